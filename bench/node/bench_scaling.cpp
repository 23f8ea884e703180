// bench_scaling: data-parallel training throughput on 1 node against n nodes (weak scaling: every
// node gets the same micro-batches per step), meshnode processes on this host over loopback, one
// per device. Scaling efficiency = samples/s on n nodes / (n x samples/s on 1 node).
//
//   bench_scaling [--nodes 4] [--device-prefix "#"] [--steps 12] [--width 2048] [--rows 4096]
//                 [--micro 8] [--compression f32|bf16|f16|int8|fp4] [--meshnode PATH]
// --device-prefix "#" gives node i the device "#i" (the i-th GPU); "cpu" gives every node the CPU.
// MESH_BENCH_KEEP=DIR copies each node's log into DIR (bench/bench_mesh.hpp, keep_node_logs).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_mesh.hpp"
#include "client/trainer.hpp"
#include "graph/nn.hpp"

using namespace mesh;

namespace {

struct settings {
  int nodes = 4, steps = 12;
  int64_t width = 2048, rows = 4096, micro = 8;
  std::string device_prefix = "#", meshnode;
  wire_format compression = wire_format::f32;
};

struct measured {
  double samples_per_s = 0;
  double step_ms = 0;
  double mb_per_step = 0;
};

/// An MLP 64 -> width -> width -> width -> 16 on random data: a matmul-bound step.
expected<measured> run(const settings& s, int n) {
  char tmpl[] = "/tmp/bench-scaling-XXXXXX";
  const std::filesystem::path dir = mkdtemp(tmpl);
  auto mesh = bench::start_training_mesh(s.meshnode, dir, "n", n, [&](int i) {
    return s.device_prefix == "cpu" ? std::string("cpu") : s.device_prefix + std::to_string(i);
  });
  if (!mesh) return tl::unexpected(mesh.error());
  auto& c = mesh->first;
  builder b;
  auto x = b.input("x", dtype::f32, {s.rows, 64});
  auto labels = b.input("labels", dtype::i32, {s.rows});
  auto net = nn::make_mlp(b, "mlp", {64, s.width, s.width, s.width, 16});
  b.output("loss", nn::cross_entropy(net(x), labels));
  auto model = b.finish();
  if (!model) return tl::unexpected(model.error());
  const int64_t examples = s.rows * 4;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> xs(static_cast<size_t>(examples * 64));
  for (auto& v : xs) v = normal(rng);
  std::vector<int32_t> ys(static_cast<size_t>(examples));
  for (auto& v : ys) v = static_cast<int32_t>(rng() % 16);
  const tensor_map data{{"x", tensor::from_floats({examples, 64}, xs)}, {"labels", tensor::from_ints({examples}, ys)}};
  train_options o;
  o.steps = static_cast<uint64_t>(s.steps);
  o.micro_batches = static_cast<uint32_t>(s.micro * n);
  o.optimizer = optim::adam_options{.lr = 1e-4};
  o.compression = s.compression;
  // Steps 1-2 include loading and compiling: time from the end of step 2 to the last one.
  std::chrono::steady_clock::time_point t2{};
  uint64_t bytes = 0;
  auto r = trainer(*c, *model, nn::init_parameters(*model, 1), data, o).fit([&](const train_progress_info& p) {
    if (p.step == 2) t2 = std::chrono::steady_clock::now();
    if (p.step > 2) bytes += p.bytes_sent;
    std::fprintf(stderr, "  n=%d step %llu loss %.4f peers %u\n", n, static_cast<unsigned long long>(p.step), p.loss, p.peers);
  });
  const auto t_end = std::chrono::steady_clock::now();
  if (!r) return tl::unexpected(r.error());
  const double secs = std::chrono::duration<double>(t_end - t2).count();
  const int timed = s.steps - 2;
  measured m;
  m.samples_per_s = static_cast<double>(timed) * static_cast<double>(o.micro_batches * s.rows) / secs;
  m.step_ms = 1000 * secs / timed;
  m.mb_per_step = static_cast<double>(bytes) / timed / 1e6;
  c.reset();
  mesh->nodes.clear();
  std::error_code ec;
  bench::keep_node_logs(dir);  // MESH_BENCH_KEEP=DIR: MESH_TRAIN_TIMING's lines of every node
  std::filesystem::remove_all(dir, ec);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  settings s;
  s.meshnode = app::meshnode_beside(argv[0]);
  if (!std::filesystem::exists(s.meshnode))  // in the build tree: build/bench/node -> build/apps
    s.meshnode = (std::filesystem::path(s.meshnode).parent_path() / "../../apps/meshnode").lexically_normal().string();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--nodes") s.nodes = std::atoi(v.c_str());
    else if (k == "--steps") s.steps = std::max(4, std::atoi(v.c_str()));
    else if (k == "--width") s.width = std::atoll(v.c_str());
    else if (k == "--rows") s.rows = std::atoll(v.c_str());
    else if (k == "--micro") s.micro = std::atoll(v.c_str());
    else if (k == "--device-prefix") s.device_prefix = v;
    else if (k == "--meshnode") s.meshnode = v;
    else if (k == "--compression")
      s.compression = v == "bf16" ? wire_format::bf16 : v == "f16" ? wire_format::f16 : v == "int8" ? wire_format::int8 : v == "fp4" ? wire_format::fp4 : wire_format::f32;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  const double flops_per_row = 6.0 * static_cast<double>(64 * s.width + 2 * s.width * s.width + 16 * s.width);
  std::printf("MLP 64-%lld-%lld-%lld-16, %lld rows per micro-batch, %lld micro-batches per node per step\n",
              static_cast<long long>(s.width), static_cast<long long>(s.width), static_cast<long long>(s.width),
              static_cast<long long>(s.rows), static_cast<long long>(s.micro));
  auto one = run(s, 1);
  if (!one) {
    std::fprintf(stderr, "1 node: %s\n", one.error().message.c_str());
    return 1;
  }
  auto many = run(s, s.nodes);
  if (!many) {
    std::fprintf(stderr, "%d nodes: %s\n", s.nodes, many.error().message.c_str());
    return 1;
  }
  std::printf("%-6s %12s %10s %10s %12s\n", "nodes", "samples/s", "step ms", "TFLOP/s", "MB/step");
  for (auto [n, m] : {std::pair{1, *one}, std::pair{s.nodes, *many}})
    std::printf("%-6d %12.0f %10.1f %10.2f %12.1f\n", n, m.samples_per_s, m.step_ms, m.samples_per_s * flops_per_row / 1e12,
                m.mb_per_step);
  std::printf("scaling efficiency on %d nodes: %.1f%%\n", s.nodes, 100 * many->samples_per_s / (s.nodes * one->samples_per_s));
  return 0;
}
