// Errors, logging and protocol helpers of reducer._core.
#include <Python.h>

#include <algorithm>
#include <optional>
#include <string>
#include <variant>

#include "bindings/common.h"
#include "common/compression.h"
#include "common/error.h"
#include "common/log.h"
#include "common/settings.h"
#include "emulate/delay_relay.h"
#include "net/address.h"
#include "net/frame_auth.h"
#include "net/socket.h"
#include "protocol/auth.h"
#include "protocol/hmac.h"
#include "protocol/plan.h"
#include "protocol/wire.h"

namespace rs::py_bind {

BufView view_of(const py::buffer& b, bool writable) {
  py::buffer_info info = b.request(writable);
  // C-contiguity check: strides must describe a dense row-major layout.
  py::ssize_t expect = info.itemsize;
  for (py::ssize_t i = info.ndim - 1; i >= 0; --i) {
    if (info.shape[i] > 1 && info.strides[i] != expect) throw py::value_error("buffer must be C-contiguous");
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

namespace {

// ---- logging: C++ log lines go to Python's logging module ("reducer.core") ----
py::object* g_log_fn = nullptr;  // a Python callable (level, message), owned by the module

bool py_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

void py_log_sink(rs::LogLevel level, const std::string& msg) {
  // A C++ thread (a client's idle progress) must not take the GIL of a finalizing interpreter:
  // the interpreter would end the thread inside C++ code (std::terminate). The line is dropped.
  if (!Py_IsInitialized() || py_finalizing()) return;
  py::gil_scoped_acquire gil;
  if (!g_log_fn || g_log_fn->is_none()) return;
  try {
    // Untrusted text may reach a log line: decode leniently so the line is never lost.
    py::object text = py::reinterpret_steal<py::object>(
        PyUnicode_DecodeUTF8(msg.data(), static_cast<Py_ssize_t>(msg.size()), "backslashreplace"));
    if (!text) throw py::error_already_set();
    (*g_log_fn)(int(level), text);
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

py::object setting_value(const std::optional<rs::settings::Value>& v) {
  if (!v) return py::none();
  return std::visit([](const auto& x) -> py::object { return py::cast(x); }, *v);
}

const rs::settings::Spec& setting_arg(const std::string& name) {
  for (const auto& s : rs::settings::kTable)
    if (name == s.name) return s;
  throw py::key_error("no C++ setting named '" + name + "'");
}

// common/settings.h: the table as reducer._core.SETTINGS (one dict per row, in table order) and
// its parser as reducer._core.parse_setting; reducer/config.py builds its rows from them.
void bind_settings(py::module_& m) {
  py::list rows;
  for (const auto& s : rs::settings::kTable) {
    py::dict row;
    row["name"] = s.name;
    row["env"] = s.env;
    row["kind"] = rs::settings::kind_name(s.kind);
    row["default"] = setting_value(rs::settings::default_value(s));
    row["lo"] = s.lo;
    row["hi"] = s.hi;
    row["choices"] = s.choices ? py::cast(std::string(s.choices)) : py::none();
    row["worker"] = bool(s.scope & rs::settings::kWorker);
    row["process"] = bool(s.scope & rs::settings::kProcess);
    row["plugin"] = bool(s.scope & rs::settings::kPlugin);
    row["reducer"] = bool(s.scope & rs::settings::kReducer);
    row["doc"] = s.doc;
    rows.append(row);
  }
  m.attr("SETTINGS") = rows;
  m.def(
      "parse_setting",
      [](const std::string& name, const std::string& text, const std::string& what) {
        return setting_value(rs::settings::parse(setting_arg(name), text, what));
      },
      py::arg("name"), py::arg("text"), py::arg("what") = "",
      "The value of a setting's text by the C++ rule of its kind (None when blank); ConfigError names `what` "
      "(default: the variable).");
  m.def(
      "parse_kind",
      [](const std::string& kind, const std::string& text, const std::string& what, double lo, double hi) {
        rs::settings::Spec s{"", "", rs::settings::Kind::Text, false, 0, nullptr, lo, hi, nullptr, 0, "", 0};
        if (kind == "bool") s.kind = rs::settings::Kind::Bool;
        else if (kind == "int") s.kind = rs::settings::Kind::Int;
        else if (kind == "size") s.kind = rs::settings::Kind::Size;
        else if (kind == "seconds") s.kind = rs::settings::Kind::Seconds;
        else throw py::value_error("parse_kind: kind must be bool, int, size or seconds");
        try {
          return setting_value(rs::settings::parse(s, text, what));
        } catch (const rs::Error& e) {
          if (!what.empty()) throw;
          const std::string prefix = "='" + text + "' is not valid: ",
                            msg = e.what();  // only the why: the caller names it
          throw py::value_error(msg.compare(0, prefix.size(), prefix) == 0 ? msg.substr(prefix.size()) : msg);
        }
      },
      py::arg("kind"), py::arg("text"), py::arg("what") = "", py::arg("lo") = -rs::settings::kNoLimit,
      py::arg("hi") = rs::settings::kNoLimit,
      "The text of a Python-only setting by the C++ rule of its kind (bool, int, size or seconds); None when blank.");
  m.attr("MAX_SECONDS") = rs::kMaxSeconds;
  m.def("secret_file_warning", &rs::settings::secret_file_warning, py::arg("path"),
        "The warning for a secret file its group or others may access ('' when private).");
  m.def("check_seconds", &rs::settings::check_seconds, py::arg("seconds"), py::arg("what"), py::arg("zero") = false,
        "A seconds argument: itself when finite, > 0 (or 0 with zero) and at most MAX_SECONDS, else ConfigError "
        "naming `what`.");
}

// common/compression.h: every name, and the wire dtype of a name.
void bind_compression(py::module_& m) {
  py::dict names;
  for (const auto& n : rs::kCompressionNames) names[n.name] = rs::wire_compression_name(n.value);
  m.attr("COMPRESSIONS") = names;
  m.def(
      "compression_wire",
      [](const std::string& name) -> py::object {
        rs::WireCompression c;
        if (!rs::parse_wire_compression(name, &c))
          throw rs::Error(rs::ErrorKind::Config, "unknown compression '" + name + "'; use " + rs::kCompressionChoices);
        if (c == rs::WireCompression::None) return py::none();
        return py::str(rs::dtype_name(rs::wire_compression_dtype(c)));
      },
      py::arg("name"),
      "The wire dtype name ('bfloat16', 'float16') of a compression name (any case), None for none; "
      "ConfigError for an unknown name.");
}

// Exceptions: the classes come from reducer.errors so Python and C++ raise the same types.
void register_errors() {
  py::module_ errors = py::module_::import("reducer.errors");
  static py::object cls[8];
  const char* names[8] = {"ConfigError",   "ConnectError",  "AuthError",        "ProtocolError",
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
}

// Addresses and the data connections' socket options (csrc/net).
void bind_net(py::module_& m) {
  m.def("set_tcp_congestion", &rs::net::set_tcp_congestion, py::arg("name"),
        "TCP congestion control (TCP_CONGESTION) of every data connection this process opens or accepts "
        "from now on; '' or 'default' = the kernel's default, 'auto' = cubic where allowed, else the kernel's. "
        "Returns the setting in force. Raises ConfigError if the kernel refuses a named algorithm.");
  m.def(
      "parse_address",
      [](const std::string& text) {
        rs::net::HostPort hp = rs::net::parse_host_port(text);
        return py::make_tuple(hp.host, hp.port);
      },
      py::arg("text"),
      "(host, port) of 'host:port' / '[ipv6]:port' text (csrc/net/address.h); ConfigError if it is malformed.");
  m.def("tcp_congestion", &rs::net::tcp_congestion, "The process-wide setting ('' = the kernel's default).");
  m.def(
      "tune_socket", [](int fd, int buffer_bytes) { rs::net::tune_socket(fd, buffer_bytes); }, py::arg("fd"),
      py::arg("buffer_bytes") = 0, "Apply the data-connection socket options to a TCP socket (tests).");
  m.def("socket_congestion", &rs::net::socket_congestion, py::arg("fd"),
        "The congestion control a TCP socket uses ('' if unreadable).");
}

}  // namespace

// Long paths (issue 31 point 2): the window rule and the bench's latency emulation.
static void bind_paths(py::module_& m) {
  m.def("path_window", &rs::proto::path_window, py::arg("window"), py::arg("chunk"), py::arg("rtt_us"),
        py::arg("rate_Bps"),
        "Chunks a worker keeps in flight on a link whose path has round trip `rtt_us` (TCP_INFO tcpi_min_rtt) and "
        "results rate `rate_Bps` (protocol/plan.h path_window): max(window, ceil(4 x rate x rtt / chunk)), bounded.");
  m.def(
      "delay_relay",
      [](const std::vector<std::string>& ifaces, uint64_t delay_us, uint64_t jitter_us, double loss, uint64_t seed,
         double run_for_s) {
        rs::emulate::RelayOptions o{ifaces, delay_us, jitter_us, loss, seed, run_for_s};
        py::gil_scoped_release nogil;
        rs::emulate::run_delay_relay(o);
      },
      py::arg("ifaces"), py::arg("delay_us"), py::arg("jitter_us") = 0, py::arg("loss") = 0.0, py::arg("seed") = 1,
      py::arg("run_for_s") = 0.0,
      "Forwards frames among `ifaces` (a learning bridge) with delay +- jitter and loss (emulate/delay_relay.h): "
      "the bench's latency emulation. Runs until killed, or for run_for_s seconds.");
}

void bind_common(py::module_& m) {
  register_errors();
  m.def("set_log_callback", &set_log_callback, py::arg("fn"),
        "Route C++ log lines to fn(level: int, message: str); None restores stderr.");
  m.def(
      "hmac_sha256",
      [](const std::string& key, const std::string& msg) {
        rs::proto::Digest d = rs::proto::hmac_sha256(key, msg);
        return py::bytes(reinterpret_cast<const char*>(d.data()), d.size());
      },
      py::arg("key"), py::arg("message"));
  m.def(
      "job_key",
      [](const std::string& secret, const std::string& job) {
        std::string why = rs::proto::check_name("job id", job);
        if (!why.empty()) throw py::value_error(why);
        rs::proto::Key k = rs::proto::job_key(secret, job);
        return py::bytes(reinterpret_cast<const char*>(k.data()), k.size());
      },
      py::arg("secret"), py::arg("job"), "The job's key derived from the shared secret (protocol/auth.h).");
  m.def(
      "job_token",
      [](const std::string& secret, const std::string& job) {
        std::string why = rs::proto::check_name("job id", job);
        if (!why.empty()) throw py::value_error(why);
        if (rs::proto::is_job_credential(secret))  // its holder would get a credential no reducer accepts
          throw rs::Error(rs::ErrorKind::Config,
                          "this is a job credential (rsjob1:<job>:<key>), not the reducers' shared secret: "
                          "job-token derives a job's credential from the secret itself");
        return rs::proto::format_job_token(job, rs::proto::job_key(secret, job));
      },
      py::arg("secret"), py::arg("job"),
      "A worker credential valid for this job only: rsjob1:<job>:<hex key>; ConfigError when `secret` is a job "
      "credential itself.");
  m.def(
      "check_name",
      [](const std::string& what, const std::string& name) { return rs::proto::check_name(what.c_str(), name); },
      py::arg("what"), py::arg("name"), "Why a job id / group name is refused, or ''.");
  bind_net(m);
  m.def(
      "frame_tags",
      [](const std::string& key, int direction, uint64_t frame, const std::string& header, const py::buffer& payload,
         uint64_t repeat) {
        if (key.size() != 32 || header.size() != rs::proto::kFrameHeaderBytes || (direction != 0 && direction != 1) ||
            repeat < 1)
          throw py::value_error("frame_tags needs a 32-byte key, direction 0 or 1, a 48-byte header and repeat >= 1");
        BufView v = view_of(payload, false);
        rs::proto::Key k;
        std::copy(key.begin(), key.end(), k.begin());
        rs::net::FrameAuth auth(k, rs::proto::Direction(direction));
        const auto* hdr = reinterpret_cast<const uint8_t*>(header.data());
        rs::net::FrameAuth::Tag htag, trailer;
        {
          py::gil_scoped_release release;
          for (uint64_t i = 0; i < frame; ++i) {  // frames 0 .. frame-1 (empty) set the counter
            auth.begin(hdr, header.size());
            auth.finish();
          }
          for (uint64_t r = 0; r < repeat; ++r) {
            htag = auth.header_tag(hdr, header.size());
            auth.begin(hdr, header.size());
            auth.update(v.ptr, v.nbytes);
            trailer = auth.finish();
          }
        }
        return py::make_tuple(py::bytes(reinterpret_cast<const char*>(htag.data()), htag.size()),
                              py::bytes(reinterpret_cast<const char*>(trailer.data()), trailer.size()));
      },
      py::arg("key"), py::arg("direction"), py::arg("frame"), py::arg("header"), py::arg("payload"),
      py::arg("repeat") = 1,
      "Header tag and trailer of frame number `frame + repeat - 1` (net/frame_auth.h), computed `repeat` times "
      "(for benchmarks; the GIL is released).");
  m.def("chunk_for", &rs::proto::chunk_for, py::arg("shard_bytes"), py::arg("max_chunk"),
        "The pipeline chunk of a shard (protocol/plan.h): the size every worker derives for a round.");
  m.def(
      "pipeline_for",
      [](uint64_t shard_bytes, uint64_t max_chunk, uint64_t workers, uint64_t reducers, uint64_t window) {
        const rs::proto::Pipeline p = rs::proto::pipeline_for(shard_bytes, max_chunk, workers, reducers, window);
        return py::make_tuple(p.chunk, p.window);
      },
      py::arg("shard_bytes"), py::arg("max_chunk"), py::arg("workers"), py::arg("reducers"), py::arg("window"),
      "(chunk, window) of a worker's link to a reducer for a round (protocol/plan.h pipeline_for): the chunk every "
      "worker derives from the shard and the group size, and the chunks it keeps in flight on the link.");
  bind_paths(m);
  m.def("reducers_for", &rs::proto::reducers_for, py::arg("nbytes"), py::arg("reducers"), py::arg("workers"),
        "How many reducers a round of `nbytes` uses (protocol/plan.h): the count every worker derives.");
  m.attr("NAME_RULE") = rs::proto::kNameRule;
  m.attr("PROTOCOL_VERSION") = rs::proto::kVersion;
  bind_settings(m);
  bind_compression(m);
}

}  // namespace rs::py_bind
