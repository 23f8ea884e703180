// cuda_transfer: the reference column of mesh-bench-transfer (bench/gpu/bench_transfer.cpp):
// cudaMemcpy of the same bytes between host memory and the GPU, from a pageable buffer (malloc,
// touched once and reused, as the trainer's buckets are: CUDA stages it through its own pinned
// buffers) and from pinned memory (cudaMallocHost: the DMA engines read it directly).
//
// Build and run on the GPU machine:
//   nvcc -O3 -o cuda_transfer bench/gpu/cuda_transfer.cu && ./cuda_transfer [MiB] [reps]   (400 8)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK_CUDA(x)                                                                    \
  do {                                                                                   \
    const cudaError_t err_ = (x);                                                        \
    if (err_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(err_)); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main(int argc, char** argv) {
  const size_t bytes = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 400) << 20;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 8;
  void* dev = nullptr;
  CHECK_CUDA(cudaMalloc(&dev, bytes));
  void* pinned = nullptr;
  CHECK_CUDA(cudaMallocHost(&pinned, bytes));
  void* pageable = std::malloc(bytes);
  std::memset(pageable, 1, bytes);
  std::memset(pinned, 1, bytes);
  std::printf("%-10s %12s %12s   (%zu MiB, median of %d)\n", "host", "write GB/s", "read GB/s", bytes >> 20, reps);
  for (void* host : {pageable, pinned}) {
    std::vector<double> writes, reads;
    for (int r = 0; r < reps + 1; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      CHECK_CUDA(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
      auto t1 = std::chrono::steady_clock::now();
      CHECK_CUDA(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
      auto t2 = std::chrono::steady_clock::now();
      if (r == 0) continue;
      writes.push_back(bytes / 1e9 / std::chrono::duration<double>(t1 - t0).count());
      reads.push_back(bytes / 1e9 / std::chrono::duration<double>(t2 - t1).count());
    }
    std::printf("%-10s %12.1f %12.1f\n", host == pinned ? "pinned" : "pageable", median(writes), median(reads));
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s\n", prop.name);
  return 0;
}
