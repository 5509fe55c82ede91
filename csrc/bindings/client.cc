// The worker transport (csrc/client) in reducer._core.
//
// Asynchronous rounds: start()/start_ptr()/start_segments() return a round id at once;
// test(id) / wait(id) drive every round in flight (GIL released). The memory of a round is
// NOT kept alive by the binding: the caller must keep the buffer (array, tensor, pointer
// target) alive and untouched until test() returned True or wait() returned.
//
// Every round method takes compression="" | "bf16" | "fp16": a float32 buffer then travels as
// 16-bit values (converted chunk by chunk in the client; see csrc/client/client.h).
#include <sys/uio.h>

#include <map>
#include <optional>
#include <tuple>

#include "bindings/common.h"
#include "client/client.h"
#include "client/client_settings.h"
#include "common/compression.h"

namespace rs::py_bind {

namespace {

using rs::client::Client;
using rs::client::ClientOptions;
using rs::client::Compression;
using rs::client::RoundId;

struct Round {  // one round's arguments, parsed with the GIL held
  std::vector<iovec> segs;
  rs::DType dtype;
  rs::Op op;
  uint64_t tag;
  Compression comp;
};

Compression compression_arg(const std::string& s) {
  Compression c;
  if (!rs::parse_wire_compression(s, &c))
    throw py::value_error("unknown compression '" + s + "' (use " + rs::kCompressionChoices + ")");
  return c;
}

Round buffer_round(py::buffer buf, const std::string& dtype, const std::string& op, uint64_t tag,
                   const std::string& comp) {
  BufView v = view_of(buf, true);
  return {{iovec{const_cast<void*>(v.ptr), v.nbytes}}, dtype_arg(dtype), op_arg(op), tag, compression_arg(comp)};
}

Round ptr_round(uintptr_t ptr, size_t nbytes, const std::string& dtype, const std::string& op, uint64_t tag,
                const std::string& comp) {
  if (ptr == 0 && nbytes) throw py::value_error("null pointer");
  return {{iovec{reinterpret_cast<void*>(ptr), nbytes}}, dtype_arg(dtype), op_arg(op), tag, compression_arg(comp)};
}

Round segments_round(const std::vector<std::tuple<uintptr_t, size_t>>& segments, const std::string& dtype,
                     const std::string& op, uint64_t tag, const std::string& comp) {
  Round r{{}, dtype_arg(dtype), op_arg(op), tag, compression_arg(comp)};
  for (const auto& [ptr, nbytes] : segments) {
    if (ptr == 0 && nbytes) throw py::value_error("null pointer in segments");
    r.segs.push_back(iovec{reinterpret_cast<void*>(ptr), nbytes});
  }
  return r;
}

RoundId start(Client& c, const Round& r) {
  py::gil_scoped_release release;
  return c.start(r.segs.data(), r.segs.size(), r.dtype, r.op, r.tag, r.comp);
}

std::optional<RoundId> try_start(Client& c, const Round& r) {
  py::gil_scoped_release release;
  RoundId id = 0;
  if (!c.try_start(r.segs.data(), r.segs.size(), r.dtype, r.op, r.tag, &id, r.comp)) return std::nullopt;
  return id;
}

void run(Client& c, const Round& r) {
  py::gil_scoped_release release;
  c.wait(c.start(r.segs.data(), r.segs.size(), r.dtype, r.op, r.tag, r.comp));
}

// The options a client was made with (or read_client_options gave), by setting name.
py::dict options_dict(const ClientOptions& o) {
  using namespace pybind11::literals;
  return py::dict("reducers"_a = o.reducers, "rank"_a = o.rank, "world_size"_a = o.world_size, "group"_a = o.group,
                  "job_id"_a = o.job_id, "timeout"_a = o.timeout, "connect_timeout"_a = o.connect_timeout,
                  "auth_token"_a = o.auth_token, "streams"_a = o.streams, "chunk_bytes"_a = o.chunk_bytes,
                  "window"_a = o.window, "socket_buffer"_a = o.socket_buffer, "failover"_a = o.failover,
                  "max_rounds_in_flight"_a = o.max_rounds_in_flight, "integrity"_a = o.integrity);
}

// client/client_settings.h over a mapping instead of the process environment (the plugin's reader).
void bind_client_settings(py::module_& m) {
  m.def(
      "read_client_options",
      [](const std::map<std::string, std::string>& env) {
        ClientOptions o = rs::client::read_client_options([&env](const char* var) -> std::optional<std::string> {
          auto it = env.find(var);
          if (it == env.end()) return std::nullopt;
          return it->second;
        });
        return options_dict(o);
      },
      py::arg("env"),
      "The worker-client options the NCCL plugin reads from RS_* variables (client/client_settings.h), "
      "from the mapping `env` instead of the process environment.");
}

GilFreeHolder<Client> make_client(const std::vector<std::string>& reducers, uint32_t rank, uint32_t world,
                                  const std::string& group, const std::string& job, double timeout,
                                  double connect_timeout, const std::string& token, int streams, uint32_t chunk,
                                  int socket_buffer, int window, int max_rounds_in_flight, bool failover,
                                  bool integrity) {
  ClientOptions o;
  o.failover = failover;
  o.integrity = integrity;
  if (socket_buffer >= 0) o.socket_buffer = socket_buffer;  // -1: the core's default
  o.window = window;
  o.max_rounds_in_flight = max_rounds_in_flight;
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
  return GilFreeHolder<Client>(std::make_unique<Client>(o));
}

py::dict stats_dict(const Client& c) {
  rs::client::ClientStats st;
  {
    py::gil_scoped_release release;  // (another thread may hold the client's lock while it logs)
    st = c.stats();
  }
  py::dict d;
  d["bytes_sent"] = st.bytes_sent;
  d["bytes_received"] = st.bytes_received;
  d["rounds"] = st.rounds;
  d["reconnects"] = st.reconnects;
  d["reducer_failovers"] = st.reducer_failovers;
  d["reducers_active"] = st.reducers_active;
  d["repaired_bytes"] = st.repaired_bytes;
  d["reducer_rejoins"] = st.reducer_rejoins;
  d["rejoin_probes"] = st.rejoin_probes;
  d["early_releases"] = st.early_releases;
  d["link_window_max"] = st.link_window_max;
  return d;
}

}  // namespace

void bind_client(py::module_& m) {
  bind_client_settings(m);
  const ClientOptions defaults;
  py::class_<Client, GilFreeHolder<Client>>(m, "Client")
      .def(py::init(&make_client), py::arg("reducers"), py::arg("rank"), py::arg("world_size"), py::arg("group"),
           py::arg("job_id"), py::arg("timeout"), py::arg("connect_timeout"), py::arg("auth_token"), py::arg("streams"),
           py::arg("chunk_bytes") = defaults.chunk_bytes, py::arg("socket_buffer") = defaults.socket_buffer,
           py::arg("window") = defaults.window, py::arg("max_rounds_in_flight") = defaults.max_rounds_in_flight,
           py::arg("failover") = defaults.failover, py::arg("integrity") = defaults.integrity)
      .def(
          "allreduce",
          [](Client& c, py::buffer buf, const std::string& dtype, const std::string& op, uint64_t tag,
             const std::string& comp) { run(c, buffer_round(std::move(buf), dtype, op, tag, comp)); },
          py::arg("buffer"), py::arg("dtype"), py::arg("op"), py::arg("tag") = 0, py::arg("compression") = "")
      .def(
          "allreduce_ptr",
          [](Client& c, uintptr_t ptr, size_t nbytes, const std::string& dtype, const std::string& op, uint64_t tag,
             const std::string& comp) { run(c, ptr_round(ptr, nbytes, dtype, op, tag, comp)); },
          py::arg("ptr"), py::arg("nbytes"), py::arg("dtype"), py::arg("op"), py::arg("tag") = 0,
          py::arg("compression") = "")
      .def(
          "start",
          [](Client& c, py::buffer buf, const std::string& dtype, const std::string& op, uint64_t tag,
             const std::string& comp) { return start(c, buffer_round(std::move(buf), dtype, op, tag, comp)); },
          py::arg("buffer"), py::arg("dtype"), py::arg("op"), py::arg("tag") = 0, py::arg("compression") = "",
          "Start reducing a C-contiguous writable buffer in place; returns the round id. Keep the buffer "
          "alive and untouched until test(id) is True or wait(id) returned.")
      .def(
          "start_ptr",
          [](Client& c, uintptr_t ptr, size_t nbytes, const std::string& dtype, const std::string& op, uint64_t tag,
             const std::string& comp) { return start(c, ptr_round(ptr, nbytes, dtype, op, tag, comp)); },
          py::arg("ptr"), py::arg("nbytes"), py::arg("dtype"), py::arg("op"), py::arg("tag") = 0,
          py::arg("compression") = "")
      .def(
          "start_segments",
          [](Client& c, const std::vector<std::tuple<uintptr_t, size_t>>& segments, const std::string& dtype,
             const std::string& op, uint64_t tag,
             const std::string& comp) { return start(c, segments_round(segments, dtype, op, tag, comp)); },
          py::arg("segments"), py::arg("dtype"), py::arg("op"), py::arg("tag") = 0, py::arg("compression") = "",
          "Start a scatter-gather round over [(ptr, nbytes), ...] (one buffer made of the segments in order).")
      .def(
          "try_start_ptr",
          [](Client& c, uintptr_t ptr, size_t nbytes, const std::string& dtype, const std::string& op, uint64_t tag,
             const std::string& comp) { return try_start(c, ptr_round(ptr, nbytes, dtype, op, tag, comp)); },
          py::arg("ptr"), py::arg("nbytes"), py::arg("dtype"), py::arg("op"), py::arg("tag") = 0,
          py::arg("compression") = "",
          "As start_ptr, but returns None instead of waiting when max_rounds_in_flight rounds are unfinished.")
      .def(
          "try_start_segments",
          [](Client& c, const std::vector<std::tuple<uintptr_t, size_t>>& segments, const std::string& dtype,
             const std::string& op, uint64_t tag,
             const std::string& comp) { return try_start(c, segments_round(segments, dtype, op, tag, comp)); },
          py::arg("segments"), py::arg("dtype"), py::arg("op"), py::arg("tag") = 0, py::arg("compression") = "")
      .def("test", &Client::test, py::arg("id"), py::call_guard<py::gil_scoped_release>(),
           "Progress every round without blocking; True once round `id` is done (raises its error).")
      .def("wait", &Client::wait, py::arg("id"), py::call_guard<py::gil_scoped_release>(),
           "Block until round `id` is done (raises its error).")
      .def("progress_while_idle", &Client::progress_while_idle, py::arg("period_s"),
           py::call_guard<py::gil_scoped_release>(),
           "With failover: a C++ thread passes over the links every period_s seconds in which no call "
           "drives the client (a reducer's loss is read and the failover exchange joined); until close().")
      // The client's lock may be held by a thread that logs (through Python's logging, with the
      // GIL): every accessor that takes it releases the GIL first.
      .def_property_readonly("in_flight",
                             py::cpp_function(&Client::in_flight, py::call_guard<py::gil_scoped_release>()))
      .def("close", &Client::close, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("connected",
                             py::cpp_function(&Client::connected, py::call_guard<py::gil_scoped_release>()))
      .def(
          "options", [](const Client& c) { return options_dict(c.options()); },
          "The options this client runs with (ClientOptions), by setting name.")
      .def("stats", &stats_dict);
}

}  // namespace rs::py_bind
