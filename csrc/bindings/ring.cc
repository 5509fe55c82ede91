// The ring all-reduce baseline (csrc/ring, benchmarks) in reducer._core.
#include "ring/ring.h"
#include "bindings/common.h"

namespace rs::py_bind {

void bind_ring(py::module_& m) {
  const rs::ring::RingOptions defaults;
  py::class_<rs::ring::Ring>(m, "Ring")
      .def(py::init([](uint32_t rank, uint32_t world, const std::string& listen_host, uint16_t port, double timeout,
                       uint32_t chunk, int socket_buffer, uint64_t session) {
             rs::ring::RingOptions o;
             o.rank = rank;
             o.world_size = world;
             o.listen_host = listen_host;
             o.port = port;
             o.timeout = timeout;
             o.chunk_bytes = chunk;
             if (socket_buffer >= 0) o.socket_buffer = socket_buffer;  // -1: the core's default
             o.session = session;
             return std::make_unique<rs::ring::Ring>(o);
           }),
           py::arg("rank"), py::arg("world_size"), py::arg("listen_host") = defaults.listen_host,
           py::arg("port") = defaults.port, py::arg("timeout") = defaults.timeout,
           py::arg("chunk_bytes") = defaults.chunk_bytes, py::arg("socket_buffer") = defaults.socket_buffer,
           py::arg("session") = defaults.session,
           "Ring all-reduce rank: listens at once (port 0 = any); then connect(addresses).")
      .def("connect", &rs::ring::Ring::connect, py::arg("addresses"), py::arg("connect_timeout") = 60.0,
           py::call_guard<py::gil_scoped_release>(),
           "Connect to the right neighbour and accept the left one; addresses[i] = 'host:port' of rank i.")
      .def(
          "allreduce",
          [](rs::ring::Ring& r, py::buffer buf, const std::string& dtype, const std::string& op) {
            BufView v = view_of(buf, true);
            rs::DType t = dtype_arg(dtype);
            rs::Op o = op_arg(op);
            py::gil_scoped_release release;
            r.allreduce(const_cast<void*>(v.ptr), v.nbytes, t, o);
          },
          py::arg("buffer"), py::arg("dtype"), py::arg("op") = "sum", "Reduce a C-contiguous buffer in place.")
      .def(
          "allreduce_ptr",
          [](rs::ring::Ring& r, uintptr_t ptr, size_t nbytes, const std::string& dtype, const std::string& op) {
            rs::DType t = dtype_arg(dtype);
            rs::Op o = op_arg(op);
            if (ptr == 0 && nbytes) throw py::value_error("null pointer");
            py::gil_scoped_release release;
            r.allreduce(reinterpret_cast<void*>(ptr), nbytes, t, o);
          },
          py::arg("ptr"), py::arg("nbytes"), py::arg("dtype"), py::arg("op") = "sum")
      .def("close", &rs::ring::Ring::close, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("port", &rs::ring::Ring::port)
      .def_property_readonly("rank", &rs::ring::Ring::rank)
      .def_property_readonly("world_size", &rs::ring::Ring::world_size)
      .def_property_readonly("connected", &rs::ring::Ring::connected)
      .def("stats", [](const rs::ring::Ring& r) {
        rs::ring::RingStats st = r.stats();
        py::dict d;
        d["bytes_sent"] = st.bytes_sent;
        d["bytes_received"] = st.bytes_received;
        d["rounds"] = st.rounds;
        return d;
      });
}

}  // namespace rs::py_bind
