// Minimal logging hook: the core never prints. The bindings install a sink that
// forwards to Python's `logging`; without one, lines go to stderr.
#pragma once

#include <cstdint>
#include <string>

namespace rs {

enum class LogLevel { Debug = 10, Info = 20, Warning = 30, Error = 40 };

using LogSink = void (*)(LogLevel, const std::string&);

void set_log_sink(LogSink sink);  // nullptr restores stderr
void log(LogLevel level, const std::string& msg);

inline void log_info(const std::string& m) { log(LogLevel::Info, m); }
inline void log_warn(const std::string& m) { log(LogLevel::Warning, m); }
inline void log_error(const std::string& m) { log(LogLevel::Error, m); }
inline void log_debug(const std::string& m) { log(LogLevel::Debug, m); }

// "1 thread", "2 threads": a count and its noun for log lines.
inline std::string count_of(uint64_t n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

}  // namespace rs
