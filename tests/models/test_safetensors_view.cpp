// Safetensors read in place: dtypes, shapes, metadata, overlapping ranges; hostile headers
// (every truncation point, bad lengths, offsets, shapes, dtypes) as errors naming the file and the
// tensor; sharded Hugging Face checkpoints with a missing shard or a lying index.
#include <catch2/catch.hpp>

#include "checkpoint_writer.hpp"
#include "models/safetensors_view.hpp"

using namespace mesh::models;
using namespace mesh::models::test;
using mesh::error_code;

namespace {

const std::string src = "model.safetensors";

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

safetensors_writer sample() {
  safetensors_writer w;
  w.add("w.f32", "F32", {2, 3}, f32_bytes({1, 2, 3, 4, 5, 6}));
  w.add("w.f16", "F16", {4}, f16_bytes({0.5f, 1, -1, 2}));
  w.add("w.bf16", "BF16", {1, 2}, bf16_bytes({3, 4}));
  w.add("scalar", "F32", {}, f32_bytes({7}));
  w.add("empty", "F32", {0, 5}, {});
  w.metadata = {{"format", "pt"}};
  return w;
}

mesh::error parse_error(const bytes& b) {
  auto v = safetensors_view::parse(b, src);
  REQUIRE_FALSE(v);
  return v.error();
}

}  // namespace

TEST_CASE("safetensors tensors are views of the file", "[models][safetensors]") {
  const bytes b = sample().build();
  auto v = safetensors_view::parse(b, src);
  REQUIRE(v);
  REQUIRE(v->tensors().size() == 5);
  CHECK(v->metadata().at("format") == "pt");
  const auto* f = v->find("w.f32");
  REQUIRE(f);
  CHECK(f->type == tensor_type::f32);
  CHECK(f->shape == std::vector<int64_t>{2, 3});
  CHECK(f->data.data() == b.data() + v->data_offset());
  CHECK(bytes(f->data.begin(), f->data.end()) == f32_bytes({1, 2, 3, 4, 5, 6}));
  CHECK(v->find("w.f16")->type == tensor_type::f16);
  CHECK(v->find("w.bf16")->type == tensor_type::bf16);
  CHECK(v->find("scalar")->shape.empty());
  CHECK(v->find("scalar")->data.size() == 4);
  CHECK(v->find("empty")->data.empty());
  CHECK(v->find("missing") == nullptr);
  CHECK(v->tensors().front().name == "empty");  // sorted by name
}

TEST_CASE("safetensors ranges may overlap or come in any order", "[models][safetensors]") {
  safetensors_writer w;
  w.add("a", "F32", {2}, f32_bytes({1, 2}));
  w.add("b", "F32", {1}, {});
  w.tensors[1].offsets = std::pair<uint64_t, uint64_t>{4, 8};  // inside a
  w.add("c", "F16", {2}, {});
  w.tensors[2].offsets = std::pair<uint64_t, uint64_t>{0, 4};
  const bytes b = w.build();
  auto v = safetensors_view::parse(b, src);
  REQUIRE(v);
  CHECK(v->find("b")->data.data() == v->find("a")->data.data() + 4);
}

TEST_CASE("every truncation of a safetensors file is an error naming the file", "[models][safetensors]") {
  const bytes b = sample().build();
  for (size_t n = 0; n < b.size(); ++n) {
    auto v = safetensors_view::parse(bytes(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(n)), src);
    INFO("prefix of " << n << " bytes");
    REQUIRE_FALSE(v);
    CHECK(v.error().message.rfind("model.safetensors: ", 0) == 0);
  }
}

