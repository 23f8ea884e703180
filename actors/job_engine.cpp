#include "actors/job_engine.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include "graph/fragment.hpp"
#include "graph/staged_plan.hpp"
#include "wire/wire_graph.hpp"

namespace mesh {
namespace {

/// The kind status shows for a one-shot job that ran as plan `s`.
job_kind job_kind_of(strategy s) {
  switch (s) {
    case strategy::data_parallel: return job_kind::data_parallel;
    case strategy::tensor_parallel: return job_kind::tensor_parallel;
    case strategy::pipeline:
    case strategy::automatic: break;
  }
  return job_kind::pipeline;
}

constexpr size_t max_finished_jobs = 100;        // kept for status
constexpr size_t max_cached_fragments = 256;     // worker side, inference sessions
constexpr size_t max_cancelled_jobs = 4096;      // cancelled jobs remembered (to ignore late stages)
constexpr uint32_t max_call_attempts = 4;        // a session call relaunched for evicted fragments
constexpr size_t max_waiting_per_coordinator = 256;  // stages one coordinator may leave waiting here

std::string resident_key_of(const node_id& coordinator, uint64_t cache, uint32_t stage) {
  return coordinator.to_string() + "/" + std::to_string(cache) + "/" + std::to_string(stage);
}

/// The distinct non-empty node ids of a stage assignment.
std::set<node_id> nodes_of(const std::vector<node_id>& stage_nodes) {
  std::set<node_id> out;
  for (const auto& n : stage_nodes)
    if (!n.empty()) out.insert(n);
  return out;
}

bool is_cut(const std::string& name) { return name.rfind("cut.", 0) == 0; }

/// An error when a client's graph names an input, parameter or output "cut.*": those names are
/// the values stages pass each other (a user's "cut.3" would be taken for one, or clash with one).
expected<void> check_reserved_names(const graph& g) {
  for (const auto& n : g.nodes)
    if ((n.op == op_kind::input || n.op == op_kind::parameter) && is_cut(n.attrs.name))
      return make_error(error_code::invalid_argument, "\"" + n.attrs.name + "\": names starting with \"cut.\" are reserved for values between stages");
  for (const auto& o : g.outputs)
    if (is_cut(o.name))
      return make_error(error_code::invalid_argument, "output \"" + o.name + "\": names starting with \"cut.\" are reserved for values between stages");
  return {};
}

std::vector<outbound> reply_error(const node_id& client, uint64_t id, error_code code, const std::string& why) {
  msg::job_result r;
  r.job = id;
  r.code = code;
  r.error = why;
  return {{client, r}};
}

/// Splits a WireGraph's tensors into the graph's inputs and parameters; errors name strays.
expected<std::pair<tensor_map, tensor_map>> split_tensors(const graph& g, tensor_map tensors) {
  tensor_map inputs, params;
  for (auto& [name, t] : tensors) {
    const node_index leaf = g.find_leaf(name);
    if (leaf < 0) return make_error(error_code::invalid_argument, "tensor \"" + name + "\" matches no input or parameter of the graph");
    (g[leaf].op == op_kind::input ? inputs : params)[name] = std::move(t);
  }
  return std::make_pair(std::move(inputs), std::move(params));
}

}  // namespace

job_engine::job_engine(node_id self, device_profile own, uint64_t first_job, stage_deadlines deadlines)
    : self_(std::move(self)), own_(std::move(own)), deadlines_(deadlines), next_job_(std::max<uint64_t>(first_job, 1)) {}

void job_engine::peer_up(const node_id& id, const device_profile& p) {
  if (peers_.count(id)) forget_coordinator(id);  // a new incarnation: its old jobs are gone
  peers_[id] = p;
  benched_.erase(id);
}

void job_engine::forget_coordinator(const node_id& id) {
  for (auto it = waiting_.begin(); it != waiting_.end();)
    it = std::get<0>(it->first) == id ? waiting_.erase(it) : std::next(it);
  forget_fragments([&](const cache_key& k) { return std::get<0>(k) == id; });
  std::erase_if(outbox_, [&](const auto& kv) { return std::get<0>(kv.first) == id; });
  std::erase_if(cancelled_, [&](const auto& kv) { return kv.first.first == id; });
  std::erase_if(closed_, [&](const auto& k) { return k.first == id; });
}

void job_engine::live_devices(std::vector<node_id>& ids, std::vector<device_profile>& profiles) const {
  ids = {self_};
  profiles = {own_};
  for (const auto& [id, p] : peers_) {
    if (benched_.count(id)) continue;
    ids.push_back(id);
    profiles.push_back(p);
  }
}

bool job_engine::usable(const node_id& n) const { return n == self_ || (peers_.count(n) && !benched_.count(n)); }

std::vector<node_id> job_engine::workers() const {
  std::vector<node_id> ids;
  std::vector<device_profile> profiles;
  live_devices(ids, profiles);
  return ids;
}

std::vector<outbound> job_engine::on_message(const node_id& from, const msg::message& m, clock::time_point now) {
  now_ = now;
  if (auto* s = std::get_if<msg::submit_job>(&m)) return submit(from, *s);
  if (auto* o = std::get_if<msg::open_session>(&m)) return open(from, *o);
  if (auto* c = std::get_if<msg::infer>(&m)) return call(from, *c);
  if (auto* c = std::get_if<msg::close_session>(&m)) {
    // From a client: it closes its session here. From a coordinator (its internal session id):
    // this worker lets that session's fragments go.
    auto it = sessions_by_client_.find({from, c->session});
    if (it != sessions_by_client_.end()) return end_session(it->second);
    forget_session(from, c->session);
    return {};
  }
  if (auto* c = std::get_if<msg::cancel_stages>(&m)) return on_cancel_stages(from, *c);
  if (auto* r = std::get_if<msg::run_stage>(&m)) return on_run_stage(from, *r);
  if (auto* a = std::get_if<msg::activation>(&m)) return on_activation(from, *a);
  if (auto* a = std::get_if<msg::stage_accepted>(&m)) return on_stage_accepted(from, *a);
  if (auto* o = std::get_if<msg::route_open>(&m)) return on_route_open(from, *o);
  if (auto* d = std::get_if<msg::stage_done>(&m)) return on_stage_done(from, *d);
  return {};
}

// ---- coordinator: one-shot jobs ----

std::vector<outbound> job_engine::submit(const node_id& client, const msg::submit_job& s) {
  if (by_client_.count({client, s.job})) return reply_error(client, s.job, error_code::invalid_argument, "job " + std::to_string(s.job) + " is already running");
  auto w = s.graph.get("the graph");  // decoded and validated with the message (wire/graph_payload.hpp)
  if (!w) return reply_error(client, s.job, w.error().code, w.error().message);
  const wire_graph& sub = **w;
  if (auto ok = check_reserved_names(sub.g); !ok) return reply_error(client, s.job, ok.error().code, ok.error().message);
  const auto kind = s.how;
  auto split = split_tensors(sub.g, sub.tensors);
  if (!split) return reply_error(client, s.job, split.error().code, split.error().message);
  if (auto ok = check_bindings(sub.g, split->first, false); !ok) return reply_error(client, s.job, ok.error().code, ok.error().message);
  if (auto ok = check_bindings(sub.g, split->second, true); !ok) return reply_error(client, s.job, ok.error().code, ok.error().message);

  // The job shares the message's graph (no copy); its tensors are the job's own.
  const uint64_t id = new_job(client, s.job, std::shared_ptr<const graph>(*w, &sub.g), sub.tensors, 0);
  job_record& j = jobs_.at(id);
  j.kind = kind;
  j.source = j.g;
  const auto ids = workers();
  return launch(id, j, ids, plan_job(j, ids));
}

std::vector<device_profile> job_engine::profiles_of(const std::vector<node_id>& nodes) const {
  std::vector<device_profile> out;
  for (const auto& n : nodes) out.push_back(n == self_ ? own_ : peers_.at(n));
  return out;
}

expected<plan> job_engine::plan_job(const job_record& j, const std::vector<node_id>& nodes) const {
  const auto devices = profiles_of(nodes);
  if (j.kind != strategy::automatic) return partition(*j.source, devices, j.kind);
  // The planner's cheapest plan may be one the stages cannot express (a data-parallel plan of a
  // graph that mixes batch rows): choose among those that can run.
  return cheapest_plan(*j.source, devices, [&](const plan& p) -> expected<void> {
    if (p.kind == strategy::pipeline) return {};
    auto staged = stage_plan(*j.source, p);
    if (!staged) return tl::unexpected(staged.error());
    return {};
  });
}

expected<void> job_engine::adopt_plan(job_record& j, const std::vector<node_id>& nodes, plan p) {
  if (p.kind == strategy::pipeline) {
    j.g = j.source;
    j.current = p;
    j.stage_tensors.clear();
  } else {
    auto staged = stage_plan(*j.source, p);
    if (!staged) return tl::unexpected(staged.error());
    auto bound = staged_tensors(*staged, j.tensors);
    if (!bound) return tl::unexpected(bound.error());
    j.g = std::make_shared<const graph>(std::move(staged->g));
    j.current = std::move(staged->stages);
    j.stage_tensors = std::move(*bound);
  }
  j.source_plan = std::move(p);
  j.plan_nodes = nodes;
  j.stage_nodes.assign(j.current.stages.size(), node_id{});
  for (size_t s = 0; s < j.current.stages.size(); ++s)
    if (!j.current.stages[s].nodes.empty()) j.stage_nodes[s] = nodes[static_cast<size_t>(j.current.stages[s].device)];
  return {};
}

expected<plan> job_engine::replan_job(const job_record& j, const node_id& dead, std::vector<node_id>& nodes) const {
  const auto pos = std::find(j.plan_nodes.begin(), j.plan_nodes.end(), dead);
  std::vector<node_id> survivors;
  for (const auto& n : j.plan_nodes)
    if (n != dead) survivors.push_back(n);
  const bool intact = pos != j.plan_nodes.end() && !survivors.empty() &&
                      std::all_of(survivors.begin(), survivors.end(), [&](const node_id& n) { return usable(n); });
  if (intact) {
    auto p = replan(*j.source, j.source_plan, static_cast<int>(pos - j.plan_nodes.begin()), profiles_of(survivors));
    if (p) {
      nodes = std::move(survivors);
      return p;
    }
  }
  nodes = workers();
  return plan_job(j, nodes);
}

uint64_t job_engine::new_job(const node_id& client, uint64_t client_job, std::shared_ptr<const graph> g,
                             tensor_map tensors, uint64_t session) {
  const uint64_t id = next_job_++;
  job_record& j = jobs_[id];
  j.client = client;
  j.client_job = client_job;
  j.g = std::move(g);
  j.tensors = std::move(tensors);
  j.session = session;
  j.started = now_;
  by_client_[{client, client_job}] = id;
  return id;
}

std::vector<outbound> job_engine::launch(uint64_t id, job_record& j, const std::vector<node_id>& nodes, expected<plan> p) {
  session_state* sess = nullptr;
  if (j.session) {
    auto it = sessions_.find(j.session);
    if (it == sessions_.end()) return finish(id, j, make_error(error_code::not_found, "the session was closed"));
    sess = &it->second;
  } else {
    if (!p) return finish(id, j, make_error(p.error().code, "cannot plan the job: " + p.error().message));
    const std::string kind = to_string(p->kind);
    if (auto ok = adopt_plan(j, nodes, std::move(*p)); !ok) return finish(id, j, make_error(ok.error().code, "cannot run the " + kind + " plan: " + ok.error().message));
  }
  const plan& pl = sess ? sess->current : j.current;
  std::vector<outbound> out;
  // The previous attempt's stages (a re-plan after a death, a call relaunched) will not be
  // collected: their nodes let them go. Nodes that get a stage of the new attempt would also
  // drop them on its arrival; nodes left out of the new plan learn it only from this.
  if (j.attempt > 0)
    for (const auto& n : nodes_of(j.stage_nodes)) out.push_back({n, msg::cancel_stages{id, j.attempt}});
  if (sess) j.stage_nodes = sess->stage_nodes;
  ++j.attempt;
  j.stages_done = 0;
  j.state = job_state::running;
  j.launched = now_;
  j.done_at.clear();
  j.pending.clear();
  j.outputs.clear();
  j.links.clear();
  for (const auto& t : pl.transfers) j.links.insert({static_cast<uint32_t>(t.from_stage), static_cast<uint32_t>(t.to_stage)});
  for (size_t s = 0; s < pl.stages.size(); ++s) {
    if (j.stage_nodes[s].empty()) continue;
    msg::run_stage r;
    r.job = id;
    r.attempt = j.attempt;
    r.stage = static_cast<uint32_t>(s);
    r.coordinator = self_;
    // Who sends each value this stage awaits: the node of the stage producing it (the worker
    // refuses an activation from any other node).
    std::map<std::string, node_id> producers;
    for (const auto& t : pl.transfers) {
      if (t.from_stage == static_cast<int>(s)) r.routes.push_back({cut_name(t.value), j.stage_nodes[static_cast<size_t>(t.to_stage)], static_cast<uint32_t>(t.to_stage)});
      if (t.to_stage == static_cast<int>(s)) producers[cut_name(t.value)] = j.stage_nodes[static_cast<size_t>(t.from_stage)];
    }
    const graph* frag = nullptr;
    graph one_shot;
    if (sess) {
      frag = &sess->fragments[s];
      r.cache = (j.session << 16) | (sess->epoch & 0xffff);
    } else {
      auto f = stage_fragment(*j.g, pl, static_cast<int>(s));
      if (!f) return finish(id, j, make_error(f.error().code, "cannot cut the graph: " + f.error().message));
      one_shot = std::move(*f);
      frag = &one_shot;
    }
    wire_graph w{*frag, {}};
    const tensor_map& bound = j.stage_tensors.empty() ? j.tensors : j.stage_tensors;
    for (const auto& n : frag->nodes) {
      if (n.op != op_kind::input && n.op != op_kind::parameter) continue;
      if (is_cut(n.attrs.name)) r.awaited.push_back({n.attrs.name, producers[n.attrs.name]});
      else if (sess && n.op == op_kind::input) r.inputs.push_back({n.attrs.name, j.tensors.at(n.attrs.name)});
      else if (!sess) w.tensors[n.attrs.name] = bound.at(n.attrs.name);
    }
    // A session's fragment and parameters travel once per (epoch, node, stage).
    const bool send_fragment = !sess || !sess->loaded.count({j.stage_nodes[s], r.stage});
    if (sess && send_fragment) w.tensors = sess->fragment_params[s];
    if (send_fragment) {
      r.fragment = graph_payload(std::move(w));  // encoded by the shell only if it leaves this node
      if (sess) sess->loaded.insert({j.stage_nodes[s], r.stage});
    }
    j.pending.insert(r.stage);
    out.push_back({j.stage_nodes[s], std::move(r)});
  }
  if (j.pending.empty()) {
    auto done = finish(id, j, {});
    out.insert(out.end(), done.begin(), done.end());
  }
  return out;
}

std::vector<outbound> job_engine::finish(uint64_t id, job_record& j, const expected<void>& outcome) {
  msg::job_result r;
  r.job = j.client_job;
  const bool ok = outcome.has_value();
  r.ok = ok;
  if (!ok) {
    r.code = outcome.error().code;
    r.error = outcome.error().message;
  }
  r.attempts = j.attempt;
  r.ran_as = j.source_plan.kind;
  if (ok && j.g)
    for (const auto& o : j.g->outputs) r.outputs.push_back({o.name, j.outputs.at(o.name)});
  for (const auto& n : j.stage_nodes)
    if (!n.empty()) r.workers.push_back(n);
  std::vector<outbound> out;
  // Stages still waiting for activations that will not come (another stage failed): let go.
  if (!ok && j.attempt > 0)
    for (const auto& n : nodes_of(j.stage_nodes)) out.push_back({n, msg::cancel_stages{id, j.attempt}});
  j.state = ok ? job_state::done : job_state::failed;
  j.seconds = std::chrono::duration<double>(now_ - j.started).count();
  j.pending.clear();
  j.g.reset();  // free the graph and tensors; the status line stays
  j.source.reset();
  j.tensors.clear();
  j.stage_tensors.clear();
  j.outputs.clear();
  by_client_.erase({j.client, j.client_job});
  out.push_back({j.client, std::move(r)});
  while (jobs_.size() > max_finished_jobs) {
    auto oldest = std::find_if(jobs_.begin(), jobs_.end(), [&](auto& kv) { return kv.first != id && (kv.second.state == job_state::done || kv.second.state == job_state::failed); });
    if (oldest == jobs_.end()) break;
    jobs_.erase(oldest);
  }
  return out;
}

std::vector<outbound> job_engine::on_stage_accepted(const node_id& from, const msg::stage_accepted& a) {
  auto it = jobs_.find(a.job);
  if (it == jobs_.end()) return {};
  job_record& j = it->second;
  if (j.state != job_state::running || a.attempt != j.attempt || a.stage >= j.stage_nodes.size() || j.stage_nodes[a.stage] != from)
    return {};  // another attempt's, or not from the node that runs the stage
  // Every stage that feeds this one may now send it its values.
  std::vector<outbound> out;
  for (const auto& [from_stage, to_stage] : j.links)
    if (to_stage == a.stage && from_stage < j.stage_nodes.size() && !j.stage_nodes[from_stage].empty())
      out.push_back({j.stage_nodes[from_stage], msg::route_open{a.job, a.attempt, from_stage, a.stage}});
  return out;
}

std::vector<outbound> job_engine::on_stage_done(const node_id& from, const msg::stage_done& d) {
  auto it = jobs_.find(d.job);
  if (it == jobs_.end()) return {};
  job_record& j = it->second;
  if (d.attempt != j.attempt || !j.pending.count(d.stage) || j.stage_nodes[d.stage] != from) return {};  // stale or spoofed
  if (!d.ok && j.session && d.code == error_code::evicted && j.attempt < max_call_attempts) {
    auto sess = sessions_.find(j.session);
    if (sess != sessions_.end()) {
      sess->second.loaded.erase({from, d.stage});  // the relaunch carries the fragment to it again
      return launch(d.job, j, {}, make_error(error_code::internal, "a session call has no plan of its own"));
    }
  }
  if (!d.ok) return finish(d.job, j, make_error(d.code, "stage " + std::to_string(d.stage) + " failed on node " + from.short_string() + ": " + d.error));
  for (const auto& o : d.outputs)
    if (j.g->find_output(o.name) >= 0) j.outputs[o.name] = o.value;
  j.pending.erase(d.stage);
  j.done_at[d.stage] = now_;
  std::vector<outbound> out;
  if (!j.session) {  // session calls are single micro-batches: no progress for them
    const auto stages = std::count_if(j.stage_nodes.begin(), j.stage_nodes.end(), [](auto& n) { return !n.empty(); });
    out.push_back({j.client, msg::job_progress{j.client_job, j.attempt, ++j.stages_done, static_cast<uint32_t>(stages), from}});
  }
  if (!j.pending.empty()) return out;
  for (const auto& o : j.g->outputs)
    if (!j.outputs.count(o.name)) {
      auto failed = finish(d.job, j, make_error(error_code::internal, "no stage returned output \"" + o.name + "\""));
      out.insert(out.end(), failed.begin(), failed.end());
      return out;
    }
  auto done = finish(d.job, j, {});
  out.insert(out.end(), done.begin(), done.end());
  return out;
}

// ---- coordinator: inference sessions ----

expected<void> job_engine::plan_session(uint64_t id, session_state& s, const std::vector<node_id>& nodes, expected<plan> p) {
  if (!p) return tl::unexpected(p.error());
  ++s.epoch;
  s.current = std::move(*p);
  s.loaded.clear();
  s.stage_nodes.assign(s.current.stages.size(), node_id{});
  s.fragments.assign(s.current.stages.size(), graph{});
  s.fragment_params.assign(s.current.stages.size(), tensor_map{});
  // Parameters get names unique to this session, so that they stay resident on each worker's
  // device next to other sessions' parameters of the same name.
  const std::string prefix = "sess." + self_.short_string() + "." + std::to_string(id) + ".";
  for (size_t k = 0; k < s.current.stages.size(); ++k) {
    if (s.current.stages[k].nodes.empty()) continue;
    s.stage_nodes[k] = nodes[static_cast<size_t>(s.current.stages[k].device)];
    auto f = stage_fragment(*s.g, s.current, static_cast<int>(k));
    if (!f) return tl::unexpected(f.error());
    for (auto& n : f->nodes)
      if (n.op == op_kind::parameter) {
        s.fragment_params[k][prefix + n.attrs.name] = s.params.at(n.attrs.name);
        n.attrs.name = prefix + n.attrs.name;
      }
    s.fragments[k] = std::move(*f);
  }
  return {};
}

std::vector<outbound> job_engine::open(const node_id& client, const msg::open_session& o) {
  if (sessions_by_client_.count({client, o.session})) return reply_error(client, o.session, error_code::invalid_argument, "session " + std::to_string(o.session) + " is already open");
  auto w = o.model.get("the model");
  if (!w) return reply_error(client, o.session, w.error().code, w.error().message);
  const wire_graph& model = **w;
  if (auto ok = check_reserved_names(model.g); !ok) return reply_error(client, o.session, ok.error().code, ok.error().message);
  auto split = split_tensors(model.g, model.tensors);
  if (!split) return reply_error(client, o.session, split.error().code, split.error().message);
  if (auto ok = check_bindings(model.g, split->second, true); !ok) return reply_error(client, o.session, ok.error().code, ok.error().message);
  if (!model.g.updates.empty()) return reply_error(client, o.session, error_code::invalid_argument, "an inference model must not update its parameters");
  const uint64_t id = next_job_++;
  session_state& s = sessions_[id];
  s.client = client;
  s.client_session = o.session;
  s.g = std::shared_ptr<const graph>(*w, &model.g);
  s.params = std::move(split->second);
  std::vector<node_id> ids;
  std::vector<device_profile> devices;
  live_devices(ids, devices);
  if (auto ok = plan_session(id, s, ids, partition(*s.g, devices, strategy::pipeline)); !ok) {
    sessions_.erase(id);
    return reply_error(client, o.session, ok.error().code, "cannot plan the model: " + ok.error().message);
  }
  sessions_by_client_[{client, o.session}] = id;
  msg::job_result r;
  r.job = o.session;
  r.ok = true;
  r.attempts = s.epoch;
  for (const auto& n : s.stage_nodes)
    if (!n.empty()) r.workers.push_back(n);
  return {{client, r}};
}

std::vector<outbound> job_engine::call(const node_id& client, const msg::infer& c) {
  auto sit = sessions_by_client_.find({client, c.session});
  if (sit == sessions_by_client_.end()) return reply_error(client, c.call, error_code::not_found, "no open session " + std::to_string(c.session));
  if (by_client_.count({client, c.call})) return reply_error(client, c.call, error_code::invalid_argument, "call " + std::to_string(c.call) + " is already running");
  session_state& s = sessions_.at(sit->second);
  tensor_map inputs;
  for (const auto& t : c.inputs) inputs[t.name] = t.value;
  if (auto ok = check_bindings(*s.g, inputs, false); !ok) return reply_error(client, c.call, ok.error().code, ok.error().message);
  const uint64_t id = new_job(client, c.call, s.g, std::move(inputs), sit->second);
  // A call runs over its session's plan: launch() takes no plan for it.
  return launch(id, jobs_.at(id), {}, make_error(error_code::internal, "a session call has no plan of its own"));
}

std::vector<outbound> job_engine::peer_dead(const node_id& id, clock::time_point now) {
  now_ = now;
  std::vector<outbound> out;
  // Sessions of a client that left without closing them: nobody will call them again.
  for (auto it = sessions_by_client_.begin(); it != sessions_by_client_.end();) {
    const uint64_t sid = it->second;
    ++it;  // end_session erases the entry
    if (sessions_.at(sid).client != id) continue;
    auto more = end_session(sid);
    out.insert(out.end(), more.begin(), more.end());
  }
  auto gone = peers_.find(id);
  if (gone == peers_.end()) return out;
  // Worker side: stages coordinated by the dead node will never be collected.
  forget_coordinator(id);
  std::vector<node_id> old_ids;
  std::vector<device_profile> old_devices;
  live_devices(old_ids, old_devices);
  peers_.erase(gone);
  benched_.erase(id);
  auto more = replan_without(id, old_ids, "died");
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

std::vector<outbound> job_engine::replan_without(const node_id& id, const std::vector<node_id>& old_ids, const std::string& why) {
  std::vector<outbound> out;
  // Coordinator side: re-plan every running job and session that had a stage there.
  const int dead = static_cast<int>(std::find(old_ids.begin(), old_ids.end(), id) - old_ids.begin());
  std::vector<node_id> ids;
  std::vector<device_profile> devices;
  live_devices(ids, devices);
  const auto uses_dead = [&](const std::vector<node_id>& nodes) { return std::find(nodes.begin(), nodes.end(), id) != nodes.end(); };
  // Survivors keep their part; only the dead node's stage moves (see replan()). A node benched
  // before was not among old_ids: its plans are made afresh.
  const auto new_plan = [&](const graph& g, const plan& old) {
    return old.stages.size() == old_ids.size() && dead < static_cast<int>(old_ids.size()) ? replan(g, old, dead, devices) : partition(g, devices, strategy::pipeline);
  };
  std::set<uint64_t> replanned;
  std::map<uint64_t, std::string> unplannable;  // sessions that cannot run without the dead node
  for (auto& [sid, s] : sessions_) {
    if (!uses_dead(s.stage_nodes)) continue;
    if (auto ok = plan_session(sid, s, ids, new_plan(*s.g, s.current)); ok) replanned.insert(sid);
    else unplannable[sid] = ok.error().message;
  }
  for (auto& [jid, j] : jobs_) {
    if (j.state != job_state::running) continue;
    if (auto u = unplannable.find(j.session); j.session && u != unplannable.end()) {
      auto failed = finish(jid, j, make_error(error_code::network, "node " + id.short_string() + " " + why + " and the session cannot be re-planned: " + u->second));
      out.insert(out.end(), failed.begin(), failed.end());
      continue;
    }
    if (j.session ? !replanned.count(j.session) && !uses_dead(j.stage_nodes) : !uses_dead(j.stage_nodes)) continue;
    std::vector<node_id> nodes;
    auto p = j.session ? expected<plan>(plan{}) : replan_job(j, id, nodes);
    auto more = launch(jid, j, nodes, std::move(p));
    out.insert(out.end(), more.begin(), more.end());
  }
  // Its calls would keep going to the dead node: the session ends, and later calls are told so.
  for (const auto& [sid, why_not] : unplannable) {
    auto more = end_session(sid, id);
    out.insert(out.end(), more.begin(), more.end());
  }
  return out;
}

job_engine::clock::duration job_engine::stage_deadline(const job_record& j, uint32_t s) const {
  const plan* pl = &j.current;
  if (j.session)
    if (auto it = sessions_.find(j.session); it != sessions_.end()) pl = &it->second.current;
  const double estimate = s < pl->stages.size() && std::isfinite(pl->stages[s].seconds) ? pl->stages[s].seconds : 0;
  const auto measured = std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(deadlines_.factor * std::min(estimate, 1e6)));
  return std::max<clock::duration>(measured, deadlines_.floor);
}

std::vector<outbound> job_engine::tick(clock::time_point now) {
  now_ = now;
  std::erase_if(benched_, [&](const auto& kv) { return kv.second <= now; });
  // The first overdue stage found: its node is benched and everything on it re-planned (which
  // restarts the other jobs it had stages of, so they are looked at again next tick).
  for (auto& [jid, j] : jobs_) {
    if (j.state != job_state::running) continue;
    for (const uint32_t s : j.pending) {
      if (s >= j.stage_nodes.size() || j.stage_nodes[s] == self_ || j.stage_nodes[s].empty()) continue;
      // Counted from when its inputs were ready: the launch, or the last producing stage's end.
      clock::time_point since = j.launched;
      bool inputs_ready = true;
      for (const auto& [from, to] : j.links) {
        if (to != s) continue;
        auto done = j.done_at.find(from);
        if (done == j.done_at.end()) inputs_ready = false;
        else since = std::max(since, done->second);
      }
      const auto limit = stage_deadline(j, s);
      if (!inputs_ready || now - since <= limit) continue;
      const node_id late = j.stage_nodes[s];
      std::vector<node_id> old_ids;
      std::vector<device_profile> old_devices;
      live_devices(old_ids, old_devices);
      benched_[late] = now + deadlines_.bench;
      const auto ms = [](clock::duration d) { return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()); };
      refused_.push_back({late, "run_stage deadline",
                          "stage " + std::to_string(s) + " of job " + std::to_string(jid) + ": not done " + ms(now - since) + " ms after its inputs were ready (deadline " +
                              ms(limit) + " ms); its jobs are re-planned without it and it gets no stage for " + std::to_string(deadlines_.bench.count()) + " s"});
      return replan_without(late, old_ids, "missed a stage deadline");
    }
  }
  return {};
}

