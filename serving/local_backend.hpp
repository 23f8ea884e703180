#pragma once
/// The models this process serves: the one model host of a node, behind both the HTTP API
/// (api_server) and the node's own clients (`meshctl generate`, client::generate through the
/// generation worker).
///
/// Each model is a checkpoint with its tokenizer, chat template and session on an executor of
/// its own (made by the factory it is given): unloading a model drops its executor, which frees
/// everything it put on the device, and a model never shares an executor with the node's jobs.
/// Models come in two ways:
///   - load() / load_async(): by the operator (`meshnode --model`, `meshctl models load`), under
///     an id; they stay until unload();
///   - on demand, when a request names a checkpoint path that is not loaded (by_path requests of
///     `meshctl generate`): at most max_path_models are kept, the least recently used goes first.
///
/// One worker thread runs every generation with continuous batching: a model holds up to
/// `parallel` sequences at once (slots of its session, each with a KV cache of the model's
/// context), and each round of the worker admits waiting requests into free slots, prefills one
/// chunk of each prompt still being read (`prefill_chunk` tokens, so that a long prompt delays the
/// running requests by one chunk per round, not by its whole length), then runs one decode step per
/// model for all its requests past their prompts together (one graph run: the weights are read
/// once per step, not once per request). A request that ends frees its slot for the next at once; requests are admitted in arrival
/// order. A split model batches too: a step's requests go through its stages as micro-batches, one
/// per stage, stepped at once, so that every stage has work (a pipeline). Each model has a bounded queue (a request past it is
/// refused with queue_full, which the HTTP server answers with 429). Cancellation is checked at
/// every token and before a queued request starts.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "base/error.hpp"
#include "gpu/executor.hpp"
#include "models/checkpoint.hpp"
#include "models/model_config.hpp"
#include "models/pipeline.hpp"
#include "serving/backend.hpp"

namespace mesh::serving {

/// What a split model's stages are built from (local_model_options::split).
struct split_input {
  const models::checkpoint& ckpt;      ///< opened on this node; outlives the pipeline
  const models::model_config& config;
  int64_t context = 0;                 ///< positions asked for (0: the model's, capped)
  gpu::executor& ex;                   ///< this model's executor, for the stage this node holds
  int64_t slots = 1;                   ///< sequences held at once (every stage holds as many)
};
/// A split model as the host drives it: a sequence whose stages may move while it serves (a
/// stage node that is lost, a node that joins: actors/failover_pipeline.hpp).
class split_sequence : public models::sequence_model {
 public:
  /// Its stages now, in order. Thread-safe: listings read it while the worker steps.
  virtual std::vector<model_stage_info> stages() const = 0;
  /// Plans the model again over `nodes` nodes (this one first, then the current plan's nodes,
  /// then the peers with the most free memory), built beside the plan serving, which serves on
  /// and is replaced between two steps; on an error the old plan stays. Later re-plans (after a
  /// loss, or to widen) aim at `nodes` too. Thread-safe.
  virtual expected<void> replan(size_t nodes) = 0;
};
using split_builder = std::function<expected<std::unique_ptr<split_sequence>>(const split_input& in)>;

struct local_model_options {
  std::filesystem::path path;  ///< a GGUF file or a Hugging Face directory
  /// The id clients name it by; empty: the file name without `.gguf` (the directory's name).
  std::string id;
  /// A chat template family by name ("chatml", "llama3", ...: models::chat_template_names());
  /// empty: recognised from the checkpoint's own template.
  std::string chat_template;
  int64_t context = 0;   ///< session_options::context (0: the model's, capped)
  size_t max_queued = 8; ///< requests waiting beside those running
  /// Split over the mesh: builds the model's pipeline (stages here and on peers) instead of one
  /// whole-model session; this node keeps the tokenizer, the chat template and the sampling.
  /// It runs on the loading thread and may wait for peers.
  split_builder split;
  /// Requests it runs at once (session slots, each a KV cache of `context` rows); 0: the
  /// backend's `parallel`. A split model's stages each hold as many.
  int64_t parallel = 0;
  /// Prompt tokens read per worker round for one request (0: the backend's `prefill_chunk`).
  int64_t prefill_chunk = 0;
  /// A PEFT LoRA adapter directory merged into the checkpoint's weights at load (models/peft.hpp);
  /// empty: none. Not with `split` (the stages on other nodes read the checkpoint's files).
  std::filesystem::path adapter;
};

struct local_backend_options {
  using executor_factory = std::function<expected<std::unique_ptr<gpu::executor>>()>;
  /// Makes each model's executor (required).
  executor_factory make_executor;
  /// Models loaded on demand for requests that name a checkpoint path: kept at most.
  size_t max_path_models = 2;
  /// Requests waiting for models loaded on demand, all such models together.
  size_t max_path_queued = 8;
  /// The session context of models loaded on demand (0: the model's, capped).
  int64_t path_context = 0;
  /// Requests a model runs at once unless its options say otherwise (models loaded on demand too).
  int64_t parallel = 4;
  /// Prompt tokens a request reads per round unless its model's options say otherwise.
  int64_t prefill_chunk = 512;
};

/// Counts since the backend started, for tests and metrics.
struct local_backend_stats {
  int64_t completed = 0;  ///< finished with a result
  int64_t cancelled = 0;
  int64_t failed = 0;
  int64_t completion_tokens = 0;
  int64_t loads = 0;      ///< models loaded (on demand ones included)
  int64_t decode_steps = 0;   ///< decode steps run, each for one or more requests (a split model's micro-batch: one)
  int64_t decoded_tokens = 0; ///< tokens those steps decoded
  int64_t widest_step = 0;    ///< the most requests one decode step served
  int64_t most_micro_batches = 0;  ///< the most micro-batches under way at once through a split model
  int64_t chained_steps = 0;  ///< steps a split model's micro-batch went on to without waiting for the others
  int64_t steps_beside_prompts = 0;  ///< a split model's decode steps begun while a prompt chunk was being read
};

class local_backend final : public generation_backend {
 public:
  /// Loads `models` (the first that fails is the error, naming its path, and nothing is served)
  /// and starts the worker.
  static expected<std::unique_ptr<local_backend>> create(local_backend_options options,
                                                         std::vector<local_model_options> models = {});

