// mesh-bench-generate CHECKPOINT [--cpu] [--threads N] [--prompt N] [--generate N] [--context N] [--runs N]
//                     [--kernels] [--prompt-kernels] [--unfused] [--batch N] [--host-argmax] [--chunk N]
// Loads a checkpoint (GGUF file or HF directory) into a session, prefills a prompt of N token ids
// (a fixed pseudo-random sequence, so any vocabulary works), decodes N tokens greedily, and prints
// load time, prompt and generation tokens/s and the process's peak resident memory beside the
// checkpoint's size on disk. --kernels lists the kernels of the last decode step with their GPU
// times (Vulkan), slowest first (in the step's order with MESH_KERNEL_ORDER=1). The first prefill
// and decode of each shape include building and loading their programs: a warm-up run of the same shapes comes first and is not timed; then
// --runs timed runs (default 1), reported as mean and standard deviation of tokens/s per run (as
// llama-bench reports its repetitions). --threads: the CPU executor's threads (default: every
// core). MESH_MATVEC=shared or chunk picks another matrix-vector kernel (kernel_variants::matvec), MESH_MATVEC_X=f32
// keeps its x in f32 where the device would quantize it to 8 bits (kernel_variants::matvec_x),
// MESH_GEMM another matmul kernel (kernel_variants::gemm; noskinny: no few-row `mms`), MESH_LINEAR=f32
// keeps prompts' linears off the f16 tensor-core kernel `mmctl` (kernel_variants::linear), MESH_LINEAR_DECODE=staged
// decodes their quantized weights while staging them, never first (kernel_variants::linear_decode), MESH_ATTENTION=f32
// their attention off `attnc` (kernel_variants::attention);
// GPU timestamps around the kernels are on only with --kernels (as a node runs without them);
// MESH_TIMESTAMPS=0 or 1 overrides that. --unfused keeps each projection its own weight
// (session_options::fuse_projections off: one matrix-vector product per q, k, v, gate and up).
// --batch N: N sequences (slots), each prefilled with the prompt, then decoded together in batched
// steps of N rows (continuous batching's step); tokens/s counts every sequence's tokens, and
// --kernels lists an N-row step's kernels. --prompt-kernels also runs one more prompt alone and sums
// its kernels' GPU times by kind.
// One sequence decodes as generate() does greedily: session::decode_greedy in chunks of
// session::greedy_chunk() steps (--chunk N: N), each chunk's steps run back to back on the device
// with the next token picked there; --host-argmax runs one step at a time instead, the logits
// read back and the next token picked on the host (first_argmax), as sampling other than greedy
// does.
// "decode host" splits a decode step's wall time (Vulkan): inside executor::run, of that from queue
// submission to the fence's signal, and outside (session, argmax).
// The last line is machine-readable, key=value pairs:
//   bench_generate device=... prompt=N prompt_tps=X prompt_tps_sd=X generate=N gen_tps=X
//   gen_tps_sd=X peak_rss_mib=X file_mib=X load_s=X compile_s=X programs=N context=N fused=0|1 batch=N
//   greedy=device|host file=PATH
// (the device name has its spaces replaced by '_'; PATH is last and may hold spaces).
// Generation starts after the prompt (positions prompt .. prompt+generate-1), like llama-bench's
// tg test at depth `prompt` (`-d`), not its default tg at an empty cache.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "gpu/executor.hpp"
#include "models/sampler.hpp"
#include "models/session.hpp"

using namespace mesh;
using namespace mesh::models;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

uint64_t path_bytes(const std::filesystem::path& p) {
  if (std::filesystem::is_regular_file(p)) return std::filesystem::file_size(p);
  uint64_t total = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(p))
    if (e.is_regular_file()) total += e.file_size();
  return total;
}

int usage() {
  std::fprintf(stderr,
               "usage: mesh-bench-generate CHECKPOINT [--cpu] [--threads N] [--prompt N] [--generate N] [--context N] "
               "[--runs N] [--kernels] [--prompt-kernels] [--unfused] [--batch N] [--host-argmax] [--chunk N]\n");
  return 2;
}

struct mean_sd {
  double mean = 0, sd = 0;
};

