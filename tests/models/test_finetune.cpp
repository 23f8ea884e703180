// Fine-tuning graphs against an independent reference: small random checkpoints of the Llama
// family and GPT-2 (Hugging Face directories and GGUF files, F16 and Q8_0; a GGUF Llama's q/k rows
// as llama.cpp's converter interleaved them, a GGUF GPT-2's projections [out, in]) built into
// training graphs (models/finetune.hpp), their loss and gradients run on the CPU executor, and
// ref_train.py, written in PyTorch from the published equations, computes the same loss and
// gradients by autograd in float64 from the same files. Skipped with a warning without torch.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpu/executor.hpp"
#include "graph/autodiff.hpp"
#include "graph/safetensors.hpp"
#include "graph/simplify.hpp"
#include "model_writer.hpp"
#include "models/finetune.hpp"
#include "models/peft.hpp"
#include "models/session.hpp"
#include "python_torch.hpp"
#include "run_command.hpp"

using namespace mesh;
using namespace mesh::models;
using namespace mesh::models::test;
using json = nlohmann::json;

namespace {

constexpr int64_t batch = 2, sequence = 12;

struct batch_data {
  std::vector<int32_t> tokens, targets;
  std::vector<float> mask;
};

batch_data random_batch(int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab - 1));
  batch_data d;
  for (int64_t i = 0; i < batch * sequence; ++i) {
    d.tokens.push_back(tok(rng));
    d.targets.push_back(tok(rng));
    d.mask.push_back(i % 5 == 1 ? 0.0f : 1.0f);  // some targets do not count
  }
  return d;
}

json rows_of(const std::vector<int32_t>& v) {
  json out = json::array();
  for (int64_t r = 0; r < batch; ++r)
    out.push_back(std::vector<int32_t>(v.begin() + r * sequence, v.begin() + (r + 1) * sequence));
  return out;
}

/// Loss and d loss / d p for every trainable parameter, on the CPU executor.
std::pair<double, tensor_map> run_gradients(const finetune_model& m, const batch_data& d) {
  std::vector<node_index> wrt;
  for (const auto& name : m.trainable)
    for (node_index i = 0; i < m.g.size(); ++i)
      if (m.g[i].op == op_kind::parameter && m.g[i].attrs.name == name) wrt.push_back(i);
  REQUIRE(wrt.size() == m.trainable.size());
  auto gg = grad(m.g, m.g.find_output("loss"), wrt);
  REQUIRE(gg);
  gg->g.outputs = {{"loss", m.g.find_output("loss")}};
  for (size_t i = 0; i < wrt.size(); ++i) gg->g.outputs.push_back({"grad." + m.trainable[i], gg->grads[i]});
  // x kept in f32 in the quantized base's linears (the default rounds it to 8 bits where the CPU
  // has AVX2): the loss and gradients within f32 rounding of the float64 reference.
  gpu::cpu_options o;
  o.threads = 2, o.int8_linear = 0;
  auto ex = gpu::make_cpu_executor(o);
  REQUIRE(ex->set_parameters(m.state));
  auto id = ex->load(simplify(gg->g));
  INFO((id ? "" : id.error().message));
  REQUIRE(id);
  tensor_map in{{"tokens", tensor::from_ints({batch, sequence}, d.tokens)},
                {"targets", tensor::from_ints({batch, sequence}, d.targets)},
                {"mask", tensor::from_floats({batch, sequence}, d.mask)}};
  auto out = ex->run(*id, in);
  INFO((out ? "" : out.error().message));
  REQUIRE(out);
  tensor_map grads;
  for (const auto& name : m.trainable) grads[name] = out->at("grad." + name);
  return {out->at("loss").at(0), grads};
}

struct ft_case {
  std::string label;
  std::filesystem::path model;
  int64_t lora_rank = 0;
  dtype compute = dtype::f32;  ///< the products' dtype (mixed precision)
};

