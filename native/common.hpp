// What the state kernels (aggregate_core.hpp, join_core.hpp) share: int64 limits and 64-bit mixing
// functions, each named for what it is. Plain C++17, no Python (pybind11 helpers: bindings_common.hpp).
//
// The two mixers are different functions on purpose and must not be swapped: each kernel's hash
// tables were tuned (and benchmarked) with its own. Neither value is ever stored in a state image
// (indexes are rebuilt on load), so changing one would change speed, never a checkpoint.
#pragma once
#include <cstdint>
#include <limits>

namespace cq {

constexpr std::int64_t kI64Max = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kI64Min = std::numeric_limits<std::int64_t>::min();

// splitmix64's output finalizer (Steele, Lea, Flood; Stafford's "Mix13" constants): a bijection on
// 64-bit words with full avalanche. The aggregation's int64 index (I64Index, preaggregate) places
// key hashes with it.
inline std::uint64_t splitmix64_finalize(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// MurmurHash3's 64-bit finalizer (fmix64, Appleby): another avalanche bijection on 64-bit words. The
// join's byte-string key hash (join_core.hpp, hash_bytes) is built on it.
inline std::uint64_t murmur3_fmix64(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

}  // namespace cq
