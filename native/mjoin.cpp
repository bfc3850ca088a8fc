// pybind11 module pyspark_cq._mjoin: the multi-way join's state kernel (issue 15, MJoin: one
// symmetric hash state per input, no intermediate state).
//
// The algorithm lives in mjoin_core.hpp (MultiJoinState); this file only checks arguments and converts
// between numpy and C++, releasing the GIL around the kernel.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <tuple>
#include <vector>

#include "bindings_common.hpp"
#include "mjoin_core.hpp"

namespace py = pybind11;
using cq::bind::I64;
using cq::bind::to_numpy;
using cq::bind::U8;
using cq::mjoin::Bound;
using cq::mjoin::MultiJoinState;

namespace {

MultiJoinState make_state(int n_inputs, const py::sequence& bounds) {
  std::vector<Bound> bs;
  for (size_t b = 0; b < bounds.size(); ++b) {
    py::sequence t = bounds[b].cast<py::sequence>();
    if (t.size() != 4)
      throw py::value_error("bounds[" + std::to_string(b) + "] must be (i, j, lower, upper)");
    bs.push_back({t[0].cast<int>(), t[1].cast<int>(), t[2].cast<int64_t>(), t[3].cast<int64_t>()});
  }
  return MultiJoinState(n_inputs, std::move(bs));
}

py::list bounds_of(const MultiJoinState& st) {
  py::list out;
  for (const Bound& b : st.bounds()) out.append(py::make_tuple(b.i, b.j, b.lower, b.upper));
  return out;
}

// Arriving rows of one input, decoded once for insert_probe and store: the arrays stay alive (and the
// pointers valid) as long as this object; null_key and ends are optional (nullptr when None).
struct Rows {
  I64 k, t, id;
  U8 nk;
  I64 en;
  py::ssize_t n = 0;
  const uint8_t* null_key = nullptr;
  const int64_t* ends = nullptr;

  Rows(py::handle keys, py::handle times, py::handle ids, py::object null_key_arg, py::object ends_arg) {
    k = cq::bind::as_array<int64_t>(keys, "keys");
    n = k.shape(0);
    t = cq::bind::as_array<int64_t>(times, "times", n);
    id = cq::bind::as_array<int64_t>(ids, "ids", n);
    if (!null_key_arg.is_none()) {
      nk = cq::bind::as_array<uint8_t>(null_key_arg, "null_key", n);
      null_key = nk.data();
    }
    if (!ends_arg.is_none()) {
      en = cq::bind::as_array<int64_t>(ends_arg, "ends", n);
      ends = en.data();
    }
  }
};

py::tuple insert_probe(MultiJoinState& st, int input, py::handle keys, py::handle times, py::handle ids,
                       py::object null_key, const std::vector<int>& order, py::object ends) {
  st.check_order(input, order);
  const Rows a(keys, times, ids, null_key, ends);
  cq::mjoin::Result r;
  {
    py::gil_scoped_release release;
    r = st.insert_probe(input, a.n, a.k.data(), a.t.data(), a.id.data(), a.null_key, a.ends, order);
  }
  const py::ssize_t cols = st.n_inputs();
  py::array_t<int64_t> flat = to_numpy(std::move(r.ids));
  py::object matches = flat.attr("reshape")(py::make_tuple(flat.shape(0) / cols, cols));
  return py::make_tuple(matches, to_numpy(std::move(r.probed)), to_numpy(std::move(r.matched)));
}

// Rows of a 2-d int64 array (m x n_inputs, C order) of probe_step's partial matches.
const int64_t* partial_rows(py::array_t<int64_t, py::array::c_style | py::array::forcecast>& a, const char* name,
                            py::ssize_t m, int n) {
  if (a.ndim() != 2 || a.shape(0) != m || a.shape(1) != n)
    throw py::value_error(std::string(name) + " must be an int64 array of shape (" + std::to_string(m) + ", " +
                          std::to_string(n) + "), one row per key");
  return a.data();
}

py::tuple probe_step(const MultiJoinState& st, int input, const std::vector<int>& order, int step, py::handle keys,
                     py::handle ids, py::handle times) {
  const I64 k = cq::bind::as_array<int64_t>(keys, "keys");
  const py::ssize_t m = k.shape(0);
  const int n = st.n_inputs();
  auto id = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(ids);
  auto t = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(times);
  if (!id || !t) throw py::type_error("ids and times must be int64 arrays of shape (len(keys), n_inputs)");
  const int64_t* idp = partial_rows(id, "ids", m, n);
  const int64_t* tp = partial_rows(t, "times", m, n);
  cq::mjoin::StepResult r;
  {
    py::gil_scoped_release release;
    r = st.probe_step(input, order, step, m, k.data(), idp, tp);
  }
  const py::ssize_t rows = static_cast<py::ssize_t>(r.keys.size());
  py::object out_ids = to_numpy(std::move(r.ids)).attr("reshape")(py::make_tuple(rows, n));
  py::object out_t = to_numpy(std::move(r.times)).attr("reshape")(py::make_tuple(rows, n));
  return py::make_tuple(to_numpy(std::move(r.keys)), out_ids, out_t);
}

void store(MultiJoinState& st, int input, py::handle keys, py::handle times, py::handle ids, py::object null_key,
           py::object ends) {
  st.input_index(input);
  const Rows a(keys, times, ids, null_key, ends);
  py::gil_scoped_release release;
  st.store(input, a.n, a.k.data(), a.t.data(), a.id.data(), a.null_key, a.ends);
}

py::array_t<int64_t> evict(MultiJoinState& st, int input, int64_t threshold) {
  std::vector<int64_t> out;
  {
    py::gil_scoped_release release;
    out = st.evict(input, threshold);
  }
  return to_numpy(std::move(out));
}

py::tuple live_rows(const MultiJoinState& st, int input) {
  std::vector<int64_t> k, t, id;
  {
    py::gil_scoped_release release;
    st.live_rows(input, &k, &t, &id);
  }
  return py::make_tuple(to_numpy(std::move(k)), to_numpy(std::move(t)), to_numpy(std::move(id)));
}

int64_t remove_ids(MultiJoinState& st, int input, py::handle ids) {
  const I64 a = cq::bind::as_array<int64_t>(ids, "ids");
  py::gil_scoped_release release;
  return st.remove_ids(input, a.shape(0), a.data());
}

py::array_t<int64_t> canonical_ids(MultiJoinState& st, int input) {
  std::vector<int64_t> out;
  {
    py::gil_scoped_release release;
    out = st.canonical_ids(input);
  }
  return to_numpy(std::move(out));
}

py::object min_end(const MultiJoinState& st, int input) {
  int64_t v;
  if (!st.min_end(input, &v)) return py::none();
  return py::int_(v);
}

py::bytes serialize(const MultiJoinState& st) { return py::bytes(st.serialize()); }

MultiJoinState deserialize(const py::bytes& blob) {
  const auto [data, size] = cq::bind::bytes_view(blob);
  return MultiJoinState::deserialize(data, size);
}

}  // namespace

