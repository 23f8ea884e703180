#include "models/hf_export.hpp"

#include <algorithm>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/durable_file.hpp"
#include "models/pre_tokenizer.hpp"
#include "models/tokenizer_json.hpp"
#include "models/utf8.hpp"

namespace mesh::models {
namespace {

using json = nlohmann::ordered_json;

constexpr std::string_view space_mark = "\xE2\x96\x81";  // "▁"

tl::unexpected<error> config_refused(const std::string& why) {
  return make_error(error_code::unsupported, "config.json cannot hold " + why);
}
tl::unexpected<error> tokenizer_refused(const std::string& why) {
  return make_error(error_code::unsupported, "tokenizer.json cannot hold " + why);
}

const char* class_of(architecture a) {
  switch (a) {
    case architecture::llama: return "LlamaForCausalLM";
    case architecture::mistral: return "MistralForCausalLM";
    case architecture::qwen2: return "Qwen2ForCausalLM";
    case architecture::qwen3: return "Qwen3ForCausalLM";
    case architecture::gpt2: break;
  }
  return "";
}

/// Every type but unused is kept by tokenizer.json; undefined reads back as normal.
token_type normalized_type(token_type t) { return t == token_type::undefined ? token_type::normal : t; }

bool mergeable(token_type t) {
  return t == token_type::normal || t == token_type::undefined || t == token_type::user_defined;
}

/// The character boundaries of `s` after the first and before the end.
std::vector<size_t> inner_boundaries(const std::string& s) {
  std::vector<size_t> out;
  for (size_t i = utf8::char_length(s, 0); i < s.size(); i += utf8::char_length(s, i)) out.push_back(i);
  return out;
}

/// A JSON string's text, or an error when `s` is not UTF-8 (JSON holds only text).
expected<std::string> quoted(const std::string& s) {
  if (!utf8::valid(s)) return tokenizer_refused("the token " + printable_token(s) + ", which is not valid UTF-8");
  return json(s).dump();
}

/// SentencePiece merges the adjacent pair whose merged piece scores highest; Hugging Face's
/// conversion (SentencePieceExtractor) writes, for each piece, every split into two tokens, the
/// pieces in order of score (ties by id), so that the first merge that makes a piece ranks it.
/// Only pieces the SentencePiece encoder builds get merges (normal and user-defined ones).
std::vector<std::pair<std::string, std::string>> sentencepiece_merges(const vocabulary& v, int32_t n) {
  std::unordered_map<std::string_view, int32_t> ids;
  for (int32_t i = 0; i < n; ++i) ids.emplace(v.tokens[static_cast<size_t>(i)], i);
  std::vector<int32_t> pieces;
  for (int32_t i = 0; i < n; ++i)
    if (mergeable(v.type_of(i))) pieces.push_back(i);
  const auto score = [&](int32_t i) { return v.scores.empty() ? 0.0f : v.scores[static_cast<size_t>(i)]; };
  std::stable_sort(pieces.begin(), pieces.end(), [&](int32_t a, int32_t b) { return score(a) > score(b); });
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<std::pair<int32_t, int32_t>> local;
  for (const int32_t p : pieces) {
    const std::string& text = v.tokens[static_cast<size_t>(p)];
    local.clear();
    for (const size_t cut : inner_boundaries(text)) {
      const auto l = ids.find(std::string_view(text).substr(0, cut)), r = ids.find(std::string_view(text).substr(cut));
      if (l != ids.end() && r != ids.end()) local.emplace_back(l->second, r->second);
    }
    std::sort(local.begin(), local.end());
    for (const auto& [l, r] : local) merges.emplace_back(v.tokens[static_cast<size_t>(l)], v.tokens[static_cast<size_t>(r)]);
  }
  return merges;
}

/// The regexes a byte-level vocabulary splits words with.
expected<std::vector<std::string>> patterns_of(const vocabulary& v) {
  if (!v.pre_tokenizer_patterns.empty()) return v.pre_tokenizer_patterns;
  return pre_tokenizer_patterns(v.pre_tokenizer.empty() ? std::string_view("gpt2") : std::string_view(v.pre_tokenizer));
}

/// Checks what tokenizer.json cannot say before writing it; `n` is the number of tokens written.
expected<void> check_representable(const vocabulary& v, int32_t n) {
  bool has_bytes = false;
  for (int32_t i = 0; i < n; ++i) has_bytes |= v.type_of(i) == token_type::byte;
  for (int32_t i = 0; i < n; ++i) {
    const std::string& t = v.tokens[static_cast<size_t>(i)];
    const std::string name = fmt::format("token {} {}", i, printable_token(t));
    switch (v.type_of(i)) {
      case token_type::unused:
        return tokenizer_refused(name + ", an unused token (GGUF token type 5) before the vocabulary's end: Hugging Face has "
                                        "no unused tokens and leaves out only those at the end");
      case token_type::byte:
        if (v.model == vocabulary::kind::byte_bpe)
          return tokenizer_refused(name + ", a byte-fallback token (GGUF token type 6) in a byte-level vocabulary");
        if (!is_byte_piece(t))
          return tokenizer_refused(name + ", a byte-fallback token (GGUF token type 6) not written <0xXX>");
        break;
      case token_type::unknown:
        if (v.unk_id != i)
          return tokenizer_refused(name + ", an unknown-token type (GGUF token type 2) that is not the vocabulary's unknown token");
        break;
      default:
        if (v.unk_id == i)
          return tokenizer_refused(name + ", the unknown token, which is not of the unknown-token type (GGUF token type 2)");
        if (v.model == vocabulary::kind::sentencepiece && has_bytes && is_byte_piece(t))
          return tokenizer_refused(name + ", a token written like a byte-fallback token <0xXX> that is not one");
        break;
    }
  }
  for (const auto& [id, what] : {std::pair{v.bos_id, "BOS"}, {v.eos_id, "EOS"}, {v.unk_id, "unknown"}, {v.pad_id, "padding"}})
    if (id && *id >= n)
      return tokenizer_refused(fmt::format("the {} token {}, an unused token at the vocabulary's end", what, *id));
  return {};
}

/// What reads back from tokenizer.json differently from `v` (the first `n` tokens), or nothing.
expected<void> compare_read_back(const vocabulary& v, int32_t n, const vocabulary& back) {
  const auto differ = [](const std::string& what) {
    return make_error(error_code::unsupported, "tokenizer.json does not read back as the vocabulary: " + what);
  };
  if (back.model != v.model) return differ("the tokenizer's kind");
  if (back.size() != n) return differ(fmt::format("{} tokens instead of {}", back.size(), n));
  for (int32_t i = 0; i < n; ++i) {
    if (back.tokens[static_cast<size_t>(i)] != v.tokens[static_cast<size_t>(i)])
      return differ(fmt::format("token {} {}", i, printable_token(v.tokens[static_cast<size_t>(i)])));
    if (back.type_of(i) != normalized_type(v.type_of(i)))
      return differ(fmt::format("the type of token {} {}", i, printable_token(v.tokens[static_cast<size_t>(i)])));
  }
  if (back.bos_id != v.bos_id || back.eos_id != v.eos_id || back.unk_id != v.unk_id || back.pad_id != v.pad_id)
    return differ("the BOS, EOS, unknown or padding token");
  if (back.add_bos != v.add_bos || back.add_eos != v.add_eos) return differ("whether BOS or EOS is added");
  if (v.model == vocabulary::kind::byte_bpe) {
    if (back.merges != v.merges) return differ("the merges");
    if (back.ignore_merges != v.ignore_merges) return differ("ignore_merges");
    auto want = patterns_of(v), got = patterns_of(back);
    if (!want) return forward_error(want);
    if (!got || *got != *want) return differ("the pre-tokenizer's patterns");
    return {};
  }
  if (back.add_space_prefix != v.add_space_prefix) return differ("the space put before the text");
  // The order merges read back in must be the order of the scores among the pieces SentencePiece
  // builds of two symbols (characters, or pieces it built): normal pieces of two or more
  // characters. (User-defined pieces are matched in the text before SentencePiece runs.)
  std::unordered_map<std::string_view, int32_t> ids;
  for (int32_t i = 0; i < n; ++i) ids.emplace(v.tokens[static_cast<size_t>(i)], i);
  const auto symbol = [&](std::string_view s) {
    if (utf8::char_length(s, 0) == s.size()) return true;
    const auto it = ids.find(s);
    return it != ids.end() && mergeable(v.type_of(it->second));
  };
  std::vector<int32_t> built;
  for (int32_t i = 0; i < n; ++i) {
    const token_type t = v.type_of(i);
    if (t != token_type::normal && t != token_type::undefined) continue;
    const std::string& text = v.tokens[static_cast<size_t>(i)];
    for (const size_t cut : inner_boundaries(text))
      if (symbol(std::string_view(text).substr(0, cut)) && symbol(std::string_view(text).substr(cut))) {
        built.push_back(i);
        break;
      }
  }
  const auto score = [&](int32_t i) { return v.scores.empty() ? 0.0f : v.scores[static_cast<size_t>(i)]; };
  std::stable_sort(built.begin(), built.end(), [&](int32_t a, int32_t b) { return score(a) > score(b); });
  constexpr float no_merge = -1e9f;  // what parse_hf_tokenizer gives a piece no merge makes
  for (size_t k = 0; k < built.size(); ++k) {
    const int32_t a = built[k];
    const std::string& ta = v.tokens[static_cast<size_t>(a)];
    if (back.scores[static_cast<size_t>(a)] <= no_merge)
      return tokenizer_refused(fmt::format("token {} {}: no merge of two tokens makes it (SentencePiece builds it from a "
                                           "character that is not a token)",
                                           a, printable_token(ta)));
    if (k == 0) continue;
    const int32_t p = built[k - 1];
    if (score(p) == score(a))
      return tokenizer_refused(fmt::format("tokens {} {} and {} {}, which have the same score {}: SentencePiece merges the "
                                           "leftmost of two such pairs, tokenizer.json's merges always the same one",
                                           p, printable_token(v.tokens[static_cast<size_t>(p)]), a, printable_token(ta), score(a)));
    if (back.scores[static_cast<size_t>(p)] <= back.scores[static_cast<size_t>(a)])
      return differ(fmt::format("the order of tokens {} and {}", p, a));
  }
  return {};
}

json added_token(int32_t id, const std::string& text, bool special) {
  return {{"id", id},           {"content", text},     {"single_word", false}, {"lstrip", false},
          {"rstrip", false},    {"normalized", false}, {"special", special}};
}

/// BOS / EOS around a text (and a pair of texts), as Llama's tokenizer.json writes them.
json template_processing(const vocabulary& v) {
  json specials = json::object();
  const auto special = [&](int32_t id, int type_id) {
    const std::string& t = v.tokens[static_cast<size_t>(id)];
    specials[t] = {{"id", t}, {"ids", {id}}, {"tokens", {t}}};
    return json{{"SpecialToken", {{"id", t}, {"type_id", type_id}}}};
  };
  const auto around = [&](const char* sequence, int type_id) {
    json list = json::array();
    if (v.add_bos) list.push_back(special(*v.bos_id, type_id));
    list.push_back({{"Sequence", {{"id", sequence}, {"type_id", type_id}}}});
    if (v.add_eos) list.push_back(special(*v.eos_id, type_id));
    return list;
  };
  const json single = around("A", 0);
  json pair = single;
  for (const auto& item : around("B", 1)) pair.push_back(item);
  return {{"type", "TemplateProcessing"}, {"single", single}, {"pair", pair}, {"special_tokens", specials}};
}

expected<hf_tokenizer_files> tokenizer_files(const vocabulary& v, const std::optional<std::string>& chat_template,
                                             int64_t model_max_length) {
  if (auto ok = v.validate(); !ok) return forward_error(ok);
  // llama.cpp's converter pads a vocabulary to the embedding's rows with unused tokens: a Hugging
  // Face model has those rows without tokens.
  int32_t n = v.size();
  while (n > 0 && v.type_of(n - 1) == token_type::unused) --n;
  if (n == 0) return tokenizer_refused("a vocabulary of unused tokens only");
  if (auto ok = check_representable(v, n); !ok) return forward_error(ok);
  const bool spm = v.model == vocabulary::kind::sentencepiece;

  json added = json::array();
  for (int32_t i = 0; i < n; ++i) {
    const token_type t = v.type_of(i);
    if (t == token_type::control || t == token_type::user_defined || (spm && t == token_type::unknown))
      added.push_back(added_token(i, v.tokens[static_cast<size_t>(i)], t != token_type::user_defined));
  }
  json normalizer, pre, post, decoder;
  if (spm) {
    const json replace = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", std::string(space_mark)}};
    normalizer = v.add_space_prefix
                     ? json{{"type", "Sequence"},
                            {"normalizers", {{{"type", "Prepend"}, {"prepend", std::string(space_mark)}}, replace}}}
                     : replace;
    json steps = {{{"type", "Replace"}, {"pattern", {{"String", std::string(space_mark)}}}, {"content", " "}},
                  {{"type", "ByteFallback"}},
                  {{"type", "Fuse"}}};
    if (v.add_space_prefix) steps.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    decoder = {{"type", "Sequence"}, {"decoders", steps}};
    if (v.add_bos || v.add_eos) post = template_processing(v);
  } else {
    auto patterns = patterns_of(v);
    if (!patterns) return forward_error(patterns);
    json steps = json::array();
    for (const auto& p : *patterns)
      steps.push_back({{"type", "Split"}, {"pattern", {{"Regex", p}}}, {"behavior", "Isolated"}, {"invert", false}});
    steps.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}});
    pre = {{"type", "Sequence"}, {"pretokenizers", steps}};
    const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
    post = v.add_bos || v.add_eos ? json{{"type", "Sequence"}, {"processors", {byte_level, template_processing(v)}}} : byte_level;
    decoder = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  }
  bool has_bytes = false;
  for (int32_t i = 0; i < n; ++i) has_bytes |= v.type_of(i) == token_type::byte;
  json model = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", v.unk_id ? json(v.tokens[static_cast<size_t>(*v.unk_id)]) : json(nullptr)},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", spm},
                {"byte_fallback", spm && has_bytes},
                {"ignore_merges", !spm && v.ignore_merges},
                {"vocab", "@vocab@"},
                {"merges", "@merges@"}};

  // The vocabulary and merges are written by hand in place of the placeholders: an ordered_json
  // object of 150k keys would be built in quadratic time, and Hugging Face's files list the
  // vocabulary by id.
  std::string vocab_text = "{";
  bool first = true;
  for (int32_t i = 0; i < n; ++i) {
    const token_type t = v.type_of(i);
    // Byte-level files hold control and user-defined tokens (raw text) only as added tokens.
    if (!spm && (t == token_type::control || t == token_type::user_defined)) continue;
    auto q = quoted(v.tokens[static_cast<size_t>(i)]);
    if (!q) return forward_error(q);
    vocab_text += fmt::format("{}\n      {}: {}", first ? "" : ",", *q, i);
    first = false;
  }
  vocab_text += "\n    }";
  const auto merges = spm ? sentencepiece_merges(v, n) : v.merges;
  // "a b" strings (what every tokenizers version reads) unless a side holds a space.
  bool pairs = false;
  for (const auto& [a, b] : merges) pairs |= a.find(' ') != std::string::npos || b.find(' ') != std::string::npos;
  std::string merges_text = "[";
  for (size_t i = 0; i < merges.size(); ++i) {
    auto a = quoted(merges[i].first), b = quoted(merges[i].second);
    if (!a) return forward_error(a);
    if (!b) return forward_error(b);
    const std::string item = pairs ? fmt::format("[{}, {}]", *a, *b) : json(merges[i].first + " " + merges[i].second).dump();
    merges_text += fmt::format("{}\n      {}", i ? "," : "", item);
  }
  merges_text += "\n    ]";

  hf_tokenizer_files out;
  try {
    json doc = {{"version", "1.0"},          {"truncation", nullptr},  {"padding", nullptr}, {"added_tokens", added},
                {"normalizer", normalizer},  {"pre_tokenizer", pre},   {"post_processor", post},
                {"decoder", decoder},        {"model", model}};
    std::string text = doc.dump(2, ' ', false, json::error_handler_t::strict);
    for (const auto& [mark, value] : {std::pair{std::string_view("\"@vocab@\""), &vocab_text}, {"\"@merges@\"", &merges_text}})
      text.replace(text.rfind(mark), mark.size(), *value);
    out.tokenizer_json = text + "\n";

    const auto token_or_null = [&](const std::optional<int32_t>& id) {
      return id ? json(v.tokens[static_cast<size_t>(*id)]) : json(nullptr);
    };
    json decoder_map = json::object();
    for (const auto& a : added)
      decoder_map[std::to_string(a["id"].get<int32_t>())] = {{"content", a["content"]}, {"lstrip", false}, {"normalized", false},
                                                             {"rstrip", false},         {"single_word", false},
                                                             {"special", a["special"]}};
    json config = {{"add_bos_token", v.add_bos},
                   {"add_eos_token", v.add_eos},
                   {"added_tokens_decoder", decoder_map},
                   {"bos_token", token_or_null(v.bos_id)},
                   {"eos_token", token_or_null(v.eos_id)},
                   {"unk_token", token_or_null(v.unk_id)},
                   {"pad_token", token_or_null(v.pad_id)},
                   {"clean_up_tokenization_spaces", false},
                   {"tokenizer_class", "PreTrainedTokenizerFast"}};
    if (model_max_length > 0) config["model_max_length"] = model_max_length;
    if (chat_template) config["chat_template"] = *chat_template;
    out.tokenizer_config_json = config.dump(2, ' ', false, json::error_handler_t::strict) + "\n";
  } catch (const json::exception&) {
    return tokenizer_refused("a token or the chat template that is not valid UTF-8");
  }

  auto back = parse_hf_tokenizer(out.tokenizer_json, out.tokenizer_config_json);
  if (!back) return make_error(error_code::internal, "the tokenizer.json written does not read back: " + back.error().message);
  if (auto ok = compare_read_back(v, n, back->vocab); !ok) return forward_error(ok);
  if (back->chat_template != chat_template) return make_error(error_code::internal, "the chat template does not read back");
  return out;
}

}  // namespace

