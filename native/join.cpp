// pybind11 module pyspark_cq._join: symmetric hash join state with temporal expiration.
//
// Implements the join status structure of Cammert, Kraemer, Seeger, Vaupel (PIPES, "A Cost Model for
// Adaptive Resource Management in Data Stream Systems"), section 3.6.3 with the temporal expiration of
// section 2.4.4 and the implementation note of section 3.4.1: per input a hash table from the join key
// to its rows, and all rows additionally linked by their expiry timestamp through a separate min-heap,
// so that purging expired rows costs O(log n) per *removed* row and O(1) when nothing expires, instead
// of a scan of the whole state (which is what Spark's own stream-stream join does).
//
// Rows are (key bytes, event time in microseconds, payload id, matched flag, the row's own band
// [lower, upper] and its expiry key). The kernel never sees payload values: the caller keeps them
// (Arrow tables) and addresses them by id. Key equality is exact: the hash only selects the bucket,
// the encoded key bytes are compared in full.
//
// Per-row bounds (PIPES section 4.2: a window change applies to new elements only): every row keeps
// the band in force at its own timestamp, and a pair (l, r) is decided by the band of the *earlier*
// element (section 2.4.1: the later element must start inside the earlier one's validity; on a tie,
// the left row's band): keys equal and b.lower <= r.t - l.t <= b.upper. The expiry heap is ordered by
// a per-row expiry key chosen by the caller (default: the row's time), so rows with different bands
// still expire in O(log n) per removed row.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "serde.hpp"

namespace py = pybind11;

