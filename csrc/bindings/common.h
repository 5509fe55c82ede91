// Shared helpers of the pybind11 module reducer._core: buffer views and argument parsing.
// Each bind_*.cc registers one part of the core; module.cc puts them together.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <memory>
#include <string>

#include "kernels/kernels.h"

namespace rs::py_bind {

namespace py = pybind11;

struct BufView {
  const void* ptr;
  size_t nbytes;
};

// A C-contiguous buffer's address and size; raises ValueError otherwise.
BufView view_of(const py::buffer& b, bool writable);
rs::DType dtype_arg(const std::string& s);
rs::Op op_arg(const std::string& s);

// The holder of a core object whose destructor blocks (the reducer joins its event loops, the
// client says goodbye on its sockets): the destructor runs without the GIL. With the GIL held, a
// core thread that logs (the log sink takes the GIL) while the destructor waits for it would
// deadlock the process, e.g. a running reducer dropped without stop().
template <typename T>
struct ReleaseGilDelete {
  ReleaseGilDelete() = default;
  ReleaseGilDelete(std::default_delete<T>) {}  // NOLINT: from std::make_unique's pointer
  void operator()(T* p) const {
    if (PyGILState_Check()) {
      py::gil_scoped_release release;
      std::default_delete<T>()(p);
    } else {
      std::default_delete<T>()(p);
    }
  }
};
template <typename T>
using GilFreeHolder = std::unique_ptr<T, ReleaseGilDelete<T>>;

void bind_common(py::module_& m);  // errors, logging, hmac, protocol constants
void bind_kernels(py::module_& m);
void bind_server(py::module_& m);
void bind_client(py::module_& m);
void bind_ring(py::module_& m);

}  // namespace rs::py_bind
