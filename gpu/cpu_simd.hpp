#pragma once
/// Helpers shared by the CPU linear's AVX2 kernels (cpu_linear.cpp: f32 dots that decode weight
/// blocks to floats; cpu_quant_dot.cpp: integer dots against x quantized to 8 bits). The AVX2
/// functions carry their own target attribute: the binaries target baseline x86-64 and call them
/// only where cpu_isa.hpp found AVX2, FMA and F16C.
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace mesh::gpu::simd {

/// A q4_k block's 8 scales (bytes 0-7 of `u`) and 8 minimums (bytes 8-15) from its 12 packed
/// bytes (graph/quant.hpp), unpacked with word operations.
inline void q4_k_scales_mins(const uint8_t* packed, uint32_t u[4]) {
  constexpr uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, low2 = 0x03030303;
  std::memcpy(u, packed, 12);
  u[3] = ((u[2] >> 4) & low4) | (((u[1] >> 6) & low2) << 4);  // mins 4-7
  const uint32_t mins_lo = u[1] & low6;                        // mins 0-3
  u[1] = (u[2] & low4) | (((u[0] >> 6) & low2) << 4);          // scales 4-7
  u[2] = mins_lo;
  u[0] &= low6;  // scales 0-3
}

#if defined(__x86_64__)
#define MESH_AVX2 __attribute__((target("avx2,fma,f16c")))

/// The sum of v's 8 lanes.
MESH_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/// The f16 at p (any alignment) as a float.
MESH_AVX2 inline float f16_at(const uint8_t* p) {
  uint16_t h = 0;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

/// Fetches `lines` cache lines from p into L1 while the current block is computed: a weight row's
/// blocks stream through once, and the hardware prefetcher alone leaves the loads waiting.
MESH_AVX2 inline void prefetch(const uint8_t* p, int lines) {
  for (int l = 0; l < lines; ++l) _mm_prefetch(reinterpret_cast<const char*>(p + 64 * l), _MM_HINT_T0);
}
/// How far ahead of the block being computed the weight dots prefetch, in bytes.
constexpr int64_t prefetch_ahead = 1024;
#endif

}  // namespace mesh::gpu::simd