namespace {

constexpr int64_t kFormatVersion = 3;  // 2: per-row bounds and expiry keys; 3: 2 with delta-coded ids and ends
constexpr int32_t kFree = -2;     // bucket[] of a free slot
constexpr int32_t kNullKey = -1;  // bucket[] of a row whose key has a null: stored, never matched
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();

inline uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

inline uint64_t hash_bytes(const uint8_t* p, size_t n) {
  uint64_t h = mix64(0x9E3779B97F4A7C15ULL ^ n);
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    h = mix64(h ^ v) + 0x9E3779B97F4A7C15ULL;
    p += 8;
    n -= 8;
  }
  if (n) {
    uint64_t v = 0;
    std::memcpy(&v, p, n);
    h = mix64(h ^ v ^ (static_cast<uint64_t>(n) << 56));
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

// One row of the state. Array-of-structs so that a chain step touches one cache line.
struct Slot {
  int64_t time;
  int64_t id;
  int64_t lo, up;  // the row's own band (the bounds in force at its timestamp)
  int32_t next, prev;
  int32_t bucket;  // kFree, kNullKey or the key's bucket
  uint8_t matched;
};

// One distinct key: head of its row chain, row count, key bytes (inline when at most 8 bytes, so that
// the common integer / short string key is compared without touching the arena).
struct Bucket {
  int32_t head;
  int32_t count;
  uint32_t klen;
  uint64_t key;  // the bytes themselves (klen <= 8, zero-padded) or the arena offset
};

// Index entry: the full hash next to the bucket id, so that mismatches are rejected without a miss.
struct Entry {
  uint64_t hash;
  int32_t bucket;  // -1 empty
};

inline uint64_t load_small(const uint8_t* k, uint32_t n) {
  uint64_t v = 0;
  std::memcpy(&v, k, n);
  return v;
}

// One input's status structure.
struct Side {
  std::vector<Slot> slots;
  std::vector<int32_t> free_slots;
  std::vector<Bucket> buckets;
  std::vector<int32_t> free_buckets;
  std::string arena;
  size_t arena_live = 0;
  // Open-addressing index (linear probing, backward-shift deletion): hash -> bucket.
  std::vector<Entry> table;
  uint64_t mask = 0;
  size_t nbuckets = 0;
  // Rows with a null key component: they can never match but must expire (outer joins emit them).
  int32_t null_head = -1;
  size_t nulls = 0;
  // Expiry linkage (PIPES section 3.4.1): min-heap of (expiry key, slot).
  std::vector<std::pair<int64_t, int32_t>> heap;
  size_t live = 0;
  // Largest reach (>= 0) of a row stored since the last load: upper for left rows, -lower for right
  // rows. A probe never needs rows older than (probe time - max_reach). Never lowered by eviction
  // (conservative); recomputed when the state is loaded.
  int64_t max_reach = 0;

  bool key_equal(const Bucket& b, const uint8_t* k, uint32_t n) const {
    if (b.klen != n) return false;
    if (n <= 8) return b.key == load_small(k, n);
    return std::memcmp(arena.data() + b.key, k, n) == 0;
  }

  void prefetch(uint64_t h) const {
    if (!table.empty()) __builtin_prefetch(&table[h & mask]);
  }

  int32_t find(uint64_t h, const uint8_t* k, uint32_t n) const {
    if (table.empty()) return -1;
    for (uint64_t i = h & mask;; i = (i + 1) & mask) {
      const Entry& e = table[i];
      if (e.bucket < 0) return -1;
      if (e.hash == h && key_equal(buckets[e.bucket], k, n)) return e.bucket;
    }
  }

  void rehash(size_t capacity) {
    std::vector<Entry> old;
    old.swap(table);
    table.assign(capacity, Entry{0, -1});
    mask = capacity - 1;
    for (const Entry& e : old) {
      if (e.bucket < 0) continue;
      uint64_t i = e.hash & mask;
      while (table[i].bucket >= 0) i = (i + 1) & mask;
      table[i] = e;
    }
  }

  int32_t find_or_add(uint64_t h, const uint8_t* k, uint32_t n) {
    if ((nbuckets + 1) * 2 > table.size()) rehash(std::max<size_t>(16, table.size() * 2));
    uint64_t i = h & mask;
    for (;; i = (i + 1) & mask) {
      const Entry& e = table[i];
      if (e.bucket < 0) break;
      if (e.hash == h && key_equal(buckets[e.bucket], k, n)) return e.bucket;
    }
    int32_t b;
    if (!free_buckets.empty()) {
      b = free_buckets.back();
      free_buckets.pop_back();
    } else {
      b = static_cast<int32_t>(buckets.size());
      buckets.emplace_back();
    }
    Bucket& bk = buckets[b];
    bk.head = -1;
    bk.count = 0;
    bk.klen = n;
    if (n <= 8) {
      bk.key = load_small(k, n);
    } else {
      bk.key = arena.size();
      arena.append(reinterpret_cast<const char*>(k), n);
      arena_live += n;
    }
    table[i] = Entry{h, b};
    ++nbuckets;
    return b;
  }

  void erase_bucket(int32_t b) {
    const uint8_t* k = key_bytes(b);
    uint64_t i = hash_bytes(k, buckets[b].klen) & mask;
    while (table[i].bucket != b) i = (i + 1) & mask;
    // Backward-shift deletion keeps every probe sequence intact without tombstones.
    uint64_t j = i;
    for (;;) {
      j = (j + 1) & mask;
      const Entry c = table[j];
      if (c.bucket < 0) break;
      uint64_t home = c.hash & mask;
      bool between = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
      if (!between) {
        table[i] = c;
        i = j;
      }
    }
    table[i] = Entry{0, -1};
    --nbuckets;
    if (buckets[b].klen > 8) arena_live -= buckets[b].klen;
    buckets[b].klen = 0;
    buckets[b].head = kFree;
    free_buckets.push_back(b);
    if (arena.size() > 4096 && arena.size() > 4 * arena_live) compact_arena();
  }

  // Key bytes of a bucket (for inline keys, a pointer into the bucket itself).
  const uint8_t* key_bytes(int32_t b) const {
    const Bucket& bk = buckets[b];
    if (bk.klen <= 8) return reinterpret_cast<const uint8_t*>(&bk.key);
    return reinterpret_cast<const uint8_t*>(arena.data()) + bk.key;
  }

  void compact_arena() {
    std::string fresh;
    fresh.reserve(arena_live * 2);
    for (Bucket& bk : buckets) {
      if (bk.head == kFree || bk.klen <= 8) continue;
      size_t off = fresh.size();
      fresh.append(arena, bk.key, bk.klen);
      bk.key = off;
    }
    arena.swap(fresh);
  }

  int32_t alloc_slot() {
    if (!free_slots.empty()) {
      int32_t s = free_slots.back();
      free_slots.pop_back();
      return s;
    }
    slots.emplace_back();
    return static_cast<int32_t>(slots.size() - 1);
  }

  // Links a row into its key chain (or the null-key chain) without touching the heap. Chains are kept
  // sorted by time, newest first: rows arrive roughly in time order, so the insertion point is found
  // after O(1) steps, and a probe can stop at the first row older than its band (see probe()).
  int32_t link(int32_t b, int64_t t, int64_t pid, uint8_t m, int64_t lo, int64_t up) {
    int32_t s = alloc_slot();
    int32_t& head = (b >= 0) ? buckets[b].head : null_head;
    Slot& r = slots[s];
    r.time = t;
    r.id = pid;
    r.lo = lo;
    r.up = up;
    r.matched = m;
    r.bucket = b;
    int32_t before = -1, after = head;
    while (after >= 0 && slots[after].time > t) {
      before = after;
      after = slots[after].next;
    }
    r.prev = before;
    r.next = after;
    if (before >= 0) slots[before].next = s; else head = s;
    if (after >= 0) slots[after].prev = s;
    if (b >= 0) ++buckets[b].count; else ++nulls;
    ++live;
    return s;
  }

  void insert(int32_t b, int64_t t, int64_t pid, uint8_t m, int64_t lo, int64_t up, int64_t end) {
    int32_t s = link(b, t, pid, m, lo, up);
    heap.emplace_back(end, s);
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  }

  // Rebuilds the expiry heap from per-slot keys (indexed by slot; entries of free slots are ignored).
  void rebuild_heap(const std::vector<int64_t>& end_of_slot) {
    heap.clear();
    heap.reserve(live);
    for (size_t s = 0; s < slots.size(); ++s)
      if (slots[s].bucket != kFree) heap.emplace_back(end_of_slot[s], static_cast<int32_t>(s));
    std::make_heap(heap.begin(), heap.end(), std::greater<>());
  }

  // Expiry key of every slot (kI64Min for free slots), read off the heap.
  std::vector<int64_t> end_of_slot() const {
    std::vector<int64_t> out(slots.size(), kI64Min);
    for (const auto& e : heap) out[e.second] = e.first;
    return out;
  }

  void unlink(int32_t s) {
    Slot& r = slots[s];
    const int32_t b = r.bucket;
    int32_t& head = (b >= 0) ? buckets[b].head : null_head;
    if (r.prev >= 0) slots[r.prev].next = r.next; else head = r.next;
    if (r.next >= 0) slots[r.next].prev = r.prev;
    r.bucket = kFree;
    free_slots.push_back(s);
    --live;
    if (b >= 0) {
      if (--buckets[b].count == 0) erase_bucket(b);
    } else {
      --nulls;
    }
  }

  size_t nbytes() const {
    return slots.capacity() * sizeof(Slot) + free_slots.capacity() * 4 + buckets.capacity() * sizeof(Bucket) +
           free_buckets.capacity() * 4 + arena.capacity() + table.capacity() * sizeof(Entry) +
           heap.capacity() * sizeof(heap[0]);
  }
};

template <class T>
const T* ptr(const py::array_t<T, py::array::c_style | py::array::forcecast>& a) {
  return a.data();
}

template <class T>
py::array_t<T> to_numpy(std::vector<T>&& v) {
  auto* heap_vec = new std::vector<T>(std::move(v));
  py::capsule owner(heap_vec, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>({static_cast<py::ssize_t>(heap_vec->size())}, {static_cast<py::ssize_t>(sizeof(T))},
                        heap_vec->data(), owner);
}

using I64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
using U8 = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;

int side_index(int side) {
  if (side != 0 && side != 1) throw py::value_error("side must be 0 (left) or 1 (right), got " + std::to_string(side));
  return side;
}

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

const int64_t* optional_i64(const py::object& obj, I64& holder, py::ssize_t n, const char* name) {
  if (obj.is_none()) return nullptr;
  holder = obj.cast<I64>();
  if (holder.size() != n) throw py::value_error(std::string(name) + " must have the same length as times");
  return holder.data();
}

class JoinState {
 public:
  JoinState(int64_t lower, int64_t upper) : lower_(lower), upper_(upper) {
    if (lower > upper)
      throw py::value_error("lower must be <= upper, got lower=" + std::to_string(lower) +
                            " and upper=" + std::to_string(upper));
  }

  int64_t lower() const { return lower_; }
  int64_t upper() const { return upper_; }
  int64_t restored_format() const { return restored_format_; }

  // Probe the other side with each row, then store the row on its side (PIPES section 3.6.3: insert
  // and probe). Each row carries its own band (`lower`, `upper`: int64 arrays, default the state's
  // constructor bounds) and expiry key (`ends`, default its time). A pair (l, r) matches when the keys
  // are equal and b.lower <= r.t - l.t <= b.upper with b the band of the earlier row (left on a tie);
  // with one band for all rows this is l.t + lower <= r.t <= l.t + upper.
  // Returns (input row index, payload id of the matched stored row) per result pair; stored rows that
  // matched get their `matched` flag set (outer joins emit only unmatched rows on expiry).
  py::tuple insert_probe(int side, const I64& offsets, const U8& data, py::object null_key, const I64& times,
                         const I64& ids, bool store, py::object lower, py::object upper, py::object ends) {
    side_index(side);
    const py::ssize_t n = times.size();
    if (ids.size() != n) throw py::value_error("ids must have the same length as times");
    if (offsets.size() != n + 1) throw py::value_error("offsets must have length len(times) + 1");
    const int64_t* off = offsets.data();
    const uint8_t* kd = data.data();
    const py::ssize_t dsize = data.size();
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
    for (py::ssize_t i = 0; i < n; ++i)
      if (off[i] < 0 || off[i] > off[i + 1] || off[i + 1] > dsize)
        throw py::value_error("offsets are not monotone within data at row " + std::to_string(i));
    const int64_t* ts = times.data();
    const int64_t* pid = ids.data();
    Side& me = s_[side];
    Side& other = s_[1 - side];
    const bool left = side == 0;
    std::vector<int64_t> out_in, out_id;
    {
      py::gil_scoped_release release;
      // Hash every row first so that the index slots of rows a few steps ahead can be prefetched:
      // at state sizes beyond the CPU caches the probe is bound by memory latency, not arithmetic.
      std::vector<uint64_t> hashes(static_cast<size_t>(n));
      for (py::ssize_t i = 0; i < n; ++i) hashes[i] = hash_bytes(kd + off[i], static_cast<size_t>(off[i + 1] - off[i]));
      constexpr py::ssize_t kAhead = 8;
      for (py::ssize_t i = 0; i < n; ++i) {
        if (i + kAhead < n) {
          other.prefetch(hashes[i + kAhead]);
          if (store) me.prefetch(hashes[i + kAhead]);
        }
        const uint8_t* k = kd + off[i];
        const uint32_t kn = static_cast<uint32_t>(off[i + 1] - off[i]);
        const bool is_null = nk && nk[i];
        const uint64_t h = hashes[i];
        const int64_t lo = los ? los[i] : lower_, up = ups ? ups[i] : upper_;
        const int64_t reach = reach_of(side, lo, up);
        uint8_t m = 0;
        if (!is_null) {
          int32_t b = other.find(h, k, kn);
          if (b >= 0) {
            // Stored rows newer than t + reach are decided by this row's band and lie beyond it; rows
            // older than t - max_reach lie beyond their own band. The chain is sorted newest first:
            // skip the former, test the rows in between, stop at the first of the latter.
            const int64_t newest = sat_add(ts[i], reach), oldest = sat_add(ts[i], -other.max_reach);
            for (int32_t s = other.buckets[b].head; s >= 0;) {
              Slot& r = other.slots[s];
              if (r.time < oldest) break;
              if (r.time <= newest &&
                  (left ? pair_matches(ts[i], lo, up, r.time, r.lo, r.up)
                        : pair_matches(r.time, r.lo, r.up, ts[i], lo, up))) {
                out_in.push_back(i);
                out_id.push_back(r.id);
                r.matched = 1;
                m = 1;
              }
              s = r.next;
            }
          }
        }
        if (store) {
          me.insert(is_null ? kNullKey : me.find_or_add(h, k, kn), ts[i], pid[i], m, lo, up, ens ? ens[i] : ts[i]);
          me.max_reach = std::max(me.max_reach, reach);
        }
      }
    }
    return py::make_tuple(to_numpy(std::move(out_in)), to_numpy(std::move(out_id)));
  }

  // Temporal expiration (PIPES section 2.4.4): remove every row of `side` whose expiry key is
  // <= threshold (the key is the row's time unless insert_probe got `ends`). Only the expiring rows
  // are touched (heap pops). Returns (payload ids, matched flags).
  py::tuple evict(int side, int64_t threshold) {
    Side& me = s_[side_index(side)];
    std::vector<int64_t> ids;
    std::vector<uint8_t> flags;
    {
      py::gil_scoped_release release;
      while (!me.heap.empty() && me.heap.front().first <= threshold) {
        std::pop_heap(me.heap.begin(), me.heap.end(), std::greater<>());
        int32_t s = me.heap.back().second;
        me.heap.pop_back();
        ids.push_back(me.slots[s].id);
        flags.push_back(me.slots[s].matched);
        me.unlink(s);
      }
    }
    return py::make_tuple(to_numpy(std::move(ids)), to_numpy(std::move(flags)));
  }

  // Smallest expiry key of a side (the next row to expire), or None when the side is empty.
  py::object min_end(int side) const {
    const Side& me = s_[side_index(side)];
    if (me.heap.empty()) return py::none();
    return py::int_(me.heap.front().first);
  }

  // (times, lowers, uppers) of the live rows of a side in slot order (the order set_ends expects).
  py::tuple row_bounds(int side) const {
    const Side& me = s_[side_index(side)];
    std::vector<int64_t> t, lo, up;
    for (const Slot& r : me.slots) {
      if (r.bucket == kFree) continue;
      t.push_back(r.time);
      lo.push_back(r.lo);
      up.push_back(r.up);
    }
    return py::make_tuple(to_numpy(std::move(t)), to_numpy(std::move(lo)), to_numpy(std::move(up)));
  }

  // Replace the expiry keys of the live rows of a side (in the order of row_bounds) and re-heapify.
  void set_ends(int side, const I64& ends) {
    Side& me = s_[side_index(side)];
    if (static_cast<size_t>(ends.size()) != me.live)
      throw py::value_error("ends must have one key per live row (" + std::to_string(me.live) + ")");
    std::vector<int64_t> end_of_slot(me.slots.size(), kI64Min);
    const int64_t* e = ends.data();
    size_t j = 0;
    for (size_t s = 0; s < me.slots.size(); ++s)
      if (me.slots[s].bucket != kFree) end_of_slot[s] = e[j++];
    me.rebuild_heap(end_of_slot);
  }

  // Renumber the payload ids of a side 0, 1, 2, ... in the order serialize() writes the rows (key by key,
  // newest first, null keys last); returns the old ids in that order, so that the caller reorders its
  // payload with payload.take(old_ids). The payload then follows the image: dead rows are dropped,
  // each key's rows are adjacent (so its columns compress better) and the ids column of the image is
  // all ones once delta-coded (format 3).
  py::array_t<int64_t> canonical_ids(int side, int64_t payload_len) {
    Side& me = s_[side_index(side)];
    if (payload_len < 0) throw py::value_error("payload_len must be >= 0");
    std::vector<int64_t> old;
    old.reserve(me.live);
    auto renumber = [&](int32_t head) {
      for (int32_t s = head; s >= 0; s = me.slots[s].next) {
        Slot& r = me.slots[s];
        if (r.id < 0 || r.id >= payload_len) throw py::value_error("a stored payload id is outside [0, payload_len)");
        old.push_back(r.id);
        r.id = static_cast<int64_t>(old.size()) - 1;
      }
    };
    for (const Entry& e : me.table)
      if (e.bucket >= 0) renumber(me.buckets[e.bucket].head);
    renumber(me.null_head);
    return to_numpy(std::move(old));
  }

  size_t rows(int side) const { return s_[side_index(side)].live; }
  size_t keys(int side) const { return s_[side_index(side)].nbuckets; }
  size_t nbytes() const { return s_[0].nbytes() + s_[1].nbytes(); }

  // Byte image (cq::Writer, format CQS1, state format 3): meta, then per side the distinct keys with
  // their row counts and the rows grouped by key, null-key rows last, each row with its time, payload
  // id, matched flag, band and expiry key. Loading rebuilds the index and heapifies in O(n).
  // Format 3 stores each payload id as the difference to the previous row's (the first to -1) and each
  // expiry key as the difference to the row's time, both modulo 2^64: after canonical_ids the ids are
  // all ones and the expiry offsets repeat, so the compressed image shrinks by about 60 %.
  // Format 2 stored both as they are; format 1 had no bands and no expiry keys: its rows get the
  // state's bounds and their time as expiry key, and restored_format says so (the caller then re-keys
  // them with set_ends). Both are still read.
  py::bytes serialize() const {
    cq::Writer w(1 + 2 * kCols2);
    std::vector<int64_t> meta = {kFormatVersion, lower_, upper_, static_cast<int64_t>(s_[0].nulls),
                                 static_cast<int64_t>(s_[1].nulls)};
    w.column(cq::kI64, meta);
    for (const Side& me : s_) {
      std::vector<uint32_t> klen, count;
      std::vector<uint8_t> kdata, flags;
      std::vector<int64_t> times, ids, los, ups, ends;
      const std::vector<int64_t> end_of_slot = me.end_of_slot();
      klen.reserve(me.nbuckets);
      count.reserve(me.nbuckets);
      times.reserve(me.live);
      ids.reserve(me.live);
      flags.reserve(me.live);
      los.reserve(me.live);
      ups.reserve(me.live);
      ends.reserve(me.live);
      int64_t prev_id = -1;
      auto rows_from = [&](int32_t head) {
        for (int32_t s = head; s >= 0; s = me.slots[s].next) {
          const Slot& r = me.slots[s];
          times.push_back(r.time);
          ids.push_back(wrap_sub(r.id, prev_id));
          prev_id = r.id;
          flags.push_back(r.matched);
          los.push_back(r.lo);
          ups.push_back(r.up);
          ends.push_back(wrap_sub(end_of_slot[s], r.time));
        }
      };
      for (const Entry& e : me.table) {
        if (e.bucket < 0) continue;
        const Bucket& bk = me.buckets[e.bucket];
        klen.push_back(bk.klen);
        count.push_back(static_cast<uint32_t>(bk.count));
        const uint8_t* k = me.key_bytes(e.bucket);
        kdata.insert(kdata.end(), k, k + bk.klen);
        rows_from(bk.head);
      }
      rows_from(me.null_head);
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
    return py::bytes(w.str());
  }

  static JoinState deserialize(const py::bytes& blob) {
    char* data;
    Py_ssize_t size;
    if (PyBytes_AsStringAndSize(blob.ptr(), &data, &size) != 0) throw py::error_already_set();
    cq::Reader r(data, static_cast<size_t>(size));
    const uint32_t ncols = r.ncols();
    if (ncols != 1 + 2 * kCols1 && ncols != 1 + 2 * kCols2)
      throw std::invalid_argument("join state blob has an unexpected column count");
    auto meta = r.column<int64_t>(cq::kI64);
    const int64_t version = meta.empty() ? -1 : meta[0];
    if (meta.size() != 5 || version < 1 || version > kFormatVersion ||
        ncols != 1 + 2 * (version == 1 ? kCols1 : kCols2))
      throw std::invalid_argument(
          "join state blob has an unknown format version (this pyspark-cq reads join state formats 1 to " +
          std::to_string(kFormatVersion) + "; start the query with a new checkpoint location)");
    JoinState js(meta[1], meta[2]);
    js.restored_format_ = version;
    for (int side = 0; side < 2; ++side) {
      Side& me = js.s_[side];
      auto klen = r.column<uint32_t>(cq::kU32);
      auto kdata = r.column<uint8_t>(cq::kU8);
      auto count = r.column<uint32_t>(cq::kU32);
      auto times = r.column<int64_t>(cq::kI64);
      auto ids = r.column<int64_t>(cq::kI64);
      auto flags = r.column<uint8_t>(cq::kU8);
      std::vector<int64_t> los, ups, ends;
      if (version == 1) {
        los.assign(times.size(), js.lower_);
        ups.assign(times.size(), js.upper_);
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
      const uint64_t nnull = static_cast<uint64_t>(meta[3 + side]);
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
      me.slots.reserve(times.size());
      std::vector<int64_t> end_of_slot(times.size(), kI64Min);
      auto add = [&](int32_t bi, size_t row) {
        const int32_t s = me.link(bi, times[row], ids[row], flags[row], los[row], ups[row]);
        if (static_cast<size_t>(s) >= end_of_slot.size()) end_of_slot.resize(s + 1, kI64Min);
        end_of_slot[s] = ends[row];
        me.max_reach = std::max(me.max_reach, reach_of(side, los[row], ups[row]));
      };
      size_t koff = 0, row = 0;
      for (size_t b = 0; b < klen.size(); ++b) {
        const uint8_t* k = kdata.data() + koff;
        int32_t bi = me.find_or_add(hash_bytes(k, klen[b]), k, klen[b]);
        // Rows were written newest first: link them oldest first so each lands at the head in O(1).
        for (uint32_t c = count[b]; c-- > 0;) add(bi, row + c);
        row += count[b];
        koff += klen[b];
      }
      for (size_t c = times.size(); c-- > row;) add(kNullKey, c);
      me.rebuild_heap(end_of_slot);
    }
    if (!r.done()) throw std::invalid_argument("join state blob has trailing bytes");
    return js;
  }

 private:
  static constexpr uint32_t kCols1 = 6, kCols2 = 9;  // columns per side in formats 1 and 2
  int64_t lower_, upper_;
  int64_t restored_format_ = 0;
  Side s_[2];
};

// Concatenate several per-row byte encodings into one injective key encoding: each component is
// prefixed by its 4-byte length, so ("ab", "c") and ("a", "bc") differ.
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
  std::vector<int64_t> out_off(static_cast<size_t>(n) + 1, 0);
  for (py::ssize_t i = 0; i < n; ++i) {
    int64_t len = 0;
    for (size_t p = 0; p < np; ++p) len += 4 + (offs[p].data()[i + 1] - offs[p].data()[i]);
    out_off[i + 1] = out_off[i] + len;
  }
  std::vector<uint8_t> out(static_cast<size_t>(out_off[n]));
  for (py::ssize_t i = 0; i < n; ++i) {
    uint8_t* dst = out.data() + out_off[i];
    for (size_t p = 0; p < np; ++p) {
      const int64_t a = offs[p].data()[i], b = offs[p].data()[i + 1];
      const uint32_t len = static_cast<uint32_t>(b - a);
      std::memcpy(dst, &len, 4);
      std::memcpy(dst + 4, datas[p].data() + a, len);
      dst += 4 + len;
    }
  }
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
      .def("insert_probe", &JoinState::insert_probe, py::arg("side"), py::arg("offsets"), py::arg("data"),
           py::arg("null_key"), py::arg("times"), py::arg("ids"), py::arg("store") = true,
           py::arg("lower") = py::none(), py::arg("upper") = py::none(), py::arg("ends") = py::none(),
           "Probe the other side with each row (in order), then store it on `side` (0 left, 1 right).\n"
           "Keys are byte strings data[offsets[i]:offsets[i+1]]; null_key (uint8 mask or None) marks rows\n"
           "that never match. lower/upper (int64 arrays or None: the state's bounds) give each row its own\n"
           "band; a pair is decided by the band of the earlier row (the left one on a tie). ends (int64 or\n"
           "None: the times) are the rows' expiry keys for evict(). Returns (input row indexes, matched\n"
           "payload ids of the other side).")
      .def("evict", &JoinState::evict, py::arg("side"), py::arg("threshold"),
           "Remove the rows of `side` whose expiry key (default: time) is <= threshold; returns (payload\n"
           "ids, matched flags).")
      .def("min_end", &JoinState::min_end, py::arg("side"),
           "Smallest expiry key of `side` (the next row to expire), or None.")
      .def("min_time", &JoinState::min_end, py::arg("side"),
           "Alias of min_end: the smallest stored time when rows were stored without `ends`.")
      .def("row_bounds", &JoinState::row_bounds, py::arg("side"),
           "(times, lowers, uppers) of the live rows of `side`, in the order set_ends expects.")
      .def("set_ends", &JoinState::set_ends, py::arg("side"), py::arg("ends"),
           "Replace the expiry keys of the live rows of `side` (order of row_bounds).")
      .def("canonical_ids", &JoinState::canonical_ids, py::arg("side"), py::arg("payload_len"),
           "Renumber the payload ids of `side` 0, 1, ... in serialization order (key by key); returns\n"
           "the old ids in that order, to reorder the payload with payload.take(old_ids).")
      .def("rows", &JoinState::rows, py::arg("side"), "Number of stored rows of `side`.")
      .def("keys", &JoinState::keys, py::arg("side"), "Number of distinct non-null keys of `side`.")
      .def("nbytes", &JoinState::nbytes, "Approximate memory held by the state, in bytes.")
      .def("serialize", &JoinState::serialize, "The state as bytes (format CQS1, see serde.hpp).")
      .def_static("deserialize", &JoinState::deserialize, py::arg("blob"),
                  "Rebuild a state from serialize(); raises ValueError on a corrupt blob.");
  m.def("concat_keys", &concat_keys, py::arg("parts"),
        "Join per-row byte encodings [(offsets, data), ...] into one injective encoding (offsets, data).");
  m.attr("FORMAT_VERSION") = kFormatVersion;
}