mean_sd summarize(const std::vector<double>& v) {
  mean_sd r;
  for (double x : v) r.mean += x;
  r.mean /= static_cast<double>(v.size());
  if (v.size() > 1) {
    for (double x : v) r.sd += (x - r.mean) * (x - r.mean);
    r.sd = std::sqrt(r.sd / static_cast<double>(v.size() - 1));
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::filesystem::path path = argv[1];
  bool cpu = false, kernels = false, prompt_kernels = false, unfused = false, host_argmax = false;
  int64_t prompt_n = 128, gen_n = 64, context = 0, runs = 1, threads = 0, batch = 1, chunk = 0;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> int64_t { return i + 1 < argc ? std::atoll(argv[++i]) : -1; };
    if (a == "--cpu") cpu = true;
    else if (a == "--prompt") prompt_n = next();
    else if (a == "--generate") gen_n = next();
    else if (a == "--context") context = next();
    else if (a == "--runs") runs = next();
    else if (a == "--threads") threads = next();
    else if (a == "--kernels") kernels = true;
    else if (a == "--prompt-kernels") prompt_kernels = kernels = true;
    else if (a == "--unfused") unfused = true;
    else if (a == "--batch") batch = next();
    else if (a == "--host-argmax") host_argmax = true;
    else if (a == "--chunk") chunk = next();
    else return usage();
  }
  if (prompt_n < 1 || gen_n < 1 || runs < 1 || threads < 0 || batch < 1 || chunk < 0) return usage();

  auto ckpt = checkpoint::open(path);
  if (!ckpt) {
    std::fprintf(stderr, "%s\n", ckpt.error().message.c_str());
    return 1;
  }
  std::unique_ptr<gpu::executor> ex;
  if (cpu) {
    ex = gpu::make_cpu_executor(static_cast<unsigned>(threads));
  } else {
    // MESH_MATVEC (kernel_variants::matvec, e.g. "shared") compares matrix-vector kernels.
    gpu::vulkan_options vo;
    if (const char* mv = std::getenv("MESH_MATVEC")) vo.variants.matvec = mv;
    if (const char* gm = std::getenv("MESH_GEMM")) vo.variants.gemm = gm;  // e.g. noskinny
    if (const char* mx = std::getenv("MESH_MATVEC_X")) vo.variants.matvec_x = mx;  // f32: decode's x never in 8 bits
    if (const char* li = std::getenv("MESH_LINEAR")) vo.variants.linear = li;  // f32: prompts without `mmctl`
    if (const char* ld = std::getenv("MESH_LINEAR_DECODE")) vo.variants.linear_decode = ld;  // staged: quantized weights never decoded first
    if (const char* at = std::getenv("MESH_ATTENTION")) vo.variants.attention = at;  // f32: prompts without `attnc`
    // GPU timestamps around the kernels only for --kernels (a node runs without them);
    // MESH_TIMESTAMPS=0 or 1 overrides (what they cost a decode step).
    vo.kernel_timestamps = kernels;
    if (const char* ts = std::getenv("MESH_TIMESTAMPS")) vo.kernel_timestamps = std::string(ts) != "0";
    auto vk = gpu::make_vulkan_executor(vo);
    if (!vk) {
      std::fprintf(stderr, "%s\n", vk.error().message.c_str());
      return 1;
    }
    ex = std::move(*vk);
  }
  session_options options;
  options.context = context;
  options.fuse_projections = !unfused;
  options.slots = batch;
  auto s = session::create(*ex, *ckpt, options);
  if (!s) {
    std::fprintf(stderr, "%s\n", s.error().message.c_str());
    return 1;
  }
  if (prompt_n + gen_n > s->context()) {
    std::fprintf(stderr, "prompt %lld + generate %lld exceed the session's context %lld (use --context)\n",
                 static_cast<long long>(prompt_n), static_cast<long long>(gen_n), static_cast<long long>(s->context()));
    return 1;
  }
  std::vector<int32_t> prompt;
  uint64_t x = 88172645463325252ull;
  for (int64_t i = 0; i < prompt_n; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    prompt.push_back(static_cast<int32_t>(x % static_cast<uint64_t>(s->config().vocab_size)));
  }
  // Where a decode step's wall time goes (Vulkan): inside executor::run, and of that from queue
  // submission to the fence; summed over the timed runs' decode loops.
  struct step_split {
    double wall_s = 0, run_ms = 0, submit_ms = 0;
    uint64_t steps = 0;
  } split;
  bool timing = false;
  auto run = [&](double& prompt_s, double& gen_s) -> bool {
    std::vector<std::vector<float>> logits(static_cast<size_t>(batch));
    double t0 = now();
    for (int64_t slot = 0; slot < batch; ++slot) {
      s->reset(slot);
      auto l = s->prefill(slot, prompt);
      if (!l) return std::fprintf(stderr, "%s\n", l.error().message.c_str()), false;
      logits[static_cast<size_t>(slot)] = std::move(*l);
    }
    prompt_s = now() - t0;
    const auto before = ex->stats();
    t0 = now();
    std::vector<slot_token> step(static_cast<size_t>(batch));
    if (batch == 1 && !host_argmax) {
      const int64_t per_chunk = chunk > 0 ? chunk : std::max<int64_t>(1, s->greedy_chunk());
      int32_t token = models::first_argmax(logits[0]);
      for (int64_t done = 0; done < gen_n;) {
        auto picked = s->decode_greedy(0, token, std::min(per_chunk, gen_n - done));
        if (!picked) return std::fprintf(stderr, "%s\n", picked.error().message.c_str()), false;
        done += static_cast<int64_t>(picked->size());
        token = picked->back();
      }
    }
    for (int64_t i = 0; i < gen_n && (batch > 1 || host_argmax); ++i) {
      for (int64_t slot = 0; slot < batch; ++slot) {
        const auto& l = logits[static_cast<size_t>(slot)];
        step[static_cast<size_t>(slot)] = {slot, models::first_argmax(l)};  // greedy, as the sampler picks
      }
      if (batch == 1) {
        auto l = s->decode(step[0].token);
        if (!l) return std::fprintf(stderr, "%s\n", l.error().message.c_str()), false;
        logits[0] = std::move(*l);
      } else {
        auto l = s->decode(step);
        if (!l) return std::fprintf(stderr, "%s\n", l.error().message.c_str()), false;
        logits = std::move(*l);
      }
    }
    gen_s = now() - t0;
    if (timing) {
      const auto after = ex->stats();
      split.wall_s += gen_s;
      split.run_ms += after.run_ms - before.run_ms;
      split.submit_ms += after.submit_ms - before.submit_ms;
      split.steps += after.runs - before.runs;
    }
    return true;
  };
  double p0, g0;
  if (!run(p0, g0)) return 1;  // the first run builds the programs
  timing = true;
  std::vector<double> prompt_tps, gen_tps;
  for (int64_t r = 0; r < runs; ++r) {
    double p, g;
    if (!run(p, g)) return 1;
    prompt_tps.push_back(static_cast<double>(prompt_n * batch) / p);
    gen_tps.push_back(static_cast<double>(gen_n * batch) / g);
  }
  const mean_sd pt = summarize(prompt_tps), gt = summarize(gen_tps);
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const auto& st = s->stats();
  const double file_mib = static_cast<double>(path_bytes(path)) / (1 << 20);
  const double rss_mib = static_cast<double>(ru.ru_maxrss) / 1024;
  std::printf("device            %s\n", ex->info().name.c_str());
  std::printf("checkpoint        %s (%.1f MiB on disk), %s, %lld layers, context %lld\n", path.c_str(), file_mib,
              to_string(s->config().arch), static_cast<long long>(s->config().n_layers),
              static_cast<long long>(s->context()));
  std::printf("load              %.2f s (weights), %.2f s building and loading %lld programs\n", st.load_seconds,
              st.compile_seconds, static_cast<long long>(st.programs));
  std::printf("prompt            %lld tokens: %.1f ± %.1f tokens/s over %lld runs (first run, with program loads: %.1f)\n",
              static_cast<long long>(prompt_n), pt.mean, pt.sd, static_cast<long long>(runs),
              static_cast<double>(prompt_n * batch) / p0);
  std::printf("generation        %lld tokens x %lld sequences: %.1f ± %.1f tokens/s over %lld runs (first run: %.1f)\n",
              static_cast<long long>(gen_n), static_cast<long long>(batch), gt.mean, gt.sd, static_cast<long long>(runs),
              static_cast<double>(gen_n * batch) / g0);
  std::printf("peak RSS          %.1f MiB (%.2fx the file)\n", rss_mib, rss_mib / file_mib);
  if (split.steps > 0) {
    const double n = static_cast<double>(split.steps);
    std::printf("decode host       %.3f ms a step: %.3f ms in executor::run (%.3f ms from submit to fence), %.3f ms outside "
                "it (session, argmax)\n",
                split.wall_s * 1e3 / n, split.run_ms / n, split.submit_ms / n, split.wall_s * 1e3 / n - split.run_ms / n);
  }
  if (batch == 1 && !host_argmax) {
    // The device's greedy tokens against the host's first_argmax of each step's logits, from
    // the same prompt: they should be the same tokens (the same logits feed both).
    const int64_t n = std::min<int64_t>(gen_n, 64);
    s->reset(0);
    auto l = s->prefill(0, prompt);
    if (!l) return std::fprintf(stderr, "%s\n", l.error().message.c_str()), 1;
    const int32_t first = models::first_argmax(*l);
    auto on_device = s->decode_greedy(0, first, n);
    if (!on_device) return std::fprintf(stderr, "%s\n", on_device.error().message.c_str()), 1;
    s->reset(0);
    l = s->prefill(0, prompt);
    int64_t same = 0;
    int32_t token = first;
    for (int64_t i = 0; i < n && l; ++i) {
      l = s->decode(token);
      if (!l) break;
      token = models::first_argmax(*l);
      if (token != (*on_device)[static_cast<size_t>(i)]) break;
      ++same;
    }
    if (!l) return std::fprintf(stderr, "%s\n", l.error().message.c_str()), 1;
    std::printf("greedy check      the device's first %lld of %lld tokens equal the host argmax's\n",
                static_cast<long long>(same), static_cast<long long>(n));
  }
  if (kernels) {
    auto ks = ex->stats().kernels;
    double total = 0;
    for (const auto& k : ks) total += k.last_ms;
    std::printf("decode step       %zu kernels, %.3f ms of GPU time\n", ks.size(), total);
    if (!std::getenv("MESH_KERNEL_ORDER")) std::sort(ks.begin(), ks.end(), [](const auto& a, const auto& b) { return a.last_ms > b.last_ms; });
    for (const auto& k : ks)
      std::printf("  %-28s %8.4f ms %10.1f MB %8.1f GB/s\n", k.name.c_str(), k.last_ms, static_cast<double>(k.bytes) / 1e6,
                  k.last_ms > 0 ? static_cast<double>(k.bytes) / k.last_ms / 1e6 : 0.0);
  }
  if (prompt_kernels) {
    // One more prompt, alone, its kernels summed by kind (the name without its node id).
    s->reset(0);
    if (auto l = s->prefill(0, prompt); !l) return std::fprintf(stderr, "%s\n", l.error().message.c_str()), 1;
    std::map<std::string, std::pair<double, int>> by_kind;
    double total = 0;
    for (const auto& k : ex->stats().kernels) {
      auto& e = by_kind[k.name.substr(0, k.name.rfind('_'))];
      e.first += k.last_ms;
      ++e.second;
      total += k.last_ms;
    }
    std::vector<std::pair<std::string, std::pair<double, int>>> rows(by_kind.begin(), by_kind.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
    std::printf("prompt kernels    %zu kernels, %.3f ms of GPU time (last program of the prompt)\n", ex->stats().kernels.size(), total);
    for (const auto& [name, e] : rows) std::printf("  %-28s %8.4f ms %4d\n", name.c_str(), e.first, e.second);
  }
  std::string device = ex->info().name;
  std::replace(device.begin(), device.end(), ' ', '_');
  std::printf("bench_generate device=%s prompt=%lld prompt_tps=%.2f prompt_tps_sd=%.2f generate=%lld gen_tps=%.2f "
              "gen_tps_sd=%.2f peak_rss_mib=%.1f file_mib=%.1f load_s=%.3f compile_s=%.3f programs=%lld context=%lld "
              "fused=%d batch=%lld greedy=%s file=%s\n",
              device.c_str(), static_cast<long long>(prompt_n), pt.mean, pt.sd, static_cast<long long>(gen_n), gt.mean,
              gt.sd, rss_mib, file_mib, st.load_seconds, st.compile_seconds, static_cast<long long>(st.programs),
              static_cast<long long>(s->context()), unfused ? 0 : 1, static_cast<long long>(batch),
              batch == 1 && !host_argmax ? "device" : "host", path.c_str());
  return 0;
}
