#include "actors/generation_worker.hpp"

#include <utility>
#include <vector>

#include <fmt/format.h>

#include "actors/generation_stream.hpp"

namespace mesh::generation {

namespace {

/// The wire's error code for a failure the host reported.
error_code code_of(serving::failure_kind k) {
  using f = serving::failure_kind;
  switch (k) {
    case f::invalid_request: return error_code::invalid_argument;
    case f::unauthorized: return error_code::invalid_argument;
    case f::model_not_found: return error_code::not_found;
    case f::too_long: return error_code::limit_exceeded;
    case f::queue_full: return error_code::limit_exceeded;
    case f::no_capacity: return error_code::unavailable;
    case f::timeout: return error_code::timeout;
    case f::cancelled: return error_code::timeout;
    case f::internal: return error_code::internal;
  }
  return error_code::internal;
}

error error_of(const serving::failure& f) { return {code_of(f.kind), f.message}; }

/// The host's request for a wire request: the model by id or path, the prompt as one user turn
/// when chat, and the numbers check_request already checked.
serving::generation_request to_host(const msg::generate_request& r, const models::generate_options& o) {
  serving::generation_request g;
  g.model = r.model;
  g.by_path = true;
  g.chat = r.chat;
  if (r.chat) g.messages.push_back({"user", r.prompt});
  else g.prompt = r.prompt;
  g.chat_template = r.chat_template;
  g.adapter = r.adapter;
  g.sampling = o.sampling;
  g.max_tokens = o.max_tokens;
  g.cap_to_context = true;  // a node's client asks for "up to N tokens": the context may end it
  g.stop = o.stop;
  return g;
}

msg::generate_done done_of(uint64_t request, const serving::generation_result& r) {
  msg::generate_done d;
  d.request = request;
  d.ok = true;
  d.finish = finish_of(r.stop, context_fit{r.completion_tokens, r.context_capped});
  const auto u32 = [](int64_t n) { return static_cast<uint32_t>(std::clamp<int64_t>(n, 0, UINT32_MAX)); };
  d.prompt_tokens = u32(r.prompt_tokens);
  d.tokens = u32(r.completion_tokens);
  d.load_seconds = r.load_seconds;
  d.prompt_seconds = r.prompt_seconds;
  d.generate_seconds = r.generate_seconds;
  return d;
}

}  // namespace

void worker::shared::tell(const key& k, const msg::message& m, bool last) {
  bool to_client = false;
  {
    std::lock_guard<std::mutex> lock(this->m);
    auto it = live.find(k);
    to_client = !closed && it != live.end() && it->second.tell_client;
    if (last && it != live.end()) live.erase(it);
  }
  if (to_client) send(k.first, m);
}

worker::worker(serving::local_backend& host, sender send, worker_options options)
    : host_(host), options_(std::move(options)), s_(std::make_shared<shared>()) {
  s_->send = std::move(send);
}

worker::~worker() {
  std::vector<std::shared_ptr<serving::request_handle>> running;
  {
    std::lock_guard<std::mutex> lock(s_->m);
    s_->closed = true;
    for (auto& [k, l] : s_->live)
      if (l.handle) running.push_back(l.handle);
  }
  for (auto& h : running) host_.cancel(h);
}

void worker::submit(const node_id& client, msg::generate_request r) {
  auto checked = check_request(r, options_.limits);
  if (!checked) {
    s_->send(client, failed(r.request, checked.error()));
    return;
  }
  const key k{client, r.request};
  {
    std::lock_guard<std::mutex> lock(s_->m);
    if (s_->closed) return;
    if (!s_->live.emplace(k, live_request{}).second) {
      s_->send(client, failed(r.request, {error_code::invalid_argument,
                                          fmt::format("generate: request {} is already running or waiting", r.request)}));
      return;
    }
  }
  // The stream's token count is touched by the host's thread only (on_token, on_piece, on_done).
  auto stream = std::make_shared<generation_stream>(r.request);
  serving::generation_callbacks cb;
  cb.on_token = [stream](int64_t n) { stream->token(n); };
  cb.on_piece = [s = s_, stream, k](std::string_view piece, std::span<const serving::token_logprobs>) {
    s->tell(k, stream->piece(piece), false);
  };
  cb.on_done = [s = s_, k](serving::generation_outcome outcome) {
    if (outcome) s->tell(k, done_of(k.second, *outcome), true);
    else if (outcome.error().kind == serving::failure_kind::cancelled) s->tell(k, cancelled(k.second), true);
    else s->tell(k, failed(k.second, error_of(outcome.error())), true);
  };
  auto started = host_.start(to_host(r, *checked), std::move(cb));
  if (!started) {
    s_->tell(k, failed(r.request, error_of(started.error())), true);
    return;
  }
  std::lock_guard<std::mutex> lock(s_->m);
  if (auto it = s_->live.find(k); it != s_->live.end()) it->second.handle = *started;  // unless it already ended
}

void worker::cancel(const node_id& client, uint64_t request) {
  std::shared_ptr<serving::request_handle> h;
  {
    std::lock_guard<std::mutex> lock(s_->m);
    auto it = s_->live.find({client, request});
    if (it == s_->live.end()) return;
    h = it->second.handle;
  }
  if (h) host_.cancel(h);
}

void worker::client_gone(const node_id& client) {
  std::vector<std::shared_ptr<serving::request_handle>> stop;
  {
    std::lock_guard<std::mutex> lock(s_->m);
    for (auto& [k, l] : s_->live)
      if (k.first == client) {
        l.tell_client = false;
        if (l.handle) stop.push_back(l.handle);
      }
  }
  for (auto& h : stop) host_.cancel(h);
}

size_t worker::pending() const {
  std::lock_guard<std::mutex> lock(s_->m);
  return s_->live.size();
}

}  // namespace mesh::generation
