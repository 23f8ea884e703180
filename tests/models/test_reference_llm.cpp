// Every architecture against an independent reference: small random checkpoints of each (HF
// directories in f32, f16 and bf16; GGUF files in F32, F16, Q8_0, Q4_0, Q5_0, Q4_K, Q5_K and
// Q6_K) run through a session on the CPU executor (and on Vulkan/lavapipe for some), and
// ref_llm.py, written in PyTorch from the published equations, computes the same in float64 from
// the same files. Checked: the logits after every prompt token (one prefill batch), and 64 greedy
// tokens decoded one at a time through the KV cache, each step's logits included. Skipped with a
// warning without torch.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpu/executor.hpp"
#include "model_writer.hpp"
#include "models/checkpoint_tokenizer.hpp"
#include "models/generate.hpp"
#include "models/session.hpp"
#include "python_torch.hpp"
#include "run_command.hpp"

using namespace mesh;
using namespace mesh::models;
using namespace mesh::models::test;
using json = nlohmann::json;

namespace {

constexpr int greedy_tokens = 64;
// Every dtype computes in f32 once its weights are widened or dequantized, so one bound serves
// them all: the largest logit error over the largest reference logit (at least 1).
constexpr double logit_tolerance = 1e-4;
// With x quantized to 8 bits in the decode linears (the CPU executor's default where the CPU has
// AVX2): each x element is off by at most 1/254 of its block's largest |x|; through the small
// models' layers that measured 0.5e-2 to 3.3e-2 (Q6_K to Q8_0), and a wrong kernel gives O(1).
constexpr double int8_logit_tolerance = 0.1;

struct model_case {
  std::string label;
  std::filesystem::path path;
  bool batched = false;  ///< also decode it in slots of one session, batched (compare_batched)
};

const std::vector<int32_t> prompt = {256, 17, 104, 101, 108, 108, 111, 33, 290, 3, 77};

// Runs the reference on every case; empty when python is missing (the caller warns and passes).
std::vector<json> reference(const temp_dir& dir, const std::vector<model_case>& cases) {
  std::string why;
  const std::string python = mesh::test::python_with_torch(why);
  if (python.empty()) {
    WARN(why);
    return {};
  }
  json jobs = json::array();
  for (size_t i = 0; i < cases.size(); ++i)
    jobs.push_back({{"model", cases[i].path.string()}, {"tokens", prompt}, {"generate", greedy_tokens},
                    {"out", (dir / ("ref" + std::to_string(i) + ".json")).string()}});
  write_file(dir / "jobs.json", jobs.dump());
  const auto run = mesh::test::run_command(python + " " MESH_MODELS_TEST_DIR "/ref_llm.py " + (dir / "jobs.json").string());
  INFO(run.output);
  REQUIRE(run.status == 0);
  std::vector<json> out;
  for (size_t i = 0; i < cases.size(); ++i) {
    std::ifstream f(dir / ("ref" + std::to_string(i) + ".json"));
    out.push_back(json::parse(f));
  }
  return out;
}

// max |a - b| / max(1, max |b|) over one row.
double row_error(const float* ours, const std::vector<double>& ref) {
  double err = 0, scale = 1;
  for (size_t j = 0; j < ref.size(); ++j) {
    const double r = ref[j];
    err = std::max(err, std::abs(static_cast<double>(ours[j]) - r));
    scale = std::max(scale, std::abs(r));
  }
  return err / scale;
}

// Compares one checkpoint on one executor with its reference; returns the largest logit error.
double compare(gpu::executor& ex, const model_case& c, const json& ref) {
  INFO(c.label);
  auto ckpt = checkpoint::open(c.path);
  REQUIRE(ckpt);
  auto s = session::create(ex, *ckpt, {});
  INFO((s ? std::string() : s.error().message));
  REQUIRE(s);
  const int64_t vocab = s->config().vocab_size;
  const auto ref_logits = ref["logits"].get<std::vector<std::vector<double>>>();
  const auto ref_greedy_logits = ref["greedy_logits"].get<std::vector<std::vector<double>>>();
  const auto ref_greedy = ref["greedy"].get<std::vector<int32_t>>();
  double worst = 0;

  // The prompt in one batch, every row's logits.
  auto all = s->prefill_all_logits(prompt);
  REQUIRE(all);
  REQUIRE(all->size() == prompt.size() * static_cast<size_t>(vocab));
  for (size_t i = 0; i < prompt.size(); ++i) worst = std::max(worst, row_error(all->data() + i * vocab, ref_logits[i]));

  // Again from a fresh sequence: prefill (last row only), then greedy decoding through the cache.
  s->reset();
  auto logits = s->prefill(prompt);
  REQUIRE(logits);
  std::vector<int32_t> ours;
  for (int i = 0; i < greedy_tokens; ++i) {
    worst = std::max(worst, row_error(logits->data(), ref_greedy_logits[static_cast<size_t>(i)]));
    const auto next = static_cast<int32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin());
    ours.push_back(next);
    if (i + 1 < greedy_tokens) {
      logits = s->decode(next);
      REQUIRE(logits);
    }
  }
  CHECK(ours == ref_greedy);
  INFO("largest logit error " << worst);
  CHECK(worst <= logit_tolerance);
  const auto& st = s->stats();
  WARN(c.label << ": largest logit error " << worst << "; " << st.programs << " programs loaded in " << st.compile_seconds
               << " s, prefill " << st.prefill_seconds << " s, " << st.decode_tokens << " decode steps " << st.decode_seconds << " s");
  return worst;
}

