// Small text helpers every part uses: trimming and case for settings and names, and hexadecimal
// (credentials, group names, quoted bytes of peer text): one home for each.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace rs {

std::string trim(const std::string& s);  // without leading and trailing spaces, tabs, CR and LF
std::string to_lower(std::string s);     // ASCII

// Lower-case hexadecimal: `n` bytes at `p` (two digits each, in order); one byte (two digits);
// a 64-bit value as 16 digits, most significant first.
std::string hex_bytes(const void* p, size_t n);
std::string hex_byte(uint8_t b);
std::string hex_u64(uint64_t v);
// The value of one hexadecimal digit (either case), -1 if `c` is not one.
int hex_value(char c);

}  // namespace rs