namespace {

/// `j` with the special token ids and the dtype of the saved weights (f32), as text.
std::string finished(json& j, const model_config& c) {
  if (c.bos_token_id) j["bos_token_id"] = *c.bos_token_id;
  if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  else if (!c.eos_token_ids.empty()) j["eos_token_id"] = c.eos_token_ids;
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

/// GPT2LMHeadModel's config: learned positions, LayerNorm, gelu (tanh form: "gelu_new"), biases
/// everywhere, one key/value head per head.
expected<std::string> gpt2_config_json(const model_config& c) {
  if (c.n_kv_heads != c.n_heads) return config_refused("GPT-2 with grouped key/value heads");
  if (c.head_dim * c.n_heads != c.hidden_size)
    return config_refused(fmt::format("GPT-2 with {} heads of {} over a width of {}", c.n_heads, c.head_dim, c.hidden_size));
  if (!c.layer_norm || !c.qkv_bias || c.rope != rope_style::none || c.sliding_window > 0)
    return config_refused("a GPT-2 without LayerNorm, biases or learned positions, or with a sliding window");
  json j = {{"architectures", {"GPT2LMHeadModel"}},
            {"model_type", "gpt2"},
            {"vocab_size", c.vocab_size},
            {"n_embd", c.hidden_size},
            {"n_layer", c.n_layers},
            {"n_head", c.n_heads},
            {"n_inner", c.ffn_size},
            {"n_positions", c.max_context},
            {"n_ctx", c.max_context},
            {"activation_function", "gelu_new"},
            {"layer_norm_epsilon", c.norm_eps},
            {"resid_pdrop", 0.0},
            {"embd_pdrop", 0.0},
            {"attn_pdrop", 0.0},
            {"initializer_range", 0.02},
            {"scale_attn_weights", true},
            {"tie_word_embeddings", c.tied_embeddings},
            {"use_cache", true}};
  return finished(j, c);
}

}  // namespace

expected<std::string> config_json_of(const model_config& c) {
  if (c.arch == architecture::gpt2) return gpt2_config_json(c);
  if (c.layer_norm || c.rope == rope_style::none)
    return config_refused(fmt::format("{} with LayerNorm or without rotary embeddings", to_string(c.arch)));
  if (c.rope_dims != c.head_dim)
    return config_refused(fmt::format("partial rotary embeddings (rope over {} of the head's {} dimensions)", c.rope_dims, c.head_dim));
  if (c.rope_freqs_tensor)
    return config_refused("Llama 3 rope scaling given only as the rope_freqs.weight tensor: Hugging Face's rope_scaling "
                          "needs factor, low_freq_factor, high_freq_factor and original_max_position_embeddings, "
                          "which the file does not carry");
  // Mistral is a Llama with a sliding window; its GGUF files say "llama".
  const architecture arch = c.arch == architecture::llama && c.sliding_window > 0 ? architecture::mistral : c.arch;
  if (c.qkv_bias != (arch == architecture::qwen2))
    return config_refused(c.qkv_bias ? fmt::format("q/k/v biases on {} (its attention_bias puts a bias on o_proj too)", to_string(arch))
                                     : std::string("Qwen2 without q/k/v biases"));
  if (c.qk_norm != (arch == architecture::qwen3))
    return config_refused(c.qk_norm ? fmt::format("q/k norms on {}", to_string(arch)) : std::string("Qwen3 without q/k norms"));
  if (c.weights_in_out) return config_refused("weights stored [in, out]");

  json j = {{"architectures", {class_of(arch)}},
            {"model_type", to_string(arch)},
            {"vocab_size", c.vocab_size},
            {"hidden_size", c.hidden_size},
            {"intermediate_size", c.ffn_size},
            {"num_hidden_layers", c.n_layers},
            {"num_attention_heads", c.n_heads},
            {"num_key_value_heads", c.n_kv_heads},
            {"head_dim", c.head_dim},
            {"hidden_act", "silu"},
            {"max_position_embeddings", c.max_context},
            {"rms_norm_eps", c.norm_eps},
            {"rope_theta", c.rope_theta}};
  switch (c.scaling.type) {
    case rope_scaling::kind::none: j["rope_scaling"] = nullptr; break;
    case rope_scaling::kind::linear: j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.scaling.factor}}; break;
    case rope_scaling::kind::llama3:
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", c.scaling.factor},
                           {"low_freq_factor", c.scaling.low_freq_factor},
                           {"high_freq_factor", c.scaling.high_freq_factor},
                           {"original_max_position_embeddings", c.scaling.original_max_position_embeddings}};
      break;
  }
  j["tie_word_embeddings"] = c.tied_embeddings;
  if (arch == architecture::llama) j["mlp_bias"] = false;
  if (arch == architecture::llama || arch == architecture::qwen3) j["attention_bias"] = false;
  const json window = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  if (arch == architecture::mistral) j["sliding_window"] = window;
  if (arch == architecture::qwen2 || arch == architecture::qwen3) {
    // max_window_layers: transformers' Qwen windows only the layers from this one on; meshnode all.
    j["use_sliding_window"] = c.sliding_window > 0;
    j["sliding_window"] = window;
    j["max_window_layers"] = 0;
  }
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  return finished(j, c);
}

expected<hf_tokenizer_files> tokenizer_json_of(const vocabulary& v, const std::optional<std::string>& chat_template,
                                               int64_t model_max_length) {
  return tokenizer_files(v, chat_template, model_max_length);
}

expected<void> check_hf_export(const model_config& c, const checkpoint_tokenizer& t) {
  if (auto ok = config_json_of(c); !ok) return forward_error(ok);
  if (auto ok = tokenizer_json_of(t.vocab, t.chat_template, c.max_context); !ok) return forward_error(ok);
  return {};
}

expected<void> write_hf_export(const std::filesystem::path& dir, const model_config& c, const checkpoint_tokenizer& t) {
  auto config = config_json_of(c);
  if (!config) return forward_error(config);
  auto tok = tokenizer_json_of(t.vocab, t.chat_template, c.max_context);
  if (!tok) return forward_error(tok);
  if (auto ok = write_text_durably(dir / "config.json", *config); !ok) return ok;
  if (auto ok = write_text_durably(dir / "tokenizer.json", tok->tokenizer_json); !ok) return ok;
  return write_text_durably(dir / "tokenizer_config.json", tok->tokenizer_config_json);
}

}  // namespace mesh::models
