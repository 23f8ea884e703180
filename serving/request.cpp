#include "serving/request.hpp"

#include <cmath>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace mesh::serving {
namespace {

using json = nlohmann::json;

tl::unexpected<failure> bad(std::string param, std::string message) {
  return fail(failure_kind::invalid_request, std::move(message), std::move(param));
}

/// What a parameter's value type is, for messages ("a string", "an integer", ...).
std::string type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    default: return "a value";
  }
}

tl::unexpected<failure> wrong_type(const std::string& param, const json& v, std::string_view want) {
  return bad(param, fmt::format("'{}' must be {}, not {}", param, want, type_name(v)));
}

/// A number as a double (any JSON number).
result<double> number(const json& v, const std::string& param) {
  if (!v.is_number()) return wrong_type(param, v, "a number");
  return v.get<double>();
}

/// A JSON integer (OpenAI refuses 1.0 for integer parameters too).
result<int64_t> integer(const json& v, const std::string& param) {
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return bad(param, fmt::format("'{}' is too large", param));
    return static_cast<int64_t>(v.get<uint64_t>());
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  return wrong_type(param, v, "an integer");
}

result<double> number_in(const json& v, const std::string& param, double lo, double hi) {
  auto x = number(v, param);
  if (!x) return x;
  if (!(*x >= lo && *x <= hi)) return bad(param, fmt::format("'{}' must be between {} and {}, not {}", param, lo, hi, *x));
  return x;
}

/// Text of a message's `content`: a string, or an array of parts of which only {"type":
/// "text"} can be honoured (their texts joined, as OpenAI joins them).
result<std::string> message_content(const json& c, const std::string& param) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) return wrong_type(param, c, "a string or an array of text parts");
  std::string text;
  for (size_t i = 0; i < c.size(); ++i) {
    const std::string p = fmt::format("{}[{}]", param, i);
    const json& part = c[i];
    if (!part.is_object()) return wrong_type(p, part, "an object");
    auto type = part.find("type");
    if (type == part.end() || !type->is_string()) return bad(p + ".type", fmt::format("'{}.type' must be a string", p));
    if (*type != "text")
      return bad(p + ".type", fmt::format("content parts of type '{}' are not supported: only 'text'",
                                          type->get<std::string>()));
    auto t = part.find("text");
    if (t == part.end() || !t->is_string()) return bad(p + ".text", fmt::format("'{}.text' must be a string", p));
    for (const auto& [key, value] : part.items())
      if (key != "type" && key != "text") return bad(p + "." + key, fmt::format("unrecognized content part field '{}'", key));
    text += t->get<std::string>();
  }
  return text;
}

result<std::vector<models::chat_message>> parse_messages(const json& m, const request_limits& limits) {
  if (!m.is_array()) return wrong_type("messages", m, "an array");
  if (m.empty()) return bad("messages", "'messages' must hold at least one message");
  if (m.size() > limits.max_messages)
    return bad("messages", fmt::format("'messages' holds {} messages, more than the {} allowed", m.size(), limits.max_messages));
  std::vector<models::chat_message> out;
  for (size_t i = 0; i < m.size(); ++i) {
    const std::string p = fmt::format("messages[{}]", i);
    const json& msg = m[i];
    if (!msg.is_object()) return wrong_type(p, msg, "an object");
    auto role = msg.find("role");
    if (role == msg.end() || !role->is_string()) return bad(p + ".role", fmt::format("'{}.role' must be a string", p));
    std::string r = role->get<std::string>();
    // OpenAI's newer name for the system turn; chat templates only know "system".
    if (r == "developer") r = "system";
    if (r != "system" && r != "user" && r != "assistant")
      return bad(p + ".role", fmt::format("role '{}' is not supported: use system, user or assistant", role->get<std::string>()));
    models::chat_message out_msg{r, {}};
    auto content = msg.find("content");
    if (content == msg.end() || content->is_null())
      return bad(p + ".content", fmt::format("'{}.content' is required (tool calls are not supported)", p));
    auto text = message_content(*content, p + ".content");
    if (!text) return tl::unexpected(text.error());
    out_msg.content = std::move(*text);
    for (const auto& [key, value] : msg.items()) {
      if (key == "role" || key == "content") continue;
      if (key == "name") {  // a participant's name: templates of these families do not render it
        if (!value.is_string()) return wrong_type(p + ".name", value, "a string");
        continue;
      }
      if ((key == "tool_calls" || key == "function_call" || key == "refusal" || key == "audio") && value.is_null()) continue;
      if (key == "tool_calls" || key == "function_call" || key == "tool_call_id" || key == "audio")
        return bad(p + "." + key, fmt::format("'{}.{}' is not supported: tools and audio are not served", p, key));
      if (key == "refusal") continue;  // an earlier assistant turn's refusal text, not rendered
      return bad(p + "." + key, fmt::format("unrecognized message field '{}'", key));
    }
    out.push_back(std::move(out_msg));
  }
  return out;
}

