// Logging through NCCL's logger, and the exception barrier every C entry point goes through.
#pragma once

#include <string>

#include "common/error.h"
#include "nccl_plugin/nccl_abi.h"

namespace rs::nccl {

// Installs NCCL's logger (nullptr: stderr) and routes the core's rs::log lines to it.
void set_logger(ncclDebugLogger_t logger);
void log_warn(const std::string& msg);
void log_info(const std::string& msg);

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
