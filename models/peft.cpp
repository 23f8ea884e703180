#include "models/peft.hpp"

#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/durable_file.hpp"
#include "graph/safetensors.hpp"
#include "models/checkpoint_tokenizer.hpp"
#include "models/hf_export.hpp"
#include "models/json_depth.hpp"

namespace mesh::models {
namespace {

using json = nlohmann::json;

constexpr std::string_view peft_prefix = "base_model.model.";
constexpr int64_t max_rank = 4096;
constexpr size_t max_config_bytes = size_t{1} << 20;
constexpr size_t max_config_depth = 16;

/// The role ("q_proj", "c_attn", ...) of a Hugging Face module name, or "".
std::string role_of(const std::string& module) {
  for (const architecture a : {architecture::llama, architecture::gpt2})
    for (const auto& r : lora_target_names(a))
      if (module.size() > r.size() && module.compare(module.size() - r.size(), r.size(), r) == 0 &&
          module[module.size() - r.size() - 1] == '.')
        return r;
  return {};
}

/// The file's name of Hugging Face projection `module` ("model.layers.<l>.<...>.<role>",
/// "transformer.h.<l>.<...>.<role>") of `config`, or "".
std::string file_name_of(const model_config& config, const std::string& module) {
  const model_config hf = hf_naming(config);
  for (int64_t l = 0; l < config.n_layers; ++l) {
    const auto h = tensor_names(hf, l), f = tensor_names(config, l);
    const std::pair<const std::string*, const std::string*> roles[] = {{&h.q, &f.q},       {&h.k, &f.k},   {&h.v, &f.v},
                                                                       {&h.qkv, &f.qkv},   {&h.o, &f.o},   {&h.gate, &f.gate},
                                                                       {&h.up, &f.up},     {&h.down, &f.down}};
    for (const auto& [hn, fn] : roles)
      if (!hn->empty() && *hn == module + ".weight") return *fn;
  }
  return {};
}

}  // namespace

double lora_config::scale() const {
  return rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / static_cast<double>(rank);
}

expected<lora_config> parse_lora_config(std::string_view text, const std::string& source) {
  const auto bad = [&](const std::string& why) { return make_error(error_code::invalid_argument, source + ": " + why); };
  if (text.size() > max_config_bytes) return bad(fmt::format("larger than {} bytes (an adapter config is a few hundred)", max_config_bytes));
  if (json_too_deep(text, max_config_depth)) return bad(fmt::format("JSON nested deeper than {} levels", max_config_depth));
  const json doc = json::parse(text.begin(), text.end(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) return bad("not a JSON object");
  const auto truthy = [&](const char* key) { return doc.contains(key) && doc[key].is_boolean() && doc[key].get<bool>(); };
  const auto non_empty = [&](const char* key) {
    return doc.contains(key) && !doc[key].is_null() && !((doc[key].is_object() || doc[key].is_array()) && doc[key].empty());
  };
  if (doc.contains("peft_type") && !(doc["peft_type"].is_string() && doc["peft_type"].get<std::string>() == "LORA"))
    return bad("peft_type is not \"LORA\" (only LoRA adapters are applied)");
  lora_config c;
  if (!doc.contains("r") || !doc["r"].is_number_integer()) return bad("\"r\" (the rank) is missing or not an integer");
  c.rank = doc["r"].get<int64_t>();
  if (c.rank < 1 || c.rank > max_rank) return bad(fmt::format("rank {} is out of range (1..{})", c.rank, max_rank));
  if (!doc.contains("lora_alpha") || !doc["lora_alpha"].is_number()) return bad("\"lora_alpha\" is missing or not a number");
  c.alpha = doc["lora_alpha"].get<double>();
  if (!std::isfinite(c.alpha)) return bad("\"lora_alpha\" is not finite");
  c.rslora = truthy("use_rslora");
  if (truthy("use_dora")) return bad("DoRA adapters (use_dora) are not supported");
  // fan_in_fan_out is not read: PEFT itself overrides it by the module's kind (true for GPT-2's
  // Conv1D, false for nn.Linear), and so does the merge here (the base's layout decides).
  if (non_empty("rank_pattern") || non_empty("alpha_pattern")) return bad("per-module rank_pattern / alpha_pattern are not supported");
  if (non_empty("modules_to_save")) return bad("modules_to_save (fully trained modules beside the adapters) are not supported");
  if (non_empty("layers_to_transform")) return bad("layers_to_transform is not supported");
  if (doc.contains("bias") && !(doc["bias"].is_string() && doc["bias"].get<std::string>() == "none"))
    return bad("trained biases (bias other than \"none\") are not supported");
  if (!doc.contains("target_modules") || !doc["target_modules"].is_array())
    return bad("\"target_modules\" must be a list of module names (a regular expression is not supported)");
  for (const auto& t : doc["target_modules"]) {
    if (!t.is_string()) return bad("\"target_modules\" holds a value that is not a string");
    const auto name = t.get<std::string>();
    if (!is_lora_target_name(name))
      return bad("target module \"" + name +
                 "\" is not a projection meshnode adapts (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; GPT-2: "
                 "c_attn, c_proj, c_fc)");
    c.targets.push_back(name);
  }
  if (c.targets.empty()) return bad("\"target_modules\" is empty");
  if (doc.contains("base_model_name_or_path") && doc["base_model_name_or_path"].is_string())
    c.base_model = doc["base_model_name_or_path"].get<std::string>();
  return c;
}

expected<lora_adapter> read_lora_adapter(const std::filesystem::path& dir) {
  const auto config_path = dir / "adapter_config.json", tensors_path = dir / "adapter_model.safetensors";
  std::ifstream f(config_path, std::ios::binary);
  if (!f) return make_error(error_code::not_found, config_path.string() + ": cannot open (a PEFT adapter directory holds adapter_config.json)");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto config = parse_lora_config(text, config_path.string());
  if (!config) return forward_error(config);
  auto file = load_safetensors(tensors_path);
  if (!file) return make_error(file.error().code, tensors_path.string() + ": " + file.error().message);
  lora_adapter out;
  out.config = *config;
  const auto bad = [&](const std::string& why) { return make_error(error_code::invalid_argument, tensors_path.string() + ": " + why); };
  for (const auto& [name, t] : file->tensors) {
    const bool is_a = name.ends_with(".lora_A.weight"), is_b = name.ends_with(".lora_B.weight");
    if (!name.starts_with(peft_prefix) || (!is_a && !is_b))
      return bad("unexpected tensor " + quote_name(name) + " (an adapter holds base_model.model.<module>.lora_A.weight and .lora_B.weight)");
    const std::string module = name.substr(peft_prefix.size(), name.size() - peft_prefix.size() - std::string_view(".lora_A.weight").size());
    const std::string role = role_of(module);
    if (role.empty() || std::find(config->targets.begin(), config->targets.end(), role) == config->targets.end())
      return bad("tensor " + quote_name(name) + " adapts a module the config's target_modules do not name");
    if (!is_float(t.type) || t.dims.size() != 2) return bad("tensor " + quote_name(name) + " is not a float matrix");
    const int64_t rank_dim = is_a ? t.dims[0] : t.dims[1];
    if (rank_dim != config->rank)
      return bad(fmt::format("tensor {} has shape {}: its rank dimension is not r = {}", quote_name(name), shape_string(t.dims), config->rank));
    auto& p = out.modules[module];
    (is_a ? p.a : p.b) = t.type == dtype::f32 ? t : tensor::from_floats(t.dims, t.to_floats());
  }
  for (const auto& [module, p] : out.modules)
    if (p.a.dims.empty() || p.b.dims.empty())
      return bad("module " + quote_name(module) + " has only one of lora_A and lora_B");
  if (out.modules.empty()) return bad("no adapter tensors");
  return out;
}

expected<void> merge_lora_adapter(checkpoint& base, const model_config& config, const lora_adapter& adapter) {
  const bool interleaved = config.naming == tensor_naming::gguf && config.rope == rope_style::normal;
  const double scale = adapter.config.scale();
  for (const auto& [module, p] : adapter.modules) {
    const std::string role = role_of(module);
    const std::string file_name = file_name_of(config, module);
    if (file_name.empty())
      return make_error(error_code::not_found, fmt::format("adapter module {} is not a projection of {}", quote_name(module), base.path().string()));
    const tensor_view* w = base.find(file_name);
    if (!w) return make_error(error_code::not_found, base.path().string() + ": tensor " + quote_name(file_name) + " is missing");
    const int64_t out = p.b.dims[0], in = p.a.dims[1], r = p.a.dims[0];
    // A Hugging Face GPT-2 stores its projections as Conv1D, [in, out]: the delta goes in transposed.
    const bool in_out = config.weights_in_out;
    if (w->shape != (in_out ? std::vector<int64_t>{in, out} : std::vector<int64_t>{out, in}))
      return make_error(error_code::shape_mismatch, fmt::format("adapter module {} is [{}, {}], but {} has shape {}{}", quote_name(module), out,
                                                                in, quote_name(file_name), shape_string(w->shape),
                                                                in_out ? " (stored [in, out])" : ""));
    // W as f32, then + scale * B A, row by row.
    tensor wt;
    wt.type = to_dtype(w->type);
    wt.dims = w->shape;
    wt.bytes.assign(w->data.begin(), w->data.end());
    std::vector<float> merged = wt.to_floats();
    const auto a = p.a.to_floats(), b = p.b.to_floats();
    std::vector<float> delta(static_cast<size_t>(out * in), 0.0f);
    for (int64_t i = 0; i < out; ++i)
      for (int64_t k = 0; k < r; ++k) {
        const float bk = static_cast<float>(scale * b[static_cast<size_t>(i * r + k)]);
        const float* ar = a.data() + k * in;
        float* dr = delta.data() + i * in;
        for (int64_t j = 0; j < in; ++j) dr[j] += bk * ar[j];
      }
    std::vector<uint8_t> delta_bytes(delta.size() * sizeof(float));
    std::memcpy(delta_bytes.data(), delta.data(), delta_bytes.size());
    if (interleaved && (role == "q_proj" || role == "k_proj"))
      delta_bytes = reorder_rope_rows(delta_bytes, role == "q_proj" ? config.n_heads : config.n_kv_heads, out,
                                      in * static_cast<int64_t>(sizeof(float)), false);
    std::memcpy(delta.data(), delta_bytes.data(), delta_bytes.size());
    if (in_out)
      for (int64_t i = 0; i < out; ++i)
        for (int64_t j = 0; j < in; ++j) merged[static_cast<size_t>(j * out + i)] += delta[static_cast<size_t>(i * in + j)];
    else
      for (size_t i = 0; i < merged.size(); ++i) merged[i] += delta[i];
    std::vector<uint8_t> bytes(merged.size() * sizeof(float));
    std::memcpy(bytes.data(), merged.data(), bytes.size());
    if (auto ok = base.replace(file_name, tensor_type::f32, std::move(bytes)); !ok) return ok;
  }
  return {};
}

expected<void> save_lora_adapter(const std::filesystem::path& dir, const finetune_model& m, const tensor_map& state,
                                 const std::string& base_model) {
  if (m.lora.rank <= 0) return make_error(error_code::invalid_argument, "save_lora_adapter: the model was not fine-tuned with LoRA");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return make_error(error_code::io_error, "cannot create " + dir.string() + ": " + ec.message());
  mesh::checkpoint file;
  for (const auto& name : m.trainable) {
    auto it = state.find(name);
    if (it == state.end()) return make_error(error_code::not_found, "save_lora_adapter: the state lacks " + quote_name(name));
    file.tensors[std::string(peft_prefix) + name] = it->second;
  }
  file.metadata["format"] = "pt";
  if (auto ok = save_safetensors(dir / "adapter_model.safetensors", file); !ok) return ok;
  json c = {{"peft_type", "LORA"},       {"task_type", "CAUSAL_LM"}, {"base_model_name_or_path", base_model},
            {"r", m.lora.rank},          {"lora_alpha", m.lora.alpha}, {"lora_dropout", 0.0},
            {"target_modules", m.lora.targets}, {"bias", "none"},   {"fan_in_fan_out", m.config.arch == architecture::gpt2},
            {"inference_mode", true},    {"use_rslora", false},     {"use_dora", false},
            {"modules_to_save", nullptr}, {"init_lora_weights", true}, {"layers_to_transform", nullptr},
            {"rank_pattern", json::object()}, {"alpha_pattern", json::object()}};
  return write_text_durably(dir / "adapter_config.json", c.dump(2) + "\n");
}

expected<void> save_full_model(const std::filesystem::path& dir, const finetune_model& m, const tensor_map& state,
                               const checkpoint& base) {
  if (m.lora.rank > 0) return make_error(error_code::invalid_argument, "save_full_model: the model was fine-tuned with LoRA (save the adapter)");
  if (base.format() != checkpoint_format::hf_directory && base.format() != checkpoint_format::gguf)
    return make_error(error_code::invalid_argument, base.path().string() + ": a lone safetensors file has no config or tokenizer to save beside the model");
  // A GGUF base: its config and vocabulary written as Hugging Face files (checked before the weights).
  std::optional<checkpoint_tokenizer> gguf_tokenizer;
  if (base.format() == checkpoint_format::gguf) {
    auto t = read_gguf_tokenizer(*base.gguf());
    if (!t) return forward_error(t);
    if (auto ok = check_hf_export(m.config, *t); !ok) return make_error(ok.error().code, base.path().string() + ": " + ok.error().message);
    gguf_tokenizer = std::move(*t);
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return make_error(error_code::io_error, "cannot create " + dir.string() + ": " + ec.message());
  mesh::checkpoint file;
  for (const auto& [name, t] : m.state) {
    auto it = state.find(name);
    if (it == state.end()) return make_error(error_code::not_found, "save_full_model: the state lacks " + quote_name(name));
    file.tensors[name] = it->second;
  }
  file.metadata["format"] = "pt";
  if (auto ok = save_safetensors(dir / "model.safetensors", file); !ok) return ok;
  if (gguf_tokenizer) return write_hf_export(dir, m.config, *gguf_tokenizer);
  // The tensors are f32 now, whatever the base stored.
  json config = json::parse(base.config_json(), nullptr, false);
  if (!config.is_object()) return make_error(error_code::decode_error, base.config_path().string() + ": not a JSON object");
  config["torch_dtype"] = "float32";
  if (auto ok = write_text_durably(dir / "config.json", config.dump(2) + "\n"); !ok) return ok;
  const auto from = base.path();
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"})
    if (std::filesystem::exists(from / name, ec)) {
      std::filesystem::copy_file(from / name, dir / name, std::filesystem::copy_options::overwrite_existing, ec);
      if (ec) return make_error(error_code::io_error, "cannot copy " + (from / name).string() + ": " + ec.message());
    }
  return {};
}

}  // namespace mesh::models
