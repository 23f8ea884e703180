#pragma once
/// The serving node's side of a model split over the mesh: stages on peers, reached through
/// stage_open / stage_step / stage_close and answered by stage_reply (docs/serving.md, "Split
/// over the mesh"). No CAF here: the generator actor hands replies and departures in.
///
/// A call blocks its caller until the peer answers, the peer leaves, or a timeout passes, so
/// calls run on the model host's threads (its worker steps the pipeline, its loader opens
/// stages), never on an actor's.
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "base/error.hpp"
#include "base/node_id.hpp"
#include "models/layer_range.hpp"
#include "models/pipeline.hpp"
#include "wire/messages.hpp"

namespace mesh::generation {

/// Calls to peers' stage hosts that wait for their stage_reply.
class stage_calls {
 public:
  /// Sends to a peer; false when it is not connected (nothing was sent).
  using sender = std::function<bool(const node_id& to, const msg::message& m)>;

  explicit stage_calls(sender send) : send_(std::move(send)) {}

  /// Sends `m` (a stage_open or stage_step; its call id is set here) and waits for the answer.
  /// Errors (unavailable, naming the node): not connected, it left while we waited, no answer
  /// within `timeout`, calls closed; or the peer's own error, as it sent it.
  expected<msg::stage_reply> call(const node_id& to, msg::message m, std::chrono::milliseconds timeout);
  /// Sends without waiting (stage_close); false when not sent.
  bool tell(const node_id& to, const msg::message& m);
  /// A stage_reply from a peer: wakes the call it answers (others are ignored: a late answer to a
  /// call that timed out, or one from a node the call did not go to).
  void deliver(const node_id& from, const msg::stage_reply& r);
  /// The peer left: its calls fail now.
  void peer_gone(const node_id& peer);
  /// No more calls: waiting ones fail, later ones fail at once, nothing is sent.
  void close();
  /// A stage id, unique for this node's lifetime.
  uint64_t next_stage();

 private:
  struct pending {
    node_id to;
    std::optional<expected<msg::stage_reply>> outcome;
  };
  sender send_;
  std::mutex m_;
  std::condition_variable answered_;
  std::map<uint64_t, pending> pending_;  ///< by call id
  uint64_t next_call_ = 1, next_stage_ = 1;
  bool closed_ = false;
};

/// Timeouts of calls to stage peers. Loading reads a whole range of a checkpoint on the peer.
/// A step waits `step` until the stage has answered a few; from then on `factor` times the
/// longest time per row of its recent steps, times the step's rows, between `floor` and `step`:
/// a stage node that stays connected but stops answering (a hung device) is failed over in
/// seconds once its speed is known, not minutes.
struct remote_stage_timeouts {
  std::chrono::milliseconds open{std::chrono::minutes(10)};
  std::chrono::milliseconds step{std::chrono::minutes(2)};
  double factor = 20;
  std::chrono::milliseconds floor{std::chrono::seconds(10)};
};

/// A stage on a peer, as a pipeline link. Closing it (the destructor) tells the peer to drop it.
class remote_stage final : public models::stage_link {
 public:
  /// Asks `peer` to load `layers` of its copy of `path` holding `slots` sequences of `context`
  /// positions (of a model whose hidden rows have `hidden_size` values); the peer's error (no
  /// such file there, no room)
  /// comes back naming it. `files` (blob_offers::offer_checkpoint) offers the checkpoint's files
  /// for fetching: a peer without its own copy fetches them from this node into its blob cache.
  static expected<std::unique_ptr<remote_stage>> open(std::shared_ptr<stage_calls> calls, const node_id& peer, const std::string& path,
                                                      const models::layer_range& layers, int64_t context, int64_t hidden_size,
                                                      remote_stage_timeouts timeouts = {}, std::vector<msg::blob_file> files = {},
                                                      int64_t slots = 1);
  ~remote_stage() override;
  expected<std::vector<float>> forward(int64_t slot, int64_t start, std::span<const int32_t> tokens,
                                       std::span<const float> hidden) override;
  expected<std::vector<float>> forward(std::span<const models::batch_row> rows, std::span<const int32_t> tokens,
                                       std::span<const float> hidden) override;

 private:
  remote_stage() = default;
  /// Sends a step with `tokens` or `hidden` as its input and returns the reply's f32 values.
  expected<std::vector<float>> call_step(msg::stage_step s, std::span<const int32_t> tokens, std::span<const float> hidden);
  std::shared_ptr<stage_calls> calls_;
  node_id peer_;
  uint64_t stage_ = 0;
  int64_t hidden_size_ = 0;
  remote_stage_timeouts timeouts_;
  /// Seconds per row of the last steps answered (at most 16; the first few include compiling).
  std::deque<double> per_row_;
  size_t answered_ = 0;
  /// How long a step of `rows` rows may take (remote_stage_timeouts).
  std::chrono::milliseconds step_deadline(int64_t rows) const;
};

}  // namespace mesh::generation
