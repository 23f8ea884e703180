// Pipeline stages (session_options::layers): chains of 2 and 3 stage sessions give the logits of
// the whole model (prefill in several chunks, then decode steps, then again after reset), each
// stage uploads only its tensors and counts its bytes as plan_costs does, and bad ranges and
// wrong inputs are errors that say so.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gpu/executor.hpp"
#include "graph/quant.hpp"
#include "model_writer.hpp"
#include "models/session.hpp"
#include "models/transformer.hpp"

using namespace mesh;
using namespace mesh::models;
using namespace mesh::models::test;

namespace {

// Chunks of 16 rows in buckets of at least 8: a 37-token prompt runs as 16 + 16 + 5.
session_options stage_options(layer_range layers, const std::string& prefix = {}) {
  session_options o;
  o.min_batch = 8;
  o.max_batch = 16;
  o.layers = layers;
  o.prefix = prefix;
  return o;
}

// max |a - b| / max(1, max |b|).
double relative_error(const std::vector<float>& ours, const std::vector<float>& whole) {
  REQUIRE(ours.size() == whole.size());
  double err = 0, scale = 1;
  for (size_t i = 0; i < whole.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(ours[i]) - whole[i]));
    scale = std::max(scale, std::abs(static_cast<double>(whole[i])));
  }
  return err / scale;
}

// The stages in order, each passing its output on: logits from the last.
std::vector<float> run_chain(std::vector<session>& chain, std::span<const int32_t> tokens) {
  expected<std::vector<float>> out = chain.front().forward(tokens);
  INFO((out ? std::string() : out.error().message));
  REQUIRE(out);
  for (size_t i = 1; i < chain.size(); ++i) {
    REQUIRE(out->size() == tokens.size() * static_cast<size_t>(chain[i].config().hidden_size));
    out = chain[i].forward(std::span<const float>(*out));
    INFO((out ? std::string() : out.error().message));
    REQUIRE(out);
  }
  return *out;
}

std::vector<int32_t> test_prompt(size_t n) {
  std::vector<int32_t> p;
  for (size_t i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((i * 37 + 11) % 300));
  return p;
}

// The chain cut at `cuts` (layers [0, c1), [c1, c2), ... [ck, layers)) against the whole model:
// a 37-token prompt, 5 greedy decode steps, then a 21-token prompt after reset. `make` gives
// each session its executor (one per stage, as on separate nodes; or one shared, with prefixes).
template <class make_executor>
double chain_error(const std::filesystem::path& model, const std::vector<int64_t>& cuts, make_executor make) {
  auto ckpt = checkpoint::open(model);
  REQUIRE(ckpt);
  auto whole = session::create(make("whole."), *ckpt, stage_options({}, "whole."));
  REQUIRE(whole);
  std::vector<session> chain;
  for (size_t i = 0; i <= cuts.size(); ++i) {
    const layer_range r{i == 0 ? 0 : cuts[i - 1], i == cuts.size() ? whole->config().n_layers : cuts[i]};
    const std::string prefix = "s" + std::to_string(i) + ".";
    auto s = session::create(make(prefix), *ckpt, stage_options(r, prefix));
    INFO((s ? std::string() : s.error().message));
    REQUIRE(s);
    chain.push_back(std::move(*s));
  }
  double worst = 0;
  for (const size_t prompt_size : {size_t{37}, size_t{21}}) {
    const auto prompt = test_prompt(prompt_size);
    auto expected_logits = whole->prefill(prompt);
    REQUIRE(expected_logits);
    worst = std::max(worst, relative_error(run_chain(chain, prompt), *expected_logits));
    for (int step = 0; step < 5; ++step) {
      const auto next = static_cast<int32_t>(std::max_element(expected_logits->begin(), expected_logits->end()) -
                                             expected_logits->begin());
      expected_logits = whole->decode(next);
      REQUIRE(expected_logits);
      worst = std::max(worst, relative_error(run_chain(chain, std::span<const int32_t>(&next, 1)), *expected_logits));
    }
    for (const auto& s : chain) CHECK(s.position() == whole->position());
    whole->reset();
    for (auto& s : chain) s.reset();
  }
  return worst;
}

// Each stage on its own CPU executor, as on its own node.
double cpu_chain_error(const std::filesystem::path& model, const std::vector<int64_t>& cuts) {
  std::vector<std::unique_ptr<gpu::executor>> executors;
  return chain_error(model, cuts, [&](const std::string&) -> gpu::executor& {
    executors.push_back(gpu::make_cpu_executor(1));
    return *executors.back();
  });
}

