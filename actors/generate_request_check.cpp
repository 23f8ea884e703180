#include "actors/generate_request_check.hpp"

#include <cmath>

#include <fmt/format.h>

namespace mesh::generation {

namespace {

tl::unexpected<error> bad(std::string what) {
  return make_error(error_code::invalid_argument, "generate: " + std::move(what));
}

}  // namespace

expected<models::generate_options> check_request(const msg::generate_request& r, const request_limits& limits) {
  if (r.model.empty()) return bad("no model path given (a GGUF file or a Hugging Face directory on the node)");
  if (r.model.size() > limits.max_path_bytes)
    return bad(fmt::format("the model path is {} bytes long; at most {} are accepted", r.model.size(), limits.max_path_bytes));
  if (r.model.find('\0') != std::string::npos) return bad("the model path contains a NUL byte");
  if (r.prompt.empty()) return bad("the prompt is empty");
  if (!r.chat_template.empty() && !r.chat) return bad("a chat template was named without chat");
  if (r.chat_template.size() > 64) return bad("the chat template name is longer than 64 bytes");
  if (r.adapter.size() > 4096) return bad("the adapter path is longer than 4096 bytes");
  if (r.max_tokens == 0) return bad("max_tokens is 0; ask for at least 1 token");
  if (r.max_tokens > limits.max_tokens)
    return bad(fmt::format("max_tokens {} is more than the node allows ({})", r.max_tokens, limits.max_tokens));
  const auto& s = r.sampling;
  // The sampler treats temperature <= 0 as greedy; a negative one is refused all the same, since
  // it is far more likely a typo than a request for greedy decoding.
  if (!std::isfinite(s.temperature) || s.temperature < 0)
    return bad(fmt::format("temperature {} is not a finite number >= 0 (0 is greedy)", s.temperature));
  if (s.top_k < 0) return bad(fmt::format("top_k {} is negative (0 turns it off)", s.top_k));
  if (!(s.top_p > 0 && s.top_p <= 1)) return bad(fmt::format("top_p {} is outside (0, 1] (1 turns it off)", s.top_p));
  if (!(s.min_p >= 0 && s.min_p <= 1)) return bad(fmt::format("min_p {} is outside [0, 1] (0 turns it off)", s.min_p));
  if (!(s.repeat_penalty > 0) || !std::isfinite(s.repeat_penalty))
    return bad(fmt::format("repeat_penalty {} is not a finite number > 0 (1 turns it off)", s.repeat_penalty));
  if (r.stop.size() > limits.max_stop_strings)
    return bad(fmt::format("{} stop strings; at most {} are accepted", r.stop.size(), limits.max_stop_strings));
  for (size_t i = 0; i < r.stop.size(); ++i) {
    if (r.stop[i].empty()) return bad(fmt::format("stop string {} is empty", i + 1));
    if (r.stop[i].size() > limits.max_stop_bytes)
      return bad(fmt::format("stop string {} is {} bytes long; at most {} are accepted", i + 1, r.stop[i].size(), limits.max_stop_bytes));
  }
  models::generate_options o;
  o.max_tokens = r.max_tokens;
  o.stop = r.stop;
  o.sampling.temperature = s.temperature;
  o.sampling.top_k = s.top_k;
  o.sampling.top_p = s.top_p;
  o.sampling.min_p = s.min_p;
  o.sampling.repetition_penalty = s.repeat_penalty;
  o.sampling.seed = s.seed;
  return o;
}

expected<context_fit> fit_context(int64_t prompt_tokens, int64_t max_tokens, int64_t context, const std::string& model) {
  const int64_t room = context - prompt_tokens;
  if (room < 1)
    return make_error(error_code::limit_exceeded,
                      fmt::format("generate: the prompt is {} tokens, which leaves no room in the context of {} positions of {} "
                                  "(shorten the prompt)",
                                  prompt_tokens, context, model));
  if (max_tokens > room) return context_fit{room, true};
  return context_fit{max_tokens, false};
}

finish_reason finish_of(models::stop_reason r, const context_fit& fit) {
  switch (r) {
    case models::stop_reason::eos: return finish_reason::eos;
    case models::stop_reason::stop_string: return finish_reason::stop;
    case models::stop_reason::callback: return finish_reason::cancelled;
    case models::stop_reason::max_tokens: return fit.capped ? finish_reason::context : finish_reason::length;
  }
  return finish_reason::length;
}

}  // namespace mesh::generation
