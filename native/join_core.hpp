// The interval join's state kernel: symmetric hash join state with temporal expiration.
//
//
// Implements the join status structure of Cammert, Kraemer, Seeger, Vaupel (PIPES, "A Cost Model for
// Adaptive Resource Management in Data Stream Systems"), section 3.6.3 with the temporal expiration of
// section 2.4.4 and the implementation note of section 3.4.1: per input a hash table from the join key
// to its rows, and all rows additionally linked by their expiry timestamp, so that purging expired rows
// costs O(1) per *removed* row (plus O(number of runs) per purge) and nothing for the rows that stay,
// instead of a scan of the whole state (which is what Spark's own stream-stream join does).
//
// Layout, chosen for memory latency (the state outgrows the CPU caches long before it outgrows RAM):
// - both inputs share one open-addressing index; a key's entry holds each input's chain head and
//   bounds of its newest time and largest expiry key, so a row finds its partners and its own chain
//   with one lookup, and skips a partner chain whose newest row is already out of band unread;
// - rows and entries are one cache line each; chains are singly linked, newest first, by links that
//   carry the slot's generation, so storing a row writes only its entry and its own slot, and a row
//   whose successors all expire with it leaves without touching its chain (State::expire);
// - the expiry linkage is a few runs of (expiry key, row) sorted by expiry key (one per insert call,
//   merged when there are too many), not a heap: expiring walks run heads in insertion order;
// - insert/probe runs as a software pipeline that prefetches index slots, then chain heads;
// - the big arrays are backed by transparent huge pages where Linux offers them (HugeAlloc).
//
// Rows are (key bytes, event time in microseconds, payload id, matched flag, the row's own band
// [lower, upper] and its expiry key). The kernel never sees payload values: the caller keeps them
// (Arrow tables) and addresses them by id. Key equality is exact: the hash only selects the slot,
// the encoded key bytes are compared in full.
//
// Per-row bounds (PIPES section 4.2: a window change applies to new elements only): every row keeps
// the band in force at its own timestamp, and a pair (l, r) is decided by the band of the *earlier*
// element (section 2.4.1: the later element must start inside the earlier one's validity; on a tie,
// the left row's band): keys equal and b.lower <= r.t - l.t <= b.upper. Rows expire by a per-row
// expiry key chosen by the caller (default: the row's time), so rows with different bands still
// expire touching only themselves.
//
// Everything here is plain C++17 (no Python), so the algorithm can be benchmarked and tested alone;
// join.cpp converts between numpy and these types (the pybind11 module pyspark_cq._join).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#include "serde.hpp"

#if defined(__linux__)
#include <sys/mman.h>
#elif defined(_WIN32)
#include <malloc.h>
#endif

// Forces inlining of the named steps of the per-row loop (JoinState::insert_probe), so that naming
// them costs nothing against the single loop body they were cut from.
#if defined(__GNUC__) || defined(__clang__)
#define CQ_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define CQ_ALWAYS_INLINE inline
#endif

namespace cq {
namespace join {

constexpr int64_t kFormatVersion = 3;  // 2: per-row bounds and expiry keys; 3: 2 with delta-coded ids and ends
using cq::kI64Max;
using cq::kI64Min;

// The join's key hash: bytes in 8-byte words through MurmurHash3's finalizer (common.hpp).
inline uint64_t hash_bytes(const uint8_t* p, size_t n) {
  uint64_t h = murmur3_fmix64(0x9E3779B97F4A7C15ULL ^ n);
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    h = murmur3_fmix64(h ^ v) + 0x9E3779B97F4A7C15ULL;
    p += 8;
    n -= 8;
  }
  if (n) {
    uint64_t v = 0;
    std::memcpy(&v, p, n);
    h = murmur3_fmix64(h ^ v ^ (static_cast<uint64_t>(n) << 56));
  }
  return h;
}

// Two's-complement wrapping difference and sum (no signed overflow): wrap_add(b, wrap_sub(a, b)) == a.
inline int64_t wrap_sub(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
}
inline int64_t wrap_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}

inline int64_t sat_add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return b > 0 ? kI64Max : kI64Min;
  return r;
}

// Allocator for the large arrays (index, rows): blocks of 1 MiB and more are 2 MiB-aligned and, on Linux,
// marked for transparent huge pages. Every probe lands on a random line of a state far larger than the
// TLB covers with 4 KiB pages, so without huge pages each access also pays a page walk (two levels of
// them in a virtual machine): measured here, huge pages made insert + probe about twice as fast.
template <class T>
struct HugeAlloc {
  using value_type = T;
  HugeAlloc() = default;
  template <class U>
  HugeAlloc(const HugeAlloc<U>&) {}
  static constexpr size_t kHuge = size_t(2) << 20;
  T* allocate(size_t n) {
    const size_t bytes = std::max<size_t>(n * sizeof(T), 1);
    // Cache-line aligned below 1 MiB (rows and entries are one line each), 2 MiB-aligned above.
    const size_t align = bytes < (size_t(1) << 20) ? 64 : kHuge;
    const size_t rounded = (bytes + align - 1) / align * align;
#if defined(_WIN32)
    void* p = _aligned_malloc(rounded, align);
#else
    void* p = std::aligned_alloc(align, rounded);
#endif
    if (!p) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (align == kHuge) madvise(p, rounded, MADV_HUGEPAGE);
#endif
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) {
#if defined(_WIN32)
    _aligned_free(p);
#else
    std::free(p);
#endif
  }
  template <class U>
  bool operator==(const HugeAlloc<U>&) const { return true; }
  template <class U>
  bool operator!=(const HugeAlloc<U>&) const { return false; }
};
template <class T>
using HugeVec = std::vector<T, HugeAlloc<T>>;

// A reference to a row: its slot and the slot's generation when the reference was made. A slot's
// generation changes when its row leaves, so a reference to a row that has left is recognisably stale
// whatever the slot holds now (32-bit generations: a stale reference would have to survive 2^32 reuses
// of one slot, and the state is rebuilt from its image at every micro-batch).
struct Link {
  int32_t slot = -1;
  uint32_t gen = 0;
};