std::vector<outbound> job_engine::end_session(uint64_t id, const node_id& skip_node) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return {};
  std::vector<outbound> out;
  for (const auto& n : nodes_of(it->second.stage_nodes))
    if (n != skip_node) out.push_back({n, msg::close_session{id}});
  sessions_by_client_.erase({it->second.client, it->second.client_session});
  sessions_.erase(it);
  return out;
}

// ---- worker ----

std::vector<outbound> job_engine::on_run_stage(const node_id& from, const msg::run_stage& r) {
  const auto fail = [&](error_code code, const std::string& why) {
    msg::stage_done d;
    d.job = r.job;
    d.attempt = r.attempt;
    d.stage = r.stage;
    d.code = code;
    d.error = why;
    return std::vector<outbound>{{r.coordinator, d}};
  };
  if (from != r.coordinator) return {};  // only the coordinator itself may hand out its stages
  // A stage waits here for its activations; a member that hands out stages whose activations
  // never come must not fill this node with them.
  size_t waiting_from = 0;
  for (const auto& [k, w] : waiting_) waiting_from += std::get<0>(k) == from;
  if (waiting_from >= max_waiting_per_coordinator) {
    refused_.push_back({from, "run_stage", "stage " + std::to_string(r.stage) + " of job " + std::to_string(r.job) + ": " +
                                               std::to_string(max_waiting_per_coordinator) + " stages of this coordinator already wait here"});
    return fail(error_code::limit_exceeded, "node " + self_.short_string() + " already holds " + std::to_string(max_waiting_per_coordinator) +
                                                " waiting stages of this coordinator");
  }
  waiting_stage ws;
  ws.task.coordinator = r.coordinator;
  ws.task.job = r.job;
  ws.task.attempt = r.attempt;
  ws.task.stage = r.stage;
  ws.task.routes = r.routes;
  const cache_key key{r.coordinator, r.cache, r.stage};
  if (r.cache && closed_.count({r.coordinator, r.cache >> 16})) return fail(error_code::not_found, "the session was closed");
  if (r.fragment.empty()) {
    if (!r.cache) return fail(error_code::invalid_argument, "the stage carries no fragment");
    auto c = cache_.find(key);
    // The call that carried the fragment came first (the transport keeps a peer's order), so a
    // fragment missing here was let go (least recently used) or lost with a device restart:
    // the coordinator sends it again.
    if (c == cache_.end()) return fail(error_code::evicted, "the session fragment is no longer cached on this node");
    c->second.last_use = ++use_clock_;
    ws.task.g = c->second.g;
    ws.task.params = c->second.params;
  } else {
    auto w = r.fragment.get("the fragment");
    if (!w) return fail(w.error().code, w.error().message);
    auto split = split_tensors((*w)->g, (*w)->tensors);
    if (!split) return fail(split.error().code, split.error().message);
    ws.task.inputs = std::move(split->first);
    ws.task.params = std::move(split->second);
    ws.task.g = std::shared_ptr<const graph>(*w, &(*w)->g);
    if (r.cache) {
      if (!cache_.count(key) && cache_.size() >= max_cached_fragments) {
        auto lru = std::min_element(cache_.begin(), cache_.end(),
                                    [](const auto& a, const auto& b) { return a.second.last_use < b.second.last_use; });
        drop_cached(lru);
      }
      cache_[key] = {ws.task.g, ws.task.params, ++use_clock_};
    }
  }
  std::vector<outbound> out;
  if (r.cache) ws.task.resident_key = resident_key_of(r.coordinator, r.cache, r.stage);
  for (const auto& t : r.inputs) ws.task.inputs[t.name] = t.value;
  for (const auto& a : r.awaited) {
    const node_index leaf = ws.task.g->find_leaf(a.name);
    if (leaf < 0 || (*ws.task.g)[leaf].op != op_kind::input) return fail(error_code::invalid_argument, "awaited value \"" + a.name + "\" is not an input of the fragment");
    if (a.from.empty()) return fail(error_code::invalid_argument, "awaited value \"" + a.name + "\" names no node that sends it");
    ws.awaited[a.name] = a.from;
  }
  const stage_key k{r.coordinator, r.job, r.attempt, r.stage};
  if (waiting_.count(k)) return out;
  if (auto c = cancelled_.find({r.coordinator, r.job}); c != cancelled_.end() && r.attempt <= c->second) return out;
  // Stages and activations of earlier attempts of this job (before a re-plan) will never be used.
  if (r.attempt > 0) on_cancel_stages(r.coordinator, msg::cancel_stages{r.job, r.attempt - 1});
  // The producers of the awaited values send them only once the coordinator relays this
  // (route_open): no activation reaches this node before its stage.
  if (!ws.awaited.empty()) out.push_back({r.coordinator, msg::stage_accepted{r.job, r.attempt, r.stage}});
  if (!r.routes.empty()) outbox_[k] = {r.routes, {}, std::nullopt};
  waiting_[k] = std::move(ws);
  promote_ready(k);
  return out;
}

