// pybind11 module pyspark_cq._aggregate: the kernels of pyspark_cq.sliding_aggregate.
//
// - preaggregate(): map-side partial aggregation of raw rows into slices (one per key and granule);
// - ShardState: the per-shard state (slices per key, two-stacks / subtract-on-evict sweeps, pending
//   change intervals), serialized with serde.hpp into the bytes kept in Spark's GroupState.
// The algorithms live in aggregate_core.hpp; this file only converts between numpy and C++.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "aggregate_core.hpp"
#include "bindings_common.hpp"
#include "serde.hpp"

namespace py = pybind11;
using cq::agg::Emitted;
using cq::agg::OutSpec;
using cq::agg::ShardState;
using cq::bind::as_array;
using cq::bind::to_numpy;

namespace {

constexpr std::int64_t kFormatVersion = 2;

std::vector<OutSpec> parse_outs(const py::handle& outs) {
  auto a = as_array<std::int32_t>(outs, "outputs");
  if (a.shape(0) % 3 != 0) throw py::value_error("outputs must hold (kind, value, count) triples");
  std::vector<OutSpec> v;
  for (py::ssize_t i = 0; i < a.shape(0); i += 3) v.push_back({a.at(i), a.at(i + 1), a.at(i + 2)});
  return v;
}

std::vector<std::uint8_t> parse_kinds(const py::handle& kinds) {
  auto a = as_array<std::uint8_t>(kinds, "kinds");
  return std::vector<std::uint8_t>(a.data(), a.data() + a.shape(0));
}

py::tuple emitted_to_python(const Emitted& e) {
  py::list values, valid;
  for (std::size_t o = 0; o < e.value.size(); ++o) {
    values.append(to_numpy(e.value[o]));
    valid.append(to_numpy(e.valid[o]));
  }
  return py::make_tuple(to_numpy(e.slot), to_numpy(e.from), to_numpy(e.to), values, valid);
}

py::dict preaggregate_py(const py::handle& hash, const py::handle& time, const py::object& time_valid,
                         std::int64_t granularity, const py::handle& ops, const py::sequence& values,
                         const py::sequence& valids) {
  if (granularity <= 0) throw py::value_error("granularity must be a positive number of ticks");
  auto h = as_array<std::int64_t>(hash, "hash");
  const py::ssize_t n = h.shape(0);
  auto t = as_array<std::int64_t>(time, "time", n);
  py::array_t<std::uint8_t, py::array::c_style | py::array::forcecast> tv;
  const bool has_tv = !time_valid.is_none();
  if (has_tv) tv = as_array<std::uint8_t>(time_valid, "time_valid", n);
  auto op_arr = as_array<std::int32_t>(ops, "ops");
  if (op_arr.shape(0) % 2 != 0) throw py::value_error("ops must hold (op, column) pairs");
  if (values.size() != valids.size()) throw py::value_error("values and valids must have the same length");
  // Keep converted arrays alive while the kernel runs.
  std::vector<py::array> keep;
  std::vector<cq::agg::ValueColumn> cols(values.size());
  std::vector<std::pair<std::uint8_t, int>> op_list;
  for (py::ssize_t i = 0; i < op_arr.shape(0); i += 2) {
    const int op = op_arr.at(i), col = op_arr.at(i + 1);
    if (op < cq::agg::kOpRows || op > cq::agg::kOpDDSketch) throw py::value_error("unknown op code " + std::to_string(op));
    if (op != cq::agg::kOpRows && (col < 0 || col >= static_cast<int>(values.size())))
      throw py::value_error("op refers to a missing value column " + std::to_string(col));
    op_list.emplace_back(static_cast<std::uint8_t>(op), col);
  }
  for (std::size_t c = 0; c < values.size(); ++c) {
    py::object v = values[c];
    if (!v.is_none()) {
      auto arr = py::array::ensure(v, py::array::c_style);
      if (!arr || arr.ndim() != 1 || arr.shape(0) != n)
        throw py::value_error("values[" + std::to_string(c) + "] must be a 1-D array of length " + std::to_string(n));
      if (arr.dtype().is(py::dtype::of<double>())) {
        cols[c].f64 = static_cast<const double*>(arr.data());
      } else if (arr.dtype().is(py::dtype::of<std::int64_t>())) {
        cols[c].i64 = static_cast<const std::int64_t*>(arr.data());
      } else {
        throw py::type_error("values[" + std::to_string(c) + "] must be int64 or float64");
      }
      keep.push_back(arr);
    }
    py::object m = valids[c];
    if (!m.is_none()) {
      auto va = as_array<std::uint8_t>(m, "valids[]", n);
      cols[c].valid = va.data();
      keep.push_back(va);
    }
  }
  for (const auto& [op, col] : op_list) {
    if (op == cq::agg::kOpRows || op == cq::agg::kOpCount || op == cq::agg::kOpPairValue) continue;
    const bool f = op == cq::agg::kOpSumF || op == cq::agg::kOpMinF || op == cq::agg::kOpMaxF ||
                   op == cq::agg::kOpMoments || op == cq::agg::kOpDDSketch;
    if (f ? !cols[col].f64 : !cols[col].i64)
      throw py::type_error("values[" + std::to_string(col) + "] must be " + (f ? "float64" : "int64") +
                           " for op " + std::to_string(op));
  }
  cq::agg::Slices s;
  {
    py::gil_scoped_release release;
    s = cq::agg::preaggregate(static_cast<std::size_t>(n), h.data(), t.data(), has_tv ? tv.data() : nullptr,
                              granularity, op_list, cols);
  }
  py::dict out;
  out["first_row"] = to_numpy(s.first_row);
  out["hash"] = to_numpy(s.hash);
  out["start"] = to_numpy(s.start);
  py::list parts;
  for (const auto& p : s.part) parts.append(to_numpy(p));
  out["partials"] = parts;
  out["null_time"] = s.null_time;
  return out;
}

// Blob layout (serde.hpp columns): meta, kinds, outputs, then per key hash, live rows, queue bounds
// (lo, mid, hi relative to the first live row) and running aggregates, then per row start, partials and
// suffix aggregates, then the pending change intervals (runs only).
py::bytes state_to_bytes(ShardState& st) {
  const std::size_t P = st.num_partials(), Q = st.num_suffixes(), O = st.num_outputs();
  const auto& keys = st.keys();
  const std::size_t K = keys.size(), N = st.num_slices();
  const std::uint32_t ncols = static_cast<std::uint32_t>(3 + 5 + 2 * P + 1 + Q + (st.runs() ? 2 + 2 * O : 0));
  cq::Writer w(ncols);
  std::vector<std::int64_t> meta = {kFormatVersion, static_cast<std::int64_t>(P), static_cast<std::int64_t>(O),
                                    st.runs() ? 1 : 0, st.has_watermark() ? 1 : 0, st.watermark(),
                                    static_cast<std::int64_t>(K), static_cast<std::int64_t>(N),
                                    static_cast<std::int64_t>(Q)};
  w.column(cq::kI64, meta);
  w.column(cq::kU8, st.kinds());
  std::vector<std::int32_t> outs;
  for (const auto& o : st.outs()) outs.insert(outs.end(), {o.kind, o.value, o.count});
  w.column(cq::kI32, outs);
  std::vector<std::int64_t> col(K);
  auto key_column = [&](auto get) {
    for (std::size_t s = 0; s < K; ++s) col[s] = get(keys[s]);
    w.column(cq::kI64, col);
  };
  key_column([](const ShardState::Key& k) { return k.hash; });
  key_column([&](const ShardState::Key& k) { return static_cast<std::int64_t>(st.nrows(k)) - k.head; });
  key_column([](const ShardState::Key& k) { return k.lo - k.head; });
  key_column([](const ShardState::Key& k) { return k.mid - k.head; });
  key_column([](const ShardState::Key& k) { return k.hi - k.head; });
  for (std::size_t p = 0; p < P; ++p) key_column([p](const ShardState::Key& k) { return k.run[p]; });
  std::vector<std::int64_t> rows;
  rows.reserve(N);
  auto row_column = [&](auto get) {
    rows.clear();
    for (const auto& k : keys)
      for (std::int64_t i = k.head; i < static_cast<std::int64_t>(st.nrows(k)); ++i) rows.push_back(get(k, i));
    w.column(cq::kI64, rows);
  };
  row_column([&](const ShardState::Key& k, std::int64_t i) { return st.start(k, i); });
  for (std::size_t p = 0; p < P; ++p) row_column([&, p](const ShardState::Key& k, std::int64_t i) { return st.part(k, i, p); });
  for (std::size_t q = 0; q < Q; ++q) row_column([&, q](const ShardState::Key& k, std::int64_t i) { return st.suf(k, i, q); });
  if (st.runs()) {
    key_column([](const ShardState::Key& k) { return k.run_from; });
    key_column([](const ShardState::Key& k) { return k.run_to; });
    for (std::size_t o = 0; o < O; ++o) key_column([o](const ShardState::Key& k) { return k.run_value[o]; });
    std::vector<std::uint8_t> flags(K);
    for (std::size_t o = 0; o < O; ++o) {
      for (std::size_t s = 0; s < K; ++s) flags[s] = keys[s].run_valid[o];
      w.column(cq::kU8, flags);
    }
  }
  return py::bytes(w.str());
}

std::unique_ptr<ShardState> state_from_bytes(const py::bytes& blob, const py::handle& kinds, const py::handle& outs,
                                             bool runs) {
  const auto [data, size] = cq::bind::bytes_view(blob);
  auto st = std::make_unique<ShardState>(parse_kinds(kinds), parse_outs(outs), runs);
  cq::Reader r(data, size);
  auto meta = r.column<std::int64_t>(cq::kI64);
  if (meta.size() != 9 || meta[0] != kFormatVersion)
    throw std::invalid_argument(
        "sliding_aggregate state blob has format version " + (meta.empty() ? std::string("?") : std::to_string(meta[0])) +
        "; this pyspark-cq reads aggregation state format " + std::to_string(kFormatVersion) +
        " (a checkpoint of another pyspark-cq release): start the query with a new checkpoint location");
  auto kinds_in = r.column<std::uint8_t>(cq::kU8);
  auto outs_in = r.column<std::int32_t>(cq::kI32);
  std::vector<std::int32_t> outs_now;
  for (const auto& o : st->outs()) outs_now.insert(outs_now.end(), {o.kind, o.value, o.count});
  if (kinds_in != st->kinds() || outs_in != outs_now || (meta[3] != 0) != runs)
    throw std::invalid_argument(
        "the saved state was written by a different aggregation (aggs, emit or, with an integral sum, "
        "spark.sql.ansi.enabled changed; or by a pyspark-cq release with another state layout); "
        "restart the query with a new checkpoint location");
  const std::size_t P = st->num_partials(), Q = st->num_suffixes(), O = st->num_outputs();
  if (r.ncols() != 3 + 5 + 2 * P + 1 + Q + (runs ? 2 + 2 * O : 0) || static_cast<std::size_t>(meta[8]) != Q)
    throw std::invalid_argument("state blob is corrupt: wrong number of columns");
  const std::size_t K = static_cast<std::size_t>(meta[6]), N = static_cast<std::size_t>(meta[7]);
  auto key_col = [&]() {
    auto c = r.column<std::int64_t>(cq::kI64);
    if (c.size() != K) throw std::invalid_argument("state blob is corrupt: key column length");
    return c;
  };
  auto hash = key_col(), n = key_col(), lo = key_col(), mid = key_col(), hi = key_col();
  std::vector<std::vector<std::int64_t>> run(P);
  for (auto& c : run) c = key_col();
  auto row_col = [&]() {
    auto c = r.column<std::int64_t>(cq::kI64);
    if (c.size() != N) throw std::invalid_argument("state blob is corrupt: slice column length");
    return c;
  };
  auto start = row_col();
  std::vector<std::vector<std::int64_t>> part(P), suf(Q);
  for (auto& c : part) c = row_col();
  for (auto& c : suf) c = row_col();
  std::size_t offset = 0;
  std::vector<std::int64_t> prow(P), srow(Q);
  for (std::size_t s = 0; s < K; ++s) {
    if (n[s] < 0 || offset + static_cast<std::size_t>(n[s]) > N)
      throw std::invalid_argument("state blob is corrupt: row counts");
    auto& k = st->add_key(hash[s]);
    k.rows.resize(static_cast<std::size_t>(n[s]) * st->stride());
    for (std::int64_t i = 0; i < n[s]; ++i) {
      for (std::size_t p = 0; p < P; ++p) prow[p] = part[p][offset + i];
      for (std::size_t q = 0; q < Q; ++q) srow[q] = suf[q][offset + i];
      st->set_row(k, i, start[offset + i], prow.data(), srow.data());
    }
    offset += static_cast<std::size_t>(n[s]);
    k.lo = lo[s], k.mid = mid[s], k.hi = hi[s];
    for (std::size_t p = 0; p < P; ++p) k.run[p] = run[p][s];
  }
  if (offset != N) throw std::invalid_argument("state blob is corrupt: row counts");
  if (runs) {
    auto from = key_col(), to = key_col();
    std::vector<std::vector<std::int64_t>> value(O);
    for (auto& c : value) c = key_col();
    for (std::size_t s = 0; s < K; ++s) {
      auto& k = st->keys()[s];
      k.run_from = from[s], k.run_to = to[s];
      for (std::size_t o = 0; o < O; ++o) k.run_value[o] = value[o][s];
    }
    for (std::size_t o = 0; o < O; ++o) {
      auto flags = r.column<std::uint8_t>(cq::kU8);
      if (flags.size() != K) throw std::invalid_argument("state blob is corrupt: key column length");
      for (std::size_t s = 0; s < K; ++s) st->keys()[s].run_valid[o] = flags[s];
    }
  }
  if (!r.done()) throw std::invalid_argument("state blob has trailing bytes");
  if (meta[4]) st->set_watermark(meta[5]);
  st->validate_and_index();
  return st;
}

// Optional int64 bound: None means unbounded.
std::pair<bool, std::int64_t> bound(const py::object& v) {
  if (v.is_none()) return {false, 0};
  return {true, v.cast<std::int64_t>()};
}

}  // namespace