// The CPU executor's default decode linears (x quantized to 8 bits, integer dot products where
// the CPU has AVX2) against the same reference: the prompt (11 rows: f32), then the reference's
// own greedy tokens fed back one at a time (so the sequence cannot diverge at a near tie), each
// step's logits within int8_logit_tolerance. Returns the largest logit error.
double compare_int8_decode(const model_case& c, const json& ref) {
  INFO(c.label << " with int8 decode linears");
  gpu::cpu_options o;
  o.threads = 2, o.int8_linear = 1;
  auto ex = gpu::make_cpu_executor(o);
  auto ckpt = checkpoint::open(c.path);
  REQUIRE(ckpt);
  auto s = session::create(*ex, *ckpt, {});
  REQUIRE(s);
  const auto ref_greedy_logits = ref["greedy_logits"].get<std::vector<std::vector<double>>>();
  const auto ref_greedy = ref["greedy"].get<std::vector<int32_t>>();
  auto logits = s->prefill(prompt);
  REQUIRE(logits);
  double worst = row_error(logits->data(), ref_greedy_logits[0]);
  for (size_t i = 0; i + 1 < ref_greedy.size(); ++i) {
    logits = s->decode(ref_greedy[i]);
    REQUIRE(logits);
    worst = std::max(worst, row_error(logits->data(), ref_greedy_logits[i + 1]));
  }
  INFO("largest logit error " << worst);
  CHECK(worst <= int8_logit_tolerance);
  return worst;
}

