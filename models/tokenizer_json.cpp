#include "models/tokenizer_json.hpp"

#include <fmt/format.h>

#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "models/json_depth.hpp"
#include "models/pre_tokenizer.hpp"

namespace mesh::models {

namespace {

using json = nlohmann::json;

constexpr size_t max_json_depth = 64;
constexpr std::string_view space_mark = "\xE2\x96\x81";  // "▁"

tl::unexpected<error> bad(std::string message) {
  return make_error(error_code::decode_error, "tokenizer.json: " + std::move(message));
}
tl::unexpected<error> unsupported(std::string message) {
  return make_error(error_code::unsupported, "tokenizer.json: " + std::move(message));
}

expected<json> parse(std::string_view text, const char* what) {
  if (text.size() > max_tokenizer_json_bytes) {
    return make_error(error_code::limit_exceeded,
                      fmt::format("{}: {} bytes is more than the limit of {}", what, text.size(), max_tokenizer_json_bytes));
  }
  if (json_too_deep(text, max_json_depth)) {
    return make_error(error_code::limit_exceeded, fmt::format("{}: nested deeper than {} levels", what, max_json_depth));
  }
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return make_error(error_code::decode_error, fmt::format("{}: not valid JSON", what));
  if (!j.is_object()) return make_error(error_code::decode_error, fmt::format("{}: not a JSON object", what));
  return j;
}

std::string type_of(const json& j) {
  if (!j.is_object()) return "";
  auto it = j.find("type");
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

/// A token named in tokenizer_config.json: a string, or an AddedToken object with "content".
std::optional<std::string> token_text(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  return std::nullopt;
}

/// j[key] by reference (value() would copy the whole vocabulary), or `fallback`.
const json& member(const json& j, const char* key, const json& fallback) {
  if (!j.is_object()) return fallback;
  auto it = j.find(key);
  return it == j.end() ? fallback : *it;
}
const json null_json;
const json empty_object = json::object();
const json empty_array = json::array();

struct pre_steps {
  std::vector<std::string> patterns;
  bool byte_level = false;
  bool metaspace = false;
  bool metaspace_prefix = false;
};

expected<void> walk_pre_tokenizer(const json& pt, pre_steps& steps, int depth = 0) {
  if (pt.is_null()) return {};
  const std::string type = type_of(pt);
  if (type == "Sequence" && depth < 4) {
    const json& list = member(pt, "pretokenizers", empty_array);
    if (!list.is_array()) return bad("pre_tokenizer Sequence without a \"pretokenizers\" list");
    for (const auto& p : list) {
      if (auto r = walk_pre_tokenizer(p, steps, depth + 1); !r) return r;
    }
    return {};
  }
  if (type == "Split") {
    const std::string behavior = pt.value("behavior", "");
    if (behavior != "Isolated") {
      return unsupported(fmt::format("pre_tokenizer Split with behavior \"{}\" is not supported (only Isolated)", behavior));
    }
    if (pt.value("invert", false)) return unsupported("pre_tokenizer Split with invert is not supported");
    const json& pattern = member(pt, "pattern", empty_object);
    if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      steps.patterns.push_back(pattern["Regex"].get<std::string>());
    } else if (pattern.contains("String") && pattern["String"].is_string()) {
      std::string literal = pattern["String"].get<std::string>();
      if (literal.find("\\E") != std::string::npos) return unsupported("pre_tokenizer Split string containing \\E");
      steps.patterns.push_back("\\Q" + literal + "\\E");
    } else {
      return bad("pre_tokenizer Split without a Regex or String pattern");
    }
    return {};
  }
  if (type == "ByteLevel") {
    steps.byte_level = true;
    if (pt.value("add_prefix_space", false)) {
      return unsupported("pre_tokenizer ByteLevel with add_prefix_space is not supported");
    }
    if (pt.value("use_regex", true)) steps.patterns.push_back(gpt2_pattern);
    return {};
  }
  if (type == "Digits") {
    steps.patterns.push_back(pt.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)");
    return {};
  }
  if (type == "Metaspace") {
    if (pt.value("replacement", std::string(space_mark)) != space_mark) {
      return unsupported("pre_tokenizer Metaspace with a replacement other than \"▁\" is not supported");
    }
    steps.metaspace = true;
    const std::string scheme = pt.value("prepend_scheme", "");
    steps.metaspace_prefix = scheme.empty() ? pt.value("add_prefix_space", true) : scheme != "never";
    return {};
  }
  return unsupported(fmt::format("pre_tokenizer type \"{}\" is not supported (supported: ByteLevel, Split, Digits, "
                                 "Metaspace, Sequence)",
                                 type));
}

struct normalizer_info {
  bool spm_spaces = false;  ///< Replace " " -> "▁"
  bool prepend = false;     ///< Prepend "▁"
};

expected<void> walk_normalizer(const json& n, normalizer_info& info, int depth = 0) {
  if (n.is_null()) return {};
  const std::string type = type_of(n);
  if (type == "Sequence" && depth < 4) {
    const json& list = member(n, "normalizers", empty_array);
    if (!list.is_array()) return bad("normalizer Sequence without a \"normalizers\" list");
    for (const auto& x : list) {
      if (auto r = walk_normalizer(x, info, depth + 1); !r) return r;
    }
    return {};
  }
  if (type == "Prepend" && n.value("prepend", "") == space_mark) {
    info.prepend = true;
    return {};
  }
  if (type == "Replace") {
    const json& pattern = member(n, "pattern", empty_object);
    if (pattern.value("String", "") == " " && n.value("content", "") == space_mark) {
      info.spm_spaces = true;
      return {};
    }
  }
  // Qwen2 normalises to NFC; text that is already NFC (nearly all text) tokenizes the same without.
  if (type == "NFC") return {};
  return unsupported(fmt::format("normalizer type \"{}\" is not supported", type));
}

/// The special tokens a TemplateProcessing post-processor puts around a single text.
void walk_post_processor(const json& pp, std::optional<std::string>& before, std::optional<std::string>& after,
                         int depth = 0) {
  const std::string type = type_of(pp);
  if (type == "Sequence" && depth < 4 && pp.contains("processors") && pp["processors"].is_array()) {
    for (const auto& p : pp["processors"]) walk_post_processor(p, before, after, depth + 1);
    return;
  }
  if (type != "TemplateProcessing" || !pp.contains("single") || !pp["single"].is_array()) return;
  bool seen_sequence = false;
  for (const auto& item : pp["single"]) {
    if (!item.is_object()) continue;
    if (item.contains("Sequence")) {
      seen_sequence = true;
    } else if (item.contains("SpecialToken") && item["SpecialToken"].is_object() &&
               item["SpecialToken"].contains("id") && item["SpecialToken"]["id"].is_string()) {
      (seen_sequence ? after : before) = item["SpecialToken"]["id"].get<std::string>();
    }
  }
}

expected<hf_tokenizer> parse_impl(std::string_view tokenizer_json, std::string_view config_json) {
  auto parsed = parse(tokenizer_json, "tokenizer.json");
  if (!parsed) return forward_error(parsed);
  const json& j = *parsed;
  hf_tokenizer out;
  vocabulary& v = out.vocab;

  const json& model = member(j, "model", empty_object);
  if (!model.is_object()) return bad("\"model\" is not an object");
  const std::string model_type = type_of(model);
  if (model_type.empty() ? !model.contains("merges") : model_type != "BPE") {
    return unsupported(fmt::format("model type \"{}\" is not supported (supported: BPE)", model_type));
  }
  const json& vocab = member(model, "vocab", empty_object);
  if (!vocab.is_object()) return bad("model.vocab is not an object of token -> id");
  if (vocab.size() > vocabulary_limits::max_tokens) {
    return make_error(error_code::limit_exceeded, fmt::format("tokenizer.json: {} tokens is more than the limit of {}",
                                                              vocab.size(), vocabulary_limits::max_tokens));
  }

  // Tokens by id from the model's vocabulary and the added tokens (Llama 3's specials live only
  // among the added tokens).
  std::map<int64_t, std::string> by_id;
  std::unordered_map<int64_t, token_type> added_type;
  auto put = [&](int64_t id, const std::string& text) -> expected<void> {
    if (id < 0 || id >= static_cast<int64_t>(vocabulary_limits::max_tokens)) {
      return bad(fmt::format("token {} has id {}, out of range", printable_token(text), id));
    }
    auto [it, fresh] = by_id.emplace(id, text);
    if (!fresh && it->second != text) {
      return bad(fmt::format("id {} names two tokens: {} and {}", id, printable_token(it->second), printable_token(text)));
    }
    return {};
  };
  for (const auto& [text, id] : vocab.items()) {
    if (!id.is_number_integer()) return bad(fmt::format("token {} has an id that is not an integer", printable_token(text)));
    if (auto r = put(id.get<int64_t>(), text); !r) return forward_error(r);
  }
  const json& added = member(j, "added_tokens", empty_array);
  if (!added.is_array()) return bad("\"added_tokens\" is not a list");
  if (added.size() > vocabulary_limits::max_tokens) return make_error(error_code::limit_exceeded, "tokenizer.json: too many added tokens");
  for (const auto& a : added) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
        !a["content"].is_string()) {
      return bad("an added token is not an object with an integer \"id\" and a string \"content\"");
    }
    const int64_t id = a["id"].get<int64_t>();
    if (auto r = put(id, a["content"].get<std::string>()); !r) return forward_error(r);
    added_type[id] = a.value("special", false) ? token_type::control : token_type::user_defined;
  }
  if (by_id.empty()) return bad("the vocabulary is empty");
  const int64_t n = by_id.rbegin()->first + 1;
  if (static_cast<size_t>(n) != by_id.size()) {
    int64_t expect = 0;
    for (const auto& [id, text] : by_id) {
      if (id != expect) break;
      ++expect;
    }
    return bad(fmt::format("no token has id {} (ids must run from 0 without gaps; the largest is {})", expect, n - 1));
  }
  v.tokens.reserve(static_cast<size_t>(n));
  for (auto& [id, text] : by_id) v.tokens.push_back(std::move(text));
  v.token_types.assign(static_cast<size_t>(n), static_cast<int32_t>(token_type::normal));
  for (const auto& [id, t] : added_type) v.token_types[static_cast<size_t>(id)] = static_cast<int32_t>(t);

