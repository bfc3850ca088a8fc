// numpy <-> C++ helpers shared by the pybind11 modules (aggregate.cpp, join.cpp, serde.cpp). The
// kernels themselves (*_core.hpp, serde.hpp, common.hpp) never include this file: they stay Python-free.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace cq {
namespace bind {

// A 1-D C-contiguous int64 / uint8 array argument, converted (copied) by pybind11 when needed.
using I64 = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>;
using U8 = py::array_t<std::uint8_t, py::array::c_style | py::array::forcecast>;

// A numpy array that takes over `v` without copying (the capsule frees the vector with the array).
template <class T>
py::array_t<T> to_numpy(std::vector<T>&& v) {
  auto* heap_vec = new std::vector<T>(std::move(v));
  py::capsule owner(heap_vec, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>({static_cast<py::ssize_t>(heap_vec->size())}, {static_cast<py::ssize_t>(sizeof(T))},
                        heap_vec->data(), owner);
}

// A numpy copy of `v` (for vectors the caller keeps).
template <class T>
py::array_t<T> to_numpy(const std::vector<T>& v) {
  py::array_t<T> a(static_cast<py::ssize_t>(v.size()));
  if (!v.empty()) std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(T));
  return a;
}

// A 1-D C-contiguous view of `obj` as T, with a readable error naming `what`; `expect` >= 0 also
// checks the length.
template <class T>
py::array_t<T, py::array::c_style | py::array::forcecast> as_array(const py::handle& obj, const char* what,
                                                                   py::ssize_t expect = -1) {
  auto a = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(obj);
  if (!a) throw py::type_error(std::string(what) + " must be a 1-D numeric array");
  if (a.ndim() != 1) throw py::value_error(std::string(what) + " must be 1-D");
  if (expect >= 0 && a.shape(0) != expect)
    throw py::value_error(std::string(what) + " has length " + std::to_string(a.shape(0)) + ", expected " +
                          std::to_string(expect));
  return a;
}

// The bytes of a Python bytes object, without copying (valid while `blob` lives).
inline std::pair<const char*, std::size_t> bytes_view(const py::bytes& blob) {
  char* data;
  Py_ssize_t size;
  if (PyBytes_AsStringAndSize(blob.ptr(), &data, &size) != 0) throw py::error_already_set();
  return {data, static_cast<std::size_t>(size)};
}

}  // namespace bind
}  // namespace cq
