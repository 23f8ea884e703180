// Architecture hyper-parameters from Hugging Face config.json and from GGUF metadata, the rope
// order each format implies, and the tensor names each format gives a layer.
#include <catch2/catch.hpp>

#include "checkpoint_writer.hpp"
#include "models/model_config.hpp"

using namespace mesh::models;
using namespace mesh::models::test;
using mesh::error_code;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Llama-3.2-1B's config.json, as published.
const char* llama32 = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009], "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
  "intermediate_size": 8192, "max_position_embeddings": 131072, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16", "vocab_size": 128256})";

// Qwen2.5-0.5B's.
const char* qwen25 = R"({
  "architectures": ["Qwen2ForCausalLM"], "bos_token_id": 151643, "eos_token_id": 151643, "hidden_size": 896,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2",
  "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true, "use_sliding_window": false,
  "vocab_size": 151936})";

// Qwen3-0.6B's (head_dim is not hidden_size / heads).
const char* qwen3 = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "bos_token_id": 151643, "eos_token_id": 151645,
  "head_dim": 128, "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 40960,
  "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "tie_word_embeddings": true,
  "vocab_size": 151936})";

// GPT-2's (small).
const char* gpt2 = R"({
  "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "bos_token_id": 50256,
  "eos_token_id": 50256, "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768,
  "n_head": 12, "n_inner": null, "n_layer": 12, "n_positions": 1024, "vocab_size": 50257})";

// Mistral-7B-v0.1's.
const char* mistral = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_size": 4096,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false, "vocab_size": 32000})";

// The metadata llama.cpp's converter writes for a small Llama 3 model.
gguf_writer llama_gguf() {
  gguf_writer w;
  w.add_string("general.architecture", "llama");
  w.add_u32("llama.context_length", 131072);
  w.add_u32("llama.embedding_length", 64);
  w.add_u32("llama.block_count", 2);
  w.add_u32("llama.feed_forward_length", 256);
  w.add_u32("llama.attention.head_count", 4);
  w.add_u32("llama.attention.head_count_kv", 2);
  w.add_f32("llama.rope.freq_base", 500000.0f);
  w.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.add_u32("llama.rope.dimension_count", 16);
  w.add_u32("llama.vocab_size", 300);
  w.add_u32("tokenizer.ggml.bos_token_id", 1);
  w.add_u32("tokenizer.ggml.eos_token_id", 2);
  w.add_tensor("token_embd.weight", tensor_type::f16, {64, 300}, bytes(64 * 300 * 2));
  w.add_tensor("rope_freqs.weight", tensor_type::f32, {8}, f32_bytes(std::vector<float>(8, 1.0f)));
  return w;
}

mesh::error hf_error(const std::string& json) {
  auto c = parse_hf_config(json, "config.json");
  REQUIRE_FALSE(c);
  return c.error();
}

mesh::expected<model_config> gguf_config(const bytes& b) {
  auto g = gguf_view::parse(b, "m.gguf");
  REQUIRE(g);
  return parse_gguf_config(*g);
}

}  // namespace

TEST_CASE("Llama 3.2 from config.json", "[models][model_config]") {
  auto c = parse_hf_config(llama32, "config.json");
  REQUIRE(c);
  CHECK(c->arch == architecture::llama);
  CHECK(c->naming == tensor_naming::hf);
  CHECK(c->vocab_size == 128256);
  CHECK(c->hidden_size == 2048);
  CHECK(c->n_layers == 16);
  CHECK(c->n_heads == 32);
  CHECK(c->n_kv_heads == 8);
  CHECK(c->head_dim == 64);
  CHECK(c->ffn_size == 8192);
  CHECK(c->max_context == 131072);
  CHECK(c->norm_eps == 1e-5);
  CHECK_FALSE(c->layer_norm);
  CHECK(c->rope == rope_style::neox);  // HF's rotate_half on HF-permuted q/k
  CHECK(c->rope_theta == 500000.0);
  CHECK(c->rope_dims == 64);
  CHECK(c->scaling.type == rope_scaling::kind::llama3);
  CHECK(c->scaling.factor == 32.0);
  CHECK(c->scaling.low_freq_factor == 1.0);
  CHECK(c->scaling.high_freq_factor == 4.0);
  CHECK(c->scaling.original_max_position_embeddings == 8192);
  CHECK(c->tied_embeddings);
  CHECK_FALSE(c->qkv_bias);
  CHECK_FALSE(c->qk_norm);
  CHECK(c->bos_token_id == 128000);
  CHECK(c->eos_token_ids == std::vector<int64_t>{128001, 128008, 128009});
  const auto l = tensor_names(*c, 3);
  CHECK(l.q == "model.layers.3.self_attn.q_proj.weight");
  CHECK(l.k == "model.layers.3.self_attn.k_proj.weight");
  CHECK(l.o == "model.layers.3.self_attn.o_proj.weight");
  CHECK(l.attn_norm == "model.layers.3.input_layernorm.weight");
  CHECK(l.ffn_norm == "model.layers.3.post_attention_layernorm.weight");
  CHECK(l.gate == "model.layers.3.mlp.gate_proj.weight");
  CHECK(l.down == "model.layers.3.mlp.down_proj.weight");
  CHECK(l.q_bias.empty());
  CHECK(l.qkv.empty());
  const auto m = tensor_names(*c);
  CHECK(m.token_embd == "model.embed_tokens.weight");
  CHECK(m.output == "model.embed_tokens.weight");  // tied
  CHECK(m.output_norm == "model.norm.weight");
}

