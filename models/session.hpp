#pragma once
/// An inference session: one model's weights and KV cache resident on a gpu::executor, a prompt
/// prefilled in batches, then tokens decoded one at a time.
///
///   auto ckpt = checkpoint::open(path);
///   auto ex = gpu::make_cpu_executor();                        // or make_vulkan_executor()
///   auto s = session::create(*ex, *ckpt, {});                  // plans and uploads the weights
///   auto logits = s->prefill(prompt_ids);                      // logits after the last prompt token
///   auto next = s->decode(token);                              // logits after `token`
///
/// Step graphs come in buckets, so that a new prompt length reuses a loaded program: a batch of n
/// tokens runs in a graph of max(min_batch, next power of two >= n) rows (longer prompts in
/// chunks of max_batch), attending over the next power of two >= the positions filled (at least
/// 64, at most the context). Each (batch, attended) pair is loaded once, on first use. Decode
/// steps (up to layers::fused_attention_max_rows rows, whose attention kernel reads only each
/// row's visible keys) attend over the whole context on a GPU (session_options::whole_context_decode),
/// so that they need one program per batch size, not one per batch size and length.
///
/// Pipeline stages: with session_options::layers a session holds only a range of the layers (and
/// uploads only their weights; the KV cache exists for its layers only). forward() runs it:
///
///   auto a = session::create(ex_a, ckpt, {.layers = {0, 12}});   // embeds the tokens
///   auto b = session::create(ex_b, ckpt, {.layers = {12, 24}});  // ends with the head
///   auto h = a->forward(prompt);          // hidden rows [prompt.size(), hidden_size] f32
///   auto logits = b->forward(*h);         // what a whole-model prefill(prompt) returns
///
/// Several sequences at once (session_options::slots; a server's continuous batching): each slot
/// holds a sequence with a KV cache of its own of context() rows. prefill(slot, tokens) appends to
/// one of them; decode(batch) appends one token to each of several in a single step (one graph
/// run, which reads the weights once for every row):
///
///   auto s = session::create(*ex, *ckpt, {.slots = 4});
///   auto a = s->prefill(0, prompt_a), b = s->prefill(1, prompt_b);
///   auto next = s->decode({{0, token_a}, {1, token_b}});      // logits after each, in order
///
/// The single-sequence calls (prefill(tokens), decode(token), reset(), position()) are slot 0's.
///
/// What travels between stages is the residual stream of the real rows only, row-major f32
/// [count, hidden_size] (no bucket padding: each stage pads its own batch, and padding rows never
/// reach a real row's result). Every stage keeps its own position, advanced by the rows it ran,
/// and the same reset(): a chain stays in step when each stage sees the same rows in order.
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.hpp"
#include "gpu/executor.hpp"
#include "models/checkpoint.hpp"
#include "models/layer_range.hpp"
#include "models/model_config.hpp"
#include "models/model_weights.hpp"
#include "models/sequence_model.hpp"

namespace mesh::models {

struct session_options {
  /// Positions the session holds (KV-cache rows). 0: the model's context, at most
  /// default_context_cap (a 128k-context model would otherwise allocate its whole cache); a
  /// larger value up to the model's context must be asked for.
  int64_t context = 0;
  static constexpr int64_t default_context_cap = 4096;
  int64_t min_batch = 16;   ///< smallest prefill bucket (a power of two)
  int64_t max_batch = 512;  ///< longest prefill chunk (a power of two)
  int64_t min_attended = 64;  ///< smallest attended-rows bucket
  /// Decode steps (at most layers::fused_attention_max_rows rows) attend over the whole context
  /// instead of a bucket of the positions filled: the fused attention op reads only the keys a
  /// row sees, so the results are the same, and a server loads one program per batch size
  /// instead of one per batch size and bucket (each load costs seconds on a GPU driver). auto:
  /// on for a GPU, off where the executor is a CPU (which materialises the cache rows it is
  /// given).
  enum class toggle { automatic, on, off };
  toggle whole_context_decode = toggle::automatic;
  /// With whole_context_decode in effect: load the decode step's programs for every batch size
  /// (up to the slots held and layers::fused_attention_max_rows rows) when the session is
  /// created, so that no request waits for one to load (a server: each costs seconds on a GPU);
  /// a whole-model session loads decode_greedy's program too.
  /// A session of the head alone loads head()'s programs for 1 to `slots` rows (its slots being
  /// the sequences of the pipeline it serves).
  bool prepare_decode = false;
  /// Prepended to every parameter name, so that several sessions can share one executor.
  std::string prefix;
  /// The layers this session holds: a pipeline stage (default: the whole model). A range the
  /// model lacks is an error naming it and the model's layer count.
  layer_range layers = {};
  /// Sequences held at once, each with a KV cache of `context` rows (device memory grows with
  /// it). 1 to max_slots.
  int64_t slots = 1;
  static constexpr int64_t max_slots = 256;
  /// Each layer's q, k, v projections and its gate and up projections as one weight each
  /// (weight_options::fuse_projections); off only to measure what fusing gains.
  bool fuse_projections = true;
};

/// Time and counts of the session's work so far.
struct session_stats {
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;  ///< tokens decoded (a batched step counts each of its sequences)
  int64_t decode_steps = 0;   ///< decode steps run (a batched step is one)
  double prefill_seconds = 0, decode_seconds = 0;
  double load_seconds = 0;      ///< uploading the weights
  double compile_seconds = 0;   ///< building and loading step graphs
  int64_t programs = 0;         ///< step graphs loaded
};

class session final : public sequence_model {
 public:
  /// Reads the config, plans the weights (an error names the file and a missing or misshapen
  /// tensor) and uploads them to `ex`, one tensor at a time: a weight the device stores as it is
  /// (f16, bf16, quantized blocks) straight from the mapped file, others converted to f32 one at a
  /// time. Each tensor's pages of the mapping are released once it is on the device, so resident
  /// memory stays near the larger of one tensor and what the executor itself keeps (the CPU
  /// executor keeps the weights; a GPU keeps them in device memory). `ex` and `ckpt` must outlive
  /// the session.
  static expected<session> create(gpu::executor& ex, const checkpoint& ckpt, const session_options& options = {});

