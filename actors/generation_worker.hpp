#pragma once
/// Text generation for a node's clients, off the actors' message loop: one thread that loads
/// checkpoints (each on an executor of its own, kept for later requests) and runs one
/// generate_request at a time, sending pieces and the final message to the client as it goes.
/// No CAF here: the generator actor (generator_actor.cpp) is the thin shell that feeds it.
///
/// Requests wait in order; more than `max_waiting` waiting is refused with a message that says
/// so. A model stays loaded (keyed by its path) until `max_models` others were used after it.
/// Each model has an executor of its own, made by the node's device factory: the node's stage
/// executor is not thread-safe and serves jobs meanwhile, and dropping a model's executor frees
/// everything the session put on the device.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "actors/generate_request_check.hpp"
#include "base/error.hpp"
#include "base/node_id.hpp"
#include "gpu/executor.hpp"
#include "wire/messages.hpp"

namespace mesh::generation {

struct worker_options {
  size_t max_models = 2;     ///< loaded models kept (least recently used goes first)
  size_t max_waiting = 8;    ///< requests waiting behind the running one
  int64_t context = 0;       ///< session context; 0: the model's, capped (models::session_options)
  request_limits limits;
};

class worker {
 public:
  using executor_factory = std::function<expected<std::unique_ptr<gpu::executor>>()>;
  /// Sends a message to a client; called from the worker's thread and from submit()/cancel().
  using sender = std::function<void(const node_id& to, const msg::message& m)>;

  worker(executor_factory make_executor, sender send, worker_options options = {});
  /// Cancels the running request, drops the waiting ones (each told `cancelled`), joins.
  ~worker();
  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;

  /// Checks `r` (check_request) and queues it; a bad request or a full queue is answered at once
  /// with a failed generate_done. A request id the client already has waiting or running is
  /// refused too.
  void submit(const node_id& client, msg::generate_request r);
  /// Withdraws one request of `client` (waiting: answered `cancelled` now; running: it stops at
  /// its next token and ends `cancelled`). Unknown ids are ignored.
  void cancel(const node_id& client, uint64_t request);
  /// The client went away: everything of it stops (nothing is sent: it is not there).
  void client_gone(const node_id& client);
  /// Requests running or waiting.
  size_t pending() const;

 private:
  struct job {
    node_id client;
    msg::generate_request request;
    models::generate_options options;
    std::atomic<bool> cancel{false};
    std::atomic<bool> tell_client{true};  ///< false once the client is gone
  };
  struct loaded_model;

  void run();
  void serve(job& j);
  void send(const job& j, const msg::message& m);
  /// The model at `path`, loading it (and evicting the least recently used) if needed;
  /// `load_seconds` is the time that took (0 when it was loaded).
  expected<loaded_model*> model(const std::string& path, double& load_seconds);

  executor_factory make_executor_;
  sender send_;
  worker_options options_;

  mutable std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<job>> waiting_;
  std::shared_ptr<job> running_;  ///< read by cancel() under m_
  bool stopping_ = false;

  // The worker thread's own state.
  std::map<std::string, std::unique_ptr<loaded_model>> models_;
  uint64_t uses_ = 0;

  std::thread thread_;  ///< last: starts after everything above exists
};

}  // namespace mesh::generation
