// The collective of a training step: this worker's all-reduce round with its ring neighbours
// (ring_allreduce.hpp does the arithmetic). The round exists from the step's arrival; members
// send pieces only after the coordinator's ring_go (every member has its round), so a piece
// never comes before its round. Pieces out to the successor (forward), in from the predecessor
// (on_piece, accept_piece), the start of each bucket once it is computed and the go came
// (start_round; a data-parallel step's gradients come in buckets, train_buckets.hpp, each its
// own ring round), and the finished round's result held until the coordinator's commit
// (round_done).
#include "actors/train_engine.hpp"

#include "actors/train_engine_state.hpp"

namespace mesh {
using namespace train_detail;

std::vector<outbound> train_engine::forward(worker_run& w, std::vector<allreduce_message> ms) {
  std::vector<outbound> out;
  const node_id& next = w.ring[static_cast<size_t>(w.rank + 1) % w.ring.size()];
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

std::vector<outbound> train_engine::on_piece(const node_id& from, const msg::allreduce_piece& p) {
  const worker_key key{p.coordinator, p.train};
  const allreduce_piece_ref m{p.round, p.ring_step, p.piece, p.payload};  // the payload stays in the message
  auto it = worker_.find(key);
  // No run, or another round than this step's: the piece belongs to a run or attempt that ended
  // here (pieces of a round come only after every member has it: ring_go).
  if (it == worker_.end()) return {};
  worker_run& w = *it->second;
  if (w.orphaned || !w.round || !w.round->owns(p.round)) return {};
  return accept_piece(w, from, m);
}

std::vector<outbound> train_engine::on_go(const node_id& from, const msg::ring_go& g) {
  auto it = worker_.find(worker_key{from, g.train});
  if (it == worker_.end()) return {};
  worker_run& w = *it->second;
  if (w.orphaned || !w.round || g.step != w.step || g.attempt != w.attempt) return {};
  if (g.probe) {
    msg::train_ready answer{g.train, g.step, g.attempt, true, w.round->taken()};
    return {{from, answer}};
  }
  w.go = true;
  return start_round(w);
}

std::vector<outbound> train_engine::start_round(worker_run& w) {
  if (!w.go || w.contribution.empty() || !w.round) return {};
  std::vector<outbound> out;
  for (auto& [bucket, data] : w.contribution) {
    if (train_detail::timing_enabled())
      train_detail::timing("step " + std::to_string(w.step) + " worker: bucket " + std::to_string(bucket) + " all-reduce starts");
    auto sent = forward(w, w.round->start(bucket, std::move(data)));
    out.insert(out.end(), std::make_move_iterator(sent.begin()), std::make_move_iterator(sent.end()));
  }
  w.contribution.clear();
  if (w.round->done()) {
    auto done = round_done(w);
    out.insert(out.end(), done.begin(), done.end());
  }
  return out;
}

std::vector<outbound> train_engine::accept_piece(worker_run& w, const node_id& from, const allreduce_piece_ref& m) {
  if (w.rank < 0 || w.ring.empty()) return {};
  const node_id& prev = w.ring[static_cast<size_t>(w.rank + static_cast<int>(w.ring.size()) - 1) % w.ring.size()];
  if (from != prev) {
    // Only our predecessor in the ring sends pieces of this round (an earlier round's pieces
    // were dropped by their round id): anyone else would add numbers of its own to the sum.
    note_refusal(from, "allreduce_piece", "training " + std::to_string(w.train) + " (coordinator " + w.coordinator.short_string() +
                                              "), round " + std::to_string(m.round) + ": the sender is not this node's ring predecessor " +
                                              prev.short_string());
    return {};
  }
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
  if (train_detail::timing_enabled()) train_detail::timing("step " + std::to_string(w.step) + " worker: all-reduce done");
  worker_run::held_result h;
  h.end = w.step_end;
  h.sum = w.round->take_results();
  h.participants = w.participants;
  h.fragment = w.fragment;
  const float loss_sum = h.sum.back().back();  // the last bucket ends with the loss sum
  h.sum.back().pop_back();
  msg::train_reduced r;
  r.train = w.train;
  r.step = w.step;
  r.attempt = w.attempt;
  r.ok = true;
  // The inner steps the round's losses come from (with overlap, those before its delta was taken).
  r.loss = static_cast<double>(loss_sum) / static_cast<double>(w.micro_batches * w.loss_steps);
  r.bytes_sent = w.round->bytes_sent();
  w.held = std::move(h);
  w.round.reset();
  return {{w.coordinator, r}};
}

}  // namespace mesh