std::vector<outbound> job_engine::on_cancel_stages(const node_id& from, const msg::cancel_stages& c) {
  const auto stale = [&](const node_id& coordinator, uint64_t job, uint32_t attempt) {
    return coordinator == from && job == c.job && attempt <= c.attempt;
  };
  auto& highest = cancelled_[{from, c.job}];
  highest = std::max(highest, c.attempt);
  if (cancelled_.size() > max_cancelled_jobs) cancelled_.erase(cancelled_.begin());
  for (auto it = waiting_.begin(); it != waiting_.end();)
    it = stale(std::get<0>(it->first), std::get<1>(it->first), std::get<2>(it->first)) ? waiting_.erase(it) : std::next(it);
  for (auto it = outbox_.begin(); it != outbox_.end();)
    it = stale(std::get<0>(it->first), std::get<1>(it->first), std::get<2>(it->first)) ? outbox_.erase(it) : std::next(it);
  return {};
}

void job_engine::unpin(const std::string& resident_key) {
  for (auto& [k, ws] : waiting_)
    if (ws.task.resident_key == resident_key) ws.task.resident_key.clear();
  for (auto& t : ready_)
    if (t.resident_key == resident_key) t.resident_key.clear();
}

void job_engine::drop_cached(std::map<cache_key, cached_fragment>::iterator it) {
  const auto& [coordinator, cache, stage] = it->first;
  const std::string key = resident_key_of(coordinator, cache, stage);
  unpin(key);
  forgotten_.push_back(key);
  cache_.erase(it);
}

