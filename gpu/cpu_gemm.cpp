// Blocked f32 GEMM after the BLIS scheme: for each slice of n (nc columns) and of k (kc), B's
// slice is packed into 16-column panels (kc x 16, contiguous, L1-sized); for each block of mc rows
// of A, A's block is packed into 6-row panels (L2-sized); the register tile then multiplies one A
// panel with one B panel, reading both sequentially. Packing pads the edges with zeros, so the
// tile is always 6 x 16; edge tiles go through a local buffer.
#include "gpu/cpu_gemm.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "gpu/cpu_thread_pool.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace mesh::gpu {
namespace {

constexpr int64_t mr = 6, nr = 16;  // the register tile
constexpr int64_t kc_max = 256;     // a B panel of kc x 16 floats is 16 KiB: L1
constexpr int64_t mc_max = 96;      // an A block of 96 x 256 floats is 96 KiB: L2
constexpr int64_t nc_max = 2048;    // a B slice of 256 x 2048 floats is 2 MiB: L2/L3

/// One thread's packing buffers, kept between calls (they grow once, to the largest slices).
struct pack_buffers {
  std::vector<float> a, b;
};
pack_buffers& buffers() {
  thread_local pack_buffers p;
  return p;
}

/// A's rows [0, rows) x columns [0, kc) into panels of mr rows: panel q holds element (q*mr + i, p)
/// at q*mr*kc + p*mr + i; rows past `rows` are zeros.
void pack_a(const float* a, int64_t a_row, int64_t a_col, int64_t rows, int64_t kc, float* dst) {
  for (int64_t i0 = 0; i0 < rows; i0 += mr, dst += mr * kc) {
    const int64_t h = std::min(mr, rows - i0);
    for (int64_t i = 0; i < h; ++i) {
      const float* src = a + (i0 + i) * a_row;
      if (a_col == 1)
        for (int64_t p = 0; p < kc; ++p) dst[p * mr + i] = src[p];
      else
        for (int64_t p = 0; p < kc; ++p) dst[p * mr + i] = src[p * a_col];
    }
    for (int64_t i = h; i < mr; ++i)
      for (int64_t p = 0; p < kc; ++p) dst[p * mr + i] = 0.0f;
  }
}

/// B's rows [0, kc) x columns [0, cols) into panels of nr columns: panel q holds element
/// (p, q*nr + j) at q*nr*kc + p*nr + j; columns past `cols` are zeros.
void pack_b(const float* b, int64_t b_row, int64_t b_col, int64_t kc, int64_t cols, float* dst) {
  for (int64_t j0 = 0; j0 < cols; j0 += nr, dst += nr * kc) {
    const int64_t w = std::min(nr, cols - j0);
    if (b_col == 1) {
      for (int64_t p = 0; p < kc; ++p) {
        std::memcpy(dst + p * nr, b + p * b_row + j0, static_cast<size_t>(w) * sizeof(float));
        std::fill(dst + p * nr + w, dst + (p + 1) * nr, 0.0f);
      }
    } else {  // B transposed (a linear layer's weight rows): read each column down its contiguous run
      for (int64_t j = 0; j < w; ++j) {
        const float* src = b + (j0 + j) * b_col;
        for (int64_t p = 0; p < kc; ++p) dst[p * nr + j] = src[p * b_row];
      }
      for (int64_t p = 0; p < kc; ++p) std::fill(dst + p * nr + w, dst + (p + 1) * nr, 0.0f);
    }
  }
}

/// The 6 x 16 tile: c (ldc apart) = (add ? c : 0) + a_panel x b_panel over kc, in order of p.
/// Plain C++: at -O2/-O3 the j loops become SSE code.
void tile_portable(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, bool add) {
  float acc[mr][nr];
  for (int64_t i = 0; i < mr; ++i)
    for (int64_t j = 0; j < nr; ++j) acc[i][j] = add ? c[i * ldc + j] : 0.0f;
  for (int64_t p = 0; p < kc; ++p, a += mr, b += nr)
    for (int64_t i = 0; i < mr; ++i) {
      const float av = a[i];
      for (int64_t j = 0; j < nr; ++j) acc[i][j] += av * b[j];
    }
  for (int64_t i = 0; i < mr; ++i)
    for (int64_t j = 0; j < nr; ++j) c[i * ldc + j] = acc[i][j];
}

#if defined(__x86_64__)
/// The tile in twelve AVX2 registers (6 rows x 2 vectors of 8), one FMA per pair of A and B
/// values: the loop's 12 FMAs per 2 B loads and 6 broadcasts keep both FMA ports busy.
__attribute__((target("avx2,fma"))) void tile_avx2(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, bool add) {
  __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
  if (add) {
    c00 = _mm256_loadu_ps(c), c01 = _mm256_loadu_ps(c + 8);
    c10 = _mm256_loadu_ps(c + ldc), c11 = _mm256_loadu_ps(c + ldc + 8);
    c20 = _mm256_loadu_ps(c + 2 * ldc), c21 = _mm256_loadu_ps(c + 2 * ldc + 8);
    c30 = _mm256_loadu_ps(c + 3 * ldc), c31 = _mm256_loadu_ps(c + 3 * ldc + 8);
    c40 = _mm256_loadu_ps(c + 4 * ldc), c41 = _mm256_loadu_ps(c + 4 * ldc + 8);
    c50 = _mm256_loadu_ps(c + 5 * ldc), c51 = _mm256_loadu_ps(c + 5 * ldc + 8);
  } else {
    c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 = _mm256_setzero_ps();
  }
  for (int64_t p = 0; p < kc; ++p, a += mr, b += nr) {
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
    __m256 av = _mm256_broadcast_ss(a);
    c00 = _mm256_fmadd_ps(av, b0, c00), c01 = _mm256_fmadd_ps(av, b1, c01);
    av = _mm256_broadcast_ss(a + 1);
    c10 = _mm256_fmadd_ps(av, b0, c10), c11 = _mm256_fmadd_ps(av, b1, c11);
    av = _mm256_broadcast_ss(a + 2);
    c20 = _mm256_fmadd_ps(av, b0, c20), c21 = _mm256_fmadd_ps(av, b1, c21);
    av = _mm256_broadcast_ss(a + 3);
    c30 = _mm256_fmadd_ps(av, b0, c30), c31 = _mm256_fmadd_ps(av, b1, c31);
    av = _mm256_broadcast_ss(a + 4);
    c40 = _mm256_fmadd_ps(av, b0, c40), c41 = _mm256_fmadd_ps(av, b1, c41);
    av = _mm256_broadcast_ss(a + 5);
    c50 = _mm256_fmadd_ps(av, b0, c50), c51 = _mm256_fmadd_ps(av, b1, c51);
  }
  _mm256_storeu_ps(c, c00), _mm256_storeu_ps(c + 8, c01);
  _mm256_storeu_ps(c + ldc, c10), _mm256_storeu_ps(c + ldc + 8, c11);
  _mm256_storeu_ps(c + 2 * ldc, c20), _mm256_storeu_ps(c + 2 * ldc + 8, c21);
  _mm256_storeu_ps(c + 3 * ldc, c30), _mm256_storeu_ps(c + 3 * ldc + 8, c31);
  _mm256_storeu_ps(c + 4 * ldc, c40), _mm256_storeu_ps(c + 4 * ldc + 8, c41);
  _mm256_storeu_ps(c + 5 * ldc, c50), _mm256_storeu_ps(c + 5 * ldc + 8, c51);
}
#endif

/// One tile of C at c: rows x cols of it (<= mr x nr) are real; a partial tile is computed in a
/// local buffer and copied out.
void tile(cpu_isa isa, int64_t kc, const float* a, const float* b, float* c, int64_t ldc, int64_t rows, int64_t cols, bool add) {
  auto kernel = [&](float* dst, int64_t ld) {
#if defined(__x86_64__)
    if (isa == cpu_isa::avx2) return tile_avx2(kc, a, b, dst, ld, add);
#endif
    (void)isa;
    tile_portable(kc, a, b, dst, ld, add);
  };
  if (rows == mr && cols == nr) return kernel(c, ldc);
  float t[mr * nr] = {};
  if (add)
    for (int64_t i = 0; i < rows; ++i) std::memcpy(t + i * nr, c + i * ldc, static_cast<size_t>(cols) * sizeof(float));
  kernel(t, nr);
  for (int64_t i = 0; i < rows; ++i) std::memcpy(c + i * ldc, t + i * nr, static_cast<size_t>(cols) * sizeof(float));
}

/// Rows [i0, i1) x columns [j0, j1) of one batch's C.
void block(const gemm_args& g, cpu_isa isa, const float* a, const float* b, float* c, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  if (g.k == 0) {
    for (int64_t i = i0; i < i1; ++i) std::fill(c + i * g.c_row + j0, c + i * g.c_row + j1, 0.0f);
    return;
  }
  pack_buffers& buf = buffers();
  const int64_t kc_top = std::min(kc_max, g.k);
  const auto a_size = static_cast<size_t>(std::min(mc_max, (i1 - i0 + mr - 1) / mr * mr) * kc_top);
  const auto b_size = static_cast<size_t>(std::min(nc_max, (j1 - j0 + nr - 1) / nr * nr) * kc_top);
  if (buf.a.size() < a_size) buf.a.resize(a_size);
  if (buf.b.size() < b_size) buf.b.resize(b_size);
  for (int64_t jc = j0; jc < j1; jc += nc_max) {
    const int64_t nc = std::min(nc_max, j1 - jc);
    for (int64_t pc = 0; pc < g.k; pc += kc_max) {
      const int64_t kc = std::min(kc_max, g.k - pc);
      pack_b(b + pc * g.b_row + jc * g.b_col, g.b_row, g.b_col, kc, nc, buf.b.data());
      for (int64_t ic = i0; ic < i1; ic += mc_max) {
        const int64_t mc = std::min(mc_max, i1 - ic);
        pack_a(a + ic * g.a_row + pc * g.a_col, g.a_row, g.a_col, mc, kc, buf.a.data());
        for (int64_t jr = 0; jr < nc; jr += nr)
          for (int64_t ir = 0; ir < mc; ir += mr)
            tile(isa, kc, buf.a.data() + ir * kc, buf.b.data() + jr * kc, c + (ic + ir) * g.c_row + jc + jr, g.c_row,
                 std::min(mr, mc - ir), std::min(nr, nc - jr), pc > 0);
      }
    }
  }
}

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

}  // namespace