// Continuous batching against the same reference: one session of 3 slots, in which slot 1 holds
// another sequence (the prompt reversed, fed a token each step) while slots 0 and 2 decode the
// prompt greedily, slot 2 starting 3 steps after slot 0. Every decode step is one batch of the
// slots that have a token, at different positions. A row that read another slot's cache, the
// wrong position or the wrong cache rows would leave the reference.
void compare_batched(gpu::executor& ex, const model_case& c, const json& ref) {
  INFO(c.label << ", batched in 3 slots");
  auto ckpt = checkpoint::open(c.path);
  REQUIRE(ckpt);
  session_options o;
  o.slots = 3;
  o.prefix = "batched.";  // beside compare()'s session on the same executor
  auto s = session::create(ex, *ckpt, o);
  INFO((s ? std::string() : s.error().message));
  REQUIRE(s);
  const auto ref_greedy_logits = ref["greedy_logits"].get<std::vector<std::vector<double>>>();
  const auto ref_greedy = ref["greedy"].get<std::vector<int32_t>>();
  std::vector<int32_t> other(prompt.rbegin(), prompt.rend());
  REQUIRE(s->prefill(1, other));
  struct follower {
    int64_t slot;
    std::vector<float> logits;
    std::vector<int32_t> greedy;
  };
  std::vector<follower> followers = {{0, {}, {}}, {2, {}, {}}};
  auto first = s->prefill(0, prompt);
  REQUIRE(first);
  followers[0].logits = std::move(*first);
  double worst = 0;
  for (int round = 0; followers[1].greedy.size() < static_cast<size_t>(greedy_tokens); ++round) {
    if (round == 3) {
      auto l = s->prefill(2, prompt);
      REQUIRE(l);
      followers[1].logits = std::move(*l);
    }
    std::vector<slot_token> batch;
    std::vector<follower*> fed;
    for (auto& f : followers) {
      if (f.logits.empty() || f.greedy.size() == static_cast<size_t>(greedy_tokens)) continue;
      worst = std::max(worst, row_error(f.logits.data(), ref_greedy_logits[f.greedy.size()]));
      const auto next = static_cast<int32_t>(std::max_element(f.logits.begin(), f.logits.end()) - f.logits.begin());
      f.greedy.push_back(next);
      if (f.greedy.size() == static_cast<size_t>(greedy_tokens)) continue;
      batch.push_back({f.slot, next});
      fed.push_back(&f);
    }
    if (s->position(1) < s->context()) batch.push_back({1, static_cast<int32_t>(round % 50)});
    if (batch.empty()) break;
    auto out = s->decode(batch);
    INFO((out ? std::string() : out.error().message));
    REQUIRE(out);
    REQUIRE(out->size() == batch.size());
    for (size_t i = 0; i < fed.size(); ++i) fed[i]->logits = std::move((*out)[i]);
  }
  CHECK(followers[0].greedy == ref_greedy);
  CHECK(followers[1].greedy == ref_greedy);
  INFO("largest logit error " << worst);
  CHECK(worst <= logit_tolerance);
  CHECK(s->stats().decode_steps < s->stats().decode_tokens);  // steps served several slots
}

enum class backend { cpu, vulkan };

void run_cases(const temp_dir& dir, const std::vector<model_case>& cases, backend where = backend::cpu) {
  const auto refs = reference(dir, cases);
  if (refs.empty()) return;
  if (where == backend::cpu) {
    for (size_t i = 0; i < cases.size(); ++i) {
      // One executor per model (sessions name their parameters alike), x kept in f32: the model
      // within f32 rounding of the reference; then the default integer decode linears.
      gpu::cpu_options o;
      o.threads = 2, o.int8_linear = 0;
      auto cpu = gpu::make_cpu_executor(o);
      compare(*cpu, cases[i], refs[i]);
      if (cases[i].batched) compare_batched(*cpu, cases[i], refs[i]);
      compare_int8_decode(cases[i], refs[i]);
    }
    return;
  }
  // One Vulkan executor for the process, never destroyed: lavapipe stays loaded until exit, so
  // LeakSanitizer can name (and tests/lsan.supp suppress) what the driver keeps.
  gpu::vulkan_options options;
  options.cache_dir = "-";
  static auto* vk = new expected<std::unique_ptr<gpu::executor>>(gpu::make_vulkan_executor(options));
  if (!*vk) {
    WARN("no Vulkan device: " << vk->error().message);
    return;
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    const model_case on_vk{cases[i].label + " on " + (**vk)->info().name, cases[i].path, cases[i].batched};
    compare(***vk, on_vk, refs[i]);
    if (on_vk.batched) compare_batched(***vk, on_vk, refs[i]);
  }
}

model_spec llama_spec() {
  model_spec s;
  s.llama3_scaling = true;
  s.theta = 500000;
  return s;
}

// K-quant rows are 256 elements: a wider, one-layer Llama with tied embeddings.
model_spec wide_llama_spec() {
  model_spec s;
  s.hidden = 256;
  s.ffn = 256;
  s.heads = 8;
  s.kv_heads = 2;
  s.head_dim = 32;
  s.layers = 1;
  s.tied = true;
  return s;
}

model_spec qwen2_spec() {
  model_spec s;
  s.arch = architecture::qwen2;
  s.theta = 1000000;
  return s;
}

