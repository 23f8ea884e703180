#pragma once
/// The public C++ API: connect to any node of a mesh and run graphs on it.
///
///   auto c = mesh::client::connect("8ea6...@127.0.0.1:7420");
///   auto r = (*c)->run(graph, {{"x", x}}, params);   // r->outputs["y"]
///
/// A client is a peer with its own throw-away identity that says it is a client, so nodes never
/// plan work onto it. Every call returns errors as values with a message a person can act on.
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/node_id.hpp"
#include "graph/evaluate.hpp"
#include "graph/graph.hpp"
#include "graph/planner.hpp"
#include "wire/messages.hpp"

namespace mesh {

struct client_options {
  std::vector<uint8_t> mesh_secret;  ///< must match the mesh's; empty = the open LAN mesh
  std::chrono::milliseconds connect_timeout{5000};
  /// No packet from the node for this long: it is gone (keep-alives are sent at a quarter of
  /// it). A training then continues on another node of the mesh (see client::train).
  std::chrono::milliseconds idle_timeout{5000};
  /// The mesh id find_node looks for in mDNS; empty = derived from mesh_secret (transport::mesh_id_of).
  /// options_for_local_node() fills both from the node's state directory. Last and with a
  /// default initializer, so that a designated initializer that stops before it
  /// (`{.mesh_secret = s, .connect_timeout = t}`) need not name it (-Wmissing-field-initializers).
  std::string mesh_id{};
};

/// A finished job.
struct job_outcome {
  tensor_map outputs;
  uint32_t attempts = 1;             ///< > 1 when a worker died and the job was re-planned
  std::vector<node_id> workers;      ///< nodes that ran a stage
  strategy ran_as = strategy::pipeline;  ///< the plan's strategy (automatic: the one chosen)
  uint64_t step = 0;                     ///< trainings: the step the run reached
};

/// A stage of a one-shot job finished (see job_options::on_progress).
struct job_progress_info {
  uint32_t stages_done = 0;
  uint32_t stages = 0;   ///< stages of the current attempt
  uint32_t attempt = 1;  ///< a re-plan after a worker died starts a new attempt (counts restart)
  node_id worker;        ///< the node that ran the stage
};

/// How to run a one-shot job.
struct job_options {
  /// pipeline (cut the graph into stages), data_parallel (each node a share of the batch rows;
  /// the graph must not mix rows), tensor_parallel (matmul weights split by columns), or
  /// automatic (the cheapest of those that apply, by the nodes' measured speeds).
  strategy how = strategy::pipeline;
  /// Called on a client thread as stages finish; may use the client.
  std::function<void(const job_progress_info&)> on_progress;
  std::chrono::milliseconds timeout = std::chrono::minutes(5);  ///< for run()
};

/// How to generate text through a node (client::generate).
struct generation_options {
  /// Render the prompt as one user message with the checkpoint's chat template.
  bool chat = false;
  /// With chat: a template family by name ("chatml", "llama3", ...); empty: the checkpoint's own.
  std::string chat_template;
  /// A PEFT LoRA adapter directory on the node (adapter_config.json + adapter_model.safetensors),
  /// merged into the checkpoint's weights when the node loads it; empty: none.
  std::string adapter;
  msg::sampling_params sampling;  ///< greedy by default (temperature 0)
  std::vector<std::string> stop;  ///< generation ends before the first of these in the text
  uint32_t max_tokens = 256;      ///< capped by the context left after the prompt (finish `context`)
  /// For the whole request, loading the model included; past it the request is withdrawn.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
};

/// A generation that ended (any finish reason; errors come back as errors).
struct generation_outcome {
  std::string text;  ///< every piece, joined
  finish_reason finish = finish_reason::length;
  uint32_t prompt_tokens = 0;
  uint32_t tokens = 0;           ///< generated, an ending EOS included
  double load_seconds = 0;       ///< the node loading the model for this request (0: it was loaded)
  double prompt_seconds = 0;     ///< the node's prefill of the prompt
  double generate_seconds = 0;   ///< the node's sampling and decoding after the prefill
  /// From sending the request to the first piece of text, on this client's clock (the model's
  /// loading and the prefill included); negative when no text came.
  double first_piece_seconds = -1;
};

/// Receives each piece of generated text (whole UTF-8 characters) and the tokens generated so
/// far, on a client thread; returning false withdraws the request (the node stops at its next
/// token and the generation ends `cancelled`).
using generation_callback = std::function<bool(std::string_view piece, uint32_t tokens)>;

class client_impl;
class client;

/// A job or training in flight whose callbacks its caller can withdraw (client::start_job,
/// client::start_training). `done` completes with the result. The callbacks stay registered
/// until the result has come or withdraw() is called; the destructor calls it. Once withdraw()
/// has returned, none of them runs and none will run again, so they may capture the caller's
/// locals as long as the handle is destroyed (or withdrawn) before those.
class pending_request {
 public:
  pending_request() = default;
  pending_request(pending_request&& other) noexcept;
  pending_request& operator=(pending_request&& other) noexcept;
  pending_request(const pending_request&) = delete;
  pending_request& operator=(const pending_request&) = delete;
  ~pending_request();

