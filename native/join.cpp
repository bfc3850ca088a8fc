// pybind11 module pyspark_cq._join: symmetric hash join state with temporal expiration (PIPES,
// Cammert et al., sections 2.4.4, 3.6.3).
//
// The algorithm lives in join_core.hpp (JoinState: insert/probe, expiry, the state image); this file
// only checks arguments and converts between numpy and C++, releasing the GIL around the kernel.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "bindings_common.hpp"
#include "join_core.hpp"

namespace py = pybind11;
using cq::bind::I64;
using cq::bind::to_numpy;
using cq::bind::U8;
using cq::join::JoinState;
using cq::join::kFormatVersion;

namespace {

const int64_t* optional_i64(const py::object& obj, I64& holder, py::ssize_t n, const char* name) {
  if (obj.is_none()) return nullptr;
  holder = obj.cast<I64>();
  if (holder.size() != n) throw py::value_error(std::string(name) + " must have the same length as times");
  return holder.data();
}

py::tuple insert_probe(JoinState& js, int side, const I64& offsets, const U8& data, py::object null_key,
                       const I64& times, const I64& ids, bool store, py::object lower, py::object upper,
                       py::object ends) {
  JoinState::side_index(side);
  const py::ssize_t n = times.size();
  if (ids.size() != n) throw py::value_error("ids must have the same length as times");
  if (offsets.size() != n + 1) throw py::value_error("offsets must have length len(times) + 1");
  U8 nulls_arr;
  const uint8_t* nk = nullptr;
  if (!null_key.is_none()) {
    nulls_arr = null_key.cast<U8>();
    if (nulls_arr.size() != n) throw py::value_error("null_key must have the same length as times");
    nk = nulls_arr.data();
  }
  I64 lo_arr, up_arr, end_arr;
  const int64_t* los = optional_i64(lower, lo_arr, n, "lower");
  const int64_t* ups = optional_i64(upper, up_arr, n, "upper");
  const int64_t* ens = optional_i64(ends, end_arr, n, "ends");
  cq::join::check_key_offsets(n, offsets.data(), data.size());
  const cq::join::ProbeInput in{side, n, offsets.data(), data.data(), nk, times.data(), ids.data(), los, ups, ens};
  cq::join::Matches m;
  {
    py::gil_scoped_release release;
    m = js.insert_probe(in, store);
  }
  return py::make_tuple(to_numpy(std::move(m.in)), to_numpy(std::move(m.id)));
}

py::tuple evict(JoinState& js, int side, int64_t threshold) {
  JoinState::side_index(side);
  cq::join::Evicted e;
  {
    py::gil_scoped_release release;
    e = js.evict(side, threshold);
  }
  return py::make_tuple(to_numpy(std::move(e.ids)), to_numpy(std::move(e.matched)));
}

py::object min_end(const JoinState& js, int side) {
  const auto m = js.min_end(side);
  if (!m) return py::none();
  return py::int_(*m);
}

py::tuple row_bounds(const JoinState& js, int side) {
  cq::join::RowBounds b = js.row_bounds(side);
  return py::make_tuple(to_numpy(std::move(b.time)), to_numpy(std::move(b.lo)), to_numpy(std::move(b.up)));
}

py::tuple row_flags(const JoinState& js, int side) {
  cq::join::RowFlags f = js.row_flags(side);
  return py::make_tuple(to_numpy(std::move(f.matched)), to_numpy(std::move(f.ends)));
}

py::array_t<int64_t> row_ids(const JoinState& js, int side) { return to_numpy(js.row_ids(side)); }

void set_ends(JoinState& js, int side, const I64& ends) {
  js.set_ends(side, ends.data(), static_cast<size_t>(ends.size()));
}

py::array_t<int64_t> canonical_ids(JoinState& js, int side, int64_t payload_len) {
  return to_numpy(js.canonical_ids(side, payload_len));
}

py::bytes serialize(const JoinState& js) { return py::bytes(js.serialize()); }

JoinState deserialize(const py::bytes& blob) {
  const auto [data, size] = cq::bind::bytes_view(blob);
  return JoinState::deserialize(data, size);
}

// Concatenate several per-row byte encodings into one injective key encoding (concat_encodings).
py::tuple concat_keys(const py::sequence& parts) {
  const size_t np = parts.size();
  if (np == 0) throw py::value_error("parts must not be empty");
  std::vector<I64> offs;
  std::vector<U8> datas;
  py::ssize_t n = -1;
  for (size_t p = 0; p < np; ++p) {
    py::tuple t = parts[p].cast<py::tuple>();
    if (t.size() != 2) throw py::value_error("parts[" + std::to_string(p) + "] must be (offsets, data)");
    offs.push_back(t[0].cast<I64>());
    datas.push_back(t[1].cast<U8>());
    if (n < 0) n = offs.back().size() - 1;
    if (offs.back().size() - 1 != n || n < 0)
      throw py::value_error("parts[" + std::to_string(p) + "] has a different number of rows");
    const int64_t* o = offs.back().data();
    for (py::ssize_t i = 0; i < n; ++i)
      if (o[i] < 0 || o[i] > o[i + 1] || o[i + 1] > datas.back().size())
        throw py::value_error("parts[" + std::to_string(p) + "] offsets are not monotone within data");
  }
  std::vector<cq::join::Encoding> enc;
  for (size_t p = 0; p < np; ++p) enc.push_back({offs[p].data(), datas[p].data()});
  auto [out_off, out] = cq::join::concat_encodings(enc, n);
  return py::make_tuple(to_numpy(std::move(out_off)), to_numpy(std::move(out)));
}

}  // namespace


