#include "actors/failover_pipeline.hpp"

#include <algorithm>
#include <map>

#include <fmt/format.h>

namespace mesh::generation {

namespace {

std::vector<node_id> ids_of(const std::vector<split_candidate>& nodes) {
  std::vector<node_id> out;
  for (const auto& n : nodes) out.push_back(n.id);
  return out;
}

std::string short_list(const std::vector<node_id>& ids) {
  std::string out;
  for (const auto& id : ids) out += (out.empty() ? "" : ", ") + id.short_string();
  return out;
}

}  // namespace

expected<std::unique_ptr<failover_pipeline>> failover_pipeline::create(failover_options o, const models::model_config& config,
                                                                      int64_t context, int64_t slots) {
  if (!o.open || o.nodes.empty() || o.nodes.front().id != o.self.id)
    return make_error(error_code::invalid_argument, "failover pipeline: no open function, or the nodes do not begin with this node");
  std::unique_ptr<failover_pipeline> f(new failover_pipeline());
  f->o_ = std::move(o);
  f->config_ = config;
  f->context_ = context;
  if (slots < 1) return make_error(error_code::invalid_argument, fmt::format("failover pipeline: {} slots", slots));
  f->history_.resize(static_cast<size_t>(slots));
  auto p = f->o_.open(f->o_.nodes, f->step_m_);
  if (!p) return tl::unexpected(p.error());
  if ((*p)->slots() != slots)
    return make_error(error_code::internal, fmt::format("failover pipeline: open made {} slots, not {}", (*p)->slots(), slots));
  f->install(std::move(*p), ids_of(f->o_.nodes));
  f->replans_ = 0;
  f->want_ = f->o_.nodes.size();
  if (f->o_.roster) f->subscription_ = f->o_.roster->subscribe([p = f.get()](const roster_event& e) { p->on_roster(e); });
  return f;
}

failover_pipeline::~failover_pipeline() {
  // After this no roster call runs on this object (it waits for one under way).
  if (o_.roster) o_.roster->unsubscribe(subscription_);
}

void failover_pipeline::say(const std::string& line) const {
  if (o_.log) o_.log(line);
}

std::vector<split_candidate> failover_pipeline::live() const {
  if (o_.roster) return o_.roster->live();
  // Without a roster: the first plan's peers, until they are lost (excluded_).
  std::vector<split_candidate> out;
  for (const auto& n : o_.nodes)
    if (n.id != o_.self.id) out.push_back(n);
  return out;
}

void failover_pipeline::install(std::unique_ptr<models::pipeline> p, std::vector<node_id> over) {
  std::vector<node_id> in_stages;
  std::vector<serving::model_stage_info> info;
  for (const auto& s : p->stages()) {
    if (auto id = node_id::parse(s.node)) in_stages.push_back(*id);
    info.push_back({s.node, s.layers.first, s.layers.end});
  }
  std::unique_ptr<models::pipeline> old;
  {
    std::unique_lock<std::shared_mutex> step(step_m_);
    old = std::move(current_);
    current_ = std::move(p);
    // The old stages are closed once no step uses them: their local stage touches the executor.
    old.reset();
  }
  std::lock_guard<std::mutex> lock(view_m_);
  planned_over_ = std::move(over);
  in_stages_ = std::move(in_stages);
  stage_info_ = std::move(info);
  ++replans_;
}

expected<void> failover_pipeline::replan_if_needed() {
  const auto peers = live();
  split_plan_view view;
  std::set<node_id> excluded;
  {
    std::lock_guard<std::mutex> lock(view_m_);
    view = {o_.self.id, planned_over_, in_stages_, want_};
    excluded = excluded_;
  }
  const auto cause = replan_needed(view, peers, excluded);
  if (cause == replan_cause::none) return {};
  return replan_over(cause, view, peers, excluded);
}

expected<void> failover_pipeline::replan(size_t nodes) {
  if (nodes < 1) return make_error(error_code::invalid_argument, "a plan needs at least one node");
  std::lock_guard<std::mutex> plan(plan_m_);
  const auto peers = live();
  split_plan_view view;
  std::set<node_id> excluded;
  {
    std::lock_guard<std::mutex> lock(view_m_);
    want_ = nodes;
    view = {o_.self.id, planned_over_, in_stages_, want_};
    excluded = excluded_;
  }
  // A stage node already lost makes this the re-plan that loss needs; otherwise the new plan is
  // built beside the one serving, as when a node joins.
  const auto cause = replan_needed(view, peers, excluded) == replan_cause::lost_node ? replan_cause::lost_node : replan_cause::asked;
  return replan_over(cause, view, peers, excluded);
}

expected<void> failover_pipeline::replan_over(replan_cause cause, const split_plan_view& view, const std::vector<split_candidate>& peers,
                                              const std::set<node_id>& excluded) {
  const split_candidate self = o_.roster ? o_.roster->current(o_.self) : o_.self;
  auto nodes = replan_nodes(self, view.planned_over, peers, excluded, view.want);
  if (cause == replan_cause::lost_node) {
    std::map<std::string, uint64_t> held;
    if (o_.stage_bytes) {
      std::lock_guard<std::mutex> lock(view_m_);
      for (const auto& s : stage_info_) {
        models::layer_range r;
        r.first = s.first_layer;
        r.end = s.end_layer;
        held[s.node] += static_cast<uint64_t>(std::max<int64_t>(0, o_.stage_bytes(r)));
      }
    }
    for (auto& n : nodes)
      if (auto it = held.find(n.id.to_string()); it != held.end()) n.memory_bytes = n.memory_bytes + it->second;
    // The stages that are left are dropped first: their nodes' memory is what the new plan
    // needs, and the model cannot step without the lost stage anyway.
    std::unique_ptr<models::pipeline> old;
    {
      std::unique_lock<std::shared_mutex> step(step_m_);
      old = std::move(current_);
      old.reset();
    }
    std::lock_guard<std::mutex> lock(view_m_);
    in_stages_.clear();
    stage_info_.clear();
  }
  say(fmt::format("re-planning ({}) over {} nodes: {}", to_string(cause), nodes.size(), short_list(ids_of(nodes))));
  auto p = o_.open(nodes, step_m_);
  if (!p) {
    if (cause == replan_cause::widen) {
      // The old plan serves on. The newcomers are not tried again until they join again (a node
      // without the file would otherwise be asked on every change of the roster).
      std::lock_guard<std::mutex> lock(view_m_);
      for (const auto& n : nodes)
        if (std::find(view.planned_over.begin(), view.planned_over.end(), n.id) == view.planned_over.end()) excluded_.insert(n.id);
    }
    say(fmt::format("re-plan failed: {}", p.error().message));
    return tl::unexpected(p.error());
  }
  install(std::move(*p), ids_of(nodes));
  std::string where;
  for (const auto& s : stages()) where += fmt::format("{}layers {}-{} on {}", where.empty() ? "" : ", ", s.first_layer, s.end_layer - 1, s.node.substr(0, 8));
  say(fmt::format("re-planned: {}", where));
  return {};
}

void failover_pipeline::maintain() {
  std::lock_guard<std::mutex> plan(plan_m_);
  (void)replan_if_needed();
}

void failover_pipeline::on_roster(const roster_event& e) {
  {
    std::lock_guard<std::mutex> lock(view_m_);
    // A node that joins (again) is a fresh start; one that left is not used until it does.
    if (e.what == roster_event::kind::joined) excluded_.erase(e.peer);
    else excluded_.insert(e.peer);
  }
  maintain();
}

int64_t failover_pipeline::replans() const {
  std::lock_guard<std::mutex> lock(view_m_);
  return replans_;
}

std::vector<serving::model_stage_info> failover_pipeline::stages() const {
  std::lock_guard<std::mutex> lock(view_m_);
  return stage_info_;
}

template <class T, class Step>
expected<T> failover_pipeline::with_failover(std::span<const int64_t> slots, Step run_step) {
  std::optional<error> lost;  // the last loss, for the message when no re-plan helps
  for (int replans = 0;; ++replans) {
    {
      std::shared_lock<std::shared_mutex> step(step_m_);
      if (current_) {
        // New stages (a re-plan since the last step) start empty: each sequence so far goes in
        // first, as one prefill.
        std::optional<size_t> failed;
        expected<std::vector<float>> caught_up = std::vector<float>{};
        for (const int64_t slot : slots) {
          const auto& h = history_[static_cast<size_t>(slot)];
          if (current_->position(slot) == static_cast<int64_t>(h.size())) continue;
          current_->reset(slot);
          if (!h.empty()) caught_up = current_->prefill(slot, h, &failed);
          if (!caught_up) break;
        }
        expected<T> out = caught_up ? run_step(*current_, &failed) : expected<T>(tl::unexpected(caught_up.error()));
        if (out) return out;
        const bool remote = failed && current_->stages()[*failed].node != o_.self.id.to_string();
        if (!remote || !is_stage_loss(out.error())) return out;
        lost = out.error();
        auto gone = node_id::parse(current_->stages()[*failed].node);
        std::lock_guard<std::mutex> lock(view_m_);
        if (gone) excluded_.insert(*gone);
        say(fmt::format("lost a stage: {}", lost->message));
      }
    }
    if (replans >= o_.max_replans_per_step)
      return make_error(error_code::unavailable, fmt::format("{}; gave up after {} re-plans", lost ? lost->message : "no stages", replans));
    std::lock_guard<std::mutex> plan(plan_m_);
    if (auto ok = replan_if_needed(); !ok)
      return make_error(error_code::unavailable, fmt::format("{}; no re-plan over the nodes left: {}",
                                                             lost ? lost->message : "the model lost a stage node", ok.error().message));
  }
}

// A slot's history is touched only by that slot's steps and resets, which never overlap (the model
// host steps disjoint slots at once, never one slot twice): read here without a lock.
int64_t failover_pipeline::position(int64_t slot) const { return static_cast<int64_t>(history_.at(static_cast<size_t>(slot)).size()); }

void failover_pipeline::reset(int64_t slot) {
  std::shared_lock<std::shared_mutex> step(step_m_);
  history_.at(static_cast<size_t>(slot)).clear();
  if (current_) current_->reset(slot);
}

expected<std::vector<float>> failover_pipeline::decode(int32_t token) { return prefill(0, std::span<const int32_t>(&token, 1)); }

expected<std::vector<float>> failover_pipeline::prefill(int64_t slot, std::span<const int32_t> tokens) {
  if (slot < 0 || slot >= slots())
    return make_error(error_code::invalid_argument, fmt::format("pipeline: slot {} does not exist (it holds {})", slot, slots()));
  if (tokens.empty()) return make_error(error_code::invalid_argument, "pipeline: no tokens to run");
  if (position(slot) + static_cast<int64_t>(tokens.size()) > context_)
    return make_error(error_code::limit_exceeded, fmt::format("pipeline: {} more tokens after {} would pass the context of {} positions",
                                                              tokens.size(), position(slot), context_));
  const int64_t touched[] = {slot};
  return with_failover<std::vector<float>>(touched, [&](models::pipeline& p, std::optional<size_t>* failed) -> expected<std::vector<float>> {
    auto out = p.prefill(slot, tokens, failed);
    if (out) history_[static_cast<size_t>(slot)].insert(history_[static_cast<size_t>(slot)].end(), tokens.begin(), tokens.end());
    return out;
  });
}

expected<std::vector<std::vector<float>>> failover_pipeline::decode(std::span<const models::slot_token> batch) {
  // The pipeline checks the batch (slots, context) before any stage runs: those errors come back
  // from the first try, with nothing re-planned.
  std::vector<int64_t> touched;
  for (const auto& e : batch)
    if (e.slot >= 0 && e.slot < slots()) touched.push_back(e.slot);  // others: the pipeline's error
  return with_failover<std::vector<std::vector<float>>>(touched, [&](models::pipeline& p, std::optional<size_t>* failed) -> expected<std::vector<std::vector<float>>> {
    auto out = p.decode(batch, failed);
    if (out)
      for (const auto& e : batch) history_[static_cast<size_t>(e.slot)].push_back(e.token);
    return out;
  });
}

}  // namespace mesh::generation
