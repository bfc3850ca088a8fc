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
//   - quantile sketches (DDSketch with collapsing stores, see dd_merge) merge associatively but not
//     invertibly: two-stacks as well.
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

#include "common.hpp"

namespace cq {
namespace agg {

using cq::kI64Max;
using cq::kI64Min;

// ---- partial aggregates ---------------------------------------------------------------------------

// How a partial column combines. All partials are stored as int64 (doubles bit-cast), so a slice is a
// row of int64 values and the state serializes as plain int64 columns.
enum Kind : std::uint8_t {
  kAddI64 = 1,  // counts and integral sums: wrapping add (Spark's long sum), invertible
  kAddF64 = 2,  // floating sums: IEEE add, not invertible (two-stacks)
  kMin = 3,     // minimum of order keys (two-stacks)
  kMax = 4,     // maximum of order keys (two-stacks)
  kMaxBytes = 5,  // bytewise maximum of eight packed 7-bit registers (HyperLogLog sketches, two-stacks)
  kFirst = 6,     // (event time, value) pair at partials p, p + 1: the earliest (ties: the smaller value)
  kLast = 7,      // idem, the latest (ties: the larger value)
  kPairValue = 8, // a further slot of a multi-slot kind (kFirst, kLast, kMoments), combined with it
  kMoments = 9,   // (n, mean, M2) as doubles at p, p + 1, p + 2: count, mean and sum of squared deviations
  kDDSketch = 10, // a DDSketch of kDDWords slots at p .. p + kDDWords - 1 (layout below)
};

// ---- DDSketch (Masson, Rim, Lee, "DDSketch: A Fast and Fully-Mergeable Quantile Sketch with
// Relative-Error Guarantees", VLDB 2019) --------------------------------------------------------------
//
// Bucket i holds the values x with gamma^(i-1) < |x| <= gamma^i, gamma = (1 + alpha) / (1 - alpha)
// (§2: i = ceil(log_gamma x)); returning 2 gamma^i / (gamma + 1) for any of them is
// within relative error alpha (§2). Negative values go to a second store of |x|. A
// fixed number of bins is kept with the paper's collapsing rule (§2.2, "collapse the lowest
// buckets"): a store of capacity c holds the buckets top - c + 1 .. top below its highest bucket `top`,
// the lowest bin also counts every smaller index. The kDDBins bins are shared: a sketch whose values
// have one sign gives that store all of them, one with both signs kDDBins / 2 to each -- so the capacity
// depends only on which signs occur, and a merge never raises it. Collapsing is clamping the index from
// below, and clamping twice is clamping at the larger bound (the merged top is the larger, the merged
// capacity the smaller), so merging two sketches (re-clamp every bin at the merged top - capacity + 1,
// add counts) gives the sketch of the union whatever the order: the merge is associative and
// commutative (the two-stacks queue relies on that) but has no inverse, so it cannot subtract on evict.
// Layout of the kDDWords int64 slots (counts packed two uint32 to a word: a window holds fewer than
// 2^32 values, the limit the integral sums already assume, so a word-wise add never carries between
// the halves):
//   [0] n: values (not null); n == 0 is the empty sketch, whatever the other slots hold (the identity)
//   [1] zeros  [2] -inf  [3] +inf  [4] NaN counts
//   [5] min, [6] max: f64_key order keys (Spark's ordering, NaN largest), for the clamp and the ranks
//       1 and n (exact)
//   [7] top index of the positive store, [8] of the negative store (of |x|); kDDEmpty: no value
//   [9 .. 9 + kDDBins / 2) the bins: bin j of the positive store (index top - j; the last one also
//       everything below) is bin j, bin j of the negative store is bin kDDBins - 1 - j
constexpr double kDDAlpha = 0.02;  // the documented bound
// The sketch is built with a slightly smaller alpha: a value on a bucket boundary (1.0 = gamma^0 is one)
// is off by exactly alpha in real arithmetic, and the rounding of exp / log could push it just past the
// bound; with this margin every value stays strictly within kDDAlpha.
constexpr double kDDAlphaBuild = kDDAlpha * 0.995;
constexpr std::int64_t kDDBins = 1024;
constexpr std::size_t kDDHead = 9;
constexpr std::size_t kDDWords = kDDHead + kDDBins / 2;
constexpr std::int64_t kDDEmpty = kI64Min;

// Slots of a kind: a multi-slot kind at p is followed by width - 1 kPairValue partials.
inline std::size_t width(std::uint8_t kind) {
  return kind == kDDSketch ? kDDWords : kind == kMoments ? 3 : (kind == kFirst || kind == kLast) ? 2 : 1;
}
constexpr std::size_t kMaxWidth = kDDWords;
inline bool is_pair(std::uint8_t kind) { return width(kind) > 1; }

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
  kOpSumHi = 8,  // sum of the high halves (v >> 32) of an integral column: with its wrapped sum, the
                 // exact sum (exact_sum), for overflow checks and avg
  kOpHll = 9,    // HyperLogLog registers of a column of 64-bit value hashes: a run of consecutive kOpHll
                 // partials of one column holds 8 registers each (2^p = 8 * run length), see hll_update
  kOpFirst = 10,  // first / last by event time: (time, value) pairs; the op's column holds the event
  kOpLast = 11,   // times, the kOpPairValue partial right after it names the value column
  kOpPairValue = 12,
  kOpMoments = 13,  // (n, mean, M2) of a float64 column, Welford per slice; two kOpPairValue partials follow
  kOpDDSketch = 14, // DDSketch of a float64 column; kDDWords - 1 kOpPairValue partials follow
};

inline Kind kind_of(std::uint8_t op) {
  switch (op) {
    case kOpRows: case kOpCount: case kOpSumI: case kOpSumHi: return kAddI64;
    case kOpSumF: return kAddF64;
    case kOpMinI: case kOpMinF: return kMin;
    case kOpMaxI: case kOpMaxF: return kMax;
    case kOpHll: return kMaxBytes;
    case kOpFirst: return kFirst;
    case kOpLast: return kLast;
    case kOpPairValue: return kPairValue;
    case kOpMoments: return kMoments;
    case kOpDDSketch: return kDDSketch;
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
    case kFirst: return kI64Max;
    case kLast: return kI64Min;
    default: return 0;  // 0 and +0.0 share the bit pattern
  }
}

inline std::int64_t combine(std::uint8_t kind, std::int64_t a, std::int64_t b) {
  switch (kind) {
    case kAddI64:  // wrapping, as Spark's non-ANSI long sum; exact modulo 2^64 so subtract-on-evict stays exact
      return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b));
    case kAddF64: return f64_bits(bits_f64(a) + bits_f64(b));
    case kMin: return a < b ? a : b;
    case kMaxBytes: {
      // SWAR: every byte holds a value < 128, so (a | 0x80) - b never borrows across bytes and its
      // high bit says a >= b in that byte.
      constexpr std::uint64_t kHigh = 0x8080808080808080ULL;
      const std::uint64_t x = static_cast<std::uint64_t>(a), y = static_cast<std::uint64_t>(b);
      const std::uint64_t ge = (((x | kHigh) - y) & kHigh) >> 7;  // 0x01 in bytes where x >= y
      const std::uint64_t mask = ge * 0xFF;
      return static_cast<std::int64_t>((x & mask) | (y & ~mask));
    }
    default: return a > b ? a : b;
  }
}

