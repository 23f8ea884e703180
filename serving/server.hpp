#pragma once
/// The OpenAI-compatible HTTP API over a generation_backend (cpp-httplib):
///   POST /v1/chat/completions, POST /v1/completions (streamed as server-sent events or not),
///   GET /v1/models, GET /v1/models/{id};
/// and the node's own pages: GET / (the dashboard), GET /api/mesh (its JSON), GET /metrics
/// (Prometheus text).
/// Bound to loopback unless told otherwise; an optional bearer key; the body size, each model's
/// queue (the backend's) and each request's time are bounded; a streamed request is cancelled
/// when its client goes away. docs/serving.md has the details.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "base/error.hpp"
#include "serving/access.hpp"
#include "serving/backend.hpp"
#include "serving/mesh_view.hpp"
#include "serving/request.hpp"

namespace mesh::serving {

struct server_options {
  bind_address bind;         ///< 127.0.0.1, port 0 (the system picks; port() tells)
  std::string api_key;       ///< empty: no key asked for
  size_t max_body_bytes = size_t{4} << 20;
  /// From a request's arrival to its last byte: past it the generation is cancelled (504, or an
  /// error event in a stream).
  std::chrono::milliseconds request_timeout = std::chrono::minutes(10);
  /// A stream with nothing to send for this long gets an SSE comment line, which clients ignore:
  /// it finds a client that went away while the request waits in the queue or in a long prefill.
  std::chrono::milliseconds keepalive_interval = std::chrono::seconds(2);
  /// stop() waits this long for requests in flight before cancelling them.
  std::chrono::milliseconds stop_grace = std::chrono::seconds(5);
  size_t threads = 8;        ///< connections served at once
  request_limits limits;
  /// What the dashboard and /metrics show of the mesh. Empty: no mesh, only this process's
  /// serving figures (no nodes; the models are the backend's, without layers or stages).
  snapshot_source snapshot;
};

class api_server {
 public:
  /// Binds (an address in use or not local is an error naming it) and starts serving on its own
  /// threads. `backend` must outlive the server.
  static expected<std::unique_ptr<api_server>> start(generation_backend& backend, server_options options);

  /// stop().
  ~api_server();

  /// The port bound (the one picked when 0 was asked for).
  uint16_t port() const;
  const std::string& host() const;

  /// Graceful stop: new requests get 503 at once, those in flight have stop_grace to finish,
  /// then they are cancelled (a stream ends with an error event); then the listener closes and
  /// the threads are joined. Idempotent.
  void stop();

 private:
  struct impl;
  explicit api_server(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace mesh::serving