model_spec three_layers(architecture arch = architecture::llama) {
  model_spec s;
  s.arch = arch;
  s.layers = 3;
  if (arch == architecture::gpt2) s.kv_heads = s.heads;
  return s;
}

// K-quant rows are 256 elements; tied embeddings: the last stage needs the embedding as its head.
model_spec wide_tied_llama() {
  model_spec s = three_layers();
  s.hidden = 256;
  s.ffn = 256;
  s.heads = 8;
  s.head_dim = 32;
  s.tied = true;
  return s;
}

constexpr double tolerance = 1e-5;

void check_chains(const std::filesystem::path& model) {
  const double two = cpu_chain_error(model, {1});
  const double three = cpu_chain_error(model, {1, 2});
  WARN(model.filename().string() << ": largest relative logit error, 2 stages " << two << ", 3 stages " << three);
  CHECK(two <= tolerance);
  CHECK(three <= tolerance);
}

}  // namespace

TEST_CASE("stages: llama HF f32 in 2 and 3 stages gives the whole model's logits", "[models][stages]") {
  temp_dir dir;
  model_spec s = three_layers();
  s.llama3_scaling = true;
  write_hf_model(dir / "hf", s, "F32");
  check_chains(dir / "hf");
}

TEST_CASE("stages: llama GGUF Q8_0 in 2 and 3 stages gives the whole model's logits", "[models][stages]") {
  temp_dir dir;
  write_gguf_model(dir / "m.gguf", three_layers(), tensor_type::q8_0);
  check_chains(dir / "m.gguf");
}

TEST_CASE("stages: llama GGUF Q4_K with tied embeddings in 2 and 3 stages gives the whole model's logits",
          "[models][stages]") {
  temp_dir dir;
  write_gguf_model(dir / "m.gguf", wide_tied_llama(), tensor_type::q4_k);
  check_chains(dir / "m.gguf");
}

TEST_CASE("stages: qwen2 (q/k/v biases) HF f32 in 2 and 3 stages gives the whole model's logits",
          "[models][stages]") {
  temp_dir dir;
  write_hf_model(dir / "hf", three_layers(architecture::qwen2), "F32");
  check_chains(dir / "hf");
}

TEST_CASE("stages: gpt2 (learned positions, tied) HF f32 in 2 and 3 stages gives the whole model's logits",
          "[models][stages]") {
  temp_dir dir;
  write_hf_model(dir / "hf", three_layers(architecture::gpt2), "F32");
  check_chains(dir / "hf");
}

TEST_CASE("on Vulkan (lavapipe in CI): llama HF f16 in 2 stages on one executor gives the whole model's logits",
          "[models][stages][gpu]") {
  // One Vulkan executor for the process, never destroyed (see test_reference_llm.cpp); the
  // sessions share it through their prefixes.
  gpu::vulkan_options options;
  options.cache_dir = "-";
  static auto* vk = new expected<std::unique_ptr<gpu::executor>>(gpu::make_vulkan_executor(options));
  if (!*vk) {
    WARN("no Vulkan device: " << vk->error().message);
    return;
  }
  temp_dir dir;
  model_spec s;
  s.layers = 2;
  write_hf_model(dir / "hf", s, "F16");
  const double err = chain_error(dir / "hf", {1}, [&](const std::string&) -> gpu::executor& { return ***vk; });
  WARN("on " << (**vk)->info().name << ": largest relative logit error " << err);
  CHECK(err <= tolerance);
}

