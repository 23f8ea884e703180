#pragma once
/// The stages a node holds for its peers' split models (docs/serving.md, "Split over the mesh"):
/// stage_open loads a range of layers from this node's own copy of the checkpoint at the path
/// the peer named, stage_step runs it, stage_close drops it. No CAF here: the generator actor
/// feeds it; the work (loading, the device) runs on the host's own thread, never on an actor's.
///
/// A stage belongs to the node that opened it: a step or close from any other node finds no
/// stage (stages are keyed by owner and the owner's stage id). At most max_stages are held, all
/// owners together; an owner that leaves loses its stages.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "actors/blob_transfer.hpp"
#include "actors/stage_request_check.hpp"
#include "base/node_id.hpp"
#include "gpu/executor.hpp"
#include "wire/messages.hpp"

namespace mesh::generation {

struct stage_host_options {
  /// Makes each stage's executor (required): a stage never shares one with the node's models.
  std::function<expected<std::unique_ptr<gpu::executor>>()> make_executor;
  size_t max_stages = 4;
  std::string self;  ///< this node's name in error messages (its short id)
  stage_limits limits;
  /// The blob cache (<state-dir>/blobs) and the fetches into it: a stage whose checkpoint this
  /// node lacks at the path, when the opener offered its files (stage_open::files), is loaded
  /// from the cache, each file fetched from the opener first when not there (a directory's
  /// files are then linked under their names: blob_store::view). Without both, a missing
  /// checkpoint fails the open.
  std::shared_ptr<blobs::blob_store> blobs;
  std::shared_ptr<blobs::blob_fetcher> fetcher;
  /// A line per fetch or cache hit (the node logs it).
  std::function<void(const std::string&)> log;
};

class stage_host {
 public:
  /// Sends a reply to a peer (from the host's thread).
  using sender = std::function<void(const node_id& to, const msg::message& m)>;

  stage_host(stage_host_options options, sender send);
  /// Stops the thread (the work running finishes first) and drops every stage; nothing more is sent.
  ~stage_host();
  stage_host(const stage_host&) = delete;
  stage_host& operator=(const stage_host&) = delete;

  /// Queue a peer's message; the reply (stage_reply, none for a close) goes out from the thread.
  void open(const node_id& from, msg::stage_open m);
  void step(const node_id& from, msg::stage_step m);
  void close(const node_id& from, const msg::stage_close& m);
  /// The peer left: its stages go.
  void owner_gone(const node_id& owner);
  /// Stages held now.
  size_t stages() const;

 private:
  struct held;
  using key = std::pair<node_id, uint64_t>;
  void post(std::function<void()> work);
  void run();
  msg::stage_reply do_open(const node_id& from, const msg::stage_open& m);
  msg::stage_reply do_step(const node_id& from, const msg::stage_step& m);
  msg::stage_reply failed(uint64_t call, const error& e) const;
  /// The file to load for `m`: its own path when this node has it, else the cached blob
  /// (fetched from `from` when not cached), pinned while the stage lives.
  expected<blobs::blob_store::held> checkpoint_file(const node_id& from, const msg::stage_open& m);
  /// The chunks of `f` a stage reads (its ranges), from the partial blob in the cache, the
  /// missing ones fetched from `from` first.
  expected<blobs::blob_store::held> partial_file(const node_id& from, const msg::blob_file& f, const std::string& what);

  stage_host_options options_;
  sender send_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> work_;  ///< guarded by mutex_
  bool stopping_ = false;                   ///< guarded by mutex_
  std::map<key, std::unique_ptr<held>> stages_;  ///< guarded by mutex_ (the thread changes it)
  std::thread thread_;
};

}  // namespace mesh::generation