/// Projections a layer that LoRA on every target of lora_target_names(a) adapts: 7 in the Llama
/// family (q, k, v, o, gate, up, down); GPT-2's c_attn, c_fc and c_proj, which names two.
size_t adapted_per_layer(architecture a) { return a == architecture::gpt2 ? 4 : 7; }

/// One case built and run here (loss, gradients), and its job for ref_train.py (`tag` names its
/// files in `dir`).
struct prepared_case {
  json job;
  std::pair<double, tensor_map> ours;
  size_t trainable = 0;
  size_t adapted_per_layer = 0;  ///< of the case's architecture
};

prepared_case prepare(const ft_case& c, const std::filesystem::path& dir, const std::string& tag, uint32_t seed) {
  auto ckpt = models::checkpoint::open(c.model);
  REQUIRE(ckpt);
  auto cfg = read_model_config(*ckpt);
  REQUIRE(cfg);
  finetune_options o;
  o.batch = batch;
  o.sequence = sequence;
  o.lora.rank = c.lora_rank;
  o.lora.alpha = 8;
  o.lora.targets = lora_target_names(cfg->arch);
  o.compute = c.compute;
  auto m = build_finetune_model(*cfg, *ckpt, o);
  INFO(c.label << ": " << (m ? "" : m.error().message));
  REQUIRE(m);
  prepared_case out;
  out.adapted_per_layer = adapted_per_layer(cfg->arch);
  json& job = out.job;
  job = {{"model", c.model.string()}, {"out", (dir / ("ref" + tag + ".json")).string()}};
  if (c.compute != dtype::f32) job["compute"] = to_string(c.compute);
  if (c.lora_rank > 0) {
    // B starts at zero, which would leave A without a gradient: start it random here, so that
    // both adapters' gradients are checked.
    std::mt19937 rng(7 + seed);
    std::normal_distribution<double> nd(0, 0.05);
    tensor_map adapters;
    for (auto& [name, t] : m->state)
      if (name.find(".lora_") != std::string::npos) {
        if (name.find(".lora_B.") != std::string::npos) {
          std::vector<float> v(static_cast<size_t>(t.size()));
          for (auto& x : v) x = static_cast<float>(nd(rng));
          t = tensor::from_floats(t.dims, v);
        }
        adapters[name] = t;
      }
    mesh::checkpoint f;
    f.tensors = adapters;
    REQUIRE(save_safetensors(dir / ("lora" + tag + ".safetensors"), f));
    job["lora"] = {{"rank", c.lora_rank}, {"alpha", 8}, {"tensors", (dir / ("lora" + tag + ".safetensors")).string()}};
  } else {
    job["lora"] = nullptr;
  }
  const auto d = random_batch(m->config.vocab_size, 11 + seed);
  job["tokens"] = rows_of(d.tokens);
  job["targets"] = rows_of(d.targets);
  json mask = json::array();
  for (int64_t r = 0; r < batch; ++r) mask.push_back(std::vector<float>(d.mask.begin() + r * sequence, d.mask.begin() + (r + 1) * sequence));
  job["mask"] = mask;
  out.ours = run_gradients(*m, d);
  out.trainable = m->trainable.size();
  return out;
}

/// Runs ref_train.py on `jobs` (REQUIREs success) and reads the result of each.
std::vector<json> reference(const std::string& python, const std::filesystem::path& dir, const std::vector<json>& jobs) {
  write_file(dir / "jobs.json", json(jobs).dump());
  const auto run = mesh::test::run_command(python + " " MESH_MODELS_TEST_DIR "/ref_train.py " + (dir / "jobs.json").string());
  INFO(run.output);
  REQUIRE(run.status == 0);
  std::vector<json> out;
  for (const auto& job : jobs) {
    std::ifstream f(job["out"].get<std::string>());
    out.push_back(json::parse(f));
  }
  return out;
}

