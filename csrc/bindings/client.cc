// The worker transport (csrc/client) in reducer._core.
#include "bindings/common.h"
#include "client/client.h"

namespace rs::py_bind {

namespace {

void client_allreduce(rs::client::Client& c, py::buffer buf, const std::string& dtype, const std::string& op,
                      uint64_t tag) {
  BufView v = view_of(buf, true);
  rs::DType t = dtype_arg(dtype);
  rs::Op o = op_arg(op);
  py::gil_scoped_release release;
  c.allreduce(const_cast<void*>(v.ptr), v.nbytes, t, o, tag);
}

void client_allreduce_ptr(rs::client::Client& c, uintptr_t ptr, size_t nbytes, const std::string& dtype,
                          const std::string& op, uint64_t tag) {
  rs::DType t = dtype_arg(dtype);
  rs::Op o = op_arg(op);
  if (ptr == 0 && nbytes) throw py::value_error("null pointer");
  py::gil_scoped_release release;
  c.allreduce(reinterpret_cast<void*>(ptr), nbytes, t, o, tag);
}

}  // namespace

void bind_client(py::module_& m) {
  py::class_<rs::client::Client>(m, "Client")
      .def(py::init([](const std::vector<std::string>& reducers, uint32_t rank, uint32_t world, const std::string& group,
                       const std::string& job, double timeout, double connect_timeout, const std::string& token,
                       int streams, uint32_t chunk, int socket_buffer, int window) {
             rs::client::ClientOptions o;
             if (window > 0) o.window = window;
             if (socket_buffer >= 0) o.socket_buffer = socket_buffer;
             o.reducers = reducers;
             o.rank = rank;
             o.world_size = world;
             o.group = group;
             o.job_id = job;
             o.timeout = timeout;
             o.connect_timeout = connect_timeout;
             o.auth_token = token;
             o.streams = streams;
             o.chunk_bytes = chunk;
             py::gil_scoped_release release;
             return std::make_unique<rs::client::Client>(o);
           }),
           py::arg("reducers"), py::arg("rank"), py::arg("world_size"), py::arg("group"), py::arg("job_id"),
           py::arg("timeout"), py::arg("connect_timeout"), py::arg("auth_token"), py::arg("streams"),
           py::arg("chunk_bytes"), py::arg("socket_buffer") = -1, py::arg("window") = 0)
      .def("allreduce", &client_allreduce, py::arg("buffer"), py::arg("dtype"), py::arg("op"), py::arg("tag") = 0)
      .def("allreduce_ptr", &client_allreduce_ptr, py::arg("ptr"), py::arg("nbytes"), py::arg("dtype"), py::arg("op"),
           py::arg("tag") = 0)
      .def("close", &rs::client::Client::close, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("connected", &rs::client::Client::connected)
      .def("stats", [](const rs::client::Client& c) {
        rs::client::ClientStats st = c.stats();
        py::dict d;
        d["bytes_sent"] = st.bytes_sent;
        d["bytes_received"] = st.bytes_received;
        d["rounds"] = st.rounds;
        d["reconnects"] = st.reconnects;
        return d;
      });

}

}  // namespace rs::py_bind
