// Split-based sliding-window aggregation: the state kernel of pyspark_cq.sliding_aggregate.
//
// PIPES (Cammert, Kraemer, Seeger, Vaupel, "A Cost Model for Adaptive Resource Management in Data
// Stream Systems", Algorithm 1, Section 2.4) aggregates over validity intervals split at start/end
// timestamps. With a time granularity g (Section 2.4.3) every split point lies on the grid g*Z, so the
// state of a group reduces to one partial aggregate per granule ("slice"). A sliding window of size W
// and slide S is then a contiguous run of slices, and consecutive windows form a FIFO over the slices.
// Combining slices is therefore O(1) amortized per slice whatever W/S is:
//   - invertible partials (counts, integer sums) keep a running value, subtract-on-evict;
//   - non-invertible ones (min, max, and floating sums, which must not subtract: inf - inf = NaN and
//     cancellation would drift) use the two-stacks queue: the front holds suffix aggregates, the back a
//     running aggregate, a flip moves the back to the front once per slice.
//
// Everything here is plain C++17 (no Python), so the algorithm can be benchmarked and tested alone.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace cq {
namespace agg {

constexpr std::int64_t kI64Max = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kI64Min = std::numeric_limits<std::int64_t>::min();

// ---- partial aggregates ---------------------------------------------------------------------------

// How a partial column combines. All partials are stored as int64 (doubles bit-cast), so a slice is a
// row of int64 values and the state serializes as plain int64 columns.
enum Kind : std::uint8_t {
  kAddI64 = 1,  // counts and integral sums: wrapping add (Spark's long sum), invertible
  kAddF64 = 2,  // floating sums: IEEE add, not invertible (two-stacks)
  kMin = 3,     // minimum of order keys (two-stacks)
  kMax = 4,     // maximum of order keys (two-stacks)
};

// Map-side operations: which partial a raw row contributes to (see preaggregate()).
enum Op : std::uint8_t {
  kOpRows = 0,   // count(*)
  kOpCount = 1,  // count(col): non-null values
  kOpSumI = 2,   // sum of an integral column
  kOpSumF = 3,   // sum of a floating column
  kOpMinI = 4,
  kOpMinF = 5,
  kOpMaxI = 6,
  kOpMaxF = 7,
};

inline Kind kind_of(std::uint8_t op) {
  switch (op) {
    case kOpRows: case kOpCount: case kOpSumI: return kAddI64;
    case kOpSumF: return kAddF64;
    case kOpMinI: case kOpMinF: return kMin;
    case kOpMaxI: case kOpMaxF: return kMax;
    default: throw std::invalid_argument("unknown partial operation code " + std::to_string(op));
  }
}

inline std::int64_t f64_bits(double x) {
  std::int64_t b;
  std::memcpy(&b, &x, 8);
  return b;
}
inline double bits_f64(std::int64_t b) {
  double x;
  std::memcpy(&x, &b, 8);
  return x;
}

// Canonical quiet NaN; its order key is above +inf's, as Spark orders NaN above every other double.
constexpr std::int64_t kNanBits = 0x7FF8000000000000LL;

// Order-preserving int64 key of a double under Spark's ordering (-inf < ... < -0.0 == 0.0 < ... < inf
// < NaN), so min/max of floating columns run on int64 like every other partial. The identities
// kI64Max / kI64Min are never the key of a real value.
inline std::int64_t f64_key(double x) {
  if (x == 0.0) x = 0.0;  // -0.0 and 0.0 are equal for Spark
  if (std::isnan(x)) return kNanBits;
  std::int64_t b = f64_bits(x);
  return b >= 0 ? b : (b ^ kI64Max);
}
inline double key_f64(std::int64_t k) { return bits_f64(k >= 0 ? k : (k ^ kI64Max)); }

inline std::int64_t identity(std::uint8_t kind) {
  switch (kind) {
    case kMin: return kI64Max;
    case kMax: return kI64Min;
    default: return 0;  // 0 and +0.0 share the bit pattern
  }
}

inline std::int64_t combine(std::uint8_t kind, std::int64_t a, std::int64_t b) {
  switch (kind) {
    case kAddI64:  // wrapping, as Spark's non-ANSI long sum; exact modulo 2^64 so subtract-on-evict stays exact
      return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b));
    case kAddF64: return f64_bits(bits_f64(a) + bits_f64(b));
    case kMin: return a < b ? a : b;
    default: return a > b ? a : b;
  }
}

inline std::int64_t floor_div(std::int64_t a, std::int64_t b) {  // b > 0
  std::int64_t q = a / b;
  if ((a % b != 0) && (a < 0)) --q;
  return q;
}

// ---- open-addressing index from int64 to dense ids ---------------------------------------------------