/// The largest difference between `got` and the reference's gradient of `name`, and the largest
/// magnitude of that gradient.
std::pair<double, double> gradient_error(const json& ref, const std::string& name, const tensor& got_t) {
  const auto& grads = ref["grads"];
  REQUIRE(grads.contains(name));
  const auto want = grads[name].get<std::vector<double>>();
  const auto got = got_t.to_floats();
  REQUIRE(want.size() == got.size());
  double largest = 0, error = 0;
  for (size_t k = 0; k < want.size(); ++k) {
    largest = std::max(largest, std::abs(want[k]));
    error = std::max(error, std::abs(want[k] - static_cast<double>(got[k])));
  }
  return {error, largest};
}

}  // namespace

TEST_CASE("fine-tuning gradients match PyTorch autograd on the same checkpoint and batch", "[finetune]") {
  std::string why;
  const std::string python = mesh::test::python_with_torch(why);
  if (python.empty()) {
    WARN(why);
    return;
  }
  temp_dir dir;
  model_spec llama;  // grouped-query attention: 4 heads over 2 key/value heads
  write_hf_model(dir / "llama-f32", llama, "F32");
  model_spec qwen2 = llama;
  qwen2.arch = architecture::qwen2;
  qwen2.tied = true;
  write_hf_model(dir / "qwen2-f32", qwen2, "F32");
  model_spec qwen3 = llama;
  qwen3.arch = architecture::qwen3;
  write_hf_model(dir / "qwen3-bf16", qwen3, "BF16");
  write_gguf_model(dir / "llama-f16.gguf", llama, tensor_type::f16);
  write_gguf_model(dir / "llama-q8_0.gguf", llama, tensor_type::q8_0);
  model_spec gpt2 = llama;
  gpt2.arch = architecture::gpt2;
  gpt2.kv_heads = gpt2.heads;
  write_hf_model(dir / "gpt2-f32", gpt2, "F32");
  write_hf_model(dir / "gpt2-bf16", gpt2, "BF16");
  write_gguf_model(dir / "gpt2-f16.gguf", gpt2, tensor_type::f16);
  write_gguf_model(dir / "gpt2-q8_0.gguf", gpt2, tensor_type::q8_0);

  const std::vector<ft_case> cases = {
      {"HF llama f32, full", dir / "llama-f32", 0},
      {"HF qwen2 f32 (q/k/v biases, tied head), full", dir / "qwen2-f32", 0},
      {"HF qwen3 bf16 (q/k norms), LoRA r4 on every projection", dir / "qwen3-bf16", 4},
      {"GGUF llama F16 (interleaved q/k rows), LoRA r4 on every projection", dir / "llama-f16.gguf", 4},
      {"GGUF llama Q8_0 (a quantized base, frozen as its blocks), LoRA r4 on every projection", dir / "llama-q8_0.gguf", 4},
      {"HF gpt2 f32 (Conv1D weights [in, out], tied head), full", dir / "gpt2-f32", 0},
      {"HF gpt2 f32, LoRA r4 on c_attn, c_proj and c_fc", dir / "gpt2-f32", 4},
      {"HF gpt2 bf16 (frozen Conv1D weights widened as read), LoRA r4 on c_attn, c_proj and c_fc", dir / "gpt2-bf16", 4},
      {"GGUF gpt2 F16 (projections [out, in], trained transposed), full", dir / "gpt2-f16.gguf", 0},
      {"GGUF gpt2 Q8_0 (frozen as its blocks), LoRA r4 on c_attn, c_proj and c_fc", dir / "gpt2-q8_0.gguf", 4},
  };
  std::vector<json> jobs;
  std::vector<std::pair<double, tensor_map>> ours;
  for (size_t i = 0; i < cases.size(); ++i) {
    auto p = prepare(cases[i], dir.path(), std::to_string(i), static_cast<uint32_t>(i));
    jobs.push_back(p.job);
    ours.push_back(p.ours);
    // Full fine-tuning trains every tensor of the file; LoRA only the adapters.
    INFO(cases[i].label);
    if (cases[i].lora_rank == 0) CHECK(p.trainable == models::checkpoint::open(cases[i].model)->tensors().size());
    else CHECK(p.trainable == 2 * p.adapted_per_layer * static_cast<size_t>(llama.layers));
  }
  const auto refs = reference(python, dir.path(), jobs);

  for (size_t i = 0; i < cases.size(); ++i) {
    INFO(cases[i].label);
    const json& ref = refs[i];
    const double ref_loss = ref["loss"].get<double>();
    CHECK(std::abs(ours[i].first - ref_loss) <= 1e-5 * std::max(1.0, std::abs(ref_loss)));
    CHECK(ref["grads"].size() == ours[i].second.size());
    for (const auto& [name, t] : ours[i].second) {
      INFO(name);
      const auto [error, largest] = gradient_error(ref, name, t);
      // Relative to the tensor's largest gradient; a gradient that is all zeros in the reference
      // must be all zeros here.
      CHECK(error <= 1e-4 * std::max(largest, 1e-6));
      if (cases[i].lora_rank > 0) CHECK(largest > 0);  // every adapter tensor gets a gradient
    }
  }
}

