// The coordinator side of training: open a run, drive its steps over the ring of members
// (assigning micro-batch slots and the dataset shards they read), collect the reductions, set
// up newcomers, report progress, checkpoints and the result to the client, and redo a step
// without a member that died. Status of the runs it coordinates (jobs).
#include "actors/train_engine.hpp"

#include <algorithm>

#include "actors/train_engine_state.hpp"

namespace mesh {
using namespace train_detail;

/// Gives each of the k micro-batch slots of a step to a member, balanced (every member k/n,
/// rounded), moving as few slots as possible: a member keeps its slots, and with them the
/// dataset shards it already holds, across membership changes; a dead member's slots go to
/// those with the fewest, a newcomer takes from those with the most.
namespace {
void assign_slots(std::map<uint32_t, node_id>& owner, const std::vector<node_id>& members, uint32_t k) {
  if (members.empty()) return;
  std::map<node_id, std::vector<uint32_t>> held;
  for (const auto& m : members) held[m];
  std::vector<uint32_t> free;
  for (uint32_t j = 0; j < k; ++j) {
    auto it = owner.find(j);
    if (it != owner.end() && held.count(it->second)) held[it->second].push_back(j);
    else free.push_back(j);
  }
  // Members in ring order, so that ties go the same way on every run.
  const auto fewest = [&] {
    const node_id* best = &members.front();
    for (const auto& m : members)
      if (held[m].size() < held[*best].size()) best = &m;
    return *best;
  };
  const auto most = [&] {
    const node_id* best = &members.front();
    for (const auto& m : members)
      if (held[m].size() > held[*best].size()) best = &m;
    return *best;
  };
  for (uint32_t j : free) held[fewest()].push_back(j);
  for (;;) {
    const node_id lo = fewest(), hi = most();
    if (held[hi].size() <= held[lo].size() + 1) break;
    held[lo].push_back(held[hi].back());
    held[hi].pop_back();
  }
  owner.clear();
  for (const auto& [m, slots] : held)
    for (uint32_t j : slots) owner[j] = m;
}
}  // namespace

namespace {
/// Whether `n` is in the ring of the current attempt of `c` (a coord_run).
template <class Run>
bool in_ring(const Run& c, const node_id& n) {
  return std::find(c.ring.begin(), c.ring.end(), n) != c.ring.end();
}
}  // namespace

std::vector<outbound> train_engine::open(const node_id& client, const msg::open_training& o, const msg::takeover_grant& takeover) {
  const auto refuse = [&](error_code code, const std::string& why) {
    msg::job_result r;
    r.job = o.train;
    r.code = code;
    r.error = why;
    return std::vector<outbound>{{client, r}};
  };
  for (const auto& [id, c] : coordinated_)
    if (c->client == client && c->client_train == o.train && c->state == job_state::running) return refuse(error_code::invalid_argument, "training " + std::to_string(o.train) + " is already running");
  if (auto ok = check_train_spec(o.spec); !ok) return refuse(ok.error().code, "training refused: " + ok.error().message);

  const uint64_t id = next_id_++;
  auto c = std::make_unique<coord_run>();
  c->client = client;
  c->client_train = o.train;
  c->takeover = takeover;
  c->spec = o.spec;
  c->step = o.spec.start_step;
  c->commit = o.spec.start_step;
  c->started = c->last_step = now_;
  // Parameters get names unique to this run, so that runs sharing a device do not mix state.
  c->prefix = run_prefix(self_, id);
  for (auto* g : {&c->spec.grad, &c->spec.apply, &c->spec.delta, &c->spec.outer}) *g = rename_parameters(*g, "", c->prefix);
  for (auto& t : c->spec.state) t.name = c->prefix + t.name;
  if (c->spec.text.empty()) {
    // The dataset stays here; setups carry its columns with no rows, steps carry the shards.
    c->data = to_map(c->spec.dataset);
    c->spec.dataset_rows = static_cast<uint64_t>(c->data.begin()->second.dims[0]);
    c->permutation = shard_permutation(static_cast<int64_t>(c->spec.dataset_rows), c->spec.seed);
    for (auto& column : c->spec.dataset) {
      column.value.dims[0] = 0;
      column.value.bytes.clear();
    }
  }
  // A data file (offered by the shell before the run opened) is read by the workers themselves.
  c->plan = plan_of(c->spec);

  std::vector<outbound> out;
  c->members.push_back(self_);
  for (const auto& p : peers_) c->members.push_back(p);
  std::sort(c->members.begin(), c->members.end());
  for (const auto& m : c->members) out.push_back({m, msg::train_setup{id, c->spec, client, o.train, takeover}});
  auto& run = *c;
  coordinated_[id] = std::move(c);
  auto more = issue_step(id, run);
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

std::vector<outbound> train_engine::issue_step(uint64_t id, coord_run& c) {
  if (train_detail::timing_enabled()) train_detail::timing("step " + std::to_string(c.step) + " coordinator: issued");
  const auto& s = c.spec;
  const size_t k = s.micro_batches;
  c.ph = coord_run::phase::stepping;
  c.step_issued = now_;
  c.probing = false;
  c.pieces_taken.clear();
  // Every member is in the ring, also one with no micro-batch this step (more workers than
  // micro-batches): it adds zeros, and it holds the result it must commit like the others.
  const bool host_reduce = !c.host_reduce_off && c.members.size() > 1 && !c.local_ring.empty() && c.local_ring == c.members;
  c.host_reduce_step = host_reduce;
  c.ring = c.members;
  c.step_not_local = false;
  ++c.attempt;
  c.waiting = {c.ring.begin(), c.ring.end()};
  c.unready = c.waiting;
  c.loss = 0;
  c.bytes = 0;
  const uint64_t inner = s.method == train_method::diloco ? std::min<uint64_t>(s.inner_steps, s.steps - c.step) : 1;
  std::vector<outbound> out;
  assign_slots(c.slot_owner, c.ring, static_cast<uint32_t>(k));
  for (size_t r = 0; r < c.ring.size(); ++r) {
    msg::train_step m;
    m.train = id;
    m.step = c.step;
    m.attempt = c.attempt;
    m.ring = c.ring;
    m.commit = c.commit;
    m.host_reduce = host_reduce;
    // The member's micro-batch slots (assign_slots): a dead member's are spread over the
    // survivors when the step is redone.
    for (uint64_t h = 0; h < inner; ++h)
      for (const auto& [j, owner] : c.slot_owner)
        if (owner == c.ring[r]) m.micro.push_back((c.step + h) * k + j);
    // The shards these micro-batches draw from that this member has not been sent yet: a dead
    // member's shards move to the survivors with its micro-batches.
    auto& sent = c.shards_sent[c.ring[r]];
    for (const uint64_t micro : m.micro) {
      if (!s.text.empty()) break;  // the workers read a data file's shards themselves
      const uint32_t shard = c.plan.shard_of(micro);
      if (!sent.insert(shard).second) continue;
      auto rows = take_rows(c.data, shard_rows(c.permutation, c.plan.shards, shard));
      msg::train_shard sh{shard, {}};
      for (auto& [name, t] : *rows) sh.columns.push_back({name, std::move(t)});
      m.shards.push_back(std::move(sh));
    }
    out.push_back({c.ring[r], std::move(m)});
  }
  return out;
}

std::vector<outbound> train_engine::fail_run(uint64_t id, coord_run& c, error_code code, const std::string& why) {
  std::vector<outbound> out;
  msg::job_result r;
  r.job = c.client_train;
  r.code = code;
  r.error = why;
  out.push_back({c.client, r});
  for (const auto& m : c.members) {
    msg::train_step stop;
    stop.train = id;
    stop.stop = true;
    out.push_back({m, stop});
  }
  c.state = job_state::failed;
  c.seconds = std::chrono::duration<double>(now_ - c.started).count();
  c.members.clear();
  c.spec = {};
  c.data.clear();
  c.permutation.clear();
  return out;
}

std::vector<outbound> train_engine::on_reduced(const node_id& from, const msg::train_reduced& r) {
  auto it = coordinated_.find(r.train);
  if (it == coordinated_.end()) return {};
  coord_run& c = *it->second;
  // Our own worker could not apply the commit and report the state (final, checkpoint or
  // newcomer sync): the state that step was to report is gone.
  if (c.state == job_state::running && !r.ok && from == self_ && r.step == c.step && r.attempt == c.attempt &&
      (c.ph == coord_run::phase::finishing || c.ph == coord_run::phase::syncing))
    return fail_run(r.train, c, r.code, "the coordinating node could not report the training state: " + r.error);
  if (c.state == job_state::running && r.step == c.step && r.attempt == c.attempt && from != self_ && !in_ring(c, from)) {
    // This attempt's answers come from its ring only: a node outside it would otherwise fail
    // the step for a member (dropping it) or decide it with a loss of its own.
    note_refusal(from, "train_reduced", "step " + std::to_string(r.step) + " of training " + std::to_string(r.train) + ": the sender is not in the step's ring");
    return {};
  }
  if (c.state != job_state::running || c.ph != coord_run::phase::stepping || r.step != c.step || r.attempt != c.attempt || !c.waiting.count(from))
    return {};  // stale (an earlier attempt) or answered already
  if (!r.ok && r.code == error_code::decode_error && c.spec.text.size() == 1) {
    // The data file itself is bad (a record, a shard too small): any worker would fail the same.
    const std::string tag = std::string(to_string(r.code)) + ": ";  // the worker's error, as error::to_string gives it
    const std::string why = r.error.rfind(tag, 0) == 0 ? r.error.substr(tag.size()) : r.error;
    return fail_run(r.train, c, r.code, "node " + from.short_string() + " cannot read the training data: " + why);
  }
  if (!r.ok) {
    // The worker lost its state (device restart) or failed the step: redo the step without it,
    // and set it up again at the next boundary unless it keeps failing.
    c.members.erase(std::find(c.members.begin(), c.members.end(), from));
    c.shards_sent.erase(from);  // its run is gone there
    c.proven.erase(from);
    if (++c.failures[from] < max_failures && peers_.count(from)) c.newcomers.insert(from);
    if (from == self_) return fail_run(r.train, c, r.code, "the coordinating node failed a step: " + r.error);
    return issue_step(r.train, c);
  }
  c.waiting.erase(from);
  c.loss = r.loss;
  c.bytes += r.bytes_sent;
  if (!c.waiting.empty()) return {};
  return advance(r.train, c);
}

std::vector<outbound> train_engine::on_ready(const node_id& from, const msg::train_ready& r) {
  auto it = coordinated_.find(r.train);
  if (it == coordinated_.end()) return {};
  coord_run& c = *it->second;
  if (c.state == job_state::running && r.step == c.step && r.attempt == c.attempt && !in_ring(c, from)) {
    note_refusal(from, "train_ready", "step " + std::to_string(r.step) + " of training " + std::to_string(r.train) + ": the sender is not in the step's ring");
    return {};
  }
  if (r.probe) {  // an answer to a stalled round's probe: tick() decides (step_overdue)
    if (c.probing && r.step == c.step && r.attempt == c.attempt) c.pieces_taken[from] = r.pieces_taken;
    return {};
  }
  if (c.state != job_state::running || c.ph != coord_run::phase::stepping || r.step != c.step || r.attempt != c.attempt || !c.unready.erase(from))
    return {};  // stale
  if (!r.host_local) c.step_not_local = true;
  if (!c.unready.empty()) return {};  // members still to come
  // Every member has its round: the pieces may flow. The next step with this ring reduces
  // through the members' regions if every one of them maps all the others'.
  c.all_ready_at = now_;
  c.local_ring = c.step_not_local ? std::vector<node_id>{} : c.ring;
  std::vector<outbound> out;
  for (const auto& m : c.ring) out.push_back({m, msg::ring_go{r.train, c.step, c.attempt}});
  return out;
}

std::vector<outbound> train_engine::advance(uint64_t id, coord_run& c) {
  if (train_detail::timing_enabled()) train_detail::timing("step " + std::to_string(c.step) + " coordinator: every member reduced");
  const auto& s = c.spec;
  const uint64_t inner = s.method == train_method::diloco ? std::min<uint64_t>(s.inner_steps, s.steps - c.step) : 1;
  c.step += inner;
  c.commit = c.step;
  const double dt = std::chrono::duration<double>(now_ - c.last_step).count();
  c.last_step = now_;
  // What this attempt took, from its train_step to its last answer: the next deadlines' measure.
  c.step_seconds.push_back(std::chrono::duration<double>(now_ - c.step_issued).count());
  if (c.step_seconds.size() > deadlines_.window) c.step_seconds.erase(c.step_seconds.begin());
  c.proven.insert(c.ring.begin(), c.ring.end());
  std::vector<outbound> out;
  msg::train_progress p;
  p.train = c.client_train;
  p.step = c.step;
  p.steps = s.steps;
  p.loss = c.loss;
  c.losses.push_back(c.loss);
  if (c.losses.size() > coord_run::max_loss_curve) {
    size_t kept = 0;
    for (size_t i = 0; i < c.losses.size(); i += 2) c.losses[kept++] = c.losses[i];
    c.losses.resize(kept);
  }
  p.samples_per_s = dt > 0 ? static_cast<double>(inner * s.micro_batches * s.micro_batch) / dt : 0;
  p.peers = static_cast<uint32_t>(c.ring.size());
  p.bytes_sent = c.bytes;
  out.push_back({c.client, p});
  for (auto it = c.newcomers.begin(); it != c.newcomers.end();)  // gone since they were noticed
    it = peers_.count(*it) ? std::next(it) : c.newcomers.erase(it);
  // A checkpoint is due when this step crossed a multiple of checkpoint_every (DiLoCo's outer
  // steps advance by several inner steps at once); the final step's state is the result.
  const uint64_t every = s.checkpoint_every;
  c.checkpoint_due = every > 0 && c.step < s.steps && c.step / every != (c.step - inner) / every;
  if (c.step >= s.steps || !c.newcomers.empty() || c.checkpoint_due) {
    // Our own worker applies the commit and reports the state: the final result, or what the
    // newcomers start from, or a checkpoint for the client.
    c.ph = c.step >= s.steps ? coord_run::phase::finishing : coord_run::phase::syncing;
    msg::train_step m;
    m.train = id;
    m.step = c.step;
    m.attempt = ++c.attempt;
    m.commit = c.commit;
    m.report_state = true;
    m.stop = c.ph == coord_run::phase::finishing;
    out.push_back({self_, m});
    // The other members stop; their stop carries the last commit, which tells them the run
    // ended (they keep their part for a while in case this node dies before the client has the
    // result: docs/training.md, "The coordinator dying").
    if (m.stop)
      for (const auto& mem : c.members)
        if (mem != self_) {
          msg::train_step stop;
          stop.train = id;
          stop.stop = true;
          stop.commit = c.commit;
          out.push_back({mem, stop});
        }
    return out;
  }
  auto more = issue_step(id, c);
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

namespace {
/// A run's state as its client names it (the coordinator prefixes every name with the run's id).
std::vector<named_tensor> client_names(const std::string& prefix, const std::vector<named_tensor>& state) {
  std::vector<named_tensor> out;
  out.reserve(state.size());
  for (const auto& t : state) out.push_back({starts_with(t.name, prefix) ? t.name.substr(prefix.size()) : t.name, t.value});
  return out;
}
}  // namespace

std::vector<outbound> train_engine::on_state(const node_id& from, const msg::train_state& s) {
  auto it = coordinated_.find(s.train);
  if (it == coordinated_.end()) return {};
  if (from != self_) {
    // The coordinator's own worker reports the state (the result, a checkpoint, what newcomers
    // start from); a state from anyone else would become the client's result.
    note_refusal(from, "train_state", "training " + std::to_string(s.train) + ": only this node's own worker reports its state");
    return {};
  }
  coord_run& c = *it->second;
  if (c.state != job_state::running || s.step != c.step) return {};
  std::vector<outbound> out;
  if (c.ph == coord_run::phase::finishing) {
    msg::job_result r;
    r.job = c.client_train;
    r.ok = true;
    r.attempts = c.attempt;
    r.outputs = client_names(c.prefix, s.state);
    r.step = s.step;
    r.workers = c.members;
    out.push_back({c.client, std::move(r)});
    c.state = job_state::done;
    c.seconds = std::chrono::duration<double>(now_ - c.started).count();
    c.spec = {};
    c.data.clear();
    c.permutation.clear();
    return out;
  }
  if (c.ph != coord_run::phase::syncing) return {};
  if (c.checkpoint_due) {
    out.push_back({c.client, msg::train_checkpoint{c.client_train, s.step, client_names(c.prefix, s.state)}});
    c.checkpoint_due = false;
  }
  c.spec.state = s.state;
  c.spec.start_step = c.step;
  for (const auto& n : c.newcomers) {
    if (!peers_.count(n)) continue;
    out.push_back({n, msg::train_setup{s.train, c.spec, c.client, c.client_train, c.takeover}});
    c.members.push_back(n);
    c.shards_sent.erase(n);
  }
  c.newcomers.clear();
  std::sort(c.members.begin(), c.members.end());
  auto more = issue_step(s.train, c);
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

std::vector<outbound> train_engine::peer_dead(const node_id& id, clock::time_point now) {
  now_ = now;
  peers_.erase(id);
  std::vector<outbound> out;
  // Worker side: runs coordinated by the dead node become orphans, kept (a few) for their client
  // to resume elsewhere; an orphan whose client died too cannot be resumed. A run whose client
  // died but whose coordinator lives goes on: the coordinator keeps training through the
  // client's grace time (the client may only be cut off from it) and stops its workers when it
  // ends the run. Erasing it here stalled the ring, the coordinator's own worker included.
  for (auto it = worker_.begin(); it != worker_.end();) {
    worker_run& w = *it->second;
    if (w.client == id && w.orphaned) {
      it = end_run(it);
      continue;
    }
    if (it->first.first == id) {
      if (w.broken || w.client.empty()) {
        it = end_run(it);
        continue;
      }
      orphan(w);
    }
    ++it;
  }
  // The bound: while there are too many, an orphan of the dead coordinator with the most goes, so
  // a member that set up many runs of its own and left loses its own before an honest one.
  for (;;) {
    std::map<node_id, size_t> per_coordinator;
    size_t orphans = 0;
    for (const auto& [k, w] : worker_)
      if (w->orphaned) ++per_coordinator[k.first], ++orphans;
    if (orphans <= max_orphans) break;
    const auto most = std::max_element(per_coordinator.begin(), per_coordinator.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    auto victim = std::find_if(worker_.begin(), worker_.end(), [&](const auto& kv) { return kv.second->orphaned && kv.first.first == most->first; });
    end_run(victim);
  }
  // Coordinator side.
  for (auto& [rid, cp] : coordinated_) {
    coord_run& c = *cp;
    if (c.state != job_state::running) continue;
    c.newcomers.erase(id);
    c.left_out.erase(id);  // when it comes back (a new connection, a restart) it may join again
    if (c.client == id) {
      // Lost, or only cut off from us: it may be resuming the run elsewhere (it then reaches us
      // as that node's setup). The run goes on meanwhile; tick() ends it after the grace time.
      c.client_lost_at = now_;
      continue;
    }
    auto m = std::find(c.members.begin(), c.members.end(), id);
    if (m == c.members.end()) continue;
    c.members.erase(m);
    c.shards_sent.erase(id);
    c.proven.erase(id);  // if it comes back, its first step compiles again
    // A step the dead node took part in is redone; nothing of it was applied anywhere.
    if (c.ph == coord_run::phase::stepping && std::find(c.ring.begin(), c.ring.end(), id) != c.ring.end()) {
      auto more = issue_step(rid, c);
      out.insert(out.end(), more.begin(), more.end());
    }
  }
  return out;
}

std::vector<outbound> train_engine::tick(clock::time_point now) {
  now_ = now;
  std::vector<outbound> out;
  // Finished runs kept in case their coordinator died before the client had the result: once
  // the client has had its grace time (or the coordinator died: then they are orphans), they go.
  for (auto it = worker_.begin(); it != worker_.end();)
    it = it->second->finished_at && !it->second->orphaned && now - *it->second->finished_at > client_grace ? end_run(it) : std::next(it);
  for (auto& [rid, c] : coordinated_) {
    if (c->state != job_state::running) continue;
    if (c->client_lost_at && now - *c->client_lost_at >= client_grace) {
      auto more = fail_run(rid, *c, error_code::network, "the client went away");
      out.insert(out.end(), more.begin() + 1, more.end());  // nobody to tell the error to
      continue;
    }
    // Counted from the step's start while members compute, and from the go once all are ready:
    // a newcomer whose first step compiled for long is not blamed for the time it took.
    const auto since = c->unready.empty() ? c->all_ready_at : c->step_issued;
    if (c->ph == coord_run::phase::stepping && now - since > step_deadline(*c)) {
      auto more = step_overdue(rid, *c);
      out.insert(out.end(), more.begin(), more.end());
    }
  }
  return out;
}

train_engine::clock::duration train_engine::step_deadline(const coord_run& c) const {
  // A member computing its first step of the run compiles the graphs and uploads the state.
  // Members say ready as a step arrives, before they compute it (train_worker.cpp), so a ready
  // member that has not finished a step of this run may still be compiling: until every member
  // of the ring has, the measured steps (none yet, on a run's first step) say nothing.
  for (const auto& m : c.ring)
    if (!c.proven.count(m)) return deadlines_.first;
  double longest = 0;
  for (double s : c.step_seconds) longest = std::max(longest, s);
  const auto measured = std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(deadlines_.factor * longest));
  return std::max<clock::duration>(measured, deadlines_.floor);
}

std::vector<outbound> train_engine::step_overdue(uint64_t id, coord_run& c) {
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now_ - c.step_issued).count();
  const std::string step = "step " + std::to_string(c.step) + " of training " + std::to_string(id);
  std::vector<node_id> late;
  for (const auto& m : c.unready)
    if (m != self_) late.push_back(m);  // this node's own device stuck: nobody else can do its part
  std::vector<outbound> out;
  if (late.empty() && !c.unready.empty()) return out;  // only our own worker is not ready: wait for it
  if (late.empty() && c.host_reduce_step) {
    // Every member was ready and a host all-reduce stalled (a member's marks or region did not
    // reach the others): the step is redone around the ring, which the run keeps from now on.
    c.host_reduce_off = true;
    notices_.push_back(notice{true, "the host all-reduce of " + step + " stalled after every member was ready (" + std::to_string(waited) +
                                        " ms); redoing it around the ring, which the run keeps"});
    return issue_step(id, c);
  }
  if (late.empty()) {
    // Every member computed its gradients and the round stalled. A member new to the run may not
    // be connected to its ring neighbours yet (it said hello to this node only; the others learn
    // of it by peer exchange): it goes back to the newcomers, to be set up again at the next step
    // boundary (at most max_failures times), and the step is redone without it.
    std::vector<node_id> fresh;
    for (const auto& m : c.ring)
      if (m != self_ && !c.proven.count(m)) fresh.push_back(m);
    if (!fresh.empty()) {
      for (const auto& m : fresh) {
        if (!stop_member(id, c, m, out)) continue;
        if (++c.failures[m] < max_failures && peers_.count(m)) c.newcomers.insert(m);
        notices_.push_back(notice{true, "the all-reduce of " + step + " stalled after every member was ready (" + std::to_string(waited) +
                           " ms); redoing it without " + m.short_string() + ", new to the run, which joins again at the next step boundary"});
      }
      auto more = issue_step(id, c);
      out.insert(out.end(), more.begin(), more.end());
      return out;
    }
    // Which member stalled the round? Every member is asked how many pieces its round took from
    // its predecessor: a member that does not answer is the culprit, and otherwise the member
    // after a silent one has taken the fewest (pieces start flowing from every member at once).
    if (!c.probing) {
      c.probing = true;
      c.probe_sent = now_;
      c.pieces_taken.clear();
      for (const auto& m : c.ring) out.push_back({m, msg::ring_go{id, c.step, c.attempt, true}});
      return out;
    }
    const bool all_answered = std::all_of(c.ring.begin(), c.ring.end(), [&](const node_id& m) { return c.pieces_taken.count(m) > 0; });
    if (!all_answered && now_ - c.probe_sent < probe_wait) return out;
    std::vector<node_id> blamed;
    for (const auto& m : c.ring)
      if (!c.pieces_taken.count(m) && m != self_) blamed.push_back(m);
    if (blamed.empty() && c.ring.size() > 1) {
      size_t fewest = 0;
      bool unique = true;
      for (size_t k = 1; k < c.ring.size(); ++k) {
        const uint32_t n = c.pieces_taken[c.ring[k]], best = c.pieces_taken[c.ring[fewest]];
        if (n < best) fewest = k, unique = true;
        else if (n == best) unique = false;
      }
      const node_id& before = c.ring[(fewest + c.ring.size() - 1) % c.ring.size()];
      if (unique && before != self_) blamed.push_back(before);
    }
    for (const auto& m : blamed)
      leave_out(id, c, m, step + ": the all-reduce stalled at this member (" + std::to_string(waited) + " ms, every member ready); left out of the run", out);
    if (!blamed.empty()) {
      auto more = issue_step(id, c);
      out.insert(out.end(), more.begin(), more.end());
      return out;
    }
    // Nobody can be blamed (this node's own part stalled it, or the answers do not tell): redo
    // the step once with the same ring; if that stalls too, the run cannot go on.
    if (c.stalled_step == c.step)
      return fail_run(id, c, error_code::timeout, "the all-reduce of " + step + " stalled twice after every member was ready (" + std::to_string(waited) + " ms)");
    c.stalled_step = c.step;
    notices_.push_back(notice{true, "the all-reduce of " + step + " stalled after every member was ready (" + std::to_string(waited) + " ms); redoing it once"});
    return issue_step(id, c);
  }
  for (const auto& m : late) leave_out(id, c, m, step + ": not ready after " + std::to_string(waited) + " ms; left out of the run", out);
  auto more = issue_step(id, c);
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

bool train_engine::stop_member(uint64_t id, coord_run& c, const node_id& m, std::vector<outbound>& out) {
  auto member = std::find(c.members.begin(), c.members.end(), m);
  if (member == c.members.end()) return false;
  // Its micro-batches and shards go to the others; if it comes back, its first step is a first
  // step again (it compiles). Its part of the run is stopped.
  c.members.erase(member);
  c.shards_sent.erase(m);
  c.proven.erase(m);
  msg::train_step stop;
  stop.train = id;
  stop.stop = true;
  out.push_back({m, stop});
  return true;
}

void train_engine::leave_out(uint64_t id, coord_run& c, const node_id& m, std::string why, std::vector<outbound>& out) {
  if (!stop_member(id, c, m, out)) return;
  // Not set up again while it stays connected: a member that heartbeats but never computes (or
  // never sends its pieces) would otherwise stall every step it is given.
  c.newcomers.erase(m);
  c.left_out.insert(m);
  note_refusal(m, "train_step deadline", std::move(why));
}

std::vector<msg::job_status> train_engine::jobs(clock::time_point now) const {
  std::vector<msg::job_status> out;
  for (const auto& [id, c] : coordinated_) {
    msg::job_status s;
    s.job = c->client_train;
    s.client = c->client;
    s.state = c->state;
    s.step = c->step;
    s.steps = c->spec.steps;
    s.stages = static_cast<uint32_t>(c->members.size());
    s.attempts = c->attempt;
    s.kind = job_kind::training;
    s.seconds = c->state == job_state::running ? std::chrono::duration<double>(now - c->started).count() : c->seconds;
    out.push_back(s);
  }
  return out;
}

loss_curves train_engine::curves() const {
  loss_curves out;
  for (const auto& [id, c] : coordinated_) out[c->client_train] = c->losses;
  return out;
}

}  // namespace mesh
