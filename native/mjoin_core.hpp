// The multi-way join's state kernel (issue 15, MJoin): one symmetric hash state per input, no
// intermediate state.
//
// n inputs (2 to 6) share one equi-join key; `bounds` are temporal constraints (i, j, lower, upper):
// times[j] - times[i] in [lower, upper], inclusive. Per input the state is an open-addressing hash
// table from the key to a doubly linked chain of that input's rows (oldest first) plus a min-heap of
// (deadline, row), so evict() touches only the rows whose deadline has passed, with O(log n) work each
// and none for the rows that stay. Rows expire in stages (see evict()): a row whose required partner
// input has no stored row it could join, and can get none any more, goes before the full reach of the
// bounds has passed; this keeps MJoin's base state near what a chain of binary joins keeps, without
// storing intermediate results.
//
// A row arriving on input a probes the other inputs one after another in the probe order given for
// that call (a permutation of the other inputs), extending a partial match {a: row} by every stored row
// of the next input with the same key that satisfies every bound between the inputs already bound and
// the new one. Partial matches exist only on the stack (depth-first), never in the state. Complete
// matches are emitted as n payload ids (column i = input i's row). The output is the same multiset for
// every probe order; only the work (the per-step counters) differs.
//
// Within one insert_probe call the arriving rows first all probe the state as it was before the call,
// then are all stored: rows of the same call never see each other. A caller that feeds the inputs one
// call at a time therefore emits every qualifying tuple exactly once, in the call that inserted its
// last row.
//
// Representation of this first kernel: keys are int64 values (the caller hashes or dictionary-encodes
// wider keys injectively) plus a null mask; null-keyed rows never match and are neither probed nor
// stored. Times, expiry keys and payload ids are int64. The kernel never sees payload values.
//
// Plain C++17, no Python: mjoin.cpp is the pybind11 module pyspark_cq._mjoin.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <queue>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#include "serde.hpp"

namespace cq {
namespace mjoin {

constexpr int64_t kFormatVersion = 2;  // 2: per row the expiry stage (1: none, explicit ends only)
constexpr int kMaxInputs = 6;

struct Bound {
  int i, j;
  int64_t lower, upper;
};

// Open-addressing (linear probing, load <= 1/2) map from a key to its chain (head, tail slots); erase
// shifts later entries back, so there are no tombstones and lookups stay short under churn.
class KeyIndex {
 public:
  struct Entry {
    int64_t key, head, tail;
  };
  KeyIndex() { rehash(16); }
  size_t size() const { return size_; }
  // The entry of `key`, or nullptr.
  Entry* find(int64_t key) {
    for (size_t i = home(key);; i = (i + 1) & mask_) {
      if (!used_[i]) return nullptr;
      if (e_[i].key == key) return &e_[i];
    }
  }
  const Entry* find(int64_t key) const { return const_cast<KeyIndex*>(this)->find(key); }
  // The entry of `key`, inserted with an empty chain when missing (valid until the next insert).
  Entry& get_or_insert(int64_t key) {
    if (2 * (size_ + 1) > e_.size()) rehash(2 * e_.size());
    size_t i = home(key);
    for (; used_[i]; i = (i + 1) & mask_)
      if (e_[i].key == key) return e_[i];
    used_[i] = 1;
    e_[i] = {key, -1, -1};
    ++size_;
    return e_[i];
  }
  void erase(Entry* ent) {
    size_t i = static_cast<size_t>(ent - e_.data());
    used_[i] = 0;
    --size_;
    for (size_t j = (i + 1) & mask_; used_[j]; j = (j + 1) & mask_) {
      const size_t h = home(e_[j].key);
      // move e_[j] back to the hole i unless its home lies cyclically in (i, j]
      if (((j - h) & mask_) >= ((j - i) & mask_)) {
        e_[i] = e_[j];
        used_[i] = 1;
        used_[j] = 0;
        i = j;
      }
    }
  }
  template <class F>
  void for_each(F f) const {
    for (size_t i = 0; i < e_.size(); ++i)
      if (used_[i]) f(e_[i]);
  }

