// The checkpoint view over GGUF files, safetensors files and Hugging Face directories: shapes in
// one order (GGUF's ne[] reversed), data where it lies in the mapping, require()'s errors, and
// which files open as what.
#include <catch2/catch.hpp>

#include "checkpoint_writer.hpp"
#include "models/checkpoint.hpp"

using namespace mesh::models;
using namespace mesh::models::test;
using mesh::error_code;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

gguf_writer small_gguf() {
  gguf_writer w;
  w.add_string("general.architecture", "llama");
  w.add_tensor("blk.0.attn_q.weight", tensor_type::q8_0, {64, 3}, random_bytes(3 * 68, 1));  // [out 3, in 64]
  w.add_tensor("token_embd.weight", tensor_type::f16, {8, 5}, random_bytes(80, 2));
  w.add_tensor("output_norm.weight", tensor_type::f32, {8}, f32_bytes({1, 1, 1, 1, 1, 1, 1, 1}));
  return w;
}

}  // namespace

TEST_CASE("a GGUF checkpoint shows shapes outermost first", "[models][checkpoint]") {
  temp_dir dir;
  const auto path = dir / "m.gguf";
  auto w = small_gguf();
  write_file(path, w.build());
  auto c = checkpoint::open(path);
  REQUIRE(c);
  CHECK(c->format() == checkpoint_format::gguf);
  REQUIRE(c->gguf());
  CHECK(*c->gguf()->get_string("general.architecture") == "llama");
  CHECK(c->tensors().size() == 3);
  const auto* q = c->find("blk.0.attn_q.weight");
  REQUIRE(q);
  CHECK(q->type == tensor_type::q8_0);
  CHECK(q->shape == std::vector<int64_t>{3, 64});
  CHECK(q->elements() == 192);
  CHECK(bytes(q->data.begin(), q->data.end()) == w.tensors()[0].data);
  CHECK(c->find("output_norm.weight")->shape == std::vector<int64_t>{8});
  CHECK(c->config_json().empty());

  // The checkpoint moves; the mapping and the views into it stay.
  const auto* before = q->data.data();
  checkpoint moved = std::move(*c);
  CHECK(moved.find("blk.0.attn_q.weight")->data.data() == before);
}

TEST_CASE("require names the checkpoint, the tensor and both shapes", "[models][checkpoint]") {
  temp_dir dir;
  const auto path = dir / "m.gguf";
  write_file(path, small_gguf().build());
  auto c = checkpoint::open(path);
  REQUIRE(c);
  auto ok = c->require("token_embd.weight", {5, 8});
  REQUIRE(ok);
  CHECK((*ok)->name == "token_embd.weight");
  auto bad = c->require("token_embd.weight", {8, 5});
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code == error_code::shape_mismatch);
  CHECK(bad.error().message == path.string() + ": tensor \"token_embd.weight\" has shape [5, 8], but the model needs [8, 5]");
  auto missing = c->require("output.weight", {5, 8});
  REQUIRE_FALSE(missing);
  CHECK(missing.error().code == error_code::not_found);
  CHECK(missing.error().message == path.string() + ": tensor \"output.weight\" is missing");
}

TEST_CASE("a safetensors file and a Hugging Face directory", "[models][checkpoint]") {
  temp_dir dir;
  safetensors_writer w;
  w.add("model.embed_tokens.weight", "BF16", {5, 8}, bf16_bytes(std::vector<float>(40, 1.0f)));
  w.add("model.norm.weight", "F32", {8}, f32_bytes(std::vector<float>(8, 1.0f)));
  w.metadata = {{"format", "pt"}};
  write_file(dir / "model.safetensors", w.build());

  auto file = checkpoint::open(dir / "model.safetensors");
  REQUIRE(file);
  CHECK(file->format() == checkpoint_format::safetensors);
  CHECK(file->find("model.embed_tokens.weight")->shape == std::vector<int64_t>{5, 8});
  CHECK(file->safetensors_metadata().at("format") == "pt");
  CHECK(file->gguf() == nullptr);

  SECTION("a directory needs config.json") {
    auto c = checkpoint::open(dir.path());
    REQUIRE_FALSE(c);
    CHECK(c.error().message == dir.path().string() + " is a directory without config.json (not a Hugging Face checkpoint)");
  }
  SECTION("config.json must be a JSON object") {
    write_file(dir / "config.json", std::string("[1]"));
    auto c = checkpoint::open(dir.path());
    REQUIRE_FALSE(c);
    CHECK(c.error().message == (dir / "config.json").string() + ": not a JSON object");
  }
  SECTION("single file directory") {
    write_file(dir / "config.json", std::string(R"({"model_type": "llama"})"));
    auto c = checkpoint::open(dir.path());
    REQUIRE(c);
    CHECK(c->format() == checkpoint_format::hf_directory);
    CHECK(c->config_json() == R"({"model_type": "llama"})");
    CHECK(c->tensors().size() == 2);
  }
  SECTION("sharded directory, the index preferred over model.safetensors") {
    write_file(dir / "config.json", std::string("{}"));
    safetensors_writer s;
    s.add("lm_head.weight", "F16", {5, 8}, f16_bytes(std::vector<float>(40, 0.5f)));
    write_file(dir / "model-00001-of-00001.safetensors", s.build());
    write_file(dir / "model.safetensors.index.json", std::string(R"({"weight_map": {"lm_head.weight": "model-00001-of-00001.safetensors"}})"));
    auto c = checkpoint::open(dir.path());
    REQUIRE(c);
    CHECK(c->tensors().size() == 1);
    CHECK(c->find("lm_head.weight"));
  }
  SECTION("a directory without weights") {
    std::filesystem::remove(dir / "model.safetensors");
    write_file(dir / "config.json", std::string("{}"));
    auto c = checkpoint::open(dir.path());
    REQUIRE_FALSE(c);
    CHECK(contains(c.error().message, "holds neither model.safetensors.index.json nor model.safetensors"));
  }
}

TEST_CASE("files open by their content and errors name the path", "[models][checkpoint]") {
  temp_dir dir;
  write_file(dir / "renamed.bin", small_gguf().build());
  auto g = checkpoint::open(dir / "renamed.bin");
  REQUIRE(g);
  CHECK(g->format() == checkpoint_format::gguf);

  write_file(dir / "junk.gguf", std::string("definitely not a checkpoint"));
  auto j = checkpoint::open(dir / "junk.gguf");
  REQUIRE_FALSE(j);
  CHECK(j.error().message == (dir / "junk.gguf").string() + ": not a GGUF file (it starts with \"defi\", not \"GGUF\")");

  write_file(dir / "junk.bin", std::string("definitely not a checkpoint"));
  CHECK(contains(checkpoint::open(dir / "junk.bin").error().message, "neither a GGUF file"));

  auto none = checkpoint::open(dir / "absent.gguf");
  REQUIRE_FALSE(none);
  CHECK(none.error().code == error_code::io_error);
  CHECK(none.error().message == "cannot open " + (dir / "absent.gguf").string() + ": No such file or directory");

  write_file(dir / "empty.gguf", bytes{});
  CHECK(contains(checkpoint::open(dir / "empty.gguf").error().message, "not a GGUF file"));
}
