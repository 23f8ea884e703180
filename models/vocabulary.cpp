#include "models/vocabulary.hpp"

#include <fmt/format.h>

#include <string_view>
#include <unordered_map>

namespace mesh::models {

token_type vocabulary::type_of(int32_t id) const {
  if (token_types.empty()) return token_type::normal;
  return static_cast<token_type>(token_types[static_cast<size_t>(id)]);
}

bool is_byte_piece(const std::string& text) {
  auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F'); };
  return text.size() == 6 && text.compare(0, 3, "<0x") == 0 && hex(text[3]) && hex(text[4]) && text[5] == '>';
}

std::string printable_token(const std::string& text) {
  std::string out;
  out.reserve(text.size() + 2);
  out.push_back('"');
  size_t n = 0;
  for (unsigned char c : text) {
    if (++n > 64) {
      out += "...";
      break;
    }
    if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  out.push_back('"');
  return out;
}

namespace {

expected<void> check_id(const std::optional<int32_t>& id, int32_t n, const char* what) {
  if (id && (*id < 0 || *id >= n)) {
    return make_error(error_code::invalid_argument,
                      fmt::format("vocabulary: the {} token id {} is out of range (the vocabulary has {} tokens)", what,
                                  *id, n));
  }
  return {};
}

}  // namespace

expected<void> vocabulary::validate() const {
  using L = vocabulary_limits;
  if (tokens.empty()) return make_error(error_code::invalid_argument, "vocabulary: it has no tokens");
  if (tokens.size() > L::max_tokens) {
    return make_error(error_code::limit_exceeded, fmt::format("vocabulary: {} tokens is more than the limit of {}",
                                                              tokens.size(), L::max_tokens));
  }
  if (merges.size() > L::max_merges) {
    return make_error(error_code::limit_exceeded, fmt::format("vocabulary: {} merges is more than the limit of {}",
                                                              merges.size(), L::max_merges));
  }
  if (!scores.empty() && scores.size() != tokens.size()) {
    return make_error(error_code::invalid_argument,
                      fmt::format("vocabulary: {} scores for {} tokens (give one per token, or none)", scores.size(),
                                  tokens.size()));
  }
  if (!token_types.empty() && token_types.size() != tokens.size()) {
    return make_error(error_code::invalid_argument,
                      fmt::format("vocabulary: {} token types for {} tokens (give one per token, or none)",
                                  token_types.size(), tokens.size()));
  }
  if (pre_tokenizer_patterns.size() > L::max_pre_tokenizer_patterns) {
    return make_error(error_code::limit_exceeded, fmt::format("vocabulary: {} pre-tokenizer patterns is more than {}",
                                                              pre_tokenizer_patterns.size(),
                                                              L::max_pre_tokenizer_patterns));
  }
  for (const auto& p : pre_tokenizer_patterns) {
    if (p.size() > L::max_pattern_bytes) {
      return make_error(error_code::limit_exceeded,
                        fmt::format("vocabulary: a pre-tokenizer pattern of {} bytes is longer than {}", p.size(),
                                    L::max_pattern_bytes));
    }
  }
  std::unordered_map<std::string_view, int32_t> ids;
  ids.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto& t = tokens[i];
    if (t.size() > L::max_token_bytes) {
      return make_error(error_code::limit_exceeded,
                        fmt::format("vocabulary: token {} is {} bytes long, more than the limit of {}", i, t.size(),
                                    L::max_token_bytes));
    }
    if (!token_types.empty() && (token_types[i] < 0 || token_types[i] > 6)) {
      return make_error(error_code::invalid_argument, fmt::format("vocabulary: token {} {} has unknown type {}", i,
                                                                  printable_token(t), token_types[i]));
    }
    // Unused placeholder slots may repeat (some GGUF files pad with identical "[PAD]" tokens);
    // every other text must name one id, or text -> id would be ambiguous.
    if (!token_types.empty() && token_types[i] == static_cast<int32_t>(token_type::unused)) continue;
    if (t.empty()) {
      return make_error(error_code::invalid_argument, fmt::format("vocabulary: token {} is empty", i));
    }
    auto [it, fresh] = ids.emplace(t, static_cast<int32_t>(i));
    if (!fresh) {
      return make_error(error_code::invalid_argument, fmt::format("vocabulary: token {} appears twice (ids {} and {})",
                                                                  printable_token(t), it->second, i));
    }
  }
  const int32_t n = size();
  if (auto r = check_id(bos_id, n, "BOS"); !r) return r;
  if (auto r = check_id(eos_id, n, "EOS"); !r) return r;
  if (auto r = check_id(unk_id, n, "unknown"); !r) return r;
  if (auto r = check_id(pad_id, n, "padding"); !r) return r;
  if (add_bos && !bos_id) {
    return make_error(error_code::invalid_argument, "vocabulary: add_bos is set but there is no BOS token");
  }
  if (add_eos && !eos_id) {
    return make_error(error_code::invalid_argument, "vocabulary: add_eos is set but there is no EOS token");
  }
  std::string joined;
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto& [a, b] = merges[i];
    for (const std::string* side : {&a, &b}) {
      if (!ids.count(*side)) {
        return make_error(error_code::invalid_argument, fmt::format("vocabulary: merge {} ({} {}) names {}, which is not a token",
                                                                    i, printable_token(a), printable_token(b),
                                                                    printable_token(*side)));
      }
    }
    joined.assign(a).append(b);
    if (!ids.count(joined)) {
      return make_error(error_code::invalid_argument,
                        fmt::format("vocabulary: merge {} ({} {}) makes {}, which is not a token", i, printable_token(a),
                                    printable_token(b), printable_token(joined)));
    }
  }
  return {};
}

}  // namespace mesh::models
