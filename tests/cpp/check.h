// The C++ unit tests' checks (tests/cpp/*.cc, built and run by tests/cpp_build.py): CHECK counts a
// failure and goes on; finish() reports and gives main's exit status.
#pragma once

#include <cstdio>

static int failures = 0;
#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                                   \
    }                                                                               \
  } while (0)

static inline int finish(const char* name) {
  if (failures) {
    std::fprintf(stderr, "%s: %d checks failed\n", name, failures);
    return 1;
  }
  std::printf("%s: all checks passed\n", name);
  return 0;
}
