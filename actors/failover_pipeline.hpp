#pragma once
/// A split model that outlives its stage nodes (docs/serving.md, "Split over the mesh"): it
/// drives a models::pipeline and, when a stage's node is lost, plans the layers again over the
/// nodes left (each loading its new range from its own copy of the checkpoint), prefills the new
/// stages with the sequence so far (the prompt and the tokens generated) and runs the step that
/// failed, so that generate() sees one slow step instead of an error. When a node joins a model
/// that runs on fewer nodes than it asked for, the new plan is built beside the old one while
/// the old one serves, and takes over between two steps. No CAF: the roster
/// (actors/split_roster.hpp) brings the health view's news; when and over whom to re-plan is
/// decided by actors/split_replan.hpp.
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <span>
#include <string>
#include <vector>

#include "actors/split_replan.hpp"
#include "actors/split_roster.hpp"
#include "models/pipeline.hpp"
#include "serving/local_backend.hpp"

namespace mesh::generation {

struct failover_options {
  /// Plans the model over `nodes` (in that order) and opens its stages. Called with nothing
  /// locked; it must hold `device` exclusively while it uses this node's executor (running
  /// steps, whose local stage uses it, hold it shared).
  std::function<expected<std::unique_ptr<models::pipeline>>(const std::vector<split_candidate>& nodes, std::shared_mutex& device)> open;
  split_candidate self;
  /// The nodes of the first plan (self first); its size is the width the split asked for.
  std::vector<split_candidate> nodes;
  /// The peers alive now, with their free memory (null: the first plan's peers as they were
  /// then, less those lost since).
  std::shared_ptr<split_roster> roster;
  /// Device memory a stage of these layers takes (weights and KV caches). A re-plan after a loss
  /// drops the stages left first, so it counts what they held on their nodes as free again:
  /// a peer's report of its free memory may be a heartbeat older than the drop.
  std::function<int64_t(const models::layer_range&)> stage_bytes;
  /// Re-plans one step may go through before its error is the request's (each loses a node).
  int max_replans_per_step = 4;
  /// One line per re-plan and per failed one (the node's log).
  std::function<void(const std::string&)> log;
};

class failover_pipeline final : public serving::split_sequence {
 public:
  /// The first plan over `o.nodes`, holding `slots` sequences (open must make pipelines of that
  /// many); its errors are open's (naming the node and the path).
  static expected<std::unique_ptr<failover_pipeline>> create(failover_options o, const models::model_config& config, int64_t context,
                                                             int64_t slots = 1);
  ~failover_pipeline() override;

  /// Runs the step; a lost stage node re-plans (at most max_replans_per_step times) and the
  /// step runs again on the new stages after each of its sequences is prefilled into them with
  /// its tokens so far. Steps on disjoint slots may run at once from several threads
  /// (models::pipeline). A loss with no plan over the nodes left is an unavailable error saying both:
  /// what was lost and why nothing fits.
  expected<std::vector<float>> prefill(int64_t slot, std::span<const int32_t> tokens) override;
  expected<std::vector<std::vector<float>>> decode(std::span<const models::slot_token> batch) override;
  void reset(int64_t slot) override;
  int64_t position(int64_t slot) const override;
  int64_t slots() const override { return static_cast<int64_t>(history_.size()); }
  expected<std::vector<float>> prefill(std::span<const int32_t> tokens) override { return prefill(0, tokens); }
  expected<std::vector<float>> decode(int32_t token) override;
  void reset() override { reset(0); }
  int64_t position() const override { return position(0); }
  int64_t context() const override { return context_; }
  const models::model_config& config() const override { return config_; }
  std::vector<serving::model_stage_info> stages() const override;

  /// Re-plans now if a stage node is gone or the model can widen (the roster's thread calls it
  /// on each change; tests call it directly). Requests go on meanwhile; see the class comment.
  void maintain();
  /// Re-plans completed since creation (for tests and logs).
  int64_t replans() const;
  /// serving::split_sequence::replan: a plan over `nodes` nodes, opened beside the current one.
  expected<void> replan(size_t nodes) override;

 private:
  failover_pipeline() = default;
  /// Runs `step` on the current pipeline, re-planning on the loss of a stage node (see prefill).
  /// Before each try, each of `slots` (those the step touches) that the pipeline does not hold
  /// as history_ says (new stages after a re-plan start empty) is reset and prefilled there with
  /// its tokens so far.
  template <class T, class Step>
  expected<T> with_failover(std::span<const int64_t> slots, Step step);
  void on_roster(const roster_event& e);
  std::vector<split_candidate> live() const;
  /// Under plan_m_: re-plans if replan_needed says so; the error says why no plan was made.
  expected<void> replan_if_needed();
  /// Under plan_m_: plans over replan_nodes(view, peers, excluded) for `cause` and installs it.
  /// A lost node drops the stages left first; otherwise the old plan serves until the new one
  /// is open, and stays if it fails (a widen's newcomers are then not tried again until they
  /// join again).
  expected<void> replan_over(replan_cause cause, const split_plan_view& view, const std::vector<split_candidate>& peers,
                             const std::set<node_id>& excluded);
  void install(std::unique_ptr<models::pipeline> p, std::vector<node_id> over);
  void say(const std::string& line) const;

  failover_options o_;
  models::model_config config_;
  int64_t context_ = 0;
  uint64_t subscription_ = 0;

  std::mutex plan_m_;  ///< one re-plan at a time; taken before step_m_, never after
  /// Shared by each step (steps on disjoint slots run at once: a pipeline of micro-batches);
  /// exclusive for the swap of current_ and for opening a stage on this node's executor.
  std::shared_mutex step_m_;
  std::unique_ptr<models::pipeline> current_;  ///< null after a loss until re-planned
  /// Each slot's sequence so far; a slot's entry is touched only by the step or reset of that
  /// slot (under step_m_ shared), so steps on other slots may run meanwhile.
  std::vector<std::vector<int32_t>> history_;

  mutable std::mutex view_m_;  ///< what listings and decisions read: a leaf lock
  std::vector<node_id> planned_over_, in_stages_;
  size_t want_ = 0;  ///< the nodes plans aim at: the first plan's, then replan()'s
  std::vector<serving::model_stage_info> stage_info_;
  std::set<node_id> excluded_;  ///< gone, failed a call, or refused a stage since they last joined
  int64_t replans_ = 0;
};

}  // namespace mesh::generation
