#include "nccl_plugin/plugin_log.h"

#include <atomic>
#include <cstdio>

#include "common/log.h"

namespace rs::nccl {

namespace {

std::atomic<ncclDebugLogger_t> g_logger{nullptr};

void emit(ncclDebugLogLevel level, const std::string& msg) {
  ncclDebugLogger_t logger = g_logger.load();
  if (logger) {
    logger(level, NCCL_INIT | NCCL_NET, __FILE__, __LINE__, "%s", ("NET/reduction-server: " + msg).c_str());
    return;
  }
  std::fprintf(stderr, "NCCL %s NET/reduction-server: %s\n", level == NCCL_LOG_WARN ? "WARN" : "INFO", msg.c_str());
}

// The core (client, sockets) logs through rs::log; in this library its lines go to NCCL.
void core_sink(LogLevel level, const std::string& msg) {
  if (level == LogLevel::Debug) return;
  emit(level >= LogLevel::Warning ? NCCL_LOG_WARN : NCCL_LOG_INFO, msg);
}

}  // namespace

void set_logger(ncclDebugLogger_t logger) {
  g_logger.store(logger);
  set_log_sink(core_sink);
}

void log_warn(const std::string& msg) { emit(NCCL_LOG_WARN, msg); }
void log_info(const std::string& msg) { emit(NCCL_LOG_INFO, msg); }

void LogLimiter::warn(const std::string& msg) noexcept {
  try {
    std::string line;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto now = std::chrono::steady_clock::now();
      if (lines_ == 0 || now - start_ >= window_) {
        line =
            suppressed_ ? msg + " (" + std::to_string(suppressed_) + " similar line(s) left out before this one)" : msg;
        start_ = now;
        lines_ = 0;
        suppressed_ = 0;
      } else if (lines_ < burst_) {
        line = msg;
      } else {
        ++suppressed_;
        return;
      }
      ++lines_;
    }
    log_warn(line);
  } catch (...) {
  }
}

ncclResult_t result_for(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::PeerLost:
    case ErrorKind::Mismatch:
    case ErrorKind::Timeout:
    case ErrorKind::Connect:
    case ErrorKind::Auth:
    case ErrorKind::Protocol: return ncclRemoteError;
    case ErrorKind::Config: return ncclInvalidUsage;
    case ErrorKind::Internal: return ncclInternalError;
  }
  return ncclInternalError;
}

}  // namespace rs::nccl
