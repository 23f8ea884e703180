// mesh-bench-transfer: how fast the Vulkan executor moves a data-parallel step's gradients
// between the device and host memory (read_parameters / write_parameters: the trainer's
// read-back of each bucket and its write of the reduced sums; docs/training.md).
//
//   mesh-bench-transfer [--mb 400] [--params 100] [--reps 8] [--threads 1,4] [--device "#0"] [--align 1] [--host-offset 0]
//
// For each value of --threads (MESH_COPY_THREADS: the threads that copy between the caller's
// buffer and staging memory) a new executor holds --mb MiB of f32 in --params parameters; a host
// buffer, touched once and reused as the trainer reuses its buckets, is written to them and read
// back --reps times (--align N: every parameter but the last a multiple of N floats, so each
// starts that aligned in the host buffer; --host-offset B: the imported row's buffers start B
// bytes into their pages). Printed: the median GB/s of each direction; every byte read back is checked
// against what was written (a mismatch prints "CHECK FAILED", exit status 2).
// A last row, "imported", moves the same bytes to and from host memory the device imported
// (executor::import_host_memory: copy commands alone, no staging; the host all-reduce's shared
// regions go this way), when the device can import.
// bench/gpu/cuda_transfer.cu times cudaMemcpy on the same bytes (pageable and pinned host
// memory) for the reference column, on the same machine.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gpu/executor.hpp"

using namespace mesh;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = std::min(s.find(',', at), s.size());
    out.push_back(s.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t mb = 400, params = 100, align = 1, host_offset = 0;
  int reps = 8;
  std::vector<std::string> threads = {"1", "4"};
  std::string device;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) return std::fprintf(stderr, "%s needs a value\n", k.c_str()), 2;
    const std::string v = argv[++i];
    if (k == "--mb") mb = std::atoll(v.c_str());
    else if (k == "--params") params = std::atoll(v.c_str());
    else if (k == "--reps") reps = std::max(1, std::atoi(v.c_str()));
    else if (k == "--threads") threads = split_list(v);
    else if (k == "--device") device = v;
    else if (k == "--align") align = std::max<int64_t>(1, std::atoll(v.c_str()));
    else if (k == "--host-offset") host_offset = std::max<int64_t>(0, std::atoll(v.c_str()));
    else return std::fprintf(stderr, "unknown option %s\n", k.c_str()), 2;
  }
  if (mb < 1 || params < 1) return std::fprintf(stderr, "--mb and --params must be positive\n"), 2;
  // Parameters of unequal sizes (as a model's are), together mb MiB of f32.
  const int64_t total = mb << 18;  // floats
  std::vector<int64_t> sizes;
  for (int64_t p = 0, left = total; p < params; ++p) {
    const int64_t n = p + 1 == params ? left : std::min<int64_t>(left, (total / params + (p % 3 == 0 ? 1023 : -1023)) / align * align);
    sizes.push_back(std::max<int64_t>(n, 0));
    left -= sizes.back();
  }
  tensor_map ps;
  std::vector<std::string> names;
  for (int64_t p = 0; p < params; ++p) {
    names.push_back("xfer." + std::to_string(p));
    ps[names.back()] = tensor::zeros(dtype::f32, {sizes[static_cast<size_t>(p)]});
  }
  std::vector<uint8_t> out(static_cast<size_t>(total) * 4), in(out.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  bool failed = false;
  std::printf("%-8s %12s %12s   (%lld MiB in %lld parameters, median of %d)\n", "threads", "write GB/s", "read GB/s",
              static_cast<long long>(mb), static_cast<long long>(params), reps);
  // Shared pages for the imported row (a shared region's kind of memory).
  const auto pages = [&](size_t n) {
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? std::span<uint8_t>{} : std::span<uint8_t>(static_cast<uint8_t*>(p), n);
  };
  // --host-offset bytes into their pages (a shared region's data start 64 bytes in).
  const size_t skip = static_cast<size_t>(host_offset);
  std::span<uint8_t> shared_out = pages(out.size() + skip), shared_in = pages(out.size() + skip);
  if (shared_out.empty() || shared_in.empty()) return std::fprintf(stderr, "mmap of %zu bytes failed\n", out.size() + skip), 1;
  shared_out = shared_out.subspan(skip), shared_in = shared_in.subspan(skip);
  std::copy(out.begin(), out.end(), shared_out.begin());
  threads.push_back("imported");
  for (const auto& t : threads) {
    const bool imported = t == "imported";
    if (!imported) ::setenv("MESH_COPY_THREADS", t.c_str(), 1);
    gpu::vulkan_options o;
    o.device = device;
    o.cache_dir = "-";
    o.block_bytes = 256ull << 20;
    auto ex = gpu::make_vulkan_executor(o);
    if (!ex) return std::fprintf(stderr, "no Vulkan executor: %s\n", ex.error().to_string().c_str()), 1;
    if (auto ok = (*ex)->set_parameters(ps); !ok) return std::fprintf(stderr, "set_parameters: %s\n", ok.error().to_string().c_str()), 1;
    std::shared_ptr<void> import_out, import_in;
    if (imported) {
      auto a = (*ex)->import_host_memory(shared_out);
      auto b = (*ex)->import_host_memory(shared_in);
      if (!a || !b) {
        std::printf("%-8s %s\n", t.c_str(), (!a ? a.error() : b.error()).to_string().c_str());
        break;
      }
      import_out = *a, import_in = *b;
    }
    const std::span<uint8_t> src = imported ? shared_out : std::span<uint8_t>(out), dst = imported ? shared_in : std::span<uint8_t>(in);
    std::vector<double> writes, reads;
    for (int r = 0; r < reps + 1; ++r) {  // the first round warms up
      src[static_cast<size_t>(r) * 4099 % src.size()] ^= 0x5a;  // each round's bytes differ
      const auto t0 = std::chrono::steady_clock::now();
      auto w = (*ex)->write_parameters(names, src);
      const auto t1 = std::chrono::steady_clock::now();
      std::fill(dst.begin(), dst.end(), 0);
      const auto t2 = std::chrono::steady_clock::now();
      auto rd = (*ex)->read_parameters(names, dst);
      const auto t3 = std::chrono::steady_clock::now();
      if (!w || !rd) return std::fprintf(stderr, "transfer: %s\n", (!w ? w.error() : rd.error()).to_string().c_str()), 1;
      if (!std::equal(src.begin(), src.end(), dst.begin())) {
        std::printf("CHECK FAILED: threads %s, round %d: the bytes read back differ from those written\n", t.c_str(), r);
        failed = true;
      }
      if (r == 0) continue;
      const double gb = static_cast<double>(out.size()) / 1e9;
      writes.push_back(gb / std::chrono::duration<double>(t1 - t0).count());
      reads.push_back(gb / std::chrono::duration<double>(t3 - t2).count());
    }
    // Where device memory is mapped (lavapipe), the host copies even to imported memory.
    const bool direct = (*ex)->stats().imported_copy_bytes > 0;
    std::printf("%-8s %12.1f %12.1f   %s%s\n", t.c_str(), median(writes), median(reads), (*ex)->info().name.c_str(),
                imported && !direct ? " (device memory is mapped: the host copied)" : "");
  }
  ::unsetenv("MESH_COPY_THREADS");
  return failed ? 2 : 0;
}