 private:
  size_t home(int64_t key) const {
    return static_cast<size_t>(splitmix64_finalize(static_cast<uint64_t>(key))) & mask_;
  }
  void rehash(size_t cap) {
    std::vector<Entry> old = std::move(e_);
    std::vector<uint8_t> old_used = std::move(used_);
    e_.assign(cap, Entry{0, -1, -1});
    used_.assign(cap, 0);
    mask_ = cap - 1;
    for (size_t i = 0; i < old.size(); ++i) {
      if (!old_used[i]) continue;
      size_t j = home(old[i].key);
      while (used_[j]) j = (j + 1) & mask_;
      e_[j] = old[i];
      used_[j] = 1;
    }
  }
  std::vector<Entry> e_;
  std::vector<uint8_t> used_;
  size_t mask_ = 0, size_ = 0;
};

// One input's rows: slots with a free list, per-key chains, an expiry heap.
struct Side {
  std::vector<int64_t> key, time, id, end, stage, prev, next;
  std::vector<uint8_t> alive;  // 0 once removed: its heap entries are stale (remove_ids leaves them there)
  std::vector<int64_t> free_slots;
  KeyIndex index;
  using HeapItem = std::pair<int64_t, int64_t>;  // (expiry key, slot)
  std::priority_queue<HeapItem, std::vector<HeapItem>, std::greater<HeapItem>> heap;
  int64_t live = 0;

  // `st` is the row's expiry stage (see MultiJoinState::evict), -1 for an explicit expiry key `e`.
  void store(int64_t k, int64_t t, int64_t pid, int64_t e, int64_t st) {
    int64_t s;
    if (!free_slots.empty()) {
      s = free_slots.back();
      free_slots.pop_back();
      key[s] = k, time[s] = t, id[s] = pid, end[s] = e, stage[s] = st, alive[s] = 1;
    } else {
      s = static_cast<int64_t>(key.size());
      key.push_back(k), time.push_back(t), id.push_back(pid), end.push_back(e), stage.push_back(st);
      prev.push_back(-1), next.push_back(-1), alive.push_back(1);
    }
    KeyIndex::Entry& c = index.get_or_insert(k);
    prev[s] = c.tail;
    next[s] = -1;
    if (c.tail >= 0) next[c.tail] = s; else c.head = s;
    c.tail = s;
    heap.emplace(e, s);
    ++live;
  }

  void remove(int64_t s) {
    KeyIndex::Entry* c = index.find(key[s]);
    if (prev[s] >= 0) next[prev[s]] = next[s]; else c->head = next[s];
    if (next[s] >= 0) prev[next[s]] = prev[s]; else c->tail = prev[s];
    if (c->head < 0) index.erase(c);
    free_slots.push_back(s);
    alive[s] = 0;
    --live;
  }

  // Whether a heap entry still stands for its row: a row removed by remove_ids (its slot perhaps reused)
  // or moved to a later stage leaves an entry that no longer matches the slot.
  bool current(const HeapItem& h) const { return alive[h.second] && end[h.second] == h.first; }

  // Pop stale entries off the top, so that the top is the smallest live expiry key.
  void purge() {
    while (!heap.empty() && !current(heap.top())) heap.pop();
  }

  int64_t chain_head(int64_t k) const {
    const KeyIndex::Entry* c = index.find(k);
    return c ? c->head : -1;
  }
};

// The result of one insert_probe call.
struct Result {
  std::vector<int64_t> ids;      // n_matches * n_inputs payload ids, row-major
  std::vector<int64_t> probed;   // per probe step: partial matches entering the step
  std::vector<int64_t> matched;  // per probe step: partial matches leaving it (extended)
};

// The result of one probe_step call: the extended partial matches (row-major, n_inputs per row).
struct StepResult {
  std::vector<int64_t> keys, ids, times;
};

class MultiJoinState {
 public:
  MultiJoinState(int n_inputs, std::vector<Bound> bounds) : n_(n_inputs), bounds_(std::move(bounds)), sides_() {
    if (n_inputs < 2 || n_inputs > kMaxInputs)
      throw std::invalid_argument("n_inputs must be between 2 and 6, got " + std::to_string(n_inputs));
    for (const Bound& b : bounds_) {
      if (b.i < 0 || b.i >= n_ || b.j < 0 || b.j >= n_ || b.i == b.j)
        throw std::invalid_argument("bounds: (i, j) must be two different inputs in [0, n_inputs)");
      if (b.lower > b.upper) throw std::invalid_argument("bounds: lower must be <= upper");
    }
    sides_.resize(n_);
    close_bounds();
  }

