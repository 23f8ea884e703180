#pragma once
/// Text generation for a node's clients (`meshctl generate`, client::generate): the wire's
/// generate_request / _cancel in, generate_piece / _done out, over the node's model host
/// (serving::local_backend, which also serves the HTTP API). No CAF here: the generator actor
/// (generator_actor.cpp) is the thin shell that feeds it.
///
/// A request names a loaded model by id or a checkpoint by path (loaded on demand by the host,
/// which keeps a few). The host runs one generation at a time; its queues bound the waiting ones,
/// and a request past them is refused with a message that says so. Messages are sent from the
/// host's thread and from the caller's.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "actors/generate_request_check.hpp"
#include "base/node_id.hpp"
#include "serving/local_backend.hpp"
#include "wire/messages.hpp"

namespace mesh::generation {

struct worker_options {
  request_limits limits;
};

class worker {
 public:
  /// Sends a message to a client.
  using sender = std::function<void(const node_id& to, const msg::message& m)>;

  /// `host` must outlive the worker's requests: destroy the worker before the host (the host's
  /// destructor ends what is still running; nothing is sent once the worker is gone).
  worker(serving::local_backend& host, sender send, worker_options options = {});
  /// Cancels every request still running or waiting; nothing more is sent to anyone.
  ~worker();
  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;

  /// Checks `r` (check_request) and hands it to the host; a bad request, an unknown model or a
  /// full queue is answered at once with a failed generate_done. A request id the client already
  /// has waiting or running is refused too.
  void submit(const node_id& client, msg::generate_request r);
  /// Withdraws one request of `client` (waiting: answered `cancelled` at once; running: it stops
  /// at its next token and ends `cancelled`). Unknown ids are ignored.
  void cancel(const node_id& client, uint64_t request);
  /// The client went away: everything of it stops (nothing is sent: it is not there).
  void client_gone(const node_id& client);
  /// Requests running or waiting.
  size_t pending() const;

 private:
  using key = std::pair<node_id, uint64_t>;
  struct live_request {
    std::shared_ptr<serving::request_handle> handle;  ///< null until the host took it
    bool tell_client = true;                          ///< false once the client is gone
  };
  /// What the host's callbacks reach: it outlives the worker if the host still runs a request.
  struct shared {
    sender send;
    mutable std::mutex m;
    std::map<key, live_request> live;
    bool closed = false;
    /// Sends `m` to the client of `k` unless it left or the worker is gone; `last` forgets `k`.
    void tell(const key& k, const msg::message& m, bool last);
  };

  serving::local_backend& host_;
  worker_options options_;
  std::shared_ptr<shared> s_;
};

}  // namespace mesh::generation