  session(session&&) noexcept = default;
  session& operator=(session&&) noexcept = default;

  /// Appends `tokens` at position() and returns the logits [vocab] after the last one. An empty
  /// batch, a token outside the vocabulary or a batch that would pass context() is an error that
  /// says so (and changes nothing). prefill, decode and prefill_all_logits need the whole model
  /// (a stage session is an error that says to use forward).
  expected<std::vector<float>> prefill(std::span<const int32_t> tokens) override;
  /// Same as prefill of one token.
  expected<std::vector<float>> decode(int32_t token) override;
  /// sequence_model::decode_greedy on the device: a step graph that picks its token itself and
  /// feeds it to the next run (step_shape::greedy), run `count` times in one submission
  /// (executor::run_repeated); only the picked tokens come back, not the logits. Needs the whole
  /// model (otherwise: the default, decode and first_argmax on the host). A step whose logits
  /// hold no maximum (NaN) is an error naming its position; the steps before it stay appended.
  expected<std::vector<int32_t>> decode_greedy(int64_t slot, int32_t token, int64_t count) override;
  int64_t greedy_chunk() const override;
  expected<void> rewind(int64_t slot, int64_t position) override;
  /// Appends `tokens` and returns the logits after each of them, [tokens.size() * vocab] (tests
  /// and scoring; one batch, at most max_batch tokens).
  expected<std::vector<float>> prefill_all_logits(std::span<const int32_t> tokens);

  /// Runs this session's layers over the next positions, from tokens (a stage that holds layer 0)
  /// or from the previous stage's hidden rows (any other stage: count * hidden_size values, the
  /// rows forward returned there). Returns, on the stage that holds the last layer, the logits as
  /// prefill does ([vocab] of the last row, or [rows * vocab] with all_logits), and on any other
  /// stage the hidden rows [rows, hidden_size] f32 for the next one. Batches longer than
  /// max_batch run in chunks, as prefill's. Errors (changing nothing): the wrong kind of input for
  /// the stage, values that are not whole rows, no rows, a token outside the vocabulary, rows
  /// past the context. On the whole model, forward(tokens) is prefill(tokens).
  expected<std::vector<float>> forward(std::span<const int32_t> tokens, bool all_logits = false);
  expected<std::vector<float>> forward(std::span<const float> hidden, bool all_logits = false);
  /// forward() into the sequence in `slot`: `tokens` on a stage that embeds, else `hidden`.
  expected<std::vector<float>> forward(int64_t slot, std::span<const int32_t> tokens, std::span<const float> hidden);
  /// A batched stage step: row i of the input (tokens[i], or hidden row i) extends
  /// rows[i].slot's sequence at rows[i].position, which must be where that sequence stands (a
  /// stage that missed a step says so). Returns a hidden row per input row, [n, hidden_size], or
  /// on the last stage the logits after each, [n, vocab]. One graph run, as decode(batch).
  /// Errors change nothing: as decode(batch)'s, and the wrong kind or amount of input.
  expected<std::vector<float>> forward(std::span<const batch_row> rows, std::span<const int32_t> tokens,
                                       std::span<const float> hidden);