// One row of the state: one cache line.
struct alignas(64) Row {
  int64_t time;
  int64_t id;
  int64_t lo, up;  // the row's own band (the bounds in force at its timestamp)
  int64_t below;   // >= the expiry key of every row after this one in its chain
  uint64_t hash;   // of its key: finds the row's index entry on the rare slow path of expiry
  Link next;       // the next older row of its chain, or a stale link (end of chain)
  uint32_t gen;
  uint8_t matched;
  uint8_t kind;  // kFreeRow, kKeyed or kNullRow
};
constexpr uint8_t kFreeRow = 0, kKeyed = 1, kNullRow = 2;

// A chain of rows, newest first, singly linked. `newest` and `maxend` are upper bounds of the newest
// time and the largest expiry key of its live rows (exact after a load, never lowered in between).
struct Chain {
  Link head;
  int64_t newest = kI64Min;
  int64_t maxend = kI64Min;
};

// One distinct key of either input: its bytes (inline when at most 8 bytes, so that the common integer
// / short string key is compared without touching the arena) and one chain per input. Both inputs share
// the index, so a row finds its partners and its own chain with one lookup, and `newest` lets a probe
// skip a partner chain whose rows are all out of band without reading any of them.
struct alignas(64) Entry {
  uint32_t tag;   // the hash's low 32 bits
  uint32_t klen;  // kNoKey for an empty slot
  uint64_t key;   // the bytes themselves (klen <= 8, zero-padded) or the arena offset
  Chain chain[2];
};
constexpr uint32_t kNoKey = 0xFFFFFFFFu;

inline uint64_t load_small(const uint8_t* k, uint32_t n) {
  uint64_t v = 0;
  std::memcpy(&v, k, n);
  return v;
}

// A run of (expiry key, row) sorted by expiry key; entries before `start` have left.
struct Run {
  std::vector<std::pair<int64_t, int32_t>> v;
  size_t start = 0;
  size_t size() const { return v.size() - start; }
};

// Sorts (expiry key, row) pairs by key: they usually arrive nearly sorted and within a narrow range,
// so an LSD radix sort over the offsets from the smallest key takes a few linear passes.
inline void sort_by_end(std::vector<std::pair<int64_t, int32_t>>& v) {
  const size_t n = v.size();
  bool sorted = true;
  int64_t lo = kI64Max, hi = kI64Min;
  for (size_t i = 0; i < n; ++i) {
    if (i && v[i].first < v[i - 1].first) sorted = false;
    lo = std::min(lo, v[i].first);
    hi = std::max(hi, v[i].first);
  }
  if (sorted) return;
  const uint64_t range = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
  constexpr int kBits = 11;
  int passes = 0;
  for (uint64_t r = range; r; r >>= kBits) ++passes;
  if (n < 256 || passes > 4) {
    std::sort(v.begin(), v.end());
    return;
  }
  std::vector<std::pair<int64_t, int32_t>> tmp(n);
  auto* src = &v;
  auto* dst = &tmp;
  for (int p = 0; p < passes; ++p) {
    const int shift = p * kBits;
    std::vector<size_t> count((1 << kBits) + 1, 0);
    auto digit = [&](int64_t key) {
      return ((static_cast<uint64_t>(key) - static_cast<uint64_t>(lo)) >> shift) & ((1u << kBits) - 1);
    };
    for (const auto& e : *src) ++count[digit(e.first) + 1];
    for (size_t d = 0; d < (1u << kBits); ++d) count[d + 1] += count[d];
    for (const auto& e : *src) (*dst)[count[digit(e.first)]++] = e;
    std::swap(src, dst);
  }
  if (src != &v) v.swap(tmp);
}

// One input's rows. Keyed rows hang off the shared index; rows whose key has a null component form a
// chain of their own (stored so that outer joins emit them, never matched).
struct Side {
  static constexpr size_t kMaxRuns = 16;
  HugeVec<Row> rows;
  std::vector<int32_t> free_rows;
  Chain nulls_chain;
  size_t nulls = 0;
  size_t live = 0;
  // Expiry linkage (PIPES section 3.4.1): rows ordered by expiry key, as a few sorted runs (one per
  // insert call). Expiring pops run heads: it touches only the rows that leave, in the order they were
  // inserted, and never the rest of the state.
  std::vector<Run> runs;
  // Largest reach (>= 0) of a row stored since the last load: upper for left rows, -lower for right
  // rows. A probe never needs rows older than (probe time - max_reach). Never lowered by eviction
  // (conservative); recomputed when the state is loaded.
  int64_t max_reach = 0;

  bool valid(Link l) const { return l.slot >= 0 && rows[l.slot].gen == l.gen; }

  int32_t alloc_row() {
    if (!free_rows.empty()) {
      int32_t s = free_rows.back();
      free_rows.pop_back();
      return s;
    }
    rows.emplace_back();  // value-initialized: generation 0
    return static_cast<int32_t>(rows.size() - 1);
  }

  // The row that alloc_row() will return `ahead` calls from now, if known (for prefetching).
  const Row* upcoming(size_t ahead) const {
    return ahead < free_rows.size() ? &rows[free_rows[free_rows.size() - 1 - ahead]] : nullptr;
  }

  void release(int32_t s) {
    Row& r = rows[s];
    if (r.kind == kNullRow) --nulls;
    r.kind = kFreeRow;
    ++r.gen;
    free_rows.push_back(s);
    --live;
  }

  void add_run(std::vector<std::pair<int64_t, int32_t>>&& items) {
    if (items.empty()) return;
    sort_by_end(items);
    runs.emplace_back();
    runs.back().v = std::move(items);
    // Up to kMaxRuns runs stay as they are (one per insert call; eviction drains and drops the old
    // ones, so a steady stream of large calls never merges). Beyond that, the adjacent pair with the
    // fewest rows is merged: many small calls then merge like a binary counter, O(log n) moves per
    // row, and expiring or asking for the smallest key costs O(kMaxRuns) on top of the rows it removes.
    while (runs.size() > kMaxRuns) {
      size_t best = 0;
      for (size_t i = 1; i + 1 < runs.size(); ++i)
        if (runs[i].size() + runs[i + 1].size() < runs[best].size() + runs[best + 1].size()) best = i;
      Run& a = runs[best];
      Run& b = runs[best + 1];
      std::vector<std::pair<int64_t, int32_t>> merged;
      merged.reserve(a.size() + b.size());
      std::merge(a.v.begin() + a.start, a.v.end(), b.v.begin() + b.start, b.v.end(), std::back_inserter(merged));
      a.v.swap(merged);
      a.start = 0;
      runs.erase(runs.begin() + best + 1);
    }
  }

