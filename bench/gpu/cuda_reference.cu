// cuda_reference: cuBLAS and plain CUDA kernels measured the way mesh-bench-gpu measures the
// Vulkan kernels, for a like-for-like comparison next to ../shared/anchors/cuda_anchor.cu.
//
// The anchor is the prescribed reference and stays in every run. Two of its choices differ from
// the Vulkan bench, and a review found both move its figures (docs/gpu.md has the numbers):
//   - its inputs are zeros: tensor cores draw less power on zeros, so a GEMM holds higher clocks
//     than on real data. Here inputs hold the bench's own pattern, 0.001 * ((i * 7919) % 97 - 48).
//   - it times one launch between two events after one warm-up call, so launch latency is inside
//     the interval and the GPU has not reached a steady clock. The bench times kernels with GPU
//     timestamps inside one command buffer after at least 300 ms of warm-up. Here every case runs
//     for at least 500 ms first, and a sample times 10 launches back to back (divided by 10).
// Each figure is also printed the anchor's way (one launch per sample, key suffix "_single"),
// so the two effects can be told apart. Results of f16/bf16 GEMMs are f16/bf16, as the Vulkan
// kernel writes them (the anchor writes fp32).
//
// Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -o cuda_reference bench/gpu/cuda_reference.cu -lcublas
//   ./cuda_reference [elements] [gemm sizes...]     (default 16777216 2048 4096)
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK_CUDA(x)                                                                       \
  do {                                                                                      \
    const cudaError_t err_ = (x);                                                           \
    if (err_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(err_));    \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)
#define CHECK_CUBLAS(x)                                                                     \
  do {                                                                                      \
    const cublasStatus_t status_ = (x);                                                     \
    if (status_ != CUBLAS_STATUS_SUCCESS) {                                                 \
      std::fprintf(stderr, "%s:%d: cuBLAS status %d\n", __FILE__, __LINE__, (int)status_); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

namespace {

/// The Vulkan bench's input values (bench_gpu.cpp), converted to the element type.
template <class T>
__global__ void fill_pattern(T* x, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x)
    x[i] = static_cast<T>(0.001f * static_cast<float>(static_cast<long long>((i * 7919) % 97) - 48));
}

__global__ void copy_kernel(const float4* __restrict__ a, float4* __restrict__ y, size_t n4) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n4) y[i] = a[i];
}

/// y = (a + b)^2: the fused chain the Vulkan bench's first row runs.
__global__ void fused_kernel(const float4* __restrict__ a, const float4* __restrict__ b, float4* __restrict__ y, size_t n4) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n4) {
    const float4 p = a[i], q = b[i];
    const float4 s = make_float4(p.x + q.x, p.y + q.y, p.z + q.z, p.w + q.w);
    y[i] = make_float4(s.x * s.x, s.y * s.y, s.z * s.z, s.w * s.w);
  }
}

template <class T>
void fill(T* x, size_t n) {
  fill_pattern<<<4096, 256>>>(x, n);
  CHECK_CUDA(cudaGetLastError());
}

struct timing {
  float back_to_back_ms;  ///< median over samples of 10 launches between two events, / 10
  float single_ms;        ///< median over samples of one launch between two events (the anchor's way)
};

/// Warms `launch` up for at least 500 ms, then times it both ways (11 samples each).
template <class F>
timing measure(F launch) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  const auto warm_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  while (std::chrono::steady_clock::now() < warm_until) {
    for (int i = 0; i < 10; ++i) launch();
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  const auto sample = [&](int launches) {
    CHECK_CUDA(cudaEventRecord(start));
    for (int i = 0; i < launches; ++i) launch();
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    return ms / static_cast<float>(launches);
  };
  const auto median = [&](int launches) {
    std::vector<float> t;
    for (int s = 0; s < 11; ++s) t.push_back(sample(launches));
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  timing out{median(10), median(1)};
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return out;
}

void report(const char* key, double amount, const timing& t, const char* unit) {
  std::printf("%s %.0f %s\n", key, amount / t.back_to_back_ms / 1e6, unit);
  std::printf("%s_single %.0f %s\n", key, amount / t.single_ms / 1e6, unit);
}

}  // namespace

int main(int argc, char** argv) {
  const size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : (size_t{16} << 20);
  std::vector<int> sizes;
  for (int i = 2; i < argc; ++i) sizes.push_back(std::atoi(argv[i]));
  if (sizes.empty()) sizes = {2048, 4096};
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s\n", prop.name);

  float *a, *b, *y;
  CHECK_CUDA(cudaMalloc(&a, n * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&b, n * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&y, n * sizeof(float)));
  fill(a, n);
  fill(b, n);
  const size_t n4 = n / 4;
  const unsigned blocks = static_cast<unsigned>((n4 + 255) / 256);
  report("copy_bandwidth", 2.0 * n * sizeof(float), measure([&] { copy_kernel<<<blocks, 256>>>(reinterpret_cast<float4*>(a), reinterpret_cast<float4*>(y), n4); }), "GB/s");
  report("fused_elementwise_bandwidth", 3.0 * n * sizeof(float),
         measure([&] { fused_kernel<<<blocks, 256>>>(reinterpret_cast<float4*>(a), reinterpret_cast<float4*>(b), reinterpret_cast<float4*>(y), n4); }),
         "GB/s");
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
  CHECK_CUDA(cudaFree(y));

  cublasHandle_t h;
  CHECK_CUBLAS(cublasCreate(&h));
  for (const int s : sizes) {
    const size_t e = static_cast<size_t>(s) * s;
    const double flops = 2.0 * s * s * s;
    const float one = 1, zero = 0;
    struct gemm_case {
      const char* key;
      cudaDataType in, out;
    };
    for (const gemm_case& c : {gemm_case{"sgemm_fp32", CUDA_R_32F, CUDA_R_32F}, gemm_case{"gemm_fp16_acc32", CUDA_R_16F, CUDA_R_16F},
                               gemm_case{"gemm_bf16_acc32", CUDA_R_16BF, CUDA_R_16BF}}) {
      void *A, *B, *C;
      CHECK_CUDA(cudaMalloc(&A, e * 4));
      CHECK_CUDA(cudaMalloc(&B, e * 4));
      CHECK_CUDA(cudaMalloc(&C, e * 4));
      if (c.in == CUDA_R_32F) {
        fill(static_cast<float*>(A), e);
        fill(static_cast<float*>(B), e);
      } else if (c.in == CUDA_R_16F) {
        fill(static_cast<__half*>(A), e);
        fill(static_cast<__half*>(B), e);
      } else {
        fill(static_cast<__nv_bfloat16*>(A), e);
        fill(static_cast<__nv_bfloat16*>(B), e);
      }
      const timing t = measure([&] {
        CHECK_CUBLAS(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, s, s, s, &one, A, c.in, s, B, c.in, s, &zero, C, c.out, s,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      });
      char key[64];
      std::snprintf(key, sizeof key, "%s_%d", c.key, s);
      report(key, flops, t, "GFLOP/s");
      CHECK_CUDA(cudaFree(A));
      CHECK_CUDA(cudaFree(B));
      CHECK_CUDA(cudaFree(C));
    }
  }
  CHECK_CUBLAS(cublasDestroy(h));
  return 0;
}
