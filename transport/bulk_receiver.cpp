#include "transport/bulk_receiver.hpp"

#include <algorithm>

namespace mesh::transport {

namespace {
constexpr uint64_t max_reserve = uint64_t{1} << 30;  // larger messages grow past it as they arrive
}

bulk_receiver::bulk_receiver(config cfg)
    : cfg_(cfg), budget_(std::max(cfg.budget, cfg.limits.bulk)), budget_left_(budget_) {}

uint64_t bulk_receiver::reserve_for(int64_t sid, uint64_t length) const {
  // Whole (one allocation, or a pooled buffer) when it will get budget at once; else one
  // stream window, which is all a waiting message can receive.
  const bool budget_now = (queue_.empty() || sid < queue_.front()) && fits(sid, length);
  return budget_now ? std::min(length, max_reserve) : std::min(length, cfg_.stream_window);
}

bool bulk_receiver::fits(int64_t sid, uint64_t size) const {
  if (!admitted_ || size > budget_left()) return false;
  if (!waits_in_inbox(sid)) return true;  // handed over as it finishes
  // It may finish before the message the inbox waits for (or before that message's marker
  // comes), and so may every other such message that has budget: all of them must fit the inbox
  // beside what it holds. Otherwise, while that message has not even announced itself (its first
  // packet lost), later ones granted here could all finish first and overflow the inbox, which
  // then cuts off a peer that only ever sent what it was credited. The awaited message waits for
  // room only until its marker comes (the control stream is reliable): then it needs budget alone.
  uint64_t ahead = inbox_held_;
  for (const auto& [id, st] : streams_)
    if (st.has_budget && waits_in_inbox(id)) ahead += st.budgeted;
  return ahead <= budget_ && size <= budget_ - ahead;
}

void bulk_receiver::enqueue(int64_t sid) {
  queue_.insert(std::upper_bound(queue_.begin(), queue_.end(), sid), sid);
}

void bulk_receiver::grant(stream& s, uint64_t size) {
  budget_left_ -= size;
  s.budgeted = size;
  s.has_budget = true;
  s.queued = false;
  s.decoder.reserve_payload(std::min(size, max_reserve));
}

expected<bulk_receiver::result> bulk_receiver::on_data(int64_t sid, std::span<const uint8_t> bytes, bool fin) {
  auto it = streams_.find(sid);
  if (it == streams_.end()) {
    it = streams_.emplace(sid, stream{frame_decoder(cfg_.limits, cfg_.stream_window, cfg_.pool), {}}).first;
    it->second.decoder.set_reserve_rule([this, sid](uint64_t length) { return reserve_for(sid, length); });
  }
  stream& s = it->second;
  auto fed = s.decoder.feed(bytes, s.frames);
  receiving_ = receiving_ - s.held + s.buffered();
  s.held = s.buffered();
  peak_ = std::max(peak_, receiving_);
  if (!fed) return make_error(fed.error().code, "bulk stream: " + fed.error().message);
  // Nothing may follow the one frame: bytes past it would be credited outside any budget.
  if (s.frames.size() > 1 || (!s.frames.empty() && (s.frames.front().kind != frame_kind::bulk || !s.decoder.at_boundary())))
    return make_error(error_code::decode_error, "a bulk stream must carry exactly one bulk frame");

  result r;
  if (s.has_budget) {
    r.credit = bytes.size();
  } else {
    s.uncredited += bytes.size();
    if (!s.queued) {
      if (auto size = s.size()) {  // the header is complete (before that it fits any window)
        // Streams wait in the order the peer opened them, not the order their headers arrive
        // (a lost packet reorders those): the inbox hands messages over in stream order, so the
        // message it waits for goes first. Nothing waiting ahead of this one: it may go now.
        if ((queue_.empty() || sid < queue_.front()) && fits(sid, *size)) {
          grant(s, *size);
          r.credit = s.uncredited;
          s.uncredited = 0;
        } else {
          s.queued = true;
          enqueue(sid);
        }
      }
    }
  }
  if (!fin) return r;
  const bool complete = s.frames.size() == 1 && s.decoder.at_boundary();
  if (complete) {
    r.message = std::move(s.frames.front().payload);
    delivered_ += r.message->size();  // its budget goes back below, and it is about to be delivered
    // Or, finished before the message the inbox waits for, it is about to wait there: counted
    // so before forget() hands its budget on (set_inbox() then says the same).
    if (waits_in_inbox(sid)) inbox_held_ += r.message->size();
  }
  forget(sid);
  if (!complete) return make_error(error_code::decode_error, "bulk stream ended inside its frame");
  return r;
}

void bulk_receiver::forget(int64_t sid) {
  auto it = streams_.find(sid);
  if (it == streams_.end()) return;
  if (it->second.queued) queue_.erase(std::find(queue_.begin(), queue_.end(), sid));
  budget_left_ += it->second.budgeted;
  receiving_ -= it->second.held;
  streams_.erase(it);
  grant_waiting();
}

void bulk_receiver::set_delivered(uint64_t bytes) {
  const bool lower = bytes < delivered_;
  delivered_ = bytes;
  if (lower) grant_waiting();
}

void bulk_receiver::set_inbox(int64_t next_sid, uint64_t held, bool next_marked) {
  const bool freed = held < inbox_held_ || next_sid != inbox_next_ || next_marked != inbox_next_marked_;
  inbox_next_ = next_sid;
  inbox_next_marked_ = next_marked;
  inbox_held_ = held;
  if (freed) grant_waiting();
}

void bulk_receiver::admit() {
  admitted_ = true;
  grant_waiting();
}

void bulk_receiver::grant_waiting() {
  if (!admitted_) return;
  while (!queue_.empty()) {
    const int64_t sid = queue_.front();
    stream& s = streams_.at(sid);  // forget() takes streams out of the queue
    const uint64_t size = s.size().value_or(0);
    if (!fits(sid, size)) return;  // the ones behind it wait too: none overtakes it
    queue_.pop_front();
    grant(s, size);
    if (s.uncredited) grants_.emplace_back(sid, s.uncredited);
    s.uncredited = 0;
  }
}

std::vector<std::pair<int64_t, uint64_t>> bulk_receiver::take_grants() {
  std::vector<std::pair<int64_t, uint64_t>> g;
  g.swap(grants_);
  return g;
}

}  // namespace mesh::transport