TEST_CASE("Qwen2.5 Qwen3 Mistral and GPT-2 from config.json", "[models][model_config]") {
  auto q2 = parse_hf_config(qwen25, "config.json");
  REQUIRE(q2);
  CHECK(q2->arch == architecture::qwen2);
  CHECK(q2->qkv_bias);
  CHECK(q2->head_dim == 64);
  CHECK(q2->n_kv_heads == 2);
  CHECK(q2->sliding_window == 0);  // use_sliding_window: false
  CHECK(q2->rope == rope_style::neox);
  CHECK(q2->rope_theta == 1000000.0);
  CHECK(tensor_names(*q2, 0).q_bias == "model.layers.0.self_attn.q_proj.bias");
  CHECK(tensor_names(*q2, 0).v_bias == "model.layers.0.self_attn.v_proj.bias");

  auto q3 = parse_hf_config(qwen3, "config.json");
  REQUIRE(q3);
  CHECK(q3->arch == architecture::qwen3);
  CHECK(q3->head_dim == 128);
  CHECK(q3->qk_norm);
  CHECK_FALSE(q3->qkv_bias);
  CHECK(q3->scaling.type == rope_scaling::kind::none);
  CHECK(q3->eos_token_ids == std::vector<int64_t>{151645});
  CHECK(tensor_names(*q3, 1).q_norm == "model.layers.1.self_attn.q_norm.weight");
  CHECK(tensor_names(*q3, 1).k_norm == "model.layers.1.self_attn.k_norm.weight");

  auto mi = parse_hf_config(mistral, "config.json");
  REQUIRE(mi);
  CHECK(mi->arch == architecture::mistral);
  CHECK(mi->sliding_window == 4096);
  CHECK_FALSE(mi->tied_embeddings);
  CHECK(tensor_names(*mi).output == "lm_head.weight");

  auto g = parse_hf_config(gpt2, "config.json");
  REQUIRE(g);
  CHECK(g->arch == architecture::gpt2);
  CHECK(g->hidden_size == 768);
  CHECK(g->ffn_size == 3072);  // n_inner null: 4 x n_embd
  CHECK(g->max_context == 1024);
  CHECK(g->layer_norm);
  CHECK(g->rope == rope_style::none);
  CHECK(g->tied_embeddings);
  CHECK(g->weights_in_out);
  const auto l = tensor_names(*g, 11);
  CHECK(l.qkv == "h.11.attn.c_attn.weight");
  CHECK(l.qkv_bias == "h.11.attn.c_attn.bias");
  CHECK(l.up == "h.11.mlp.c_fc.weight");
  CHECK(l.down_bias == "h.11.mlp.c_proj.bias");
  CHECK(l.q.empty());
  CHECK(tensor_names(*g).position_embd == "wpe.weight");
  CHECK(tensor_names(*g).output == "wte.weight");
}

