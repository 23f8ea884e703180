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

json chat_choice(json delta, json finish) {
  return {{"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr}, {"finish_reason", std::move(finish)}};
}

json text_choice(std::string_view text, json finish) {
  return {{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", std::move(finish)}};
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
              {"logprobs", nullptr},
              {"finish_reason", to_string(r.reason)}};
  } else {
    choice = text_choice(r.text, to_string(r.reason));
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

std::string piece_chunk_json(const response_meta& meta, std::string_view piece, bool usage_null) {
  return dump(chunk(meta, meta.chat ? chat_choice({{"content", piece}}, nullptr) : text_choice(piece, nullptr), usage_null));
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
