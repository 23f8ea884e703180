// The tokenizer a GGUF file brings: byte-level and SentencePiece-style vocabularies from
// tokenizer.ggml.* metadata, llama.cpp's defaults, and the errors for what does not fit.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "model_writer.hpp"
#include "models/checkpoint_tokenizer.hpp"
#include "models/tokenizer.hpp"

using namespace mesh;
using namespace mesh::models;
using namespace mesh::models::test;

namespace {

expected<gguf_view> parse(const bytes& b) { return gguf_view::parse(b, "t.gguf"); }

}  // namespace

TEST_CASE("a byte-level GGUF vocabulary encodes with its merges and decodes back", "[models][gguf_tokenizer]") {
  gguf_writer w;
  add_gguf_vocabulary(w, 300);
  w.add_string("tokenizer.chat_template", "{% for m in messages %}<|im_start|>{% endfor %}");
  const bytes file = w.build();
  auto g = parse(file);
  REQUIRE(g);
  auto t = read_gguf_tokenizer(*g);
  REQUIRE(t);
  CHECK(t->vocab.model == vocabulary::kind::byte_bpe);
  CHECK(t->vocab.tokens.size() == 300);
  CHECK(t->vocab.bos_id == 256);
  CHECK(t->vocab.eos_id == 257);
  CHECK_FALSE(t->vocab.add_bos);  // llama.cpp's default for "gpt2"
  CHECK(t->chat_template.has_value());
  auto tok = tokenizer::create(t->vocab);
  REQUIRE(tok);
  auto ids = tok->encode("ab ab!", {.add_special = true, .parse_special = true});
  REQUIRE(ids);
  CHECK(ids->at(0) == *tok->find("ab"));  // merged by "a b"
  auto text = tok->decode(*ids);
  REQUIRE(text);
  CHECK(*text == "ab ab!");
  auto special = tok->encode("<s>x", {.add_special = false, .parse_special = true});
  REQUIRE(special);
  CHECK(special->front() == 256);
}

TEST_CASE("a SentencePiece-style GGUF vocabulary adds BOS by default and falls back to bytes", "[models][gguf_tokenizer]") {
  gguf_writer w;
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    tokens.push_back(hex);
    types.push_back(6);
  }
  for (const char* p : {"\xe2\x96\x81", "a", "b", "\xe2\x96\x81" "a", "\xe2\x96\x81" "ab"}) {
    tokens.push_back(p);
    types.push_back(1);
  }
  std::vector<float> scores(tokens.size(), 0.0f);
  scores[tokens.size() - 2] = -1;
  scores[tokens.size() - 1] = -2;
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_array_strings("tokenizer.ggml.tokens", tokens);
  w.add_array_f32("tokenizer.ggml.scores", scores);
  w.add_array_i32("tokenizer.ggml.token_type", types);
  w.add_u32("tokenizer.ggml.bos_token_id", 1);
  w.add_u32("tokenizer.ggml.eos_token_id", 2);
  w.add_u32("tokenizer.ggml.unknown_token_id", 0);
  const bytes file = w.build();
  auto g = parse(file);
  REQUIRE(g);
  auto t = read_gguf_tokenizer(*g);
  REQUIRE(t);
  CHECK(t->vocab.model == vocabulary::kind::sentencepiece);
  CHECK(t->vocab.add_bos);
  auto tok = tokenizer::create(t->vocab);
  REQUIRE(tok);
  auto ids = tok->encode("ab\xc3\xa9");
  REQUIRE(ids);
  CHECK(ids->front() == 1);                                                       // BOS
  CHECK(ids->at(1) == static_cast<int32_t>(tokens.size() - 1));                   // "▁ab"
  CHECK(ids->at(2) == 3 + 0xc3);                                                  // byte fallback
  auto text = tok->decode(*ids);
  REQUIRE(text);
  CHECK(*text == "ab\xc3\xa9");
}