  // Replaces the expiry runs by one run over the live rows (ends indexed by row; free rows ignored).
  void rebuild_runs(const std::vector<int64_t>& end_of_row) {
    runs.clear();
    std::vector<std::pair<int64_t, int32_t>> items;
    items.reserve(live);
    for (size_t s = 0; s < rows.size(); ++s)
      if (rows[s].kind != kFreeRow) items.emplace_back(end_of_row[s], static_cast<int32_t>(s));
    add_run(std::move(items));
  }

  // Expiry key of every row (kI64Min for free rows), read off the runs.
  std::vector<int64_t> end_of_row() const {
    std::vector<int64_t> out(rows.size(), kI64Min);
    for (const Run& r : runs)
      for (size_t i = r.start; i < r.v.size(); ++i) out[r.v[i].second] = r.v[i].first;
    return out;
  }

  std::optional<int64_t> min_end() const {
    std::optional<int64_t> m;
    for (const Run& r : runs)
      if (r.size() && (!m || r.v[r.start].first < *m)) m = r.v[r.start].first;
    return m;
  }

  // Calls f(slot) for the live rows of a chain, newest first.
  template <class F>
  void walk(const Chain& c, F&& f) const {
    for (Link l = c.head; valid(l); l = rows[l.slot].next) f(l.slot);
  }

  size_t nbytes() const {
    size_t n = rows.capacity() * sizeof(Row) + free_rows.capacity() * 4;
    for (const Run& r : runs) n += r.v.capacity() * sizeof(r.v[0]);
    return n;
  }
};

// Both inputs' status structures (PIPES section 3.6.3): an open-addressing index (linear probing) from
// key to one Entry per distinct key, and per input its rows.
//
// Rows leave without touching their chain when nothing after them stays (the common case: expiry keys
// grow with time, and each chain is sorted by time): the predecessor keeps a link that is now stale,
// which ends the chain for every reader. Only a row with a live successor (possible when bands differ
// between rows) is unlinked from its predecessor, found from the index. Entries whose chains are both
// empty are dropped when the index is rebuilt.
struct State {
  HugeVec<Entry> table;
  uint64_t mask = 0;
  size_t used = 0;
  std::string arena;
  Side side[2];

  bool key_equal(const Entry& e, const uint8_t* k, uint32_t n) const {
    if (e.klen != n) return false;
    if (n <= 8) return e.key == load_small(k, n);
    return std::memcmp(arena.data() + e.key, k, n) == 0;
  }

  const uint8_t* key_bytes(const Entry& e) const {
    if (e.klen <= 8) return reinterpret_cast<const uint8_t*>(&e.key);
    return reinterpret_cast<const uint8_t*>(arena.data()) + e.key;
  }

  void prefetch(uint64_t h) const {
    if (!table.empty()) __builtin_prefetch(&table[h & mask]);
  }

  // Position of the key's entry, or -1.
  int64_t find(uint64_t h, const uint8_t* k, uint32_t n) const {
    if (table.empty()) return -1;
    const uint32_t tag = static_cast<uint32_t>(h);
    for (uint64_t i = h & mask;; i = (i + 1) & mask) {
      const Entry& e = table[i];
      if (e.klen == kNoKey) return -1;
      if (e.tag == tag && key_equal(e, k, n)) return static_cast<int64_t>(i);
    }
  }

  // The entry an upcoming row will probe, judged by its hash alone (a prefetch hint, never a decision).
  const Entry* peek(uint64_t h) const {
    if (table.empty()) return nullptr;
    const uint32_t tag = static_cast<uint32_t>(h);
    for (uint64_t i = h & mask;; i = (i + 1) & mask) {
      const Entry& e = table[i];
      if (e.klen == kNoKey) return nullptr;
      if (e.tag == tag) return &e;
    }
  }

  bool has_rows(const Entry& e) const { return side[0].valid(e.chain[0].head) || side[1].valid(e.chain[1].head); }

  // Whether a quarter or more of the keys have no rows left, judged from 64 entries spread over the
  // index (reading every entry's chain heads costs a random access each).
  bool mostly_stale() const {
    if (used < 256) return true;
    size_t seen = 0, stale = 0;
    for (uint64_t k = 0; k < 64; ++k) {
      uint64_t i = (k * 0x9E3779B97F4A7C15ULL) & mask;
      while (table[i].klen == kNoKey) i = (i + 1) & mask;
      ++seen;
      stale += !has_rows(table[i]);
    }
    return 4 * stale >= seen;
  }

  // Rebuilds the index with room for `extra` more keys. When a sample says enough keys have no rows
  // left, it drops them (reading each entry's chain heads: O(entries) random accesses) and resets the
  // bounds of empty chains; otherwise it only re-places the entries.
  void rebuild(size_t extra) {
    const bool purge = mostly_stale();
    std::vector<Entry> keep;
    keep.reserve(used);
    std::string fresh;
    for (const Entry& e : table) {
      if (e.klen == kNoKey) continue;
      Entry c = e;
      if (purge) {
        if (!has_rows(c)) continue;
        for (int sd = 0; sd < 2; ++sd)
          if (!side[sd].valid(c.chain[sd].head)) c.chain[sd] = Chain{};
      }
      if (c.klen > 8) {
        const size_t off = fresh.size();
        fresh.append(arena, c.key, c.klen);
        c.key = off;
      }
      keep.push_back(c);
    }
    arena.swap(fresh);
    size_t capacity = 16;
    while (capacity < 2 * (keep.size() + extra) + 2) capacity *= 2;
    table.assign(capacity, Entry{0, kNoKey, 0, {}});
    mask = capacity - 1;
    for (const Entry& e : keep) {
      uint64_t i = hash_bytes(key_bytes(e), e.klen) & mask;
      while (table[i].klen != kNoKey) i = (i + 1) & mask;
      table[i] = e;
    }
    used = keep.size();
  }

  uint64_t find_or_add(uint64_t h, const uint8_t* k, uint32_t n) {
    if ((used + 1) * 2 > table.size()) rebuild(std::max<size_t>(used / 2, 8));
    const uint32_t tag = static_cast<uint32_t>(h);
    uint64_t i = h & mask;
    for (;; i = (i + 1) & mask) {
      const Entry& e = table[i];
      if (e.klen == kNoKey) break;
      if (e.tag == tag && key_equal(e, k, n)) return i;
    }
    Entry& e = table[i];
    e = Entry{tag, n, 0, {}};
    if (n <= 8) {
      e.key = load_small(k, n);
    } else {
      e.key = arena.size();
      arena.append(reinterpret_cast<const char*>(k), n);
    }
    ++used;
    return i;
  }