void job_engine::forget_session(const node_id& coordinator, uint64_t session) {
  if (closed_.size() >= max_cancelled_jobs) closed_.erase(closed_.begin());
  closed_.insert({coordinator, session});
  forget_fragments([&](const cache_key& k) { return std::get<0>(k) == coordinator && (std::get<1>(k) >> 16) == session; });
}

void job_engine::forget_fragments(const std::function<bool(const cache_key&)>& which) {
  for (auto it = cache_.begin(); it != cache_.end();) {
    auto next = std::next(it);
    if (which(it->first)) drop_cached(it);
    it = next;
  }
}

std::vector<outbound> job_engine::on_activation(const node_id& from, const msg::activation& a) {
  // The stage is here (its producer waited for route_open): a value for no waiting stage
  // belongs to a cancelled attempt, or is a duplicate or a value the stage does not take.
  const stage_key k{a.coordinator, a.job, a.attempt, a.stage};
  auto it = waiting_.find(k);
  if (it == waiting_.end()) return {};
  auto value = it->second.awaited.find(a.value.name);
  if (value == it->second.awaited.end()) return {};
  // Only the node of the stage producing the value may send it: any member could otherwise
  // feed another's stage its own numbers first (the real value would then be the duplicate).
  if (value->second != from) {
    refused_.push_back({from, "activation", "value \"" + a.value.name + "\" for stage " + std::to_string(a.stage) + " of job " +
                                                std::to_string(a.job) + " (coordinator " + a.coordinator.short_string() + ") comes from node " +
                                                value->second.short_string() + ", not from this sender"});
    return {};
  }
  it->second.task.inputs[a.value.name] = a.value.value;
  it->second.awaited.erase(value);
  promote_ready(k);
  return {};
}