TEST_CASE("stages: each stage uploads only its tensors, and its bytes are plan_costs'", "[models][stages]") {
  temp_dir dir;
  write_gguf_model(dir / "m.gguf", wide_tied_llama(), tensor_type::q4_k);
  auto ckpt = checkpoint::open(dir / "m.gguf");
  REQUIRE(ckpt);
  auto config = read_model_config(*ckpt);
  REQUIRE(config);
  auto costs = plan_costs(*config, *ckpt, {}, 128);
  REQUIRE(costs);
  // By hand: Q4_K blocks are 256 values in 144 bytes. A layer: q, o, gate, up, down 256 x 256
  // (256 blocks each), k and v 64 x 256, two f32 norms of 256.
  CHECK(costs->layer_bytes == std::vector<int64_t>(3, 5 * 256 * 144 + 2 * 64 * 144 + 2 * 256 * 4));
  CHECK(costs->first_bytes == 300 * 144);              // the embedding, Q4_K
  CHECK(costs->last_bytes == 256 * 4 + 300 * 144);     // the final norm and the tied head
  CHECK(costs->shared_bytes == 300 * 144);
  CHECK(costs->kv_bytes_per_layer == 2 * 128 * 64 * 4);  // keys and values, f32, 2 heads of 32

  auto whole = model_weights::plan(*config, *ckpt);
  REQUIRE(whole);
  const auto top = tensor_names(*config);
  int64_t stage_total = 0;
  for (const layer_range r : {layer_range{0, 1}, layer_range{1, 2}, layer_range{2, 3}}) {
    INFO("layers " << to_string(r));
    auto cpu = gpu::make_cpu_executor(1);
    auto s = session::create(*cpu, *ckpt, stage_options(r));
    REQUIRE(s);
    CHECK(s->layers() == r);
    CHECK(s->weight_bytes() + s->kv_cache_bytes() == costs->stage_bytes(r));
    stage_total += s->weight_bytes();
    // Every tensor of the model: on this executor exactly when the stage needs it.
    for (const auto& w : whole->all()) {
      INFO(w.param);
      const bool embedding = w.param == "w." + top.token_embd;
      const bool needed = w.layer >= 0 ? r.first <= w.layer && w.layer < r.end
                                       : (embedding && r.takes_tokens()) || r.returns_logits(3);
      auto got = cpu->get_parameters({w.param});
      CHECK(static_cast<bool>(got) == needed);
      if (got) {  // as the device stores it: quantized blocks stay blocks
        CHECK(got->at(w.param).type == w.type);
        CHECK(static_cast<int64_t>(got->at(w.param).bytes.size()) == byte_size(w.type, w.dims));
      }
    }
    // KV caches come with the stage's programs, for its layers only.
    const std::vector<float> hidden(static_cast<size_t>(3 * config->hidden_size), 0.5f);
    const auto prompt = test_prompt(3);
    REQUIRE((r.takes_tokens() ? s->forward(prompt) : s->forward(std::span<const float>(hidden))));
    for (int64_t l = 0; l < 3; ++l) CHECK(static_cast<bool>(cpu->get_parameters({kv_cache_name("", l, false)})) == (l == r.first));
  }
  // The tied embedding is on the first stage and, as the head, on the last.
  CHECK(stage_total == whole->device_bytes() + costs->shared_bytes);
}

TEST_CASE("stages: a range the model lacks is an error naming it and the layer count", "[models][stages]") {
  temp_dir dir;
  write_gguf_model(dir / "m.gguf", three_layers(), tensor_type::f32);
  auto ckpt = checkpoint::open(dir / "m.gguf");
  REQUIRE(ckpt);
  auto cpu = gpu::make_cpu_executor(1);
  const std::vector<std::pair<layer_range, std::string>> bad = {
      {{2, 2}, "layers [2, 2) of a model with 3 layers: it holds no layer"},
      {{1, 5}, "layers [1, 5) of a model with 3 layers: it runs past the last layer"},
      {{3, 0, false}, "layers [3, 3) without the head of a model with 3 layers: it starts past the last layer"},
      {{4, 4}, "layers [4, 4) of a model with 3 layers: it starts past the last layer"},
      {{-1, 2}, "layers [-1, 2) of a model with 3 layers: the first layer is negative"}};
  for (const auto& [range, message] : bad) {
    auto s = session::create(*cpu, *ckpt, stage_options(range));
    REQUIRE_FALSE(s);
    CHECK(s.error().code == error_code::invalid_argument);
    CHECK(s.error().message == (dir / "m.gguf").string() + ": " + message);
  }
  auto config = read_model_config(*ckpt);
  REQUIRE(config);
  auto weights = model_weights::plan(*config, *ckpt);
  REQUIRE(weights);
  auto g = build_step_graph(*config, *weights, {1, 64, 64, false, {1, 4}, 1, false});
  REQUIRE_FALSE(g);
  CHECK(g.error().message == "step graph: layers [1, 4) of a model with 3 layers: it runs past the last layer");
}

