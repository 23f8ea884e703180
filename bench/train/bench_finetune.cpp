// mesh-bench-finetune: fine-tuning throughput of a Llama-shape checkpoint through the mesh, on 1
// node and on n (one meshnode process per device on this host, loopback), the model built by
// models/finetune.hpp from a random Hugging Face checkpoint this program writes. Weak scaling:
// each node takes `--micro` micro-batches of `--batch` x `--sequence` tokens per step.
// Scaling efficiency = tokens/s on n nodes / (n x tokens/s on 1 node).
//
// MESH_BENCH_KEEP=DIR copies each node's log (with MESH_TRAIN_TIMING=1: where its steps' time
// goes) into DIR.
//   mesh-bench-finetune [--nodes 1,2] [--device-prefix "#"] [--steps 8] [--hidden 768] [--layers 12]
//                       [--heads 12] [--kv-heads 4] [--ffn 2048] [--vocab 16384] [--batch 4]
//                       [--sequence 256] [--micro 1] [--lora-rank 0] [--compression f32] [--meshnode PATH]
//                       [--bucket-mb 25] [--profile "#0"]
// --bucket-mb: the all-reduce's buckets (train_options::bucket_bytes, in MiB; 0: one all-reduce
// after the whole backward pass).
// --profile DEVICE: instead, the step's gradient program on that Vulkan device in this process,
// its kernels by time (where a step's time goes); then, with --bucket-mb above 0, the same
// program cut into segments as a data-parallel worker runs it (each segment's time, the values
// saved between segments by op, the largest kernels).
//
// bench/train/finetune_reference.py runs the same model, shapes and optimizer in PyTorch (eager,
// and DistributedDataParallel over NCCL with --ranks) for the anchor in the same run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "actors/train_buckets.hpp"
#include "bench/bench_mesh.hpp"
#include "bench/train/random_llama.hpp"
#include "client/trainer.hpp"
#include "gpu/executor.hpp"
#include "graph/autodiff.hpp"
#include "graph/simplify.hpp"
#include "graph/safetensors.hpp"
#include "models/checkpoint.hpp"
#include "models/finetune.hpp"
#include "models/model_config.hpp"

using namespace mesh;
namespace fs = std::filesystem;