TEST_CASE("mixed-precision fine-tuning rounds where PyTorch's half-precision reference rounds", "[finetune][mixed]") {
  std::string why;
  const std::string python = mesh::test::python_with_torch(why);
  if (python.empty()) {
    WARN(why);
    return;
  }
  temp_dir dir;
  model_spec llama;
  llama.layers = 1;
  write_hf_model(dir / "llama-f32", llama, "F32");
  model_spec qwen3 = llama;
  qwen3.arch = architecture::qwen3;
  write_hf_model(dir / "qwen3-bf16", qwen3, "BF16");
  write_gguf_model(dir / "llama-f16.gguf", llama, tensor_type::f16);
  model_spec gpt2 = llama;
  gpt2.arch = architecture::gpt2;
  gpt2.kv_heads = gpt2.heads;
  write_hf_model(dir / "gpt2-f32", gpt2, "F32");
  const std::vector<ft_case> cases = {
      {"HF llama f32, full, f16 products", dir / "llama-f32", 0, dtype::f16},
      {"HF gpt2 f32, full, bf16 products", dir / "gpt2-f32", 0, dtype::bf16},
      {"HF llama f32, full, bf16 products", dir / "llama-f32", 0, dtype::bf16},
      {"HF qwen3 bf16, LoRA r4, bf16 products", dir / "qwen3-bf16", 4, dtype::bf16},
      {"GGUF llama F16, LoRA r4, f16 products", dir / "llama-f16.gguf", 4, dtype::f16},
  };
  // Each case against the reference rounding the same way, and against the same reference in
  // float64 throughout (the job without "compute"). One layer: fewer roundings in a row (below).
  std::vector<json> jobs;
  std::vector<std::pair<double, tensor_map>> ours;
  for (size_t i = 0; i < cases.size(); ++i) {
    auto p = prepare(cases[i], dir.path(), std::to_string(i), static_cast<uint32_t>(i));
    jobs.push_back(p.job);
    json exact = p.job;
    exact.erase("compute");
    exact["out"] = (dir / ("exact" + std::to_string(i) + ".json")).string();
    jobs.push_back(exact);
    ours.push_back(p.ours);
  }
  const auto refs = reference(python, dir.path(), jobs);
  for (size_t i = 0; i < cases.size(); ++i) {
    INFO(cases[i].label);
    const json &mixed = refs[2 * i], &exact = refs[2 * i + 1];
    // Over every gradient entry of the case: the root of the summed squared differences over the
    // root of the summed squares of the reference (a flip of one rounding here and there moves
    // this little; a product left unrounded, or rounded where the reference does not, moves it
    // by the rounding of every entry).
    double d_mixed = 0, d_exact = 0, norm = 0;
    for (const auto& [name, t] : ours[i].second) {
      const auto got = t.to_doubles();
      const auto want = mixed["grads"][name].get<std::vector<double>>(), plain = exact["grads"][name].get<std::vector<double>>();
      REQUIRE(want.size() == got.size());
      for (size_t k = 0; k < got.size(); ++k) {
        d_mixed += (got[k] - want[k]) * (got[k] - want[k]);
        d_exact += (got[k] - plain[k]) * (got[k] - plain[k]);
        norm += want[k] * want[k];
      }
    }
    const double e_mixed = std::sqrt(d_mixed / norm), e_exact = std::sqrt(d_exact / norm);
    const double mixed_loss = mixed["loss"].get<double>(), exact_loss = exact["loss"].get<double>();
    WARN(cases[i].label << ": gradient error against the rounding reference " << e_mixed << ", against float64 " << e_exact
                        << "; loss " << ours[i].first << " (reference " << mixed_loss << ", float64 " << exact_loss << ")");
    // u: the compute dtype's unit roundoff. Two computations that round at the same places still
    // differ: where their f32 and float64 sums straddle a rounding boundary one value rounds the
    // other way, and the next roundings carry that on (a third of a layer's values by its end).
    // So: within 2u of the rounding reference; clearly nearer to it than to float64 (which
    // a graph rounding at other places, or not at all, would not be); and rounded at all.
    const double u = cases[i].compute == dtype::f16 ? 0x1p-11 : 0x1p-8;
    CHECK(e_mixed <= 2 * u);
    CHECK(e_mixed * 1.4 < e_exact);
    CHECK(e_exact >= u / 4);
    CHECK(std::abs(ours[i].first - mixed_loss) <= u * std::abs(mixed_loss));
  }
}