  int n_inputs() const { return n_; }
  const std::vector<Bound>& bounds() const { return bounds_; }

  void input_index(int input) const {
    if (input < 0 || input >= n_)
      throw std::invalid_argument("input must be in [0, " + std::to_string(n_) + "), got " + std::to_string(input));
  }

  int64_t rows(int input) const {
    input_index(input);
    return sides_[input].live;
  }
  int64_t keys(int input) const {
    input_index(input);
    return static_cast<int64_t>(sides_[input].index.size());
  }

  // Checks that `order` is a permutation of the inputs other than `input`.
  void check_order(int input, const std::vector<int>& order) const {
    input_index(input);
    if (static_cast<int>(order.size()) != n_ - 1)
      throw std::invalid_argument("order must list the " + std::to_string(n_ - 1) + " other inputs, got " +
                                  std::to_string(order.size()) + " entries");
    std::vector<bool> seen(n_, false);
    seen[input] = true;
    for (int o : order) {
      if (o < 0 || o >= n_ || seen[o])
        throw std::invalid_argument("order must be a permutation of the inputs other than " +
                                    std::to_string(input) + " (bad or repeated entry " + std::to_string(o) + ")");
      seen[o] = true;
    }
  }

  // Probe with n rows arriving on `input` (null_key may be null: no null keys; ends may be null: the
  // times), then store them. See the file comment for the semantics.
  Result insert_probe(int input, int64_t n, const int64_t* keys, const int64_t* times, const int64_t* ids,
                      const uint8_t* null_key, const int64_t* ends, const std::vector<int>& order) {
    const std::vector<std::vector<Check>> checks = step_checks(input, order);
    Result res;
    res.probed.assign(n_ - 1, 0);
    res.matched.assign(n_ - 1, 0);
    Ctx ctx{order.data(), checks.data(), &res, {}, {}};
    for (int64_t r = 0; r < n; ++r) {
      if (null_key && null_key[r]) continue;
      ctx.bound_id[input] = ids[r];
      ctx.bound_time[input] = times[r];
      extend(ctx, 0, keys[r]);
    }
    store(input, n, keys, times, ids, null_key, ends);
    return res;
  }

  // Store n rows of `input` without probing (arguments as for insert_probe): the second half of
  // insert_probe, for a caller that ran the probe itself one step at a time (probe_step).
  void store(int input, int64_t n, const int64_t* keys, const int64_t* times, const int64_t* ids,
             const uint8_t* null_key, const int64_t* ends) {
    input_index(input);
    Side& s = sides_[input];
    for (int64_t r = 0; r < n; ++r) {
      if (null_key && null_key[r]) continue;
      if (ends) {
        s.store(keys[r], times[r], ids[r], ends[r], -1);
      } else {
        s.store(keys[r], times[r], ids[r], deadline(input, times[r], 0), 0);
      }
    }
  }

