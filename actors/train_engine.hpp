#pragma once
/// Distributed training, without I/O: the coordinator side (drive the steps, keep the ring of
/// workers, re-form it when one dies or joins) and the worker side (compute a step's gradients
/// on the device, all-reduce them around the ring, apply the result only when told to commit).
///
/// A step, data parallel:
///   1. coordinator -> every ring member: train_step{s, micro-batches, ring, commit = s}
///      (commit: first apply the held result of step s-1).
///   2. each worker makes the step's all-reduce round (ring_allreduce.hpp) and says train_ready;
///      when every member has, the coordinator sends ring_go (so no piece ever reaches a node
///      before its round: the coordinator and the predecessor are two senders, and this orders
///      them). Each worker sums the gradients of its micro-batches and, with the go, runs the
///      round with its successor; the result is *held*, not applied. When every member of the
///      ring said (train_ready) that it maps every other's shared region, the coordinator's next
///      step with that ring carries host_reduce: the round goes through the regions instead
///      (host_reduce.hpp, host_reduce_mark to every member).
///   3. each worker -> coordinator: train_reduced. When all have answered, the step is decided
///      and the next train_step carries its commit.
/// A worker that dies before the decision makes the coordinator redo the step (attempt + 1) over
/// the survivors with the dead one's micro-batches redistributed; nobody applied anything, so no
/// step is lost or applied twice. Commits are idempotent (a step already applied is skipped).
/// DiLoCo runs the same protocol per outer step: H local AdamW steps, then the all-reduce of the
/// parameter deltas and, at commit, an outer Nesterov step.
///
/// A node joining mid-run (new, or restarted after a crash) is added at the next step boundary:
/// the coordinator's own worker reports its state after the commit, the newcomer is set up with
/// it, and the next step includes it.
///
/// The coordinator is also a worker (messages to itself go through the shell like any other).
///
/// Coordinator failover: when the coordinator dies, its workers keep their runs as orphans
/// (bounded), with the state they reached. The client, which lost its connection, connects to a
/// surviving member and sends train_resume; that node reads its own state after the last step it
/// applied (DiLoCo: from the snapshot taken at the start of the unfinished outer step) and opens
/// the rest of the run as a new run it coordinates, from that step, over every member. Its state
/// is a consistent point of the run (every step before it applied once, none after), so the
/// finished run equals an uninterrupted one; an unfinished step is simply redone, and progress
/// may report it twice. Other survivors' orphans are dropped when the new setup reaches them.
/// A coordinator that only lost its client keeps training for client_grace; a takeover
/// elsewhere (its setup reaching this node) stops the old run.
///
/// Authority: a worker's part of a run is keyed by its coordinator, so only that node may step
/// it or end it; all-reduce pieces are taken from the ring predecessor only, host all-reduce
/// marks from the step's ring members only, step answers only
/// from the step's ring members, the state only from this node's own worker. A takeover, which
/// ends the run everywhere else, needs the client's signed grant (wire/takeover_grant.hpp),
/// checked by the node taking over (train_resume) and by every node its setups reach. What is
/// refused for want of authority is collected for the shell to log and count (take_refused).
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "actors/host_reduce.hpp"
#include "actors/job_engine.hpp"
#include "actors/refused_message.hpp"
#include "wire/messages.hpp"
#include "actors/ring_allreduce.hpp"
#include "actors/shared_region.hpp"
#include "actors/train_data.hpp"
#include "actors/train_text.hpp"
#include "graph/validate.hpp"

