#include "models/tokenizer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <optional>
#include <unordered_map>

#include "models/bpe_encoder.hpp"
#include "models/spm_encoder.hpp"
#include "models/utf8.hpp"

namespace mesh::models {

struct tokenizer::impl {
  vocabulary vocab;
  std::unordered_map<std::string_view, int32_t> ids;  // views into vocab.tokens
  std::vector<std::string> pieces;                    // decoded bytes per id
  // Special and added tokens by first byte, longest first: the text is scanned once and at each
  // byte only the tokens starting with it are tried.
  std::array<std::vector<int32_t>, 256> specials_by_byte;
  std::optional<bpe_encoder> bpe;
  std::optional<spm_encoder> spm;

  bool is_special_text(int32_t id, bool parse_special) const {
    const token_type t = vocab.type_of(id);
    return t == token_type::user_defined || (parse_special && t == token_type::control);
  }
};

tokenizer::tokenizer(std::shared_ptr<const impl> p) : impl_(std::move(p)) {}

expected<tokenizer> tokenizer::create(vocabulary v) {
  if (auto r = v.validate(); !r) return forward_error(r);
  auto p = std::make_shared<impl>();
  p->vocab = std::move(v);
  const vocabulary& voc = p->vocab;
  p->ids.reserve(voc.tokens.size());
  p->pieces.resize(voc.tokens.size());
  for (int32_t id = 0; id < voc.size(); ++id) {
    const std::string& text = voc.tokens[static_cast<size_t>(id)];
    const token_type t = voc.type_of(id);
    if (t != token_type::unused) p->ids.emplace(text, id);
    std::string& piece = p->pieces[static_cast<size_t>(id)];
    if (t == token_type::control || t == token_type::user_defined || t == token_type::unknown) {
      // Added tokens hold raw text in both kinds.
      piece = text;
      if (t != token_type::unknown && !text.empty()) {
        p->specials_by_byte[static_cast<unsigned char>(text[0])].push_back(id);
      }
    } else if (voc.model == vocabulary::kind::byte_bpe) {
      utf8::unmap_bytes(text, piece);
    } else if (t == token_type::byte) {
      unsigned v = 0;
      if (text.size() == 6 && std::sscanf(text.c_str(), "<0x%02X>", &v) == 1) {
        piece.assign(1, static_cast<char>(v));
      } else {
        piece = text;
      }
    } else {
      // "▁" -> " "
      for (size_t i = 0; i < text.size();) {
        if (text.compare(i, 3, "\xE2\x96\x81") == 0) {
          piece.push_back(' ');
          i += 3;
        } else {
          piece.push_back(text[i++]);
        }
      }
    }
  }
  for (auto& list : p->specials_by_byte) {
    std::stable_sort(list.begin(), list.end(), [&](int32_t a, int32_t b) {
      return voc.tokens[static_cast<size_t>(a)].size() > voc.tokens[static_cast<size_t>(b)].size();
    });
  }
  if (voc.model == vocabulary::kind::byte_bpe) {
    auto e = bpe_encoder::create(voc, p->ids);
    if (!e) return forward_error(e);
    p->bpe.emplace(std::move(*e));
  } else {
    auto e = spm_encoder::create(voc, p->ids);
    if (!e) return forward_error(e);
    p->spm.emplace(std::move(*e));
  }
  return tokenizer(std::move(p));
}

expected<std::vector<int32_t>> tokenizer::encode(std::string_view text, const encode_options& options) const {
  if (text.size() > max_text_bytes) {
    return make_error(error_code::limit_exceeded,
                      fmt::format("tokenizer: a text of {} bytes is longer than the limit of {} bytes", text.size(),
                                  max_text_bytes));
  }
  const impl& p = *impl_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (options.add_special && p.vocab.add_bos) out.push_back(*p.vocab.bos_id);
  bool after_special = options.space_prefix;  // SentencePiece: "▁" before the first text and after each special
  auto encode_text = [&](std::string_view part) -> expected<void> {
    if (part.empty()) return {};
    if (p.bpe) {
      if (auto r = p.bpe->encode(part, out); !r) return r;
    } else {
      p.spm->encode(part, p.vocab.add_space_prefix && after_special, out);
    }
    after_special = false;
    return {};
  };
  size_t text_start = 0;
  for (size_t i = 0; i < text.size();) {
    int32_t found = -1;
    for (int32_t id : p.specials_by_byte[static_cast<unsigned char>(text[i])]) {
      const std::string& t = p.vocab.tokens[static_cast<size_t>(id)];
      if (p.is_special_text(id, options.parse_special) && text.compare(i, t.size(), t) == 0) {
        found = id;
        break;
      }
    }
    if (found < 0) {
      ++i;
      continue;
    }
    if (auto r = encode_text(text.substr(text_start, i - text_start)); !r) return forward_error(r);
    out.push_back(found);
    after_special = true;
    i += p.vocab.tokens[static_cast<size_t>(found)].size();
    text_start = i;
  }
  if (auto r = encode_text(text.substr(text_start)); !r) return forward_error(r);
  if (options.add_special && p.vocab.add_eos) out.push_back(*p.vocab.eos_id);
  return out;
}

expected<std::string> tokenizer::decode(std::span<const int32_t> ids, const decode_options& options) const {
  const impl& p = *impl_;
  std::string out;
  bool first_text = true;
  for (size_t k = 0; k < ids.size(); ++k) {
    const int32_t id = ids[k];
    if (id < 0 || id >= p.vocab.size()) {
      return make_error(error_code::invalid_argument,
                        fmt::format("tokenizer: token id {} is out of range (the vocabulary has {} tokens)", id,
                                    p.vocab.size()));
    }
    if (is_control(id)) {
      if (!options.skip_special) out += p.pieces[static_cast<size_t>(id)];
      // A BOS keeps the next piece "first": its dummy-prefix space goes too.
      if (!(p.vocab.bos_id && id == *p.vocab.bos_id)) first_text = false;
      continue;
    }
    const std::string& piece = p.pieces[static_cast<size_t>(id)];
    if (first_text && strips_leading_space() && !piece.empty() && piece[0] == ' ' &&
        p.vocab.type_of(id) != token_type::user_defined) {
      out.append(piece, 1);
    } else {
      out += piece;
    }
    first_text = false;
  }
  return out;
}

const std::string& tokenizer::piece(int32_t id) const { return impl_->pieces[static_cast<size_t>(id)]; }

bool tokenizer::is_control(int32_t id) const {
  const token_type t = impl_->vocab.type_of(id);
  return t == token_type::control || t == token_type::unknown || t == token_type::unused;
}

bool tokenizer::strips_leading_space() const {
  return impl_->vocab.model == vocabulary::kind::sentencepiece && impl_->vocab.add_space_prefix;
}

const vocabulary& tokenizer::vocab() const { return impl_->vocab; }

std::optional<int32_t> tokenizer::find(std::string_view token_text) const {
  auto it = impl_->ids.find(token_text);
  if (it == impl_->ids.end()) return std::nullopt;
  return it->second;
}

}  // namespace mesh::models