TEST_CASE("stages: the wrong input for a stage is an error that changes nothing", "[models][stages]") {
  temp_dir dir;
  write_gguf_model(dir / "m.gguf", three_layers(), tensor_type::f32);
  auto ckpt = checkpoint::open(dir / "m.gguf");
  REQUIRE(ckpt);
  const std::string file = (dir / "m.gguf").string();
  auto cpu = gpu::make_cpu_executor(1);
  auto first = session::create(*cpu, *ckpt, stage_options({0, 1}, "a."));
  auto middle = session::create(*cpu, *ckpt, stage_options({1, 2}, "b."));
  auto whole = session::create(*cpu, *ckpt, stage_options({}, "c."));
  REQUIRE(first);
  REQUIRE(middle);
  REQUIRE(whole);
  CHECK(first->takes_tokens());
  CHECK_FALSE(first->returns_logits());
  CHECK_FALSE(middle->takes_tokens());
  CHECK_FALSE(middle->returns_logits());
  CHECK(whole->layers() == layer_range{0, 3});

  const auto prompt = test_prompt(4);
  const std::vector<float> rows(4 * 64, 0.25f);
  auto e = first->forward(std::span<const float>(rows));
  REQUIRE_FALSE(e);
  CHECK(e.error().message == file + ": layers [0, 1) of 3 take tokens, not hidden rows");
  e = middle->forward(prompt);
  REQUIRE_FALSE(e);
  CHECK(e.error().message == file + ": layers [1, 2) of 3 take the previous stage's hidden rows, not tokens");
  e = middle->forward(std::span<const float>(rows).subspan(0, 65));
  REQUIRE_FALSE(e);
  CHECK(e.error().message == file + ": 65 hidden values are not whole rows of 64");
  CHECK_FALSE(middle->forward(std::span<const float>()));
  e = first->prefill(prompt);
  REQUIRE_FALSE(e);
  CHECK(e.error().message == file + ": prefill needs the whole model; this session holds layers [0, 1) of 3 (use forward)");
  CHECK_FALSE(first->decode(5));
  CHECK_FALSE(first->prefill_all_logits(prompt));
  CHECK(first->position() == 0);
  CHECK(middle->position() == 0);

  // A stage before the last returns every real row, with or without all_logits.
  auto h = middle->forward(std::span<const float>(rows), true);
  REQUIRE(h);
  CHECK(h->size() == rows.size());
  CHECK(middle->position() == 4);
  // On the whole model, forward is prefill.
  auto a = whole->forward(prompt);
  whole->reset();
  auto b = whole->prefill(prompt);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(*a == *b);
}

namespace {

bool covered(const std::vector<file_span>& spans, uint64_t offset, uint64_t length) {
  return std::any_of(spans.begin(), spans.end(), [&](const file_span& s) { return s.offset <= offset && offset + length <= s.offset + s.length; });
}

/// Every tensor of `weights` lies in the ranges of its file.
void check_ranges_hold(const checkpoint& ckpt, const std::vector<std::vector<file_span>>& ranges, const model_weights& weights) {
  for (const auto& w : weights.all())
    for (const auto* src : w.sources) {
      auto at = ckpt.locate(src->data);
      REQUIRE(at);
      INFO(src->name);
      CHECK(covered(ranges.at(at->file), at->offset, src->data.size()));
    }
}

}  // namespace

TEST_CASE("stages: the bytes a stage reads are its files' headers and its own tensors' data", "[models][stages][ranges]") {
  temp_dir dir;
  model_spec s;
  s.layers = 4;
  write_gguf_model(dir / "m.gguf", s, tensor_type::q8_0);
  write_hf_model(dir / "hf", s, "F32", 3);
  for (const auto& path : {dir / "m.gguf", dir / "hf"}) {
    INFO(path);
    auto ckpt = checkpoint::open(path);
    REQUIRE(ckpt);
    auto config = read_model_config(*ckpt);
    REQUIRE(config);
    const auto files = ckpt->files();
    const auto headers = ckpt->header_bytes();
    REQUIRE(headers.size() == files.size());
    const layer_range front{0, 2}, back{2, 4, false};
    auto a = stage_file_ranges(*config, *ckpt, front);
    auto b = stage_file_ranges(*config, *ckpt, back);
    REQUIRE(a);
    REQUIRE(b);
    REQUIRE(a->size() == files.size());
    uint64_t total = 0, read_a = 0;
    for (size_t i = 0; i < files.size(); ++i) {
      total += std::filesystem::file_size(files[i]);
      CHECK(covered((*a)[i], 0, headers[i]));  // every file's header: opening it parses them all
      CHECK(covered((*b)[i], 0, headers[i]));
      for (const auto& r : (*a)[i]) {
        CHECK(r.offset + r.length <= std::filesystem::file_size(files[i]));
        read_a += r.length;
      }
    }
    // Each stage's tensors lie in its ranges; the front stage reads less than the files hold,
    // and none of the last layer's tensors.
    check_ranges_hold(*ckpt, *a, model_weights::plan(*config, *ckpt, {}, front).value());
    check_ranges_hold(*ckpt, *b, model_weights::plan(*config, *ckpt, {}, back).value());
    CHECK(read_a < total);
    const auto whole = model_weights::plan(*config, *ckpt).value();
    for (const auto& w : whole.all())
      if (w.layer == 3)
        for (const auto* src : w.sources) {
          auto at = ckpt->locate(src->data);
          REQUIRE(at);
          CHECK_FALSE(covered((*a)[at->file], at->offset, src->data.size()));
        }
  }
}
