// The pybind11 module reducer._core: type conversion, GIL release and exception
// mapping only. All logic lives in the C++ core (protocol/, kernels/, net/, server/, client/).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "client/client.h"
#include "common/error.h"
#include "common/log.h"
#include "kernels/kernels.h"
#include "protocol/hmac.h"
#include "protocol/wire.h"
#include "ring/ring.h"  // issue 5: ring all-reduce baseline (binding block at the end)
#include "server/server.h"

namespace py = pybind11;

namespace {

struct BufView {
  const void* ptr;
  size_t nbytes;
};

BufView view_of(const py::buffer& b, bool writable) {
  py::buffer_info info = b.request(writable);
  // C-contiguity check: strides must describe a dense row-major layout.
  py::ssize_t expect = info.itemsize;
  for (py::ssize_t i = info.ndim - 1; i >= 0; --i) {
    if (info.shape[i] > 1 && info.strides[i] != expect)
      throw py::value_error("buffer must be C-contiguous");
    expect *= info.shape[i];
  }
  return {info.ptr, static_cast<size_t>(info.size * info.itemsize)};
}

rs::DType dtype_arg(const std::string& s) {
  rs::DType t;
  if (!rs::parse_dtype(s, &t)) throw py::value_error("unsupported dtype '" + s + "'");
  return t;
}

rs::Op op_arg(const std::string& s) {
  rs::Op o;
  if (!rs::parse_op(s, &o)) throw py::value_error("unsupported op '" + s + "' (sum, avg, min, max)");
  return o;
}

// Reduce `inputs` (rank order) into `out` exactly as the reducer does for one chunk.
void kernels_reduce(const std::string& dtype, const std::string& op, const std::vector<py::buffer>& inputs,
                    py::buffer out) {
  rs::DType t = dtype_arg(dtype);
  rs::Op o = op_arg(op);
  if (inputs.empty()) throw py::value_error("need at least one input");
  BufView ov = view_of(out, true);
  std::vector<BufView> iv;
  for (auto& b : inputs) {
    iv.push_back(view_of(b, false));
    if (iv.back().nbytes != ov.nbytes) throw py::value_error("all inputs must have the size of out");
  }
  size_t es = rs::dtype_size(t);
  if (ov.nbytes % es) throw py::value_error("buffer size is not a multiple of the dtype size");
  size_t n = ov.nbytes / es;
  std::vector<unsigned char> acc(n * rs::acc_elem_size(t));
  {
    py::gil_scoped_release release;
    rs::kernels::init(t, acc.data(), iv[0].ptr, n);
    for (size_t k = 1; k < iv.size(); ++k) rs::kernels::accumulate(t, o, acc.data(), iv[k].ptr, n);
    rs::kernels::finalize(t, o, const_cast<void*>(ov.ptr), acc.data(), n, static_cast<uint32_t>(iv.size()));
  }
}

// One accumulate pass (acc op= x) for benchmarks: acc uses the accumulator type.
void kernels_accumulate(const std::string& dtype, const std::string& op, py::buffer acc, py::buffer x) {
  rs::DType t = dtype_arg(dtype);
  rs::Op o = op_arg(op);
  BufView av = view_of(acc, true), xv = view_of(x, false);
  size_t n = xv.nbytes / rs::dtype_size(t);
  if (av.nbytes < n * rs::acc_elem_size(t)) throw py::value_error("accumulator too small");
  py::gil_scoped_release release;
  rs::kernels::accumulate(t, o, const_cast<void*>(av.ptr), xv.ptr, n);
}

// ---- logging: C++ log lines go to Python's logging module ("reducer.core") ----
py::object* g_log_fn = nullptr;  // a Python callable (level, message), owned by the module

void py_log_sink(rs::LogLevel level, const std::string& msg) {
  if (!Py_IsInitialized()) return;
  py::gil_scoped_acquire gil;
  if (!g_log_fn || g_log_fn->is_none()) return;
  try {
    (*g_log_fn)(int(level), msg);
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("reducer log sink");
  }
}

void set_log_callback(py::object fn) {
  static py::object holder;  // kept alive for the module's lifetime
  holder = std::move(fn);
  g_log_fn = &holder;
  rs::set_log_sink(holder.is_none() ? nullptr : &py_log_sink);
}

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

PYBIND11_MODULE(_core, m) {
  m.doc() = "reduction-server C++ core";

  // Exceptions: the classes come from reducer.errors so Python and C++ raise the same types.
  py::module_ errors = py::module_::import("reducer.errors");
  static py::object cls[8];
  const char* names[8] = {"ConfigError", "ConnectError", "AuthError", "ProtocolError",
                          "PeerLostError", "MismatchError", "ReductionTimeout", "ReductionError"};
  for (int i = 0; i < 8; ++i) cls[i] = errors.attr(names[i]);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const rs::Error& e) {
      int idx = 7;
      switch (e.kind()) {
        case rs::ErrorKind::Config: idx = 0; break;
        case rs::ErrorKind::Connect: idx = 1; break;
        case rs::ErrorKind::Auth: idx = 2; break;
        case rs::ErrorKind::Protocol: idx = 3; break;
        case rs::ErrorKind::PeerLost: idx = 4; break;
        case rs::ErrorKind::Mismatch: idx = 5; break;
        case rs::ErrorKind::Timeout: idx = 6; break;
        case rs::ErrorKind::Internal: idx = 7; break;
      }
      PyErr_SetString(cls[idx].ptr(), e.what());
    }
  });

  m.def("set_log_callback", &set_log_callback, py::arg("fn"),
        "Route C++ log lines to fn(level: int, message: str); None restores stderr.");
  m.def("hmac_sha256", [](const std::string& key, const std::string& msg) {
    rs::proto::Digest d = rs::proto::hmac_sha256(key, msg);
    return py::bytes(reinterpret_cast<const char*>(d.data()), d.size());
  }, py::arg("key"), py::arg("message"));
  m.attr("PROTOCOL_VERSION") = rs::proto::kVersion;

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

  m.def("kernels_reduce", &kernels_reduce, py::arg("dtype"), py::arg("op"), py::arg("inputs"), py::arg("out"),
        "Reduce inputs (in rank order) into out with the reducer's kernels.");
  m.def("kernels_accumulate", &kernels_accumulate, py::arg("dtype"), py::arg("op"), py::arg("acc"), py::arg("x"),
        "acc op= x (acc in the accumulator type: float32 for float16/bfloat16).");
  m.def("kernels_isa", &rs::kernels::isa_name, "Instruction set the kernels dispatch to.");
  m.def("kernels_set_isa", &rs::kernels::set_isa, py::arg("name"),
        "Force 'scalar', 'avx2', 'avx512' or 'auto'; returns False if this CPU lacks it.");

  // ---- BEGIN ring all-reduce baseline (issue 5, benchmarks; csrc/ring) ----
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
             o.socket_buffer = socket_buffer;
             o.session = session;
             return std::make_unique<rs::ring::Ring>(o);
           }),
           py::arg("rank"), py::arg("world_size"), py::arg("listen_host") = "0.0.0.0", py::arg("port") = 0,
           py::arg("timeout") = 30.0, py::arg("chunk_bytes") = 1u << 20, py::arg("socket_buffer") = 4 << 20,
           py::arg("session") = 0,
           "Ring all-reduce rank: listens at once (port 0 = any); then connect(addresses).")
      .def("connect", &rs::ring::Ring::connect, py::arg("addresses"), py::arg("connect_timeout") = 60.0,
           py::call_guard<py::gil_scoped_release>(),
           "Connect to the right neighbour and accept the left one; addresses[i] = 'host:port' of rank i.")
      .def("allreduce", [](rs::ring::Ring& r, py::buffer buf, const std::string& dtype, const std::string& op) {
             BufView v = view_of(buf, true);
             rs::DType t = dtype_arg(dtype);
             rs::Op o = op_arg(op);
             py::gil_scoped_release release;
             r.allreduce(const_cast<void*>(v.ptr), v.nbytes, t, o);
           }, py::arg("buffer"), py::arg("dtype"), py::arg("op") = "sum", "Reduce a C-contiguous buffer in place.")
      .def("allreduce_ptr", [](rs::ring::Ring& r, uintptr_t ptr, size_t nbytes, const std::string& dtype,
                               const std::string& op) {
             rs::DType t = dtype_arg(dtype);
             rs::Op o = op_arg(op);
             if (ptr == 0 && nbytes) throw py::value_error("null pointer");
             py::gil_scoped_release release;
             r.allreduce(reinterpret_cast<void*>(ptr), nbytes, t, o);
           }, py::arg("ptr"), py::arg("nbytes"), py::arg("dtype"), py::arg("op") = "sum")
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
  // ---- END ring all-reduce baseline ----
}