TEST_CASE("safetensors header errors", "[models][safetensors]") {
  SECTION("lengths") {
    auto w = sample();
    w.length_override = uint64_t{1} << 40;
    CHECK(contains(parse_error(w.build()).message, "header length is 1099511627776 bytes, more than the format's limit"));
    w.length_override = 1000;
    CHECK(contains(parse_error(w.build()).message, "truncated: the header of 1000 bytes runs past the end of the file"));
    CHECK(contains(parse_error(bytes{1, 2, 3}).message, "truncated: 3 bytes"));
  }
  SECTION("not JSON") {
    auto w = sample();
    w.header_override = "{\"a\": ";
    CHECK(parse_error(w.build()).message == "model.safetensors: the header is not valid JSON");
    w.header_override = "[1, 2]";
    CHECK(contains(parse_error(w.build()).message, "not a JSON object"));
  }
  SECTION("an unsupported dtype names the tensor and the dtype") {
    auto w = sample();
    w.add("ids", "I64", {2}, bytes(16));
    const auto e = parse_error(w.build());
    CHECK(e.code == error_code::unsupported);
    CHECK(e.message == "model.safetensors: tensor \"ids\" has dtype \"I64\"; supported dtypes are F32, F16 and BF16");
  }
  SECTION("data offsets outside the buffer or not matching the shape") {
    auto w = sample();
    w.tensors[0].offsets = std::pair<uint64_t, uint64_t>{0, 4000};
    CHECK(contains(parse_error(w.build()).message, "tensor \"w.f32\" has data_offsets [0, 4000] outside the data buffer"));
    w.tensors[0].offsets = std::pair<uint64_t, uint64_t>{8, 4};
    CHECK(contains(parse_error(w.build()).message, "tensor \"w.f32\" has data_offsets [8, 4]"));
    auto s = sample();
    s.tensors[0].shape = {2, 4};
    CHECK(contains(parse_error(s.build()).message, "tensor \"w.f32\" (F32 [2, 4]) needs 32 bytes but its data_offsets span 24"));
    s.tensors[0].shape = {int64_t{1} << 40, int64_t{1} << 40};
    CHECK(contains(parse_error(s.build()).message, "needs more bytes but its data_offsets span 24"));
  }
  SECTION("malformed entries") {
    auto w = sample();
    w.header_override = R"({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}})";
    CHECK(contains(parse_error(w.build()).message, "tensor \"t\" has a shape entry that is not a non-negative integer"));
    w.header_override = R"({"t": {"dtype": "F32", "shape": [1]}})";
    CHECK(contains(parse_error(w.build()).message, "tensor \"t\" has no \"data_offsets\" pair"));
    w.header_override = R"({"t": {"shape": [1], "data_offsets": [0, 4]}})";
    CHECK(contains(parse_error(w.build()).message, "tensor \"t\" has no \"dtype\" string"));
    w.header_override = R"({"__metadata__": {"k": 1}})";
    CHECK(contains(parse_error(w.build()).message, "__metadata__ value \"k\" is not a string"));
    w.header_override = R"({"t": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})";
    CHECK_FALSE(safetensors_view::parse(w.build(), src));
  }
}

TEST_CASE("sharded Hugging Face safetensors map every shard once", "[models][safetensors]") {
  temp_dir dir;
  safetensors_writer a, b;
  a.add("x", "F32", {2}, f32_bytes({1, 2}));
  a.add("y", "F16", {1}, f16_bytes({3}));
  b.add("z", "BF16", {2}, bf16_bytes({4, 5}));
  write_file(dir / "model-00001-of-00002.safetensors", a.build());
  write_file(dir / "model-00002-of-00002.safetensors", b.build());
  const std::string index = R"({"metadata": {"total_size": 14}, "weight_map": {
      "x": "model-00001-of-00002.safetensors", "y": "model-00001-of-00002.safetensors",
      "z": "model-00002-of-00002.safetensors"}})";
  write_file(dir / "model.safetensors.index.json", index);

  SECTION("all shards") {
    auto s = safetensors_shards::open_index(dir / "model.safetensors.index.json");
    REQUIRE(s);
    CHECK(s->files().size() == 2);
    REQUIRE(s->find("z"));
    CHECK(s->find("z")->type == tensor_type::bf16);
    CHECK(s->find("x")->data.data() >= s->files()[0].bytes().data());
  }
  SECTION("a missing shard is named") {
    std::filesystem::remove(dir / "model-00002-of-00002.safetensors");
    auto s = safetensors_shards::open_index(dir / "model.safetensors.index.json");
    REQUIRE_FALSE(s);
    CHECK(s.error().code == error_code::not_found);
    CHECK(contains(s.error().message, "names shard \"model-00002-of-00002.safetensors\", which is missing"));
  }
  SECTION("an index that places a tensor in the wrong shard") {
    write_file(dir / "model.safetensors.index.json",
               std::string(R"({"weight_map": {"x": "model-00002-of-00002.safetensors", "z": "model-00002-of-00002.safetensors"}})"));
    auto s = safetensors_shards::open_index(dir / "model.safetensors.index.json");
    REQUIRE_FALSE(s);
    CHECK(contains(s.error().message, "places tensor \"x\" in \"model-00002-of-00002.safetensors\", which does not hold it"));
  }
  SECTION("a tensor in two shards") {
    write_file(dir / "model-00002-of-00002.safetensors", a.build());
    auto s = safetensors_shards::open_index(dir / "model.safetensors.index.json");
    REQUIRE_FALSE(s);
    CHECK(contains(s.error().message, "tensor \"x\" is in both"));
  }
  SECTION("shard names may not leave the directory") {
    auto i = parse_safetensors_index(R"({"weight_map": {"x": "../etc/passwd"}})", "index.json");
    REQUIRE_FALSE(i);
    CHECK(i.error().message == "index.json: weight_map entry \"x\" names \"../etc/passwd\", not a file beside the index");
    CHECK_FALSE(parse_safetensors_index(R"({"weight_map": {"x": "/abs"}})", "index.json"));
    CHECK_FALSE(parse_safetensors_index(R"({"weight_map": {"x": ".."}})", "index.json"));
    CHECK(parse_safetensors_index(R"({"nothing": 1})", "index.json").error().message == "index.json: has no \"weight_map\" object");
  }
}
