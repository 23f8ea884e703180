// Any bytes as one JSONL line of training data: parse_jsonl_record gives an error or a record, and
// a record tokenizes (or fails with an error) without a crash. On success: a text record's ids are
// its bytes plus EOS, every one carrying loss; a ChatML conversation's ids are those of its whole
// rendered text and the loss runs are exactly each assistant turn's content + "<|im_end|>\n"; a
// Llama 2 conversation on a SentencePiece vocabulary also equals its whole text's ids. The example
// then packs into rows whose targets are the next tokens.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "models/text_dataset.hpp"
#include "models/utf8.hpp"

namespace {

using namespace mesh::models;

/// Byte b is token b; then <|endoftext|> (EOS), <|im_start|>, <|im_end|>.
tokenizer make_bytes() {
  vocabulary v;
  v.model = vocabulary::kind::byte_bpe;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(utf8::gpt2_bytes().to_text[b]);
  for (const char* s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) v.tokens.push_back(s);
  v.token_types.assign(v.tokens.size(), 1);
  for (int id = 256; id < 259; ++id) v.token_types[id] = static_cast<int32_t>(token_type::control);
  v.eos_id = 256;
  return *tokenizer::create(v);
}

tokenizer make_spm() {
  vocabulary v;
  v.model = vocabulary::kind::sentencepiece;
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.token_types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    v.tokens.push_back(buf);
    v.token_types.push_back(6);
  }
  for (const char* p : {"▁", "a", "b", "▁a", "ab", "▁ab", "▁▁"}) {
    v.tokens.push_back(p);
    v.token_types.push_back(1);
  }
  v.scores.assign(v.tokens.size(), 0.0f);
  for (size_t i = 259; i < v.tokens.size(); ++i) v.scores[i] = -static_cast<float>(i);
  v.unk_id = 0;
  v.bos_id = 1;
  v.eos_id = 2;
  v.add_bos = true;
  return *tokenizer::create(v);
}

void check_rows(const tokenized_example& e) {
  auto packer = row_packer::create({.sequence = 7});
  if (!packer) __builtin_trap();
  packer->push(e);
  size_t rows = 0;
  while (auto row = packer->pop()) {
    for (size_t i = 0; i < 7; ++i) {
      const size_t at = rows * 7 + i;
      if (row->tokens[i] != e.ids[at] || row->targets[i] != e.ids[at + 1]) __builtin_trap();
      if (row->mask[i] != (e.loss[at + 1] ? 1.0f : 0.0f)) __builtin_trap();
    }
    ++rows;
  }
  if (e.ids.size() > 0 && rows != (e.ids.size() - 1) / 7) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tokenizer bytes = make_bytes();
  static const tokenizer spm = make_spm();
  static const chat_template chatml = *chat_template_by_name("chatml");
  static const chat_template llama2 = *chat_template_by_name("llama2", {"<s>", "</s>"});
  const std::string_view line(reinterpret_cast<const char*>(data), size);

  auto record = parse_jsonl_record(line, 1, "fuzz.jsonl");
  if (!record) {
    if (record.error().message.rfind("fuzz.jsonl:1: ", 0) != 0) __builtin_trap();
    return 0;
  }
  auto e = tokenize_record(*record, bytes, &chatml);
  const auto* text = std::get_if<std::string>(&record->content);
  if (!e) {
    if (text) __builtin_trap();  // only a conversation may be refused
    return 0;
  }
  if (e->ids.size() != e->loss.size()) __builtin_trap();

  if (text) {
    if (e->ids.size() != text->size() + 1 || e->ids.back() != 256) __builtin_trap();
    for (size_t i = 0; i < text->size(); ++i) {
      if (e->ids[i] != static_cast<unsigned char>((*text)[i]) || !e->loss[i]) __builtin_trap();
    }
    check_rows(*e);
    return 0;
  }
  const auto& m = std::get<std::vector<chat_message>>(record->content);
  auto full = chatml.render(m, false);
  if (!full || e->ids != *bytes.encode(*full, {.add_special = false, .parse_special = true})) __builtin_trap();
  std::vector<std::string> runs, expected_runs;
  for (size_t i = 0; i < e->ids.size(); ++i) {
    if (e->loss[i] && (i == 0 || !e->loss[i - 1])) runs.emplace_back();
    if (e->loss[i]) runs.back() += bytes.piece(e->ids[i]);
  }
  for (const auto& x : m) {
    if (x.role == "assistant") expected_runs.push_back(x.content + "<|im_end|>\n");
  }
  if (runs != expected_runs) __builtin_trap();
  check_rows(*e);

  if (auto s = tokenize_record(*record, spm, &llama2)) {
    auto whole = llama2.render(m, false);
    if (!whole || s->ids != *spm.encode(*whole, {.add_special = false, .parse_special = true})) __builtin_trap();
  }
  return 0;
}
