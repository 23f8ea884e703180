#include "serving/response.hpp"

#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace mesh::serving {
namespace {

using json = nlohmann::json;

/// Pieces are whole UTF-8 characters, but a prompt echoed in an error or a model id need not
/// be: replace rather than throw.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json usage(const generation_result& r) {
  return {{"prompt_tokens", r.prompt_tokens},
          {"completion_tokens", r.completion_tokens},
          {"total_tokens", r.prompt_tokens + r.completion_tokens}};
}

json chunk(const response_meta& meta, json choice, bool usage_null) {
  json c = {{"id", meta.id},
            {"object", meta.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", meta.created},
            {"model", meta.model},
            {"choices", json::array({std::move(choice)})}};
  if (usage_null) c["usage"] = nullptr;
  return c;
}

// A token's bytes as a JSON string: dump() replaces bytes that are not UTF-8 by U+FFFD.
json token_bytes(const std::string& bytes) {
  json b = json::array();
  for (const char c : bytes) b.push_back(static_cast<unsigned char>(c));
  return b;
}

json chat_logprobs(std::span<const token_logprobs> entries) {
  json content = json::array();
  for (const auto& e : entries) {
    json top = json::array();
    for (const auto& t : e.top) top.push_back({{"token", t.bytes}, {"logprob", t.logprob}, {"bytes", token_bytes(t.bytes)}});
    content.push_back({{"token", e.token.bytes},
                       {"logprob", e.token.logprob},
                       {"bytes", token_bytes(e.token.bytes)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

json text_logprobs(std::span<const token_logprobs> entries) {
  json tokens = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
  for (const auto& e : entries) {
    tokens.push_back(e.token.bytes);
    values.push_back(e.token.logprob);
    json top = json::object();
    // Keys are the tokens' text: two tokens that show the same text keep the likelier one.
    for (const auto& t : e.top) top.emplace(t.bytes, t.logprob);
    tops.push_back(std::move(top));
    offsets.push_back(e.text_offset);
  }
  return {{"tokens", std::move(tokens)}, {"token_logprobs", std::move(values)}, {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

json logprobs_of(const response_meta& meta, std::span<const token_logprobs> entries) {
  if (!meta.logprobs) return nullptr;
  return meta.chat ? chat_logprobs(entries) : text_logprobs(entries);
}

json chat_choice(json delta, json finish, json logprobs = nullptr) {
  return {{"index", 0}, {"delta", std::move(delta)}, {"logprobs", std::move(logprobs)}, {"finish_reason", std::move(finish)}};
}

json text_choice(std::string_view text, json finish, json logprobs = nullptr) {
  return {{"index", 0}, {"text", text}, {"logprobs", std::move(logprobs)}, {"finish_reason", std::move(finish)}};
}

}  // namespace

const char* to_string(finish_reason r) { return r == finish_reason::length ? "length" : "stop"; }

std::string make_response_id(bool chat) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}{:08x}", chat ? "chatcmpl-" : "cmpl-", rng(), static_cast<uint32_t>(rng()));
}

std::string completion_json(const response_meta& meta, const generation_result& r) {
  json choice;
  if (meta.chat) {
    choice = {{"index", 0},
              {"message", {{"role", "assistant"}, {"content", r.text}, {"refusal", nullptr}}},
              {"logprobs", logprobs_of(meta, r.logprobs)},
              {"finish_reason", to_string(r.reason)}};
  } else {
    choice = text_choice(r.text, to_string(r.reason), logprobs_of(meta, r.logprobs));
  }
  return dump({{"id", meta.id},
               {"object", meta.chat ? "chat.completion" : "text_completion"},
               {"created", meta.created},
               {"model", meta.model},
               {"choices", json::array({choice})},
               {"usage", usage(r)}});
}

std::string sse_event(std::string_view j) {
  std::string e;
  e.reserve(j.size() + 8);
  e += "data: ";
  e += j;
  e += "\n\n";
  return e;
}

std::string sse_done() { return "data: [DONE]\n\n"; }

std::string first_chunk_json(const response_meta& meta, bool usage_null) {
  return dump(chunk(meta, chat_choice({{"role", "assistant"}, {"content", ""}}, nullptr), usage_null));
}

std::string piece_chunk_json(const response_meta& meta, std::string_view piece, std::span<const token_logprobs> logprobs,
                             bool usage_null) {
  json lp = logprobs_of(meta, logprobs);
  return dump(chunk(meta,
                    meta.chat ? chat_choice({{"content", piece}}, nullptr, std::move(lp))
                              : text_choice(piece, nullptr, std::move(lp)),
                    usage_null));
}

std::string finish_chunk_json(const response_meta& meta, finish_reason reason, bool usage_null) {
  return dump(chunk(meta, meta.chat ? chat_choice(json::object(), to_string(reason)) : text_choice("", to_string(reason)),
                    usage_null));
}

std::string usage_chunk_json(const response_meta& meta, const generation_result& r) {
  json c = chunk(meta, nullptr, false);
  c["choices"] = json::array();
  c["usage"] = usage(r);
  return dump(c);
}

std::string model_json(const model_info& m) { return dump({{"id", m.id}, {"object", "model"}, {"created", m.created}, {"owned_by", "meshnode"}}); }

std::string models_json(std::span<const model_info> models) {
  json data = json::array();
  for (const auto& m : models) data.push_back({{"id", m.id}, {"object", "model"}, {"created", m.created}, {"owned_by", "meshnode"}});
  return dump({{"object", "list"}, {"data", data}});
}

}  // namespace mesh::serving
