// The collective of a training step: this worker's all-reduce round with its ring neighbours
// (ring_allreduce.hpp does the arithmetic). Pieces out to the successor (forward), pieces in
// from the predecessor (on_piece: parked when their round has not started here yet,
// accept_piece), and the finished round's result held until the coordinator's commit
// (round_done).
#include "actors/train_engine.hpp"

#include "actors/train_engine_state.hpp"

namespace mesh {
using namespace train_detail;

std::vector<outbound> train_engine::forward(worker_run& w, std::vector<allreduce_message> ms) {
  std::vector<outbound> out;
  const std::string& next = w.ring[static_cast<size_t>(w.rank + 1) % w.ring.size()];
  for (auto& m : ms) {
    msg::allreduce_piece p;
    p.train = w.train;
    p.coordinator = w.coordinator;
    p.round = m.round;
    p.ring_step = m.step;
    p.piece = m.piece;
    p.payload = std::move(m.payload);
    out.push_back({next, std::move(p)});
  }
  return out;
}

std::vector<outbound> train_engine::on_piece(const std::string& from, const msg::allreduce_piece& p) {
  const worker_key key{p.coordinator, p.train};
  allreduce_message m{p.round, p.ring_step, p.piece, p.payload};
  auto it = worker_.find(key);
  if (it == worker_.end()) {
    // The predecessor may be faster than our setup or step message (they come from the
    // coordinator, over another connection): keep the piece for later.
    if (!peers_.count(p.coordinator) && p.coordinator != self_) return {};
    if (early_pieces_.size() >= max_early_runs && !early_pieces_.count(key)) return {};
    auto& q = early_pieces_[key];
    if (q.size() < max_parked_pieces) q.emplace_back(from, std::move(m));
    return {};
  }
  worker_run& w = *it->second;
  if (w.orphaned) return {};
  const uint64_t current = round_id(w.step, w.attempt);
  if (p.round < current) return {};  // a stale round
  if (p.round > current || !w.round) {
    if (w.parked.size() < max_parked_pieces) w.parked.emplace_back(from, std::move(m));
    return {};
  }
  return accept_piece(w, from, m);
}

std::vector<outbound> train_engine::accept_piece(worker_run& w, const std::string& from, const allreduce_message& m) {
  if (w.rank < 0 || w.ring.empty()) return {};
  const std::string& prev = w.ring[static_cast<size_t>(w.rank + static_cast<int>(w.ring.size()) - 1) % w.ring.size()];
  if (from != prev) return {};  // only our predecessor in the ring may send us pieces
  auto fwd = w.round->on_message(m);
  if (!fwd) return {};  // a duplicate or malformed piece: ring_allreduce says why; dropping it is safe
  auto out = forward(w, std::move(*fwd));
  if (w.round->done()) {
    auto done = round_done(w);
    out.insert(out.end(), done.begin(), done.end());
  }
  return out;
}

std::vector<outbound> train_engine::round_done(worker_run& w) {
  worker_run::held_result h;
  h.end = w.step_end;
  h.sum = w.round->result();
  h.participants = w.participants;
  const float loss_sum = h.sum.back();
  h.sum.pop_back();
  msg::train_reduced r;
  r.train = w.train;
  r.step = w.step;
  r.attempt = w.attempt;
  r.ok = true;
  r.loss = static_cast<double>(loss_sum) / static_cast<double>(w.micro_batches * (w.step_end - w.step));
  r.bytes_sent = w.round->bytes_sent();
  w.held = std::move(h);
  w.round.reset();
  return {{w.coordinator, r}};
}

}  // namespace mesh