TEST_CASE("config.json errors name the file and the key", "[models][model_config]") {
  auto e = hf_error(R"({"model_type": "phi3", "vocab_size": 10})");
  CHECK(e.code == error_code::unsupported);
  CHECK(e.message == "config.json: architecture \"phi3\" is not supported (supported: llama, mistral, qwen2, qwen3, gpt2)");
  CHECK(hf_error(R"({"architectures": ["FalconForCausalLM"]})").message ==
        "config.json: architecture \"FalconForCausalLM\" is not supported (supported: llama, mistral, qwen2, qwen3, gpt2)");
  CHECK(hf_error("{}").message == "config.json: key \"model_type\" is missing (and no \"architectures\" entry names the model)");
  CHECK(hf_error(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8})").message ==
        "config.json: key \"num_hidden_layers\" is missing");
  std::string no_eps = qwen25;
  no_eps.replace(no_eps.find("\"rms_norm_eps\""), 14, "\"xms_norm_eps\"");
  CHECK(hf_error(no_eps).message == "config.json: key \"rms_norm_eps\" is missing");
  std::string text_layers = qwen25;
  text_layers.replace(text_layers.find("\"num_hidden_layers\": 24"), 23, "\"num_hidden_layers\": \"24\"");
  const auto t = hf_error(text_layers);
  CHECK(t.code == error_code::dtype_mismatch);
  CHECK(t.message == "config.json: key \"num_hidden_layers\" is not an integer");
  std::string yarn = llama32;
  yarn.replace(yarn.find("\"llama3\""), 8, "\"yarn\"");
  CHECK(hf_error(yarn).message == "config.json: rope scaling \"yarn\" is not supported (supported: default, linear, llama3)");
  std::string no_factor = llama32;
  no_factor.replace(no_factor.find("\"factor\""), 8, "\"fuctor\"");
  CHECK(hf_error(no_factor).message == "config.json rope_scaling: key \"factor\" is missing");
  std::string gqa = mistral;
  gqa.replace(gqa.find("\"num_key_value_heads\": 8"), 24, "\"num_key_value_heads\": 5");
  CHECK(hf_error(gqa).message == "config.json: head count 32 is not a multiple of the key/value head count 5");
  std::string huge = mistral;
  huge.replace(huge.find("\"num_hidden_layers\": 32"), 23, "\"num_hidden_layers\": 99999999");
  CHECK(hf_error(huge).message == "config.json: layer count is 99999999, outside 1..4096");
  CHECK(hf_error("not json").message == "config.json: not a JSON object");
}

TEST_CASE("Llama 3 from GGUF metadata: normal rope and the rope_freqs tensor", "[models][model_config]") {
  const bytes b = llama_gguf().build();
  auto c = gguf_config(b);
  REQUIRE(c);
  CHECK(c->arch == architecture::llama);
  CHECK(c->naming == tensor_naming::gguf);
  CHECK(c->rope == rope_style::normal);  // the converter un-permuted q/k
  CHECK(c->hidden_size == 64);
  CHECK(c->n_layers == 2);
  CHECK(c->n_heads == 4);
  CHECK(c->n_kv_heads == 2);
  CHECK(c->head_dim == 16);
  CHECK(c->rope_dims == 16);
  CHECK(c->ffn_size == 256);
  CHECK(c->vocab_size == 300);
  CHECK(c->max_context == 131072);
  CHECK(c->rope_theta == 500000.0);
  CHECK(c->norm_eps == Approx(1e-5));
  CHECK(c->rope_freqs_tensor);
  CHECK(c->scaling.type == rope_scaling::kind::llama3);
  CHECK(c->tied_embeddings);  // no output.weight
  CHECK(c->bos_token_id == 1);
  CHECK(c->eos_token_ids == std::vector<int64_t>{2});
  const auto l = tensor_names(*c, 1);
  CHECK(l.q == "blk.1.attn_q.weight");
  CHECK(l.o == "blk.1.attn_output.weight");
  CHECK(l.attn_norm == "blk.1.attn_norm.weight");
  CHECK(l.ffn_norm == "blk.1.ffn_norm.weight");
  CHECK(l.gate == "blk.1.ffn_gate.weight");
  CHECK(l.up == "blk.1.ffn_up.weight");
  CHECK(l.down == "blk.1.ffn_down.weight");
  const auto m = tensor_names(*c);
  CHECK(m.output == "token_embd.weight");
  CHECK(m.output_norm == "output_norm.weight");
  CHECK(m.rope_freqs == "rope_freqs.weight");
}