std::vector<outbound> job_engine::on_route_open(const node_id& from, const msg::route_open& o) {
  auto it = outbox_.find(stage_key{from, o.job, o.attempt, o.stage});
  if (it == outbox_.end()) return {};  // a cancelled attempt, or the routes were all sent
  it->second.open.insert(o.to_stage);
  return send_open_routes(it);
}

std::vector<outbound> job_engine::send_open_routes(std::map<stage_key, stage_outbox>::iterator it) {
  auto& box = it->second;
  if (!box.values) return {};  // the stage has not run yet
  const auto& [coordinator, job, attempt, stage] = it->first;
  std::vector<outbound> out;
  std::vector<msg::route> still_closed;
  for (auto& r : box.routes) {
    if (!box.open.count(r.stage)) {
      still_closed.push_back(std::move(r));
      continue;
    }
    auto v = box.values->find(r.value);
    if (v == box.values->end()) continue;  // the stage did not produce it (validated graphs always do)
    msg::activation a;
    a.coordinator = coordinator;
    a.job = job;
    a.attempt = attempt;
    a.stage = r.stage;
    a.value = {r.value, v->second};
    out.push_back({r.to, std::move(a)});
  }
  box.routes = std::move(still_closed);
  if (box.routes.empty()) outbox_.erase(it);
  return out;
}