  // One probe step, breadth-first: m partial matches of rows arriving on `input` (their key; per input
  // a payload id and a time, row-major m x n_inputs, meaningful for `input` and order[0 .. step-1]) probe
  // input order[step] and are extended by every stored row of it that satisfies the bounds, exactly as
  // step `step` of insert_probe extends them depth-first. Running steps 0 .. n-2 in sequence over all
  // partial matches of a batch of arriving rows, with the state unchanged in between, then store(), gives
  // insert_probe's matches (in another order) and its per-step counters: probed = m, matched = the rows
  // returned. This lets the caller schedule the steps over chunks (Chain, STREAM §5.3).
  StepResult probe_step(int input, const std::vector<int>& order, int step, int64_t m, const int64_t* keys,
                        const int64_t* ids, const int64_t* times) const {
    const std::vector<std::vector<Check>> checks = step_checks(input, order);
    if (step < 0 || step >= n_ - 1)
      throw std::invalid_argument("step must be in [0, " + std::to_string(n_ - 1) + "), got " + std::to_string(step));
    StepResult out;
    const int in = order[step];
    const Side& s = sides_[in];
    const std::vector<Check>& ck = checks[step];
    for (int64_t r = 0; r < m; ++r) {
      const int64_t* rid = ids + r * n_;
      const int64_t* rt = times + r * n_;
      for (int64_t x = s.chain_head(keys[r]); x >= 0; x = s.next[x]) {
        const int64_t t = s.time[x];
        bool ok = true;
        for (const Check& ch : ck) {
          const __int128 d = static_cast<__int128>(t) - rt[ch.other];
          if (d < ch.lo || d > ch.hi) {
            ok = false;
            break;
          }
        }
        if (!ok) continue;
        out.keys.push_back(keys[r]);
        out.ids.insert(out.ids.end(), rid, rid + n_);
        out.ids[out.ids.size() - n_ + in] = s.id[x];
        out.times.insert(out.times.end(), rt, rt + n_);
        out.times[out.times.size() - n_ + in] = t;
      }
    }
    return out;
  }

  // Remove the rows of `input` that can no longer join; returns their payload ids.
  //
  // Rows stored with explicit expiry keys (`ends`) go when their key is <= threshold. Rows stored without
  // them expire in stages, with `threshold` a time such that every row still to come is later than it
  // (the watermark): with D[i][j] the largest t_j - t_i the bounds allow (their closure), a row of input i
  // at time t can meet future rows of input j only while threshold < t + D[i][j]. At each stage's deadline
  // (the distinct D[i][j] in ascending order) the row is removed if some input j it can no longer meet
  // from the future has no stored row it could join (same key, t_j - t within [-D[j][i], D[i][j]]): every
  // result tuple needs a row of j, and none can come. Otherwise it waits for the next stage; after the
  // last one no row it can meet is still to come, and it goes. Work is proportional to the rows whose
  // deadline passes (plus the partner chains they check), never to the rows that stay.
  std::vector<int64_t> evict(int input, int64_t threshold) {
    input_index(input);
    Side& s = sides_[input];
    std::vector<int64_t> out;
    while (!s.heap.empty() && s.heap.top().first <= threshold) {
      const Side::HeapItem top = s.heap.top();
      s.heap.pop();
      if (!s.current(top)) continue;  // removed by remove_ids
      const int64_t slot = top.second;
      const int64_t st = s.stage[slot];
      const std::vector<int64_t>& stages = stage_reach_[input];
      if (st >= 0 && st + 1 < static_cast<int64_t>(stages.size()) && !lacks_partner(input, slot, stages[st])) {
        s.stage[slot] = st + 1;
        s.end[slot] = deadline(input, s.time[slot], st + 1);
        s.heap.emplace(s.end[slot], slot);
        continue;
      }
      out.push_back(s.id[slot]);
      s.remove(slot);
    }
    s.purge();
    return out;
  }

  // The live rows of `input` (keys, times, payload ids), in no particular order: what a caller needs to
  // decide which rows its stream constraints make useless (pyspark_cq.constraints, STREAM §5.2).
  void live_rows(int input, std::vector<int64_t>* keys, std::vector<int64_t>* times,
                 std::vector<int64_t>* ids) const {
    input_index(input);
    const Side& s = sides_[input];
    keys->reserve(s.live), times->reserve(s.live), ids->reserve(s.live);
    s.index.for_each([&](const KeyIndex::Entry& en) {
      for (int64_t x = en.head; x >= 0; x = s.next[x])
        keys->push_back(s.key[x]), times->push_back(s.time[x]), ids->push_back(s.id[x]);
    });
  }

