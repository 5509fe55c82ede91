// Text a peer sent (a reducer's refusal message, an ERROR frame's text) as the worker quotes it in
// log lines and exception messages: a hostile or broken reducer must not be able to forge log
// lines, move a terminal's cursor or flood a log through them (docs/security.md).
#pragma once

#include <cstddef>
#include <string>

namespace rs::client {

// Quoted text keeps at most this many characters of the peer's (then an ellipsis).
constexpr size_t kPeerTextChars = 256;

// `raw` made safe to quote: printable ASCII (0x20-0x7e) stays as it is, except the backslash
// (written "\\"); "\n", "\r" and "\t" become those two-character escapes; every other byte
// (control characters, ESC of an escape sequence, NUL, DEL, bytes >= 0x80) becomes "\xHH". At
// most `max_chars` characters of the result come from `raw` (an escape is never cut); a longer
// text ends in "... (N bytes)" with N the length of `raw`. The result is printable ASCII only.
std::string peer_text(const std::string& raw, size_t max_chars = kPeerTextChars);

}  // namespace rs::client
