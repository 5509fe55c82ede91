// The reducer node (csrc/server) in reducer._core.
#include "bindings/common.h"
#include "server/server.h"

namespace rs::py_bind {

namespace {

py::dict server_stats(const rs::server::Server& s) {
  rs::server::ServerStats st = s.stats();
  py::dict d;
  d["bytes_received"] = st.bytes_received;
  d["bytes_sent"] = st.bytes_sent;
  d["rounds_completed"] = st.rounds_completed;
  d["chunks_reduced"] = st.chunks_reduced;
  d["connections"] = st.connections;
  d["connected_workers"] = st.connected_workers;
  d["groups"] = st.groups;
  d["errors"] = st.errors;
  d["rejected"] = st.rejected;
  d["memory_bytes"] = st.memory_bytes;
  return d;
}

}  // namespace

void bind_server(py::module_& m) {
  py::class_<rs::server::Server>(m, "Server")
      .def(py::init([](const std::string& host, uint16_t port, int threads, const std::string& token, int window,
                       double handshake_timeout, int socket_buffer, uint64_t max_group_bytes) {
             rs::server::ServerOptions o;
             if (max_group_bytes) o.max_group_bytes = max_group_bytes;
             if (socket_buffer >= 0) o.socket_buffer = socket_buffer;
             o.host = host;
             o.port = port;
             o.threads = threads;
             o.auth_token = token;
             o.window = window;
             o.handshake_timeout = handshake_timeout;
             return std::make_unique<rs::server::Server>(o);
           }),
           py::arg("host"), py::arg("port"), py::arg("threads") = 0, py::arg("auth_token") = "",
           py::arg("window") = 4, py::arg("handshake_timeout") = 10.0, py::arg("socket_buffer") = -1,
           py::arg("max_group_bytes") = 0)
      .def("start", &rs::server::Server::start, py::call_guard<py::gil_scoped_release>())
      .def("stop", &rs::server::Server::stop, py::arg("drain_timeout") = 0.0, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("port", &rs::server::Server::port)
      .def_property_readonly("running", &rs::server::Server::running)
      .def("stats", &server_stats);

}

}  // namespace rs::py_bind