  Chain& chain_of(int sd, int64_t pos) { return pos >= 0 ? table[pos].chain[sd] : side[sd].nulls_chain; }

  // Links a new row into the chain of entry `pos` (or the null chain when pos < 0). Chains are sorted by
  // time, newest first: rows arrive roughly in time order, so the row usually becomes the head without
  // reading the chain, and a probe can stop at the first row older than its band (see insert_probe).
  int32_t link(int sd, int64_t pos, int64_t t, int64_t pid, uint8_t m, int64_t lo, int64_t up, uint64_t h,
               int64_t end) {
    Side& me = side[sd];
    const int32_t s = me.alloc_row();
    Chain& c = chain_of(sd, pos);
    Row& r = me.rows[s];
    r.time = t;
    r.id = pid;
    r.lo = lo;
    r.up = up;
    r.hash = h;
    r.matched = m;
    r.kind = pos >= 0 ? kKeyed : kNullRow;
    if (pos < 0) ++me.nulls;
    ++me.live;
    const Link self{s, r.gen};
    if (t >= c.newest) {  // the common case: no read of the chain
      r.next = c.head;
      r.below = c.maxend;
      c.head = self;
      c.newest = t;
    } else {
      // Walk past the newer rows; every one of them now has this row after it.
      Link prev{}, cur = c.head;
      while (me.valid(cur) && me.rows[cur.slot].time > t) {
        Row& q = me.rows[cur.slot];
        q.below = std::max(q.below, end);
        prev = cur;
        cur = q.next;
      }
      r.next = cur;
      r.below = prev.slot >= 0 ? me.rows[prev.slot].below : c.maxend;  // an upper bound
      if (prev.slot >= 0) me.rows[prev.slot].next = self; else c.head = self;
    }
    c.maxend = std::max(c.maxend, end);
    return s;
  }

  // Removes row s of side sd, whose expiry key is <= threshold. When every row after it expires too
  // (its `below` <= threshold), nothing else is touched: the chain simply ends at the stale link.
  void expire(int sd, int32_t s, int64_t threshold) {
    if (side[sd].rows[s].below > threshold) unlink(sd, s);
    side[sd].release(s);
  }

  // The slow path: row s has (or may have) a live row after it, so its predecessor must skip it.
  void unlink(int sd, int32_t s) {
    Side& me = side[sd];
    const Row& r = me.rows[s];
    const Link self{s, r.gen};
    auto splice = [&](Chain& c) {
      Link prev{};
      for (Link cur = c.head; me.valid(cur); prev = cur, cur = me.rows[cur.slot].next) {
        if (cur.slot != self.slot) continue;
        if (prev.slot >= 0) me.rows[prev.slot].next = r.next; else c.head = r.next;
        return true;
      }
      return false;
    };
    if (r.kind == kNullRow) {
      splice(me.nulls_chain);
      return;
    }
    const uint32_t tag = static_cast<uint32_t>(r.hash);
    for (uint64_t i = r.hash & mask;; i = (i + 1) & mask) {
      Entry& e = table[i];
      if (e.klen == kNoKey) return;  // unreachable: a live row is always on its key's chain
      if (e.tag == tag && splice(e.chain[sd])) return;
    }
  }

  // The order of the state image, which serialize() and canonical_ids() share: the keys of side sd
  // that have rows, in index order, each with its rows newest first. The chains are walked a level
  // at a time across all keys (the first rows of every chain, then the second rows, ...), so that the
  // random accesses of many chains are in flight together, then grouped by key with a stable
  // counting sort.
  struct ImageOrder {
    std::vector<uint64_t> pos;    // index positions of the keys with rows
    std::vector<uint32_t> count;  // their row counts
    std::vector<int32_t> rows;    // their rows, key by key
  };
  ImageOrder image_order(int sd) const {
    const Side& me = side[sd];
    std::vector<uint32_t> ord;  // ordinal of each active chain's key among all keys
    std::vector<Link> cur;
    std::vector<uint64_t> all;
    for (uint64_t i = 0; i < table.size(); ++i) {
      if (table[i].klen == kNoKey) continue;
      ord.push_back(static_cast<uint32_t>(all.size()));
      all.push_back(i);
      cur.push_back(table[i].chain[sd].head);
    }
    std::vector<std::pair<uint32_t, int32_t>> found;  // (key ordinal, row), level by level
    found.reserve(me.live);
    constexpr size_t kAhead = 16;
    while (!ord.empty()) {
      size_t w = 0;
      for (size_t j = 0; j < ord.size(); ++j) {
        if (j + kAhead < ord.size() && cur[j + kAhead].slot >= 0) __builtin_prefetch(&me.rows[cur[j + kAhead].slot]);
        if (!me.valid(cur[j])) continue;
        found.emplace_back(ord[j], cur[j].slot);
        ord[w] = ord[j];
        cur[w] = me.rows[cur[j].slot].next;
        ++w;
      }
      ord.resize(w);
      cur.resize(w);
    }
    std::vector<uint32_t> start(all.size() + 1, 0);
    for (const auto& f : found) ++start[f.first + 1];
    ImageOrder out;
    for (size_t k = 0; k < all.size(); ++k) {
      if (start[k + 1]) {
        out.pos.push_back(all[k]);
        out.count.push_back(start[k + 1]);
      }
      start[k + 1] += start[k];
    }
    out.rows.resize(found.size());
    for (const auto& f : found) out.rows[start[f.first]++] = f.second;
    return out;
  }

  // Recomputes each chain's `below` and `maxend` of side sd from new expiry keys (indexed by row): they
  // are upper bounds of the keys *after* each row, and new keys may be larger than the old ones.
  void recompute_bounds(int sd, const std::vector<int64_t>& end_of_row) {
    Side& me = side[sd];
    std::vector<int32_t> chain;
    auto redo = [&](Chain& c) {
      chain.clear();
      me.walk(c, [&](int32_t s) { chain.push_back(s); });
      int64_t after = kI64Min;
      for (size_t j = chain.size(); j-- > 0;) {
        me.rows[chain[j]].below = after;
        after = std::max(after, end_of_row[chain[j]]);
      }
      c.maxend = after;
    };
    for (Entry& e : table)
      if (e.klen != kNoKey) redo(e.chain[sd]);
    redo(me.nulls_chain);
  }

