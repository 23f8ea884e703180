#include "actors/split_roster.hpp"

namespace mesh::generation {

split_roster::split_roster(std::shared_ptr<const free_memory> memory) : memory_(std::move(memory)), thread_([this] { run(); }) {}

split_roster::~split_roster() { close(); }

void split_roster::joined(const split_candidate& peer) {
  {
    std::lock_guard<std::mutex> lock(m_);
    peers_[peer.id] = peer;
    if (closed_) return;
    events_.push_back({roster_event::kind::joined, peer.id});
  }
  wake_.notify_one();
}

void split_roster::left(const node_id& peer) {
  {
    std::lock_guard<std::mutex> lock(m_);
    peers_.erase(peer);
    if (closed_) return;
    events_.push_back({roster_event::kind::left, peer});
  }
  wake_.notify_one();
}

std::vector<split_candidate> split_roster::live() const {
  std::vector<split_candidate> out;
  {
    std::lock_guard<std::mutex> lock(m_);
    for (const auto& [id, c] : peers_) out.push_back(c);
  }
  for (auto& c : out) c = current(std::move(c));
  return out;
}

split_candidate split_roster::current(split_candidate c) const {
  if (memory_)
    if (auto free = memory_->of(c.id)) c.memory_bytes = *free;
  return c;
}

uint64_t split_roster::subscribe(listener l) {
  std::lock_guard<std::mutex> lock(dispatch_m_);
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> inner(m_);
    id = next_++;
  }
  listeners_[id] = std::move(l);
  return id;
}

void split_roster::unsubscribe(uint64_t id) {
  std::lock_guard<std::mutex> lock(dispatch_m_);
  listeners_.erase(id);
}

void split_roster::close() {
  {
    std::lock_guard<std::mutex> lock(m_);
    closed_ = true;
    events_.clear();
  }
  wake_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void split_roster::run() {
  for (;;) {
    roster_event e;
    {
      std::unique_lock<std::mutex> lock(m_);
      wake_.wait(lock, [&] { return closed_ || !events_.empty(); });
      if (closed_) return;
      e = events_.front();
      events_.pop_front();
    }
    std::lock_guard<std::mutex> lock(dispatch_m_);
    for (auto& [id, l] : listeners_) l(e);
  }
}

}  // namespace mesh::generation