TEST_CASE("fine-tuning refuses what it cannot train, naming it", "[finetune]") {
  temp_dir dir;
  model_spec gpt2;
  gpt2.arch = architecture::gpt2;
  write_hf_model(dir / "gpt2", gpt2, "F32");
  model_spec llama;
  write_hf_model(dir / "llama", llama, "F32");
  auto g = models::checkpoint::open(dir / "gpt2");
  REQUIRE(g);
  auto gc = read_model_config(*g);
  REQUIRE(gc);
  finetune_options o;
  o.lora.rank = 4;
  auto r = build_finetune_model(*gc, *g, o);
  REQUIRE(r);
  CHECK(r->lora.targets == std::vector<std::string>{"c_attn"});  // PEFT's default for GPT-2
  o.lora.targets = {"c_attn", "q_proj"};
  r = build_finetune_model(*gc, *g, o);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Catch::Contains("unknown LoRA target \"q_proj\" for gpt2 (its projections: c_attn, c_proj, c_fc)"));

  auto l = models::checkpoint::open(dir / "llama");
  REQUIRE(l);
  auto lc = read_model_config(*l);
  REQUIRE(lc);
  o.lora.targets = {"q_proj", "qkv"};
  r = build_finetune_model(*lc, *l, o);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Catch::Contains("unknown LoRA target \"qkv\""));
  o.lora.targets = {};
  r = build_finetune_model(*lc, *l, o);
  REQUIRE(r);
  CHECK(r->lora.targets == std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj"});
  o = {};
  o.sequence = llama.context + 1;
  r = build_finetune_model(*lc, *l, o);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Catch::Contains("longer than the model's context"));
}

