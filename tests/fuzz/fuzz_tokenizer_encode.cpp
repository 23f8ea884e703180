// Any bytes as text for a byte-level BPE tokenizer (Llama 3's pre-tokenizer, a few merges, added
// tokens) and a SentencePiece-style one: no crash; byte-level decode(encode(s)) == s when no
// special token is parsed; the stream decoder emits only valid UTF-8 and, for valid text, the text.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "models/stream_decoder.hpp"
#include "models/tokenizer.hpp"
#include "models/utf8.hpp"

namespace {

mesh::models::tokenizer make_byte_level() {
  mesh::models::vocabulary v;
  v.model = mesh::models::vocabulary::kind::byte_bpe;
  v.pre_tokenizer = "llama-bpe";
  v.ignore_merges = true;
  const auto& t = mesh::models::utf8::gpt2_bytes();
  for (int b = 0; b < 256; ++b) v.tokens.push_back(t.to_text[b]);
  const char* merges[][2] = {{"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"i", "n"}, {"Ġ", "Ġ"}, {"ĠĠ", "ĠĠ"}, {"Ċ", "Ċ"}};
  for (auto& m : merges) {
    v.merges.emplace_back(m[0], m[1]);
    std::string joined = std::string(m[0]) + m[1];
    bool have = false;
    for (const auto& x : v.tokens) have = have || x == joined;
    if (!have) v.tokens.push_back(joined);
  }
  v.tokens.push_back("<|eot|>");
  v.tokens.push_back("<tool>");
  v.token_types.assign(v.tokens.size(), 1);
  v.token_types[v.tokens.size() - 2] = static_cast<int32_t>(mesh::models::token_type::control);
  v.token_types[v.tokens.size() - 1] = static_cast<int32_t>(mesh::models::token_type::user_defined);
  return *mesh::models::tokenizer::create(v);
}

mesh::models::tokenizer make_spm() {
  mesh::models::vocabulary v;
  v.model = mesh::models::vocabulary::kind::sentencepiece;
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.token_types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    v.tokens.push_back(buf);
    v.token_types.push_back(6);
  }
  for (const char* p : {"▁", "a", "b", "▁a", "ab", "▁ab", "é", "▁▁"}) {
    v.tokens.push_back(p);
    v.token_types.push_back(1);
  }
  v.scores.assign(v.tokens.size(), 0.0f);
  for (size_t i = 259; i < v.tokens.size(); ++i) v.scores[i] = -static_cast<float>(i);
  v.bos_id = 1;
  v.unk_id = 0;
  v.add_bos = true;
  return *mesh::models::tokenizer::create(v);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const mesh::models::tokenizer byte_level = make_byte_level();
  static const mesh::models::tokenizer spm = make_spm();
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  auto ids = byte_level.encode(text, {.add_special = false, .parse_special = false});
  if (!ids) __builtin_trap();
  auto back = byte_level.decode(*ids, {.skip_special = false});
  if (!back || *back != text) __builtin_trap();
  // With specials parsed the text still comes back when they are kept.
  auto with = byte_level.encode(text, {.add_special = false, .parse_special = true});
  if (!with || *byte_level.decode(*with, {.skip_special = false}) != text) __builtin_trap();

  mesh::models::stream_decoder stream(byte_level);
  std::string streamed;
  for (int32_t id : *ids) {
    auto chunk = stream.push(id);
    if (!chunk || !mesh::models::utf8::valid(*chunk)) __builtin_trap();
    streamed += *chunk;
  }
  streamed += stream.finish();
  if (!mesh::models::utf8::valid(streamed)) __builtin_trap();
  if (mesh::models::utf8::valid(text) && streamed != text) __builtin_trap();

  auto sids = spm.encode(text, {.add_special = true, .parse_special = false});
  if (!sids) __builtin_trap();
  auto sback = spm.decode(*sids);
  if (!sback) __builtin_trap();
  // Spaces become "▁" and back, the dummy prefix goes again, bytes fall back: the text returns,
  // unless it held a "▁" of its own (which decodes as the space it stands for).
  if (text.find("\xE2\x96\x81") == std::string_view::npos && *sback != text) __builtin_trap();
  return 0;
}
