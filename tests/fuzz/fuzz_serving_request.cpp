// Any bytes as the body of POST /v1/chat/completions and /v1/completions (the first byte picks
// the endpoint): a 400 whose error body is valid JSON of OpenAI's shape, or a request whose
// invariants hold and whose response chunks build.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "serving/request.hpp"
#include "serving/response.hpp"

using namespace mesh::serving;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool chat = data[0] & 1;
  std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  auto r = chat ? parse_chat_request(body, 7) : parse_completion_request(body, 7);
  if (!r) {
    if (r.error().kind != failure_kind::invalid_request) __builtin_trap();
    auto e = nlohmann::json::parse(error_body(r.error()), nullptr, false);
    if (e.is_discarded() || !e.contains("error") || e["error"].size() != 4) __builtin_trap();
    return 0;
  }
  const auto& g = r->generation;
  if (g.model.empty() || g.chat != chat) __builtin_trap();
  if (chat && (g.messages.empty() || g.messages.size() > request_limits{}.max_messages)) __builtin_trap();
  for (const auto& m : g.messages)
    if (m.role != "system" && m.role != "user" && m.role != "assistant") __builtin_trap();
  if (g.max_tokens && *g.max_tokens < 1) __builtin_trap();
  if (g.stop.size() > 4) __builtin_trap();
  for (const auto& s : g.stop)
    if (s.empty()) __builtin_trap();
  if (!(g.sampling.temperature >= 0 && g.sampling.temperature <= 2) || !(g.sampling.top_p > 0 && g.sampling.top_p <= 1) ||
      g.sampling.top_k < 0 || !(g.sampling.min_p >= 0 && g.sampling.min_p <= 1) || !(g.sampling.repetition_penalty > 0))
    __builtin_trap();
  if (r->include_usage && !r->stream) __builtin_trap();
  const response_meta meta{"id", 1, g.model, chat, g.logprobs >= 0};
  if (g.logprobs < -1 || g.logprobs > mesh::models::max_top_logprobs) __builtin_trap();
  // Every piece of outside text, as a piece and as tokens' bytes (which need not be UTF-8), must
  // render as valid JSON.
  for (const auto& m : g.messages) {
    const std::vector<token_logprobs> lp = {{{m.content, -1.0}, {{m.content, -2.0}, {g.model, -3.0}}, 0}};
    if (nlohmann::json::parse(piece_chunk_json(meta, m.content, lp, true), nullptr, false).is_discarded()) __builtin_trap();
  }
  return 0;
}
