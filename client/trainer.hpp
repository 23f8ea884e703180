#pragma once
/// Distributed training through a node: data parallel or DiLoCo over every worker of the mesh.
///
///   mesh::trainer t(*client, model, params, dataset, {.steps = 500, .micro_batches = 6});
///   auto r = t.fit([](const mesh::train_progress_info& p) { ... });   // r->state
///
/// The model is a graph whose inputs are the dataset's columns (dimension 0 = `micro_batch`
/// rows) and whose output "loss" is an f32 scalar, the mean over the micro-batch; every
/// parameter of the graph is trained, or those train_options::trainable names. The trainer turns it into the graphs that travel to the
/// workers (gradients, optimizer step, DiLoCo's delta and outer step; see train_spec in
/// wire/messages.hpp) and the node the client is connected to coordinates the run
/// (actors/train_engine.hpp).
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "client/client.hpp"
#include "graph/optim.hpp"
#include "wire/messages.hpp"

namespace mesh {

struct train_options {
  train_method method = train_method::data_parallel;
  uint64_t steps = 100;          ///< train until this step (DiLoCo: counting inner steps)
  uint64_t start_step = 0;       ///< > 0 to resume: the state passed in must be that step's
  uint32_t micro_batches = 4;    ///< per step, spread over the workers (global batch = this x rows)
  uint32_t inner_steps = 20;     ///< DiLoCo: local steps between averaging (of each fragment)
  /// DiLoCo: > 1 cuts the parameters into this many fragments synchronised in turn, one every
  /// inner_steps / fragments local steps (streaming DiLoCo): each fragment still every
  /// inner_steps, and each all-reduce carries a fragment's share of the bytes.
  uint32_t fragments = 1;
  /// DiLoCo: the last this many inner steps of each round (of inner_steps / fragments local steps)
  /// run while the round's all-reduce travels: the delta is taken before them, so communication
  /// overlaps computation (Streaming DiLoCo's overlap). When the round's outer step arrives, the
  /// parameters it resets become overlap_mix x local + (1 - overlap_mix) x the new outer values,
  /// keeping part of what the local steps since the delta learnt (0.25: on the shaped-link
  /// benchmark 0 and 0.25 ended within 1.4% of data parallel's loss, the paper's 0.5 6.7% above;
  /// docs/training.md). The round's reported loss is the mean over the inner steps before the
  /// delta. 0: no overlap.
  uint32_t overlap_steps = 0;
  double overlap_mix = 0.25;
  double outer_lr = 0.7;         ///< DiLoCo: outer Nesterov step
  double outer_momentum = 0.9;
  wire_format compression = wire_format::f32;  ///< of the all-reduce
  /// Data parallel on 2 or more workers: gradients are all-reduced in buckets of about this many
  /// bytes, each while the backward pass computes the next (0: one all-reduce after it).
  uint64_t bucket_bytes = uint64_t{25} << 20;
  uint64_t seed = 1;             ///< data order
  /// The parameters to train, by name; empty: every parameter of the model. The others stay
  /// frozen at their value in the state (LoRA's base weights): they go to every worker with the
  /// state, but get no gradient, no optimizer state and no all-reduce.
  std::vector<std::string> trainable;
  std::variant<optim::adam_options, optim::sgd_options> optimizer = optim::adam_options{};
  /// Dynamic loss scaling (graph/optim.hpp): for models whose products run in f16
  /// (finetune_options::compute), where small gradients would flush to zero. Steps whose gradients
  /// overflow are skipped (parameters and optimizer state unchanged) and the scale halved. Not
  /// needed for bf16, whose range is f32's.
  std::optional<optim::loss_scaling> loss_scale;
  std::chrono::milliseconds timeout{std::chrono::hours(24)};
  /// > 0: every this many steps the coordinating node sends the state (parameters and optimizer)
  /// to `on_checkpoint`, called from the client's network thread; save it (save_safetensors with
  /// the step as metadata) and a later run resumes from it with start_step = step.
  uint64_t checkpoint_every = 0;
  std::function<void(uint64_t step, const tensor_map& state)> on_checkpoint;
};

/// One finished step, as the coordinating node reports it.
struct train_progress_info {
  uint64_t step = 0, steps = 0;
  double loss = 0;
  double samples_per_s = 0;
  uint32_t peers = 0;        ///< workers that took part in the step
  uint64_t bytes_sent = 0;   ///< all-reduce bytes of the step, all workers together
  double seconds = 0;        ///< since fit() started
};

struct train_result {
  tensor_map state;                ///< parameters and optimizer state (save it to resume)
  std::vector<double> losses;      ///< per reported step
  uint64_t step = 0;               ///< the step the run reached, as its coordinator reports it
  uint64_t bytes_sent = 0;         ///< all-reduce bytes of the whole run
  std::vector<node_id> workers;    ///< nodes of the last step
  double seconds = 0;
};

/// Builds what travels to the workers. `state` holds every parameter of `model`, and may hold
/// optimizer state from a checkpoint (missing state starts at zero; DiLoCo's outer copy starts
/// at the parameters). Errors say what does not fit.
expected<msg::train_spec> make_train_spec(const graph& model, const tensor_map& state, const tensor_map& dataset,
                                          int64_t micro_batch, const train_options& options);

class trainer {
 public:
  trainer(client& c, graph model, tensor_map state, tensor_map dataset, train_options options = {});
  /// Trains on a data file that the workers read themselves, each only the shards its
  /// micro-batches draw from (docs/training.md, "Data from files"): `text.path` is a file on the
  /// node the client is connected to, which offers it to the others; make_text_data
  /// (actors/train_text.hpp) fills in the tokenizer. The model's inputs are "tokens" and
  /// "targets" (i32) and "mask" (f32), each [micro_batch, text.sequence].
  trainer(client& c, graph model, tensor_map state, msg::train_text_data text, train_options options = {});
  /// Trains over the mesh; `progress` runs (on a client thread) after every step. When fit()
  /// returns, neither `progress` nor options.on_checkpoint runs or will run again, also after a
  /// timeout ("training did not finish in time"): the run is then withdrawn from the client
  /// (pending_request), while the node, which nothing tells to stop, may go on with it.
  expected<train_result> fit(const std::function<void(const train_progress_info&)>& progress = {});

 private:
  client& client_;
  graph model_;
  tensor_map state_, dataset_;
  std::optional<msg::train_text_data> text_;
  train_options options_;
};

/// Mean of the model's "loss" over `dataset` (as many whole micro-batches as it holds), run as
/// one-shot jobs on the mesh.
expected<double> evaluate_loss(client& c, const graph& model, const tensor_map& params, const tensor_map& dataset);

/// The parameters of `state` (drops optimizer and DiLoCo state: names starting "opt." or "outer.").
tensor_map parameters_only(const tensor_map& state);

}  // namespace mesh
