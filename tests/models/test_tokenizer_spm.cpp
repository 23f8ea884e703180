// SentencePiece-style encoding against sentencepiece itself: a BPE model with byte fallback is
// trained on a generated corpus (ref_spm.py), its pieces, scores and types become a vocabulary,
// and our ids and decoded text must equal sentencepiece's on many strings.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "models/tokenizer.hpp"
#include "test_tokenizer_support.hpp"
#include "test_tokenizer_text_samples.hpp"

using namespace mesh::models;
using json = nlohmann::json;

TEST_CASE("sentencepiece-style BPE matches sentencepiece", "[tokenizer]") {
  if (auto why = test::python_missing("sentencepiece")) {
    WARN("skipped: " << *why);
    return;
  }
  test::scratch_dir dir;
  // Characters of the samples that the corpus lacks (some emoji, rare CJK) exercise byte fallback.
  std::string corpus = test::training_corpus();
  test::write_file(dir.path / "corpus.txt", corpus);
  auto err = test::run_python("ref_spm.py", {"train", (dir.path / "corpus.txt").string(), "700", dir.path.string()});
  REQUIRE_FALSE(err);
  const json exported = json::parse(test::read_file(dir.path / "vocab.json"));
  vocabulary v;
  v.model = vocabulary::kind::sentencepiece;
  v.tokens = exported["pieces"].get<std::vector<std::string>>();
  v.scores = exported["scores"].get<std::vector<float>>();
  v.token_types = exported["types"].get<std::vector<int32_t>>();
  v.bos_id = exported["bos"].get<int32_t>();
  v.eos_id = exported["eos"].get<int32_t>();
  v.unk_id = exported["unk"].get<int32_t>();
  v.add_bos = true;
  auto tok = tokenizer::create(v);
  REQUIRE(tok);

  std::vector<std::string> texts;
  for (auto& t : test::sample_texts(false)) {
    if (!t.empty()) texts.push_back(t);  // sentencepiece encodes "" to nothing, without the prefix
  }
  texts.push_back("𝔘𝔫𝔨𝔫𝔬𝔴𝔫 🦀 ꙮ");
  test::write_file(dir.path / "strings.json", json(texts).dump());
  err = test::run_python("ref_spm.py", {"encode", dir.path.string(), (dir.path / "strings.json").string(),
                                        (dir.path / "out.json").string()});
  REQUIRE_FALSE(err);
  const json ref = json::parse(test::read_file(dir.path / "out.json"));
  REQUIRE(ref.size() == texts.size());
  size_t byte_fallbacks = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    INFO("text " << i << ": " << json(texts[i]).dump());
    auto ids = tok->encode(texts[i], {.add_special = false});
    REQUIRE(ids);
    CHECK(*ids == ref[i]["ids"].get<std::vector<int32_t>>());
    for (int32_t id : *ids) byte_fallbacks += v.type_of(id) == token_type::byte;
    auto text = tok->decode(*ids);
    REQUIRE(text);
    CHECK(*text == ref[i]["decoded"].get<std::string>());
    // With BOS in front the dummy-prefix space still goes, as llama.cpp and sentencepiece do.
    auto with_bos = tok->encode(texts[i]);
    REQUIRE(with_bos);
    CHECK(with_bos->front() == *v.bos_id);
    CHECK(*tok->decode(*with_bos) == ref[i]["decoded"].get<std::string>());
  }
  CHECK(byte_fallbacks > 0);
}

TEST_CASE("sentencepiece-style: a long text is encoded in bounded pieces with the same result", "[tokenizer]") {
  vocabulary v;
  v.model = vocabulary::kind::sentencepiece;
  v.tokens = {"<unk>", "<s>", "</s>", "▁", "a", "b", "▁a", "ab", "▁ab"};
  v.scores = {0, 0, 0, -1, -1, -1, -2, -3, -4};
  v.token_types = {2, 3, 3, 1, 1, 1, 1, 1, 1};
  v.unk_id = 0;
  auto tok = tokenizer::create(v);
  REQUIRE(tok);
  std::string text;
  while (text.size() < 300000) text += "ab ab  a ";
  auto ids = tok->encode(text, {.add_special = false});
  REQUIRE(ids);
  CHECK(*tok->decode(*ids) == text);
  // Every "ab" after a space is one piece, also across the cuts.
  size_t count = 0;
  for (int32_t id : *ids) count += id == 8;
  CHECK(count == 2 * (text.size() / 9));
}