namespace {

struct settings {
  std::vector<int> nodes = {1};
  int steps = 8;
  int64_t hidden = 768, layers = 12, heads = 12, kv_heads = 4, ffn = 2048, vocab = 16384;
  int64_t batch = 4, sequence = 256, micro = 1, lora_rank = 0;
  std::string device_prefix = "#", meshnode;
  std::string profile;  ///< a Vulkan device ("#0"): time the gradient program's kernels there, in this process
  wire_format compression = wire_format::f32;
  int64_t bucket_mb = 25;
  dtype precision = dtype::f32;  ///< the products' dtype (f16: with dynamic loss scaling)
};

/// The random checkpoint of the settings' shape (random_llama.hpp).
void write_checkpoint(const fs::path& dir, const settings& s) {
  const bench::llama_shape shape{s.hidden, s.layers, s.heads, s.kv_heads, s.ffn, s.vocab, std::max<int64_t>(s.sequence, 2048)};
  if (auto ok = bench::write_random_llama(dir, shape); !ok) {
    std::fprintf(stderr, "writing the checkpoint: %s\n", ok.error().message.c_str());
    std::exit(1);
  }
}

struct measured {
  double tokens_per_s = 0, step_ms = 0, mb_per_step = 0, first_step_s = 0;
  double median_step_ms = 0;  ///< of steps 3 .. last, each alone: a step with a one-time cost counts once
};

expected<measured> run(const settings& s, const models::finetune_model& m, int n, const fs::path& dir) {
  // "#" numbers the GPUs (node i on "#i"); anything else ("cpu", a device name) is every node's.
  auto mesh = bench::start_training_mesh(s.meshnode, dir, "n" + std::to_string(n) + "-", n, [&](int i) {
    return s.device_prefix == "#" ? "#" + std::to_string(i) : s.device_prefix;
  });
  if (!mesh) return tl::unexpected(mesh.error());
  auto& c = mesh->first;
  // Random tokens: throughput does not depend on what is learnt.
  const int64_t rows = s.batch * s.micro * n * 2, t = s.sequence;
  std::mt19937 rng(2);
  std::vector<int32_t> tokens(static_cast<size_t>(rows * t)), targets(tokens.size());
  for (auto& v : tokens) v = static_cast<int32_t>(rng() % static_cast<uint32_t>(s.vocab));
  for (auto& v : targets) v = static_cast<int32_t>(rng() % static_cast<uint32_t>(s.vocab));
  const tensor_map data{{"tokens", tensor::from_ints({rows, t}, tokens)},
                        {"targets", tensor::from_ints({rows, t}, targets)},
                        {"mask", tensor::from_floats({rows, t}, std::vector<float>(tokens.size(), 1.0f))}};
  train_options o;
  o.steps = static_cast<uint64_t>(s.steps);
  o.micro_batches = static_cast<uint32_t>(s.micro * n);
  o.optimizer = optim::adam_options{.lr = 1e-5};
  o.compression = s.compression;
  o.bucket_bytes = static_cast<uint64_t>(s.bucket_mb) << 20;
  o.trainable = m.trainable;
  if (s.precision == dtype::f16) o.loss_scale = optim::loss_scaling{};
  // Step 1 includes the setup (the state's upload), compiling and the first step; the timing
  // runs from step 2's progress report to the last step's.
  const auto t0 = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point t1{}, t2{}, t_last{};
  std::vector<std::chrono::steady_clock::time_point> reports;  // of steps 2 .. last
  uint64_t bytes = 0;
  auto r = trainer(*c, m.g, m.state, data, o).fit([&](const train_progress_info& p) {
    if (p.step >= 2) reports.push_back(std::chrono::steady_clock::now());
    if (p.step == 1) t1 = std::chrono::steady_clock::now();
    if (p.step == 2) t2 = std::chrono::steady_clock::now();
    if (p.step == p.steps) t_last = std::chrono::steady_clock::now();
    if (p.step > 2) bytes += p.bytes_sent;
    std::fprintf(stderr, "  n=%d step %llu loss %.4f peers %u\n", n, static_cast<unsigned long long>(p.step), p.loss, p.peers);
  });
  if (!r) return tl::unexpected(r.error());
  // Steps 3 .. last, each from the previous step's progress to its own; not the result's
  // transfer after the last (the whole state, parameters and optimizer, to the client).
  const double secs = std::chrono::duration<double>(t_last - t2).count();
  const int timed = s.steps - 2;
  measured out;
  out.tokens_per_s = static_cast<double>(timed) * static_cast<double>(o.micro_batches * s.batch * s.sequence) / secs;
  out.step_ms = 1000 * secs / timed;
  out.mb_per_step = static_cast<double>(bytes) / timed / 1e6;
  out.first_step_s = std::chrono::duration<double>(t1 - t0).count();
  std::vector<double> each;
  for (size_t k = 1; k < reports.size(); ++k) each.push_back(1000 * std::chrono::duration<double>(reports[k] - reports[k - 1]).count());
  if (!each.empty()) {
    std::sort(each.begin(), each.end());
    out.median_step_ms = each[each.size() / 2];
  }
  c.reset();
  mesh->nodes.clear();
  if (const char* v = std::getenv("MESH_TRAIN_TIMING"); v && std::string(v) == "1") {
    // The coordinating node's device work per step (actors/train_worker.cpp step_timer).
    std::ifstream log(dir / ("n" + std::to_string(n) + "-0") / "node.log");
    std::vector<std::string> lines;
    for (std::string line; std::getline(log, line);)
      if (line.find("train timing") != std::string::npos) lines.push_back(line);
    for (size_t i = lines.size() > 48 ? lines.size() - 48 : 0; i < lines.size(); ++i) std::fprintf(stderr, "  n=%d %s\n", n, lines[i].c_str());
  }
  return out;
}

/// The kernels that take the most of `kernels` (each a list of medians over runs): up to `top`.
void print_largest(const std::vector<gpu::kernel_timing>& kernels, std::vector<std::vector<double>>& per_kernel, size_t top) {
  std::vector<std::pair<double, size_t>> order;
  for (size_t k = 0; k < kernels.size(); ++k) {
    auto& v = per_kernel[k];
    std::sort(v.begin(), v.end());
    order.emplace_back(v[v.size() / 2], k);
  }
  std::sort(order.rbegin(), order.rend());
  for (size_t i = 0; i < std::min(order.size(), top); ++i) {
    const auto& k = kernels[order[i].second];
    std::printf("  %-28s %9.3f ms %10.1f MB %10.2f GFLOP\n", k.name.c_str(), order[i].first, static_cast<double>(k.bytes) / 1e6, k.flops / 1e9);
  }
}

/// `whole` (the gradient program into the accumulators `acc`, whose values are the nodes
/// `values`) cut as a data-parallel worker cuts it (buckets of `bucket_bytes`, one segment each:
/// train_buckets.hpp), run segment after segment as a worker runs a step's last micro-batch:
/// each segment's wall time and kernel time, the values saved between segments by their op, and
/// the kernels that take the most. Compare with the whole program's figures printed before.
int profile_segments(gpu::executor& ex, const graph& whole, const std::vector<std::string>& acc, const std::vector<node_index>& values,
                     uint64_t bucket_bytes, const tensor_map& in) {
  graph named = whole;  // the gradients as outputs, for order_into_buckets
  std::vector<std::string> grads;
  std::vector<int64_t> sizes;
  std::vector<shape> dims;
  for (size_t i = 0; i < acc.size(); ++i) {
    named.outputs.push_back({acc[i], values[i]});
    grads.push_back(acc[i]);
    sizes.push_back(element_count(whole[values[i]].dims));
    dims.push_back(whole[values[i]].dims);
  }
  const auto ends = order_into_buckets(named, grads, sizes, dims, bucket_bytes, 64);
  std::vector<std::vector<std::string>> groups;
  for (size_t b = 0; b < ends.size(); ++b) groups.emplace_back(grads.begin() + static_cast<ptrdiff_t>(b ? ends[b - 1] : 0), grads.begin() + static_cast<ptrdiff_t>(ends[b]));
  auto cut = segment_by_updates(whole, groups, "seg.");
  if (!cut) return std::fprintf(stderr, "segments: %s\n", cut.error().message.c_str()), 1;
  // The values saved between segments, by the op that makes them.
  std::map<std::string, std::pair<int, double>> by_op;
  double saved_mb = 0;
  for (const auto& [name, t] : cut->saved) {
    const auto id = static_cast<node_index>(std::stoll(name.substr(std::string("seg.x.").size())));
    auto& e = by_op[std::string(to_string(whole[id].op))];
    e.first += 1;
    e.second += static_cast<double>(t.bytes.size()) / 1e6;
    saved_mb += static_cast<double>(t.bytes.size()) / 1e6;
  }
  std::printf("\nthe same program in %zu segments (buckets of %llu MiB): %zu values saved between them, %.1f MB; by op:\n", cut->segments.size(),
              static_cast<unsigned long long>(bucket_bytes >> 20), cut->saved.size(), saved_mb);
  for (const auto& [op, e] : by_op) std::printf("  %-16s %5d values %10.1f MB\n", op.c_str(), e.first, e.second);
  if (auto ok = ex.set_parameters(cut->saved); !ok) return std::fprintf(stderr, "%s\n", ok.error().message.c_str()), 1;
  std::vector<gpu::program_id> ids;
  for (const auto& g : cut->segments) {
    auto id = ex.load(g);
    if (!id) return std::fprintf(stderr, "load a segment: %s\n", id.error().message.c_str()), 1;
    ids.push_back(*id);
  }
  std::vector<std::vector<double>> wall(ids.size()), busy(ids.size()), per_kernel;
  std::vector<size_t> count(ids.size());
  std::vector<gpu::kernel_timing> kernels;
  std::vector<double> totals;
  for (int i = 0; i < 6; ++i) {
    std::vector<gpu::kernel_timing> run_kernels;
    const auto r0 = std::chrono::steady_clock::now();
    for (size_t k = 0; k < ids.size(); ++k) {
      tensor_map part;
      for (const auto& name : cut->inputs[k]) part[name] = in.at(name);
      const auto t0 = std::chrono::steady_clock::now();
      if (auto ok = ex.run(ids[k], part); !ok) return std::fprintf(stderr, "run a segment: %s\n", ok.error().message.c_str()), 1;
      const auto st = ex.stats();
      double sum = 0;
      for (const auto& kt : st.kernels) sum += kt.last_ms;
      if (i == 0) continue;  // warm-up
      wall[k].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      busy[k].push_back(sum);
      count[k] = st.kernels.size();
      run_kernels.insert(run_kernels.end(), st.kernels.begin(), st.kernels.end());
    }
    if (i == 0) continue;
    totals.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - r0).count());
    kernels = run_kernels;
    per_kernel.resize(kernels.size());
    for (size_t k = 0; k < kernels.size(); ++k) per_kernel[k].push_back(kernels[k].last_ms);
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  double busy_all = 0;
  for (size_t k = 0; k < ids.size(); ++k) {
    std::printf("  segment %2zu: %7.2f ms wall, %7.2f ms in %zu kernels\n", k, median(wall[k]), median(busy[k]), count[k]);
    busy_all += median(busy[k]);
  }
  std::printf("segments: %.1f ms a run (wall, median), kernels %.1f ms in all, %zu kernels; the largest:\n", median(totals), busy_all,
              kernels.size());
  print_largest(kernels, per_kernel, 12);
  return 0;
}

