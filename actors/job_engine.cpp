#include "actors/job_engine.hpp"

#include <algorithm>

#include "graph/fragment.hpp"
#include "graph/wire.hpp"

namespace mesh {
namespace {

constexpr size_t max_early_activations = 4096;  // activations buffered for stages not yet here
constexpr size_t max_finished_jobs = 100;        // kept for status

bool is_cut(const std::string& name) { return name.rfind("cut.", 0) == 0; }

}  // namespace

job_engine::job_engine(std::string self, device_profile own, graph_limits limits)
    : self_(std::move(self)), own_(std::move(own)), limits_(limits) {}

void job_engine::peer_up(const std::string& id, const device_profile& p) { peers_[id] = p; }

void job_engine::live_devices(std::vector<std::string>& ids, std::vector<device_profile>& profiles) const {
  ids = {self_};
  profiles = {own_};
  for (const auto& [id, p] : peers_) {
    ids.push_back(id);
    profiles.push_back(p);
  }
}

std::vector<std::string> job_engine::workers() const {
  std::vector<std::string> ids;
  std::vector<device_profile> profiles;
  live_devices(ids, profiles);
  return ids;
}

std::vector<outbound> job_engine::on_message(const std::string& from, const msg::message& m) {
  if (auto* s = std::get_if<msg::submit_job>(&m)) return submit(from, *s);
  if (auto* r = std::get_if<msg::run_stage>(&m)) return on_run_stage(from, *r);
  if (auto* a = std::get_if<msg::activation>(&m)) return on_activation(*a);
  if (auto* d = std::get_if<msg::stage_done>(&m)) return on_stage_done(from, *d);
  return {};
}

// ---- coordinator ----

std::vector<outbound> job_engine::submit(const std::string& client, const msg::submit_job& s) {
  const auto reject = [&](const std::string& why) {
    msg::job_result r;
    r.job = s.job;
    r.error = why;
    return std::vector<outbound>{{client, r}};
  };
  if (by_client_.count({client, s.job})) return reject("job " + std::to_string(s.job) + " is already running");
  auto w = decode_wire_graph(s.wire.data(), s.wire.size(), limits_);
  if (!w) return reject("the graph was rejected: " + w.error().to_string());
  if (s.strategy > static_cast<uint8_t>(strategy::automatic)) return reject("unknown strategy " + std::to_string(s.strategy));
  auto kind = static_cast<strategy>(s.strategy);
  // The engine executes pipeline plans; data and tensor parallel plans are run by the trainer.
  if (kind == strategy::automatic) kind = strategy::pipeline;
  if (kind != strategy::pipeline)
    return reject(std::string("one-shot jobs run as pipeline plans; ") + to_string(kind) + " is for training jobs");
  tensor_map inputs, params;
  for (auto& [name, t] : w->tensors) {
    const node_id leaf = w->g.find_leaf(name);
    if (leaf < 0) return reject("tensor \"" + name + "\" matches no input or parameter of the graph");
    (w->g[leaf].op == op_kind::input ? inputs : params)[name] = t;
  }
  if (auto ok = check_bindings(w->g, inputs, false); !ok) return reject(ok.error().message);
  if (auto ok = check_bindings(w->g, params, true); !ok) return reject(ok.error().message);

  const uint64_t id = next_job_++;
  job_state& j = jobs_[id];
  j.client = client;
  j.client_job = s.job;
  j.g = std::move(w->g);
  j.tensors = std::move(w->tensors);
  j.kind = kind;
  by_client_[{client, s.job}] = id;
  std::vector<std::string> ids;
  std::vector<device_profile> devices;
  live_devices(ids, devices);
  return launch(id, j, ids, devices, partition(j.g, devices, kind));
}

std::vector<outbound> job_engine::launch(uint64_t id, job_state& j, const std::vector<std::string>& nodes,
                                         const std::vector<device_profile>& devices, expected<plan> p) {
  (void)devices;
  if (!p) return finish(id, j, false, "cannot plan the job: " + p.error().message);
  ++j.attempt;
  j.current = std::move(*p);
  j.state = "running";
  j.pending.clear();
  j.outputs.clear();
  j.stage_nodes.assign(j.current.stages.size(), "");
  for (size_t s = 0; s < j.current.stages.size(); ++s)
    if (!j.current.stages[s].nodes.empty()) j.stage_nodes[s] = nodes[static_cast<size_t>(j.current.stages[s].device)];
  std::vector<outbound> out;
  for (size_t s = 0; s < j.current.stages.size(); ++s) {
    if (j.stage_nodes[s].empty()) continue;
    auto f = stage_fragment(j.g, j.current, static_cast<int>(s));
    if (!f) return finish(id, j, false, "cannot cut the graph: " + f.error().message);
    msg::run_stage r;
    r.job = id;
    r.attempt = j.attempt;
    r.stage = static_cast<uint32_t>(s);
    r.coordinator = self_;
    wire_graph w{*f, {}};
    for (const auto& n : f->nodes) {
      if (n.op != op_kind::input && n.op != op_kind::parameter) continue;
      if (is_cut(n.attrs.name)) r.awaited.push_back(n.attrs.name);
      else w.tensors[n.attrs.name] = j.tensors.at(n.attrs.name);
    }
    for (const auto& t : j.current.transfers)
      if (t.from_stage == static_cast<int>(s)) r.routes.push_back({cut_name(t.value), j.stage_nodes[static_cast<size_t>(t.to_stage)]});
    auto bytes = encode(w);
    if (!bytes) return finish(id, j, false, bytes.error().message);
    r.wire = std::move(*bytes);
    j.pending.insert(r.stage);
    out.push_back({j.stage_nodes[s], std::move(r)});
  }
  if (j.pending.empty()) {
    auto done = finish(id, j, true, "");
    out.insert(out.end(), done.begin(), done.end());
  }
  return out;
}

std::vector<outbound> job_engine::finish(uint64_t id, job_state& j, bool ok, const std::string& error) {
  msg::job_result r;
  r.job = j.client_job;
  r.ok = ok;
  r.error = error;
  r.attempts = j.attempt;
  if (ok)
    for (const auto& o : j.g.outputs) r.outputs.push_back({o.name, j.outputs.at(o.name)});
  for (const auto& n : j.stage_nodes)
    if (!n.empty()) r.workers.push_back(n);
  j.state = ok ? "done" : "failed";
  j.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - j.started).count();
  j.pending.clear();
  j.g = {};  // free the graph and tensors; the status line stays
  j.tensors.clear();
  j.outputs.clear();
  by_client_.erase({j.client, j.client_job});
  std::vector<outbound> out{{j.client, std::move(r)}};
  while (jobs_.size() > max_finished_jobs) {
    auto oldest = std::find_if(jobs_.begin(), jobs_.end(), [&](auto& kv) { return kv.first != id && (kv.second.state == "done" || kv.second.state == "failed"); });
    if (oldest == jobs_.end()) break;
    jobs_.erase(oldest);
  }
  return out;
}