  std::future<expected<job_outcome>> done;

  /// Gives the request up: unregisters its callbacks, waits for one that runs now on the
  /// client's network thread (unless it is that callback calling withdraw()), and completes
  /// `done`, if it was not complete yet, with a timeout error. The node is not told: it may go on
  /// with the job or training, and whatever it sends about it later is ignored. Idempotent.
  void withdraw();
  /// The client's id of the request (0 when it failed before it was sent).
  uint64_t id() const { return id_; }

 private:
  friend class client;
  pending_request(std::shared_ptr<client_impl> impl, uint64_t id, std::future<expected<job_outcome>> f)
      : done(std::move(f)), impl_(std::move(impl)), id_(id) {}
  std::shared_ptr<client_impl> impl_;
  uint64_t id_ = 0;
};

/// Options for a client on the machine of a node whose state directory is `state_dir`: the mesh
/// credential that node keeps there (<state_dir>/mesh.token, written when the node created or
/// joined its mesh), or the open mesh's when it keeps none (a node started --open or
/// --secret-file; for the latter, set mesh_secret from the file). Refuses a token file that
/// others may read, or one that does not decode.
expected<client_options> options_for_local_node(const std::filesystem::path& state_dir);

/// Looks for a node of the mesh of `options.mesh_secret` (same mesh id and protocol version) on
/// the LAN by mDNS (`_meshnode._udp` through avahi-daemon), browsing without announcing, and
/// returns the first one found as "NODEID@HOST:PORT". Errors: none found within `timeout` (the
/// message says what to check), or discovery could not start.
expected<std::string> find_node(const client_options& options, std::chrono::milliseconds timeout);

/// A model loaded once across a pipeline of peers (parameters resident on their devices), for
/// repeated calls. Calls may overlap: each streams through the stages as a micro-batch.
class inference_session {
 public:
  ~inference_session();
  /// One call: the inputs of the model; the future completes with its outputs.
  std::future<expected<job_outcome>> infer(const tensor_map& inputs);
  /// Nodes holding a stage when the session was opened.
  const std::vector<node_id>& workers() const { return workers_; }

 private:
  friend class client;
  inference_session(std::shared_ptr<client_impl> impl, uint64_t id, std::vector<node_id> workers)
      : impl_(std::move(impl)), id_(id), workers_(std::move(workers)) {}
  std::shared_ptr<client_impl> impl_;
  uint64_t id_;
  std::vector<node_id> workers_;
};

class client {
 public:
  /// Connects to the node "NODEID@HOST:PORT" (see <state_dir>/endpoint of a running meshnode).
  /// An empty `node` or "mdns" first looks for a node of the mesh with find_node(), waiting at
  /// most `options.connect_timeout` for it, then connects within the same timeout again.
  static expected<std::unique_ptr<client>> connect(const std::string& node, client_options options = {});
  ~client();