  /// Stops the worker and the loader: the request running is cancelled, queued ones fail with
  /// no_capacity, pending loads fail.
  ~local_backend() override;

  /// Loads a model on the caller's thread (generation goes on meanwhile). Errors name the path:
  /// an id already in use, a checkpoint that does not open, a chat template name that does not
  /// exist, a device that cannot hold it.
  expected<model_info> load(const local_model_options& options);
  /// load() on the backend's loader thread; `done` is called there (also with the error "the
  /// backend is stopping" for a load still waiting when the backend goes away).
  void load_async(local_model_options options, std::function<void(expected<model_info>)> done);
  /// Unloads a model by id: its waiting requests fail (no_capacity), the running one is
  /// cancelled; its device memory is freed once nothing uses it. An unknown id is not_found.
  expected<void> unload(const std::string& id);
  /// Plans a split model again over `nodes` nodes (split_sequence::replan) while it serves; the
  /// stages it then has. Errors: an unknown id (not_found), a model that is not split
  /// (invalid_argument), the new plan's (the old plan serves on).
  expected<std::vector<model_stage_info>> replan(const std::string& id, size_t nodes);
  /// replan() on the loader thread (after the loads asked before it); `done` is called there
  /// (also with "the backend is stopping" for one still waiting when the backend goes away).
  void replan_async(std::string id, size_t nodes, std::function<void(expected<std::vector<model_stage_info>>)> done);

  /// Cancels a request from start(): a waiting one ends at once (on_done with cancelled, on the
  /// caller's thread), the running one at its next token. handle->cancel() alone does the same,
  /// except that a waiting request ends only when its turn comes.
  void cancel(const std::shared_ptr<request_handle>& handle);

  std::vector<model_info> models() const override;
  backend_queue queue() const override;
  result<std::shared_ptr<request_handle>> start(generation_request request, generation_callbacks callbacks) override;

  local_backend_stats stats() const;