  const json& merges = member(model, "merges", empty_array);
  if (!merges.is_array()) return bad("model.merges is not a list");
  if (merges.size() > vocabulary_limits::max_merges) {
    return make_error(error_code::limit_exceeded, fmt::format("tokenizer.json: {} merges is more than the limit of {}",
                                                              merges.size(), vocabulary_limits::max_merges));
  }
  v.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    if (m.is_string()) {
      // The older form "a b": tokens never hold a plain space in either kind (Ġ, ▁ stand for it).
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 >= s.size() || s.find(' ', space + 1) != std::string::npos) {
        return bad(fmt::format("merge {} ({}) is not two tokens separated by one space", i, printable_token(s)));
      }
      v.merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      v.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return bad(fmt::format("merge {} is neither \"a b\" nor [\"a\", \"b\"]", i));
    }
  }
  v.ignore_merges = model.value("ignore_merges", false);

  pre_steps steps;
  if (auto r = walk_pre_tokenizer(member(j, "pre_tokenizer", null_json), steps); !r) return forward_error(r);
  normalizer_info norm;
  if (auto r = walk_normalizer(member(j, "normalizer", null_json), norm); !r) return forward_error(r);
  const bool byte_level_decoder = type_of(member(j, "decoder", null_json)) == "ByteLevel";
  if (steps.byte_level || byte_level_decoder) {
    v.model = vocabulary::kind::byte_bpe;
    if (norm.spm_spaces || steps.metaspace) return unsupported("both byte-level and \"▁\" spaces: not supported");
    v.pre_tokenizer_patterns = std::move(steps.patterns);
    v.pre_tokenizer = pre_tokenizer_name(v.pre_tokenizer_patterns);
  } else if (norm.spm_spaces || steps.metaspace) {
    v.model = vocabulary::kind::sentencepiece;
    if (!steps.patterns.empty()) return unsupported("a Split or Digits pre-tokenizer with \"▁\" spaces is not supported");
    v.add_space_prefix = norm.prepend || steps.metaspace_prefix;
    v.pre_tokenizer = "default";
    // SentencePiece merges the pair whose merged piece scores highest; HF's conversion wrote its
    // merges in that order, so the rank of the merge that makes a piece gives back its score.
    // Pieces no merge makes never win a merge.
    v.scores.assign(v.tokens.size(), -1e9f);
    std::unordered_map<std::string_view, int32_t> ids;
    for (int32_t i = 0; i < v.size(); ++i) ids.emplace(v.tokens[static_cast<size_t>(i)], i);
    std::string joined;
    for (size_t r = v.merges.size(); r-- > 0;) {
      joined.assign(v.merges[r].first).append(v.merges[r].second);
      if (auto it = ids.find(joined); it != ids.end()) v.scores[static_cast<size_t>(it->second)] = -static_cast<float>(r);
    }
    if (model.value("byte_fallback", false)) {
      for (size_t i = 0; i < v.tokens.size(); ++i) {
        if (v.token_types[i] == static_cast<int32_t>(token_type::normal) && is_byte_piece(v.tokens[i])) {
          v.token_types[i] = static_cast<int32_t>(token_type::byte);
        }
      }
    }
    // validate() checks the merges; the sentencepiece encoder does not use them once scored.
    if (auto r = v.validate(); !r) return forward_error(r);
    v.merges.clear();
  } else {
    return unsupported("neither byte-level (no ByteLevel pre-tokenizer or decoder) nor SentencePiece-style "
                       "(no Metaspace, no \"▁\" normalizer): not supported");
  }

  auto id_of = [&](const std::string& text) -> std::optional<int32_t> {
    for (int32_t i = 0; i < v.size(); ++i) {
      if (v.tokens[static_cast<size_t>(i)] == text) return i;
    }
    return std::nullopt;
  };
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    v.unk_id = id_of(model["unk_token"].get<std::string>());
    if (v.unk_id) v.token_types[static_cast<size_t>(*v.unk_id)] = static_cast<int32_t>(token_type::unknown);
  }
  std::optional<std::string> before, after;
  walk_post_processor(member(j, "post_processor", null_json), before, after);
  if (before) {
    v.bos_id = id_of(*before);
    v.add_bos = v.bos_id.has_value();
  }
  if (after) {
    v.eos_id = id_of(*after);
    v.add_eos = v.eos_id.has_value();
  }

  if (!config_json.empty()) {
    auto cparsed = parse(config_json, "tokenizer_config.json");
    if (!cparsed) return forward_error(cparsed);
    const json& c = *cparsed;
    auto named = [&](const char* key, std::optional<int32_t>& id) -> expected<void> {
      if (!c.contains(key) || c[key].is_null()) return {};
      auto text = token_text(c[key]);
      if (!text) return make_error(error_code::decode_error, fmt::format("tokenizer_config.json: {} is not a token", key));
      id = id_of(*text);
      if (!id) {
        return make_error(error_code::invalid_argument,
                          fmt::format("tokenizer_config.json: {} {} is not in the vocabulary of tokenizer.json", key,
                                      printable_token(*text)));
      }
      return {};
    };
    if (auto r = named("bos_token", v.bos_id); !r) return forward_error(r);
    if (auto r = named("eos_token", v.eos_id); !r) return forward_error(r);
    if (auto r = named("unk_token", v.unk_id); !r) return forward_error(r);
    if (auto r = named("pad_token", v.pad_id); !r) return forward_error(r);
    if (c.contains("add_bos_token") && c["add_bos_token"].is_boolean()) v.add_bos = c["add_bos_token"].get<bool>();
    if (c.contains("add_eos_token") && c["add_eos_token"].is_boolean()) v.add_eos = c["add_eos_token"].get<bool>();
    if (c.contains("chat_template")) {
      const json& t = c["chat_template"];
      if (t.is_string()) {
        out.chat_template = t.get<std::string>();
      } else if (t.is_array()) {
        for (const auto& e : t) {
          if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string()) {
            out.chat_template = e["template"].get<std::string>();
          }
        }
      }
    }
  }
  if (auto r = v.validate(); !r) {
    return make_error(r.error().code, "tokenizer.json: " + r.error().message);
  }
  return out;
}