namespace mesh {
namespace gpu {
class executor;
}

/// The graphs of a training run, decoded and checked against each other.
struct train_graphs {
  std::shared_ptr<const graph> grad, apply, delta, outer;  ///< delta/outer: DiLoCo only
  std::vector<std::string> grads;    ///< "grad.<p>" outputs of `grad`, in the all-reduce order
  std::vector<int64_t> grad_sizes;   ///< elements of each
  std::vector<shape> grad_dims;
  /// Data parallel: `grads` in the order the backward pass finishes them, cut into buckets:
  /// bucket b is grads [bucket_ends[b-1], bucket_ends[b]) (train_buckets.hpp). One bucket for
  /// DiLoCo, whose deltas travel once after the inner steps.
  std::vector<size_t> bucket_ends;
  std::vector<std::string> deltas;   ///< "delta.<p>" outputs of `delta` (DiLoCo)
  /// DiLoCo's fragments (train_spec::fragments): fragment f is deltas [fragment_ends[f-1],
  /// fragment_ends[f]), about equal in elements.
  std::vector<size_t> fragment_ends;
  std::vector<int64_t> delta_sizes;
  std::vector<shape> delta_dims;
};

/// Decodes and checks a spec (every graph valid, names and shapes consistent, the dataset
/// matching the gradient graph's inputs, the state covering every parameter). Errors say what
/// is wrong in words a client can act on. `with_rows`: the dataset has its rows (a client's
/// spec); otherwise only its columns' shapes (a setup: the rows come as shards with the steps,
/// spec.dataset_rows says how many there are).
expected<train_graphs> check_train_spec(const msg::train_spec& spec, bool with_rows = true);

/// Checks that `columns` are the inputs of the gradient graph `grad` (names, dtypes, shapes but
/// the number of rows) and returns the number of rows they share.
expected<int64_t> dataset_rows(const graph& grad, uint32_t micro_batch, const tensor_map& columns);

/// What a worker's device does for one train_step (run by the shell on the executor).
struct train_work_result {
  std::vector<float> buffer;  ///< to all-reduce: gradients or deltas, then loss sum and count
  tensor_map state;           ///< when report_state
  std::string note;           ///< for the node's log (what the device does with the shared regions)
  /// Set when the device may still be copying the task's bytes when the task returns (a bucket
  /// read into the node's shared region, a sum written from the regions: copies beside the
  /// kernels, gpu::executor::read_parameters_async): the result is handed to the engine only
  /// after this returned, and its error stands for the task's (finish_copies). It may run on any
  /// thread while the executor goes on with the next task.
  std::function<expected<void>()> copied;
};

/// `r` once its copies are done (train_work_result::copied): an error of theirs replaces it.
expected<train_work_result> finish_copies(expected<train_work_result> r);

struct train_task {
  node_id coordinator;
  uint64_t train = 0;
  uint64_t step = 0;
  uint32_t attempt = 0;
  bool takeover = false;  ///< reads the state an orphaned run resumes from (train_resume)
  bool report_state = false;  ///< the coordinator waits for this step's state (or its error)
  bool cleanup = false;       ///< frees an ended run's programs and parameters; no result to handle
  /// The step's gradients come in buckets, a task each (train_buckets.hpp): this task's bucket.
  /// Its result's buffer is that bucket (the last one ends with the loss sum and count).
  int bucket = 0;
  /// DiLoCo with overlap: this task runs the round's last inner steps, after its delta went to
  /// the all-reduce; its result carries nothing for the round.
  bool trailing = false;
  /// Data parallel in buckets: this task writes bucket `bucket`'s reduced sum into its
  /// accumulators (train_engine::write_bucket); its result carries nothing.
  bool bucket_write = false;
  std::function<expected<train_work_result>(gpu::executor&)> work;
};

/// Loss per step of training runs, by run id (the dashboard's curves).
using loss_curves = std::map<uint64_t, std::vector<double>>;

/// How long a coordinator waits for a step before it treats the members that did not finish it
/// as failed: derived from how long the run's recent steps took, so a slow run is not cut short
/// and a fast one does not wait minutes for a member that heartbeats but never computes.
struct step_deadlines {
  /// For a step with a member that has not finished a step of this run yet (its first step
  /// compiles the graphs and uploads the state, which measured steps say nothing about).
  std::chrono::seconds first{300};
  /// Otherwise `factor` times the longest of the last `window` steps, but at least `floor`.
  double factor = 8;
  size_t window = 8;
  std::chrono::seconds floor{10};
};

class train_engine {
 public:
  explicit train_engine(node_id self, step_deadlines deadlines = {});
  ~train_engine();

