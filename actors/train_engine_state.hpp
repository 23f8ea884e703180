#pragma once
// Internal to the training engine (the actors/train_*.cpp files, nobody else): a run's state on
// its two sides (coord_run, worker_run), the engine's limits, and the small helpers more than
// one of those files uses.
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "actors/host_reduce.hpp"
#include "actors/train_engine.hpp"
#include "gpu/executor.hpp"

namespace mesh {
namespace train_detail {

inline constexpr size_t max_refused_runs = 64;     // runs whose setup this node refused, remembered
inline constexpr int ring_pieces = 4;              // pieces per chunk: pipelining within a round
inline constexpr int max_failures = 3;             // of one worker in one run, before it is left out
inline constexpr size_t max_orphans = 4;           // runs kept after their coordinator died, for a takeover
inline constexpr size_t max_runs_per_coordinator = 8;  // live runs one coordinator may set up on a node
inline constexpr std::chrono::seconds probe_wait{5};    // for the answers to a stalled round's probe

inline uint64_t round_id(uint64_t step, uint32_t attempt) { return (step << 16) | (attempt & 0xffffu); }

/// Parameters of run `id` coordinated by `coordinator` carry this prefix on every device, so that
/// runs sharing a device never mix state. Workers derive it too (to undo it for a takeover).
/// The coordinator's whole id, never its 8-digit short form: a peer can grind a key whose short
/// form matches another coordinator's and so name (and overwrite) that run's tensors.
inline std::string run_prefix(const node_id& coordinator, uint64_t id) {
  return "tr." + coordinator.to_string() + "." + std::to_string(id) + ".";
}

/// The prefix of the same run's gradient accumulators on a worker's device (accumulating() in
/// train_worker.cpp).
inline std::string accumulator_prefix(const node_id& coordinator, uint64_t id) {
  return "acc." + coordinator.to_string() + "." + std::to_string(id) + ".";
}

inline bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

inline tensor_map to_map(const std::vector<named_tensor>& ts) {
  tensor_map m;
  for (const auto& t : ts) m[t.name] = t.value;
  return m;
}

/// The graph `p` with every parameter named `from` + x renamed to `to` + x (absent stays absent).
graph_payload rename_parameters(const graph_payload& p, const std::string& from, const std::string& to);

/// The shards a run's micro-batches draw from: a dataset's (cut by its rows), or a data file's,
/// which the workers cut themselves into one shard per micro-batch slot.
inline shard_plan plan_of(const msg::train_spec& s) {
  if (!s.text.empty()) return {s.micro_batches, s.micro_batches, 1};
  return shard_plan::make(static_cast<int64_t>(s.dataset_rows), s.micro_batch, s.micro_batches);
}

/// With MESH_TRAIN_TIMING=1 in the environment: "train timing: <ms on the steady clock> <what>"
/// on standard error, where a step's time goes (benchmarks read it from the node's log).
bool timing_enabled();
void timing(const std::string& what);
/// The timing line of bucket `b` of `step` on a worker: "step 6 worker: bucket 3 <what>".
std::string bucket_line(uint64_t step, int b, const char* what);

}  // namespace train_detail

// ---- the two sides' state ----

struct train_engine::coord_run {
  node_id client;
  uint64_t client_train = 0;
  /// The client's grant this node coordinates under (generation 0: the client opened the run
  /// here); every setup it sends carries it.
  msg::takeover_grant takeover;
  msg::train_spec spec;  ///< renamed; `state` is refreshed when newcomers are set up; no dataset rows
  tensor_map data;       ///< the whole dataset: the coordinator hands out its shards
  shard_plan plan;
  std::vector<int64_t> permutation;  ///< shard_permutation of the dataset's rows
  std::map<node_id, std::set<uint32_t>> shards_sent;  ///< per member (of its current setup)
  std::map<uint32_t, node_id> slot_owner;  ///< micro-batch slot j of every step -> member
  std::vector<node_id> members;
  std::set<node_id> newcomers;
  bool checkpoint_due = false;  ///< the state being fetched goes to the client too
  std::map<node_id, int> failures;
  enum class phase { stepping, syncing, finishing } ph = phase::stepping;
  uint64_t step = 0;
  uint32_t attempt = 0;
  uint64_t commit = 0;
  std::vector<node_id> ring;
  std::set<node_id> waiting;   ///< members whose reduction of this step is still to come
  std::set<node_id> unready;   ///< members that have not said train_ready for this step
  double loss = 0;
  /// The loss of each step so far, for the dashboard; past max_loss_curve points every other one
  /// is dropped (the curve keeps its shape at half the resolution).
  std::vector<double> losses;
  static constexpr size_t max_loss_curve = 2048;
  uint64_t bytes = 0;
  std::string prefix;
  job_state state = job_state::running;
  clock::time_point started{}, last_step{};
  clock::time_point step_issued{};      ///< when the current attempt of the step went out
  clock::time_point all_ready_at{};     ///< when its last member said ready (ring_go went out)
  std::vector<double> step_seconds;     ///< the last decided steps' durations (step_deadlines::window)
  std::set<node_id> proven;             ///< members that finished a step of this run
  std::set<node_id> left_out;           ///< missed a deadline: not set up again unless they reconnect
  uint64_t stalled_step = ~0ull;        ///< the step whose ring stalled once (step_overdue)
  /// The ring whose members all said, in their train_ready of its last step, that they map each
  /// other's shared regions (train_step::host_reduce for its next step); empty: none such.
  std::vector<node_id> local_ring;
  bool step_not_local = false;  ///< a member of this step's ring said it is not (train_ready)
  bool host_reduce_step = false;  ///< the current step was issued with train_step::host_reduce
  /// A host all-reduce step stalled: the run keeps the ring from then on (its stall handling can
  /// tell which member to blame; marks to every member cannot).
  bool host_reduce_off = false;
  /// A stalled round's probe (step_overdue): when it went out and what each member answered.
  bool probing = false;
  clock::time_point probe_sent{};
  std::map<node_id, uint32_t> pieces_taken;
  std::optional<std::chrono::steady_clock::time_point> client_lost_at;  ///< its connection went down
  double seconds = 0;
};

struct train_engine::worker_run {
  node_id coordinator;
  uint64_t train = 0;
  node_id client;          ///< who opened the run: the only one that may resume it
  uint64_t client_train = 0;
  uint32_t generation = 0;  ///< of the setup's takeover grant (0: none)
  msg::train_spec shell;       ///< the setup's spec without dataset and state (for a takeover)
  msg::takeover_grant takeover;  ///< from train_resume, checked: this node takes the run over with it
  bool orphaned = false;       ///< the coordinator died; kept for a train_resume
  /// The coordinator finished the run (its stop carried the last commit). Kept for
  /// train_engine::client_grace: should the coordinator die before the client has the result,
  /// this node can still take the run over (it redoes the last step, whose result it holds).
  std::optional<std::chrono::steady_clock::time_point> finished_at;
  train_method method = train_method::data_parallel;
  uint64_t steps = 0;
  uint32_t micro_batches = 1, inner_steps = 1;
  uint32_t fragments = 1;  ///< DiLoCo: streaming fragments (train_spec::fragments)
  uint32_t fragment = 0;   ///< the fragment this step synchronises
  uint32_t overlap_steps = 0;  ///< DiLoCo: inner steps run while the round travels (train_spec::overlap_steps)
  uint64_t loss_steps = 1;     ///< inner steps whose losses the round's all-reduce sums
  wire_format format = wire_format::f32;
  train_graphs graphs;
  uint64_t seed = 0;
  int64_t micro_batch = 1;
  shard_plan plan;
  /// The dataset shards received so far (immutable once here: device work shares them).
  std::map<uint32_t, std::shared_ptr<const tensor_map>> shards;
  std::vector<named_tensor> resume_dataset;  ///< from train_resume, for the takeover
  /// A run on a data file: what the workers read, and the node that offers it (the coordinator).
  std::shared_ptr<const msg::train_text_data> text;
  std::vector<std::string> state_names, local_names;  ///< all state; DiLoCo: the local part