PYBIND11_MODULE(_mjoin, m) {
  m.doc() = "Multi-way join state kernel (MJoin): one symmetric hash state per input, no intermediate state.";
  py::class_<MultiJoinState>(m, "MultiJoinState")
      .def(py::init(&make_state), py::arg("n_inputs"), py::arg("bounds"),
           "Empty state for n_inputs (2 to 6) inputs sharing one int64 key; bounds are (i, j, lower, upper):\n"
           "times[j] - times[i] in [lower, upper], inclusive (integer ticks, e.g. microseconds).")
      .def_property_readonly("n_inputs", &MultiJoinState::n_inputs)
      .def_property_readonly("bounds", &bounds_of)
      .def("insert_probe", &insert_probe, py::arg("input"), py::arg("keys"), py::arg("times"), py::arg("ids"),
           py::arg("null_key"), py::arg("order"), py::arg("ends") = py::none(),
           "Probe the other inputs in `order` (a permutation of them) with each row of `input`, then store\n"
           "the rows (rows of one call never see each other). null_key (uint8 mask or None) marks rows that\n"
           "never match and are not stored; ends (int64 or None) are explicit expiry keys for evict(); without\n"
           "them rows expire in stages from the bounds' closure (see evict).\n"
           "Returns (matches: (n_matches, n_inputs) payload ids, probed, matched): per probe step the\n"
           "partial matches entering it and leaving it.")
      .def("probe_step", &probe_step, py::arg("input"), py::arg("order"), py::arg("step"), py::arg("keys"),
           py::arg("ids"), py::arg("times"),
           "One probe step of insert_probe, breadth-first: partial matches of rows arriving on `input` (their\n"
           "keys; ids and times: (len(keys), n_inputs) int64, meaningful for `input` and order[:step]) probe\n"
           "input order[step]. Returns (keys, ids, times) of the extended partial matches. Steps 0 .. n-2 over\n"
           "a batch's rows with the state unchanged, then store(), give insert_probe's matches and counters.")
      .def("store", &store, py::arg("input"), py::arg("keys"), py::arg("times"), py::arg("ids"),
           py::arg("null_key") = py::none(), py::arg("ends") = py::none(),
           "Store rows of `input` without probing (the second half of insert_probe; arguments as there).")
      .def("evict", &evict, py::arg("input"), py::arg("threshold"),
           "Remove the rows of `input` that can no longer join; returns their payload ids. Rows with explicit\n"
           "ends go when their end is <= threshold; the others (threshold: a time every future row is later\n"
           "than, e.g. the watermark) when no future row can meet them, or earlier when some input they can no\n"
           "longer meet from the future has no stored row they could join.")
      .def("closure", &MultiJoinState::closure,
           "D[i][j]: the largest times[j] - times[i] the bounds allow (their shortest-path closure), inf where\n"
           "unbounded; a negative D[i][i] means the bounds contradict each other.")
      .def("live_rows", &live_rows, py::arg("input"),
           "The live rows of `input` as (keys, times, payload ids), int64 arrays in no particular order.")
      .def("remove_ids", &remove_ids, py::arg("input"), py::arg("ids"),
           "Remove the live rows of `input` with these payload ids (others ignored); returns how many went.\n"
           "For stream constraints (pyspark_cq.constraints): rows that can join nothing more while they hold.")
      .def("canonical_ids", &canonical_ids, py::arg("input"),
           "Renumber `input`'s payload ids to 0..rows-1 in serialization order; returns the old ids in that\n"
           "order (compact the payload table with take(old)).")
      .def("min_end", &min_end, py::arg("input"), "Smallest expiry key of `input`, or None.")
      .def("rows", &MultiJoinState::rows, py::arg("input"), "Number of stored rows of `input`.")
      .def("keys", &MultiJoinState::keys, py::arg("input"), "Number of distinct keys of `input`.")
      .def("serialize", &serialize, "The state as bytes (format CQS1, see serde.hpp).")
      .def_static("deserialize", &deserialize, py::arg("blob"),
                  "Rebuild a state from serialize(); raises ValueError on a corrupt blob.");
  m.attr("FORMAT_VERSION") = cq::mjoin::kFormatVersion;
}