  /// A worker joined; it is used from the next step of every run.
  void peer_up(const node_id& id);

  /// Opens the bytes of a run's data file (msg::train_text_data) for this node's worker:
  /// `holder` offers it (the run's coordinator; this node itself when it coordinates). Called
  /// on the executor's thread, which the reads then block. Without an opener, runs on a data
  /// file fail their steps here (io_error).
  using data_opener = std::function<expected<models::byte_source>(const node_id& holder, const msg::train_text_data& text)>;
  void set_data_opener(data_opener opener) { opener_ = std::move(opener); }
  /// Memory shared with ring neighbours on this host (actors/shared_region.hpp): how a worker
  /// makes the region it puts its all-reduce pieces into, and maps its predecessor's. Without it
  /// (the default) every piece travels in its message; with it, a worker offers its region to
  /// its successor, and once the successor has mapped it (it is on this host) pieces go through
  /// the region and only their place travels (docs/training.md, "Peers on one host").
  struct shared_memory {
    std::function<expected<std::shared_ptr<shared_region>>(uint64_t data_bytes)> create;
    std::function<expected<std::shared_ptr<shared_region>>(const region_locator& where)> open;
  };
  void set_shared_memory(shared_memory s) { shared_ = std::move(s); }
  /// Regions of this process (shared_region::create / open).
  static shared_memory host_shared_memory();
  /// Threads for the ring's passes over a piece (ring_allreduce::set_parallel); without them
  /// (the default) every pass runs on the caller's thread.
  void set_parallel(parallel_runner run) { parallel_ = std::move(run); }
  /// Whether this node's workers may reduce through every member's region when all share its
  /// host (host_reduce.hpp; the default), or keep their pieces going around the ring.
  void set_host_reduce(bool on) { host_reduce_ = on; }
  /// Whether those workers' devices import the members' regions (region_import.hpp; the
  /// default), or move the bytes through staging memory and host copies.
  void set_host_import(bool on) { host_import_ = on; }
  /// Whether those devices copy the buckets and their sums beside the kernels, while the
  /// backward pass goes on (train_work_result::copied; the default), or each copy before the
  /// task returns.
  void set_copy_overlap(bool on) { copy_overlap_ = on; }
  /// The engine reads no clock: every entry point that may need the time is given it (the
  /// node's shell passes the steady clock; tests may pass simulated time).
  using clock = std::chrono::steady_clock;

  /// A worker died or left: steps it was part of are redone without it.
  std::vector<outbound> peer_dead(const node_id& id, clock::time_point now);
  /// The executor was restarted: resident training state is gone, so this node leaves its runs
  /// (the coordinators set it up again with the current state).
  void executor_restarted();
  /// Called every second or so: a run whose client has been gone for `client_grace` without
  /// resuming it elsewhere is ended, and a step past its deadline (step_deadlines) is redone
  /// without the members that did not finish it (see step_overdue).
  std::vector<outbound> tick(clock::time_point now);
  /// How long a coordinator keeps training for a client it lost (which may only be cut off from
  /// it, and resume the run on another node: that node's setup then stops this run).
  static constexpr std::chrono::seconds client_grace{30};

  /// Training messages (open_training, train_setup, train_step, allreduce_piece(_shared),
  /// shared_region_offer/answer, train_reduced, train_state, train_resume); others are ignored.
  std::vector<outbound> on_message(const node_id& from, const msg::message& m, clock::time_point now);
  /// Device work ready to run; the shell runs each and calls on_executed.
  std::vector<train_task> take_ready();
  std::vector<outbound> on_executed(const train_task& t, expected<train_work_result> r, clock::time_point now);