  size_t keys(int sd) const {
    size_t n = 0;
    for (const Entry& e : table)
      if (e.klen != kNoKey && side[sd].valid(e.chain[sd].head)) ++n;
    return n;
  }

  size_t nbytes() const {
    return table.capacity() * sizeof(Entry) + arena.capacity() + side[0].nbytes() + side[1].nbytes();
  }
};

inline int64_t neg_sat(int64_t v) { return v == kI64Min ? kI64Max : -v; }

// Reach of a row: how far after its own time a partner of the other side can lie when this row is the
// earlier element (upper for a left row, -lower for a right row), clipped at 0.
inline int64_t reach_of(int side, int64_t lo, int64_t up) {
  return std::max<int64_t>(0, side == 0 ? up : neg_sat(lo));
}

// The pair rule: the band of the earlier element decides (the left row's band on a tie).
inline bool pair_matches(int64_t lt, int64_t llo, int64_t lup, int64_t rt, int64_t rlo, int64_t rup) {
  const __int128 d = static_cast<__int128>(rt) - lt;
  return lt <= rt ? (llo <= d && d <= lup) : (rlo <= d && d <= rup);
}

// ---- the kernel's operations -------------------------------------------------------------------------

// One insert_probe call's input rows, as raw arrays of `n` rows (the caller checked their lengths and,
// with check_key_offsets, the key offsets). Optional arrays are nullptr.
struct ProbeInput {
  int side;                 // 0 left, 1 right
  std::ptrdiff_t n;         // rows
  const int64_t* offsets;   // n + 1 offsets into `keys`: row i's key is keys[offsets[i] : offsets[i + 1]]
  const uint8_t* keys;      // encoded key bytes
  const uint8_t* null_key;  // nonzero: the row's key has a null component (never matches); or nullptr
  const int64_t* times;     // event times
  const int64_t* ids;       // payload ids
  const int64_t* lower;     // per-row band, or nullptr: the state's bounds
  const int64_t* upper;
  const int64_t* ends;      // per-row expiry keys, or nullptr: the times
};

// Result pairs of insert_probe: the input row index and the payload id of the stored partner.
struct Matches {
  std::vector<int64_t> in, id;
};

// The rows evict() removed: payload ids and matched flags.
struct Evicted {
  std::vector<int64_t> ids;
  std::vector<uint8_t> matched;
};

// The live rows of one side in row order: times and bands.
struct RowBounds {
  std::vector<int64_t> time, lo, up;
};

// The live rows of one side in row order: matched flags and expiry keys.
struct RowFlags {
  std::vector<uint8_t> matched;
  std::vector<int64_t> ends;
};

// Throws std::invalid_argument unless the `n + 1` key offsets are monotone within `size` bytes.
inline void check_key_offsets(std::ptrdiff_t n, const int64_t* off, std::ptrdiff_t size) {
  for (std::ptrdiff_t i = 0; i < n; ++i)
    if (off[i] < 0 || off[i] > off[i + 1] || off[i + 1] > size)
      throw std::invalid_argument("offsets are not monotone within data at row " + std::to_string(i));
}

// Concatenates several per-row byte encodings (each `n` rows of offsets into data) into one injective
// key encoding: each component is prefixed by its 4-byte length, so ("ab", "c") and ("a", "bc") differ.
struct Encoding {
  const int64_t* offsets;
  const uint8_t* data;
};
inline std::pair<std::vector<int64_t>, std::vector<uint8_t>> concat_encodings(const std::vector<Encoding>& parts,
                                                                             std::ptrdiff_t n) {
  const size_t np = parts.size();
  std::vector<int64_t> out_off(static_cast<size_t>(n) + 1, 0);
  for (std::ptrdiff_t i = 0; i < n; ++i) {
    int64_t len = 0;
    for (size_t p = 0; p < np; ++p) len += 4 + (parts[p].offsets[i + 1] - parts[p].offsets[i]);
    out_off[i + 1] = out_off[i] + len;
  }
  std::vector<uint8_t> out(static_cast<size_t>(out_off[n]));
  for (std::ptrdiff_t i = 0; i < n; ++i) {
    uint8_t* dst = out.data() + out_off[i];
    for (size_t p = 0; p < np; ++p) {
      const int64_t a = parts[p].offsets[i], b = parts[p].offsets[i + 1];
      const uint32_t len = static_cast<uint32_t>(b - a);
      std::memcpy(dst, &len, 4);
      std::memcpy(dst + 4, parts[p].data + a, len);
      dst += 4 + len;
    }
  }
  return {std::move(out_off), std::move(out)};
}

// The join state of one shard: both inputs' rows with the band l.t + lower <= r.t <= l.t + upper as
// the default of rows stored without their own. Errors are std::invalid_argument (ValueError in Python).
class JoinState {
 public:
  JoinState(int64_t lower, int64_t upper) : lower_(lower), upper_(upper) {
    if (lower > upper)
      throw std::invalid_argument("lower must be <= upper, got lower=" + std::to_string(lower) +
                                  " and upper=" + std::to_string(upper));
  }

  int64_t lower() const { return lower_; }
  int64_t upper() const { return upper_; }
  int64_t restored_format() const { return restored_format_; }

  static int side_index(int side) {
    if (side != 0 && side != 1)
      throw std::invalid_argument("side must be 0 (left) or 1 (right), got " + std::to_string(side));
    return side;
  }