TEST_CASE("GGUF tokenizer errors name the file and the key", "[models][gguf_tokenizer]") {
  SECTION("unknown tokenizer model") {
    gguf_writer w;
    w.add_string("tokenizer.ggml.model", "bert");
    w.add_array_strings("tokenizer.ggml.tokens", {"a"});
    const bytes file = w.build();  // the view points into it
    auto g = parse(file);
    REQUIRE(g);
    auto t = read_gguf_tokenizer(*g);
    REQUIRE_FALSE(t);
    CHECK(t.error().code == error_code::unsupported);
    CHECK(t.error().message == "t.gguf: tokenizer model \"bert\" is not supported (supported: \"gpt2\", \"llama\")");
  }
  SECTION("a merge that is not two tokens") {
    gguf_writer w;
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_array_strings("tokenizer.ggml.tokens", {"a", "b", "ab"});
    w.add_array_strings("tokenizer.ggml.merges", {"ab"});
    const bytes file = w.build();  // the view points into it
    auto g = parse(file);
    REQUIRE(g);
    auto t = read_gguf_tokenizer(*g);
    REQUIRE_FALSE(t);
    CHECK(t.error().message ==
          "t.gguf: metadata key \"tokenizer.ggml.merges\" holds \"ab\", not two tokens separated by a space");
  }
  SECTION("a special token id past the vocabulary") {
    gguf_writer w;
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_array_strings("tokenizer.ggml.tokens", {"a", "b"});
    w.add_u32("tokenizer.ggml.eos_token_id", 7);
    const bytes file = w.build();  // the view points into it
    auto g = parse(file);
    REQUIRE(g);
    auto t = read_gguf_tokenizer(*g);
    REQUIRE_FALSE(t);
    CHECK(t.error().message == "t.gguf: metadata key \"tokenizer.ggml.eos_token_id\" is token 7, but the vocabulary has 2 tokens");
  }
  SECTION("no tokenizer at all") {
    gguf_writer w;
    w.add_string("general.architecture", "llama");
    const bytes file = w.build();  // the view points into it
    auto g = parse(file);
    REQUIRE(g);
    auto t = read_gguf_tokenizer(*g);
    REQUIRE_FALSE(t);
    CHECK(t.error().code == error_code::not_found);
  }
}

TEST_CASE("a tokenizer that does not match the model's vocabulary is an error", "[models][gguf_tokenizer]") {
  temp_dir dir;
  model_spec s;
  s.vocab = 310;  // 310 embedding rows
  write_gguf_model(dir / "m.gguf", s, tensor_type::f32);
  // A 300-token vocabulary against the model's 310 rows.
  gguf_writer w;
  add_gguf_vocabulary(w, 300);
  auto ckpt = checkpoint::open(dir / "m.gguf");
  REQUIRE(ckpt);
  auto config = read_model_config(*ckpt);
  REQUIRE(config);
  const bytes file = w.build();
  auto g = parse(file);
  REQUIRE(g);
  auto t = read_gguf_tokenizer(*g);
  REQUIRE(t);
  auto ok = check_tokenizer_fits(t->vocab, *config, "m.gguf");
  REQUIRE_FALSE(ok);
  CHECK(ok.error().code == error_code::shape_mismatch);
  CHECK(ok.error().message ==
        "m.gguf: the tokenizer has 300 tokens but the model's vocabulary has 310 rows (a GGUF file carries one token per row)");
  config->vocab_size = 200;
  auto more = check_tokenizer_fits(t->vocab, *config, "m.gguf");
  REQUIRE_FALSE(more);
  CHECK(more.error().message ==
        "m.gguf: the tokenizer has 300 tokens but the model's vocabulary has 200 rows: they do not belong together");
  // The file's own tokenizer fits.
  auto own = load_tokenizer(*ckpt, *read_model_config(*ckpt));
  REQUIRE(own);
  CHECK(own->vocab.tokens.size() == 310);
}