  // Remove the live rows of `input` whose payload id is among the n `ids` (ids that no live row has are
  // ignored); returns how many went. Their heap entries become stale and are skipped by evict.
  int64_t remove_ids(int input, int64_t n, const int64_t* ids) {
    input_index(input);
    Side& s = sides_[input];
    if (n == 0 || s.live == 0) return 0;
    std::vector<int64_t> want(ids, ids + n);
    std::sort(want.begin(), want.end());
    std::vector<int64_t> slots;
    s.index.for_each([&](const KeyIndex::Entry& en) {
      for (int64_t x = en.head; x >= 0; x = s.next[x])
        if (std::binary_search(want.begin(), want.end(), s.id[x])) slots.push_back(x);
    });
    for (int64_t x : slots) s.remove(x);
    s.purge();
    return static_cast<int64_t>(slots.size());
  }

  // Smallest expiry key of `input`, or false when empty.
  bool min_end(int input, int64_t* out) const {
    input_index(input);
    const Side& s = sides_[input];
    if (s.heap.empty()) return false;
    *out = s.heap.top().first;
    return true;
  }

  // D[i][j], the largest t_j - t_i the bounds allow (see close_bounds), as doubles; +infinity where the
  // bounds leave it unbounded. A negative D[i][i] means the bounds contradict each other.
  std::vector<std::vector<double>> closure() const {
    std::vector<std::vector<double>> out(n_, std::vector<double>(n_));
    for (int i = 0; i < n_; ++i)
      for (int j = 0; j < n_; ++j)
        out[i][j] = reach_[i][j] >= kUnbounded ? std::numeric_limits<double>::infinity()
                                                : static_cast<double>(reach_[i][j]);
    return out;
  }

  // Renumber `input`'s payload ids to 0..rows-1 in serialization order (keys ascending, oldest first
  // within a key) and return the old ids in that order, so that the caller can compact its payload
  // table with one take() and drop the rows evicted since the last call.
  std::vector<int64_t> canonical_ids(int input) {
    input_index(input);
    Side& s = sides_[input];
    std::vector<int64_t> old;
    old.reserve(s.live);
    for (int64_t key : sorted_keys(s)) {
      for (int64_t x = s.chain_head(key); x >= 0; x = s.next[x]) {
        old.push_back(s.id[x]);
        s.id[x] = static_cast<int64_t>(old.size()) - 1;
      }
    }
    return old;
  }

  // Byte image (cq::Writer, CQS1): meta [version, n, nbounds, (i, j, lower, upper)...], then per input
  // the live rows as key, time, id, end columns, oldest first within each key.
  std::string serialize() const {
    cq::Writer w(static_cast<uint32_t>(1 + 5 * n_));
    std::vector<int64_t> meta{kFormatVersion, int64_t{n_}, static_cast<int64_t>(bounds_.size())};
    for (const Bound& b : bounds_) meta.insert(meta.end(), {int64_t{b.i}, int64_t{b.j}, b.lower, b.upper});
    w.column(cq::kI64, meta);
    for (const Side& s : sides_) {
      std::vector<int64_t> k, t, id, e, st;
      k.reserve(s.live), t.reserve(s.live), id.reserve(s.live), e.reserve(s.live), st.reserve(s.live);
      for (int64_t key : sorted_keys(s)) {
        for (int64_t x = s.chain_head(key); x >= 0; x = s.next[x]) {
          k.push_back(key), t.push_back(s.time[x]), id.push_back(s.id[x]), e.push_back(s.end[x]);
          st.push_back(s.stage[x]);
        }
      }
      w.column(cq::kI64, k), w.column(cq::kI64, t), w.column(cq::kI64, id), w.column(cq::kI64, e);
      w.column(cq::kI64, st);
    }
    return std::move(w.str());
  }