TEST_CASE("a LoRA adapter saved in PEFT's layout and merged at load gives the logits of the reference's merged weights",
          "[finetune][peft]") {
  std::string why;
  const std::string python = mesh::test::python_with_torch(why);
  if (python.empty()) {
    WARN(why);
    return;
  }
  temp_dir dir;
  model_spec llama;
  write_hf_model(dir / "llama-f32", llama, "F32");
  write_gguf_model(dir / "llama-f16.gguf", llama, tensor_type::f16);
  model_spec gpt2 = llama;
  gpt2.arch = architecture::gpt2;
  gpt2.kv_heads = gpt2.heads;
  write_hf_model(dir / "gpt2-f32", gpt2, "F32");
  write_gguf_model(dir / "gpt2-f16.gguf", gpt2, tensor_type::f16);
  const std::vector<int32_t> prompt = {256, 17, 104, 101, 108, 108, 111, 33, 290, 3, 77};
  json jobs = json::array();
  std::vector<std::vector<float>> ours;
  // GPT-2: a Hugging Face base stores its projections [in, out] (the delta goes in transposed), a
  // GGUF base [out, in].
  const std::vector<std::filesystem::path> bases = {dir / "llama-f32", dir / "llama-f16.gguf", dir / "gpt2-f32", dir / "gpt2-f16.gguf"};
  for (size_t i = 0; i < bases.size(); ++i) {
    INFO(bases[i]);
    auto ckpt = models::checkpoint::open(bases[i]);
    REQUIRE(ckpt);
    auto cfg = read_model_config(*ckpt);
    REQUIRE(cfg);
    finetune_options o;
    o.lora.rank = 4;
    o.lora.alpha = 8;
    o.lora.targets = lora_target_names(cfg->arch);
    const bool is_gpt2 = cfg->arch == architecture::gpt2;
    const size_t per_layer = adapted_per_layer(cfg->arch);
    auto m = build_finetune_model(*cfg, *ckpt, o);
    REQUIRE(m);
    // A trained adapter: B away from zero, so that the merge changes every target.
    std::mt19937 rng(5);
    std::normal_distribution<double> nd(0, 0.05);
    tensor_map state = m->state;
    for (const auto& name : m->trainable)
      if (name.find(".lora_B.") != std::string::npos) {
        std::vector<float> v(static_cast<size_t>(state[name].size()));
        for (auto& x : v) x = static_cast<float>(nd(rng));
        state[name] = tensor::from_floats(state[name].dims, v);
      }
    const auto adapter_dir = dir / ("adapter" + std::to_string(i));
    REQUIRE(save_lora_adapter(adapter_dir, *m, state, bases[i].string()));

    // What PEFT reads: its config keys and the tensors under base_model.model.<module>.
    std::ifstream cf(adapter_dir / "adapter_config.json");
    const json config = json::parse(cf);
    CHECK(config["peft_type"] == "LORA");
    CHECK(config["r"] == 4);
    CHECK(config["lora_alpha"] == 8);
    CHECK(config["fan_in_fan_out"] == is_gpt2);  // as PEFT sets it for GPT-2's Conv1D
    auto saved = load_safetensors(adapter_dir / "adapter_model.safetensors");
    REQUIRE(saved);
    CHECK(saved->tensors.size() == m->trainable.size());
    CHECK(saved->tensors.count(is_gpt2 ? "base_model.model.transformer.h.1.mlp.c_proj.lora_B.weight"
                                       : "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"));

    auto adapter = read_lora_adapter(adapter_dir);
    INFO((adapter ? "" : adapter.error().message));
    REQUIRE(adapter);
    CHECK(adapter->modules.size() == per_layer * static_cast<size_t>(llama.layers));
    auto base = models::checkpoint::open(bases[i]);
    REQUIRE(base);
    auto merged = merge_lora_adapter(*base, *cfg, *adapter);
    INFO((merged ? "" : merged.error().message));
    REQUIRE(merged);
    CHECK(base->replaced() == per_layer * static_cast<size_t>(llama.layers));
    auto ex = gpu::make_cpu_executor(2);
    auto s = session::create(*ex, *base, {});
    INFO((s ? "" : s.error().message));
    REQUIRE(s);
    auto logits = s->prefill_all_logits(prompt);
    REQUIRE(logits);
    ours.push_back(*logits);
    jobs.push_back({{"model", bases[i].string()}, {"tokens", prompt}, {"generate", 0}, {"adapter", adapter_dir.string()},
                    {"out", (dir / ("ref" + std::to_string(i) + ".json")).string()}});
  }
  write_file(dir / "jobs.json", jobs.dump());
  const auto run = mesh::test::run_command(python + " " MESH_MODELS_TEST_DIR "/ref_llm.py " + (dir / "jobs.json").string());
  INFO(run.output);
  REQUIRE(run.status == 0);
  for (size_t i = 0; i < bases.size(); ++i) {
    INFO(bases[i]);
    std::ifstream f(dir / ("ref" + std::to_string(i) + ".json"));
    const auto ref = json::parse(f)["logits"].get<std::vector<std::vector<double>>>();
    const size_t vocab = static_cast<size_t>(llama.vocab);
    REQUIRE(ours[i].size() == ref.size() * vocab);
    double worst = 0, scale = 1, moved = 0;
    for (size_t r = 0; r < ref.size(); ++r)
      for (size_t j = 0; j < vocab; ++j) {
        worst = std::max(worst, std::abs(ours[i][r * vocab + j] - ref[r][j]));
        scale = std::max(scale, std::abs(ref[r][j]));
      }
    // The merged model differs from the base: the base's logits are not what was compared.
    auto plain = models::checkpoint::open(bases[i]);
    REQUIRE(plain);
    auto ex = gpu::make_cpu_executor(2);
    auto s = session::create(*ex, *plain, {});
    REQUIRE(s);
    auto base_logits = s->prefill_all_logits(prompt);
    REQUIRE(base_logits);
    for (size_t k = 0; k < base_logits->size(); ++k) moved = std::max(moved, static_cast<double>(std::abs((*base_logits)[k] - ours[i][k])));
    WARN(bases[i].filename().string() << " + adapter: largest logit error " << worst / scale << "; the adapter moves logits by up to " << moved);
    CHECK(worst / scale <= 1e-4);
    CHECK(moved > 100 * worst);
  }
}

