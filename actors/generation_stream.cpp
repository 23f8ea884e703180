#include "actors/generation_stream.hpp"

#include <algorithm>
#include <limits>

namespace mesh::generation {

namespace {

uint32_t clamp_u32(int64_t n) {
  return static_cast<uint32_t>(std::clamp<int64_t>(n, 0, std::numeric_limits<uint32_t>::max()));
}

}  // namespace

void generation_stream::token(int64_t tokens) { tokens_ = std::max(tokens_, clamp_u32(tokens)); }

msg::generate_piece generation_stream::piece(std::string_view text) const {
  return msg::generate_piece{request_, std::string(text), tokens_};
}

msg::generate_done generation_stream::done(const models::generation& g, const context_fit& fit, double load_seconds) const {
  msg::generate_done d;
  d.request = request_;
  d.ok = true;
  d.finish = finish_of(g.reason, fit);
  d.prompt_tokens = clamp_u32(g.prompt_tokens);
  d.tokens = clamp_u32(static_cast<int64_t>(g.tokens.size()));
  d.load_seconds = load_seconds;
  d.prompt_seconds = g.prompt_seconds;
  d.generate_seconds = g.generate_seconds;
  return d;
}

msg::generate_done failed(uint64_t request, const error& e) {
  msg::generate_done d;
  d.request = request;
  d.ok = false;
  d.code = e.code;
  d.error = e.message;
  return d;
}

msg::generate_done cancelled(uint64_t request) {
  msg::generate_done d;
  d.request = request;
  d.ok = true;
  d.finish = finish_reason::cancelled;
  return d;
}

}  // namespace mesh::generation