  /// Messages refused since the last call for their sender's lack of authority (a forged
  /// takeover, a piece or step answer from outside the ring), and members left out of a run for
  /// missing a step's deadline (kind "train_step deadline"); the shell logs and counts them.
  std::vector<refused_message> take_refused() { return std::exchange(refused_messages_, {}); }
  /// Other events the shell should log since the last call: warnings (a stalled all-reduce
  /// redone, no shared memory) and news (pieces to a successor go through shared memory).
  struct notice {
    bool warning = true;
    std::string text;
  };
  std::vector<notice> take_notices() { return std::exchange(notices_, {}); }

  /// Runs this node coordinates, for status ("training" jobs).
  std::vector<msg::job_status> jobs(clock::time_point now) const;
  /// The loss curve of each run this node coordinates, by the id jobs() reports.
  loss_curves curves() const;
  size_t running() const { return coordinated_.size() + worker_.size(); }

 private:
  struct coord_run;
  struct worker_run;
  using worker_key = std::pair<node_id, uint64_t>;  // coordinator, train

  /// Opens a run this node coordinates: a client's (no grant, generation 0), or one taken over
  /// from a dead coordinator (take_over: with the client's grant, which its setups carry).
  std::vector<outbound> open(const node_id& client, const msg::open_training& o, const msg::takeover_grant& takeover = {});
  std::vector<outbound> on_setup(const node_id& from, const msg::train_setup& s);
  std::vector<outbound> on_step(const node_id& from, const msg::train_step& s);
  /// Its coordinator is gone (or its client moved it): keep the state, stop everything else.
  static void orphan(worker_run& w);
  std::vector<outbound> on_piece(const node_id& from, const msg::allreduce_piece& p);
  std::vector<outbound> on_piece_shared(const node_id& from, const msg::allreduce_piece_shared& p);
  /// Worker: member `from`'s region at `where`, as mapped here already or opened now (then kept
  /// in peer_regions); an error (and peer_regions untouched) when it does not open.
  expected<std::shared_ptr<shared_region>> map_peer_region(worker_run& w, const node_id& from, const region_locator& where);
  /// Worker: where the round's pieces go in this run's region (ring_allreduce::set_placer).
  static payload_placer region_placer(worker_run& w);
  /// Worker: offers this run's region to the step's successor, once it has none mapped.
  std::vector<outbound> offer_region(worker_run& w);
  std::vector<outbound> on_region_offer(const node_id& from, const msg::shared_region_offer& o);
  void on_region_answer(const node_id& from, const msg::shared_region_answer& a);
  std::vector<outbound> on_reduced(const node_id& from, const msg::train_reduced& r);
  std::vector<outbound> on_state(const node_id& from, const msg::train_state& s);
  std::vector<outbound> on_resume(const node_id& client, const msg::train_resume& r);
  /// The takeover task finished: open the rest of the run as one this node coordinates.
  std::vector<outbound> take_over(const train_task& t, expected<train_work_result> r);
  /// Coordinator: start (or redo) the current step over the current members.
  std::vector<outbound> issue_step(uint64_t id, coord_run& c);
  /// Coordinator: the current step is decided; go on (next step, sync newcomers, or finish).
  std::vector<outbound> advance(uint64_t id, coord_run& c);
  std::vector<outbound> fail_run(uint64_t id, coord_run& c, error_code code, const std::string& why);
  /// How long the current step of `c` may take (step_deadlines).
  clock::duration step_deadline(const coord_run& c) const;
  /// Coordinator: the current step is past its deadline. Members that never said train_ready
  /// (their gradients are not computed) are left out of the run and the step is redone without
  /// them. When every member was ready, the ring itself stalled and nobody can be blamed: the
  /// step is redone once with the same ring, and a second stall of the same step fails the run.
  std::vector<outbound> step_overdue(uint64_t id, coord_run& c);
  /// Coordinator: takes `m` out of run `id`'s members and sends it a stop; false when it is no
  /// member (any more).
  bool stop_member(uint64_t id, coord_run& c, const node_id& m, std::vector<outbound>& out);
  /// Coordinator: stop_member, and `m` is not set up again while it stays connected; the reason
  /// is logged and counted against it.
  void leave_out(uint64_t id, coord_run& c, const node_id& m, std::string why, std::vector<outbound>& out);
  /// Worker: the round is complete; hold the result and tell the coordinator.
  std::vector<outbound> round_done(worker_run& w);
  /// Data parallel in buckets: bucket `bucket`'s round ended, so its sum goes to the device now
  /// (a task writing it into the bucket's accumulators) rather than at the next step's commit:
  /// the writes overlap the rounds still going.
  void write_bucket(worker_run& w, int bucket);
  std::vector<outbound> forward(worker_run& w, std::vector<allreduce_message> ms);
  /// Worker: whether this run's steps may reduce through every member's region (data parallel
  /// in buckets, f32 on the wire): its region is then offered to every member, not only the
  /// successor.
  bool host_reduce_possible(const worker_run& w) const;
  /// A region's room for a step's ring pieces, in bytes; a host all-reduce's bucket sizes
  /// (values, the last with the loss sum) and its sum areas' place, after that room.
  static uint64_t ring_area_bytes(const worker_run& w);
  static std::vector<size_t> host_bucket_values(const worker_run& w);
  static size_t host_sum_base(const worker_run& w) { return static_cast<size_t>(ring_area_bytes(w) / sizeof(float)); }
  /// Worker: whether it maps every other member's region of the current ring and each of them
  /// maps its own (train_ready::host_local).
  bool host_local(const worker_run& w) const;
  /// Worker, host_reduce: announce the buckets in the region (once the go came); the marks and
  /// what they complete.
  std::vector<outbound> start_direct(worker_run& w);
  std::vector<outbound> on_host_mark(const node_id& from, const msg::host_reduce_mark& m);
  /// host_reduce's events: its marks to every other member; a bucket summed everywhere is
  /// written to the device from the regions; the last one ends the round.
  std::vector<outbound> direct_events(worker_run& w, const host_reduce::events& e);
  std::vector<outbound> accept_piece(worker_run& w, const node_id& from, const allreduce_piece_ref& m);
  /// Coordinator: a member has its round for the step; when all have, ring_go to each.
  std::vector<outbound> on_ready(const node_id& from, const msg::train_ready& r);
  /// Worker: every member has its round; start ours if the contribution is computed.
  std::vector<outbound> on_go(const node_id& from, const msg::ring_go& g);
  /// Worker: starts the round once both the contribution and the go are here.
  std::vector<outbound> start_round(worker_run& w);
  /// Records a message refused for its sender's lack of authority (take_refused).
  void note_refusal(const node_id& from, const char* kind, std::string why);
  /// Queues a task that frees an ended run's programs and parameters on the executor.
  void retire(const std::shared_ptr<worker_run>& w);
  /// Ends a worker run: retire() and forget it. Returns the next entry.
  std::map<worker_key, std::shared_ptr<worker_run>>::iterator end_run(std::map<worker_key, std::shared_ptr<worker_run>>::iterator it);

  node_id self_;
  step_deadlines deadlines_;
  data_opener opener_;
  shared_memory shared_;
  parallel_runner parallel_;
  bool host_reduce_ = true;
  bool host_import_ = true;
  bool copy_overlap_ = true;
  clock::time_point now_{};  ///< the time the current entry point was given
  std::set<node_id> peers_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, std::unique_ptr<coord_run>> coordinated_;
  std::map<worker_key, std::shared_ptr<worker_run>> worker_;
  /// Runs whose setup this node refused (the most recent few): their steps are answered with the
  /// refusal, so the coordinator redoes the step without this node instead of waiting for ever.
  std::map<worker_key, error> refused_;
  std::vector<train_task> ready_;
  std::vector<refused_message> refused_messages_;
  std::vector<notice> notices_;
};

}  // namespace mesh
