#include <atomic>
#include <cstdio>
#include <cstring>

#include "common/error.h"
#include "common/log.h"

namespace rs {

std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r returns a char* that may or may not be buf.
  const char* s = strerror_r(err, buf, sizeof buf);
  return std::string(s);
}

namespace {
std::atomic<LogSink> g_sink{nullptr};
}

void set_log_sink(LogSink sink) { g_sink.store(sink); }

void log(LogLevel level, const std::string& msg) {
  LogSink sink = g_sink.load();
  if (sink) {
    sink(level, msg);
    return;
  }
  const char* name = level >= LogLevel::Error     ? "ERROR"
                     : level >= LogLevel::Warning ? "WARNING"
                     : level >= LogLevel::Info    ? "INFO"
                                                  : "DEBUG";
  std::fprintf(stderr, "%s reducer: %s\n", name, msg.c_str());
}

}  // namespace rs
