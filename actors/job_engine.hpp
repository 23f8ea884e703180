#pragma once
/// The job logic of a node, without I/O: the coordinator side (plan a submitted graph over the
/// live devices, ship stage fragments, collect results, re-plan when a worker dies) and the worker
/// side (wait for a stage's activations, hand it to the executor, route its outputs).
///
/// A stage's inputs come from two senders: its fragment from the coordinator (run_stage) and its
/// activations from the nodes of the stages that feed it. They are ordered through the
/// coordinator: the consumer accepts its stage (stage_accepted), the coordinator opens the route
/// (route_open) on the producer, and only then does the producer send; so an activation never
/// reaches a node before its stage, and no node keeps values for stages it does not know.
///
/// The actor shell feeds it decoded messages, peer changes and executor results, and carries out
/// what it returns: messages to send and stages to execute. Any node can coordinate; a node is
/// also a worker of its own plans (messages to itself are returned like any other).
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "actors/refused_message.hpp"
#include "wire/messages.hpp"
#include "graph/cost.hpp"
#include "graph/evaluate.hpp"
#include "graph/planner.hpp"
#include "graph/validate.hpp"

namespace mesh {

/// A message for the shell to send (to == self is delivered locally by the shell).
struct outbound {
  node_id to;
  msg::message m;
};

/// A stage ready to run on this node's executor.
struct stage_task {
  node_id coordinator;
  uint64_t job = 0;
  uint32_t attempt = 0;
  uint32_t stage = 0;
  std::shared_ptr<const graph> g;  ///< validated fragment
  tensor_map inputs;     ///< job inputs and arrived activations, by input name
  tensor_map params;     ///< the fragment's parameters
  std::vector<msg::route> routes;
  /// Non-empty for inference sessions: the parameters are named uniquely for the session and
  /// need uploading only once per executor (this key says which upload they belong to).
  std::string resident_key;
};

/// How long a coordinator waits for a stage once its inputs are ready before it treats the
/// stage's node as failed for its jobs: `factor` times the planner's estimate of the stage (from
/// the node's measured speed, compute plus receiving its inputs), at least `floor` (which covers
/// compiling the fragment and uploading its parameters, which the estimate leaves out).
struct stage_deadlines {
  double factor = 20;
  std::chrono::seconds floor{30};
  /// A node that missed a deadline gets no stage of any job for this long (or until it connects
  /// again): it heartbeats, so only this keeps the planner from giving it the re-plan's stage.
  std::chrono::seconds bench{60};
};

class job_engine {
 public:
  /// `self` is this node's id. The graphs it receives were validated against the node's
  /// graph_limits when their messages were decoded (wire/graph_payload.hpp).
  /// `first_job` numbers this engine's jobs and sessions from there: a node passes a value of
  /// its start time, so that a restarted coordinator's job 1 is never taken by a worker for the
  /// job 1 of its previous life (workers remember cancelled jobs and cached fragments by id).
  job_engine(node_id self, device_profile own, uint64_t first_job = 1, stage_deadlines deadlines = {});

  /// A worker joined (its hello arrived), or joined again after a restart: what this node kept
  /// of the jobs and sessions it coordinated before is dropped.
  void peer_up(const node_id& id, const device_profile& p);
  /// The engine reads no clock: every entry point that may need the time is given it (the
  /// node's shell passes the steady clock; tests may pass simulated time).
  using clock = std::chrono::steady_clock;

  /// A worker died (health said Dead) or left: jobs that used it are re-planned over the rest.
  std::vector<outbound> peer_dead(const node_id& id, clock::time_point now);

  /// Called every second or so: a stage past its deadline (stage_deadlines) makes the jobs and
  /// sessions on its node re-plan without it, as if it had died; the node is benched.
  std::vector<outbound> tick(clock::time_point now);

  /// A message from `from` (already decoded), received at `now`. Returns what to send.
  std::vector<outbound> on_message(const node_id& from, const msg::message& m, clock::time_point now);

  /// Stages whose inputs have all arrived; the shell runs them and calls on_executed.
  std::vector<stage_task> take_ready();
  /// Resident keys (stage_task::resident_key) of session fragments this worker let go (the
  /// session closed, its client or coordinator died, or the cache made room): the shell frees
  /// their programs and parameters on the executor.
  std::vector<std::string> take_forgotten() { return std::exchange(forgotten_, {}); }
  /// The executor's result for a task from take_ready().
  std::vector<outbound> on_executed(const stage_task& t, const expected<tensor_map>& outputs, clock::time_point now);
  /// Messages refused since the last call for their sender's lack of authority (an activation
  /// from a node that does not run the stage producing it), and nodes benched for missing a
  /// stage's deadline (kind "run_stage deadline"); the shell logs and counts them.
  std::vector<refused_message> take_refused() { return std::exchange(refused_, {}); }

