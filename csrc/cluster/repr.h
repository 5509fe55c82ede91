// Values in error messages written as Python writes them (repr), so that a message about a
// malformed cluster description reads the same whichever entry point raised it: 'a:1',
// ['a', 1], {'type': 'worker'}, True, None. Long values are cut at a bound with "...".
#pragma once

#include <cstddef>
#include <string>

#include "common/json.h"

namespace rs::cluster {

inline constexpr size_t kReprMax = 200;  // characters of one value in a message

// Python's repr of a str; bytes that are not UTF-8 are written \xNN.
std::string py_repr(const std::string& text);
// Python's repr of what json.loads would return for `v` (numbers as written).
std::string py_repr(const json::Value& v);
// The name of the Python type json.loads would return for `v`: dict, list, str, int, float, bool, NoneType.
const char* py_type_name(const json::Value& v);

}  // namespace rs::cluster
