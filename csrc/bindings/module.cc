// The pybind11 module reducer._core: type conversion, GIL release and exception
// mapping only. All logic lives in the C++ core (protocol/, kernels/, net/, server/, client/,
// cluster/).
#include <pybind11/pybind11.h>

#include "bindings/common.h"

namespace rs::py_bind {
void bind_cluster(py::module_& m);  // bindings/cluster.cc: reducer._core.cluster
}  // namespace rs::py_bind

PYBIND11_MODULE(_core, m) {
  m.doc() = "reduction-server C++ core";
  rs::py_bind::bind_common(m);
  rs::py_bind::bind_kernels(m);
  rs::py_bind::bind_server(m);
  rs::py_bind::bind_client(m);
  rs::py_bind::bind_ring(m);
  rs::py_bind::bind_cluster(m);
}