  static MultiJoinState deserialize(const char* data, size_t size) {
    cq::Reader r(data, size);
    const auto meta = r.column<int64_t>(cq::kI64);
    if (meta.size() < 3 || meta[0] < 1 || meta[0] > kFormatVersion)
      throw std::invalid_argument("multi-join state blob has format version " +
                                  (meta.empty() ? std::string("?") : std::to_string(meta[0])) +
                                  "; this pyspark-cq reads multi-join state formats 1 to " +
                                  std::to_string(kFormatVersion) + ": start the query with a new checkpoint location");
    const int64_t version = meta[0], n = meta[1], nb = meta[2];
    const int64_t per_input = version == 1 ? 4 : 5;
    if (n < 2 || n > kMaxInputs || nb < 0 || meta.size() != static_cast<size_t>(3 + 4 * nb) ||
        r.ncols() != static_cast<uint32_t>(1 + per_input * n))
      throw std::invalid_argument("state blob is truncated or corrupt (multi-join meta)");
    std::vector<Bound> bounds;
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t* m = &meta[3 + 4 * b];
      bounds.push_back({static_cast<int>(m[0]), static_cast<int>(m[1]), m[2], m[3]});
    }
    MultiJoinState st(static_cast<int>(n), std::move(bounds));
    for (int in = 0; in < n; ++in) {
      const auto k = r.column<int64_t>(cq::kI64);
      const auto t = r.column<int64_t>(cq::kI64);
      const auto id = r.column<int64_t>(cq::kI64);
      const auto e = r.column<int64_t>(cq::kI64);
      const auto sg = version == 1 ? std::vector<int64_t>(k.size(), -1) : r.column<int64_t>(cq::kI64);
      if (t.size() != k.size() || id.size() != k.size() || e.size() != k.size() || sg.size() != k.size())
        throw std::invalid_argument("state blob is truncated or corrupt (column lengths differ)");
      const int64_t nstages = static_cast<int64_t>(st.stage_reach_[in].size());
      for (size_t x = 0; x < k.size(); ++x) {
        if (sg[x] < -1 || sg[x] >= nstages)
          throw std::invalid_argument("state blob is corrupt (expiry stage out of range)");
        st.sides_[in].store(k[x], t[x], id[x], e[x], sg[x]);
      }
    }
    if (!r.done()) throw std::invalid_argument("state blob has trailing bytes");
    return st;
  }

 private:
  static constexpr __int128 kUnbounded = static_cast<__int128>(1) << 100;

  // reach_[i][j] = D[i][j], the largest t_j - t_i the bounds allow (Floyd-Warshall over the difference
  // constraints t_j - t_i <= upper, t_i - t_j <= -lower; kUnbounded where none); stage_reach_[i] the
  // distinct finite D[i][j] (j != i) in ascending order: the deadlines of the expiry stages.
  void close_bounds() {
    std::vector<std::vector<__int128>> d(n_, std::vector<__int128>(n_, kUnbounded));
    for (int i = 0; i < n_; ++i) d[i][i] = 0;
    for (const Bound& b : bounds_) {
      d[b.i][b.j] = std::min(d[b.i][b.j], static_cast<__int128>(b.upper));
      d[b.j][b.i] = std::min(d[b.j][b.i], -static_cast<__int128>(b.lower));
    }
    for (int k = 0; k < n_; ++k)
      for (int i = 0; i < n_; ++i)
        for (int j = 0; j < n_; ++j)
          if (d[i][k] < kUnbounded && d[k][j] < kUnbounded) d[i][j] = std::min(d[i][j], d[i][k] + d[k][j]);
    reach_ = d;
    stage_reach_.assign(n_, {});
    for (int i = 0; i < n_; ++i) {
      std::vector<int64_t> st;
      bool unbounded = false;
      for (int j = 0; j < n_; ++j) {
        if (j == i) continue;
        if (d[i][j] >= kUnbounded) unbounded = true;
        else st.push_back(clamp(d[i][j]));
      }
      std::sort(st.begin(), st.end());
      st.erase(std::unique(st.begin(), st.end()), st.end());
      // Bounds that do not connect every input: a row may meet some input's future rows forever.
      if (unbounded) st.push_back(std::numeric_limits<int64_t>::max());
      stage_reach_[i] = st;
    }
  }

  static int64_t clamp(__int128 v) {
    if (v > std::numeric_limits<int64_t>::max()) return std::numeric_limits<int64_t>::max();
    if (v < std::numeric_limits<int64_t>::min()) return std::numeric_limits<int64_t>::min();
    return static_cast<int64_t>(v);
  }