 private:
  struct model;
  struct job;
  explicit local_backend(local_backend_options options);
  expected<std::shared_ptr<model>> open_model(const local_model_options& o);
  /// The loaded model a request names (its id, or with by_path its checkpoint path); null if none.
  std::shared_ptr<model> find(const generation_request& r) const;
  result<void> prepare(model& m, job& j) const;
  void run();
  void run_loads();
  /// Moves waiting requests whose models have a free slot into active_ (under mutex_).
  std::vector<std::shared_ptr<job>> admit();
  /// Starts an admitted request: loads its model if needed and sets up its generation. Ends it
  /// (complete) when something fails.
  void begin(const std::shared_ptr<job>& j);
  /// Reads the next chunk of a request's prompt; after the last, samples its first token.
  void prefill(const std::shared_ptr<job>& j);
  /// One round for model `m`: a prompt chunk for each of its requests still reading one, and a
  /// decode step for all those past their prompts (a split model: the chunks and the decode
  /// micro-batches at once, the micro-batches going on to further steps; see decode_lane).
  void step(const std::shared_ptr<model>& m, const std::vector<std::shared_ptr<job>>& jobs);
  /// A split model's round, shared by its threads.
  struct lane_control {
    std::atomic<bool>& round_over;        ///< set by the first lane that stops: the others stop after their step
    std::atomic<size_t>& readers_left;    ///< threads still reading this round's prompt chunks
    bool reading = false;                 ///< whether the round reads prompt chunks
  };
  /// Decode steps of `mine` (one micro-batch of `lanes`): one without `control`; with it, steps
  /// until one of its requests ends, or the round's prompt chunks are in (when it reads some),
  /// or others_waiting (when not); or another lane stopped. `running`: the model's requests in this round.
  void decode_lane(const std::shared_ptr<model>& m, const std::vector<std::shared_ptr<job>>& mine, size_t lanes,
                   const lane_control* control, size_t running);
  /// Whether the worker has other work than `m`'s `running` requests: one of them ended, a
  /// waiting request could be admitted, another model's requests wait, or the backend stops.
  bool others_waiting(const model& m, size_t running) const;
  /// Hands the logits after a request's last token to its generation; ends it when it is done.
  void advance(const std::shared_ptr<job>& j, std::span<const float> logits);
  /// A request decoding alone, greedily, on a model that decodes greedily on the device
  /// (sequence_model::greedy_chunk): a chunk of steps with no host between them, the tokens then
  /// handed to its generation one by one; positions decoded past a stop are dropped (rewind).
  void decode_greedy(const std::shared_ptr<model>& m, const std::shared_ptr<job>& j);
  /// The rest of advance(): the generation's answer for the request's next token.
  void settle(const std::shared_ptr<job>& j, expected<std::optional<int32_t>> next);
  /// Ends a request: frees its slot, counts it and calls on_done.
  void complete(const std::shared_ptr<job>& j, generation_outcome outcome);
  /// The model at `path`, loaded on demand (evicting the least recently used such model).
  expected<std::shared_ptr<model>> path_model(const std::string& path, const std::string& adapter, double& load_seconds);

  local_backend_options options_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::shared_ptr<model>> models_;  ///< guarded by mutex_
  std::deque<std::shared_ptr<job>> queue_;
  std::vector<std::shared_ptr<job>> active_;  ///< admitted, not ended: guarded by mutex_
  size_t path_queued_ = 0;        ///< queued requests for models not loaded yet
  uint64_t uses_ = 0;             ///< a clock for least-recently-used eviction
  std::atomic<bool> stopping_{false};  ///< set under mutex_ (the worker waits on it), read without
  local_backend_stats stats_;

  /// A load, or another task for the loader thread (`task`: called with false to run it, with
  /// true when the backend stops first).
  struct pending_load {
    local_model_options options;
    std::function<void(expected<model_info>)> done;
    std::function<void(bool stopping)> task;
  };
  std::condition_variable load_wake_;
  std::deque<pending_load> loads_;  ///< guarded by mutex_

  std::thread worker_;
  std::thread loader_;
};

}  // namespace mesh::serving