  // Probe the other side with each row, then store the row on its side (PIPES section 3.6.3: insert
  // and probe). Each row carries its own band (`lower`, `upper`, default the state's constructor
  // bounds) and expiry key (`ends`, default its time). A pair (l, r) matches when the keys are equal
  // and b.lower <= r.t - l.t <= b.upper with b the band of the earlier row (left on a tie); with one
  // band for all rows this is l.t + lower <= r.t <= l.t + upper.
  // Returns (input row index, payload id of the matched stored row) per result pair; stored rows that
  // matched get their `matched` flag set (outer joins emit only unmatched rows on expiry).
  // Steps per row: prefetch_ahead (the pipeline), find the key, probe_chain, store_row.
  // `in` is taken by value: a local copy keeps its pointers in registers across the loop's stores.
  Matches insert_probe(const ProbeInput in, bool store) {
    const int side = side_index(in.side);
    Matches out;
    const std::vector<uint64_t> hashes = hash_keys(in);
    std::vector<std::pair<int64_t, int32_t>> fresh;
    if (store) fresh.reserve(static_cast<size_t>(in.n));
    for (std::ptrdiff_t i = 0; i < in.n; ++i) {
      prefetch_ahead(in, hashes, i, store);
      const uint8_t* k = in.keys + in.offsets[i];
      const uint32_t kn = static_cast<uint32_t>(in.offsets[i + 1] - in.offsets[i]);
      const bool is_null = in.null_key && in.null_key[i];
      const uint64_t h = hashes[i];
      const int64_t lo = in.lower ? in.lower[i] : lower_, up = in.upper ? in.upper[i] : upper_;
      const int64_t reach = reach_of(side, lo, up);
      int64_t pos = is_null ? -1 : st_.find(h, k, kn);
      const uint8_t m = pos >= 0 ? probe_chain(side, pos, i, in.times[i], lo, up, reach, out) : 0;
      if (store) {
        if (!is_null && pos < 0) pos = static_cast<int64_t>(st_.find_or_add(h, k, kn));
        const int64_t end = in.ends ? in.ends[i] : in.times[i];
        store_row(side, pos, in.times[i], in.ids[i], m, lo, up, h, end, reach, fresh);
      }
    }
    st_.side[side].add_run(std::move(fresh));
    return out;
  }

  // Temporal expiration (PIPES section 2.4.4): remove every row of `side` whose expiry key is
  // <= threshold (the key is the row's time unless insert_probe got `ends`). Only the expiring rows
  // are touched (run heads, then the rows themselves; a row's chain only when a row after it stays).
  Evicted evict(int side, int64_t threshold) {
    Side& me = st_.side[side_index(side)];
    Evicted out;
    std::vector<int32_t> gone;
    for (Run& r : me.runs) {
      while (r.start < r.v.size() && r.v[r.start].first <= threshold) gone.push_back(r.v[r.start++].second);
      if (r.start >= 1024 && 2 * r.start >= r.v.size()) {  // release what has left
        r.v.erase(r.v.begin(), r.v.begin() + static_cast<std::ptrdiff_t>(r.start));
        r.start = 0;
      }
    }
    me.runs.erase(std::remove_if(me.runs.begin(), me.runs.end(), [](const Run& r) { return r.size() == 0; }),
                  me.runs.end());
    const size_t n = gone.size();
    out.ids.reserve(n);
    out.matched.reserve(n);
    constexpr size_t kAhead = 16;
    for (size_t j = 0; j < n; ++j) {
      if (j + kAhead < n) __builtin_prefetch(&me.rows[gone[j + kAhead]], 1);
      const Row& r = me.rows[gone[j]];
      out.ids.push_back(r.id);
      out.matched.push_back(r.matched);
      st_.expire(side, gone[j], threshold);
    }
    return out;
  }

  // Smallest expiry key of a side (the next row to expire), or nothing when the side is empty.
  std::optional<int64_t> min_end(int side) const { return st_.side[side_index(side)].min_end(); }

  // (times, lowers, uppers) of the live rows of a side in row order (the order set_ends expects).
  RowBounds row_bounds(int side) const {
    const Side& me = st_.side[side_index(side)];
    RowBounds out;
    for (const Row& r : me.rows) {
      if (r.kind == kFreeRow) continue;
      out.time.push_back(r.time);
      out.lo.push_back(r.lo);
      out.up.push_back(r.up);
    }
    return out;
  }

  // (matched flags, expiry keys) of the live rows of a side in row order (that of row_bounds and set_ends):
  // what a caller needs to drop rows by a rule of its own (stream constraints, STREAM section 5.2) through
  // set_ends and evict.
  RowFlags row_flags(int side) const {
    const Side& me = st_.side[side_index(side)];
    const std::vector<int64_t> end_of_row = me.end_of_row();
    RowFlags out;
    out.matched.reserve(me.live);
    out.ends.reserve(me.live);
    for (size_t s = 0; s < me.rows.size(); ++s) {
      if (me.rows[s].kind == kFreeRow) continue;
      out.matched.push_back(me.rows[s].matched);
      out.ends.push_back(end_of_row[s]);
    }
    return out;
  }

  // The payload ids of the live rows of a side in row order (that of row_flags and set_ends): lets a caller
  // that decides by a row's key (clustered / ordered arrival, STREAM section 5.2) find the row's payload.
  std::vector<int64_t> row_ids(int side) const {
    const Side& me = st_.side[side_index(side)];
    std::vector<int64_t> out;
    out.reserve(me.live);
    for (const Row& r : me.rows)
      if (r.kind != kFreeRow) out.push_back(r.id);
    return out;
  }

  // Replace the expiry keys of the live rows of a side (`n` keys in the order of row_bounds).
  void set_ends(int side, const int64_t* e, size_t n) {
    Side& me = st_.side[side_index(side)];
    if (n != me.live)
      throw std::invalid_argument("ends must have one key per live row (" + std::to_string(me.live) + ")");
    std::vector<int64_t> end_of_row(me.rows.size(), kI64Min);
    size_t j = 0;
    for (size_t s = 0; s < me.rows.size(); ++s)
      if (me.rows[s].kind != kFreeRow) end_of_row[s] = e[j++];
    me.rebuild_runs(end_of_row);
    st_.recompute_bounds(side, end_of_row);
  }

  // Renumber the payload ids of a side 0, 1, 2, ... in the order serialize() writes the rows (key by key,
  // newest first, null keys last); returns the old ids in that order, so that the caller reorders its
  // payload with payload.take(old_ids). The payload then follows the image: dead rows are dropped,
  // each key's rows are adjacent (so its columns compress better) and the ids column of the image is
  // all ones once delta-coded (format 3).
  std::vector<int64_t> canonical_ids(int side, int64_t payload_len) {
    Side& me = st_.side[side_index(side)];
    if (payload_len < 0) throw std::invalid_argument("payload_len must be >= 0");
    std::vector<int64_t> old;
    old.reserve(me.live);
    bool bad = false;
    auto renumber = [&](int32_t s) {
      Row& r = me.rows[s];
      if (r.id < 0 || r.id >= payload_len) bad = true;
      old.push_back(r.id);
      r.id = static_cast<int64_t>(old.size()) - 1;
    };
    const std::vector<int32_t> order = st_.image_order(side).rows;
    for (size_t j = 0; j < order.size(); ++j) {
      if (j + 16 < order.size()) __builtin_prefetch(&me.rows[order[j + 16]], 1);
      renumber(order[j]);
    }
    me.walk(me.nulls_chain, renumber);
    if (bad) throw std::invalid_argument("a stored payload id is outside [0, payload_len)");
    return old;
  }

