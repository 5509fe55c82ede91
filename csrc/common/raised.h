// Sets a flag for the life of a scope, and clears it however the scope ends (return, throw).
#pragma once

namespace rs {

struct Raised {
  bool& f;
  explicit Raised(bool& v) : f(v) { f = true; }
  ~Raised() { f = false; }
  Raised(const Raised&) = delete;
  Raised& operator=(const Raised&) = delete;
};

}  // namespace rs