void job_engine::promote_ready(const stage_key& k) {
  auto it = waiting_.find(k);
  if (it == waiting_.end() || !it->second.awaited.empty()) return;
  ready_.push_back(std::move(it->second.task));
  waiting_.erase(it);
}

std::vector<stage_task> job_engine::take_ready() {
  std::vector<stage_task> out(std::make_move_iterator(ready_.begin()), std::make_move_iterator(ready_.end()));
  ready_.clear();
  executing_ += out.size();
  return out;
}

std::vector<outbound> job_engine::on_executed(const stage_task& t, const expected<tensor_map>& outputs, clock::time_point now) {
  now_ = now;
  if (executing_ > 0) --executing_;
  msg::stage_done d;
  d.job = t.job;
  d.attempt = t.attempt;
  d.stage = t.stage;
  std::vector<outbound> out;
  if (!outputs) {
    outbox_.erase(stage_key{t.coordinator, t.job, t.attempt, t.stage});
    d.code = outputs.error().code;
    d.error = outputs.error().to_string();
    out.push_back({t.coordinator, d});
    return out;
  }
  // Cut values go to the stages whose consumer accepted (route_open); the others stay with this
  // stage's record until theirs does.
  if (auto box = outbox_.find(stage_key{t.coordinator, t.job, t.attempt, t.stage}); box != outbox_.end()) {
    box->second.values.emplace();
    for (const auto& r : box->second.routes)
      if (auto v = outputs->find(r.value); v != outputs->end()) (*box->second.values)[r.value] = v->second;
    out = send_open_routes(box);
  }
  d.ok = true;
  for (const auto& [name, value] : *outputs)
    if (!is_cut(name)) d.outputs.push_back({name, value});
  out.push_back({t.coordinator, std::move(d)});
  return out;
}

std::vector<msg::job_status> job_engine::jobs(clock::time_point now) const {
  std::vector<msg::job_status> out;
  for (const auto& [id, j] : jobs_) {
    msg::job_status s;
    s.job = j.client_job;
    s.client = j.client;
    s.state = j.state;
    s.stages = static_cast<uint32_t>(std::count_if(j.stage_nodes.begin(), j.stage_nodes.end(), [](auto& n) { return !n.empty(); }));
    s.attempts = j.attempt;
    s.kind = j.session ? job_kind::inference : job_kind_of(j.source_plan.kind);
    s.seconds = j.state == job_state::running ? std::chrono::duration<double>(now - j.started).count() : j.seconds;
    out.push_back(s);
  }
  return out;
}

}  // namespace mesh