  size_t rows(int side) const { return st_.side[side_index(side)].live; }
  size_t keys(int side) const { return st_.keys(side_index(side)); }
  size_t nbytes() const { return st_.nbytes(); }

  // Byte image (cq::Writer, format CQS1, state format 3): meta, then per side the distinct keys with
  // their row counts and the rows grouped by key, null-key rows last, each row with its time, payload
  // id, matched flag, band and expiry key. Loading rebuilds the index and the expiry runs in
  // O(n log n) at worst (one sort).
  // Format 3 stores each payload id as the difference to the previous row's (the first to -1) and each
  // expiry key as the difference to the row's time, both modulo 2^64: after canonical_ids the ids are
  // all ones and the expiry offsets repeat, so the compressed image shrinks by about 60 %.
  // Format 2 stored both as they are; format 1 had no bands and no expiry keys: its rows get the
  // state's bounds and their time as expiry key, and restored_format says so (the caller then re-keys
  // them with set_ends). Both are still read.
  std::string serialize() const {
    cq::Writer w(1 + 2 * kCols2);
    std::vector<int64_t> meta = {kFormatVersion, lower_, upper_, static_cast<int64_t>(st_.side[0].nulls),
                                 static_cast<int64_t>(st_.side[1].nulls)};
    w.column(cq::kI64, meta);
    for (int sd = 0; sd < 2; ++sd) write_side(w, sd);
    return std::move(w.str());
  }

  // Rebuild a state from serialize()'s bytes (formats 1 to kFormatVersion).
  static JoinState deserialize(const char* data, size_t size) {
    cq::Reader r(data, size);
    const uint32_t ncols = r.ncols();
    if (ncols != 1 + 2 * kCols1 && ncols != 1 + 2 * kCols2)
      throw std::invalid_argument("join state blob has an unexpected column count");
    auto meta = r.column<int64_t>(cq::kI64);
    const int64_t version = meta.empty() ? -1 : meta[0];
    if (meta.size() != 5 || version < 1 || version > kFormatVersion ||
        ncols != 1 + 2 * (version == 1 ? kCols1 : kCols2))
      throw std::invalid_argument(
          "join state blob has format version " + std::to_string(version) +
          " (or an unexpected layout); this pyspark-cq reads join state formats 1 to " +
          std::to_string(kFormatVersion) + ": start the query with a new checkpoint location");
    JoinState js(meta[1], meta[2]);
    js.restored_format_ = version;
    for (int sd = 0; sd < 2; ++sd) js.read_side(r, sd, version, static_cast<uint64_t>(meta[3 + sd]));
    if (!r.done()) throw std::invalid_argument("join state blob has trailing bytes");
    return js;
  }

 private:
  static constexpr uint32_t kCols1 = 6, kCols2 = 9;  // columns per side in formats 1 and 2

  // -- the steps of insert_probe

  // The key hash of every input row.
  static std::vector<uint64_t> hash_keys(const ProbeInput& in) {
    std::vector<uint64_t> hashes(static_cast<size_t>(in.n));
    for (std::ptrdiff_t i = 0; i < in.n; ++i)
      hashes[i] = hash_bytes(in.keys + in.offsets[i], static_cast<size_t>(in.offsets[i + 1] - in.offsets[i]));
    return hashes;
  }

  // At state sizes beyond the CPU caches the work is bound by memory latency, not arithmetic, so
  // insert_probe runs as a software pipeline: the index slot of row i + kAhead is prefetched, the partner
  // chain's head (when in band) and the slot to be written for row i + kNear are prefetched once
  // its index slot has arrived, and row i is processed with its lines already on their way. Storing
  // a row touches only its index entry and its own new slot.
  CQ_ALWAYS_INLINE void prefetch_ahead(const ProbeInput& in, const std::vector<uint64_t>& hashes, std::ptrdiff_t i,
                                       bool store) const {
    constexpr std::ptrdiff_t kAhead = 16, kNear = 8;
    const Side& me = st_.side[in.side];
    const Side& other = st_.side[1 - in.side];
    if (i + kAhead < in.n) st_.prefetch(hashes[i + kAhead]);
    if (i + kNear < in.n) {
      const std::ptrdiff_t j = i + kNear;
      if (!(in.null_key && in.null_key[j])) {
        if (const Entry* e = st_.peek(hashes[j])) {
          const Chain& c = e->chain[1 - in.side];
          if (c.head.slot >= 0 && c.newest >= sat_add(in.times[j], -other.max_reach))
            __builtin_prefetch(&other.rows[c.head.slot]);
        }
      }
      if (store)
        if (const Row* r = me.upcoming(kNear)) __builtin_prefetch(r, 1);
    }
  }

  // Probes the other side's chain of index entry `pos` with input row i (time t, band [lo, up], reach)
  // and appends its partners to `out`; returns whether it found any (the row's matched flag).
  // Stored rows newer than t + reach are decided by this row's band and lie beyond it; rows older than
  // t - max_reach lie beyond their own band. The chain is sorted newest first: skip the former, test
  // the rows in between, stop at the first of the latter (or do not enter the chain at all when even
  // its newest row is older).
  CQ_ALWAYS_INLINE uint8_t probe_chain(int side, int64_t pos, std::ptrdiff_t i, int64_t t, int64_t lo, int64_t up,
                                       int64_t reach, Matches& out) {
    Side& other = st_.side[1 - side];
    const bool left = side == 0;
    uint8_t m = 0;
    const Chain& c = st_.table[pos].chain[1 - side];
    const int64_t newest = sat_add(t, reach), oldest = sat_add(t, -other.max_reach);
    if (c.newest >= oldest) {
      for (Link l = c.head; other.valid(l);) {
        Row& r = other.rows[l.slot];
        if (r.time < oldest) break;
        if (r.time <= newest &&
            (left ? pair_matches(t, lo, up, r.time, r.lo, r.up) : pair_matches(r.time, r.lo, r.up, t, lo, up))) {
          out.in.push_back(i);
          out.id.push_back(r.id);
          r.matched = 1;
          m = 1;
        }
        l = r.next;
      }
    }
    return m;
  }