/// The step's gradient program as a worker runs it (gradients into resident accumulators), on a
/// Vulkan executor in this process: the kernels that take the time, median of 5 runs; with
/// `--bucket-mb` above 0, then the same program cut into segments as a data-parallel worker runs it.
int profile(const settings& s, const models::finetune_model& m) {
  gpu::vulkan_options vo;
  vo.device = s.profile;
  auto ex = gpu::make_vulkan_executor(vo);
  if (!ex) return std::fprintf(stderr, "vulkan: %s\n", ex.error().message.c_str()), 1;
  std::vector<node_index> wrt;
  for (const auto& name : m.trainable)
    for (node_index i = 0; i < m.g.size(); ++i)
      if (m.g[i].op == op_kind::parameter && m.g[i].attrs.name == name) wrt.push_back(i);
  auto gg = grad(m.g, m.g.find_output("loss"), wrt);
  if (!gg) return std::fprintf(stderr, "grad: %s\n", gg.error().message.c_str()), 1;
  builder b(gg->g);
  for (size_t i = 0; i < wrt.size(); ++i) {
    const expr g = b.at(gg->grads[i]);
    b.update(b.parameter("acc." + m.trainable[i], dtype::f32, g.dims()), g);
  }
  auto done = b.finish();
  if (!done) return std::fprintf(stderr, "%s\n", done.error().message.c_str()), 1;
  done->outputs = {{"loss", m.g.find_output("loss")}};
  const graph program = simplify(*done);
  if (auto ok = (*ex)->set_parameters(m.state); !ok) return std::fprintf(stderr, "%s\n", ok.error().message.c_str()), 1;
  const auto t0 = std::chrono::steady_clock::now();
  auto id = (*ex)->load(program);
  if (!id) return std::fprintf(stderr, "load: %s\n", id.error().message.c_str()), 1;
  std::printf("gradient program on %s: compiled in %.1f s\n", (*ex)->info().name.c_str(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  const int64_t t = s.sequence;
  std::vector<int32_t> tokens(static_cast<size_t>(s.batch * t));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7919) % static_cast<size_t>(s.vocab));
  const tensor_map in{{"tokens", tensor::from_ints({s.batch, t}, tokens)},
                      {"targets", tensor::from_ints({s.batch, t}, tokens)},
                      {"mask", tensor::from_floats({s.batch, t}, std::vector<float>(tokens.size(), 1.0f))}};
  std::vector<std::vector<double>> per_kernel;
  std::vector<gpu::kernel_timing> kernels;
  std::vector<double> walls;
  for (int i = 0; i < 6; ++i) {
    const auto r0 = std::chrono::steady_clock::now();
    if (auto ok = (*ex)->run(*id, in); !ok) return std::fprintf(stderr, "run: %s\n", ok.error().message.c_str()), 1;
    if (i == 0) continue;  // warm-up
    walls.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - r0).count());
    kernels = (*ex)->stats().kernels;
    per_kernel.resize(kernels.size());
    for (size_t k = 0; k < kernels.size(); ++k) per_kernel[k].push_back(kernels[k].last_ms);
  }
  // The optimizer as a ring of one runs it: Adam on the accumulators, in place.
  {
    train_options o;
    o.trainable = m.trainable;
    o.optimizer = optim::adam_options{.lr = 1e-5};
    auto spec = make_train_spec(m.g, m.state, in, s.batch, o);
    if (!spec || !spec->apply.value) return std::fprintf(stderr, "spec: %s\n", spec ? "no optimizer graph" : spec.error().message.c_str()), 1;
    graph apply = spec->apply.value->g;
    for (auto& n : apply.nodes)
      if (n.op == op_kind::input && n.attrs.name.rfind("grad.", 0) == 0) {
        n.op = op_kind::parameter;
        n.attrs.name = "acc." + n.attrs.name.substr(5);
      }
    tensor_map zeros;
    for (const auto& n : apply.nodes)
      if (n.op == op_kind::parameter && n.attrs.name.rfind("opt.", 0) == 0) zeros[n.attrs.name] = tensor::zeros(n.type, n.dims);
    if (auto ok = (*ex)->set_parameters(zeros); !ok) return std::fprintf(stderr, "%s\n", ok.error().message.c_str()), 1;
    auto aid = (*ex)->load(apply);
    if (!aid) return std::fprintf(stderr, "load optimizer: %s\n", aid.error().message.c_str()), 1;
    std::vector<double> steps;
    for (int i = 0; i < 4; ++i) {
      const auto r0 = std::chrono::steady_clock::now();
      if (auto ok = (*ex)->run(*id, in); !ok) return std::fprintf(stderr, "run: %s\n", ok.error().message.c_str()), 1;
      if (auto ok = (*ex)->run(*aid, {{"scale", tensor::scalar(1.0)}}); !ok) return std::fprintf(stderr, "run: %s\n", ok.error().message.c_str()), 1;
      if (i > 0) steps.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - r0).count());
    }
    std::sort(steps.begin(), steps.end());
    std::printf("gradients + Adam in place, as a worker alone runs a step: %.1f ms (median)\n", steps[steps.size() / 2]);
  }
  std::sort(walls.begin(), walls.end());
  double total = 0;
  for (auto v : per_kernel) {
    std::sort(v.begin(), v.end());
    total += v[v.size() / 2];
  }
  std::printf("gradient program: %.1f ms a run (wall, median), kernels %.1f ms in all, %zu kernels; the largest:\n", walls[walls.size() / 2],
              total, kernels.size());
  print_largest(kernels, per_kernel, 20);
  if (s.bucket_mb <= 0) return 0;
  // The accumulators' values, as the updates of `program` name them.
  std::vector<std::string> acc;
  std::vector<node_index> values;
  for (const auto& u : program.updates) {
    acc.push_back(program[u.target].attrs.name);
    values.push_back(u.value);
  }
  return profile_segments(**ex, program, acc, values, static_cast<uint64_t>(s.bucket_mb) << 20, in);
}

