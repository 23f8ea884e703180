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

#include <algorithm>
#include <cstring>

namespace mesh {
using namespace train_detail;

namespace {

/// A region as messages name it (shared_region_offer, allreduce_piece_shared), whose nonce the
/// decoder checked to be 16 bytes.
region_locator locator_of(uint32_t pid, uint32_t fd, uint64_t size, const std::vector<uint8_t>& nonce) {
  region_locator at{pid, fd, size, {}};
  std::copy_n(nonce.begin(), std::min(nonce.size(), at.nonce.size()), at.nonce.begin());
  return at;
}

/// The worker's ring predecessor in the current step, or none (no ring yet).
const node_id* predecessor_of(const std::vector<node_id>& ring, int rank) {
  if (rank < 0 || ring.empty()) return nullptr;
  return &ring[static_cast<size_t>(rank + static_cast<int>(ring.size()) - 1) % ring.size()];
}

}  // namespace

train_engine::shared_memory train_engine::host_shared_memory() {
  shared_memory s;
  s.create = [](uint64_t bytes) -> expected<std::shared_ptr<shared_region>> {
    auto r = shared_region::create(bytes);
    if (!r) return tl::unexpected(r.error());
    return std::make_shared<shared_region>(std::move(*r));
  };
  s.open = [](const region_locator& where) -> expected<std::shared_ptr<shared_region>> {
    auto r = shared_region::open(where);
    if (!r) return tl::unexpected(r.error());
    return std::make_shared<shared_region>(std::move(*r));
  };
  return s;
}

payload_placer train_engine::region_placer(worker_run& w) {
  // The round belongs to `w`, so `w` outlives it. Pieces go into the region once the successor
  // has mapped it, each at the next 64-byte boundary of this step's part; none past its end.
  return [&w](size_t bytes) -> std::optional<std::pair<uint8_t*, uint64_t>> {
    if (!w.region || w.rank < 0 || w.ring.size() < 2) return std::nullopt;
    if (!w.mapped_by.count(w.ring[static_cast<size_t>(w.rank + 1) % w.ring.size()])) return std::nullopt;
    if (bytes > w.region->data_bytes() - w.region_used) return std::nullopt;
    const uint64_t at = w.region_used;
    w.region_used = std::min(w.region->data_bytes(), at + ((bytes + 63) & ~uint64_t{63}));
    return std::pair{w.region->data() + at, at};
  };
}

bool train_engine::host_reduce_possible(const worker_run& w) const {
  return host_reduce_ && w.method == train_method::data_parallel && w.format == wire_format::f32 && w.graphs.bucket_ends.size() > 1;
}

uint64_t train_engine::ring_area_bytes(const worker_run& w) {
  // Room for a step's pieces: a bucket of v values sends 2(n-1) pieces of v/n values, under 2v;
  // f32 is the widest wire format; and some room for each piece's alignment. A multiple of 64
  // bytes: the host all-reduce's sum areas after it start 64-byte aligned (host_reduce.hpp).
  uint64_t values = 1;
  for (auto n : w.method == train_method::data_parallel ? w.graphs.grad_sizes : w.graphs.delta_sizes) values += static_cast<uint64_t>(n);
  return (2 * values * sizeof(float) + (uint64_t{1} << 20) + 63) / 64 * 64;
}

std::vector<size_t> train_engine::host_bucket_values(const worker_run& w) {
  const auto& ends = w.graphs.bucket_ends;
  std::vector<size_t> values;
  for (size_t b = 0; b < ends.size(); ++b) {
    size_t n = b + 1 == ends.size() ? 1 : 0;  // the last bucket ends with the loss sum
    for (size_t i = b ? ends[b - 1] : 0; i < ends[b]; ++i) n += static_cast<size_t>(w.graphs.grad_sizes[i]);
    values.push_back(n);
  }
  return values;
}

bool train_engine::host_local(const worker_run& w) const {
  if (!w.region || !host_reduce_possible(w) || w.rank < 0 || w.ring.size() < 2) return false;
  for (const auto& m : w.ring) {
    if (m == w.ring[static_cast<size_t>(w.rank)]) continue;
    auto by = w.mapped_by.find(m);
    auto mapped = w.peer_regions.find(m);
    if (by == w.mapped_by.end() || !by->second || mapped == w.peer_regions.end() || !mapped->second) return false;
  }
  return true;
}

std::vector<outbound> train_engine::offer_region(worker_run& w) {
  if (!shared_.create || w.rank < 0 || w.ring.size() < 2 || w.region_failed) return {};
  // The successor, for the ring's pieces; every member when the step may reduce through the
  // regions of all (host_reduce.hpp).
  std::vector<node_id> to;
  for (size_t i = 1; i < (host_reduce_possible(w) ? w.ring.size() : 2); ++i) {
    const node_id& m = w.ring[(static_cast<size_t>(w.rank) + i) % w.ring.size()];
    if (!w.mapped_by.count(m) && w.region_offers[m] < worker_run::max_region_offers) to.push_back(m);
  }
  if (to.empty()) return {};
  if (!w.region) {
    // The ring's pieces from the start; a host all-reduce's sums after them, where no ring step
    // writes (a member may still be writing the last host step's sums to its device when the
    // next step, around the ring, has this node's pieces placed already).
    uint64_t bytes = ring_area_bytes(w);
    if (host_reduce_possible(w)) bytes = host_reduce(0, 2, host_bucket_values(w), host_sum_base(w)).region_floats() * sizeof(float);
    auto r = shared_.create(bytes);
    if (!r) {
      w.region_failed = true;
      notices_.push_back(notice{true, "training " + std::to_string(w.train) + ": no shared memory for the all-reduce (" + r.error().message +
                         "): its pieces travel in messages"});
      return {};
    }
    w.region = std::move(*r);
  }
  const region_locator& at = w.region->locator();
  std::vector<outbound> out;
  for (const auto& m : to) {
    ++w.region_offers[m];
    out.push_back({m, msg::shared_region_offer{w.train, w.coordinator, at.pid, at.fd, at.size, {at.nonce.begin(), at.nonce.end()}}});
  }
  return out;
}

std::vector<outbound> train_engine::on_region_offer(const node_id& from, const msg::shared_region_offer& o) {
  msg::shared_region_answer a{o.train, o.coordinator, o.pid, o.fd, false, ""};
  auto it = worker_.find(worker_key{o.coordinator, o.train});
  if (!shared_.open) {
    a.error = "this node takes no pieces through shared memory";
  } else if (it == worker_.end()) {
    a.error = "no training run " + std::to_string(o.train) + " of that coordinator is set up here yet";
  } else {
    auto r = shared_.open(locator_of(o.pid, o.fd, o.size, o.nonce));
    if (r) {
      worker_run& w = *it->second;
      auto& mapped = w.peer_regions[from];
      if (mapped && mapped->locator() != (*r)->locator()) {
        // The member made another region (it was set up again, in a new process perhaps): it has
        // not mapped this node's current one, which is offered to it again.
        w.mapped_by.erase(from);
        w.region_offers.erase(from);
      }
      mapped = std::move(*r);
      a.ok = true;
    } else {
      a.error = r.error().message;
    }
  }
  return {{from, std::move(a)}};
}

void train_engine::on_region_answer(const node_id& from, const msg::shared_region_answer& a) {
  auto it = worker_.find(worker_key{a.coordinator, a.train});
  if (it == worker_.end()) return;
  worker_run& w = *it->second;
  // An answer to another region than this run's (one made before) or to no offer: ignored.
  if (!w.region || !w.region_offers.count(from) || a.pid != w.region->locator().pid || a.fd != w.region->locator().fd) return;
  if (a.ok && !w.mapped_by.count(from)) {
    w.mapped_by[from] = true;
    notices_.push_back(notice{false, "training " + std::to_string(w.train) + ": " + from.short_string() +
                                          " maps this node's shared memory (same host): all-reduce values to it go through shared memory"});
  } else if (!a.ok) {
    // Turned down (or a piece's region did not open there): pieces go in messages, and the region
    // is offered again at a later step, up to max_region_offers (on another host they run out).
    w.mapped_by.erase(from);
  }
}

std::vector<outbound> train_engine::forward(worker_run& w, std::vector<allreduce_message> ms) {
  std::vector<outbound> out;
  const node_id& next = w.ring[static_cast<size_t>(w.rank + 1) % w.ring.size()];
  for (auto& m : ms) {
    if (m.placed) {
      // The payload is in the region (region_placer); only its place travels.
      const region_locator& at = w.region->locator();
      out.push_back({next, msg::allreduce_piece_shared{w.train, w.coordinator, m.round, m.step, m.piece, at.pid, at.fd, at.size,
                                                       {at.nonce.begin(), at.nonce.end()}, m.placed_offset, m.placed_bytes}});
      continue;
    }
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

expected<std::shared_ptr<shared_region>> train_engine::map_peer_region(worker_run& w, const node_id& from, const region_locator& where) {
  if (auto known = w.peer_regions.find(from); known != w.peer_regions.end() && known->second && known->second->locator() == where)
    return known->second;
  if (!shared_.open) return make_error(error_code::unsupported, "this node takes no pieces through shared memory");
  auto r = shared_.open(where);
  if (r) w.peer_regions[from] = *r;
  return r;
}

std::vector<outbound> train_engine::on_piece_shared(const node_id& from, const msg::allreduce_piece_shared& p) {
  auto it = worker_.find(worker_key{p.coordinator, p.train});
  if (it == worker_.end()) return {};
  worker_run& w = *it->second;
  const node_id* prev = predecessor_of(w.ring, w.rank);
  if (!prev) return {};
  if (from != *prev) {
    // Only the ring predecessor's region is ever mapped here (accept_piece's rule, before any
    // file is opened for the sender).
    note_refusal(from, "allreduce_piece_shared", "training " + std::to_string(p.train) + ": the sender is not this node's ring predecessor " +
                                                     prev->short_string());
    return {};
  }
  // The predecessor's region, mapped when it offered it or now (this run was set up again since,
  // or the offer's answer crossed this piece). Whatever the piece's round: one in a region that
  // does not open here, or past its end, is no piece a member following the protocol sends.
  auto mapped = map_peer_region(w, from, locator_of(p.pid, p.fd, p.size, p.nonce));
  if (!mapped) {
    w.peer_regions.erase(from);
    note_refusal(from, "allreduce_piece_shared", "training " + std::to_string(p.train) + ": the piece's shared region: " + mapped.error().message);
    // Told, the sender sends its pieces in messages again (the round redone by the coordinator).
    return {{from, msg::shared_region_answer{p.train, p.coordinator, p.pid, p.fd, false, mapped.error().message}}};
  }
  const shared_region& r = **mapped;
  if (p.offset > r.data_bytes() || p.length > r.data_bytes() - p.offset) {
    note_refusal(from, "allreduce_piece_shared", "training " + std::to_string(p.train) + ": bytes [" + std::to_string(p.offset) + ", +" +
                                                     std::to_string(p.length) + ") past its shared region's " +
                                                     std::to_string(r.data_bytes()));
    return {};
  }
  if (w.orphaned || !w.round || !w.round->owns(p.round)) return {};
  // Read in place: the ring adds (or copies) the payload into its data before this returns.
  const allreduce_piece_ref m{p.round, p.ring_step, p.piece, {r.data() + p.offset, p.length}};
  return accept_piece(w, from, m);
}

std::vector<outbound> train_engine::on_go(const node_id& from, const msg::ring_go& g) {
  auto it = worker_.find(worker_key{from, g.train});
  if (it == worker_.end()) return {};
  worker_run& w = *it->second;
  if (w.orphaned || (!w.round && !w.direct) || g.step != w.step || g.attempt != w.attempt) return {};
  if (g.probe) {
    msg::train_ready answer{g.train, g.step, g.attempt, true, w.round ? w.round->taken() : w.direct->taken()};
    return {{from, answer}};
  }
  w.go = true;
  return w.direct ? start_direct(w) : start_round(w);
}

std::vector<outbound> train_engine::start_round(worker_run& w) {
  if (!w.go || w.contribution.empty() || !w.round) return {};
  std::vector<outbound> out;
  for (auto& [bucket, data] : w.contribution) {
    if (train_detail::timing_enabled())
      train_detail::timing(train_detail::bucket_line(w.step, bucket, "all-reduce starts"));
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
  const node_id* predecessor = predecessor_of(w.ring, w.rank);
  if (!predecessor) return {};
  const node_id& prev = *predecessor;
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
  if (w.round->round_done(m.round)) {  // only the round's last piece completes it
    const int bucket = static_cast<int>(m.round % bucketed_allreduce::max_buckets);
    if (train_detail::timing_enabled())
      train_detail::timing(train_detail::bucket_line(w.step, bucket, "all-reduce done"));
    if (w.method == train_method::data_parallel && w.round->buckets() > 1) write_bucket(w, bucket);
  }
  auto out = forward(w, std::move(*fwd));
  if (w.round->done()) {
    auto done = round_done(w);
    out.insert(out.end(), done.begin(), done.end());
  }
  return out;
}

std::vector<outbound> train_engine::start_direct(worker_run& w) {
  if (!w.go || !w.direct) return {};
  std::vector<outbound> out;
  for (int b : std::exchange(w.posted, {})) {
    if (train_detail::timing_enabled())
      train_detail::timing(train_detail::bucket_line(w.step, b, "all-reduce starts"));
    auto more = direct_events(w, w.direct->posted(b));
    out.insert(out.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
    if (!w.direct) break;  // the round ended (it cannot have with buckets still to post)
  }
  return out;
}

std::vector<outbound> train_engine::direct_events(worker_run& w, const host_reduce::events& e) {
  std::vector<outbound> out;
  const region_locator& at = w.region->locator();
  for (const auto& m : e.marks)
    for (const auto& member : w.ring)
      if (member != self_)
        out.push_back({member, msg::host_reduce_mark{w.train, w.coordinator, w.direct_base + static_cast<uint64_t>(m.bucket),
                                                     static_cast<uint32_t>(m.phase), at.pid, at.fd, at.size, {at.nonce.begin(), at.nonce.end()}}});
  for (int b : e.done) {
    if (train_detail::timing_enabled())
      train_detail::timing(train_detail::bucket_line(w.step, b, "all-reduce done"));
    write_bucket(w, b);
  }
  if (w.direct->done()) {
    auto done = round_done(w);
    out.insert(out.end(), done.begin(), done.end());
  }
  return out;
}

std::vector<outbound> train_engine::on_host_mark(const node_id& from, const msg::host_reduce_mark& m) {
  auto it = worker_.find(worker_key{m.coordinator, m.train});
  if (it == worker_.end()) return {};
  worker_run& w = *it->second;
  // Another step's or attempt's mark (the round ids name both: a member left out since may
  // still send one), or of a run whose step goes around the ring: nothing to do.
  if (w.orphaned || !w.direct || m.round < w.direct_base || m.round >= w.direct_base + static_cast<uint64_t>(w.direct->buckets())) return {};
  const std::string run = "training " + std::to_string(m.train);
  const auto member = std::find(w.ring.begin(), w.ring.end(), from);
  if (member == w.ring.end() || from == self_) {
    // Only a member of the ring adds to the sums; no file is opened for anyone else.
    note_refusal(from, "host_reduce_mark", run + ": the sender is not in this node's ring");
    return {};
  }
  if (m.phase > 1) {
    note_refusal(from, "host_reduce_mark", run + ": no such phase " + std::to_string(m.phase));
    return {};
  }
  const int rank = static_cast<int>(member - w.ring.begin());
  // One naming a region that does not open here is no mark a member following the protocol sends.
  auto opened = map_peer_region(w, from, locator_of(m.pid, m.fd, m.size, m.nonce));
  if (!opened) {
    // The region mapped before (if any) stays: this mark does not count. A member that made a
    // new region offers it; a step whose marks do not count stalls and is redone around the ring.
    note_refusal(from, "host_reduce_mark", run + ": the member's shared region: " + opened.error().message);
    return {{from, msg::shared_region_answer{m.train, m.coordinator, m.pid, m.fd, false, opened.error().message}}};
  }
  const std::shared_ptr<shared_region> mapped = std::move(*opened);
  if (mapped->data_bytes() < w.direct->region_floats() * sizeof(float)) {
    note_refusal(from, "host_reduce_mark", run + ": its shared region holds " + std::to_string(mapped->data_bytes()) + " bytes, not the " +
                                               std::to_string(w.direct->region_floats() * sizeof(float)) + " the step's buckets need");
    return {};
  }
  // (Read through the const data(): a reader has no writable view of a peer's region.)
  w.direct->set_region(rank, reinterpret_cast<const float*>(std::as_const(*mapped).data()));
  w.direct_regions[static_cast<size_t>(rank)] = mapped;
  auto e = w.direct->on_mark(rank, static_cast<int>(m.round - w.direct_base), static_cast<int>(m.phase));
  if (!e) {
    note_refusal(from, "host_reduce_mark", run + ": " + e.error().message);
    return {};
  }
  return direct_events(w, *e);
}

std::vector<outbound> train_engine::round_done(worker_run& w) {
  if (train_detail::timing_enabled()) train_detail::timing("step " + std::to_string(w.step) + " worker: all-reduce done");
  worker_run::held_result h;
  h.end = w.step_end;
  if (w.direct) {
    h.sum.assign(static_cast<size_t>(w.direct->buckets()), {});  // every bucket went to the device from the regions
  } else {
    h.sum = w.round->take_results();
  }
  h.participants = w.participants;
  h.fragment = w.fragment;
  h.written = w.method == train_method::data_parallel && h.sum.size() > 1;
  float loss_sum = 0;  // the last bucket ends with the loss sum
  if (w.bucket_loss) {
    loss_sum = *w.bucket_loss;
  } else {
    loss_sum = h.sum.back().back();
    h.sum.back().pop_back();
  }
  w.bucket_loss.reset();
  msg::train_reduced r;
  r.train = w.train;
  r.step = w.step;
  r.attempt = w.attempt;
  r.ok = true;
  // The inner steps the round's losses come from (with overlap, those before its delta was taken).
  r.loss = static_cast<double>(loss_sum) / static_cast<double>(w.micro_batches * w.loss_steps);
  r.bytes_sent = w.round ? w.round->bytes_sent() : 0;  // through the regions: nothing on the transport
  w.held = std::move(h);
  w.round.reset();
  w.direct.reset();
  return {{w.coordinator, r}};
}

}  // namespace mesh