// Rows of 96 elements: 3 blocks of 32, not a multiple of 256, as Qwen2.5-0.5B's 896 (28 blocks)
// for which llama.cpp's Q4_K_M falls back to Q5_0. Q5_0 rows are then 66 bytes, so every other
// row starts in the middle of a 32-bit word.
model_spec narrow_qwen2_spec() {
  model_spec s = qwen2_spec();
  s.hidden = 96;
  return s;
}

model_spec qwen3_spec() {
  model_spec s;
  s.arch = architecture::qwen3;
  s.tied = true;
  s.head_dim = 32;  // wider than hidden / heads, as Qwen3's heads are
  s.eps = 1e-6;
  return s;
}

model_spec gpt2_spec() {
  model_spec s;
  s.arch = architecture::gpt2;
  s.kv_heads = s.heads;
  s.ffn = 256;
  return s;
}

void check_hf(const std::string& label, const model_spec& s, const std::string& dtype, backend where = backend::cpu,
              bool batched = false) {
  temp_dir dir;
  write_hf_model(dir / "hf", s, dtype);
  run_cases(dir, {{label + " HF " + dtype, dir / "hf", batched}}, where);
}

void check_gguf(const std::string& label, const model_spec& s, tensor_type t, backend where = backend::cpu,
                bool batched = false) {
  temp_dir dir;
  write_gguf_model(dir / "m.gguf", s, t);
  run_cases(dir, {{label + " GGUF " + to_string(t), dir / "m.gguf", batched}}, where);
}

}  // namespace

