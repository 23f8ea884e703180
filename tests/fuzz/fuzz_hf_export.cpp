// libFuzzer target for the Hugging Face tokenizer files written from a GGUF vocabulary
// (models/hf_export.hpp tokenizer_json_of): the vocabulary comes from a file a user points
// meshnode at, so any vocabulary that passes validate() (what the GGUF reader checks) gives an
// error naming what tokenizer.json cannot hold, or files that meshnode's own reader reads back.
//
// Input layout: byte 0 flags (SentencePiece, add BOS, add EOS, ignore merges, space prefix, scores,
// types, a chat template), byte 1 the pre-tokenizer name, bytes 2-5 the BOS, EOS, unknown and
// padding ids (255: none; else modulo the token count), then tokens separated by 0xFF (with types:
// the token's first byte is its type modulo 7; with scores: the next is its score), a 0xFE byte,
// then merges as pairs of token indices, and after a second 0xFE the chat template.
#include <cstdint>
#include <optional>
#include <string>

#include "models/hf_export.hpp"
#include "models/tokenizer_json.hpp"
#include "tests/fuzz/fuzz_check.hpp"

namespace {

using mesh::fuzz::check;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mesh::models;
  if (size < 6) return 0;
  const uint8_t flags = data[0];
  vocabulary v;
  v.model = flags & 1 ? vocabulary::kind::sentencepiece : vocabulary::kind::byte_bpe;
  v.add_bos = flags & 2;
  v.add_eos = flags & 4;
  v.ignore_merges = flags & 8;
  v.add_space_prefix = flags & 16;
  const bool scores = flags & 32, types = flags & 64, with_template = flags & 128;
  static const char* const pre[] = {"gpt2", "llama-bpe", "qwen2", "smollm", "", "no-such-pre-tokenizer"};
  v.pre_tokenizer = pre[data[1] % 6];

  size_t at = 6;
  std::string token;
  std::optional<int32_t> type;
  std::optional<float> score;
  const auto finish_token = [&] {
    v.tokens.push_back(token);
    if (types) v.token_types.push_back(type.value_or(1));
    if (scores) v.scores.push_back(score.value_or(0.0f));
    token.clear();
    type.reset();
    score.reset();
  };
  for (; at < size && data[at] != 0xFE; ++at) {
    if (data[at] == 0xFF) {
      finish_token();
    } else if (types && !type) {
      type = data[at] % 7;
    } else if (scores && !score) {
      score = static_cast<float>(static_cast<int8_t>(data[at]));
    } else {
      token.push_back(static_cast<char>(data[at]));
    }
  }
  if (!token.empty() || type || score) finish_token();
  if (v.tokens.empty()) return 0;
  const auto id = [&](uint8_t b) -> std::optional<int32_t> {
    if (b == 255) return std::nullopt;
    return static_cast<int32_t>(b % v.tokens.size());
  };
  v.bos_id = id(data[2]), v.eos_id = id(data[3]), v.unk_id = id(data[4]), v.pad_id = id(data[5]);
  if (v.add_bos && !v.bos_id) v.add_bos = false;
  if (v.add_eos && !v.eos_id) v.add_eos = false;
  for (++at; at + 1 < size && data[at] != 0xFE; at += 2)
    v.merges.emplace_back(v.tokens[data[at] % v.tokens.size()], v.tokens[data[at + 1] % v.tokens.size()]);
  std::optional<std::string> chat_template;
  if (with_template && at < size) chat_template = std::string(reinterpret_cast<const char*>(data + at + 1), size - at - 1);
  if (!v.validate()) return 0;

  auto files = tokenizer_json_of(v, chat_template, 4096);
  if (!files) {
    check(!files.error().message.empty());
    return 0;
  }
  auto back = parse_hf_tokenizer(files->tokenizer_json, files->tokenizer_config_json);
  check(back.has_value());
  check(back->vocab.model == v.model);
  check(back->vocab.size() <= v.size());
  for (int32_t i = 0; i < back->vocab.size(); ++i) check(back->vocab.tokens[static_cast<size_t>(i)] == v.tokens[static_cast<size_t>(i)]);
  check(back->chat_template == chat_template);
  return 0;
}