expected<std::string> read_file(const std::filesystem::path& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return make_error(error_code::io_error, fmt::format("{}: {}", path.string(), ec.message()));
  if (size > max_tokenizer_json_bytes) {
    return make_error(error_code::limit_exceeded,
                      fmt::format("{}: {} bytes is more than the limit of {}", path.string(), size, max_tokenizer_json_bytes));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(error_code::io_error, fmt::format("{}: cannot be opened", path.string()));
  std::string text(static_cast<size_t>(size), '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  if (!in) return make_error(error_code::io_error, fmt::format("{}: read failed", path.string()));
  return text;
}

}  // namespace

expected<hf_tokenizer> parse_hf_tokenizer(std::string_view tokenizer_json, std::string_view config_json) {
  // nlohmann reports wrong types (a number where a string was expected) by throwing; they are
  // decode errors of the file, caught here so none leaves the layer.
  try {
    return parse_impl(tokenizer_json, config_json);
  } catch (const json::exception& e) {
    return bad(fmt::format("unexpected content: {}", e.what()));
  } catch (const std::bad_alloc&) {
    return make_error(error_code::limit_exceeded, "tokenizer.json: out of memory while reading it");
  }
}

expected<hf_tokenizer> load_hf_tokenizer(const std::filesystem::path& dir) {
  auto tok = read_file(dir / "tokenizer.json");
  if (!tok) return forward_error(tok);
  std::string config;
  if (std::filesystem::exists(dir / "tokenizer_config.json")) {
    auto c = read_file(dir / "tokenizer_config.json");
    if (!c) return forward_error(c);
    config = std::move(*c);
  }
  auto r = parse_hf_tokenizer(*tok, config);
  if (!r) return make_error(r.error().code, fmt::format("{}: {}", dir.string(), r.error().message));
  return r;
}

}  // namespace mesh::models
