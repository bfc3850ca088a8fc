// pybind11 module pyspark_cq._serde: pack numpy columns into one bytes blob and back (see serde.hpp).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "bindings_common.hpp"
#include "serde.hpp"

namespace py = pybind11;

namespace {

struct Kind {
  char kind;
  int size;
  cq::Code code;
};
constexpr Kind kKinds[] = {{'b', 1, cq::kBool}, {'i', 1, cq::kI8},  {'i', 2, cq::kI16}, {'i', 4, cq::kI32},
                           {'i', 8, cq::kI64},  {'u', 1, cq::kU8},  {'u', 2, cq::kU16}, {'u', 4, cq::kU32},
                           {'u', 8, cq::kU64},  {'f', 4, cq::kF32}, {'f', 8, cq::kF64}};

cq::Code code_of(const py::dtype& dt, std::size_t index) {
  for (const auto& k : kKinds)
    if (dt.kind() == k.kind && dt.itemsize() == k.size) return k.code;
  throw py::type_error("columns[" + std::to_string(index) + "] has unsupported dtype " +
                       std::string(py::str(dt)) + "; expected bool, (u)int8..64 or float32/64");
}

py::dtype dtype_of(std::uint8_t code) {
  static const char* names[] = {"", "bool", "int8", "int16", "int32", "int64", "uint8",
                                "uint16", "uint32", "uint64", "float32", "float64"};
  if (code < 1 || code > cq::kF64) throw std::invalid_argument("state blob has an unknown column type");
  return py::dtype(names[code]);
}

py::bytes pack(const py::sequence& columns) {
  cq::Writer w(static_cast<std::uint32_t>(columns.size()));
  for (std::size_t i = 0; i < columns.size(); ++i) {
    py::object obj = columns[i];
    if (!py::isinstance<py::array>(obj))
      throw py::type_error("columns[" + std::to_string(i) + "] must be a 1-D numpy array");
    auto arr = py::array::ensure(obj, py::array::c_style);
    if (arr.ndim() != 1)
      throw py::value_error("columns[" + std::to_string(i) + "] must be 1-D, got " +
                            std::to_string(arr.ndim()) + "-D");
    cq::Code code = code_of(arr.dtype(), i);
    w.column(code, static_cast<std::uint8_t>(arr.itemsize()), arr.data(), arr.size());
  }
  return py::bytes(w.str());
}

py::list unpack(const py::bytes& blob) {
  const auto [data, size] = cq::bind::bytes_view(blob);
  cq::Reader r(data, size);
  py::list out;
  for (std::uint32_t c = 0; c < r.ncols(); ++c) {
    std::uint8_t code, itemsize;
    std::uint64_t n;
    const char* src = r.column(&code, &itemsize, &n);
    py::dtype dt = dtype_of(code);
    if (dt.itemsize() != itemsize) throw std::invalid_argument("state blob column has a bad item size");
    py::array arr(dt, std::vector<py::ssize_t>{static_cast<py::ssize_t>(n)});
    if (n) std::memcpy(arr.mutable_data(), src, n * itemsize);
    out.append(arr);
  }
  if (!r.done()) throw std::invalid_argument("state blob has trailing bytes");
  return out;
}

}  // namespace

PYBIND11_MODULE(_serde, m) {
  m.doc() = "Length-checked byte (de)serialization of numpy columns, used for operator state.";
  m.def("pack", &pack, py::arg("columns"),
        "Pack a sequence of 1-D numpy arrays into one bytes blob (format 'CQS1').");
  m.def("unpack", &unpack, py::arg("blob"),
        "Unpack a blob written by pack() into a list of numpy arrays; raises ValueError when corrupt.");
  m.attr("FORMAT") = "CQS1";
}
