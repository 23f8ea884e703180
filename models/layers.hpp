#pragma once
/// The pieces every architecture here is made of, composed from graph/'s ops (the kernel compiler
/// fuses them); projections are graph's `linear` op (it reads f16, bf16 and quantized weights as
/// they are stored) and KV-cache writes its `kv_write` op (in place).
#include <cstdint>
#include <vector>

#include "graph/builder.hpp"
#include "models/model_config.hpp"

namespace mesh::models::layers {

/// x [rows, in] times a projection w stored [out, in] (or [in, out] when `in_out`: HF GPT-2's
/// Conv1D, f32/f16/bf16 only), read as f32 whatever w's dtype: [rows, out].
expr linear(const expr& x, const expr& w, bool in_out = false);

/// Rows `ids` (i32 [n]) of an embedding table [vocab, d] as f32 [n, d], whatever the table's
/// dtype (a quantized table is decoded row by row as it is read).
expr embedding(const expr& table, const expr& ids);

/// x * rsqrt(mean(x^2 over the last axis) + eps) * w (w over the last axis).
expr rms_norm(const expr& x, const expr& w, double eps);

/// The rotation frequencies of rope: theta^(-2i/dims) for i < dims/2, then Llama 3 scaling
/// (HF's _compute_llama3_parameters), linear scaling (divided by factor) and GGUF's per-frequency
/// divisors (`freq_divisors`, rope_freqs.weight; empty for none), computed in double.
std::vector<double> rope_frequencies(const model_config& c, const std::vector<float>& freq_divisors);

/// Rotates the first `dims` features of every head of x [rows, heads, head_dim] by angle
/// position * frequency: normal style pairs (2i, 2i+1), NeoX style pairs (i, i + dims/2).
/// cos and sin are [rows, 1, dims/2].
expr rope(const expr& x, const expr& cos, const expr& sin, int64_t dims, rope_style style);

/// Writes `rows` [l, width] into the cache parameter [n, width], row i at cache row dest[i]
/// (dest: i32 [l]; a negative entry writes nothing), as the graph's update of that parameter, and
/// returns the updated cache for attention to read.
expr write_cache(const expr& cache, const expr& rows, const expr& dest);

/// The first `attended` rows of one sequence's cache in a cache of several sequences of `context`
/// rows each ([slots * context, width], slot s at rows s * context ...), picked by `slot` (i32
/// [1], a runtime value): [attended, width].
expr slot_rows(const expr& cache, const expr& slot, int64_t context, int64_t attended);

/// Query rows up to which attention() and batched_attention() use the fused attention op.
inline constexpr int64_t fused_attention_max_rows = 16;
/// attention() takes the fused op for any number of query rows when heads are at most this
/// wide: the Vulkan executor then runs a prompt's attention as one kernel reading each key once
/// per tile of query rows (gpu/plan.hpp attention_tiled_max_dim).
inline constexpr int64_t fused_attention_max_head_dim = 128;

/// Causal grouped-query attention of q [l, heads, head_dim] over the first `attended` rows of
/// the caches k, v [n, kv_heads * head_dim]; query row i at position positions[i] (i32 [l]) sees
/// cache rows t <= positions[i] (and t > positions[i] - window when window > 0). Query head h uses
/// key/value head h / (heads / kv_heads), as HF's repeat_kv does. Result [l, heads * head_dim].
/// Up to fused_attention_max_rows query rows (decode), or any number with heads at most
/// fused_attention_max_head_dim wide, take the fused op (mesh::attention); otherwise the rows are
/// composed of matmuls and a softmax, which reuse each key across the rows.
expr attention(const expr& q, const expr& k_cache, const expr& v_cache, const expr& positions, int64_t kv_heads,
               int64_t attended, int64_t window);

/// A decode step of b sequences, one query row each: row i of q [b, heads, head_dim] is the next
/// token of the sequence in slot row_slots[i] (i32 [b]) of the caches k, v [slots * context,
/// kv_heads * head_dim] and sees that slot's rows t <= positions[i] (i32 [b]; and t >
/// positions[i] - window when window > 0), of its first `attended`. Otherwise as attention().
/// Result [b, heads * head_dim]. Up to fused_attention_max_rows sequences take the fused op.
expr batched_attention(const expr& q, const expr& k_cache, const expr& v_cache, const expr& positions, const expr& row_slots,
                       int64_t kv_heads, int64_t context, int64_t attended, int64_t window);

}  // namespace mesh::models::layers