  /// Jobs this node coordinates, for status.
  std::vector<msg::job_status> jobs(clock::time_point now) const;
  size_t running_stages() const { return waiting_.size() + executing_; }
  std::vector<node_id> workers() const;

 private:
  struct job_record {
    node_id client;
    uint64_t client_job = 0;
    std::shared_ptr<const graph> g;
    tensor_map tensors;   ///< one-shot: inputs and parameters; session call: inputs
    uint64_t session = 0;  ///< internal session id for an inference call, else 0
    strategy kind = strategy::pipeline;  ///< as asked (automatic: chosen at each planning)
    uint32_t attempt = 0;
    // One-shot jobs: the graph and tensors as submitted, the plan made for them and the nodes it
    // was made over (for re-planning when one dies); `g`, `current` and `stage_tensors` are the
    // stages that plan became (graph/staged_plan.hpp; for a pipeline plan the same graph).
    std::shared_ptr<const graph> source;
    plan source_plan;
    std::vector<node_id> plan_nodes;
    tensor_map stage_tensors;  ///< empty when the stages bind `tensors` as they are
    uint32_t stages_done = 0;
    plan current;
    std::vector<node_id> stage_nodes;  ///< node id per stage of `current` ("" = empty stage)
    std::set<uint32_t> pending;            ///< stages not done yet
    clock::time_point launched{};          ///< when this attempt's stages went out
    std::map<uint32_t, clock::time_point> done_at;  ///< this attempt's finished stages
    std::set<std::pair<uint32_t, uint32_t>> links;  ///< (producer, consumer) stages of this attempt
    tensor_map outputs;
    job_state state = job_state::planning;
    clock::time_point started{};
    double seconds = 0;
  };
  /// A model loaded across a pipeline of peers for repeated calls.
  struct session_state {
    node_id client;
    uint64_t client_session = 0;
    std::shared_ptr<const graph> g;
    tensor_map params;
    uint32_t epoch = 0;  ///< bumped on every re-plan: workers cache fragments per epoch
    plan current;
    std::vector<node_id> stage_nodes;
    std::vector<graph> fragments;            ///< parameters renamed to be unique to the session
    std::vector<tensor_map> fragment_params;
    std::set<std::pair<node_id, uint32_t>> loaded;  ///< (node, stage) holding this epoch's fragment
  };
  struct waiting_stage {
    stage_task task;
    std::map<std::string, node_id> awaited;  ///< cut values still to come, each from the node producing it
  };
  using stage_key = std::tuple<node_id, uint64_t, uint32_t, uint32_t>;  // coordinator, job, attempt, stage

  std::vector<outbound> submit(const node_id& client, const msg::submit_job& s);
  std::vector<outbound> open(const node_id& client, const msg::open_session& o);
  std::vector<outbound> call(const node_id& client, const msg::infer& c);
  /// (Re)starts a job over plan `p` (one-shot jobs) or over its session's plan (calls).
  std::vector<outbound> launch(uint64_t id, job_record& j, const std::vector<node_id>& nodes, expected<plan> p);
  expected<void> plan_session(uint64_t id, session_state& s, const std::vector<node_id>& nodes, expected<plan> p);
  /// Ends a job: its result (the outputs, or `outcome`'s error) goes to the client.
  std::vector<outbound> finish(uint64_t id, job_record& j, const expected<void>& outcome);
  /// The plan for a one-shot job over `nodes`: its strategy, or for automatic the cheapest plan
  /// that can run as stages.
  expected<plan> plan_job(const job_record& j, const std::vector<node_id>& nodes) const;
  /// Makes `p` (over `nodes`) the job's plan and turns it into stages.
  expected<void> adopt_plan(job_record& j, const std::vector<node_id>& nodes, plan p);
  /// A one-shot job's plan after `dead` died: survivors keep their part when every node of the
  /// old plan but `dead` is still live, else a fresh plan. `nodes` receives the device list.
  expected<plan> replan_job(const job_record& j, const node_id& dead, std::vector<node_id>& nodes) const;
  std::vector<device_profile> profiles_of(const std::vector<node_id>& nodes) const;
  /// Registers a new job (or session call) of `client` and returns its internal id.
  uint64_t new_job(const node_id& client, uint64_t client_job, std::shared_ptr<const graph> g, tensor_map tensors,
                   uint64_t session);
  std::vector<outbound> on_run_stage(const node_id& from, const msg::run_stage& r);
  std::vector<outbound> on_activation(const node_id& from, const msg::activation& a);
  std::vector<outbound> on_stage_accepted(const node_id& from, const msg::stage_accepted& a);
  std::vector<outbound> on_route_open(const node_id& from, const msg::route_open& o);
  std::vector<outbound> on_stage_done(const node_id& from, const msg::stage_done& d);
  /// This node and the peers that are not benched, with their profiles: what plans are made over.
  void live_devices(std::vector<node_id>& ids, std::vector<device_profile>& profiles) const;
  /// Whether a plan may give `n` a stage: this node, or a connected peer that is not benched.
  bool usable(const node_id& n) const;
  /// Coordinator side: re-plans every running job and session with a stage on `gone`, which is no
  /// longer among the live devices; `old_ids` are the live devices before (the plans' order).
  /// `why` completes "node X ..." in the error of a session that cannot be re-planned.
  std::vector<outbound> replan_without(const node_id& gone, const std::vector<node_id>& old_ids, const std::string& why);
  /// The deadline of stage `s` of job `j`'s current attempt, counted from when its inputs are ready.
  clock::duration stage_deadline(const job_record& j, uint32_t s) const;
  void promote_ready(const stage_key& k);

