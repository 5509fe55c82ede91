// What the libFuzzer targets of csrc/fuzz share: the invariant check and a reader of the input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

// A broken invariant: stop at once with the input that broke it (libFuzzer keeps it).
#define FUZZ_CHECK(cond) \
  do {                   \
    if (!(cond)) {       \
      __builtin_trap();  \
    }                    \
  } while (0)

namespace rs::fuzz {

// Reads the fuzzer's input front to back; yields zeros once it is spent.
struct Input {
  const uint8_t* p;
  size_t n;
  uint8_t byte() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  uint64_t u64() {  // little-endian
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t(byte()) << (8 * i);
    return v;
  }
  std::string bytes(size_t len) {  // at most len (fewer when the input ends)
    len = len < n ? len : n;
    std::string s(reinterpret_cast<const char*>(p), len);
    p += len;
    n -= len;
    return s;
  }
};

}  // namespace rs::fuzz
