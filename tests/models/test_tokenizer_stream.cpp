// The streaming decoder: chunks are always whole UTF-8, their concatenation is the text, special
// tokens follow the flag, an unfinished character becomes U+FFFD at the end.
#include <catch2/catch.hpp>

#include "models/stream_decoder.hpp"
#include "models/tokenizer.hpp"
#include "models/utf8.hpp"

using namespace mesh::models;

namespace {

tokenizer bytes_only() {
  vocabulary v;
  v.model = vocabulary::kind::byte_bpe;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(utf8::gpt2_bytes().to_text[b]);
  v.tokens.push_back("<|end|>");
  v.token_types.assign(v.tokens.size(), 1);
  v.token_types[256] = static_cast<int32_t>(token_type::control);
  return *tokenizer::create(v);
}

}  // namespace

TEST_CASE("stream decoder never splits a UTF-8 character", "[tokenizer]") {
  const tokenizer tok = bytes_only();
  const std::string text = "héllo 🌍 中文 — ok";
  auto ids = tok.encode(text, {.add_special = false});
  REQUIRE(ids);
  REQUIRE(ids->size() == text.size());  // one token per byte: the hardest case
  stream_decoder dec(tok);
  std::string joined;
  for (int32_t id : *ids) {
    auto chunk = dec.push(id);
    REQUIRE(chunk);
    CHECK(utf8::valid(*chunk));
    joined += *chunk;
  }
  joined += dec.finish();
  CHECK(joined == text);
}

TEST_CASE("stream decoder: special tokens by flag, broken bytes as U+FFFD, bad ids refused", "[tokenizer]") {
  const tokenizer tok = bytes_only();
  const int32_t end = 256;
  stream_decoder skip(tok);
  CHECK(*skip.push('a') == "a");
  CHECK(skip.push(end)->empty());
  stream_decoder keep(tok, {.skip_special = false});
  CHECK(*keep.push(end) == "<|end|>");
  // 0xE4 0xB8 starts a 3-byte character; "a" cannot continue it.
  const int32_t e4 = *tok.find(utf8::gpt2_bytes().to_text[0xE4]);
  const int32_t b8 = *tok.find(utf8::gpt2_bytes().to_text[0xB8]);
  stream_decoder d(tok);
  CHECK(d.push(e4)->empty());
  CHECK(d.push(b8)->empty());
  CHECK(*d.push('a') == "\xEF\xBF\xBD" "a");
  CHECK(d.push(e4)->empty());
  CHECK(d.finish() == "\xEF\xBF\xBD");
  CHECK(*d.push(*tok.find(utf8::gpt2_bytes().to_text[0x80])) == "\xEF\xBF\xBD");
  CHECK_FALSE(d.push(257));
  CHECK_FALSE(d.push(-3));
}

TEST_CASE("stream decoder drops SentencePiece's dummy-prefix space once, after BOS too", "[tokenizer]") {
  vocabulary v;
  v.model = vocabulary::kind::sentencepiece;
  v.tokens = {"<unk>", "<s>", "</s>", "▁hi", "▁there"};
  v.token_types = {2, 3, 3, 1, 1};
  v.bos_id = 1;
  v.unk_id = 0;
  auto tok = tokenizer::create(v);
  REQUIRE(tok);
  stream_decoder d(*tok);
  CHECK(d.push(1)->empty());
  CHECK(*d.push(3) == "hi");
  CHECK(*d.push(4) == " there");
  CHECK(*tok->decode(std::vector<int32_t>{1, 3, 4}) == "hi there");
  CHECK(*tok->decode(std::vector<int32_t>{3, 4}) == "hi there");
}
