// Byte-level BPE against ref_bpe.py (GPT-2's algorithm in Python with the `regex` module): the
// same tokenizer.json, the same ids, for the GPT-2, Llama 3, Qwen2 and SmolLM pre-tokenizers.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>

#include "models/pre_tokenizer.hpp"
#include "models/utf8.hpp"
#include "models/tokenizer.hpp"
#include "models/tokenizer_json.hpp"
#include "test_tokenizer_support.hpp"
#include "test_tokenizer_text_samples.hpp"

using namespace mesh::models;
using json = nlohmann::json;

namespace {

struct bpe_case {
  const char* gguf_name;
  const char* merge_form;  // "strings" ("a b") or "pairs" (["a","b"], with ignore_merges)
};

void compare_with_reference(const bpe_case& c) {
  if (auto why = test::python_missing("regex")) {
    WARN("skipped: " << *why);
    return;
  }
  test::scratch_dir dir;
  auto patterns = pre_tokenizer_patterns(c.gguf_name);
  REQUIRE(patterns);
  test::write_file(dir.path / "corpus.txt", test::training_corpus());
  test::write_file(dir.path / "patterns.json", json(*patterns).dump());
  auto err = test::run_python("ref_bpe.py", {"train", (dir.path / "corpus.txt").string(),
                                             (dir.path / "patterns.json").string(), "600", c.merge_form,
                                             (dir.path / "tokenizer.json").string()});
  REQUIRE_FALSE(err);

  auto hf = parse_hf_tokenizer(test::read_file(dir.path / "tokenizer.json"));
  REQUIRE(hf);
  CHECK(hf->vocab.model == vocabulary::kind::byte_bpe);
  CHECK(hf->vocab.pre_tokenizer == (std::string(c.gguf_name) == "starcoder" ? "smollm" : c.gguf_name));
  CHECK(hf->vocab.merges.size() > 400);  // fewer than asked when the corpus runs out of pairs
  auto tok = tokenizer::create(hf->vocab);
  REQUIRE(tok);

  const auto texts = test::sample_texts(true);
  test::write_file(dir.path / "strings.json", json(texts).dump());
  err = test::run_python("ref_bpe.py", {"encode", (dir.path / "tokenizer.json").string(),
                                        (dir.path / "strings.json").string(), (dir.path / "ids.json").string()});
  REQUIRE_FALSE(err);
  const json expected_ids = json::parse(test::read_file(dir.path / "ids.json"));
  REQUIRE(expected_ids.size() == texts.size());
  size_t compared = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    INFO("text " << i << ": " << json(texts[i]).dump());
    auto ids = tok->encode(texts[i], {.add_special = false, .parse_special = true});
    REQUIRE(ids);
    CHECK(*ids == expected_ids[i].get<std::vector<int32_t>>());
    auto back = tok->decode(*ids, {.skip_special = false});
    REQUIRE(back);
    CHECK(*back == texts[i]);
    ++compared;
  }
  CHECK(compared > 300);
}

}  // namespace

TEST_CASE("byte-level BPE with GPT-2's pre-tokenizer matches the reference", "[tokenizer]") {
  compare_with_reference({"gpt2", "strings"});
}

TEST_CASE("byte-level BPE with Llama 3's pre-tokenizer matches the reference", "[tokenizer]") {
  compare_with_reference({"llama-bpe", "pairs"});
}

TEST_CASE("byte-level BPE with Qwen2's pre-tokenizer matches the reference", "[tokenizer]") {
  compare_with_reference({"qwen2", "strings"});
}

TEST_CASE("byte-level BPE with SmolLM's digit split matches the reference", "[tokenizer]") {
  compare_with_reference({"smollm", "pairs"});
}

namespace {

/// 256 byte tokens, "ab" from one merge, a control and a user-defined added token.
vocabulary hand_made_byte_vocab() {
  vocabulary v;
  v.model = vocabulary::kind::byte_bpe;
  v.pre_tokenizer = "gpt2";
  for (int b = 0; b < 256; ++b) v.tokens.push_back(utf8::gpt2_bytes().to_text[b]);
  v.tokens.push_back("ab");
  v.merges.emplace_back("a", "b");
  v.tokens.push_back("<|end|>");
  v.tokens.push_back("<x>");
  v.token_types.assign(v.tokens.size(), 1);
  v.token_types[257] = static_cast<int32_t>(token_type::control);
  v.token_types[258] = static_cast<int32_t>(token_type::user_defined);
  v.eos_id = 257;
  return v;
}

}  // namespace

TEST_CASE("byte-level BPE: control tokens in text are plain text unless parse_special", "[tokenizer]") {
  auto tok = tokenizer::create(hand_made_byte_vocab());
  REQUIRE(tok);
  auto plain = tok->encode("ab<|end|>b<x>", {.add_special = false, .parse_special = false});
  REQUIRE(plain);
  CHECK(std::count(plain->begin(), plain->end(), 257) == 0);
  CHECK(std::count(plain->begin(), plain->end(), 258) == 1);  // user-defined: always
  CHECK((*plain)[0] == 256);                                    // "ab" merged
  auto special = tok->encode("ab<|end|>b<x>", {.add_special = false, .parse_special = true});
  REQUIRE(special);
  CHECK(*special == std::vector<int32_t>{256, 257, tok->find("b").value(), 258});
  auto kept = tok->decode(*special, {.skip_special = false});
  REQUIRE(kept);
  CHECK(*kept == "ab<|end|>b<x>");
  auto skipped = tok->decode(*special, {.skip_special = true});
  REQUIRE(skipped);
  CHECK(*skipped == "abb<x>");
  CHECK_FALSE(tok->decode(std::vector<int32_t>{259}));
  CHECK_FALSE(tok->decode(std::vector<int32_t>{-1}));
}

TEST_CASE("byte-level BPE: any bytes round-trip, huge words included", "[tokenizer]") {
  auto tok = tokenizer::create(hand_made_byte_vocab());
  REQUIRE(tok);
  std::string bytes;
  for (int i = 0; i < 4096; ++i) bytes.push_back(static_cast<char>((i * 131) & 0xFF));
  auto ids = tok->encode(bytes, {.add_special = false, .parse_special = false});
  REQUIRE(ids);
  CHECK(*tok->decode(*ids) == bytes);
  // 4 MB of spaces is one regex word: merged in bounded pieces, still every byte back.
  const std::string spaces(4 << 20, ' ');
  ids = tok->encode(spaces, {.add_special = false});
  REQUIRE(ids);
  CHECK(ids->size() == spaces.size());
  CHECK(*tok->decode(*ids) == spaces);
  std::string text;
  while (text.size() < (4u << 20)) text += "ab cd, éé 東京 123 ab\n";
  ids = tok->encode(text, {.add_special = false});
  REQUIRE(ids);
  CHECK(*tok->decode(*ids) == text);
}
