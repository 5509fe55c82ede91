// Logging through NCCL's logger, and the exception barrier every C entry point goes through.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

#include "common/error.h"
#include "nccl_plugin/nccl_abi.h"

namespace rs::nccl {

// Installs NCCL's logger (nullptr: stderr) and routes the core's rs::log lines to it.
void set_logger(ncclDebugLogger_t logger);
void log_warn(const std::string& msg);
void log_info(const std::string& msg);

// Warnings that a peer can cause at will (a flood of bad connections, a call NCCL repeats) go
// through one of these: at most `burst` lines per `window`; the first line of a later window says
// how many were left out. Thread-safe; never throws.
class LogLimiter {
 public:
  LogLimiter(int burst, std::chrono::steady_clock::duration window) : burst_(burst), window_(window) {}
  void warn(const std::string& msg) noexcept;

 private:
  std::mutex mu_;
  const int burst_;
  const std::chrono::steady_clock::duration window_;
  std::chrono::steady_clock::time_point start_{};
  int lines_ = 0;
  uint64_t suppressed_ = 0;
};

// The NCCL result for a failure of this kind (peer lost / mismatch / timeout: a remote error).
ncclResult_t result_for(ErrorKind kind);

// Runs f() (returning ncclResult_t); no exception escapes: an rs::Error becomes its result
// and a warning naming `what`; anything else becomes ncclInternalError (bad_alloc: ncclSystemError).
template <class F>
ncclResult_t guarded(const char* what, F&& f) noexcept {
  try {
    return f();
  } catch (const Error& e) {
    try {
      log_warn(std::string(what) + ": " + e.what());
    } catch (...) {
    }
    return result_for(e.kind());
  } catch (const std::bad_alloc&) {
    try {
      log_warn(std::string(what) + ": out of memory");
    } catch (...) {
    }
    return ncclSystemError;
  } catch (const std::exception& e) {
    try {
      log_warn(std::string(what) + ": internal error: " + e.what());
    } catch (...) {
    }
    return ncclInternalError;
  } catch (...) {
    try {
      log_warn(std::string(what) + ": unknown internal error");
    } catch (...) {
    }
    return ncclInternalError;
  }
}

// guarded() for bodies that return nothing: success unless they throw.
template <class F>
ncclResult_t run_guarded(const char* what, F&& f) noexcept {
  return guarded(what, [&] {
    f();
    return ncclSuccess;
  });
}

}  // namespace rs::nccl