std::vector<outbound> job_engine::on_stage_done(const std::string& from, const msg::stage_done& d) {
  auto it = jobs_.find(d.job);
  if (it == jobs_.end()) return {};
  job_state& j = it->second;
  if (d.attempt != j.attempt || !j.pending.count(d.stage) || j.stage_nodes[d.stage] != from) return {};  // stale or spoofed
  if (!d.ok) return finish(d.job, j, false, "stage " + std::to_string(d.stage) + " failed on node " + from.substr(0, 8) + ": " + d.error);
  for (const auto& o : d.outputs)
    if (j.g.find_output(o.name) >= 0) j.outputs[o.name] = o.value;
  j.pending.erase(d.stage);
  if (!j.pending.empty()) return {};
  for (const auto& o : j.g.outputs)
    if (!j.outputs.count(o.name)) return finish(d.job, j, false, "no stage returned output \"" + o.name + "\"");
  return finish(d.job, j, true, "");
}

std::vector<outbound> job_engine::peer_dead(const std::string& id) {
  std::vector<outbound> out;
  auto gone = peers_.find(id);
  if (gone == peers_.end()) return out;
  // Worker side: stages coordinated by the dead node will never be collected.
  for (auto it = waiting_.begin(); it != waiting_.end();)
    it = std::get<0>(it->first) == id ? waiting_.erase(it) : std::next(it);
  // Coordinator side: re-plan every running job that had a stage there.
  std::vector<std::string> old_ids;
  std::vector<device_profile> old_devices;
  live_devices(old_ids, old_devices);
  const int dead = static_cast<int>(std::find(old_ids.begin(), old_ids.end(), id) - old_ids.begin());
  peers_.erase(gone);
  std::vector<std::string> ids;
  std::vector<device_profile> devices;
  live_devices(ids, devices);
  for (auto& [jid, j] : jobs_) {
    if (j.state != "running" || std::find(j.stage_nodes.begin(), j.stage_nodes.end(), id) == j.stage_nodes.end()) continue;
    // Survivors keep their part; only the dead node's stage moves (see replan()).
    auto p = j.current.stages.size() == old_ids.size() ? replan(j.g, j.current, dead, devices) : partition(j.g, devices, j.kind);
    auto more = launch(jid, j, ids, devices, std::move(p));
    out.insert(out.end(), more.begin(), more.end());
  }
  return out;
}

