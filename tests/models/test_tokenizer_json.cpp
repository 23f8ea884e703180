// tokenizer.json / tokenizer_config.json loading and vocabulary::validate: what real files hold,
// and the errors hostile or unsupported ones get (each naming what is wrong).
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "models/pre_tokenizer.hpp"
#include "models/tokenizer.hpp"
#include "models/tokenizer_json.hpp"
#include "models/utf8.hpp"
#include "test_tokenizer_support.hpp"

using mesh::error_code;
using namespace mesh::models;
using json = nlohmann::json;

namespace {

std::string fmt_byte(int b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "<0x%02X>", b);
  return buf;
}

/// A byte-level tokenizer.json in Llama 3's layout: Split regex + ByteLevel, added specials
/// beyond the model vocabulary, TemplateProcessing that adds BOS.
json llama3_style() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[utf8::gpt2_bytes().to_text[b]] = b;
  vocab["he"] = 256;
  vocab["ll"] = 257;
  vocab["hell"] = 258;
  vocab["Ġh"] = 259;
  json j = {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", 260}, {"content", "<|begin_of_text|>"}, {"special", true}},
        {{"id", 261}, {"content", "<|eot_id|>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", pre_tokenizer_patterns("llama-bpe")->at(0)}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}}},
      {"post_processor",
       {{"type", "Sequence"},
        {"processors",
         {{{"type", "ByteLevel"}},
          {{"type", "TemplateProcessing"},
           {"single", {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}}}}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"}, {"ignore_merges", true}, {"vocab", vocab}, {"merges", json::array({json::array({"h", "e"}), json::array({"l", "l"}), json::array({"he", "ll"}), json::array({"Ġ", "h"})})}}}};
  return j;
}

/// Llama 2's layout: BPE with byte fallback, "▁" through the normalizer, <s> added by the
/// post-processor.
json llama2_style() {
  json vocab = json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  for (int b = 0; b < 256; ++b) vocab[fmt_byte(b)] = 3 + b;
  const std::vector<std::string> rest = {"▁", "h", "e", "l", "o", "▁h", "ll", "▁he", "llo", "▁hello", "w", "r", "d", "▁w", "or", "▁wor", "ld", "▁world"};
  for (size_t i = 0; i < rest.size(); ++i) vocab[rest[i]] = 259 + static_cast<int>(i);
  json j = {
      {"added_tokens",
       {{{"id", 0}, {"content", "<unk>"}, {"special", true}},
        {{"id", 1}, {"content", "<s>"}, {"special", true}},
        {{"id", 2}, {"content", "</s>"}, {"special", true}}}},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", "▁"}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}}}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}}}}}}}},
      {"decoder", {{"type", "Sequence"}}},
      {"model",
       {{"type", "BPE"},
        {"byte_fallback", true},
        {"unk_token", "<unk>"},
        {"vocab", vocab},
        {"merges", {"▁ h", "l l", "▁h e", "ll o", "▁he llo", "▁ w", "o r", "▁w or", "l d", "▁wor ld"}}}}};
  return j;
}

}  // namespace

TEST_CASE("tokenizer.json: Llama 3 layout loads as byte-level BPE", "[tokenizer]") {
  const std::string config = R"({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>"},
    "chat_template": "{{ '<|start_header_id|>' }}"})";
  auto hf = parse_hf_tokenizer(llama3_style().dump(), config);
  REQUIRE(hf);
  const vocabulary& v = hf->vocab;
  CHECK(v.model == vocabulary::kind::byte_bpe);
  CHECK(v.pre_tokenizer == "llama-bpe");
  CHECK(v.ignore_merges);
  CHECK(v.tokens.size() == 262);
  CHECK(v.bos_id == 260);
  CHECK(v.eos_id == 261);
  CHECK(v.add_bos);
  CHECK(v.type_of(260) == token_type::control);
  REQUIRE(hf->chat_template);
  CHECK(*hf->chat_template == "{{ '<|start_header_id|>' }}");
  auto tok = tokenizer::create(v);
  REQUIRE(tok);
  auto ids = tok->encode("hell hello<|eot_id|>");
  REQUIRE(ids);
  // BOS, "hell" whole (ignore_merges), then " hello" by rank: "Ġ" "hell" "o".
  CHECK(*ids == std::vector<int32_t>{260, 258, *tok->find("Ġ"), 258, *tok->find("o"), 261});
}

TEST_CASE("tokenizer.json: Llama 2 layout loads as sentencepiece with byte fallback", "[tokenizer]") {
  auto hf = parse_hf_tokenizer(llama2_style().dump(), R"({"add_bos_token": true, "add_eos_token": false})");
  REQUIRE(hf);
  const vocabulary& v = hf->vocab;
  CHECK(v.model == vocabulary::kind::sentencepiece);
  CHECK(v.add_space_prefix);
  CHECK(v.add_bos);
  CHECK(v.bos_id == 1);
  CHECK(v.unk_id == 0);
  CHECK(v.type_of(3 + 0xC3) == token_type::byte);
  CHECK(v.type_of(0) == token_type::unknown);
  auto tok = tokenizer::create(v);
  REQUIRE(tok);
  auto ids = tok->encode("hello world é");
  REQUIRE(ids);
  const int32_t hello = *tok->find("▁hello"), world = *tok->find("▁world"), space = *tok->find("▁");
  CHECK(*ids == std::vector<int32_t>{1, hello, world, space, 3 + 0xC3, 3 + 0xA9});
  auto text = tok->decode(*ids);
  REQUIRE(text);
  CHECK(*text == "hello world é");
}