  /// Submits `g` with its inputs and parameters; the future completes with the outputs or an error.
  /// `options.on_progress` stays registered until then (or until the client is destroyed), so
  /// whatever it captures must live that long; start_job() lets the caller withdraw it earlier.
  std::future<expected<job_outcome>> submit(const graph& g, const tensor_map& inputs, const tensor_map& params,
                                            job_options options);
  std::future<expected<job_outcome>> submit(const graph& g, const tensor_map& inputs, const tensor_map& params,
                                            strategy s = strategy::pipeline);
  /// submit() and wait, at most `options.timeout`. Also on a timeout, `options.on_progress` is
  /// neither running nor called any more once run() returns (the node may still run the job).
  expected<job_outcome> run(const graph& g, const tensor_map& inputs, const tensor_map& params, job_options options);
  expected<job_outcome> run(const graph& g, const tensor_map& inputs, const tensor_map& params,
                            std::chrono::milliseconds timeout = std::chrono::minutes(5));
  /// Loads `model` (outputs from inputs, no updates) with `params` across the mesh once.
  expected<std::unique_ptr<inference_session>> open_inference(const graph& model, const tensor_map& params,
                                                              std::chrono::milliseconds timeout = std::chrono::minutes(1));
  /// Starts a training run coordinated by the connected node (see trainer.hpp, which builds
  /// `spec`); `on_progress` runs on a client thread after every step. The future completes with
  /// the final state (parameters and optimizer state) as outputs.
  ///
  /// If the coordinating node dies, the client connects to another node of the mesh (from the
  /// nodes' own status reports) and asks it to take the run over from its state; the run then
  /// continues there (a step in progress is redone, so progress may report a step twice) and
  /// this client stays connected to that node. Other requests in flight fail as usual.
  /// `on_checkpoint` receives the state every spec.checkpoint_every steps (from the node's thread).
  /// Both stay registered until the future completes or the client is destroyed: what they
  /// capture must live that long (start_training() lets the caller withdraw them earlier).
  std::future<expected<job_outcome>> train(const msg::train_spec& spec,
                                           std::function<void(const msg::train_progress&)> on_progress = {},
                                           std::function<void(const msg::train_checkpoint&)> on_checkpoint = {});
  /// submit() and train() with a handle that can withdraw the callbacks (see pending_request):
  /// for callers that may stop waiting before the result comes.
  pending_request start_job(const graph& g, const tensor_map& inputs, const tensor_map& params, job_options options);
  pending_request start_training(const msg::train_spec& spec,
                                 std::function<void(const msg::train_progress&)> on_progress = {},
                                 std::function<void(const msg::train_checkpoint&)> on_checkpoint = {});
  /// Generates text from `model`, a checkpoint path on the connected node (a GGUF file or a
  /// Hugging Face directory), after `prompt`, streaming pieces to `on_piece` as they come. The node
  /// loads the model on first use and keeps it for later requests. Errors (a missing file, a bad
  /// option, a prompt past the context, the node busy) come back with the node's message. When
  /// this returns, `on_piece` is neither running nor called again, so it may capture locals.
  expected<generation_outcome> generate(const std::string& model, const std::string& prompt,
                                        const generation_options& options = {}, generation_callback on_piece = {});
  /// The models the node serves (models_action::list), or loads one (load: `target` is a
  /// checkpoint path on the node; the reply comes once it is loaded, so give a load minutes) or
  /// unloads one (`target` is its id). The reply lists the models after the change and the
  /// node's HTTP API address. The request's id is set here.
  expected<msg::models_reply> models(msg::models_request request, std::chrono::milliseconds timeout = std::chrono::seconds(5));
  /// The node's view of the mesh: peers with health and load, jobs.
  expected<msg::status_reply> status(std::chrono::milliseconds timeout = std::chrono::seconds(5));
  /// The connected node's id.
  node_id node() const;

 private:
  explicit client(std::shared_ptr<client_impl> impl);
  std::shared_ptr<client_impl> impl_;
};

}  // namespace mesh