// HyperLogLog update of Heule, Nunkesser and Hall, "HyperLogLog in Practice" (HLL++, §2, Fig. 1; the
// register layout of Spark's HyperLogLogPlusPlus): with 2^p registers the first p bits of the hash
// choose the register, which keeps the maximum of the rank rho = (leading zeros of the remaining bits)
// + 1; the padding bit 2^(p-1) caps rho at 65 - p. Registers are packed eight to an int64, register
// j in byte j % 8 of word j / 8. `words` points to the 2^p / 8 words of one sketch.
inline void hll_update(std::int64_t* words, int p, std::uint64_t hash) {
  const std::uint64_t idx = hash >> (64 - p);
  const std::uint64_t rest = (hash << p) | (std::uint64_t{1} << (p - 1));
  const std::uint64_t rho = static_cast<std::uint64_t>(__builtin_clzll(rest)) + 1;
  const std::uint64_t cur = (static_cast<std::uint64_t>(words[idx >> 3]) >> (8 * (idx & 7))) & 0xFF;
  if (rho > cur)
    words[idx >> 3] = static_cast<std::int64_t>((static_cast<std::uint64_t>(words[idx >> 3]) &
                                                 ~(std::uint64_t{0xFF} << (8 * (idx & 7)))) |
                                                (rho << (8 * (idx & 7))));
}

// DDSketch helpers (layout and references at kDDSketch above).
inline double dd_log_gamma() {
  static const double lg = std::log((1 + kDDAlphaBuild) / (1 - kDDAlphaBuild));
  return lg;
}
// Bucket of a finite magnitude m > 0: ceil(log_gamma m) (§2).
inline std::int64_t dd_index(double m) { return static_cast<std::int64_t>(std::ceil(std::log(m) / dd_log_gamma())); }
// The value a bucket stands for, 2 gamma^i / (gamma + 1) (§2: within relative error alpha
// of every value of the bucket). Computed as one exp so that the bucket of DBL_MAX does not overflow.
inline double dd_value(std::int64_t i) {
  static const double lf = std::log(2.0 / (1.0 + (1 + kDDAlphaBuild) / (1 - kDDAlphaBuild)));
  return std::exp(static_cast<double>(i) * dd_log_gamma() + lf);
}
inline std::uint64_t dd_get(const std::int64_t* bins, std::int64_t j) {
  return (static_cast<std::uint64_t>(bins[j >> 1]) >> (32 * (j & 1))) & 0xFFFFFFFFULL;
}
inline void dd_add(std::int64_t* bins, std::int64_t j, std::uint64_t c) {
  bins[j >> 1] = static_cast<std::int64_t>(static_cast<std::uint64_t>(bins[j >> 1]) + (c << (32 * (j & 1))));
}
// Capacity of each store of a sketch with (top_pos, top_neg), and where bin j of a store lies.
inline std::int64_t dd_capacity(std::int64_t top_pos, std::int64_t top_neg) {
  return top_pos != kDDEmpty && top_neg != kDDEmpty ? kDDBins / 2 : kDDBins;
}
inline std::int64_t dd_slot(bool neg, std::int64_t j) { return neg ? kDDBins - 1 - j : j; }
// dst = dst merged with src (§2.2: counts add bucket by bucket, after both are collapsed
// to the merged sketch's tops and capacity).
inline void dd_merge(std::int64_t* dst, const std::int64_t* src) {
  constexpr std::int64_t kWords = kDDBins / 2;
  if (src[0] == 0) return;
  if (dst[0] == 0) {
    std::copy(src, src + kDDWords, dst);
    return;
  }
  for (int i = 0; i < 5; ++i) dst[i] += src[i];
  dst[5] = std::min(dst[5], src[5]);
  dst[6] = std::max(dst[6], src[6]);
  const std::int64_t top[2] = {std::max(dst[7], src[7]), std::max(dst[8], src[8])};  // kDDEmpty is the lowest
  const std::int64_t cap = dd_capacity(top[0], top[1]);
  std::int64_t* bins = &dst[kDDHead];
  const std::int64_t* sbins = &src[kDDHead];
  if (dst[7] == src[7] && dst[8] == src[8] && dd_capacity(dst[7], dst[8]) == cap) {
    // aligned (same tops and capacity, hence src's too): a word-wise add, no carry between the halves
    for (std::int64_t w = 0; w < kWords; ++w)
      bins[w] = static_cast<std::int64_t>(static_cast<std::uint64_t>(bins[w]) + static_cast<std::uint64_t>(sbins[w]));
    return;
  }
  std::uint64_t merged[kDDBins] = {};
  for (const std::int64_t* d : {static_cast<const std::int64_t*>(dst), src}) {
    // Slot by slot, skipping empty words (a slice's sketch is mostly empty). With one sign every slot
    // is that sign's; with both, the first half is the positive store's.
    const bool has_pos = d[7] != kDDEmpty, has_neg = d[8] != kDDEmpty;
    const std::int64_t shift[2] = {has_pos ? top[0] - d[7] : 0, has_neg ? top[1] - d[8] : 0};  // no kDDEmpty arithmetic
    for (std::int64_t w = 0; w < kWords; ++w) {
      const std::uint64_t word = static_cast<std::uint64_t>(d[kDDHead + w]);
      if (!word) continue;
      for (std::int64_t h = 0; h < 2; ++h) {
        const std::uint64_t n = (word >> (32 * h)) & 0xFFFFFFFFULL;
        if (!n) continue;
        const std::int64_t at = 2 * w + h;
        const bool neg = has_neg && (!has_pos || at >= kDDBins / 2);
        const std::int64_t j = neg ? kDDBins - 1 - at : at;
        merged[dd_slot(neg, std::min(j + shift[neg], cap - 1))] += n;
      }
    }
  }
  std::fill(bins, bins + kWords, 0);
  for (std::int64_t j = 0; j < kDDBins; ++j)
    if (merged[j]) dd_add(bins, j, merged[j]);
  dst[7] = top[0];
  dst[8] = top[1];
}
// The value of rank r = ceil(q * n) (1-based, at least 1) in Spark's order (-inf, negatives, zeros,
// positives, +inf, NaN) -- the rank Spark's ApproximatePercentile (QuantileSummaries.query) returns.
// Ranks 1 and n are the exact min and max; the others a bucket's value clamped to [min, max], within
// relative error alpha of the true value unless its bucket was collapsed.
inline double dd_quantile(const std::int64_t* d, double q) {
  const std::int64_t n = d[0];
  std::int64_t r = static_cast<std::int64_t>(std::ceil(q * static_cast<double>(n)));
  r = std::max<std::int64_t>(1, std::min(r, n));
  const double lo = key_f64(d[5]), hi = key_f64(d[6]);
  if (r == 1) return lo;
  if (r == n) return hi;
  auto clamp = [&](double v) { return v < lo ? lo : v > hi ? hi : v; };
  std::int64_t cum = d[2];
  if (cum >= r) return -std::numeric_limits<double>::infinity();
  const std::int64_t* bins = &d[kDDHead];
  const std::int64_t cap = dd_capacity(d[7], d[8]);
  if (d[8] != kDDEmpty)
    for (std::int64_t j = 0; j < cap; ++j)  // most negative first
      if ((cum += static_cast<std::int64_t>(dd_get(bins, dd_slot(true, j)))) >= r) return clamp(-dd_value(d[8] - j));
  if ((cum += d[1]) >= r) return 0.0;
  if (d[7] != kDDEmpty)
    for (std::int64_t j = cap - 1; j >= 0; --j)
      if ((cum += static_cast<std::int64_t>(dd_get(bins, dd_slot(false, j)))) >= r) return clamp(dd_value(d[7] - j));
  if ((cum += d[3]) >= r) return std::numeric_limits<double>::infinity();
  return std::numeric_limits<double>::quiet_NaN();
}