TEST_CASE("PEFT adapter configs meshnode cannot apply exactly are refused with the reason", "[finetune][peft]") {
  const auto parse = [](const std::string& text) { return parse_lora_config(text, "adapter_config.json"); };
  const std::string ok = R"({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"], "bias": "none"})";
  auto c = parse(ok);
  REQUIRE(c);
  CHECK(c->scale() == 2.0);
  c = parse(R"({"r": 4, "lora_alpha": 8, "use_rslora": true, "target_modules": ["q_proj"]})");
  REQUIRE(c);
  CHECK(c->scale() == 4.0);
  // GPT-2's, as PEFT writes it for Conv1D.
  c = parse(R"({"r": 4, "lora_alpha": 8, "fan_in_fan_out": true, "target_modules": ["c_attn", "c_proj", "c_fc"]})");
  REQUIRE(c);
  CHECK(c->targets == std::vector<std::string>{"c_attn", "c_proj", "c_fc"});
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"[1, 2]", "not a JSON object"},
      {R"({"peft_type": "IA3", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]})", "LORA"},
      {R"({"lora_alpha": 16, "target_modules": ["q_proj"]})", "\"r\""},
      {R"({"r": 0, "lora_alpha": 16, "target_modules": ["q_proj"]})", "out of range"},
      {R"({"r": 8, "target_modules": ["q_proj"]})", "lora_alpha"},
      {R"({"r": 8, "lora_alpha": 16, "use_dora": true, "target_modules": ["q_proj"]})", "DoRA"},
      {R"({"r": 8, "lora_alpha": 16, "rank_pattern": {"q_proj": 4}, "target_modules": ["q_proj"]})", "rank_pattern"},
      {R"({"r": 8, "lora_alpha": 16, "modules_to_save": ["lm_head"], "target_modules": ["q_proj"]})", "modules_to_save"},
      {R"({"r": 8, "lora_alpha": 16, "bias": "all", "target_modules": ["q_proj"]})", "biases"},
      {R"({"r": 8, "lora_alpha": 16, "target_modules": ".*proj"})", "regular expression"},
      {R"({"r": 8, "lora_alpha": 16, "target_modules": ["embed_tokens"]})", "embed_tokens"},
      {R"({"r": 8, "lora_alpha": 16, "target_modules": []})", "empty"},
      {R"({"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "x": [[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]})", "nested deeper than 16"},
      {std::string(R"({"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "x": ")") + std::string(size_t{1} << 20, 'a') + "\"}",
       "larger than"},
  };
  for (const auto& [text, reason] : refused) {
    INFO(text);
    auto r = parse(text);
    REQUIRE_FALSE(r);
    CHECK_THAT(r.error().message, Catch::Contains(reason));
    CHECK_THAT(r.error().message, Catch::StartsWith("adapter_config.json: "));
  }
}
