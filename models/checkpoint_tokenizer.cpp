#include "models/checkpoint_tokenizer.hpp"

#include <fmt/format.h>

#include "models/tokenizer_json.hpp"

namespace mesh::models {

namespace {

constexpr std::string_view model_key = "tokenizer.ggml.model";

// Optional keys: missing is fine, a wrong type is the file's error.
expected<std::optional<int64_t>> optional_id(const gguf_view& g, std::string_view key) {
  if (!g.has(key)) return std::optional<int64_t>{};
  auto v = g.get_i64(key);
  if (!v) return forward_error(v);
  return std::optional<int64_t>{*v};
}

expected<std::optional<bool>> optional_bool(const gguf_view& g, std::string_view key) {
  if (!g.has(key)) return std::optional<bool>{};
  auto v = g.get_bool(key);
  if (!v) return forward_error(v);
  return std::optional<bool>{*v};
}

// An array's element count, checked against the vocabulary's limit before any element is decoded.
expected<void> check_count(const gguf_view& g, std::string_view key, size_t limit) {
  const gguf_value* v = g.find(key);
  if (v && v->type() == gguf_value_type::array && v->size() > limit)
    return make_error(error_code::limit_exceeded, fmt::format("{}: metadata key {} holds {} entries; at most {} are accepted",
                                                              g.source(), quote_name(key), v->size(), limit));
  return {};
}

expected<std::optional<int32_t>> token_id(const gguf_view& g, std::string_view key, size_t n_tokens) {
  auto id = optional_id(g, key);
  if (!id) return forward_error(id);
  if (!*id) return std::optional<int32_t>{};
  // llama.cpp writes -1 (as a u32 0xffffffff too) for "none".
  if (**id < 0 || **id == 0xffffffffLL) return std::optional<int32_t>{};
  if (static_cast<size_t>(**id) >= n_tokens)
    return make_error(error_code::invalid_argument, fmt::format("{}: metadata key {} is token {}, but the vocabulary has {} tokens",
                                                                g.source(), quote_name(key), **id, n_tokens));
  return std::optional<int32_t>{static_cast<int32_t>(**id)};
}

}  // namespace

expected<checkpoint_tokenizer> read_gguf_tokenizer(const gguf_view& g) {
  auto model = g.get_string(model_key);
  if (!model) return forward_error(model);
  vocabulary v;
  if (*model == "gpt2") {
    v.model = vocabulary::kind::byte_bpe;
  } else if (*model == "llama") {
    v.model = vocabulary::kind::sentencepiece;
  } else {
    return make_error(error_code::unsupported,
                      fmt::format("{}: tokenizer model {} is not supported (supported: \"gpt2\", \"llama\")", g.source(),
                                  quote_name(*model)));
  }
  using L = vocabulary_limits;
  for (const char* key : {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"})
    if (auto ok = check_count(g, key, L::max_tokens); !ok) return forward_error(ok);
  if (auto ok = check_count(g, "tokenizer.ggml.merges", L::max_merges); !ok) return forward_error(ok);

  auto tokens = g.get_array_strings("tokenizer.ggml.tokens");
  if (!tokens) return forward_error(tokens);
  v.tokens.reserve(tokens->size());
  for (const auto t : *tokens) v.tokens.emplace_back(t);
  if (g.has("tokenizer.ggml.scores")) {
    auto scores = g.get_array_f32("tokenizer.ggml.scores");
    if (!scores) return forward_error(scores);
    v.scores = std::move(*scores);
  }
  if (g.has("tokenizer.ggml.token_type")) {
    auto types = g.get_array_i64("tokenizer.ggml.token_type");
    if (!types) return forward_error(types);
    v.token_types.reserve(types->size());
    for (const int64_t t : *types) {
      if (t < 0 || t > static_cast<int64_t>(token_type::byte))
        return make_error(error_code::invalid_argument,
                          fmt::format("{}: metadata key \"tokenizer.ggml.token_type\" holds token type {} (types are 0..6)",
                                      g.source(), t));
      v.token_types.push_back(static_cast<int32_t>(t));
    }
  }
  if (g.has("tokenizer.ggml.merges")) {
    auto merges = g.get_array_strings("tokenizer.ggml.merges");
    if (!merges) return forward_error(merges);
    v.merges.reserve(merges->size());
    for (const auto m : *merges) {
      // A merge is "left right"; pieces never hold a plain space (GPT-2's bytes map it to "Ġ"),
      // so the first space splits it.
      const size_t space = m.find(' ');
      if (space == std::string_view::npos || space == 0 || space + 1 == m.size())
        return make_error(error_code::invalid_argument,
                          fmt::format("{}: metadata key \"tokenizer.ggml.merges\" holds {}, not two tokens separated by a space",
                                      g.source(), quote_name(m)));
      v.merges.emplace_back(std::string(m.substr(0, space)), std::string(m.substr(space + 1)));
    }
  }
  if (g.has("tokenizer.ggml.pre")) {
    auto pre = g.get_string("tokenizer.ggml.pre");
    if (!pre) return forward_error(pre);
    if (*pre != "default") v.pre_tokenizer = std::string(*pre);
  }
  // llama.cpp's LLAMA_VOCAB_PRE_TYPE_LLAMA3 takes a word that is a whole token as it is.
  v.ignore_merges = v.pre_tokenizer == "llama-bpe";

  const size_t n = v.tokens.size();
  auto bos = token_id(g, "tokenizer.ggml.bos_token_id", n);
  auto eos = token_id(g, "tokenizer.ggml.eos_token_id", n);
  auto unk = token_id(g, "tokenizer.ggml.unknown_token_id", n);
  auto pad = token_id(g, "tokenizer.ggml.padding_token_id", n);
  for (const auto* id : {&bos, &eos, &unk, &pad})
    if (!*id) return forward_error(*id);
  v.bos_id = *bos;
  v.eos_id = *eos;
  v.unk_id = *unk;
  v.pad_id = *pad;
  auto add_bos = optional_bool(g, "tokenizer.ggml.add_bos_token");
  auto add_eos = optional_bool(g, "tokenizer.ggml.add_eos_token");
  auto space_prefix = optional_bool(g, "tokenizer.ggml.add_space_prefix");
  for (const auto* b : {&add_bos, &add_eos, &space_prefix})
    if (!*b) return forward_error(*b);
  const bool spm = v.model == vocabulary::kind::sentencepiece;
  v.add_bos = add_bos->value_or(spm) && v.bos_id.has_value();
  v.add_eos = add_eos->value_or(false) && v.eos_id.has_value();
  v.add_space_prefix = space_prefix->value_or(true);

  if (auto ok = v.validate(); !ok)
    return make_error(ok.error().code, g.source() + ": tokenizer: " + ok.error().message);
  checkpoint_tokenizer out{std::move(v), std::nullopt};
  if (g.has("tokenizer.chat_template")) {
    auto t = g.get_string("tokenizer.chat_template");
    if (!t) return forward_error(t);
    out.chat_template = std::string(*t);
  }
  return out;
}

expected<void> check_tokenizer_fits(const vocabulary& v, const model_config& config, const std::string& source) {
  const auto tokens = static_cast<int64_t>(v.tokens.size());
  if (tokens > config.vocab_size)
    return make_error(error_code::shape_mismatch,
                      fmt::format("{}: the tokenizer has {} tokens but the model's vocabulary has {} rows: they do not "
                                  "belong together",
                                  source, tokens, config.vocab_size));
  if (config.naming == tensor_naming::gguf && tokens != config.vocab_size)
    return make_error(error_code::shape_mismatch,
                      fmt::format("{}: the tokenizer has {} tokens but the model's vocabulary has {} rows (a GGUF file "
                                  "carries one token per row)",
                                  source, tokens, config.vocab_size));
  return {};
}

expected<checkpoint_tokenizer> load_tokenizer(const checkpoint& c, const model_config& config) {
  checkpoint_tokenizer out;
  if (c.format() == checkpoint_format::gguf) {
    auto t = read_gguf_tokenizer(*c.gguf());
    if (!t) return forward_error(t);
    out = std::move(*t);
  } else if (c.format() == checkpoint_format::hf_directory) {
    auto t = load_hf_tokenizer(c.path());
    if (!t) return make_error(t.error().code, c.path().string() + ": " + t.error().message);
    out.vocab = std::move(t->vocab);
    out.chat_template = std::move(t->chat_template);
  } else {
    return make_error(error_code::not_found,
                      c.path().string() + ": a lone .safetensors file carries no tokenizer (open its directory)");
  }
  if (auto ok = check_tokenizer_fits(out.vocab, config, c.path().string()); !ok) return forward_error(ok);
  return out;
}

}  // namespace mesh::models
