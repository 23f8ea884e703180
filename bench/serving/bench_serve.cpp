// mesh-bench-serve CHECKPOINT [--cpu] [--port N] [--context N] [--id ID]
// The serving path of a node without the mesh around it: the node's model host
// (serving::local_backend) and its HTTP API (serving::api_server) on 127.0.0.1, so that
// bench/serving/load.py can measure it beside llama.cpp's llama-server on a machine that lacks
// the node's other libraries (the GPU machine: static libstdc++, see bench/serving/h100.sh).
// Prints "serving ID on http://127.0.0.1:PORT" once the model is loaded; runs until SIGINT or
// SIGTERM.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "gpu/executor.hpp"
#include "serving/local_backend.hpp"
#include "serving/server.hpp"

using namespace mesh;

namespace {
volatile std::sig_atomic_t stop = 0;
extern "C" void on_signal(int) { stop = 1; }
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CHECKPOINT [--cpu] [--port N] [--context N] [--parallel N] [--id ID]\n", argv[0]);
    return 2;
  }
  bool cpu = false;
  int port = 0;
  int64_t context = 0, parallel = 4;
  std::string id;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--cpu") cpu = true;
    else if (a == "--port" && i + 1 < argc) port = std::atoi(argv[++i]);
    else if (a == "--context" && i + 1 < argc) context = std::atoll(argv[++i]);
    else if (a == "--parallel" && i + 1 < argc) parallel = std::atoll(argv[++i]);
    else if (a == "--id" && i + 1 < argc) id = argv[++i];
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  serving::local_backend_options o;
  o.make_executor = [cpu]() -> expected<std::unique_ptr<gpu::executor>> {
    if (cpu) return gpu::make_cpu_executor();
    return gpu::make_vulkan_executor({});
  };
  serving::local_model_options m;
  m.path = argv[1];
  m.id = id;
  m.context = context;
  m.parallel = parallel;  // requests decoded together (continuous batching)
  m.max_queued = 64;  // the load generator's streams all wait: none is refused
  auto backend = serving::local_backend::create(o, {m});
  if (!backend) {
    std::fprintf(stderr, "mesh-bench-serve: %s\n", backend.error().message.c_str());
    return 1;
  }
  serving::server_options so;
  so.bind.port = static_cast<uint16_t>(port);
  so.threads = 32;
  auto server = serving::api_server::start(**backend, so);
  if (!server) {
    std::fprintf(stderr, "mesh-bench-serve: %s\n", server.error().message.c_str());
    return 1;
  }
  std::printf("serving %s on http://127.0.0.1:%u\n", (*backend)->models().front().id.c_str(), (*server)->port());
  std::fflush(stdout);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  (*server)->stop();
  return 0;
}
