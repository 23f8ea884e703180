// Checkpoints in the safetensors format: round trips (every dtype, rank 0, empty tensors,
// metadata), a file written by the reference Python library, and hostile files as errors.
#include <catch2/catch.hpp>

#include <filesystem>
#include <random>
#include <string>

#include "graph/safetensors.hpp"

using namespace mesh;

namespace {
checkpoint sample() {
  checkpoint c;
  c.tensors["w"] = tensor::from_values(dtype::f32, {2, 3}, {1, 2, 3, 4, 5, 6});
  c.tensors["h"] = tensor::from_values(dtype::f16, {2}, {0.5, -2});
  c.tensors["b"] = tensor::from_values(dtype::bf16, {1, 2}, {3, 4});
  c.tensors["i"] = tensor::from_ints({3}, {7, -8, 9});
  c.tensors["s"] = tensor::scalar(42.0);
  c.tensors["empty"] = tensor::zeros(dtype::f32, {0, 4});
  c.tensors["we\"ird\\name"] = tensor::scalar(1.0);
  c.metadata = {{"step", "120"}, {"format", "pt"}};
  return c;
}
}  // namespace

TEST_CASE("safetensors round trip", "[graph][safetensors]") {
  const auto c = sample();
  const auto bytes = encode_safetensors(c);
  auto back = decode_safetensors(bytes.data(), bytes.size());
  REQUIRE(back);
  CHECK(back->tensors == c.tensors);
  CHECK(back->metadata == c.metadata);
  const auto path = std::filesystem::temp_directory_path() / "mesh_test_checkpoint.safetensors";
  REQUIRE(save_safetensors(path, c));
  auto loaded = load_safetensors(path);
  REQUIRE(loaded);
  CHECK(loaded->tensors == c.tensors);
  std::filesystem::remove(path);
  CHECK_FALSE(load_safetensors(path));
}

TEST_CASE("a file as the Python safetensors library writes it", "[graph][safetensors]") {
  // safetensors.numpy.save({"a": np.array([[1, 2]], dtype=np.float32)}, metadata={"k": "v"})
  const std::string header = R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]}})";
  std::string padded = header;
  while (padded.size() % 8) padded += ' ';
  std::vector<uint8_t> bytes(8);
  bytes[0] = static_cast<uint8_t>(padded.size());
  bytes.insert(bytes.end(), padded.begin(), padded.end());
  const float values[2] = {1, 2};
  const auto* raw = reinterpret_cast<const uint8_t*>(values);
  bytes.insert(bytes.end(), raw, raw + 8);
  auto c = decode_safetensors(bytes.data(), bytes.size());
  REQUIRE(c);
  CHECK(c->tensors.at("a") == tensor::from_floats({1, 2}, {1, 2}));
  CHECK(c->metadata.at("k") == "v");
}

TEST_CASE("hostile safetensors files are errors", "[graph][safetensors]") {
  const auto bytes = encode_safetensors(sample());
  for (size_t n = 0; n < bytes.size(); ++n) CHECK_FALSE(decode_safetensors(bytes.data(), n));
  std::mt19937 rng(5);
  for (int i = 0; i < 3000; ++i) {
    auto b = bytes;
    b[rng() % b.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
    auto c = decode_safetensors(b.data(), b.size());  // an error, or a checkpoint that is consistent
    if (c)
      for (const auto& [name, t] : c->tensors) CHECK(t.check());
  }
  const auto with_header = [](const std::string& h) {
    std::vector<uint8_t> b(8);
    b[0] = static_cast<uint8_t>(h.size());
    b.insert(b.end(), h.begin(), h.end());
    return decode_safetensors(b.data(), b.size());
  };
  CHECK_THAT(with_header(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})").error().message, Catch::Contains("data_offsets"));
  CHECK_THAT(with_header(R"({"a":{"dtype":"F64","shape":[],"data_offsets":[0,0]}})").error().message, Catch::Contains("F64"));
  CHECK_THAT(with_header(R"({"a":{"dtype":"F32","shape":[99999999,99999999,99999999],"data_offsets":[0,0]}})").error().message, Catch::Contains("absurd"));
  CHECK_FALSE(with_header(R"({"a":{"dtype":"F32"}})"));
  CHECK_FALSE(with_header(R"({"a":)"));
  std::vector<uint8_t> huge(8, 0xff);
  CHECK_THAT(decode_safetensors(huge.data(), huge.size()).error().message, Catch::Contains("past the end"));
}
