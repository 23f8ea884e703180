#include "models/spm_encoder.hpp"

#include <fmt/format.h>

#include <queue>

#include "models/utf8.hpp"

namespace mesh::models {

expected<spm_encoder> spm_encoder::create(const vocabulary& v,
                                          const std::unordered_map<std::string_view, int32_t>& ids) {
  spm_encoder e;
  e.vocab_ = &v;
  e.ids_ = &ids;
  for (int b = 0; b < 256; ++b) {
    auto it = ids.find(fmt::format("<0x{:02X}>", b));
    e.byte_ids_[b] = it == ids.end() ? -1 : it->second;
  }
  return e;
}

void spm_encoder::encode(std::string_view text, bool space_prefix, std::vector<int32_t>& out) const {
  // A long text is encoded in pieces cut before a space that follows a non-space: pieces never
  // end in "▁" (SentencePiece trains with split_by_whitespace), so merges do not cross such a cut
  // and the working memory stays bounded.
  while (text.size() > max_chunk_bytes) {
    size_t cut = 0;
    for (size_t i = max_chunk_bytes; i > max_chunk_bytes / 2; --i) {
      if (text[i] == ' ' && text[i - 1] != ' ') {
        cut = i;
        break;
      }
    }
    if (cut == 0) {
      cut = max_chunk_bytes;
      while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
      if (cut == 0) cut = max_chunk_bytes;
    }
    encode_chunk(text.substr(0, cut), space_prefix, out);
    text.remove_prefix(cut);
    space_prefix = false;
  }
  encode_chunk(text, space_prefix, out);
}

void spm_encoder::encode_chunk(std::string_view text, bool space_prefix, std::vector<int32_t>& out) const {
  static constexpr std::string_view space_mark = "\xE2\x96\x81";  // U+2581 "▁"
  std::string s;
  s.reserve(text.size() + 3 * (space_prefix ? 1 : 0) + text.size() / 2);
  if (space_prefix) s += space_mark;
  for (char c : text) {
    if (c == ' ') {
      s += space_mark;
    } else {
      s.push_back(c);
    }
  }
  if (s.empty()) return;

  // Symbols: one per UTF-8 character (a stray byte is its own), linked both ways.
  struct symbol {
    uint32_t begin, length;
    int32_t prev, next;
  };
  std::vector<symbol> sym;
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8::char_length(s, i);
    const auto k = static_cast<int32_t>(sym.size());
    sym.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(n), k - 1, i + n < s.size() ? k + 1 : -1});
    i += n;
  }
  struct bigram {
    float score;
    int32_t left, right;
    uint32_t length;  // of the merged text, to spot stale entries
    bool operator<(const bigram& o) const {
      // Highest score first; on a tie the leftmost pair, as llama.cpp and sentencepiece do.
      return score != o.score ? score < o.score : left > o.left;
    }
  };
  std::priority_queue<bigram> queue;
  auto view = [&](int32_t i) { return std::string_view(s).substr(sym[i].begin, sym[i].length); };
  auto consider = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const std::string_view merged = std::string_view(s).substr(sym[l].begin, sym[l].length + sym[r].length);
    auto it = ids_->find(merged);
    if (it == ids_->end()) return;
    // Only text pieces merge: control, byte and unused pieces are never built from characters.
    const token_type t = vocab_->type_of(it->second);
    if (t != token_type::normal && t != token_type::user_defined && t != token_type::undefined) return;
    const float score = vocab_->scores.empty() ? 0.0f : vocab_->scores[static_cast<size_t>(it->second)];
    queue.push({score, l, r, static_cast<uint32_t>(merged.size())});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(sym.size()); ++i) consider(i - 1, i);
  while (!queue.empty()) {
    const bigram b = queue.top();
    queue.pop();
    symbol& l = sym[b.left];
    symbol& r = sym[b.right];
    if (l.length == 0 || r.length == 0 || l.length + r.length != b.length || l.next != b.right) continue;
    l.length += r.length;
    r.length = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = b.left;
    consider(l.prev, b.left);
    consider(b.left, l.next);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) {
    const std::string_view piece = view(i);
    if (auto it = ids_->find(piece); it != ids_->end()) {
      out.push_back(it->second);
      continue;
    }
    // Merged symbols are always tokens; only single characters can be missing: spell their bytes.
    for (unsigned char c : piece) {
      if (byte_ids_[c] >= 0) {
        out.push_back(byte_ids_[c]);
      } else if (vocab_->unk_id) {
        out.push_back(*vocab_->unk_id);
      }
    }
  }
}

}  // namespace mesh::models
