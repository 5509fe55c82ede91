// The reducer node (csrc/server) in reducer._core.
#include "server/server.h"
#include "bindings/common.h"
#include "common/error.h"

namespace rs::py_bind {

namespace {

py::dict server_stats(const rs::server::Server& s) {
  const rs::server::ServerStats st = s.stats();
  py::dict d;
  d["bytes_received"] = st.bytes_received;
  d["bytes_sent"] = st.bytes_sent;
  d["rounds_completed"] = st.rounds_completed;
  d["chunks_reduced"] = st.chunks_reduced;
  d["connections"] = st.connections;
  d["connected_workers"] = st.connected_workers;
  d["groups"] = st.groups;
  d["handshakes"] = st.handshakes;
  d["waiting"] = st.waiting;
  d["errors"] = st.errors;
  d["rejected"] = st.rejected;
  d["refused_over_limit"] = st.refused_over_limit;
  d["memory_bytes"] = st.memory_bytes;
  d["chunks_in_flight"] = st.chunks_in_flight;
  d["draining"] = st.draining;
  py::dict lat;
  lat["bounds"] = rs::server::kLatencyBounds;
  lat["counts"] = st.round_latency_counts;
  lat["sum"] = st.round_latency_sum;
  d["round_latency_seconds"] = lat;
  return d;
}

// The limits of `o` (Server.limits(): those in force).
py::dict options_limits(const rs::server::ServerOptions& o) {
  py::dict d;
  d["group_slots"] = o.group_slots;
  d["handshake_timeout"] = o.handshake_timeout;
  d["group_timeout"] = o.group_timeout;
  d["max_group_bytes"] = o.max_group_bytes;
  d["max_memory_bytes"] = o.max_memory_bytes;
  d["max_memory_per_job"] = o.max_memory_per_job;
  d["max_memory_per_peer"] = o.max_memory_per_peer;
  d["memory_idle_timeout"] = o.memory_idle_timeout;
  d["max_connections"] = o.max_connections;
  d["max_connections_per_peer"] = o.max_connections_per_peer;
  d["max_groups_per_peer"] = o.max_groups_per_peer;
  d["integrity"] = rs::server::integrity_mode_name(o.integrity);
  return d;
}

py::dict server_limits(const rs::server::Server& s) { return options_limits(s.limits()); }

// A default-made ServerOptions (reducer._core.SERVER_DEFAULTS): its limits, and where and how it listens.
py::dict server_defaults() {
  const rs::server::ServerOptions o;
  py::dict d = options_limits(o);
  d["host"] = o.host;
  d["port"] = o.port;
  d["threads"] = o.threads;
  d["socket_buffer"] = o.socket_buffer;
  return d;
}

py::list server_group_stats(const rs::server::Server& s) {
  std::vector<rs::server::GroupStat> rows;
  {
    py::gil_scoped_release release;  // waits (briefly) for every event loop's fresh snapshot
    rows = s.group_stats();
  }
  py::list out;
  for (const rs::server::GroupStat& g : rows) {
    py::dict d;
    d["job"] = g.job;
    d["group"] = g.group;
    d["stream"] = g.stream;
    d["world_size"] = g.world_size;
    d["connected"] = g.connected;
    d["complete"] = g.complete;
    d["rounds"] = g.rounds;
    d["bytes_received"] = g.bytes_received;
    d["bytes_sent"] = g.bytes_sent;
    d["last_error"] = g.last_error;
    d["age_s"] = g.age_s;
    d["ended"] = g.ended;
    out.append(d);
  }
  return out;
}

}  // namespace

void bind_server(py::module_& m) {
  const rs::server::ServerOptions defaults;
  m.attr("SERVER_DEFAULTS") = server_defaults();
  py::class_<rs::server::Server, GilFreeHolder<rs::server::Server>>(m, "Server")
      .def(py::init([](const std::string& host, uint16_t port, int threads, const std::string& token, int group_slots,
                       double handshake_timeout, double group_timeout, int socket_buffer, uint64_t max_group_bytes,
                       uint64_t max_memory_bytes, uint32_t max_connections, uint32_t max_connections_per_peer,
                       uint32_t max_groups_per_peer, uint64_t max_memory_per_job, uint64_t max_memory_per_peer,
                       double memory_idle_timeout, const std::string& integrity) {
             rs::server::ServerOptions o;
             if (!rs::server::parse_integrity_mode(integrity, &o.integrity))
               throw rs::Error(rs::ErrorKind::Config,
                               "integrity must be 'off', 'on' or 'required', not '" + integrity + "'");
             o.host = host;
             o.port = port;
             o.threads = threads;
             o.auth_token = token;
             o.group_slots = group_slots;
             o.handshake_timeout = handshake_timeout;
             o.group_timeout = group_timeout;
             o.socket_buffer = socket_buffer;
             o.max_group_bytes = max_group_bytes;
             o.max_memory_bytes = max_memory_bytes;
             o.max_connections = max_connections;
             o.max_connections_per_peer = max_connections_per_peer;
             o.max_groups_per_peer = max_groups_per_peer;
             o.max_memory_per_job = max_memory_per_job;
             o.max_memory_per_peer = max_memory_per_peer;
             o.memory_idle_timeout = memory_idle_timeout;
             return GilFreeHolder<rs::server::Server>(std::make_unique<rs::server::Server>(o));
           }),
           py::arg("host") = defaults.host, py::arg("port") = defaults.port, py::arg("threads") = defaults.threads,
           py::arg("auth_token") = defaults.auth_token, py::arg("group_slots") = defaults.group_slots,
           py::arg("handshake_timeout") = defaults.handshake_timeout, py::arg("group_timeout") = defaults.group_timeout,
           py::arg("socket_buffer") = defaults.socket_buffer, py::arg("max_group_bytes") = defaults.max_group_bytes,
           py::arg("max_memory_bytes") = defaults.max_memory_bytes,
           py::arg("max_connections") = defaults.max_connections,
           py::arg("max_connections_per_peer") = defaults.max_connections_per_peer,
           py::arg("max_groups_per_peer") = defaults.max_groups_per_peer,
           py::arg("max_memory_per_job") = defaults.max_memory_per_job,
           py::arg("max_memory_per_peer") = defaults.max_memory_per_peer,
           py::arg("memory_idle_timeout") = defaults.memory_idle_timeout, py::arg("integrity") = "auto")
      .def("start", &rs::server::Server::start, py::call_guard<py::gil_scoped_release>())
      .def("stop", &rs::server::Server::stop, py::arg("drain_timeout") = 0.0, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("port", &rs::server::Server::port)
      .def_property_readonly("running", &rs::server::Server::running)
      .def("drain", &rs::server::Server::drain, "Take no new group; keep serving the groups already here.")
      .def("stats", &server_stats)
      .def("limits", &server_limits, "The limits in force (machine-dependent defaults resolved after start()).")
      .def("group_stats", &server_group_stats,
           "Live group streams and the last few that ended (refreshed every 250 ms).");
}

}  // namespace rs::py_bind