  /// Touched only by the device work, which runs one task at a time on the executor.
  struct device_side {
    bool loaded = false;
    tensor_map initial;  ///< uploaded with the first task
    gpu::program_id delta = 0, outer = 0;
    gpu::program_id acc_first = 0, acc_more = 0;  ///< see accumulating()
    gpu::program_id apply_resident = 0;  ///< the optimizer on the accumulators (resident_apply())
    bool grads_resident = false;         ///< the accumulators hold the last step's gradients, not sent
    std::vector<gpu::program_id> programs;         ///< all of the above that were loaded
    std::vector<std::string> acc_names;
    std::map<uint32_t, data_order> orders;  ///< each shard's epoch order
    std::unique_ptr<text_data_reader> text;  ///< a run on a data file: opened with the first step
    /// Data parallel in buckets: the gradient programs cut per bucket (train_buckets.hpp), for a
    /// step's first micro-batch and for later ones; the step's last micro-batch runs them, one
    /// task per bucket, with these inputs, and its first task leaves the loss sum here.
    std::vector<gpu::program_id> seg_first, seg_more;
    std::vector<std::vector<std::string>> seg_first_inputs, seg_more_inputs;  ///< what each reads
    /// Streaming DiLoCo: the outer step of each fragment alone.
    std::vector<gpu::program_id> outer_fragment;
    tensor_map last_inputs;
    bool last_first = true;
    double loss_sum = 0;
    /// Host buffers the gradients of each bucket are read into, and get back once a commit has
    /// written their sum to the device: reused step after step, so a step allocates and
    /// first-touches no memory for the hundreds of MB of a large model's gradients.
    std::vector<std::vector<float>> spare;
    /// Why a bucket's sum could not be written as its round ended (train_engine::write_bucket):
    /// the commit of that step fails with it rather than apply the bucket's own gradients. A
    /// step's gradients computed again clear it.
    std::optional<error> unwritten;
    /// The node logged that its buckets' copies run beside the kernels (once a run).
    bool overlap_noted = false;
    uint64_t snapshot_step = ~0ull;  ///< DiLoCo: local state at the start of this step
    tensor_map snapshot;
  };
  std::shared_ptr<device_side> dev = std::make_shared<device_side>();

