#pragma once
/// UTF-8 pieces the tokenizers share: character lengths, validity, and GPT-2's byte <-> character
/// table of byte-level BPE.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace mesh::models::utf8 {

/// Length of the UTF-8 character starting at s[i]: 1 to 4 when valid, else 1 (a stray byte is a
/// character of its own, so that every byte string splits into characters).
size_t char_length(std::string_view s, size_t i);

/// Whether s is valid UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF).
bool valid(std::string_view s);

/// Appends the UTF-8 encoding of code point cp (assumed valid).
void append(std::string& out, uint32_t cp);

/// How many leading bytes of s form complete, valid characters, with invalid sequences counted as
/// complete (they will never become valid); what is left is the start of a character whose
/// remaining bytes may still come. Used by the streaming decoder.
size_t complete_prefix(std::string_view s);

/// s with every invalid sequence replaced by U+FFFD, as Python's errors="replace" does.
std::string sanitize(std::string_view s);

/// GPT-2's table: byte b <-> the printable character that stands for it in byte-level BPE tokens
/// (printable Latin-1 bytes stand for themselves; the rest map to U+0100 and up, in byte order).
struct byte_table {
  /// UTF-8 text of the character for each byte.
  std::array<std::string, 256> to_text;
  /// Inverse: for code points below 0x144, the byte it stands for, or -1.
  std::array<int16_t, 0x144> to_byte;
};
const byte_table& gpt2_bytes();

/// Byte-level token text (mapped characters) back to raw bytes; false if a character is not in
/// the table (then `out` holds the raw text of that character).
bool unmap_bytes(std::string_view token_text, std::string& out);

}  // namespace mesh::models::utf8
