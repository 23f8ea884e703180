#pragma once
/// A checkpoint as a model to fine-tune: the causal language model's training graph (the loss of
/// predicting each next token) with the checkpoint's tensors as its parameters, for full
/// fine-tuning or for LoRA adapters beside frozen weights.
///
/// The graph is the same architecture as transformer.hpp's inference graph, composed only of
/// differentiable ops (attention as matmuls and a softmax over a causal mask, not the fused
/// inference op), over a micro-batch of `batch` sequences of `sequence` tokens at positions
/// 0 .. sequence - 1:
///
///   inputs  "tokens"  i32 [batch, sequence]   the tokens read
///           "targets" i32 [batch, sequence]   the next token at each position
///           "mask"    f32 [batch, sequence]   1 where the target counts, 0 where it does not
///   output  "loss"    f32 []                  sum(mask * -log p(target)) / max(sum(mask), 1)
///
/// Parameters are named by the Hugging Face tensor names ("model.layers.0.self_attn.q_proj.weight")
/// whatever the file, and hold the Hugging Face layout: a GGUF Llama's q and k rows, which
/// llama.cpp's converter interleaves for its rope, are put back in Hugging Face's order (and rope
/// rotates halves, as Hugging Face does), so a fine-tuned model saves as a Hugging Face directory
/// and its adapters in PEFT's layout (peft.hpp).
///
/// Full fine-tuning trains every tensor, as f32 (widened or dequantized from the file). LoRA
/// (rank > 0) freezes the checkpoint's tensors in the dtype the file stores them (f16, bf16 and
/// the quantized GGUF types stay as they are; the linear op reads them) and adds to each target
/// projection W x the product (alpha / rank) B A x, with A [rank, in] and B [out, rank] the only
/// trained parameters: "<module>.lora_A.weight" and "<module>.lora_B.weight", module being the
/// projection's Hugging Face name without ".weight". A starts uniform in +-1/sqrt(in) (PEFT's
/// default), B at zero, so training starts from the checkpoint's own outputs.
///
/// Mixed precision (finetune_options::compute): the products' operands in f16 or bf16, everything
/// else, and the master weights, in f32 (Micikevicius et al., "Mixed Precision Training").
///
/// Architectures: the Llama family (Llama, Mistral, Qwen2, Qwen3) and GPT-2. GPT-2's parameters
/// are named as transformers' GPT2LMHeadModel names them ("transformer.h.0.attn.c_attn.weight",
/// the weights in its Conv1D layout [in, out], used as x W + b); its LoRA targets are c_attn (the
/// fused q/k/v projection), c_proj (the attention's and the MLP's output projections, as PEFT
/// matches the name) and c_fc, with A [rank, in] and B [out, rank] as for the Llama family. A GGUF
/// GPT-2's projections are [out, in] in the file: transposed to [in, out] when trained in full,
/// kept as the file has them (and read x W^T) when frozen beside adapters.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.hpp"
#include "graph/evaluate.hpp"
#include "graph/graph.hpp"
#include "models/checkpoint.hpp"
#include "models/model_config.hpp"

namespace mesh::models {

struct lora_options {
  int64_t rank = 0;  ///< 0: full fine-tuning
  double alpha = 16;
  /// The projections that get adapters, by their Hugging Face module name (lora_target_names);
  /// empty: the architecture's default (default_lora_targets).
  std::vector<std::string> targets;
  uint64_t seed = 1;  ///< of A's starting values
};

struct finetune_options {
  int64_t batch = 1;       ///< sequences per micro-batch
  int64_t sequence = 128;  ///< tokens per sequence (at most the model's context)
  lora_options lora;
  /// The dtype the products run in (mixed precision): f32 (default), f16 or bf16. With f16 or
  /// bf16 the inputs of every projection, of attention's two products and of the head are rounded
  /// to it and the products' results widened back to f32; parameters (the master weights), norms,
  /// softmax, rope, the residual stream and the loss stay f32, and a weight's gradient is widened to
  /// f32 from the product that makes it. f16 wants loss scaling (train_options::loss_scale).
  dtype compute = dtype::f32;
};

/// `c` with the names of the fine-tuned parameters (tensor_names of the result): Hugging Face's,
/// GPT-2's under "transformer." as GPT2LMHeadModel's state dict has them.
model_config hf_naming(model_config c);

/// The projections LoRA may target in a model of `arch`: q_proj, k_proj, v_proj, o_proj,
/// gate_proj, up_proj, down_proj (the Llama family); c_attn, c_proj, c_fc (GPT-2).
const std::vector<std::string>& lora_target_names(architecture arch);
/// The targets when none are given: q_proj, k_proj, v_proj and o_proj for the Llama family (PEFT's
/// own default is q_proj and v_proj); c_attn for GPT-2 (PEFT's default).
const std::vector<std::string>& default_lora_targets(architecture arch);
/// Whether `name` is a projection LoRA may target in any architecture.
bool is_lora_target_name(std::string_view name);

/// A checkpoint ready to train.
struct finetune_model {
  graph g;            ///< inputs tokens, targets, mask; output loss
  tensor_map state;   ///< the starting value of every parameter of g
  std::vector<std::string> trainable;  ///< the parameters to train (LoRA: only the adapters)
  model_config config;  ///< the model, in Hugging Face layout (rope neox where the file had interleaved rows)
  lora_options lora;  ///< its targets resolved (never empty)
  /// The file's q and k rows were interleaved (GGUF Llama): an adapter merged into that file
  /// interleaves B's rows of q_proj and k_proj the same way (peft.hpp).
  bool interleaved_qk = false;
};

/// The training graph and starting state of `ckpt`. Errors name what does not fit: a missing or
/// misshapen tensor (the checkpoint's message), an unknown LoRA target, a sequence longer than
/// the model's context, an architecture's projection it does not have.
expected<finetune_model> build_finetune_model(const model_config& config, const checkpoint& ckpt,
                                              const finetune_options& options);

/// llama.cpp's converter orders each head's q (or k) rows as pairs (2i, 2i+1) of Hugging Face's
/// rows (i, i + half): this puts rows of `rows_total` x `row_bytes` bytes back in Hugging Face's
/// order (`to_hf`) or into the converter's (`!to_hf`), `heads` heads of equal size.
std::vector<uint8_t> reorder_rope_rows(std::span<const uint8_t> bytes, int64_t heads, int64_t rows_total,
                                       int64_t row_bytes, bool to_hf);

}  // namespace mesh::models