  node_id self_;
  clock::time_point now_{};  ///< the time the current entry point was given
  device_profile own_;
  stage_deadlines deadlines_;
  std::map<node_id, device_profile> peers_;
  std::map<node_id, clock::time_point> benched_;  ///< missed a stage deadline: no stages until then
  uint64_t next_job_ = 1;
  std::map<uint64_t, job_record> jobs_;               // coordinated here, by internal id
  std::map<std::pair<node_id, uint64_t>, uint64_t> by_client_;  // (client, client job) -> id
  std::map<uint64_t, session_state> sessions_;       // by internal id
  std::map<std::pair<node_id, uint64_t>, uint64_t> sessions_by_client_;
  struct cached_fragment {
    std::shared_ptr<const graph> g;
    tensor_map params;
    uint64_t last_use = 0;  ///< use_clock_ at the last call: the least recently used goes first
  };
  using cache_key = std::tuple<node_id, uint64_t, uint32_t>;  // coordinator, session << 16 | epoch, stage
  /// Forgets a cached fragment (worker side) and queues its resident key for the executor.
  void drop_cached(std::map<cache_key, cached_fragment>::iterator it);
  /// Session `session` of coordinator `coordinator` closed: forgets its fragments.
  void forget_session(const node_id& coordinator, uint64_t session);
  /// Forgets the cached fragments whose key `which` picks.
  void forget_fragments(const std::function<bool(const cache_key&)>& which);
  /// Coordinator side: ends session `id` (its client closed it, died, or it cannot be re-planned)
  /// and tells its stage nodes to let its fragments go.
  std::vector<outbound> end_session(uint64_t id, const node_id& skip_node = {});
  std::vector<outbound> on_cancel_stages(const node_id& from, const msg::cancel_stages& c);
  /// Worker side: everything kept for jobs and sessions coordinated by `id` (it died, or restarted).
  void forget_coordinator(const node_id& id);
  /// Stages of fragment `resident_key` still waiting or ready run as one-shot stages (nothing of
  /// theirs stays on the device once the fragment was let go).
  void unpin(const std::string& resident_key);
  std::map<cache_key, cached_fragment> cache_;  // worker side
  uint64_t use_clock_ = 0;
  std::vector<std::string> forgotten_;
  /// (coordinator, job) -> the highest attempt cancelled: a stage of it still on its way (sent
  /// before the coordinator re-planned, or from another attempt) is ignored.
  std::map<std::pair<node_id, uint64_t>, uint32_t> cancelled_;
  /// (coordinator, session) closed: a call of it that arrives late is refused, not cached.
  std::set<std::pair<node_id, uint64_t>> closed_;
  std::map<stage_key, waiting_stage> waiting_;       // worker side
  /// A stage's routes (producer side), from its run_stage until every routed value was sent: a
  /// value goes out once the stage ran and the coordinator opened the route (its consumer
  /// accepted its own stage). Holds only this node's own outputs.
  struct stage_outbox {
    std::vector<msg::route> routes;   ///< not sent yet
    std::set<uint32_t> open;          ///< consumer stages that accepted
    std::optional<tensor_map> values; ///< the routed outputs, once the stage ran
  };
  std::map<stage_key, stage_outbox> outbox_;
  /// Sends the values of the open routes of a stage that ran; forgets the stage when all went.
  std::vector<outbound> send_open_routes(std::map<stage_key, stage_outbox>::iterator it);
  std::deque<stage_task> ready_;
  size_t executing_ = 0;
  std::vector<refused_message> refused_;
};

}  // namespace mesh