// One checkpoint per test case, so that each stays a few seconds under ASan.
TEST_CASE("llama (GQA, Llama 3 rope scaling) HF f32 matches the reference, alone and batched in slots", "[models][reference]") {
  check_hf("llama", llama_spec(), "F32", backend::cpu, /*batched=*/true);
}
TEST_CASE("llama HF f16 matches the reference", "[models][reference]") { check_hf("llama", llama_spec(), "F16"); }
TEST_CASE("llama HF bf16 matches the reference", "[models][reference]") { check_hf("llama", llama_spec(), "BF16"); }
TEST_CASE("llama GGUF F32 (normal rope order, rope_freqs) matches the reference", "[models][reference]") {
  check_gguf("llama", llama_spec(), tensor_type::f32);
}
TEST_CASE("llama GGUF F16 matches the reference", "[models][reference]") {
  check_gguf("llama", llama_spec(), tensor_type::f16);
}
TEST_CASE("llama GGUF Q8_0 matches the reference on the dequantized weights", "[models][reference]") {
  check_gguf("llama", llama_spec(), tensor_type::q8_0);
}
TEST_CASE("llama GGUF Q4_0 matches the reference on the dequantized weights", "[models][reference]") {
  check_gguf("llama", llama_spec(), tensor_type::q4_0);
}
TEST_CASE("llama GGUF Q4_K (tied embeddings) matches the reference on the dequantized weights", "[models][reference]") {
  check_gguf("llama", wide_llama_spec(), tensor_type::q4_k);
}
TEST_CASE("llama GGUF Q6_K (tied embeddings) matches the reference on the dequantized weights", "[models][reference]") {
  check_gguf("llama", wide_llama_spec(), tensor_type::q6_k);
}
TEST_CASE("llama GGUF Q5_K (tied embeddings) matches the reference on the dequantized weights", "[models][reference]") {
  check_gguf("llama", wide_llama_spec(), tensor_type::q5_k);
}
TEST_CASE("qwen2 (q/k/v biases) HF f32 matches the reference", "[models][reference]") {
  check_hf("qwen2", qwen2_spec(), "F32");
}
TEST_CASE("qwen2 GGUF Q8_0 matches the reference, alone and batched in slots", "[models][reference]") {
  check_gguf("qwen2", qwen2_spec(), tensor_type::q8_0, backend::cpu, /*batched=*/true);
}
TEST_CASE("qwen2 GGUF Q5_0 with hidden 96 (rows not of 256) matches the reference", "[models][reference]") {
  check_gguf("qwen2", narrow_qwen2_spec(), tensor_type::q5_0);
}
TEST_CASE("qwen3 (q/k norms, tied embeddings) HF bf16 matches the reference", "[models][reference]") {
  check_hf("qwen3", qwen3_spec(), "BF16");
}
TEST_CASE("qwen3 GGUF F16 matches the reference", "[models][reference]") {
  check_gguf("qwen3", qwen3_spec(), tensor_type::f16);
}
TEST_CASE("gpt2 (Conv1D layout, fused qkv, learned positions) HF f32 matches the reference, alone and batched in slots",
          "[models][reference]") {
  check_hf("gpt2", gpt2_spec(), "F32", backend::cpu, /*batched=*/true);
}
TEST_CASE("gpt2 GGUF Q8_0 matches the reference", "[models][reference]") {
  check_gguf("gpt2", gpt2_spec(), tensor_type::q8_0);
}
TEST_CASE("generate's logprobs are the reference's log-softmax at each greedy token, with its top 5", "[models][reference]") {
  temp_dir dir;
  write_gguf_model(dir / "m.gguf", llama_spec(), tensor_type::f32);
  const auto refs = reference(dir, {{"llama GGUF F32", dir / "m.gguf"}});
  if (refs.empty()) return;
  const json& ref = refs[0];
  auto ckpt = checkpoint::open(dir / "m.gguf");
  REQUIRE(ckpt);
  auto cpu = gpu::make_cpu_executor(2);
  auto s = session::create(*cpu, *ckpt, {});
  REQUIRE(s);
  auto vocab = load_tokenizer(*ckpt, s->config());
  REQUIRE(vocab);
  auto tok = tokenizer::create(vocab->vocab);
  REQUIRE(tok);
  generate_options o;
  o.max_tokens = greedy_tokens;
  o.stop_at_eos = false;
  o.logprobs = 5;
  auto g = generate(*s, *tok, prompt, o);
  REQUIRE(g);
  CHECK(g->tokens == ref["greedy"].get<std::vector<int32_t>>());
  // At max_tokens every token's entry is given out, in order.
  REQUIRE(g->logprobs.size() == static_cast<size_t>(greedy_tokens));
  const auto want = ref["greedy_logprobs"].get<std::vector<double>>();
  const auto want_top = ref["greedy_top"].get<std::vector<std::vector<std::pair<int32_t, double>>>>();
  for (size_t i = 0; i < g->logprobs.size(); ++i) {
    const auto& e = g->logprobs[i];
    INFO("token " << i);
    CHECK(e.id == g->tokens[i]);
    CHECK(std::abs(e.logprob - want[i]) <= logit_tolerance * std::max(1.0, std::abs(want[i])));
    REQUIRE(e.top.size() == 5);
    for (size_t k = 0; k < 5; ++k) {
      INFO("alternative " << k);
      CHECK(std::abs(e.top[k].second - want_top[i][k].second) <= logit_tolerance * std::max(1.0, std::abs(want_top[i][k].second)));
      // The same token, unless the reference's neighbours are too close to order in f32.
      const bool clear = (k == 0 || want_top[i][k - 1].second - want_top[i][k].second > 1e-3) &&
                         (k == 4 || want_top[i][k].second - want_top[i][k + 1].second > 1e-3);
      if (clear) CHECK(e.top[k].first == want_top[i][k].first);
    }
    if (i > 0) CHECK(e.text_offset >= g->logprobs[i - 1].text_offset);
  }
}

TEST_CASE("on Vulkan (lavapipe in CI): llama HF f16 matches the reference, alone and batched in slots", "[models][reference][gpu]") {
  model_spec s = llama_spec();
  s.layers = 1;  // lavapipe under ASan: ~0.1 s a decode step per layer
  check_hf("llama", s, "F16", backend::vulkan, /*batched=*/true);
}
TEST_CASE("on Vulkan (lavapipe in CI): qwen2 GGUF Q4_0 matches the reference, alone and batched in slots", "[models][reference][gpu]") {
  model_spec s = qwen2_spec();
  s.layers = 1;
  check_gguf("qwen2", s, tensor_type::q4_0, backend::vulkan, /*batched=*/true);
}
TEST_CASE("on Vulkan (lavapipe in CI): qwen2 GGUF Q5_0 with hidden 96 matches the reference", "[models][reference][gpu]") {
  model_spec s = narrow_qwen2_spec();
  s.layers = 1;
  check_gguf("qwen2", s, tensor_type::q5_0, backend::vulkan);
}