TEST_CASE("Qwen2 Qwen3 and GPT-2 from GGUF metadata", "[models][model_config]") {
  auto base = [](const std::string& a) {
    gguf_writer w;
    w.add_string("general.architecture", a);
    w.add_u32(a + ".context_length", 4096);
    w.add_u32(a + ".embedding_length", 64);
    w.add_u32(a + ".block_count", 2);
    w.add_u32(a + ".feed_forward_length", 128);
    w.add_u32(a + ".attention.head_count", 4);
    w.add_tensor("token_embd.weight", tensor_type::f32, {64, 10}, bytes(64 * 10 * 4));
    w.add_tensor("output.weight", tensor_type::q8_0, {64, 10}, bytes(2 * 34 * 10));
    return w;
  };
  auto q2 = base("qwen2");
  q2.add_f32("qwen2.attention.layer_norm_rms_epsilon", 1e-6f);
  const bytes q2b = q2.build();
  auto c = gguf_config(q2b);
  REQUIRE(c);
  CHECK(c->arch == architecture::qwen2);
  CHECK(c->rope == rope_style::neox);
  CHECK(c->qkv_bias);
  CHECK(c->vocab_size == 10);  // from token_embd's rows
  CHECK(c->n_kv_heads == 4);
  CHECK_FALSE(c->tied_embeddings);
  CHECK(tensor_names(*c, 0).k_bias == "blk.0.attn_k.bias");
  CHECK(tensor_names(*c).output == "output.weight");

  auto q3 = base("qwen3");
  q3.add_f32("qwen3.attention.layer_norm_rms_epsilon", 1e-6f);
  q3.add_u32("qwen3.attention.key_length", 32);
  const bytes q3b = q3.build();
  c = gguf_config(q3b);
  REQUIRE(c);
  CHECK(c->head_dim == 32);
  CHECK(c->qk_norm);
  CHECK(tensor_names(*c, 0).q_norm == "blk.0.attn_q_norm.weight");

  auto g2 = base("gpt2");
  g2.add_f32("gpt2.attention.layer_norm_epsilon", 1e-5f);
  const bytes g2b = g2.build();
  c = gguf_config(g2b);
  REQUIRE(c);
  CHECK(c->layer_norm);
  CHECK(c->rope == rope_style::none);
  CHECK_FALSE(c->weights_in_out);  // the converter transposes GPT-2's Conv1D weights
  const auto l = tensor_names(*c, 0);
  CHECK(l.qkv == "blk.0.attn_qkv.weight");
  CHECK(l.qkv_bias == "blk.0.attn_qkv.bias");
  CHECK(l.attn_norm_bias == "blk.0.attn_norm.bias");
  CHECK(l.up_bias == "blk.0.ffn_up.bias");
  CHECK(tensor_names(*c).position_embd == "position_embd.weight");
  CHECK(tensor_names(*c).output_norm_bias == "output_norm.bias");
}

TEST_CASE("GGUF metadata errors name the file and the key", "[models][model_config]") {
  gguf_writer phi;
  phi.add_string("general.architecture", "phi3");
  const bytes pb = phi.build();
  auto e = gguf_config(pb);
  REQUIRE_FALSE(e);
  CHECK(e.error().message == "m.gguf: architecture \"phi3\" is not supported (supported: llama (also Mistral's files), qwen2, qwen3, gpt2)");

  gguf_writer none;
  const bytes nb = none.build();
  CHECK(gguf_config(nb).error().message == "m.gguf: metadata key \"general.architecture\" is missing");

  gguf_writer partial;
  partial.add_string("general.architecture", "llama");
  partial.add_u32("llama.embedding_length", 64);
  const bytes partial_bytes = partial.build();
  CHECK(gguf_config(partial_bytes).error().message == "m.gguf: metadata key \"llama.block_count\" is missing");

  auto yarn = llama_gguf();
  yarn.add_string("llama.rope.scaling.type", "yarn");
  const bytes yb = yarn.build();
  CHECK(contains(gguf_config(yb).error().message, "m.gguf: rope scaling \"yarn\" (llama.rope.scaling.type) is not supported"));

  auto freqs = llama_gguf();
  freqs.tensors()[1].ne = {4};
  freqs.tensors()[1].data.resize(16);
  const bytes fb = freqs.build();
  CHECK(gguf_config(fb).error().message ==
        "m.gguf: tensor \"rope_freqs.weight\" must be F32 with 8 entries (rope dimensions / 2)");
}

TEST_CASE("read_model_config picks the source by format", "[models][model_config]") {
  temp_dir dir;
  write_file(dir / "m.gguf", llama_gguf().build());
  auto g = checkpoint::open(dir / "m.gguf");
  REQUIRE(g);
  auto gc = read_model_config(*g);
  REQUIRE(gc);
  CHECK(gc->rope == rope_style::normal);

  safetensors_writer w;
  w.add("transformer.wte.weight", "F32", {2, 2}, f32_bytes({1, 2, 3, 4}));
  write_file(dir / "model.safetensors", w.build());
  auto lone = checkpoint::open(dir / "model.safetensors");
  REQUIRE(lone);
  CHECK(contains(read_model_config(*lone).error().message, "a lone safetensors file has no config.json"));

  write_file(dir / "config.json", std::string(gpt2));
  auto hf = checkpoint::open(dir.path());
  REQUIRE(hf);
  auto hc = read_model_config(*hf);
  REQUIRE(hc);
  CHECK(hc->name_prefix == "transformer.");  // saved by a recent transformers
  CHECK(tensor_names(*hc, 0).qkv == "transformer.h.0.attn.c_attn.weight");
  CHECK(tensor_names(*hc).token_embd == "transformer.wte.weight");

  write_file(dir / "config.json", std::string(R"({"model_type": "llama"})"));
  auto bad = checkpoint::open(dir.path());
  REQUIRE(bad);
  CHECK(read_model_config(*bad).error().message == (dir / "config.json").string() + ": key \"vocab_size\" is missing");
}
