#include "models/utf8.hpp"

namespace mesh::models::utf8 {

namespace {

bool cont(unsigned char c) { return (c & 0xC0) == 0x80; }

/// Length of a valid sequence at s[i], 0 when invalid, -1 when truncated but valid so far.
int sequence(std::string_view s, size_t i) {
  const auto c0 = static_cast<unsigned char>(s[i]);
  if (c0 < 0x80) return 1;
  int n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // bounds of the second byte
  if (c0 >= 0xC2 && c0 <= 0xDF) {
    n = 2;
  } else if (c0 >= 0xE0 && c0 <= 0xEF) {
    n = 3;
    if (c0 == 0xE0) lo = 0xA0;  // overlong
    if (c0 == 0xED) hi = 0x9F;  // surrogates
  } else if (c0 >= 0xF0 && c0 <= 0xF4) {
    n = 4;
    if (c0 == 0xF0) lo = 0x90;  // overlong
    if (c0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  for (int k = 1; k < n; ++k) {
    if (i + k >= s.size()) return -1;
    const auto c = static_cast<unsigned char>(s[i + k]);
    if (k == 1 ? (c < lo || c > hi) : !cont(c)) return 0;
  }
  return n;
}

}  // namespace

size_t char_length(std::string_view s, size_t i) {
  const int n = sequence(s, i);
  return n > 0 ? static_cast<size_t>(n) : 1;
}

bool valid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const int n = sequence(s, i);
    if (n <= 0) return false;
    i += static_cast<size_t>(n);
  }
  return true;
}

void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t complete_prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const int n = sequence(s, i);
    if (n < 0) break;  // may still complete
    i += n == 0 ? 1 : static_cast<size_t>(n);
  }
  return i;
}

std::string sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const int n = sequence(s, i);
    if (n > 0) {
      out.append(s.substr(i, static_cast<size_t>(n)));
      i += static_cast<size_t>(n);
      continue;
    }
    out += "\xEF\xBF\xBD";
    // Python replaces the longest valid-so-far prefix of a broken sequence with one U+FFFD.
    size_t skip = 1;
    const auto c0 = static_cast<unsigned char>(s[i]);
    if (c0 >= 0xC2 && c0 <= 0xF4) {
      std::string_view rest = s.substr(i);
      for (size_t k = 1; k < rest.size() && k < 4; ++k) {
        // Extend while the prefix is still a valid start: check by truncation.
        if (sequence(rest.substr(0, k + 1), 0) == -1 || sequence(rest.substr(0, k + 1), 0) > 0) {
          skip = k + 1;
        } else {
          break;
        }
      }
      if (n == -1) skip = rest.size();
    }
    i += skip;
  }
  return out;
}

const byte_table& gpt2_bytes() {
  static const byte_table table = [] {
    byte_table t;
    t.to_byte.fill(-1);
    auto printable = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
    uint32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = printable(b) ? static_cast<uint32_t>(b) : next++;
      append(t.to_text[b], cp);
      t.to_byte[cp] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return table;
}

bool unmap_bytes(std::string_view token_text, std::string& out) {
  const auto& t = gpt2_bytes();
  bool ok = true;
  for (size_t i = 0; i < token_text.size();) {
    const size_t n = char_length(token_text, i);
    uint32_t cp = 0x110000;
    const auto c0 = static_cast<unsigned char>(token_text[i]);
    if (n == 1 && c0 < 0x80) {
      cp = c0;
    } else if (n == 2) {
      cp = ((c0 & 0x1Fu) << 6) | (static_cast<unsigned char>(token_text[i + 1]) & 0x3Fu);
    }
    if (cp < t.to_byte.size() && t.to_byte[cp] >= 0) {
      out.push_back(static_cast<char>(t.to_byte[cp]));
    } else {
      out.append(token_text.substr(i, n));
      ok = false;
    }
    i += n;
  }
  return ok;
}

}  // namespace mesh::models::utf8