  // Stores a row on `side` in the chain of index entry `pos` (-1: the null chain) and queues its expiry
  // key for the call's new expiry run.
  CQ_ALWAYS_INLINE void store_row(int side, int64_t pos, int64_t t, int64_t id, uint8_t m, int64_t lo, int64_t up,
                                  uint64_t h, int64_t end, int64_t reach,
                                  std::vector<std::pair<int64_t, int32_t>>& fresh) {
    Side& me = st_.side[side];
    fresh.emplace_back(end, st_.link(side, pos, t, id, m, lo, up, h, end));
    me.max_reach = std::max(me.max_reach, reach);
  }

  // -- the state image

  // Appends side sd's columns (kCols2 of them) to the image.
  void write_side(cq::Writer& w, int sd) const {
    const Side& me = st_.side[sd];
    std::vector<uint32_t> klen, count;
    std::vector<uint8_t> kdata, flags;
    std::vector<int64_t> times, ids, los, ups, ends;
    const std::vector<int64_t> end_of_row = me.end_of_row();
    times.reserve(me.live);
    ids.reserve(me.live);
    flags.reserve(me.live);
    los.reserve(me.live);
    ups.reserve(me.live);
    ends.reserve(me.live);
    int64_t prev_id = -1;
    auto put = [&](int32_t s) {
      const Row& r = me.rows[s];
      times.push_back(r.time);
      ids.push_back(wrap_sub(r.id, prev_id));
      prev_id = r.id;
      flags.push_back(r.matched);
      los.push_back(r.lo);
      ups.push_back(r.up);
      ends.push_back(wrap_sub(end_of_row[s], r.time));
    };
    const State::ImageOrder order = st_.image_order(sd);
    size_t next = 0;
    for (size_t k = 0; k < order.pos.size(); ++k) {
      const Entry& e = st_.table[order.pos[k]];
      klen.push_back(e.klen);
      const uint8_t* kb = st_.key_bytes(e);
      kdata.insert(kdata.end(), kb, kb + e.klen);
      count.push_back(order.count[k]);
      for (uint32_t c = 0; c < order.count[k]; ++c, ++next) {
        if (next + 16 < order.rows.size()) {  // the rows are random accesses again in key order
          __builtin_prefetch(&me.rows[order.rows[next + 16]]);
          __builtin_prefetch(&end_of_row[order.rows[next + 16]]);
        }
        put(order.rows[next]);
      }
    }
    me.walk(me.nulls_chain, put);
    w.column(cq::kU32, klen);
    w.column(cq::kU8, kdata);
    w.column(cq::kU32, count);
    w.column(cq::kI64, times);
    w.column(cq::kI64, ids);
    w.column(cq::kU8, flags);
    w.column(cq::kI64, los);
    w.column(cq::kI64, ups);
    w.column(cq::kI64, ends);
  }

  // Reads side sd's columns of an image of format `version` (nnull rows with a null key) into this
  // (empty) state.
  void read_side(cq::Reader& r, int sd, int64_t version, uint64_t nnull) {
    State& st = st_;
    Side& me = st.side[sd];
    auto klen = r.column<uint32_t>(cq::kU32);
    auto kdata = r.column<uint8_t>(cq::kU8);
    auto count = r.column<uint32_t>(cq::kU32);
    auto times = r.column<int64_t>(cq::kI64);
    auto ids = r.column<int64_t>(cq::kI64);
    auto flags = r.column<uint8_t>(cq::kU8);
    std::vector<int64_t> los, ups, ends;
    if (version == 1) {
      los.assign(times.size(), lower_);
      ups.assign(times.size(), upper_);
      ends = times;
    } else {
      los = r.column<int64_t>(cq::kI64);
      ups = r.column<int64_t>(cq::kI64);
      ends = r.column<int64_t>(cq::kI64);
    }
    if (version >= 3) {  // undo the delta coding of serialize()
      int64_t prev_id = -1;
      for (size_t i = 0; i < ids.size(); ++i) {
        ids[i] = prev_id = wrap_add(prev_id, ids[i]);
        ends[i] = wrap_add(times[i], ends[i]);
      }
    }
    if (klen.size() != count.size() || times.size() != ids.size() || times.size() != flags.size() ||
        times.size() != los.size() || times.size() != ups.size() || times.size() != ends.size())
      throw std::invalid_argument("join state blob is corrupt (column lengths differ)");
    uint64_t key_total = 0, row_total = nnull;
    for (size_t b = 0; b < klen.size(); ++b) {
      key_total += klen[b];
      row_total += count[b];
    }
    if (key_total != kdata.size() || row_total != times.size())
      throw std::invalid_argument("join state blob is corrupt (key or row counts do not add up)");
    me.rows.reserve(times.size());
    std::vector<int64_t> end_of_row(times.size(), kI64Min);
    auto add = [&](int64_t pos, uint64_t h, size_t row) {
      const int32_t s = st.link(sd, pos, times[row], ids[row], flags[row], los[row], ups[row], h, ends[row]);
      if (static_cast<size_t>(s) >= end_of_row.size()) end_of_row.resize(s + 1, kI64Min);
      end_of_row[s] = ends[row];
      me.max_reach = std::max(me.max_reach, reach_of(sd, los[row], ups[row]));
    };
    size_t koff = 0, row = 0;
    for (size_t b = 0; b < klen.size(); ++b) {
      const uint8_t* k = kdata.data() + koff;
      const uint64_t h = hash_bytes(k, klen[b]);
      const int64_t pos = static_cast<int64_t>(st.find_or_add(h, k, klen[b]));
      // Rows were written newest first: link them oldest first so each lands at the head in O(1).
      for (uint32_t c = count[b]; c-- > 0;) add(pos, h, row + c);
      row += count[b];
      koff += klen[b];
    }
    for (size_t c = times.size(); c-- > row;) add(-1, 0, c);
    me.rebuild_runs(end_of_row);
  }

  int64_t lower_, upper_;
  int64_t restored_format_ = 0;
  State st_;
};

}  // namespace join
}  // namespace cq
