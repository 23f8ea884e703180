#pragma once
/// What the HTTP server counts about the requests it answers, and the metric families of
/// `GET /metrics` built from those counts, the backend's queue and the mesh snapshot.
/// Thread-safe (one mutex: HTTP threads and the backend's thread record into it); no I/O, time is
/// passed in.
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "base/error.hpp"
#include "serving/backend.hpp"
#include "serving/mesh_view.hpp"
#include "serving/metrics.hpp"
#include "serving/rate_series.hpp"

namespace mesh::serving {

/// The route label of a request path: one of the server's routes ("/v1/models/{id}" for any
/// model), or "other", so that unknown URLs cannot grow the label set.
std::string route_label(std::string_view path);

/// Totals for the dashboard (the same counts /metrics exposes).
struct serving_totals {
  double requests = 0;           ///< HTTP requests answered on the completion routes
  double prompt_tokens = 0;
  double completion_tokens = 0;
};

class serving_stats {
 public:
  using clock = std::chrono::steady_clock;

  /// `origin`: when the server started (the series counts intervals from it).
  explicit serving_stats(clock::time_point origin);

  /// An HTTP request answered: by route label and status.
  void http_request(std::string_view route, int status);

  /// A completion request's first piece of text, `seconds` after the request arrived.
  void first_piece(const std::string& model, double seconds);
  /// The time between two consecutive pieces of one request.
  void piece_gap(const std::string& model, double seconds);

  /// A generation that finished (with a result, not an error): its tokens, and when it ran.
  void generation_done(const std::string& model, const generation_result& r, clock::time_point done);
  /// A completion request's whole time, arrival to its last byte (or its error).
  void request_duration(std::string_view route, double seconds);

  serving_totals totals() const;
  rate_series::view series(clock::time_point now) const;

  /// The whole `/metrics` text: these counts, `queue`, and what `mesh` says of peers, models
  /// and training runs.
  expected<std::string> prometheus(const backend_queue& queue, const mesh_snapshot& mesh) const;

 private:
  /// The per-model histogram of `map`, created with `bounds` on first use.
  static histogram& hist_for(std::map<std::string, histogram, std::less<>>& map, std::string_view key,
                             const std::vector<double>& bounds);

  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, double> requests_;  ///< (route, status) -> count
  std::map<std::string, double, std::less<>> prompt_tokens_, completion_tokens_;  ///< by model
  std::map<std::string, histogram, std::less<>> first_piece_, piece_gap_;         ///< by model
  std::map<std::string, histogram, std::less<>> duration_;                        ///< by route
  rate_series series_;
};

}  // namespace mesh::serving
