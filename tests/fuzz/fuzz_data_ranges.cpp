// Any bytes as a training data file (text or JSONL, by the first byte), cut into byte ranges at
// offsets the next bytes choose, as training workers cut a file into shards
// (text_record_reader::open_range): when the whole file reads without error, every range does, and
// the ranges' records joined are the whole file's records, at the same offsets; when it fails,
// some range fails. A shard of it then hands out a draw (rows or an error), never a crash.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "models/text_shard.hpp"
#include "models/utf8.hpp"

namespace {

using namespace mesh;
using namespace mesh::models;

tokenizer make_bytes() {
  vocabulary v;
  v.model = vocabulary::kind::byte_bpe;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(utf8::gpt2_bytes().to_text[b]);
  v.tokens.push_back("<|endoftext|>");
  v.token_types.assign(v.tokens.size(), 1);
  v.token_types[256] = static_cast<int32_t>(token_type::control);
  v.eos_id = 256;
  return *tokenizer::create(v);
}

struct seen {
  std::string text;
  uint64_t offset;
};

/// The records of a reader, or false when it fails. Records longer than the reader's bound fail.
bool read_all(text_record_reader& r, std::vector<seen>& out) {
  for (;;) {
    auto x = r.next();
    if (!x) return false;
    if (!*x) return true;
    const auto& c = x->value().content;
    out.push_back({std::holds_alternative<std::string>(c) ? std::get<std::string>(c) : std::string("<chat>"), x->value().offset});
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tokenizer tok = make_bytes();
  if (size < 3) return 0;
  const data_format format = data[0] & 1 ? data_format::jsonl : data_format::text;
  const uint32_t cuts_wanted = 1 + data[1] % 6;
  const std::string_view cut_bytes(reinterpret_cast<const char*>(data + 2), std::min<size_t>(cuts_wanted, size - 2));
  const std::string file(reinterpret_cast<const char*>(data + 2 + cut_bytes.size()), size - 2 - cut_bytes.size());
  const byte_source source = [&file](uint64_t offset, std::span<char> into) -> expected<size_t> {
    if (offset >= file.size()) return size_t{0};
    const size_t n = std::min<size_t>(into.size(), file.size() - offset);
    std::copy_n(file.data() + offset, n, into.data());
    return n;
  };
  constexpr size_t max_record = 4096;
  auto whole = text_record_reader::open_range(source, "f", format, 0, UINT64_MAX, max_record);
  if (!whole) __builtin_trap();
  std::vector<seen> all;
  const bool whole_ok = read_all(*whole, all);

  std::vector<uint64_t> cuts{0};
  for (char c : cut_bytes) cuts.push_back(file.empty() ? 0 : static_cast<uint8_t>(c) * file.size() / 255);
  std::sort(cuts.begin(), cuts.end());
  cuts.push_back(file.size());
  std::vector<seen> joined;
  bool some_failed = false;
  for (size_t j = 0; j + 1 < cuts.size(); ++j) {
    auto part = text_record_reader::open_range(source, "f", format, cuts[j], cuts[j + 1], max_record);
    if (!part) __builtin_trap();
    std::vector<seen> mine;
    if (!read_all(*part, mine)) {
      some_failed = true;
      continue;
    }
    for (auto& s : mine) {
      if (s.offset < cuts[j] || s.offset >= cuts[j + 1]) __builtin_trap();
      joined.push_back(std::move(s));
    }
  }
  if (whole_ok) {
    if (some_failed || joined.size() != all.size()) __builtin_trap();
    for (size_t i = 0; i < all.size(); ++i)
      if (joined[i].text != all[i].text || joined[i].offset != all[i].offset) __builtin_trap();
  } else if (!some_failed) {
    __builtin_trap();
  }

  text_shard_options o;
  o.name = "f";
  o.format = format;
  o.size = file.size();
  o.shards = static_cast<uint32_t>(cuts.size() - 1);
  o.shard = data[1] % o.shards;
  o.sequence = 4;
  o.batch = 2;
  o.shuffle_rows = 4;
  auto shard = text_shard::open(source, tok, nullptr, o);
  if (!shard) __builtin_trap();
  for (uint64_t d : {uint64_t{0}, uint64_t{3}, uint64_t{1}}) {
    auto rows = shard->draw(d);
    if (rows && rows->rows() != 2) __builtin_trap();
  }
  return 0;
}