// dst[0] (+ dst[1] for a pair kind) combined with src[0] (+ src[1]): every layout (slice rows, suffix
// columns, running aggregates) keeps a pair's value right after its time. All kinds are commutative.
inline void combine_at(std::uint8_t kind, std::int64_t* dst, const std::int64_t* src) {
  if (kind == kDDSketch) {
    dd_merge(dst, src);
    return;
  }
  if (kind == kMoments) {
    // Chan, Golub and LeVeque, "Algorithms for computing the sample variance" (1983), eq. 2.1: the
    // pairwise update of (n, mean, M2), which never subtracts two large sums of squares.
    const double nb = bits_f64(src[0]);
    if (nb == 0) return;
    const double na = bits_f64(dst[0]);
    if (na == 0) {
      dst[0] = src[0], dst[1] = src[1], dst[2] = src[2];
      return;
    }
    const double ma = bits_f64(dst[1]), mb = bits_f64(src[1]), n = na + nb, delta = mb - ma;
    dst[0] = f64_bits(n);
    dst[1] = f64_bits(ma + delta * (nb / n));
    dst[2] = f64_bits(bits_f64(dst[2]) + bits_f64(src[2]) + delta * delta * (na * nb / n));
    return;
  }
  if (!is_pair(kind)) {
    dst[0] = combine(kind, dst[0], src[0]);
    return;
  }
  const bool first = kind == kFirst;
  const bool take = first ? (src[0] < dst[0] || (src[0] == dst[0] && src[1] < dst[1]))
                          : (src[0] > dst[0] || (src[0] == dst[0] && src[1] > dst[1]));
  if (take) dst[0] = src[0], dst[1] = src[1];
}

inline std::int64_t floor_div(std::int64_t a, std::int64_t b) {  // b > 0
  std::int64_t q = a / b;
  if ((a % b != 0) && (a < 0)) --q;
  return q;
}

// ---- open-addressing index from int64 to dense ids ---------------------------------------------------

// Keys are placed by splitmix64_finalize (common.hpp).

