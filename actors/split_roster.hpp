#pragma once
/// The peers a node's split models may re-plan over, and the news of their coming and going
/// (docs/serving.md, "Split over the mesh"). No CAF: the generator actor feeds it from the node's
/// membership (a peer's hello) and health (a connection closed, a peer Dead); the failover
/// pipelines read it and are told of each change on the roster's own thread, where a re-plan may
/// take as long as loading layers takes without holding up the actor that reported the change.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "actors/free_memory.hpp"
#include "actors/split_replan.hpp"

namespace mesh::generation {

/// A change of the roster, as listeners hear it.
struct roster_event {
  enum class kind { joined, left };
  kind what = kind::joined;
  node_id peer;
};

class split_roster {
 public:
  using listener = std::function<void(const roster_event&)>;

  /// `memory`, when given, replaces each candidate's memory with its latest free figure.
  explicit split_roster(std::shared_ptr<const free_memory> memory = nullptr);
  /// close().
  ~split_roster();
  split_roster(const split_roster&) = delete;
  split_roster& operator=(const split_roster&) = delete;

  /// A peer said hello (again: its description is replaced). Returns at once.
  void joined(const split_candidate& peer);
  /// A peer's connection closed or health declared it Dead. Returns at once; an unknown peer is
  /// still announced (a stage call may have gone to it).
  void left(const node_id& peer);
  /// The peers alive now, in id order, with their free memory now.
  std::vector<split_candidate> live() const;
  /// `c` with its free memory now (this node's too); unchanged when nothing newer is known.
  split_candidate current(split_candidate c) const;

  /// Calls `l` on the roster's thread for every later change; the id is for unsubscribe().
  uint64_t subscribe(listener l);
  /// After it returns, `l` runs no more (it waits for a call under way).
  void unsubscribe(uint64_t id);
  /// Stops the thread (waiting for a call under way); later changes are recorded, not told.
  void close();

 private:
  void run();

  std::shared_ptr<const free_memory> memory_;
  mutable std::mutex m_;  ///< peers_, events_, closed_, next_
  std::condition_variable wake_;
  std::map<node_id, split_candidate> peers_;
  std::deque<roster_event> events_;
  bool closed_ = false;
  uint64_t next_ = 1;
  std::mutex dispatch_m_;  ///< held while listeners run, and to change them
  std::map<uint64_t, listener> listeners_;
  std::thread thread_;
};

}  // namespace mesh::generation
