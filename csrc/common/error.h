// Typed errors of the C++ core. The bindings map each kind to a Python class in
// reducer/errors.py; messages always name the peer and the cause.
#pragma once

#include <stdexcept>
#include <string>

namespace rs {

enum class ErrorKind { Config, Connect, Auth, Protocol, PeerLost, Mismatch, Timeout, Internal };

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// errno as text, e.g. "Connection refused".
std::string errno_text(int err);

}  // namespace rs