  // The deadline of expiry stage `st` of a row of `input` at time t (saturating).
  int64_t deadline(int input, int64_t t, int64_t st) const {
    return clamp(static_cast<__int128>(t) + stage_reach_[input][st]);
  }

  // True when some input j with D[input][j] <= passed has no stored row that the row in `slot` could
  // join with: same key and t_j - t within [-D[j][input], D[input][j]].
  bool lacks_partner(int input, int64_t slot, int64_t passed) const {
    const Side& s = sides_[input];
    const int64_t key = s.key[slot];
    const __int128 t = s.time[slot];
    for (int j = 0; j < n_; ++j) {
      if (j == input || reach_[input][j] > passed) continue;
      const Side& o = sides_[j];
      bool found = false;
      for (int64_t x = o.chain_head(key); x >= 0 && !found; x = o.next[x]) {
        const __int128 dt = static_cast<__int128>(o.time[x]) - t;
        found = dt >= -reach_[j][input] && dt <= reach_[input][j];
      }
      if (!found) return true;
    }
    return false;
  }

  // Keys in ascending order, so that equal states give equal images.
  static std::vector<int64_t> sorted_keys(const Side& s) {
    std::vector<int64_t> ks;
    ks.reserve(s.index.size());
    s.index.for_each([&](const KeyIndex::Entry& en) { ks.push_back(en.key); });
    std::sort(ks.begin(), ks.end());
    return ks;
  }

  struct Check {
    int other;
    __int128 lo, hi;
  };

  // Per step k of `order` for rows arriving on `input`: the constraints between order[k] and the inputs
  // bound before it, as t_new - t_other in [lo, hi] (128-bit so negating a bound cannot overflow).
  std::vector<std::vector<Check>> step_checks(int input, const std::vector<int>& order) const {
    check_order(input, order);
    std::vector<std::vector<Check>> checks(n_ - 1);
    std::vector<int> pos(n_, -1);  // step at which an input is bound (-1: the arriving input)
    for (int k = 0; k < n_ - 1; ++k) pos[order[k]] = k;
    pos[input] = -1;
    for (const Bound& b : bounds_) {
      // t_j - t_i in [lower, upper]; the later-bound of i, j is the "new" one.
      if (pos[b.j] > pos[b.i]) {
        checks[pos[b.j]].push_back({b.i, static_cast<__int128>(b.lower), static_cast<__int128>(b.upper)});
      } else {
        checks[pos[b.i]].push_back({b.j, -static_cast<__int128>(b.upper), -static_cast<__int128>(b.lower)});
      }
    }
    return checks;
  }
  struct Ctx {
    const int* order;
    const std::vector<Check>* checks;
    Result* res;
    int64_t bound_id[kMaxInputs];
    int64_t bound_time[kMaxInputs];
  };

  void extend(Ctx& c, int k, int64_t key) const {
    const int steps = n_ - 1;
    c.res->probed[k] += 1;
    const int in = c.order[k];
    const Side& s = sides_[in];
    const std::vector<Check>& ck = c.checks[k];
    for (int64_t x = s.chain_head(key); x >= 0; x = s.next[x]) {
      const int64_t t = s.time[x];
      bool ok = true;
      for (const Check& ch : ck) {
        const __int128 d = static_cast<__int128>(t) - c.bound_time[ch.other];
        if (d < ch.lo || d > ch.hi) {
          ok = false;
          break;
        }
      }
      if (!ok) continue;
      c.res->matched[k] += 1;
      c.bound_id[in] = s.id[x];
      c.bound_time[in] = t;
      if (k + 1 < steps) {
        extend(c, k + 1, key);
      } else {
        c.res->ids.insert(c.res->ids.end(), c.bound_id, c.bound_id + n_);
      }
    }
  }

  int n_;
  std::vector<Bound> bounds_;
  std::vector<Side> sides_;
  std::vector<std::vector<__int128>> reach_;
  std::vector<std::vector<int64_t>> stage_reach_;
};

}  // namespace mjoin
}  // namespace cq