// ---- worker ----

std::vector<outbound> job_engine::on_run_stage(const std::string& from, const msg::run_stage& r) {
  const auto fail = [&](const std::string& why) {
    msg::stage_done d;
    d.job = r.job;
    d.attempt = r.attempt;
    d.stage = r.stage;
    d.error = why;
    return std::vector<outbound>{{r.coordinator, d}};
  };
  if (from != r.coordinator) return {};  // only the coordinator itself may hand out its stages
  auto w = decode_wire_graph(r.wire.data(), r.wire.size(), limits_);
  if (!w) return fail("fragment rejected: " + w.error().to_string());
  waiting_stage ws;
  ws.task.coordinator = r.coordinator;
  ws.task.job = r.job;
  ws.task.attempt = r.attempt;
  ws.task.stage = r.stage;
  ws.task.routes = r.routes;
  for (auto& [name, t] : w->tensors) {
    const node_id leaf = w->g.find_leaf(name);
    if (leaf < 0) return fail("tensor \"" + name + "\" matches no leaf of the fragment");
    (w->g[leaf].op == op_kind::input ? ws.task.inputs : ws.task.params)[name] = std::move(t);
  }
  for (const auto& a : r.awaited) {
    const node_id leaf = w->g.find_leaf(a);
    if (leaf < 0 || w->g[leaf].op != op_kind::input) return fail("awaited value \"" + a + "\" is not an input of the fragment");
    ws.awaited.insert(a);
  }
  ws.task.g = std::move(w->g);
  const stage_key k{r.coordinator, r.job, r.attempt, r.stage};
  if (waiting_.count(k)) return {};
  // Activations that arrived before the stage itself.
  auto early = early_.find({r.coordinator, r.job, r.attempt});
  if (early != early_.end()) {
    for (auto it = early->second.begin(); it != early->second.end();) {
      if (ws.awaited.erase(it->first)) {
        ws.task.inputs[it->first] = std::move(it->second);
        it = early->second.erase(it);
      } else {
        ++it;
      }
    }
    if (early->second.empty()) early_.erase(early);
  }
  waiting_[k] = std::move(ws);
  promote_ready(k);
  return {};
}

std::vector<outbound> job_engine::on_activation(const msg::activation& a) {
  for (auto& [k, ws] : waiting_) {
    if (std::get<0>(k) != a.coordinator || std::get<1>(k) != a.job || std::get<2>(k) != a.attempt) continue;
    if (!ws.awaited.erase(a.value.name)) continue;
    ws.task.inputs[a.value.name] = a.value.value;
    promote_ready(k);
    return {};
  }
  size_t buffered = 0;
  for (const auto& [k, m] : early_) buffered += m.size();
  if (buffered < max_early_activations) early_[{a.coordinator, a.job, a.attempt}][a.value.name] = a.value.value;
  return {};
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

std::vector<outbound> job_engine::on_executed(const stage_task& t, const expected<tensor_map>& outputs) {
  if (executing_ > 0) --executing_;
  msg::stage_done d;
  d.job = t.job;
  d.attempt = t.attempt;
  d.stage = t.stage;
  std::vector<outbound> out;
  if (!outputs) {
    d.error = outputs.error().to_string();
    out.push_back({t.coordinator, d});
    return out;
  }
  for (const auto& r : t.routes) {
    auto v = outputs->find(r.value);
    if (v == outputs->end()) continue;
    msg::activation a;
    a.coordinator = t.coordinator;
    a.job = t.job;
    a.attempt = t.attempt;
    a.value = {r.value, v->second};
    out.push_back({r.to, std::move(a)});
  }
  d.ok = true;
  for (const auto& [name, value] : *outputs)
    if (!is_cut(name)) d.outputs.push_back({name, value});
  out.push_back({t.coordinator, std::move(d)});
  return out;
}

std::vector<msg::job_status> job_engine::jobs() const {
  std::vector<msg::job_status> out;
  for (const auto& [id, j] : jobs_) {
    msg::job_status s;
    s.job = j.client_job;
    s.client = j.client;
    s.state = j.state;
    s.stages = static_cast<uint32_t>(std::count_if(j.stage_nodes.begin(), j.stage_nodes.end(), [](auto& n) { return !n.empty(); }));
    s.attempts = j.attempt;
    s.seconds = j.state == "running" ? std::chrono::duration<double>(std::chrono::steady_clock::now() - j.started).count() : j.seconds;
    out.push_back(s);
  }
  return out;
}

}  // namespace mesh