result<std::vector<std::string>> parse_stop(const json& v, const request_limits& limits) {
  std::vector<std::string> stop;
  if (v.is_null()) return stop;
  if (v.is_string()) {
    stop.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    if (v.size() > limits.max_stop)
      return bad("stop", fmt::format("'stop' holds {} strings, more than the {} allowed", v.size(), limits.max_stop));
    for (const auto& s : v) {
      if (!s.is_string()) return wrong_type("stop", s, "a string or an array of strings");
      stop.push_back(s.get<std::string>());
    }
  } else {
    return wrong_type("stop", v, "a string or an array of strings");
  }
  for (const auto& s : stop) {
    if (s.empty()) return bad("stop", "a stop string must not be empty");
    if (s.size() > limits.max_stop_bytes)
      return bad("stop", fmt::format("a stop string of {} bytes is longer than the {} allowed", s.size(), limits.max_stop_bytes));
  }
  return stop;
}

/// Whether a value is its parameter's "off" value, so that a client that sends the default
/// explicitly (many do) is not refused.
bool is_zero_or_null(const json& v) { return v.is_null() || (v.is_number() && v.get<double>() == 0.0); }

enum class endpoint { chat, completion };

result<api_request> parse(std::string_view body, uint64_t default_seed, const request_limits& limits, endpoint kind) {
  if (json_depth(body) > limits.max_json_depth)
    return bad("", fmt::format("the request body nests deeper than {} levels", limits.max_json_depth));
  json doc = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return bad("", "the request body is not valid JSON");
  if (!doc.is_object()) return bad("", fmt::format("the request body must be a JSON object, not {}", type_name(doc)));

  api_request out;
  generation_request& g = out.generation;
  g.chat = kind == endpoint::chat;
  g.sampling.temperature = 1.0f;
  g.sampling.seed = default_seed;
  bool have_model = false, have_input = false;
  std::optional<int64_t> max_tokens, max_completion_tokens;
  bool chat_logprobs = false;
  std::optional<int32_t> top_logprobs;
  const json* stream_options = nullptr;

  for (const auto& [key, v] : doc.items()) {
    if (key == "model") {
      if (!v.is_string()) return wrong_type("model", v, "a string");
      g.model = v.get<std::string>();
      if (g.model.empty()) return bad("model", "'model' must not be empty");
      have_model = true;
    } else if (kind == endpoint::chat && key == "messages") {
      auto m = parse_messages(v, limits);
      if (!m) return tl::unexpected(m.error());
      g.messages = std::move(*m);
      have_input = true;
    } else if (kind == endpoint::completion && key == "prompt") {
      if (v.is_string()) {
        g.prompt = v.get<std::string>();
      } else if (v.is_array() && v.size() == 1 && v[0].is_string()) {
        g.prompt = v[0].get<std::string>();
      } else if (v.is_array() && v.size() > 1 && v[0].is_string()) {
        return bad("prompt", "'prompt' holds several prompts: only one per request is supported");
      } else {
        return wrong_type("prompt", v, "a string or an array of one string (token arrays are not supported)");
      }
      have_input = true;
    } else if (key == "max_tokens" || key == "max_completion_tokens") {
      if (v.is_null()) continue;
      auto n = integer(v, key);
      if (!n) return tl::unexpected(n.error());
      if (*n < 1) return bad(key, fmt::format("'{}' must be at least 1, not {}", key, *n));
      (key == "max_tokens" ? max_tokens : max_completion_tokens) = *n;
    } else if (key == "temperature") {
      if (v.is_null()) continue;
      auto t = number_in(v, key, 0, 2);
      if (!t) return tl::unexpected(t.error());
      g.sampling.temperature = static_cast<float>(*t);
    } else if (key == "top_p") {
      if (v.is_null()) continue;
      auto p = number_in(v, key, 0, 1);
      if (!p) return tl::unexpected(p.error());
      if (*p == 0) return bad(key, "'top_p' must be greater than 0 (use temperature 0 for greedy decoding)");
      g.sampling.top_p = static_cast<float>(*p);
    } else if (key == "top_k") {  // vLLM's and llama.cpp's extension; -1 (vLLM) and 0 are off
      if (v.is_null()) continue;
      auto k = integer(v, key);
      if (!k) return tl::unexpected(k.error());
      if (*k < -1 || *k > std::numeric_limits<int32_t>::max())
        return bad(key, fmt::format("'top_k' must be -1, 0 (off) or a positive count, not {}", *k));
      g.sampling.top_k = *k < 0 ? 0 : static_cast<int32_t>(*k);
    } else if (key == "min_p") {
      if (v.is_null()) continue;
      auto p = number_in(v, key, 0, 1);
      if (!p) return tl::unexpected(p.error());
      g.sampling.min_p = static_cast<float>(*p);
    } else if (key == "repetition_penalty") {  // vLLM's extension: CTRL's multiplicative penalty
      if (v.is_null()) continue;
      auto p = number_in(v, key, 0, 100);
      if (!p) return tl::unexpected(p.error());
      if (*p == 0) return bad(key, "'repetition_penalty' must be greater than 0 (1 is off)");
      g.sampling.repetition_penalty = static_cast<float>(*p);
    } else if (key == "frequency_penalty" || key == "presence_penalty") {
      // OpenAI's additive penalties are not the sampler's multiplicative repetition penalty:
      // mapping one onto the other would silently change results.
      if (!is_zero_or_null(v))
        return bad(key, fmt::format("'{}' is not supported (use repetition_penalty); only 0 is accepted", key));
    } else if (key == "ignore_eos") {  // vLLM's extension: generate exactly max_tokens (benchmarks)
      if (v.is_null()) continue;
      if (!v.is_boolean()) return wrong_type(key, v, "a boolean");
      g.ignore_eos = v.get<bool>();
    } else if (key == "seed") {
      if (v.is_null()) continue;
      auto s = integer(v, key);
      if (!s) return tl::unexpected(s.error());
      g.sampling.seed = static_cast<uint64_t>(*s);
    } else if (key == "stop") {
      auto s = parse_stop(v, limits);
      if (!s) return tl::unexpected(s.error());
      g.stop = std::move(*s);
    } else if (key == "n" || key == "best_of") {
      if (v.is_null()) continue;
      auto n = integer(v, key);
      if (!n) return tl::unexpected(n.error());
      if (*n != 1) return bad(key, fmt::format("'{}' must be 1: one choice per request is supported", key));
    } else if (key == "stream") {
      if (v.is_null()) continue;
      if (!v.is_boolean()) return wrong_type(key, v, "a boolean");
      out.stream = v.get<bool>();
    } else if (key == "stream_options") {
      if (v.is_null()) continue;
      if (!v.is_object()) return wrong_type(key, v, "an object");
      stream_options = &v;
    } else if (key == "logprobs" && kind == endpoint::chat) {  // chat: a boolean, alternatives in top_logprobs
      if (v.is_null()) continue;
      if (!v.is_boolean()) return wrong_type(key, v, "a boolean");
      chat_logprobs = v.get<bool>();
    } else if (key == "logprobs") {  // text completions: the number of alternatives, 0 to 5 (OpenAI's range)
      if (v.is_null()) continue;
      auto n = integer(v, key);
      if (!n) return tl::unexpected(n.error());
      if (*n < 0 || *n > 5) return bad(key, fmt::format("'logprobs' must be between 0 and 5, not {}", *n));
      g.logprobs = static_cast<int32_t>(*n);
    } else if (key == "top_logprobs" && kind == endpoint::chat) {
      if (v.is_null()) continue;
      auto n = integer(v, key);
      if (!n) return tl::unexpected(n.error());
      if (*n < 0 || *n > models::max_top_logprobs)
        return bad(key, fmt::format("'top_logprobs' must be between 0 and {}, not {}", models::max_top_logprobs, *n));
      top_logprobs = static_cast<int32_t>(*n);
    } else if (key == "top_logprobs") {
      if (!is_zero_or_null(v)) return bad(key, "text completions take 'logprobs': N, not 'top_logprobs'");
    } else if (key == "echo") {
      if (kind != endpoint::completion) return bad(key, fmt::format("unrecognized request argument '{}'", key));
      if (!v.is_null() && !v.is_boolean()) return wrong_type(key, v, "a boolean");
      if (v.is_boolean() && v.get<bool>()) return bad(key, "'echo' is not supported");
    } else if (key == "suffix") {
      if (kind != endpoint::completion) return bad(key, fmt::format("unrecognized request argument '{}'", key));
      if (!v.is_null() && !(v.is_string() && v.get<std::string>().empty())) return bad(key, "'suffix' is not supported");
    } else if (key == "logit_bias") {
      if (!v.is_null() && !(v.is_object() && v.empty())) return bad(key, "'logit_bias' is not supported");
    } else if (key == "tools" || key == "functions") {
      if (!v.is_null() && !(v.is_array() && v.empty())) return bad(key, fmt::format("'{}' is not supported: tools are not served", key));
    } else if (key == "tool_choice" || key == "function_call") {
      if (!v.is_null() && !(v.is_string() && v.get<std::string>() == "none"))
        return bad(key, fmt::format("'{}' is not supported: tools are not served", key));
    } else if (key == "response_format") {
      if (v.is_null()) continue;
      if (!v.is_object() || !v.contains("type") || v["type"] != "text")
        return bad(key, "'response_format' is not supported beyond {\"type\": \"text\"}");
    } else if (key == "modalities") {
      if (!v.is_null() && !(v.is_array() && v.size() == 1 && v[0] == "text")) return bad(key, "only the text modality is served");
    } else if (key == "user" || key == "metadata" || key == "store" || key == "service_tier" ||
               key == "parallel_tool_calls" || key == "safety_identifier" || key == "prompt_cache_key") {
      // Bookkeeping and routing hints that do not change the generated text.
    } else {
      return bad(key, fmt::format("unrecognized request argument '{}'", key));
    }
  }
  if (top_logprobs.value_or(0) > 0 && !chat_logprobs) return bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  if (chat_logprobs) g.logprobs = top_logprobs.value_or(0);
  if (!have_model) return bad("model", "'model' is required");
  if (!have_input) return kind == endpoint::chat ? bad("messages", "'messages' is required") : bad("prompt", "'prompt' is required");
  if (max_completion_tokens) g.max_tokens = max_completion_tokens;
  else if (max_tokens) g.max_tokens = max_tokens;
  if (stream_options) {
    if (!out.stream) return bad("stream_options", "'stream_options' is only allowed when 'stream' is true");
    for (const auto& [key, v] : stream_options->items()) {
      if (key == "include_usage") {
        if (!v.is_boolean()) return wrong_type("stream_options.include_usage", v, "a boolean");
        out.include_usage = v.get<bool>();
      } else if (key != "include_obfuscation") {  // padding OpenAI may add to chunks: none here
        return bad("stream_options." + key, fmt::format("unrecognized stream option '{}'", key));
      }
    }
  }
  return out;
}

}  // namespace

int json_depth(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') deepest = std::max(deepest, ++depth);
    else if (c == ']' || c == '}') --depth;
  }
  return deepest;
}

result<api_request> parse_chat_request(std::string_view body, uint64_t default_seed, const request_limits& limits) {
  return parse(body, default_seed, limits, endpoint::chat);
}

result<api_request> parse_completion_request(std::string_view body, uint64_t default_seed, const request_limits& limits) {
  return parse(body, default_seed, limits, endpoint::completion);
}

}  // namespace mesh::serving