inline std::uint64_t mix64(std::uint64_t x) {  // splitmix64 finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Maps int64 keys to ids 0..n-1 in insertion order (linear probing, power-of-two capacity).
class I64Index {
 public:
  explicit I64Index(std::size_t expected = 16) { rehash(capacity_for(expected)); }
  std::size_t size() const { return keys_.size(); }
  const std::vector<std::int64_t>& keys() const { return keys_; }
  // Returns the id of `key`, inserting it when absent; *inserted tells which.
  std::int32_t find_or_insert(std::int64_t key, bool* inserted) {
    std::size_t pos = mix64(static_cast<std::uint64_t>(key)) & mask_;
    while (true) {
      std::int32_t id = slots_[pos];
      if (id < 0) break;
      if (keys_[id] == key) {
        *inserted = false;
        return id;
      }
      pos = (pos + 1) & mask_;
    }
    std::int32_t id = static_cast<std::int32_t>(keys_.size());
    keys_.push_back(key);
    slots_[pos] = id;
    *inserted = true;
    if (keys_.size() * 2 > slots_.size()) rehash(slots_.size() * 2);
    return id;
  }

 private:
  static std::size_t capacity_for(std::size_t n) {
    std::size_t c = 16;
    while (c < 2 * n + 2) c <<= 1;
    return c;
  }
  void rehash(std::size_t cap) {
    slots_.assign(cap, -1);
    mask_ = cap - 1;
    for (std::size_t id = 0; id < keys_.size(); ++id) {
      std::size_t pos = mix64(static_cast<std::uint64_t>(keys_[id])) & mask_;
      while (slots_[pos] >= 0) pos = (pos + 1) & mask_;
      slots_[pos] = static_cast<std::int32_t>(id);
    }
  }
  std::vector<std::int32_t> slots_;
  std::vector<std::int64_t> keys_;
  std::size_t mask_ = 0;
};

// ---- map side: pre-aggregation of raw rows into slices ----------------------------------------------

// One value column of the input: int64 or float64 values (nulls as 0) and an optional validity mask.
struct ValueColumn {
  const std::int64_t* i64 = nullptr;
  const double* f64 = nullptr;
  const std::uint8_t* valid = nullptr;  // nullptr: no nulls
};

struct Slices {
  std::vector<std::int64_t> first_row;  // a row of each slice (for its key values)
  std::vector<std::int64_t> hash;       // key hash of each slice
  std::vector<std::int64_t> start;      // granule start (ticks)
  std::vector<std::vector<std::int64_t>> part;  // one column per partial
  std::int64_t null_time = 0;           // rows dropped because their time is null
};

// Groups `n` raw rows by (key hash, granule) and computes the partials `ops` (op code, value column)
// per group -- the map-side partial aggregation that lets the stateful stage receive slices instead of
// rows. Rows with a null time are skipped and counted (Spark's window() drops them).
inline Slices preaggregate(std::size_t n, const std::int64_t* hash, const std::int64_t* time,
                           const std::uint8_t* time_valid, std::int64_t g,
                           const std::vector<std::pair<std::uint8_t, int>>& ops,
                           const std::vector<ValueColumn>& cols) {
  if (g <= 0) throw std::invalid_argument("granularity must be positive");
  Slices out;
  std::vector<std::int32_t> gid(n);
  // Group ids by (hash, granule): a table of pair keys with linear probing.
  std::size_t cap = 64;
  while (cap < n / 4) cap <<= 1;
  std::vector<std::int32_t> slots(cap, -1);
  std::size_t mask = cap - 1;
  std::int64_t last_h = 0, last_s = 0;
  std::int32_t last_id = -1;
  for (std::size_t i = 0; i < n; ++i) {
    if (time_valid && !time_valid[i]) {
      gid[i] = -1;
      ++out.null_time;
      continue;
    }
    std::int64_t h = hash[i];
    std::int64_t s = floor_div(time[i], g) * g;
    if (last_id >= 0 && h == last_h && s == last_s) {  // runs of equal (key, granule) are common
      gid[i] = last_id;
      continue;
    }
    std::size_t pos = mix64(static_cast<std::uint64_t>(h) ^ mix64(static_cast<std::uint64_t>(s))) & mask;
    std::int32_t id;
    while (true) {
      id = slots[pos];
      if (id < 0 || (out.hash[id] == h && out.start[id] == s)) break;
      pos = (pos + 1) & mask;
    }
    if (id < 0) {
      id = static_cast<std::int32_t>(out.hash.size());
      out.hash.push_back(h);
      out.start.push_back(s);
      out.first_row.push_back(static_cast<std::int64_t>(i));
      slots[pos] = id;
      if (out.hash.size() * 2 > cap) {  // grow and reinsert
        cap <<= 1;
        mask = cap - 1;
        slots.assign(cap, -1);
        for (std::size_t j = 0; j < out.hash.size(); ++j) {
          std::size_t p = mix64(static_cast<std::uint64_t>(out.hash[j]) ^
                                mix64(static_cast<std::uint64_t>(out.start[j]))) & mask;
          while (slots[p] >= 0) p = (p + 1) & mask;
          slots[p] = static_cast<std::int32_t>(j);
        }
      }
    }
    gid[i] = id;
    last_h = h;
    last_s = s;
    last_id = id;
  }
  const std::size_t m = out.hash.size();
  out.part.resize(ops.size());
  // Column-wise accumulation: one tight loop per partial.
  for (std::size_t p = 0; p < ops.size(); ++p) {
    const std::uint8_t op = ops[p].first;
    const std::uint8_t kind = kind_of(op);
    std::vector<std::int64_t>& acc = out.part[p];
    acc.assign(m, identity(kind));
    if (op == kOpRows) {
      for (std::size_t i = 0; i < n; ++i)
        if (gid[i] >= 0) ++acc[gid[i]];
      continue;
    }
    const ValueColumn& c = cols.at(static_cast<std::size_t>(ops[p].second));
    const std::uint8_t* v = c.valid;
    switch (op) {
      case kOpCount:
        for (std::size_t i = 0; i < n; ++i)
          if (gid[i] >= 0 && (!v || v[i])) ++acc[gid[i]];
        break;
      case kOpSumI:
        for (std::size_t i = 0; i < n; ++i)
          if (gid[i] >= 0 && (!v || v[i])) acc[gid[i]] = combine(kAddI64, acc[gid[i]], c.i64[i]);
        break;
      case kOpSumF: {
        // accumulate in doubles, store bits once
        std::vector<double> sums(m, 0.0);
        for (std::size_t i = 0; i < n; ++i)
          if (gid[i] >= 0 && (!v || v[i])) sums[gid[i]] += c.f64[i];
        for (std::size_t j = 0; j < m; ++j) acc[j] = f64_bits(sums[j]);
        break;
      }
      case kOpMinI:
        for (std::size_t i = 0; i < n; ++i)
          if (gid[i] >= 0 && (!v || v[i]) && c.i64[i] < acc[gid[i]]) acc[gid[i]] = c.i64[i];
        break;
      case kOpMaxI:
        for (std::size_t i = 0; i < n; ++i)
          if (gid[i] >= 0 && (!v || v[i]) && c.i64[i] > acc[gid[i]]) acc[gid[i]] = c.i64[i];
        break;
      case kOpMinF:
        for (std::size_t i = 0; i < n; ++i)
          if (gid[i] >= 0 && (!v || v[i])) {
            std::int64_t k = f64_key(c.f64[i]);
            if (k < acc[gid[i]]) acc[gid[i]] = k;
          }
        break;
      case kOpMaxF:
        for (std::size_t i = 0; i < n; ++i)
          if (gid[i] >= 0 && (!v || v[i])) {
            std::int64_t k = f64_key(c.f64[i]);
            if (k > acc[gid[i]]) acc[gid[i]] = k;
          }
        break;
      default: throw std::invalid_argument("unknown partial operation code " + std::to_string(op));
    }
  }
  return out;
}

// ---- output aggregates ------------------------------------------------------------------------------

enum OutKind : std::int32_t {
  kOutCount = 1,  // int64 partial, never null (count(*), count(col))
  kOutSumI = 2,   // int64 sum, null when the column had no non-null value
  kOutSumF = 3,   // double sum, idem
  kOutAvgI = 4,   // double(sum of int64) / count, idem
  kOutAvgF = 5,   // double sum / count, idem
  kOutMin = 6,    // order key, idem
  kOutMax = 7,
};

struct OutSpec {
  std::int32_t kind;
  std::int32_t value;  // partial index of the value
  std::int32_t count;  // partial index of the non-null count (-1 for kOutCount)
};

inline std::int64_t canonical_double_bits(double x) { return std::isnan(x) ? kNanBits : f64_bits(x); }

// Final value of one output aggregate from combined partials: (bits, valid).
inline void finalize(const OutSpec& o, const std::int64_t* combined, std::int64_t* value, std::uint8_t* valid) {
  if (o.kind == kOutCount) {
    *value = combined[o.value];
    *valid = 1;
    return;
  }
  const std::int64_t cnt = combined[o.count];
  if (cnt <= 0) {
    *value = 0;
    *valid = 0;
    return;
  }
  *valid = 1;
  const std::int64_t v = combined[o.value];
  switch (o.kind) {
    case kOutSumI: case kOutMin: case kOutMax: *value = v; break;
    case kOutSumF: *value = canonical_double_bits(bits_f64(v)); break;
    case kOutAvgI: *value = canonical_double_bits(static_cast<double>(v) / static_cast<double>(cnt)); break;
    case kOutAvgF: *value = canonical_double_bits(bits_f64(v) / static_cast<double>(cnt)); break;
    default: throw std::invalid_argument("unknown output aggregate kind " + std::to_string(o.kind));
  }
}

// Value equality of finalized outputs for coalescing runs of constant aggregates: doubles compare by
// value with NaN == NaN (both canonical here) and -0.0 == 0.0.
inline bool same_value(const OutSpec& o, std::int64_t a, std::int64_t b) {
  if (a == b) return true;
  switch (o.kind) {
    case kOutSumF: case kOutAvgI: case kOutAvgF: return bits_f64(a) == bits_f64(b);
    default: return false;
  }
}

// ---- the per-shard state ----------------------------------------------------------------------------

struct Emitted {  // windows or change intervals produced by one emission
  std::vector<std::int32_t> slot;
  std::vector<std::int64_t> from, to;
  std::vector<std::vector<std::int64_t>> value;  // per output aggregate
  std::vector<std::vector<std::uint8_t>> valid;
  explicit Emitted(std::size_t nout) : value(nout), valid(nout) {}
};

struct IngestResult {
  std::vector<std::int32_t> slot;     // per incoming slice: key slot, -1 when late
  std::vector<std::int64_t> new_rows; // incoming row that introduced each new key, in slot order
  std::int64_t late_rows = 0;         // raw rows (count(*)) of late slices
  std::int64_t late_slices = 0;
};

struct EvictResult {
  std::vector<std::int64_t> kept;  // old slot of each surviving key, in new slot order
  std::int64_t slices = 0;         // slices evicted
  std::int64_t rows = 0;           // raw rows they held (count(*))
};

// The state of one shard: many keys, each a time-ordered list of slices (CSR layout), plus -- for the
// change-interval output -- one pending run of constant aggregate value per key.
class ShardState {
 public:
  ShardState(std::vector<std::uint8_t> kinds, std::vector<OutSpec> outs, bool runs)
      : kinds_(std::move(kinds)), outs_(std::move(outs)), runs_(runs), part_(kinds_.size()) {
    if (kinds_.empty() || kinds_[0] != kAddI64)
      throw std::invalid_argument("partial 0 must be count(*) (kind add-int64)");
    for (auto k : kinds_)
      if (k < kAddI64 || k > kMax) throw std::invalid_argument("unknown partial kind " + std::to_string(k));
    for (const auto& o : outs_) {
      if (o.kind < kOutCount || o.kind > kOutMax) throw std::invalid_argument("unknown output kind");
      if (o.value < 0 || o.value >= static_cast<std::int32_t>(kinds_.size()) ||
          (o.kind != kOutCount && (o.count < 0 || o.count >= static_cast<std::int32_t>(kinds_.size()))))
        throw std::invalid_argument("output aggregate refers to a missing partial");
    }
    key_off_.push_back(0);
    if (runs_) run_value_.resize(outs_.size()), run_valid_.resize(outs_.size());
  }

  std::size_t num_partials() const { return kinds_.size(); }
  std::size_t num_outputs() const { return outs_.size(); }
  std::size_t num_keys() const { return key_hash_.size(); }
  std::size_t num_slices() const { return start_.size(); }
  std::size_t num_runs() const {
    std::size_t r = 0;
    for (auto f : run_from_) r += (f != kI64Min);
    return r;
  }
  bool has_watermark() const { return has_wm_; }
  std::int64_t watermark() const { return wm_; }
  void set_watermark(std::int64_t wm) {
    wm_ = wm;
    has_wm_ = true;
  }
  const std::vector<std::uint8_t>& kinds() const { return kinds_; }
  const std::vector<OutSpec>& outs() const { return outs_; }
  bool runs() const { return runs_; }
  // Raw access for (de)serialization.
  std::vector<std::int64_t>& key_hash() { return key_hash_; }
  std::vector<std::int64_t>& key_off() { return key_off_; }
  std::vector<std::int64_t>& start() { return start_; }
  std::vector<std::vector<std::int64_t>>& part() { return part_; }
  std::vector<std::int64_t>& run_from() { return run_from_; }
  std::vector<std::int64_t>& run_to() { return run_to_; }
  std::vector<std::vector<std::int64_t>>& run_value() { return run_value_; }
  std::vector<std::vector<std::uint8_t>>& run_valid() { return run_valid_; }

  // Checks the invariants after deserialization (sizes, sorted slices) and builds the key index.
  void validate_and_index() {
    const std::size_t k = key_hash_.size(), n = start_.size();
    if (key_off_.size() != k + 1 || key_off_.front() != 0 || key_off_.back() != static_cast<std::int64_t>(n))
      throw std::invalid_argument("state blob is corrupt: key offsets do not match the slices");
    for (const auto& c : part_)
      if (c.size() != n) throw std::invalid_argument("state blob is corrupt: partial column length");
    for (std::size_t s = 0; s < k; ++s) {
      if (key_off_[s] > key_off_[s + 1]) throw std::invalid_argument("state blob is corrupt: key offsets");
      for (std::int64_t i = key_off_[s] + 1; i < key_off_[s + 1]; ++i)
        if (start_[i - 1] >= start_[i]) throw std::invalid_argument("state blob is corrupt: unsorted slices");
    }
    if (runs_) {
      if (run_from_.size() != k || run_to_.size() != k)
        throw std::invalid_argument("state blob is corrupt: pending runs");
      for (std::size_t o = 0; o < outs_.size(); ++o)
        if (run_value_[o].size() != k || run_valid_[o].size() != k)
          throw std::invalid_argument("state blob is corrupt: pending run values");
    }
    index_ = I64Index(k);
    for (std::size_t s = 0; s < k; ++s) {
      bool inserted;
      index_.find_or_insert(key_hash_[s], &inserted);
      if (!inserted) throw std::invalid_argument("state blob is corrupt: duplicate key");
    }
    touched_.assign(n, 0);
  }

  // Merges incoming slices into the state. A slice whose every window ended at or before `late_end`
  // (the watermark of the previous batch) is late: dropped and counted, as Spark drops (window, key)
  // rows with window.end <= that watermark. `W`, `S` decide a slice's last window end.
  IngestResult ingest(std::size_t m, const std::int64_t* hash, const std::int64_t* start,
                      const std::vector<const std::int64_t*>& parts, std::int64_t W, std::int64_t S,
                      bool has_late_end, std::int64_t late_end) {
    if (parts.size() != kinds_.size()) throw std::invalid_argument("wrong number of partial columns");
    check_window(W, S);
    IngestResult res;
    res.slot.assign(m, -1);
    const std::size_t k_old = key_hash_.size();
    for (std::size_t i = 0; i < m; ++i) {
      if (has_late_end && last_end(start[i], W, S) <= late_end) {
        res.late_rows += parts[0][i];
        ++res.late_slices;
        continue;
      }
      bool inserted;
      std::int32_t slot = index_.find_or_insert(hash[i], &inserted);
      if (inserted) {
        key_hash_.push_back(hash[i]);
        res.new_rows.push_back(static_cast<std::int64_t>(i));
      }
      res.slot[i] = slot;
    }
    const std::size_t k_new = key_hash_.size();
    // Bucket incoming rows by slot (counting sort), then sort each bucket by start.
    std::vector<std::int64_t> inc_off(k_new + 1, 0);
    for (std::size_t i = 0; i < m; ++i)
      if (res.slot[i] >= 0) ++inc_off[res.slot[i] + 1];
    for (std::size_t s = 0; s < k_new; ++s) inc_off[s + 1] += inc_off[s];
    std::vector<std::int64_t> order(static_cast<std::size_t>(inc_off[k_new]));
    {
      std::vector<std::int64_t> fill(inc_off.begin(), inc_off.end() - 1);
      for (std::size_t i = 0; i < m; ++i)
        if (res.slot[i] >= 0) order[fill[res.slot[i]]++] = static_cast<std::int64_t>(i);
    }
    for (std::size_t s = 0; s < k_new; ++s) {
      auto b = order.begin() + inc_off[s], e = order.begin() + inc_off[s + 1];
      if (e - b > 1 && !std::is_sorted(b, e, [&](std::int64_t x, std::int64_t y) { return start[x] < start[y]; }))
        std::stable_sort(b, e, [&](std::int64_t x, std::int64_t y) { return start[x] < start[y]; });
    }
    // Merge old slices (sorted per key) with the incoming ones into new CSR arrays.
    const std::size_t P = kinds_.size();
    const std::size_t n_old = start_.size();
    std::vector<std::int64_t> nstart;
    nstart.reserve(n_old + order.size());
    std::vector<std::vector<std::int64_t>> npart(P);
    for (auto& c : npart) c.reserve(n_old + order.size());
    std::vector<std::uint8_t> ntouched;
    ntouched.reserve(n_old + order.size());
    std::vector<std::int64_t> noff(k_new + 1, 0);
    for (std::size_t s = 0; s < k_new; ++s) {
      std::int64_t a = s < k_old ? key_off_[s] : 0, ae = s < k_old ? key_off_[s + 1] : 0;
      std::int64_t b = inc_off[s], be = inc_off[s + 1];
      while (a < ae || b < be) {
        bool take_old;
        if (b >= be) take_old = true;
        else if (a >= ae) take_old = false;
        else take_old = start_[a] <= start[order[b]];
        if (take_old) {
          nstart.push_back(start_[a]);
          for (std::size_t p = 0; p < P; ++p) npart[p].push_back(part_[p][a]);
          ntouched.push_back(0);
          ++a;
        } else {
          const std::int64_t i = order[b];
          if (!nstart.empty() && static_cast<std::int64_t>(nstart.size()) > noff[s] && nstart.back() == start[i]) {
            for (std::size_t p = 0; p < P; ++p) npart[p].back() = combine(kinds_[p], npart[p].back(), parts[p][i]);
          } else {
            nstart.push_back(start[i]);
            for (std::size_t p = 0; p < P; ++p) npart[p].push_back(parts[p][i]);
            ntouched.push_back(0);
          }
          ntouched.back() = 1;
          ++b;
        }
      }
      noff[s + 1] = static_cast<std::int64_t>(nstart.size());
    }
    start_.swap(nstart);
    part_.swap(npart);
    key_off_.swap(noff);
    touched_.swap(ntouched);
    if (runs_) {
      run_from_.resize(k_new, kI64Min);
      run_to_.resize(k_new, kI64Min);
      for (std::size_t o = 0; o < outs_.size(); ++o) {
        run_value_[o].resize(k_new, 0);
        run_valid_[o].resize(k_new, 0);
      }
    }
    return res;
  }

  // Sliding windows [k*S, k*S + W) that contain at least one slice (flagged as touched by the last
  // ingest when `only_touched`), with end in (lo_end, hi_end] (a missing bound is unbounded).
  Emitted emit_windows(std::int64_t W, std::int64_t S, bool has_lo, std::int64_t lo_end, bool has_hi,
                       std::int64_t hi_end, bool only_touched) {
    check_window(W, S);
    Emitted out(outs_.size());
    Sweep sw(*this);
    for (std::size_t s = 0; s < key_hash_.size(); ++s) {
      sw.reset(s);
      for_each_window(s, W, S, has_lo, lo_end, has_hi, hi_end, only_touched, sw,
                      [&](std::int64_t ws, std::int64_t we, const std::int64_t* vals, const std::uint8_t* ok) {
                        out.slot.push_back(static_cast<std::int32_t>(s));
                        out.from.push_back(ws);
                        out.to.push_back(we);
                        for (std::size_t o = 0; o < outs_.size(); ++o) {
                          out.value[o].push_back(vals[o]);
                          out.valid[o].push_back(ok[o]);
                        }
                      });
    }
    return out;
  }

  // PIPES output (Algorithm 1, snapshot-reducible): the aggregate valid over granule [j*g, (j+1)*g)
  // is the one of the window of size W ending at (j+1)*g. Consecutive granules with equal aggregate
  // values coalesce into maximal intervals [from, to). Granules whose window ends in (lo_end, hi_end]
  // are processed; a run is emitted once the granule after it is final (its window end <= hi_end) and
  // does not extend it; otherwise it stays pending in the state.
  Emitted emit_changes(std::int64_t W, std::int64_t g, bool has_lo, std::int64_t lo_end, bool has_hi,
                       std::int64_t hi_end) {
    if (!runs_) throw std::logic_error("this state was created without change intervals");
    check_window(W, g);
    const std::size_t O = outs_.size();
    Emitted out(O);
    Sweep sw(*this);
    auto flush = [&](std::size_t s) {
      out.slot.push_back(static_cast<std::int32_t>(s));
      out.from.push_back(run_from_[s]);
      out.to.push_back(run_to_[s]);
      for (std::size_t o = 0; o < O; ++o) {
        out.value[o].push_back(run_value_[o][s]);
        out.valid[o].push_back(run_valid_[o][s]);
      }
      run_from_[s] = run_to_[s] = kI64Min;
    };
    for (std::size_t s = 0; s < key_hash_.size(); ++s) {
      sw.reset(s);
      for_each_window(s, W, g, has_lo, lo_end, has_hi, hi_end, false, sw,
                      [&](std::int64_t, std::int64_t we, const std::int64_t* vals, const std::uint8_t* ok) {
                        const std::int64_t from = we - g;
                        if (run_from_[s] != kI64Min && run_to_[s] == from) {
                          bool same = true;
                          for (std::size_t o = 0; o < O && same; ++o)
                            same = run_valid_[o][s] == ok[o] &&
                                   (!ok[o] || same_value(outs_[o], run_value_[o][s], vals[o]));
                          if (same) {
                            run_to_[s] = we;
                            return;
                          }
                        }
                        if (run_from_[s] != kI64Min) flush(s);
                        run_from_[s] = from;
                        run_to_[s] = we;
                        for (std::size_t o = 0; o < O; ++o) {
                          run_value_[o][s] = vals[o];
                          run_valid_[o][s] = ok[o];
                        }
                      });
      // The granule right after the run is final and did not extend it: the run is maximal.
      if (run_from_[s] != kI64Min && (!has_hi || run_to_[s] <= hi_end - g)) flush(s);
    }
    return out;
  }

  // Drops slices whose every window ended at or before `wm`, and keys left with neither slices nor a
  // pending run. Work is proportional to the state (the state is rewritten per batch anyway).
  EvictResult evict(std::int64_t W, std::int64_t S, std::int64_t wm) {
    check_window(W, S);
    EvictResult res;
    const std::size_t P = kinds_.size();
    std::size_t w = 0;  // write position
    std::size_t kw = 0;
    std::vector<std::int64_t> noff(1, 0);
    for (std::size_t s = 0; s < key_hash_.size(); ++s) {
      const std::size_t begin_w = w;
      for (std::int64_t i = key_off_[s]; i < key_off_[s + 1]; ++i) {
        if (last_end(start_[i], W, S) <= wm) {
          ++res.slices;
          res.rows += part_[0][i];
          continue;
        }
        start_[w] = start_[i];
        for (std::size_t p = 0; p < P; ++p) part_[p][w] = part_[p][i];
        ++w;
      }
      const bool has_run = runs_ && run_from_[s] != kI64Min;
      if (w == begin_w && !has_run) continue;  // the key leaves the state
      key_hash_[kw] = key_hash_[s];
      if (runs_) {
        run_from_[kw] = run_from_[s];
        run_to_[kw] = run_to_[s];
        for (std::size_t o = 0; o < outs_.size(); ++o) {
          run_value_[o][kw] = run_value_[o][s];
          run_valid_[o][kw] = run_valid_[o][s];
        }
      }
      res.kept.push_back(static_cast<std::int64_t>(s));
      noff.push_back(static_cast<std::int64_t>(w));
      ++kw;
    }
    start_.resize(w);
    for (auto& c : part_) c.resize(w);
    key_hash_.resize(kw);
    key_off_.swap(noff);
    if (runs_) {
      run_from_.resize(kw);
      run_to_.resize(kw);
      for (std::size_t o = 0; o < outs_.size(); ++o) {
        run_value_[o].resize(kw);
        run_valid_[o].resize(kw);
      }
    }
    touched_.assign(w, 0);
    index_ = I64Index(kw);
    bool inserted;
    for (std::size_t s = 0; s < kw; ++s) index_.find_or_insert(key_hash_[s], &inserted);
    return res;
  }

  // Bytes of the state's columns (what a snapshot holds).
  std::size_t payload_bytes() const {
    std::size_t b = 8 * (key_hash_.size() + key_off_.size() + start_.size() * (1 + part_.size()));
    if (runs_) b += key_hash_.size() * (16 + 9 * outs_.size());
    return b;
  }

  // Last end of a window [k*S, k*S + W) containing time t.
  static std::int64_t last_end(std::int64_t t, std::int64_t W, std::int64_t S) {
    return floor_div(t, S) * S + W;
  }

 private:
  static void check_window(std::int64_t W, std::int64_t S) {
    if (W <= 0 || S <= 0) throw std::invalid_argument("window and slide must be positive");
  }

  // The two-stacks FIFO over one key's slices [lo, hi): add-int64 partials keep a running value
  // (subtract-on-evict); the others keep suffix aggregates for [lo, mid) and a running back aggregate
  // for [mid, hi).
  struct Sweep {
    ShardState& st;
    std::int64_t lo = 0, mid = 0, hi = 0, end = 0;
    std::vector<std::int64_t> run;        // per partial: running (add-int64) or back aggregate
    std::vector<std::vector<std::int64_t>> suf;  // per partial (two-stacks ones): suffix aggregates
    std::vector<std::int64_t> combined;
    std::vector<std::int64_t> vals;
    std::vector<std::uint8_t> ok;
    explicit Sweep(ShardState& s)
        : st(s), run(s.kinds_.size()), suf(s.kinds_.size()), combined(s.kinds_.size()),
          vals(s.outs_.size()), ok(s.outs_.size()) {
      for (std::size_t p = 0; p < s.kinds_.size(); ++p)
        if (s.kinds_[p] != kAddI64) suf[p].resize(s.start_.size());
    }
    void reset(std::size_t slot) {
      lo = mid = hi = st.key_off_[slot];
      end = st.key_off_[slot + 1];
      for (std::size_t p = 0; p < run.size(); ++p) run[p] = identity(st.kinds_[p]);
    }
    void push() {
      for (std::size_t p = 0; p < run.size(); ++p) run[p] = combine(st.kinds_[p], run[p], st.part_[p][hi]);
      ++hi;
    }
    void pop() {
      if (lo == mid) flip();
      for (std::size_t p = 0; p < run.size(); ++p)
        if (st.kinds_[p] == kAddI64)
          run[p] = static_cast<std::int64_t>(static_cast<std::uint64_t>(run[p]) -
                                             static_cast<std::uint64_t>(st.part_[p][lo]));
      ++lo;
    }
    void flip() {  // move the back [mid, hi) to the front: suffix aggregates, newest to oldest
      for (std::size_t p = 0; p < run.size(); ++p) {
        const std::uint8_t k = st.kinds_[p];
        if (k == kAddI64) continue;
        std::int64_t acc = identity(k);
        for (std::int64_t i = hi - 1; i >= lo; --i) {
          acc = combine(k, st.part_[p][i], acc);
          suf[p][i] = acc;
        }
        run[p] = identity(k);
      }
      mid = hi;
    }
    void query() {
      for (std::size_t p = 0; p < run.size(); ++p) {
        const std::uint8_t k = st.kinds_[p];
        combined[p] = (k == kAddI64 || lo >= mid) ? run[p] : combine(k, suf[p][lo], run[p]);
      }
      for (std::size_t o = 0; o < st.outs_.size(); ++o) finalize(st.outs_[o], combined.data(), &vals[o], &ok[o]);
    }
  };

  // Calls fn(ws, we, values, valid) for each window of key `slot` in time order (see emit_windows).
  template <class Fn>
  void for_each_window(std::size_t slot, std::int64_t W, std::int64_t S, bool has_lo, std::int64_t lo_end,
                       bool has_hi, std::int64_t hi_end, bool only_touched, Sweep& sw, Fn&& fn) {
    const std::int64_t b = key_off_[slot], e = key_off_[slot + 1];
    // Window index bounds from the end bounds: k*S + W > lo_end and k*S + W <= hi_end.
    std::int64_t k_lo = kI64Min, k_hi = kI64Max;
    if (has_lo) k_lo = floor_div(lo_end - W, S) + 1;
    if (has_hi) k_hi = floor_div(hi_end - W, S);
    std::int64_t k_next = kI64Min;
    // Slices whose windows all end by lo_end cannot contribute: skip them by binary search, so the
    // work per call is proportional to the slices in the emitted windows, not to the key's state.
    std::int64_t first = b;
    if (has_lo) first = std::lower_bound(start_.begin() + b, start_.begin() + e, lo_end - W + 1) - start_.begin();
    for (std::int64_t i = first; i < e; ++i) {
      const std::int64_t t = start_[i];
      if (has_hi && t >= hi_end) break;  // its windows end after t >= hi_end
      if (only_touched && !touched_[i]) continue;
      std::int64_t kf = floor_div(t - W, S) + 1, kl = floor_div(t, S);
      kf = std::max(kf, std::max(k_lo, k_next));
      kl = std::min(kl, k_hi);
      for (std::int64_t k = kf; k <= kl; ++k) {
        const std::int64_t ws = k * S, we = ws + W;
        if (sw.lo == sw.hi) {  // empty queue (identity aggregates): jump to the window's first slice
          const std::int64_t j = std::lower_bound(start_.begin() + sw.hi, start_.begin() + e, ws) - start_.begin();
          sw.lo = sw.mid = sw.hi = j;
        }
        while (sw.hi < e && start_[sw.hi] < we) sw.push();
        while (sw.lo < sw.hi && start_[sw.lo] < ws) sw.pop();
        sw.query();
        fn(ws, we, sw.vals.data(), sw.ok.data());
        k_next = k + 1;
      }
    }
  }

  std::vector<std::uint8_t> kinds_;
  std::vector<OutSpec> outs_;
  bool runs_;
  bool has_wm_ = false;
  std::int64_t wm_ = 0;
  std::vector<std::int64_t> key_hash_;
  std::vector<std::int64_t> key_off_;
  std::vector<std::int64_t> start_;
  std::vector<std::vector<std::int64_t>> part_;
  std::vector<std::uint8_t> touched_;
  std::vector<std::int64_t> run_from_, run_to_;
  std::vector<std::vector<std::int64_t>> run_value_;
  std::vector<std::vector<std::uint8_t>> run_valid_;
  I64Index index_;
};

}  // namespace agg
}  // namespace cq