std::vector<int> int_list(const std::string& v) {
  std::vector<int> out;
  std::stringstream ss(v);
  for (std::string x; std::getline(ss, x, ',');) out.push_back(std::atoi(x.c_str()));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  settings s;
  s.meshnode = app::meshnode_beside(argv[0]);
  if (!fs::exists(s.meshnode))  // in the build tree: build/bench/train -> build/apps
    s.meshnode = (fs::path(s.meshnode).parent_path() / "../../apps/meshnode").lexically_normal().string();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    const auto num = [&] { return std::atoll(v.c_str()); };
    if (k == "--nodes") s.nodes = int_list(v);
    else if (k == "--steps") s.steps = std::max(4, static_cast<int>(num()));
    else if (k == "--hidden") s.hidden = num();
    else if (k == "--layers") s.layers = num();
    else if (k == "--heads") s.heads = num();
    else if (k == "--kv-heads") s.kv_heads = num();
    else if (k == "--ffn") s.ffn = num();
    else if (k == "--vocab") s.vocab = num();
    else if (k == "--batch") s.batch = num();
    else if (k == "--sequence") s.sequence = num();
    else if (k == "--micro") s.micro = num();
    else if (k == "--lora-rank") s.lora_rank = num();
    else if (k == "--bucket-mb") s.bucket_mb = num();
    else if (k == "--precision") {
      if (v != "f32" && v != "f16" && v != "bf16") return std::fprintf(stderr, "--precision: f32, f16 or bf16\n"), 2;
      s.precision = v == "f16" ? dtype::f16 : v == "bf16" ? dtype::bf16 : dtype::f32;
    } else if (k == "--device-prefix") s.device_prefix = v;
    else if (k == "--meshnode") s.meshnode = v;
    else if (k == "--profile") s.profile = v;
    else if (k == "--compression")
      s.compression = v == "bf16" ? wire_format::bf16 : v == "f16" ? wire_format::f16 : v == "int8" ? wire_format::int8 : v == "fp4" ? wire_format::fp4 : wire_format::f32;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  char tmpl[] = "/tmp/bench-finetune-XXXXXX";
  const fs::path dir = mkdtemp(tmpl);
  write_checkpoint(dir / "model", s);
  auto ckpt = models::checkpoint::open(dir / "model");
  if (!ckpt) return std::fprintf(stderr, "%s\n", ckpt.error().message.c_str()), 1;
  auto config = models::read_model_config(*ckpt);
  if (!config) return std::fprintf(stderr, "%s\n", config.error().message.c_str()), 1;
  models::finetune_options fo;
  fo.batch = s.batch;
  fo.sequence = s.sequence;
  fo.lora.rank = s.lora_rank;
  fo.lora.alpha = 2.0 * static_cast<double>(s.lora_rank);
  fo.compute = s.precision;
  auto m = models::build_finetune_model(*config, *ckpt, fo);
  if (!m) return std::fprintf(stderr, "%s\n", m.error().message.c_str()), 1;
  int64_t params = 0, trained = 0;
  for (const auto& [name, t] : m->state) params += t.size();
  for (const auto& name : m->trainable) trained += m->state.at(name).size();
  // 6 flops per trained-through parameter and token (forward 2, backward 4) plus attention's
  // 12 * layers * hidden * sequence per token (causal: half of it is masked work).
  const double flops_per_token = 6.0 * static_cast<double>(params) +
                                 12.0 * static_cast<double>(s.layers * s.hidden * s.sequence);
  std::printf("Llama shape: hidden %lld, %lld layers, %lld heads (%lld kv), ffn %lld, vocab %lld: %.1f M parameters, %.1f M trained "
              "(%s); micro-batch %lld x %lld tokens, %lld per node per step; products in %s, Adam fp32\n",
              static_cast<long long>(s.hidden), static_cast<long long>(s.layers), static_cast<long long>(s.heads),
              static_cast<long long>(s.kv_heads), static_cast<long long>(s.ffn), static_cast<long long>(s.vocab), params / 1e6,
              trained / 1e6, s.lora_rank > 0 ? ("LoRA rank " + std::to_string(s.lora_rank)).c_str() : "full",
              static_cast<long long>(s.batch), static_cast<long long>(s.sequence), static_cast<long long>(s.micro),
              to_string(s.precision));
  if (!s.profile.empty()) return profile(s, *m);
  std::vector<std::pair<int, measured>> results;
  for (int n : s.nodes) {
    auto r = run(s, *m, n, dir);
    if (!r) {
      std::fprintf(stderr, "%d nodes: %s\n", n, r.error().message.c_str());
      bench::keep_node_logs(dir);  // what the nodes saw, for the failure
      return 1;
    }
    results.emplace_back(n, *r);
  }
  std::printf("%-6s %12s %10s %12s %12s %14s %14s\n", "nodes", "tokens/s", "step ms", "TFLOP/s", "MB/step", "first step s",
              "median step ms");
  for (const auto& [n, r] : results)
    std::printf("%-6d %12.0f %10.1f %12.2f %12.1f %14.1f %14.1f\n", n, r.tokens_per_s, r.step_ms, r.tokens_per_s * flops_per_token / 1e12,
                r.mb_per_step, r.first_step_s, r.median_step_ms);
  for (const auto& [n, r] : results)
    if (n > 1 && results.front().first == 1)
      std::printf("scaling efficiency on %d nodes: %.1f%%\n", n, 100 * r.tokens_per_s / (n * results.front().second.tokens_per_s));
  std::error_code ec;
  bench::keep_node_logs(dir);  // every node's MESH_TRAIN_TIMING lines, not only the first's
  fs::remove_all(dir, ec);
  return 0;
}