void gemm_f32(const gemm_args& g, cpu_isa isa, thread_pool* pool) {
  if (g.batch <= 0 || g.m <= 0 || g.n <= 0) return;
  // Split each batch's C into chunks of whole tiles, enough that every thread gets work: rows
  // first (each thread then packs B's slice for its own rows, and A's rows once), columns when
  // there are too few row tiles. Below ~2^18 flops a product runs on the calling thread alone.
  const double flops = 2.0 * static_cast<double>(g.batch) * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
  const int64_t threads = pool && flops >= (1 << 18) ? pool->size() : 1;
  const int64_t want = (threads + g.batch - 1) / g.batch;  // chunks per batch
  const int64_t m_tiles = (g.m + mr - 1) / mr, n_tiles = (g.n + nr - 1) / nr;
  const int64_t mt = std::min(want, m_tiles);
  const int64_t nt = std::min((want + mt - 1) / mt, n_tiles);
  const int64_t m_chunk = round_up((g.m + mt - 1) / mt, mr), n_chunk = round_up((g.n + nt - 1) / nt, nr);
  const int64_t mc = (g.m + m_chunk - 1) / m_chunk, nc = (g.n + n_chunk - 1) / n_chunk;
  auto part = [&](int64_t q) {
    const int64_t t = q / (mc * nc), mi = q / nc % mc, ni = q % nc;
    block(g, isa, g.a + t * g.a_batch, g.b + t * g.b_batch, g.c + t * g.c_batch, mi * m_chunk, std::min(g.m, (mi + 1) * m_chunk),
          ni * n_chunk, std::min(g.n, (ni + 1) * n_chunk));
  };
  const int64_t parts = g.batch * mc * nc;
  if (threads > 1) pool->run(parts, part);
  else
    for (int64_t q = 0; q < parts; ++q) part(q);
}

}  // namespace mesh::gpu