  uint64_t applied = 0;  ///< steps before this one are applied
  struct held_result {
    uint64_t end = 0;  ///< the step the state reaches when this result is applied
    /// Each bucket's sum (one bucket unless data parallel in buckets), without the loss; every
    /// bucket empty for a ring of one (its gradients stay in the accumulators).
    std::vector<std::vector<float>> sum;
    /// Data parallel in buckets: a bucket whose `sum` is empty went into the accumulators as its
    /// round ended (train_engine::write_bucket); the others are written at commit.
    bool written = false;
    uint32_t participants = 1;
    uint32_t fragment = 0;  ///< DiLoCo: whose deltas `sum` holds (all, with one fragment)
  };
  std::optional<held_result> held;
  /// The loss sum the last bucket ended with, when that bucket was taken by write_bucket.
  std::optional<float> bucket_loss;
  uint64_t step = 0;
  uint32_t attempt = 0;
  uint64_t step_end = 0;
  uint32_t participants = 1;
  std::vector<node_id> ring;
  int rank = -1;
  /// The step's round, made when the step arrives (so it takes the predecessor's pieces while
  /// this node computes); it starts once this node's contribution is computed and the
  /// coordinator said every member is ready (ring_go).
  std::unique_ptr<bucketed_allreduce> round;
  bool go = false;
  /// This node's buckets computed and not yet started (waiting for the go).
  std::map<int, std::vector<float>> contribution;
  /// All-reduce pieces through shared memory (train_engine::set_shared_memory). This worker's
  /// region, for the pieces it sends its successor: each step's pieces take it from the start
  /// (the successor has read every piece of a step before the coordinator issues the next, and
  /// a piece of an attempt given up is read into a round that is dropped).
  std::shared_ptr<shared_region> region;
  bool region_failed = false;  ///< making it failed: pieces travel in their messages
  uint64_t region_used = 0;    ///< bytes this step's pieces take
  /// Per member offered the region (the successor; with host_reduce_possible every member):
  /// whether it mapped it (absent: not offered yet), and how many offers it has turned down (an
  /// offer may come before its setup: offered again at later steps, up to max_region_offers).
  std::map<node_id, bool> mapped_by;
  std::map<node_id, int> region_offers;
  static constexpr int max_region_offers = 4;
  /// The regions of other members mapped here, by sender (the latest each named).
  std::map<node_id, std::shared_ptr<shared_region>> peer_regions;
  /// The step's all-reduce through every member's region (train_step::host_reduce), in place of
  /// `round`: the device reads each bucket into this node's region, whose input area `direct`
  /// lays out; `posted` holds the buckets there whose marks wait for the go.
  std::unique_ptr<host_reduce> direct;
  uint64_t direct_base = 0;  ///< its buckets' round ids: direct_base + bucket
  /// The regions `direct` reads, by rank: kept mapped while it (or a bucket write) may read them,
  /// whatever replaces them in peer_regions.
  std::vector<std::shared_ptr<shared_region>> direct_regions;
  bool direct_noted = false;  ///< the node logged that this run reduces through the regions
  std::vector<int> posted;
  bool broken = false;
  bool device_lost = false;  ///< the executor was restarted: nothing of this run is on the device
  bool stopping = false;
};

}  // namespace mesh