// Maps int64 keys to ids 0..n-1 in insertion order (linear probing, power-of-two capacity).
class I64Index {
 public:
  explicit I64Index(std::size_t expected = 16) { rehash(capacity_for(expected)); }
  std::size_t size() const { return keys_.size(); }
  const std::vector<std::int64_t>& keys() const { return keys_; }
  // Returns the id of `key`, inserting it when absent; *inserted tells which.
  std::int32_t find_or_insert(std::int64_t key, bool* inserted) {
    std::size_t pos = splitmix64_finalize(static_cast<std::uint64_t>(key)) & mask_;
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
      std::size_t pos = splitmix64_finalize(static_cast<std::uint64_t>(keys_[id])) & mask_;
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
    std::size_t pos = splitmix64_finalize(static_cast<std::uint64_t>(h) ^ splitmix64_finalize(static_cast<std::uint64_t>(s))) & mask;
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
          std::size_t p = splitmix64_finalize(static_cast<std::uint64_t>(out.hash[j]) ^
                                splitmix64_finalize(static_cast<std::uint64_t>(out.start[j]))) & mask;
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
    if ((op == kOpHll && p > 0 && ops[p - 1].first == kOpHll && ops[p - 1].second == ops[p].second) ||
        op == kOpPairValue)
      continue;  // filled with the first word of its sketch / with its pair's time
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
      case kOpSumHi:
        for (std::size_t i = 0; i < n; ++i)
          if (gid[i] >= 0 && (!v || v[i])) acc[gid[i]] = combine(kAddI64, acc[gid[i]], c.i64[i] >> 32);
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
      case kOpFirst: case kOpLast: {
        if (p + 1 >= ops.size() || ops[p + 1].first != kOpPairValue)
          throw std::invalid_argument("a first / last partial needs its value partial right after it");
        const ValueColumn& val = cols.at(static_cast<std::size_t>(ops[p + 1].second));
        std::vector<std::int64_t>& value = out.part[p + 1];
        value.assign(m, 0);
        std::int64_t pair[2];
        for (std::size_t i = 0; i < n; ++i)
          if (gid[i] >= 0 && (!v || v[i]) && (!val.valid || val.valid[i])) {
            pair[0] = c.i64[i];
            pair[1] = val.f64 ? f64_key(val.f64[i]) : val.i64[i];
            std::int64_t cur[2] = {acc[gid[i]], value[gid[i]]};
            combine_at(kind, cur, pair);
            acc[gid[i]] = cur[0], value[gid[i]] = cur[1];
          }
        break;
      }
      case kOpMoments: {  // Welford's update per row, per slice
        if (p + 2 >= ops.size() || ops[p + 1].first != kOpPairValue || ops[p + 2].first != kOpPairValue)
          throw std::invalid_argument("a moments partial needs two value partials right after it");
        std::vector<double> cnt(m, 0.0), mean(m, 0.0), m2(m, 0.0);
        for (std::size_t i = 0; i < n; ++i)
          if (gid[i] >= 0 && (!v || v[i])) {
            const std::size_t g = static_cast<std::size_t>(gid[i]);
            const double x = c.f64[i], d = x - mean[g];
            cnt[g] += 1.0;
            mean[g] += d / cnt[g];
            m2[g] += d * (x - mean[g]);
          }
        out.part[p + 1].resize(m);
        out.part[p + 2].resize(m);
        for (std::size_t g = 0; g < m; ++g) {
          acc[g] = f64_bits(cnt[g]);
          out.part[p + 1][g] = f64_bits(mean[g]);
          out.part[p + 2][g] = f64_bits(m2[g]);
        }
        break;
      }
      case kOpDDSketch: {
        for (std::size_t j = 1; j < kDDWords; ++j)
          if (p + j >= ops.size() || ops[p + j].first != kOpPairValue)
            throw std::invalid_argument("a DDSketch partial needs its value partials right after it");
        std::vector<std::int64_t>* w = &out.part[p];
        for (std::size_t j = 1; j < kDDWords; ++j) w[j].assign(m, 0);
        w[5].assign(m, kI64Max), w[6].assign(m, kI64Min), w[7].assign(m, kDDEmpty), w[8].assign(m, kDDEmpty);
        // Two passes: the tops of a slice's stores first, so that each value lands in its final
        // (collapsed) bin at once -- no per-row shifting of the stores.
        std::vector<std::int64_t> idx(n, kDDEmpty);
        for (std::size_t i = 0; i < n; ++i) {
          if (gid[i] < 0 || (v && !v[i])) continue;
          const std::size_t g = static_cast<std::size_t>(gid[i]);
          const double x = c.f64[i];
          ++acc[g];
          const std::int64_t key = f64_key(x);
          w[5][g] = std::min(w[5][g], key);
          w[6][g] = std::max(w[6][g], key);
          if (std::isnan(x)) ++w[4][g];
          else if (x == 0) ++w[1][g];
          else if (std::isinf(x)) ++w[x < 0 ? 2 : 3][g];
          else {
            idx[i] = dd_index(std::fabs(x));
            std::int64_t& top = w[x > 0 ? 7 : 8][g];
            top = std::max(top, idx[i]);
          }
        }
        for (std::size_t i = 0; i < n; ++i) {
          if (idx[i] == kDDEmpty) continue;
          const std::size_t g = static_cast<std::size_t>(gid[i]);
          const bool pos = c.f64[i] > 0;
          const std::int64_t j = dd_slot(!pos, std::min(w[pos ? 7 : 8][g] - idx[i], dd_capacity(w[7][g], w[8][g]) - 1));
          std::int64_t& word = w[kDDHead + static_cast<std::size_t>(j >> 1)][g];
          word = static_cast<std::int64_t>(static_cast<std::uint64_t>(word) + (std::uint64_t{1} << (32 * (j & 1))));
        }
        break;
      }
      case kOpHll: {
        std::size_t w = 1;  // the sketch's words: this partial and the kOpHll partials of the column after it
        while (p + w < ops.size() && ops[p + w].first == kOpHll && ops[p + w].second == ops[p].second) ++w;
        int prec = 3;
        while ((std::size_t{1} << prec) < 8 * w) ++prec;
        if ((std::size_t{1} << prec) != 8 * w || prec < 4 || prec > 18)
          throw std::invalid_argument("a HyperLogLog sketch needs 2^p / 8 words with 4 <= p <= 18");
        std::vector<std::int64_t> regs(m * w, 0);  // slice-major, then copied out word by word
        for (std::size_t i = 0; i < n; ++i)
          if (gid[i] >= 0 && (!v || v[i]))
            hll_update(&regs[static_cast<std::size_t>(gid[i]) * w], prec, static_cast<std::uint64_t>(c.i64[i]));
        for (std::size_t k = 0; k < w; ++k) {
          std::vector<std::int64_t>& word = out.part[p + k];
          word.resize(m);
          for (std::size_t j = 0; j < m; ++j) word[j] = regs[j * w + k];
        }
        break;
      }
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
  kOutAvgI = 4,   // double(exact sum of int64) / count, idem; the high-half sum is partial value + 1
  kOutAvgF = 5,   // double sum / count, idem
  kOutMin = 6,    // order key, idem
  kOutMax = 7,
  kOutSumIChecked = 8,  // kOutSumI with the high-half sum at partial value + 1: valid is 2 when the
                        // exact sum is outside int64 (the value is then the wrapped sum, Spark's non-ANSI one)
  kOutRaw = 9,    // the combined partial as it is, always valid (e.g. a sketch word finished in Python)
  kOutQuantile = 10,  // a DDSketch's quantile (double bits), null for an empty sketch; `count` holds the
                      // percentage in units of 1e-9 (0 .. 10^9), not a partial index
};
constexpr std::int32_t kQuantileUnits = 1000000000;

// Whether an output reads the high-half sum partial (kOpSumHi) at its value partial + 1.
inline bool uses_high_half(std::int32_t kind) { return kind == kOutAvgI || kind == kOutSumIChecked; }

// The exact sum of an integral column from its wrapped sum `w` (mod 2^64) and the sum `h` of its values'
// high halves (v >> 32). Both partials are exact modulo 2^64 (subtract-on-evict keeps them so), and for
// fewer than 2^32 values the sum of the low halves, sum - h * 2^32, lies in [0, 2^64): it is
// w - h * 2^32 modulo 2^64.
__extension__ typedef __int128 i128;
inline i128 exact_sum(std::int64_t w, std::int64_t h) {
  const std::uint64_t low = static_cast<std::uint64_t>(w) - (static_cast<std::uint64_t>(h) << 32);
  return static_cast<i128>(h) * 4294967296LL + static_cast<i128>(low);
}

struct OutSpec {
  std::int32_t kind;
  std::int32_t value;  // partial index of the value
  std::int32_t count;  // partial index of the non-null count (-1 for kOutCount)
};

inline std::int64_t canonical_double_bits(double x) { return std::isnan(x) ? kNanBits : f64_bits(x); }

// Final value of one output aggregate from combined partials: (bits, valid).
inline void finalize(const OutSpec& o, const std::int64_t* combined, std::int64_t* value, std::uint8_t* valid) {
  if (o.kind == kOutQuantile) {
    const std::int64_t* d = &combined[o.value];
    *valid = d[0] > 0;
    *value = *valid ? canonical_double_bits(dd_quantile(d, static_cast<double>(o.count) / kQuantileUnits)) : 0;
    return;
  }
  if (o.kind == kOutCount || o.kind == kOutRaw) {
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
    case kOutSumIChecked: {
      const i128 s = exact_sum(v, combined[o.value + 1]);
      *value = v;
      if (s > static_cast<i128>(kI64Max) || s < static_cast<i128>(kI64Min)) *valid = 2;
      break;
    }
    case kOutAvgI:
      *value = canonical_double_bits(static_cast<double>(exact_sum(v, combined[o.value + 1])) /
                                     static_cast<double>(cnt));
      break;
    case kOutAvgF: *value = canonical_double_bits(bits_f64(v) / static_cast<double>(cnt)); break;
    default: throw std::invalid_argument("unknown output aggregate kind " + std::to_string(o.kind));
  }
}

// Value equality of finalized outputs for coalescing runs of constant aggregates: doubles compare by
// value with NaN == NaN (both canonical here) and -0.0 == 0.0.
inline bool same_value(const OutSpec& o, std::int64_t a, std::int64_t b) {
  if (a == b) return true;
  switch (o.kind) {
    case kOutSumF: case kOutAvgI: case kOutAvgF: case kOutQuantile: return bits_f64(a) == bits_f64(b);
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

// The state of one shard: many keys, each a time-ordered array of slices ("rows") and a FIFO over
// them that stays positioned on the last window computed, across micro-batches:
//   - rows [head, n) are live; [lo, hi) is the queue, [lo, mid) its front with suffix aggregates,
//     [mid, hi) its back with running aggregates (`run`);
//   - add-int64 partials keep a running value in `run` (subtract-on-evict), the others the back
//     aggregate (two-stacks: a flip moves the back to the front once per row);
//   - moving to the next window pops rows that left it and pushes rows that entered it, so every
//     slice is pushed and popped once in its life: O(1) amortized per slice whatever W/S is, and a
//     micro-batch costs what it adds and emits, not the size of the windows.
// A slice arriving inside the queue (out of order, within the watermark) is folded into the running
// or suffix aggregates it belongs to. For change intervals (PIPES output) each key also holds one
// pending run of constant aggregate value.
class ShardState {
 public:
  ShardState(std::vector<std::uint8_t> kinds, std::vector<OutSpec> outs, bool runs)
      : kinds_(std::move(kinds)), outs_(std::move(outs)), runs_(runs) {
    if (kinds_.empty() || kinds_[0] != kAddI64)
      throw std::invalid_argument("partial 0 must be count(*) (kind add-int64)");
    for (auto k : kinds_) {
      if (k < kAddI64 || k > kDDSketch) throw std::invalid_argument("unknown partial kind " + std::to_string(k));
      suf_of_.push_back(k == kAddI64 ? -1 : static_cast<int>(Q_++));
    }
    for (const auto& o : outs_) {
      if (o.kind < kOutCount || o.kind > kOutQuantile) throw std::invalid_argument("unknown output kind");
      if (o.kind == kOutQuantile) {
        if (o.value < 0 || o.value >= static_cast<std::int32_t>(kinds_.size()) || kinds_[o.value] != kDDSketch)
          throw std::invalid_argument("a quantile output needs a DDSketch partial");
        if (o.count < 0 || o.count > kQuantileUnits)
          throw std::invalid_argument("a quantile output's percentage must be in [0, 1e9] (units of 1e-9)");
        continue;
      }
      if (uses_high_half(o.kind) && (o.value + 1 >= static_cast<std::int32_t>(kinds_.size()) ||
                                     kinds_[o.value + 1] != kAddI64))
        throw std::invalid_argument("an integral sum or avg needs its high-half sum partial right after it");
      if (o.value < 0 || o.value >= static_cast<std::int32_t>(kinds_.size()) ||
          (o.kind != kOutCount && o.kind != kOutRaw && (o.count < 0 || o.count >= static_cast<std::int32_t>(kinds_.size()))))
        throw std::invalid_argument("output aggregate refers to a missing partial");
    }
    for (std::size_t p = 0; p < kinds_.size();) {  // a multi-slot kind owns exactly its width of slots
      std::size_t w = width(kinds_[p]), j = 1;
      if (kinds_[p] == kPairValue) throw std::invalid_argument("a value partial without its first / last / moments");
      for (; j < w; ++j)
        if (p + j >= kinds_.size() || kinds_[p + j] != kPairValue) break;
      if (j != w) throw std::invalid_argument("a first / last / moments / DDSketch partial lacks its value partials");
      p += w;
    }
    P_ = kinds_.size();
    R_ = 2 + P_ + Q_;  // row: start, epoch (last ingest that touched it), partials, suffixes
    combined_.resize(P_);
  }

  struct Key {
    std::int64_t hash = 0;
    std::vector<std::int64_t> rows;  // stride R
    std::int64_t head = 0, lo = 0, mid = 0, hi = 0;
    std::vector<std::int64_t> run;   // per partial
    std::int64_t run_from = kI64Min, run_to = kI64Min;  // pending change interval
    std::vector<std::int64_t> run_value;
    std::vector<std::uint8_t> run_valid;
  };

  std::size_t num_partials() const { return P_; }
  std::size_t num_suffixes() const { return Q_; }
  std::size_t num_outputs() const { return outs_.size(); }
  std::size_t num_keys() const { return keys_.size(); }
  std::size_t num_slices() const {
    std::size_t n = 0;
    for (const auto& k : keys_) n += nrows(k) - static_cast<std::size_t>(k.head);
    return n;
  }
  std::size_t num_runs() const {
    std::size_t r = 0;
    for (const auto& k : keys_) r += (k.run_from != kI64Min);
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
  std::vector<Key>& keys() { return keys_; }
  const std::vector<Key>& keys() const { return keys_; }
  std::size_t stride() const { return R_; }

  // A key as deserialized: live rows only (head = 0); checks invariants.
  Key& add_key(std::int64_t hash) {
    keys_.emplace_back();
    Key& k = keys_.back();
    k.hash = hash;
    k.run.resize(P_);
    for (std::size_t p = 0; p < P_; ++p) k.run[p] = identity(kinds_[p]);
    if (runs_) k.run_value.assign(outs_.size(), 0), k.run_valid.assign(outs_.size(), 0);
    return k;
  }

  // Checks invariants after deserialization and builds the key index.
  void validate_and_index() {
    index_ = I64Index(keys_.size());
    for (auto& k : keys_) {
      const std::int64_t n = static_cast<std::int64_t>(nrows(k));
      if (!(0 <= k.head && k.head <= k.lo && k.lo <= k.mid && k.mid <= k.hi && k.hi <= n))
        throw std::invalid_argument("state blob is corrupt: queue bounds");
      for (std::int64_t i = k.head + 1; i < n; ++i)
        if (start(k, i - 1) >= start(k, i)) throw std::invalid_argument("state blob is corrupt: unsorted slices");
      bool inserted;
      index_.find_or_insert(k.hash, &inserted);
      if (!inserted) throw std::invalid_argument("state blob is corrupt: duplicate key");
    }
  }

  // Merges incoming slices. A slice whose every window ended at or before `late_end` (the previous
  // batch's watermark) is late: dropped and counted, as Spark drops (window, key) rows with
  // window.end <= that watermark. `W`, `S` decide a slice's last window end.
  IngestResult ingest(std::size_t m, const std::int64_t* hash, const std::int64_t* start_in,
                      const std::vector<const std::int64_t*>& parts, std::int64_t W, std::int64_t S,
                      bool has_late_end, std::int64_t late_end) {
    if (parts.size() != P_) throw std::invalid_argument("wrong number of partial columns");
    check_window(W, S);
    ++epoch_;
    const std::size_t k_old = keys_.size();
    IngestResult res;
    res.slot.assign(m, -1);
    // In time order, so that rows mostly append at the end of their key.
    std::vector<std::int64_t> order(m);
    std::iota(order.begin(), order.end(), 0);
    if (!std::is_sorted(order.begin(), order.end(),
                        [&](std::int64_t a, std::int64_t b) { return start_in[a] < start_in[b]; }))
      std::stable_sort(order.begin(), order.end(),
                       [&](std::int64_t a, std::int64_t b) { return start_in[a] < start_in[b]; });
    std::vector<std::int64_t> x(P_);
    for (std::int64_t i : order) {
      if (has_late_end && last_end(start_in[i], W, S) <= late_end) {
        res.late_rows += parts[0][i];
        ++res.late_slices;
        continue;
      }
      bool inserted;
      const std::int32_t slot = index_.find_or_insert(hash[i], &inserted);
      if (inserted) add_key(hash[i]);
      res.slot[i] = slot;
      for (std::size_t p = 0; p < P_; ++p) x[p] = parts[p][i];
      insert(keys_[slot], start_in[i], x.data());
    }
    // New keys in slot order, each with the first incoming row (in input order) that carries it.
    std::vector<std::int64_t> first(keys_.size(), -1);
    for (std::size_t i = 0; i < m; ++i)
      if (res.slot[i] >= 0 && first[res.slot[i]] < 0) first[res.slot[i]] = static_cast<std::int64_t>(i);
    for (std::size_t s = k_old; s < keys_.size(); ++s) res.new_rows.push_back(first[s]);
    return res;
  }

  // Sliding windows [k*S, k*S + W) that contain at least one slice (one touched by the last ingest
  // when `only_touched`), with end in (lo_end, hi_end] (a missing bound is unbounded) and k in
  // [k_min, k_max]. The k bounds let a caller emit the windows of one window size W only (a window-size
  // schedule: each window [k*S, k*S + W(k*S)) takes the size in effect at its start).
  Emitted emit_windows(std::int64_t W, std::int64_t S, bool has_lo, std::int64_t lo_end, bool has_hi,
                       std::int64_t hi_end, bool only_touched, std::int64_t k_min = kI64Min,
                       std::int64_t k_max = kI64Max) {
    check_window(W, S);
    Emitted out(outs_.size());
    std::vector<std::int64_t> vals(outs_.size());
    std::vector<std::uint8_t> ok(outs_.size());
    for (std::size_t s = 0; s < keys_.size(); ++s) {
      for_each_window(keys_[s], W, S, has_lo, lo_end, has_hi, hi_end, only_touched, vals.data(), ok.data(),
                      k_min, k_max, [&](std::int64_t ws, std::int64_t we) {
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
    std::vector<std::int64_t> vals(O);
    std::vector<std::uint8_t> ok(O);
    for (std::size_t s = 0; s < keys_.size(); ++s) {
      Key& k = keys_[s];
      auto flush = [&]() {
        out.slot.push_back(static_cast<std::int32_t>(s));
        out.from.push_back(k.run_from);
        out.to.push_back(k.run_to);
        for (std::size_t o = 0; o < O; ++o) {
          out.value[o].push_back(k.run_value[o]);
          out.valid[o].push_back(k.run_valid[o]);
        }
        k.run_from = k.run_to = kI64Min;
      };
      for_each_window(k, W, g, has_lo, lo_end, has_hi, hi_end, false, vals.data(), ok.data(), kI64Min, kI64Max,
                      [&](std::int64_t, std::int64_t we) {
                        const std::int64_t from = we - g;
                        if (k.run_from != kI64Min && k.run_to == from) {
                          bool same = true;
                          for (std::size_t o = 0; o < O && same; ++o)
                            same = k.run_valid[o] == ok[o] && (!ok[o] || same_value(outs_[o], k.run_value[o], vals[o]));
                          if (same) {
                            k.run_to = we;
                            return;
                          }
                        }
                        if (k.run_from != kI64Min) flush();
                        k.run_from = from;
                        k.run_to = we;
                        for (std::size_t o = 0; o < O; ++o) {
                          k.run_value[o] = vals[o];
                          k.run_valid[o] = ok[o];
                        }
                      });
      // The granule right after the run is final and did not extend it: the run is maximal.
      if (k.run_from != kI64Min && (!has_hi || k.run_to <= hi_end - g)) flush();
    }
    return out;
  }

  // Drops slices whose every window ended at or before `wm` (they are at the front of their key:
  // work proportional to what is removed), and keys left with neither slices nor a pending run.
  EvictResult evict(std::int64_t W, std::int64_t S, std::int64_t wm) {
    check_window(W, S);
    EvictResult res;
    std::vector<Key> kept_keys;
    bool removed = false;
    for (std::size_t s = 0; s < keys_.size(); ++s) {
      Key& k = keys_[s];
      const std::int64_t n = static_cast<std::int64_t>(nrows(k));
      std::int64_t h = k.head;
      while (h < n && last_end(start(k, h), W, S) <= wm) {
        res.rows += part(k, h, 0);
        ++h;
      }
      res.slices += h - k.head;
      if (k.hi <= h) {
        reset_queue(k, h);
      } else {
        while (k.lo < h) pop(k);
      }
      k.head = h;
      if (k.head == n && k.run_from == kI64Min) {
        removed = true;
        continue;
      }
      compact(k);
      res.kept.push_back(static_cast<std::int64_t>(s));
    }
    if (removed) {
      std::vector<Key> next;
      next.reserve(res.kept.size());
      for (auto s : res.kept) next.push_back(std::move(keys_[s]));
      keys_.swap(next);
      index_ = I64Index(keys_.size());
      bool inserted;
      for (const auto& k : keys_) index_.find_or_insert(k.hash, &inserted);
    }
    return res;
  }

  // Bytes of the state's columns (what a snapshot holds).
  std::size_t payload_bytes() const {
    std::size_t b = 8 * keys_.size() * (5 + P_) + 8 * num_slices() * (1 + P_ + Q_);
    if (runs_) b += keys_.size() * (16 + 9 * outs_.size());
    return b;
  }

  // Last end of a window [k*S, k*S + W) containing time t.
  static std::int64_t last_end(std::int64_t t, std::int64_t W, std::int64_t S) {
    return floor_div(t, S) * S + W;
  }

  std::size_t nrows(const Key& k) const { return k.rows.size() / R_; }
  std::int64_t start(const Key& k, std::int64_t i) const { return k.rows[i * R_]; }
  std::int64_t part(const Key& k, std::int64_t i, std::size_t p) const { return k.rows[i * R_ + 2 + p]; }
  std::int64_t suf(const Key& k, std::int64_t i, std::size_t q) const { return k.rows[i * R_ + 2 + P_ + q]; }
  // Set the rows of a key being deserialized: start, partials and suffixes (epoch 0).
  void set_row(Key& k, std::int64_t i, std::int64_t st, const std::int64_t* parts_row, const std::int64_t* suf_row) {
    std::int64_t* r = &k.rows[i * R_];
    r[0] = st;
    r[1] = 0;
    for (std::size_t p = 0; p < P_; ++p) r[2 + p] = parts_row[p];
    for (std::size_t q = 0; q < Q_; ++q) r[2 + P_ + q] = suf_row[q];
  }

 private:
  static void check_window(std::int64_t W, std::int64_t S) {
    if (W <= 0 || S <= 0) throw std::invalid_argument("window and slide must be positive");
  }
  std::int64_t* rowp(Key& k, std::int64_t i) { return &k.rows[i * R_]; }

  // First row >= from with start >= t, by galloping from `from`: O(log d) for a row d rows ahead,
  // O(1) for the next one (the common case of dense slices).
  std::int64_t lower_bound(const Key& k, std::int64_t from, std::int64_t t) const {
    const std::int64_t n = static_cast<std::int64_t>(nrows(k));
    if (from >= n || start(k, from) >= t) return from;
    std::int64_t below = from, step = 1;  // start(below) < t
    while (below + step < n && start(k, below + step) < t) {
      below += step;
      step *= 2;
    }
    std::int64_t a = below + 1, b = std::min(below + step, n);
    while (a < b) {
      const std::int64_t c = a + (b - a) / 2;
      if (start(k, c) < t) a = c + 1;
      else b = c;
    }
    return a;
  }

  // Adds slice (t, x) to key k: merges into a row with the same start or inserts a row, keeping the
  // queue's aggregates exact when the slice falls inside it.
  void insert(Key& k, std::int64_t t, const std::int64_t* x) {
    const std::int64_t n = static_cast<std::int64_t>(nrows(k));
    std::int64_t pos = (n == k.head || start(k, n - 1) < t) ? n : lower_bound(k, k.head, t);
    if (pos < n && start(k, pos) == t) {
      std::int64_t* r = rowp(k, pos);
      for (std::size_t p = 0; p < P_; ++p)
        if (kinds_[p] != kPairValue) combine_at(kinds_[p], &r[2 + p], &x[p]);
      r[1] = epoch_;
      if (pos >= k.lo && pos < k.hi) fold_into_queue(k, pos, x, false);
      return;
    }
    if (pos == n) {
      k.rows.resize(k.rows.size() + R_);
    } else {
      k.rows.insert(k.rows.begin() + pos * static_cast<std::int64_t>(R_), R_, 0);
    }
    std::int64_t* r = rowp(k, pos);
    r[0] = t;
    r[1] = epoch_;
    for (std::size_t p = 0; p < P_; ++p) r[2 + p] = x[p];
    // A row right before the queue's first row joins it (a later move pops it if it is before the
    // window); a row further back stays out (a later move restarts the queue if it is needed).
    if (pos < k.lo || (pos == k.lo && k.lo == k.hi)) {
      ++k.lo, ++k.mid, ++k.hi;
    } else if (pos < k.hi) {  // inside: the queue now holds it
      ++k.hi;
      if (pos < k.mid) ++k.mid;
      fold_into_queue(k, pos, x, true);
    }
    // pos >= hi: after the queue; a later move pushes it.
  }

  // Slice x (at row pos, inside [lo, hi)) joins the queue's aggregates. For a new front row its own
  // suffix aggregate is set too.
  void fold_into_queue(Key& k, std::int64_t pos, const std::int64_t* x, bool new_row) {
    for (std::size_t p = 0; p < P_; ++p) {
      const std::uint8_t kind = kinds_[p];
      if (kind == kPairValue) continue;  // with its time (p - 1)
      if (kind == kAddI64 || pos >= k.mid) {
        combine_at(kind, &k.run[p], &x[p]);
        continue;
      }
      const std::size_t q = static_cast<std::size_t>(suf_of_[p]);
      std::int64_t* base = &k.rows[2 + P_ + q];  // a pair's value suffix is q + 1, right after it
      if (new_row) {
        std::int64_t acc[kMaxWidth];
        acc[0] = x[p];
        for (std::size_t j = 1; j < width(kind); ++j) acc[j] = x[p + j];
        if (pos + 1 < k.mid) combine_at(kind, acc, &base[(pos + 1) * R_]);
        for (std::size_t j = 0; j < width(kind); ++j) base[pos * R_ + j] = acc[j];
      }
      for (std::int64_t i = k.lo; i < pos + (new_row ? 0 : 1); ++i) combine_at(kind, &base[i * R_], &x[p]);
    }
  }

  void reset_queue(Key& k, std::int64_t pos) {
    k.lo = k.mid = k.hi = pos;
    for (std::size_t p = 0; p < P_; ++p) k.run[p] = identity(kinds_[p]);
  }
  void push(Key& k) {
    const std::int64_t* r = &k.rows[k.hi * R_ + 2];
    for (std::size_t p = 0; p < P_; ++p)
      if (kinds_[p] != kPairValue) combine_at(kinds_[p], &k.run[p], &r[p]);
    ++k.hi;
  }
  void pop(Key& k) {
    if (k.lo == k.mid) flip(k);
    const std::int64_t* r = &k.rows[k.lo * R_ + 2];
    for (std::size_t p = 0; p < P_; ++p)
      if (kinds_[p] == kAddI64)
        k.run[p] = static_cast<std::int64_t>(static_cast<std::uint64_t>(k.run[p]) - static_cast<std::uint64_t>(r[p]));
    ++k.lo;
  }
  void flip(Key& k) {  // move the back [mid, hi) to the front: suffix aggregates, newest to oldest
    for (std::size_t p = 0; p < P_; ++p) {
      const std::uint8_t kind = kinds_[p];
      if (kind == kAddI64 || kind == kPairValue) continue;
      const std::size_t q = static_cast<std::size_t>(suf_of_[p]);
      std::int64_t acc[kMaxWidth];
      acc[0] = identity(kind);
      std::fill(acc + 1, acc + width(kind), 0);
      for (std::int64_t i = k.hi - 1; i >= k.lo; --i) {
        std::int64_t* r = &k.rows[i * R_];
        combine_at(kind, acc, &r[2 + p]);
        for (std::size_t j = 0; j < width(kind); ++j) r[2 + P_ + q + j] = acc[j];
      }
      k.run[p] = identity(kind);
      for (std::size_t j = 1; j < width(kind); ++j) k.run[p + j] = 0;
    }
    k.mid = k.hi;
  }
  // Positions the queue on window [ws, we): forward moves pop and push; a move the queue cannot make
  // forward (backwards, or rows it already dropped) restarts it at the window.
  void move_to(Key& k, std::int64_t ws, std::int64_t we) {
    const std::int64_t n = static_cast<std::int64_t>(nrows(k));
    const bool forward = (k.lo == k.head || start(k, k.lo - 1) < ws) && (k.hi == k.head || start(k, k.hi - 1) < we);
    if (!forward || k.lo == k.hi) reset_queue(k, lower_bound(k, std::max(k.head, forward ? k.hi : k.head), ws));
    while (k.hi < n && start(k, k.hi) < we) push(k);
    while (k.lo < k.hi && start(k, k.lo) < ws) pop(k);
  }
  void query(const Key& k, std::int64_t* vals, std::uint8_t* ok) {
    for (std::size_t p = 0; p < P_; ++p) {
      const std::uint8_t kind = kinds_[p];
      if (kind == kPairValue) continue;  // with its time (p - 1)
      for (std::size_t j = 0; j < width(kind); ++j)
        combined_[p + j] = (kind == kAddI64 || k.lo >= k.mid)
                               ? k.run[p + j] : suf(k, k.lo, static_cast<std::size_t>(suf_of_[p]) + j);
      if (kind != kAddI64 && k.lo < k.mid) combine_at(kind, &combined_[p], &k.run[p]);
    }
    for (std::size_t o = 0; o < outs_.size(); ++o) finalize(outs_[o], combined_.data(), &vals[o], &ok[o]);
  }
  void compact(Key& k) {  // drop dead rows once they are the majority
    if (k.head < 32 || 2 * k.head < static_cast<std::int64_t>(nrows(k))) return;
    k.rows.erase(k.rows.begin(), k.rows.begin() + k.head * static_cast<std::int64_t>(R_));
    k.lo -= k.head, k.mid -= k.head, k.hi -= k.head;
    k.head = 0;
  }

  // Calls fn(ws, we) with values/valid filled, for each window of key k in time order (see
  // emit_windows). Rows are visited only where a new window can start: after the windows of a row,
  // the next row considered is the first starting at or after the next window's start.
  template <class Fn>
  void for_each_window(Key& k, std::int64_t W, std::int64_t S, bool has_lo, std::int64_t lo_end, bool has_hi,
                       std::int64_t hi_end, bool only_touched, std::int64_t* vals, std::uint8_t* ok,
                       std::int64_t k_min, std::int64_t k_max, Fn&& fn) {
    const std::int64_t n = static_cast<std::int64_t>(nrows(k));
    std::int64_t k_lo = kI64Min, k_hi = kI64Max;
    if (has_lo) k_lo = floor_div(lo_end - W, S) + 1;  // k*S + W > lo_end
    if (has_hi) k_hi = floor_div(hi_end - W, S);      // k*S + W <= hi_end
    k_lo = std::max(k_lo, k_min);
    k_hi = std::min(k_hi, k_max);
    if (k_lo > k_hi) return;
    std::int64_t k_next = k_lo;
    // A row's last window is floor(t/S): rows before k_lo*S have none left.
    std::int64_t i = k_lo != kI64Min ? lower_bound(k, k.head, k_lo * S) : k.head;
    while (i < n) {
      const std::int64_t t = start(k, i);
      if (has_hi && t >= hi_end) break;  // its windows end after t >= hi_end
      const std::int64_t first = floor_div(t - W, S) + 1;  // the row's first window
      if (first > k_hi) break;  // rows are in time order: later rows start later windows
      if (only_touched && k.rows[i * R_ + 1] != epoch_) {
        ++i;
        continue;
      }
      std::int64_t kf = std::max(first, k_next), kl = std::min(floor_div(t, S), k_hi);
      for (std::int64_t w = kf; w <= kl; ++w) {
        move_to(k, w * S, w * S + W);
        query(k, vals, ok);
        fn(w * S, w * S + W);
        k_next = w + 1;
      }
      if (k_next != kI64Min && k_next > k_hi) break;  // the last window allowed by hi_end is done
      if (only_touched || k_next == kI64Min) ++i;
      else i = lower_bound(k, i + 1, k_next * S);
    }
  }

  std::vector<std::uint8_t> kinds_;
  std::vector<OutSpec> outs_;
  bool runs_;
  std::vector<int> suf_of_;  // partial -> suffix column, -1 for add-int64 partials
  std::size_t P_ = 0, Q_ = 0, R_ = 0;
  bool has_wm_ = false;
  std::int64_t wm_ = 0;
  std::int64_t epoch_ = 0;
  std::vector<Key> keys_;
  std::vector<std::int64_t> combined_;
  I64Index index_;
};

}  // namespace agg
}  // namespace cq
