#pragma once
/// An architecture's hyper-parameters, read from a Hugging Face config.json or from GGUF metadata
/// into one struct, and the names each format gives a layer's tensors.
///
/// Rope order, the one fact the two formats disagree on (from llama.cpp's convert_hf_to_gguf.py
/// and llama_model_rope_type()):
/// - Meta's Llama checkpoints rotate adjacent pairs (x[2i], x[2i+1]). Hugging Face's Llama
///   conversion permuted the rows of q_proj and k_proj within each head so that its rotate_half
///   code (pairs x[i], x[i + d/2], what ggml calls NeoX style) gives the same result. So HF
///   llama/mistral checkpoints (TinyLlama, SmolLM, Llama 2/3 and Mistral alike) use NeoX style.
/// - convert_hf_to_gguf.py's LlamaModel undoes that permutation for attn_q and attn_k
///   (reshape(n_head, 2, d/2, ...).swapaxes(1, 2)) and llama.cpp runs LLM_ARCH_LLAMA with
///   LLAMA_ROPE_TYPE_NORM: GGUF llama files use normal (adjacent-pair) style on unpermuted rows.
///   Mistral models convert to the "llama" architecture too.
/// - Qwen2 and Qwen3 are not permuted by the converter and run with LLAMA_ROPE_TYPE_NEOX: NeoX
///   style in both formats. GPT-2 has learned positions and no rope.
/// Llama 3's rope scaling: HF config.json carries rope_scaling {"rope_type": "llama3", factor,
/// low_freq_factor, high_freq_factor, original_max_position_embeddings}; the converter writes no
/// scaling keys for it but a tensor rope_freqs.weight (F32, head_dim/2 entries) whose entries
/// divide each rotation frequency (1 at high frequencies, factor at low ones, smooth between).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.hpp"
#include "models/checkpoint.hpp"
#include "models/gguf.hpp"

namespace mesh::models {

/// The architectures meshnode builds graphs for.
enum class architecture { llama, mistral, qwen2, qwen3, gpt2 };

/// "llama", "mistral", "qwen2", "qwen3", "gpt2".
const char* to_string(architecture a);

/// Which elements rope rotates together.
enum class rope_style {
  none,    ///< no rope (GPT-2: learned position embeddings)
  normal,  ///< adjacent pairs (x[2i], x[2i+1]): ggml's LLAMA_ROPE_TYPE_NORM
  neox,    ///< halves (x[i], x[i + d/2]): HF's rotate_half, ggml's LLAMA_ROPE_TYPE_NEOX
};

const char* to_string(rope_style s);

/// Context extension by scaling rope frequencies.
struct rope_scaling {
  enum class kind {
    none,
    linear,  ///< positions divided by factor
    llama3,  ///< Llama 3.1+: per-frequency factors from the four numbers below (HF), or the
             ///< rope_freqs.weight tensor (GGUF, see model_config::rope_freqs_tensor)
  };
  kind type = kind::none;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 1.0;
  int64_t original_max_position_embeddings = 0;
};

/// How a file names tensors.
enum class tensor_naming { hf, gguf };

/// Everything the graph builder needs to know about an architecture instance.
struct model_config {
  architecture arch = architecture::llama;
  tensor_naming naming = tensor_naming::hf;
  /// Prefix of every HF tensor name where a checkpoint has one (GPT-2 saved by recent
  /// transformers: "transformer."); empty otherwise.
  std::string name_prefix;

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  ///< < n_heads for grouped-query attention
  int64_t head_dim = 0;
  int64_t ffn_size = 0;       ///< the MLP's inner width
  int64_t max_context = 0;    ///< positions the model was trained for
  int64_t sliding_window = 0; ///< 0: full attention (Mistral v0.1 declares 4096)

  bool layer_norm = false;  ///< LayerNorm with bias (GPT-2); otherwise RMSNorm
  double norm_eps = 1e-5;

  rope_style rope = rope_style::none;
  double rope_theta = 10000.0;
  int64_t rope_dims = 0;  ///< dimensions of each head rope rotates (head_dim for these models)
  rope_scaling scaling;
  bool rope_freqs_tensor = false;  ///< GGUF: per-frequency divisors in rope_freqs.weight

  bool qkv_bias = false;     ///< biases on q, k, v (Qwen2; GPT-2 has biases everywhere)
  bool qk_norm = false;      ///< RMSNorm over each head of q and k before rope (Qwen3)
  bool tied_embeddings = false;  ///< the output projection is the token embedding
  /// HF GPT-2 stores its projections as Conv1D weights, [in, out]; every other case (and GPT-2
  /// in GGUF, which the converter transposes) is [out, in] like nn.Linear.
  bool weights_in_out = false;

  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  ///< HF allows several (Llama 3.1 instruct has three)
};

/// Reads the config of an opened checkpoint: config.json for a Hugging Face directory, the
/// metadata for GGUF (a lone .safetensors file has no config: not_found). Where the config leaves
/// something to the tensors (GGUF ties embeddings by leaving out output.weight), they are checked.
expected<model_config> read_model_config(const checkpoint& c);

/// Parses the text of a Hugging Face config.json; `source` names it in errors. Missing keys, wrong
/// types and unsupported architectures are errors naming the file and the key.
expected<model_config> parse_hf_config(std::string_view json_text, const std::string& source);

/// Reads GGUF metadata (and the presence of output.weight, rope_freqs.weight, biases).
expected<model_config> parse_gguf_config(const gguf_view& g);

/// The names of one layer's tensors in the config's naming; a role the architecture lacks is
/// empty. GPT-2 has a fused qkv projection (qkv, qkv_bias) instead of q, k and v.
struct layer_tensor_names {
  std::string attn_norm, attn_norm_bias;
  std::string q, k, v, qkv;
  std::string q_bias, k_bias, v_bias, qkv_bias;
  std::string o, o_bias;
  std::string q_norm, k_norm;
  std::string ffn_norm, ffn_norm_bias;
  std::string gate, up, up_bias, down, down_bias;
};

/// The tensors outside the layers. `output` is the embedding's name when embeddings are tied.
struct model_tensor_names {
  std::string token_embd, position_embd;
  std::string output_norm, output_norm_bias;
  std::string output;
  std::string rope_freqs;  ///< GGUF Llama 3 only
};

layer_tensor_names tensor_names(const model_config& config, int64_t layer);
model_tensor_names tensor_names(const model_config& config);

}  // namespace mesh::models
