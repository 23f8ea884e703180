#include "models/bpe_encoder.hpp"

#include <queue>

#include "models/utf8.hpp"

namespace mesh::models {

namespace {

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

bpe_encoder::bpe_encoder(const vocabulary& v, const std::unordered_map<std::string_view, int32_t>& ids,
                         pre_tokenizer pre)
    : vocab_(&v), ids_(&ids), pre_(std::move(pre)) {}

bpe_encoder::bpe_encoder(bpe_encoder&& o) noexcept
    : vocab_(o.vocab_),
      ids_(o.ids_),
      pre_(std::move(o.pre_)),
      byte_ids_(o.byte_ids_),
      merges_(std::move(o.merges_)),
      cache_(std::move(o.cache_)) {}

expected<bpe_encoder> bpe_encoder::create(const vocabulary& v,
                                          const std::unordered_map<std::string_view, int32_t>& ids) {
  std::vector<std::string> patterns = v.pre_tokenizer_patterns;
  if (patterns.empty()) {
    auto p = pre_tokenizer_patterns(v.pre_tokenizer.empty() ? std::string_view("gpt2") : v.pre_tokenizer);
    if (!p) return forward_error(p);
    patterns = std::move(*p);
  }
  auto pre = pre_tokenizer::create(patterns);
  if (!pre) return forward_error(pre);
  bpe_encoder e(v, ids, std::move(*pre));
  const auto& table = utf8::gpt2_bytes();
  for (int b = 0; b < 256; ++b) {
    auto it = ids.find(table.to_text[b]);
    e.byte_ids_[b] = it == ids.end() ? -1 : it->second;
  }
  e.merges_.reserve(v.merges.size());
  std::string joined;
  for (size_t r = 0; r < v.merges.size(); ++r) {
    const auto& [a, b] = v.merges[r];
    joined.assign(a).append(b);
    // validate() guarantees all three are tokens.
    const uint64_t key = pair_key(ids.at(a), ids.at(b));
    // The first (lowest-rank) rule for a pair wins, as in HF, where later duplicates are ignored.
    e.merges_.emplace(key, merge_info{static_cast<int32_t>(r), ids.at(joined)});
  }
  return e;
}

void bpe_encoder::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  {
    std::lock_guard lock(cache_mutex_);
    if (auto it = cache_.find(std::string(word)); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const auto& table = utf8::gpt2_bytes();
  std::string mapped;
  mapped.reserve(word.size() * 2);
  for (unsigned char c : word) mapped += table.to_text[c];

  std::vector<int32_t> result;
  if (vocab_->ignore_merges) {
    if (auto it = ids_->find(mapped); it != ids_->end()) result.push_back(it->second);
  }
  if (result.empty()) {
    // Symbols are a doubly linked list over the word's bytes; a byte whose character is not a
    // token (a vocabulary without all 256) stays a symbol of id -1 that never merges.
    struct symbol {
      int32_t id;
      int32_t prev, next;
      std::string_view bytes;  // of the original word, for the unknown-symbol case
    };
    std::vector<symbol> sym;
    sym.reserve(word.size());
    for (size_t i = 0; i < word.size(); ++i) {
      sym.push_back({byte_ids_[static_cast<unsigned char>(word[i])], static_cast<int32_t>(i) - 1,
                     i + 1 < word.size() ? static_cast<int32_t>(i) + 1 : -1, word.substr(i, 1)});
    }
    struct candidate {
      int32_t rank;
      int32_t left;
      int32_t left_id, right_id;
      bool operator>(const candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    std::priority_queue<candidate, std::vector<candidate>, std::greater<>> queue;
    auto consider = [&](int32_t l) {
      if (l < 0) return;
      const int32_t r = sym[l].next;
      if (r < 0 || sym[l].id < 0 || sym[r].id < 0) return;
      auto it = merges_.find(pair_key(sym[l].id, sym[r].id));
      if (it != merges_.end()) queue.push({it->second.rank, l, sym[l].id, sym[r].id});
    };
    for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) consider(i);
    while (!queue.empty()) {
      const candidate c = queue.top();
      queue.pop();
      symbol& l = sym[c.left];
      // Stale entries: the left symbol was merged away or changed, or its neighbour did.
      if (l.id != c.left_id || l.next < 0 || sym[l.next].id != c.right_id) continue;
      const int32_t r = l.next;
      l.id = merges_.at(pair_key(c.left_id, c.right_id)).result;
      l.next = sym[r].next;
      if (l.next >= 0) sym[l.next].prev = c.left;
      sym[r].id = -2;  // dead
      consider(l.prev);
      consider(c.left);
    }
    for (int32_t i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next) {
      if (sym[i].id >= 0) {
        result.push_back(sym[i].id);
      } else if (vocab_->unk_id) {
        result.push_back(*vocab_->unk_id);
      }
    }
  }
  out.insert(out.end(), result.begin(), result.end());
  std::lock_guard lock(cache_mutex_);
  if (cache_.size() >= cache_limit) cache_.clear();
  if (word.size() <= 256) cache_.emplace(std::string(word), std::move(result));
}

expected<void> bpe_encoder::encode(std::string_view text, std::vector<int32_t>& out) const {
  return pre_.split(text, [&](std::string_view word) {
    // A pathological word (a megabyte of spaces is one regex match) is merged in pieces so that
    // the working memory stays bounded; below max_word_bytes the result is exactly HF's.
    while (word.size() > max_word_bytes) {
      size_t cut = max_word_bytes;
      while (cut > 0 && (static_cast<unsigned char>(word[cut]) & 0xC0) == 0x80) --cut;
      if (cut == 0) cut = max_word_bytes;
      encode_word(word.substr(0, cut), out);
      word.remove_prefix(cut);
    }
    encode_word(word, out);
  });
}

}  // namespace mesh::models
