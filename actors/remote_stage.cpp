#include "actors/remote_stage.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace mesh::generation {

expected<msg::stage_reply> stage_calls::call(const node_id& to, msg::message m, std::chrono::milliseconds timeout) {
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(m_);
    if (closed_) return make_error(error_code::unavailable, "the node is stopping");
    id = next_call_++;
    pending_[id].to = to;
  }
  if (auto* o = std::get_if<msg::stage_open>(&m)) o->call = id;
  else if (auto* s = std::get_if<msg::stage_step>(&m)) s->call = id;
  const auto forget = [&] {
    std::lock_guard<std::mutex> lock(m_);
    pending_.erase(id);
  };
  if (!send_(to, m)) {
    forget();
    return make_error(error_code::unavailable, fmt::format("node {} is not connected", to.short_string()));
  }
  std::unique_lock<std::mutex> lock(m_);
  const bool done = answered_.wait_for(lock, timeout, [&] { return pending_.at(id).outcome.has_value(); });
  expected<msg::stage_reply> outcome = make_error(error_code::unavailable, fmt::format("node {} did not answer {} within {} ms", to.short_string(),
                                                                                      msg::kind_name(m), timeout.count()));
  if (done) outcome = std::move(*pending_.at(id).outcome);
  pending_.erase(id);
  return outcome;
}

bool stage_calls::tell(const node_id& to, const msg::message& m) {
  {
    std::lock_guard<std::mutex> lock(m_);
    if (closed_) return false;
  }
  return send_(to, m);
}

void stage_calls::deliver(const node_id& from, const msg::stage_reply& r) {
  {
    std::lock_guard<std::mutex> lock(m_);
    auto it = pending_.find(r.call);
    if (it == pending_.end() || it->second.to != from || it->second.outcome) return;
    it->second.outcome = r;
  }
  answered_.notify_all();
}

void stage_calls::peer_gone(const node_id& peer) {
  {
    std::lock_guard<std::mutex> lock(m_);
    for (auto& [id, p] : pending_)
      if (p.to == peer && !p.outcome)
        p.outcome = make_error(error_code::unavailable, fmt::format("node {} left the mesh (its connection closed)", peer.short_string()));
  }
  answered_.notify_all();
}

void stage_calls::close() {
  {
    std::lock_guard<std::mutex> lock(m_);
    closed_ = true;
    for (auto& [id, p] : pending_)
      if (!p.outcome) p.outcome = make_error(error_code::unavailable, "the node is stopping");
  }
  answered_.notify_all();
}

uint64_t stage_calls::next_stage() {
  std::lock_guard<std::mutex> lock(m_);
  return next_stage_++;
}

expected<std::unique_ptr<remote_stage>> remote_stage::open(std::shared_ptr<stage_calls> calls, const node_id& peer, const std::string& path,
                                                          const models::layer_range& layers, int64_t context, int64_t hidden_size,
                                                          remote_stage_timeouts timeouts, std::vector<msg::blob_file> files,
                                                          int64_t slots) {
  std::unique_ptr<remote_stage> r(new remote_stage());
  r->calls_ = std::move(calls);
  r->peer_ = peer;
  r->stage_ = r->calls_->next_stage();
  r->hidden_size_ = hidden_size;
  r->timeouts_ = timeouts;
  msg::stage_open o;
  o.stage = r->stage_;
  o.path = path;
  o.first_layer = static_cast<uint32_t>(layers.first);
  o.end_layer = static_cast<uint32_t>(layers.end);
  o.head = layers.head;
  o.context = static_cast<uint32_t>(context);
  o.slots = static_cast<uint32_t>(slots);
  o.files = std::move(files);
  auto reply = r->calls_->call(peer, o, timeouts.open);
  if (!reply) {
    r->calls_.reset();  // nothing to close
    return tl::unexpected(reply.error());
  }
  if (!reply->ok) {
    r->calls_.reset();
    return make_error(reply->code, reply->error);
  }
  return r;
}

remote_stage::~remote_stage() {
  if (calls_) calls_->tell(peer_, msg::stage_close{stage_});
}

expected<std::vector<float>> remote_stage::forward(int64_t slot, int64_t start, std::span<const int32_t> tokens,
                                                   std::span<const float> hidden) {
  msg::stage_step s;
  s.slot = static_cast<uint32_t>(slot);
  s.start = static_cast<uint32_t>(start);
  return call_step(std::move(s), tokens, hidden);
}

expected<std::vector<float>> remote_stage::forward(std::span<const models::batch_row> rows, std::span<const int32_t> tokens,
                                                   std::span<const float> hidden) {
  msg::stage_step s;
  for (const auto& r : rows) s.rows.push_back({static_cast<uint32_t>(r.slot), static_cast<uint32_t>(r.position)});
  return call_step(std::move(s), tokens, hidden);
}

expected<std::vector<float>> remote_stage::call_step(msg::stage_step s, std::span<const int32_t> tokens, std::span<const float> hidden) {
  s.stage = stage_;
  if (!tokens.empty()) {
    s.input = tensor::from_ints({static_cast<int64_t>(tokens.size())}, std::vector<int32_t>(tokens.begin(), tokens.end()));
  } else {
    const auto n = static_cast<int64_t>(hidden.size());
    if (hidden_size_ <= 0 || n % hidden_size_ != 0)
      return make_error(error_code::invalid_argument, fmt::format("{} values are not whole rows of {}", n, hidden_size_));
    s.input = tensor::from_floats({n / hidden_size_, hidden_size_}, std::vector<float>(hidden.begin(), hidden.end()));
  }
  const int64_t rows = std::max<int64_t>(1, s.input.dims.empty() ? 1 : s.input.dims[0]);
  const auto started = std::chrono::steady_clock::now();
  auto reply = calls_->call(peer_, std::move(s), step_deadline(rows));
  if (!reply) return tl::unexpected(reply.error());
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  per_row_.push_back(took / static_cast<double>(rows));
  if (per_row_.size() > 16) per_row_.pop_front();
  ++answered_;
  if (!reply->ok) return make_error(reply->code, reply->error);
  if (reply->output.type != dtype::f32)
    return make_error(error_code::decode_error, fmt::format("node {} answered a step with {} values, not f32", peer_.short_string(),
                                                            to_string(reply->output.type)));
  return reply->output.to_floats();
}

std::chrono::milliseconds remote_stage::step_deadline(int64_t rows) const {
  // The first steps compile the stage's programs and read its first prompt: no measure yet.
  if (answered_ < 4) return timeouts_.step;
  double longest = 0;
  for (double x : per_row_) longest = std::max(longest, x);
  const double ms = timeouts_.factor * longest * static_cast<double>(rows) * 1e3;
  const auto measured = std::chrono::milliseconds(static_cast<int64_t>(std::min(ms, 1e12)));
  return std::clamp(measured, timeouts_.floor, std::max(timeouts_.floor, timeouts_.step));
}

}  // namespace mesh::generation