  /// On a session of the head alone (layer_range::head_of): the final norm and the head over
  /// hidden rows ([n, hidden_size], what a last stage without its head returns): the logits of
  /// each, [n, vocab]. It holds no sequence (no position moves). At most max_batch rows; errors:
  /// another kind of session, values that are not whole rows, no rows.
  expected<std::vector<float>> head(std::span<const float> hidden);

  /// Appends `tokens` to the sequence in `slot`, returns the logits [vocab] after the last one.
  /// Errors as prefill(tokens), and a slot outside [0, slots()).
  expected<std::vector<float>> prefill(int64_t slot, std::span<const int32_t> tokens) override;
  /// Appends each entry's token to its slot's sequence in one step; returns the logits [vocab]
  /// after each, in the batch's order. Errors (changing nothing): an empty batch, a slot outside
  /// [0, slots()) or named twice, a token outside the vocabulary, a sequence at its context.
  expected<std::vector<std::vector<float>>> decode(std::span<const slot_token> batch) override;
  /// Forgets the sequence in `slot` (0 <= slot < slots()).
  void reset(int64_t slot) override { positions_.at(static_cast<size_t>(slot)) = 0; }
  /// Positions filled in `slot` (0 <= slot < slots()).
  int64_t position(int64_t slot) const override { return positions_.at(static_cast<size_t>(slot)); }
  int64_t slots() const override { return static_cast<int64_t>(positions_.size()); }

  /// Forgets the sequence (the cache's rows are overwritten as positions are filled again).
  void reset() override { positions_[0] = 0; }
  /// Positions filled so far.
  int64_t position() const override { return positions_[0]; }
  int64_t context() const override { return context_; }
  const model_config& config() const override { return config_; }
  const session_stats& stats() const { return stats_; }
  /// The layers this session holds (resolved: [0, layers) for the whole model).
  const layer_range& layers() const { return weights_->layers(); }
  /// It embeds tokens (holds layer 0); otherwise it takes hidden rows.
  bool takes_tokens() const { return layers().takes_tokens(); }
  /// It returns logits (holds the last layer); otherwise hidden rows.
  bool returns_logits() const { return layers().returns_logits(config_.n_layers); }
  /// Device bytes of its weights (those uploaded) and of its layers' KV caches (every slot's).
  int64_t weight_bytes() const { return weights_->device_bytes(); }
  int64_t kv_cache_bytes() const;

 private:
  session() = default;
  expected<std::vector<float>> step(int64_t slot, std::span<const int32_t> tokens, std::span<const float> hidden,
                                    bool all_logits);
  expected<void> need_whole(const char* call) const;
  expected<void> check_slot(int64_t slot) const;
  expected<void> check_token(int32_t token) const;
  /// The attended rows of a step of `rows` rows whose longest sequence fills `filled` positions.
  int64_t attended_for(int64_t rows, int64_t filled) const;
  /// The rows of head()'s program for `n` hidden rows: the next power of two (few programs serve
  /// every count). Not min_batch, as prompts are: every padding row costs a matrix-vector pass
  /// over the head's weights and [vocab] logits read back, and a step's rows are few.
  int64_t head_rows(int64_t n) const;
  /// The positions head()'s program is built for: it attends to nothing, so the smallest.
  int64_t head_attended() const { return std::min(context_, options_.min_attended); }
  /// The batched step of decode(batch) and forward(rows, ...): row i of the input goes to
  /// rows[i]; returns the output rows in that order.
  expected<std::vector<float>> batch_step(std::span<const batch_row> rows, std::span<const int32_t> tokens,
                                          std::span<const float> hidden);
  /// The step graph of `batch` rows attending over `attended` rows (batched: a decode step of
  /// several slots), loaded on first use.
  expected<gpu::program_id> program(int64_t batch, int64_t attended, bool all_logits, bool batched = false);

  gpu::executor* ex_ = nullptr;
  model_config config_;
  std::unique_ptr<model_weights> weights_;
  session_options options_;
  std::string source_;
  int64_t context_ = 0;
  bool whole_context_decode_ = false;
  std::vector<int64_t> positions_ = {0};  ///< per slot
  std::map<std::tuple<int64_t, int64_t, bool, bool>, gpu::program_id> programs_;
  /// decode_greedy's step graph attending over `attended` rows, loaded on first use.
  expected<gpu::program_id> greedy_program(int64_t attended);
  std::map<int64_t, gpu::program_id> greedy_programs_;  ///< by attended rows
  std::vector<uint8_t> greedy_history_;                  ///< read back after decode_greedy
  session_stats stats_;
};

}  // namespace mesh::models
