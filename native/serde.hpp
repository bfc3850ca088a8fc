// Byte (de)serialization of operator state: a small, versioned, length-checked column format.
//
// Layout: "CQS1" | u32 ncols | per column: u8 dtype code, u8 item size, u64 length, raw little-endian
// bytes. State kernels write their tables with Writer and read them back with Reader, which checks
// every length against the remaining buffer so a truncated or foreign blob raises instead of crashing.
#pragma once
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace cq {

constexpr char kMagic[4] = {'C', 'Q', 'S', '1'};

class Writer {
 public:
  explicit Writer(std::uint32_t ncols) {
    buf_.append(kMagic, 4);
    put(ncols);
  }
  template <class T>
  void put(const T& v) { buf_.append(reinterpret_cast<const char*>(&v), sizeof(T)); }
  void column(std::uint8_t code, std::uint8_t itemsize, const void* data, std::uint64_t n) {
    put(code);
    put(itemsize);
    put(n);
    buf_.append(static_cast<const char*>(data), static_cast<std::size_t>(n * itemsize));
  }
  template <class T>
  void column(std::uint8_t code, const std::vector<T>& v) { column(code, sizeof(T), v.data(), v.size()); }
  std::string& str() { return buf_; }

 private:
  std::string buf_;
};

class Reader {
 public:
  Reader(const char* data, std::size_t size) : p_(data), end_(data + size) {
    if (size < 8 || std::memcmp(data, kMagic, 4) != 0)
      throw std::invalid_argument("state blob is not pyspark-cq state (bad magic or too short)");
    p_ += 4;
    ncols_ = get<std::uint32_t>();
  }
  std::uint32_t ncols() const { return ncols_; }
  template <class T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  // Reads one column header and returns a pointer to its raw bytes.
  const char* column(std::uint8_t* code, std::uint8_t* itemsize, std::uint64_t* n) {
    *code = get<std::uint8_t>();
    *itemsize = get<std::uint8_t>();
    *n = get<std::uint64_t>();
    if (*itemsize == 0 || *n > static_cast<std::uint64_t>(end_ - p_) / *itemsize)
      throw std::invalid_argument("state blob is truncated or corrupt (column length exceeds data)");
    const char* data = p_;
    p_ += *n * *itemsize;
    return data;
  }
  template <class T>
  std::vector<T> column(std::uint8_t expect_code) {
    std::uint8_t code, itemsize;
    std::uint64_t n;
    const char* d = column(&code, &itemsize, &n);
    if (code != expect_code || itemsize != sizeof(T))
      throw std::invalid_argument("state blob column has an unexpected type");
    std::vector<T> v(n);
    if (n) std::memcpy(v.data(), d, n * sizeof(T));
    return v;
  }
  bool done() const { return p_ == end_; }

 private:
  void need(std::size_t k) {
    if (static_cast<std::size_t>(end_ - p_) < k)
      throw std::invalid_argument("state blob is truncated");
  }
  const char* p_;
  const char* end_;
  std::uint32_t ncols_ = 0;
};

// dtype codes: numpy kind + size, stable across versions.
enum Code : std::uint8_t { kBool = 1, kI8, kI16, kI32, kI64, kU8, kU16, kU32, kU64, kF32, kF64 };

}  // namespace cq