TEST_CASE("tokenizer.json: merges as strings and as pairs give the same vocabulary", "[tokenizer]") {
  json a = llama3_style();
  json b = a;
  b["model"]["merges"] = {"h e", "l l", "he ll", "Ġ h"};
  auto va = parse_hf_tokenizer(a.dump());
  auto vb = parse_hf_tokenizer(b.dump());
  REQUIRE(va);
  REQUIRE(vb);
  CHECK(va->vocab.merges == vb->vocab.merges);
}

TEST_CASE("tokenizer.json: unsupported and broken files are errors that name the problem", "[tokenizer]") {
  auto message = [](const json& j, std::string_view config = {}) {
    auto r = parse_hf_tokenizer(j.dump(), config);
    REQUIRE_FALSE(r);
    return r.error().message;
  };
  json j = llama3_style();
  j["model"]["type"] = "Unigram";
  CHECK_THAT(message(j), Catch::Contains("\"Unigram\""));
  j = llama3_style();
  j["model"]["type"] = "WordPiece";
  CHECK_THAT(message(j), Catch::Contains("\"WordPiece\""));
  j = llama3_style();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  CHECK_THAT(message(j), Catch::Contains("\"Whitespace\""));
  j = llama3_style();
  j["model"]["merges"].push_back(json::array({"h", "zz"}));
  CHECK_THAT(message(j), Catch::Contains("\"zz\""));
  j = llama3_style();
  j["model"]["merges"].push_back("h e l");
  CHECK_THAT(message(j), Catch::Contains("two tokens"));
  j = llama3_style();
  j["model"]["vocab"]["hell"] = 300;
  CHECK_THAT(message(j), Catch::Contains("no token has id"));
  j = llama3_style();
  j["added_tokens"].push_back({{"id", 5}, {"content", "other"}, {"special", true}});
  CHECK_THAT(message(j), Catch::Contains("two tokens"));
  j = llama3_style();
  j["model"]["vocab"]["he"] = "x";
  CHECK_THAT(message(j), Catch::Contains("\"he\""));
  j = llama3_style();
  j["model"]["vocab"]["he"] = -4;
  CHECK_THAT(message(j), Catch::Contains("out of range"));
  j = llama3_style();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  {
    auto r = parse_hf_tokenizer(j.dump());
    REQUIRE(r);  // the loader keeps patterns; the tokenizer compiles them
    auto t = tokenizer::create(r->vocab);
    REQUIRE_FALSE(t);
    CHECK_THAT(t.error().message, Catch::Contains("does not compile"));
  }
  CHECK_THAT(message(llama3_style(), R"({"bos_token": "<nope>"})"), Catch::Contains("\"<nope>\""));
  CHECK_FALSE(parse_hf_tokenizer("{\"model\": "));
  CHECK_FALSE(parse_hf_tokenizer("[1, 2]"));
  CHECK(parse_hf_tokenizer(std::string(100000, '[')).error().code == error_code::limit_exceeded);
  j = llama3_style();
  j["model"]["vocab"][std::string(2000, 'x')] = 262;
  CHECK_THAT(message(j), Catch::Contains("bytes long"));
}

TEST_CASE("vocabulary::validate names the offending token", "[tokenizer]") {
  vocabulary v;
  v.tokens = {"a", "b", "ab"};
  v.merges = {{"a", "b"}};
  CHECK(v.validate());
  v.tokens.push_back("a");
  auto r = v.validate();
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Catch::Contains("\"a\" appears twice"));
  v.tokens.pop_back();
  v.merges.push_back({"b", "c"});
  r = v.validate();
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Catch::Contains("\"c\""));
  v.merges.pop_back();
  v.merges.push_back({"b", "a"});
  r = v.validate();
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Catch::Contains("\"ba\""));
  v.merges.pop_back();
  v.eos_id = 3;
  CHECK_THAT(v.validate().error().message, Catch::Contains("EOS"));
  v.eos_id = 2;
  v.scores = {1.0f};
  CHECK_THAT(v.validate().error().message, Catch::Contains("scores"));
  v.scores.clear();
  v.add_bos = true;
  CHECK_FALSE(v.validate());
  v.add_bos = false;
  v.token_types = {1, 1, 9};
  CHECK_THAT(v.validate().error().message, Catch::Contains("unknown type"));
}

TEST_CASE("pre-tokenizer names: the known ones, and an error listing them", "[tokenizer]") {
  for (const char* name : {"gpt2", "llama-bpe", "qwen2", "smollm"}) {
    auto p = pre_tokenizer_patterns(name);
    REQUIRE(p);
    CHECK(pre_tokenizer::create(*p));
  }
  auto bad = pre_tokenizer_patterns("nonesuch");
  REQUIRE_FALSE(bad);
  CHECK_THAT(bad.error().message, Catch::Contains("llama-bpe"));
}

TEST_CASE("load_hf_tokenizer reads a directory and names a missing file", "[tokenizer]") {
  test::scratch_dir dir;
  auto missing = load_hf_tokenizer(dir.path);
  REQUIRE_FALSE(missing);
  CHECK(missing.error().code == error_code::io_error);
  CHECK_THAT(missing.error().message, Catch::Contains("tokenizer.json"));
  test::write_file(dir.path / "tokenizer.json", llama2_style().dump());
  test::write_file(dir.path / "tokenizer_config.json", R"({"chat_template": [{"name": "default", "template": "[INST]"}]})");
  auto ok = load_hf_tokenizer(dir.path);
  REQUIRE(ok);
  CHECK(ok->chat_template == "[INST]");
}