PYBIND11_MODULE(_join, m) {
  m.doc() = "Symmetric hash join state with temporal expiration (PIPES, Cammert et al., sections 2.4.4, 3.6.3).";
  py::class_<JoinState>(m, "JoinState")
      .def(py::init<int64_t, int64_t>(), py::arg("lower"), py::arg("upper"),
           "Empty state for the band l.t + lower <= r.t <= l.t + upper (integer ticks, e.g. microseconds).")
      .def_property_readonly("lower", &JoinState::lower)
      .def_property_readonly("upper", &JoinState::upper)
      .def_property_readonly("restored_format", &JoinState::restored_format,
                             "0 for a new state, else the format version of the blob it was loaded from.")
      .def("insert_probe", &insert_probe, py::arg("side"), py::arg("offsets"), py::arg("data"),
           py::arg("null_key"), py::arg("times"), py::arg("ids"), py::arg("store") = true,
           py::arg("lower") = py::none(), py::arg("upper") = py::none(), py::arg("ends") = py::none(),
           "Probe the other side with each row (in order), then store it on `side` (0 left, 1 right).\n"
           "Keys are byte strings data[offsets[i]:offsets[i+1]]; null_key (uint8 mask or None) marks rows\n"
           "that never match. lower/upper (int64 arrays or None: the state's bounds) give each row its own\n"
           "band; a pair is decided by the band of the earlier row (the left one on a tie). ends (int64 or\n"
           "None: the times) are the rows' expiry keys for evict(). Returns (input row indexes, matched\n"
           "payload ids of the other side).")
      .def("evict", &evict, py::arg("side"), py::arg("threshold"),
           "Remove the rows of `side` whose expiry key (default: time) is <= threshold; returns (payload\n"
           "ids, matched flags).")
      .def("min_end", &min_end, py::arg("side"),
           "Smallest expiry key of `side` (the next row to expire), or None.")
      .def("min_time", &min_end, py::arg("side"),
           "Alias of min_end: the smallest stored time when rows were stored without `ends`.")
      .def("row_bounds", &row_bounds, py::arg("side"),
           "(times, lowers, uppers) of the live rows of `side`, in the order set_ends expects.")
      .def("row_flags", &row_flags, py::arg("side"),
           "(matched flags, expiry keys) of the live rows of `side`, in the order set_ends expects.")
      .def("row_ids", &row_ids, py::arg("side"),
           "Payload ids of the live rows of `side`, in the order set_ends expects.")
      .def("set_ends", &set_ends, py::arg("side"), py::arg("ends"),
           "Replace the expiry keys of the live rows of `side` (order of row_bounds).")
      .def("canonical_ids", &canonical_ids, py::arg("side"), py::arg("payload_len"),
           "Renumber the payload ids of `side` 0, 1, ... in serialization order (key by key); returns\n"
           "the old ids in that order, to reorder the payload with payload.take(old_ids).")
      .def("rows", &JoinState::rows, py::arg("side"), "Number of stored rows of `side`.")
      .def("keys", &JoinState::keys, py::arg("side"), "Number of distinct non-null keys of `side`.")
      .def("nbytes", &JoinState::nbytes, "Approximate memory held by the state, in bytes.")
      .def("serialize", &serialize, "The state as bytes (format CQS1, see serde.hpp).")
      .def_static("deserialize", &deserialize, py::arg("blob"),
                  "Rebuild a state from serialize(); raises ValueError on a corrupt blob.");
  m.def("concat_keys", &concat_keys, py::arg("parts"),
        "Join per-row byte encodings [(offsets, data), ...] into one injective encoding (offsets, data).");
  m.attr("FORMAT_VERSION") = kFormatVersion;
}