PYBIND11_MODULE(_aggregate, m) {
  m.doc() = "Kernels of pyspark_cq.sliding_aggregate: map-side slicing and the per-shard sliding state.";

  m.def("preaggregate", &preaggregate_py, py::arg("hash"), py::arg("time"), py::arg("time_valid"),
        py::arg("granularity"), py::arg("ops"), py::arg("values"), py::arg("valids"),
        R"doc(Partial aggregation of raw rows per (key hash, granule) -- the map side of the operator.

Parameters: hash, time (int64 ticks), time_valid (uint8 or None), granularity (ticks), ops (int32 pairs
(op code, value column)), values (per column: int64 / float64 array, or None for count-only columns),
valids (per column: uint8 mask or None). Returns a dict with first_row, hash, start, partials (list of
int64 arrays, floats bit-cast) and null_time (rows skipped for a null time).)doc");

  m.def("f64_keys", [](const py::handle& x) {
    auto a = as_array<double>(x, "x");
    py::array_t<std::int64_t> out(a.shape(0));
    auto* o = out.mutable_data();
    for (py::ssize_t i = 0; i < a.shape(0); ++i) o[i] = cq::agg::f64_key(a.data()[i]);
    return out;
  }, py::arg("x"), "Order keys of doubles under Spark's ordering (NaN greatest, -0.0 == 0.0).");
  m.def("keys_f64", [](const py::handle& k) {
    auto a = as_array<std::int64_t>(k, "keys");
    py::array_t<double> out(a.shape(0));
    auto* o = out.mutable_data();
    for (py::ssize_t i = 0; i < a.shape(0); ++i) o[i] = cq::agg::key_f64(a.data()[i]);
    return out;
  }, py::arg("keys"), "Inverse of f64_keys.");

  py::class_<ShardState>(m, "ShardState", "Sliding-window state of one shard (many keys).")
      .def(py::init([](const py::handle& kinds, const py::handle& outs, bool runs) {
             return std::make_unique<ShardState>(parse_kinds(kinds), parse_outs(outs), runs);
           }),
           py::arg("kinds"), py::arg("outputs"), py::arg("runs"))
      .def_static("from_bytes", &state_from_bytes, py::arg("blob"), py::arg("kinds"), py::arg("outputs"),
                  py::arg("runs"), "Restore a state written by to_bytes(); ValueError when corrupt or foreign.")
      .def("to_bytes", &state_to_bytes)
      .def_property_readonly("num_keys", &ShardState::num_keys)
      .def_property_readonly("key_hashes",
                             [](const ShardState& s) {
                               std::vector<std::int64_t> h;
                               for (const auto& k : s.keys()) h.push_back(k.hash);
                               return to_numpy(h);
                             },
                             "Key hash of each slot.")
      .def_property_readonly("num_slices", &ShardState::num_slices)
      .def_property_readonly("num_runs", &ShardState::num_runs)
      .def_property_readonly("payload_bytes", &ShardState::payload_bytes)
      .def_property("watermark",
                    [](const ShardState& s) -> py::object {
                      return s.has_watermark() ? py::int_(s.watermark()) : py::object(py::none());
                    },
                    [](ShardState& s, std::int64_t wm) { s.set_watermark(wm); })
      .def("ingest",
           [](ShardState& s, const py::handle& hash, const py::handle& start, const py::sequence& parts,
              std::int64_t window, std::int64_t slide, const py::object& late_end) {
             auto h = as_array<std::int64_t>(hash, "hash");
             const py::ssize_t n = h.shape(0);
             auto st = as_array<std::int64_t>(start, "start", n);
             std::vector<py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>> keep;
             std::vector<const std::int64_t*> ptrs;
             for (std::size_t p = 0; p < parts.size(); ++p) {
               keep.push_back(as_array<std::int64_t>(parts[p], "partials[]", n));
               ptrs.push_back(keep.back().data());
             }
             auto [has_late, late] = bound(late_end);
             cq::agg::IngestResult r;
             {
               py::gil_scoped_release release;
               r = s.ingest(static_cast<std::size_t>(n), h.data(), st.data(), ptrs, window, slide, has_late, late);
             }
             return py::make_tuple(to_numpy(r.slot), to_numpy(r.new_rows), r.late_rows, r.late_slices);
           },
           py::arg("hash"), py::arg("start"), py::arg("partials"), py::arg("window"), py::arg("slide"),
           py::arg("late_end"),
           "Merge incoming slices; returns (slot per slice or -1 if late, rows introducing new keys, late rows, "
           "late slices).")
      .def("emit_windows",
           [](ShardState& s, std::int64_t window, std::int64_t slide, const py::object& lo_end,
              const py::object& hi_end, bool only_touched, const py::object& start_lo, const py::object& start_hi) {
             if (slide <= 0) throw py::value_error("slide must be positive");
             auto [has_lo, lo] = bound(lo_end);
             auto [has_hi, hi] = bound(hi_end);
             auto [has_slo, slo] = bound(start_lo);
             auto [has_shi, shi] = bound(start_hi);
             // window starts k*S in [start_lo, start_hi): k in [ceil(start_lo/S), ceil(start_hi/S) - 1]
             const std::int64_t k_min = has_slo ? -cq::agg::floor_div(-slo, slide) : cq::agg::kI64Min;
             const std::int64_t k_max = has_shi ? -cq::agg::floor_div(-shi, slide) - 1 : cq::agg::kI64Max;
             Emitted e(0);
             {
               py::gil_scoped_release release;
               e = s.emit_windows(window, slide, has_lo, lo, has_hi, hi, only_touched, k_min, k_max);
             }
             return emitted_to_python(e);
           },
           py::arg("window"), py::arg("slide"), py::arg("lo_end"), py::arg("hi_end"), py::arg("only_touched"),
           py::arg("start_lo") = py::none(), py::arg("start_hi") = py::none(),
           "Windows with end in (lo_end, hi_end] and start in [start_lo, start_hi) (None: unbounded): "
           "(slot, start, end, values, valids).")
      .def("emit_changes",
           [](ShardState& s, std::int64_t window, std::int64_t granularity, const py::object& lo_end,
              const py::object& hi_end) {
             auto [has_lo, lo] = bound(lo_end);
             auto [has_hi, hi] = bound(hi_end);
             Emitted e(0);
             {
               py::gil_scoped_release release;
               e = s.emit_changes(window, granularity, has_lo, lo, has_hi, hi);
             }
             return emitted_to_python(e);
           },
           py::arg("window"), py::arg("granularity"), py::arg("lo_end"), py::arg("hi_end"),
           "Maximal intervals of constant aggregate values that became final: (slot, from, to, values, valids).")
      .def("evict",
           [](ShardState& s, std::int64_t window, std::int64_t slide, std::int64_t watermark) {
             cq::agg::EvictResult r;
             {
               py::gil_scoped_release release;
               r = s.evict(window, slide, watermark);
             }
             return py::make_tuple(to_numpy(r.kept), r.slices, r.rows);
           },
           py::arg("window"), py::arg("slide"), py::arg("watermark"),
           "Drop slices whose windows all ended by the watermark; returns (kept old slots, slices, rows).");

  m.attr("OP_ROWS") = static_cast<int>(cq::agg::kOpRows);
  m.attr("OP_COUNT") = static_cast<int>(cq::agg::kOpCount);
  m.attr("OP_SUM_I") = static_cast<int>(cq::agg::kOpSumI);
  m.attr("OP_SUM_F") = static_cast<int>(cq::agg::kOpSumF);
  m.attr("OP_MIN_I") = static_cast<int>(cq::agg::kOpMinI);
  m.attr("OP_MIN_F") = static_cast<int>(cq::agg::kOpMinF);
  m.attr("OP_MAX_I") = static_cast<int>(cq::agg::kOpMaxI);
  m.attr("OP_MAX_F") = static_cast<int>(cq::agg::kOpMaxF);
  m.attr("OP_SUM_HI") = static_cast<int>(cq::agg::kOpSumHi);
  m.attr("OP_HLL") = static_cast<int>(cq::agg::kOpHll);
  m.attr("OP_FIRST") = static_cast<int>(cq::agg::kOpFirst);
  m.attr("OP_LAST") = static_cast<int>(cq::agg::kOpLast);
  m.attr("OP_PAIR_VALUE") = static_cast<int>(cq::agg::kOpPairValue);
  m.attr("OP_MOMENTS") = static_cast<int>(cq::agg::kOpMoments);
  m.attr("KIND_ADD_I64") = static_cast<int>(cq::agg::kAddI64);
  m.attr("KIND_ADD_F64") = static_cast<int>(cq::agg::kAddF64);
  m.attr("KIND_MIN") = static_cast<int>(cq::agg::kMin);
  m.attr("KIND_MAX") = static_cast<int>(cq::agg::kMax);
  m.attr("KIND_MAX_BYTES") = static_cast<int>(cq::agg::kMaxBytes);
  m.attr("KIND_FIRST") = static_cast<int>(cq::agg::kFirst);
  m.attr("KIND_LAST") = static_cast<int>(cq::agg::kLast);
  m.attr("KIND_PAIR_VALUE") = static_cast<int>(cq::agg::kPairValue);
  m.attr("KIND_MOMENTS") = static_cast<int>(cq::agg::kMoments);
  m.attr("OUT_COUNT") = static_cast<int>(cq::agg::kOutCount);
  m.attr("OUT_SUM_I") = static_cast<int>(cq::agg::kOutSumI);
  m.attr("OUT_SUM_F") = static_cast<int>(cq::agg::kOutSumF);
  m.attr("OUT_AVG_I") = static_cast<int>(cq::agg::kOutAvgI);
  m.attr("OUT_AVG_F") = static_cast<int>(cq::agg::kOutAvgF);
  m.attr("OUT_MIN") = static_cast<int>(cq::agg::kOutMin);
  m.attr("OUT_MAX") = static_cast<int>(cq::agg::kOutMax);
  m.attr("OUT_SUM_I_CHECKED") = static_cast<int>(cq::agg::kOutSumIChecked);
  m.attr("OUT_RAW") = static_cast<int>(cq::agg::kOutRaw);
  m.attr("OP_DDSKETCH") = static_cast<int>(cq::agg::kOpDDSketch);
  m.attr("KIND_DDSKETCH") = static_cast<int>(cq::agg::kDDSketch);
  m.attr("OUT_QUANTILE") = static_cast<int>(cq::agg::kOutQuantile);
  m.attr("DD_WORDS") = static_cast<int>(cq::agg::kDDWords);
  m.attr("DD_BINS") = static_cast<int>(cq::agg::kDDBins);
  m.attr("DD_ALPHA") = cq::agg::kDDAlpha;
  m.attr("QUANTILE_UNITS") = static_cast<int>(cq::agg::kQuantileUnits);
}
