#include "serving/server.hpp"

#include <signal.h>

#include <condition_variable>
#include <ctime>
#include <deque>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>

#include "serving/dashboard.hpp"
#include "serving/mesh_json.hpp"
#include "serving/response.hpp"
#include "serving/serving_stats.hpp"

namespace mesh::serving {

using clock_type = std::chrono::steady_clock;

namespace {

/// What a request's backend callbacks hand to the HTTP thread that answers it. Shared: the
/// backend may call on_done after the HTTP side gave up (timeout, client gone).
struct exchange {
  std::mutex mutex;
  std::condition_variable changed;
  struct piece {
    std::string text;
    std::vector<token_logprobs> logprobs;
  };
  std::deque<piece> pieces;
  std::optional<generation_outcome> outcome;
  /// When the last piece came (metrics: time to first token, gaps between pieces). Only the
  /// backend touches it: it calls a request's callbacks one at a time (from one of its threads).
  std::optional<clock_type::time_point> last_piece;
};

double seconds_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

void send_error(httplib::Response& res, const failure& f) {
  res.status = http_status(f.kind);
  res.set_content(error_body(f), "application/json");
}

}  // namespace

struct api_server::impl {
  generation_backend& backend;
  server_options options;
  httplib::Server http;
  std::thread listener;
  uint16_t port = 0;
  std::atomic<bool> draining{false};
  bool stopped = false;

  std::mutex mutex;
  std::condition_variable idle;
  std::set<std::shared_ptr<request_handle>> active;  ///< requests in flight, cancelled by stop()
  std::mt19937_64 seeds{std::random_device{}()};

  const clock_type::time_point started = clock_type::now();
  /// Shared with the backend's callbacks, which may run after the server is gone.
  std::shared_ptr<serving_stats> stats = std::make_shared<serving_stats>(started);

  impl(generation_backend& b, server_options o) : backend(b), options(std::move(o)) {}

  uint64_t fresh_seed() {
    std::lock_guard<std::mutex> lock(mutex);
    return seeds();
  }

  void track(const std::shared_ptr<request_handle>& h) {
    std::lock_guard<std::mutex> lock(mutex);
    active.insert(h);
  }
  void untrack(const std::shared_ptr<request_handle>& h) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      active.erase(h);
    }
    idle.notify_all();
  }

  /// The failure a cancelled request reports to its client: only stop() cancels a request whose
  /// client is still there.
  failure reported(const failure& f) const {
    if (f.kind == failure_kind::cancelled) return {failure_kind::no_capacity, "the server is stopping", ""};
    return f;
  }

  /// Whether the request may go on: not stopping, and the key matches when one is set.
  bool admit(const httplib::Request& req, httplib::Response& res) {
    if (draining.load()) {
      send_error(res, {failure_kind::no_capacity, "the server is stopping", ""});
      return false;
    }
    if (options.api_key.empty()) return true;
    const std::string auth = req.get_header_value("Authorization");
    if (bearer_matches(auth, options.api_key)) return true;
    send_error(res, {failure_kind::unauthorized,
                     auth.empty() ? "You didn't provide an API key: send it as 'Authorization: Bearer KEY'"
                                  : "Incorrect API key provided",
                     ""});
    return false;
  }

  void completion(const httplib::Request& req, httplib::Response& res, bool chat) {
    const auto arrived = clock_type::now();
    if (!admit(req, res)) return;
    if (req.body.size() > options.max_body_bytes) {
      send_error(res, {failure_kind::too_long, fmt::format("the request body is larger than {} bytes", options.max_body_bytes), ""});
      return;
    }
    auto parsed = chat ? parse_chat_request(req.body, fresh_seed(), options.limits)
                       : parse_completion_request(req.body, fresh_seed(), options.limits);
    if (!parsed) return send_error(res, parsed.error());
    response_meta meta{make_response_id(chat), static_cast<int64_t>(std::time(nullptr)), parsed->generation.model, chat,
                       parsed->generation.logprobs >= 0};
    const bool stream = parsed->stream, include_usage = parsed->include_usage;
    const auto deadline = arrived + options.request_timeout;
    const std::string route = route_label(req.path);

    auto ex = std::make_shared<exchange>();
    generation_callbacks cb;
    // Non-streamed requests get pieces too, for their timing only.
    cb.on_piece = [ex, stats = stats, model = meta.model, arrived, stream](std::string_view piece,
                                                                          std::span<const token_logprobs> logprobs) {
      const auto now = clock_type::now();
      if (ex->last_piece) stats->piece_gap(model, seconds_between(*ex->last_piece, now));
      else stats->first_piece(model, seconds_between(arrived, now));
      ex->last_piece = now;
      if (!stream) return;
      {
        std::lock_guard<std::mutex> lock(ex->mutex);
        ex->pieces.push_back({std::string(piece), {logprobs.begin(), logprobs.end()}});
      }
      ex->changed.notify_all();
    };
    cb.on_done = [ex, stats = stats, model = meta.model](generation_outcome outcome) {
      if (outcome) stats->generation_done(model, *outcome, clock_type::now());
      {
        std::lock_guard<std::mutex> lock(ex->mutex);
        ex->outcome = std::move(outcome);
      }
      ex->changed.notify_all();
    };
    auto started = backend.start(std::move(parsed->generation), std::move(cb));
    if (!started) return send_error(res, started.error());
    auto handle = *started;
    track(handle);
    auto finished = [this, route, arrived] { stats->request_duration(route, seconds_between(arrived, clock_type::now())); };

    if (!stream) {
      std::unique_lock<std::mutex> lock(ex->mutex);
      const bool done = ex->changed.wait_until(lock, deadline, [&] { return ex->outcome.has_value(); });
      if (!done) {
        lock.unlock();
        handle->cancel();
        untrack(handle);
        finished();
        return send_error(res, {failure_kind::timeout, "the request did not finish in time and was cancelled", ""});
      }
      generation_outcome outcome = std::move(*ex->outcome);
      lock.unlock();
      untrack(handle);
      finished();
      if (!outcome) return send_error(res, reported(outcome.error()));
      res.set_content(completion_json(meta, *outcome), "application/json");
      return;
    }

    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, ex, handle, meta, include_usage, deadline](size_t, httplib::DataSink& sink) {
          // The whole stream is written in this one call, on this connection's thread. A write
          // that fails means the client went away: cancel, and tell httplib to drop the
          // connection.
          auto write = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
          auto gone = [&] {
            handle->cancel();
            return false;
          };
          if (meta.chat && !write(sse_event(first_chunk_json(meta, include_usage)))) return gone();
          for (;;) {
            std::deque<exchange::piece> pieces;
            std::optional<generation_outcome> outcome;
            {
              std::unique_lock<std::mutex> lock(ex->mutex);
              const auto until = std::min(deadline, clock_type::now() + options.keepalive_interval);
              ex->changed.wait_until(lock, until, [&] { return !ex->pieces.empty() || ex->outcome.has_value(); });
              pieces.swap(ex->pieces);
              if (ex->outcome) outcome = std::move(ex->outcome);
            }
            for (const auto& p : pieces)
              if (!write(sse_event(piece_chunk_json(meta, p.text, p.logprobs, include_usage)))) return gone();
            if (outcome) {
              if (*outcome) {
                if (!write(sse_event(finish_chunk_json(meta, (*outcome)->reason, include_usage)))) return false;
                if (include_usage && !write(sse_event(usage_chunk_json(meta, **outcome)))) return false;
                if (!write(sse_done())) return false;
              } else if (!write(sse_event(error_body(reported(outcome->error()))))) {
                return false;
              }
              sink.done();
              return true;
            }
            if (clock_type::now() >= deadline) {
              handle->cancel();
              write(sse_event(error_body({failure_kind::timeout, "the request did not finish in time and was cancelled", ""})));
              sink.done();
              return true;
            }
            if (pieces.empty() && !write(": keep-alive\n\n")) return gone();
          }
        },
        [this, handle, finished](bool success) {
          if (!success) handle->cancel();
          untrack(handle);
          finished();
        });
  }

  void list_models(const httplib::Request& req, httplib::Response& res) {
    if (!admit(req, res)) return;
    const auto models = backend.models();
    if (req.matches.size() < 2) return res.set_content(models_json(models), "application/json");
    const std::string id = req.matches[1];
    for (const auto& m : models)
      if (m.id == id) return res.set_content(model_json(m), "application/json");
    send_error(res, {failure_kind::model_not_found, fmt::format("The model '{}' does not exist", id), "model"});
  }

  /// The mesh as the node sees it, or without a mesh this process's models.
  mesh_snapshot snapshot() const {
    if (options.snapshot) return options.snapshot();
    mesh_snapshot s;
    s.uptime_s = seconds_between(started, clock_type::now());
    for (const auto& m : backend.models()) {
      model_view v;
      v.id = m.id;
      v.context = m.context;
      s.models.push_back(std::move(v));
    }
    return s;
  }

  void mesh_page(const httplib::Request& req, httplib::Response& res) {
    if (!admit(req, res)) return;
    const serving_view view{backend.models(), backend.queue(), stats->totals(), stats->series(clock_type::now())};
    res.set_header("Cache-Control", "no-store");
    res.set_content(mesh_json(snapshot(), view), "application/json");
  }

  void metrics(const httplib::Request& req, httplib::Response& res) {
    if (!admit(req, res)) return;
    auto text = stats->prometheus(backend.queue(), snapshot());
    if (!text) return send_error(res, {failure_kind::internal, text.error().to_string(), ""});
    res.set_header("Cache-Control", "no-store");
    res.set_content(*text, "text/plain; version=0.0.4; charset=utf-8");
  }

  /// The page needs no key (it asks for one when /api/mesh says 401) and may load nothing from
  /// elsewhere: the policy allows its inline style and script and requests to this server only.
  void dashboard(const httplib::Request&, httplib::Response& res) {
    res.set_header("Content-Security-Policy",
                   "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
                   "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
    res.set_header("Cache-Control", "no-cache");
    const auto page = dashboard_html();
    res.set_content(page.data(), page.size(), "text/html; charset=utf-8");
  }

  /// Statuses httplib sets by itself (no route, body too large, malformed request) get OpenAI's
  /// error body too; responses the handlers wrote keep theirs.
  void error_page(const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    failure f{failure_kind::invalid_request, "", ""};
    if (res.status == 404) f.message = fmt::format("Unknown request URL: {} {}", req.method, req.path);
    else if (res.status == 413) f = {failure_kind::too_long, fmt::format("the request body is larger than {} bytes", options.max_body_bytes), ""};
    else if (res.status >= 500) f = {failure_kind::internal, fmt::format("HTTP {}", res.status), ""};
    else f.message = fmt::format("the HTTP request could not be handled (status {})", res.status);
    res.set_content(error_body(f), "application/json");
  }
};

expected<std::unique_ptr<api_server>> api_server::start(generation_backend& backend, server_options options) {
  auto p = std::make_unique<impl>(backend, std::move(options));
  impl* self = p.get();
  auto& http = p->http;
  const size_t threads = std::max<size_t>(1, p->options.threads);
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(p->options.max_body_bytes);
  // An idle keep-alive connection holds a thread: let it go soon, so that stop() is quick and
  // idle clients do not starve the pool.
  http.set_keep_alive_timeout(1);
  http.set_tcp_nodelay(true);  // a streamed piece is a small write that should leave at once
  http.Post("/v1/chat/completions", [self](const httplib::Request& req, httplib::Response& res) { self->completion(req, res, true); });
  http.Post("/v1/completions", [self](const httplib::Request& req, httplib::Response& res) { self->completion(req, res, false); });
  http.Get("/v1/models", [self](const httplib::Request& req, httplib::Response& res) { self->list_models(req, res); });
  http.Get(R"(/v1/models/(.+))", [self](const httplib::Request& req, httplib::Response& res) { self->list_models(req, res); });
  http.Get("/", [self](const httplib::Request& req, httplib::Response& res) { self->dashboard(req, res); });
  http.Get("/api/mesh", [self](const httplib::Request& req, httplib::Response& res) { self->mesh_page(req, res); });
  http.Get("/metrics", [self](const httplib::Request& req, httplib::Response& res) { self->metrics(req, res); });
  // Called after a response is written, a stream's last byte included: every request counts.
  http.set_logger([self](const httplib::Request& req, const httplib::Response& res) {
    self->stats->http_request(route_label(req.path), res.status);
  });
  http.set_error_handler([self](const httplib::Request& req, httplib::Response& res) { self->error_page(req, res); });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    send_error(res, {failure_kind::internal, "the server failed while handling the request", ""});
  });

  // cpp-httplib sets SO_REUSEPORT by default: a second server on a port in use would then bind
  // without an error and the kernel would share the connections between the two (two nodes on
  // one machine answering each other's clients). SO_REUSEADDR alone still allows a restart
  // while old connections sit in TIME_WAIT.
  http.set_socket_options([](int sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  const auto& bind = p->options.bind;
  int port = bind.port;
  if (bind.port == 0) port = http.bind_to_any_port(bind.host);
  else if (!http.bind_to_port(bind.host, bind.port)) port = -1;
  if (port <= 0)
    return make_error(error_code::io_error, fmt::format("API address {}:{}: cannot listen there (in use, or not an address "
                                                        "of this machine)", bind.host, bind.port));
  p->port = static_cast<uint16_t>(port);
  p->listener = std::thread([self] {
    // httplib writes with send() without MSG_NOSIGNAL: a client that went away would raise
    // SIGPIPE and end the process. Blocking it here, before the pool's threads are created
    // (they inherit the mask), turns it into EPIPE for this server's threads only, without
    // changing the process's signal disposition.
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    self->http.listen_after_bind();
  });
  return std::unique_ptr<api_server>(new api_server(std::move(p)));
}

api_server::api_server(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

api_server::~api_server() { stop(); }

uint16_t api_server::port() const { return impl_->port; }
const std::string& api_server::host() const { return impl_->options.bind.host; }

void api_server::stop() {
  impl& p = *impl_;
  if (p.stopped) return;
  p.stopped = true;
  p.draining.store(true);
  {
    std::unique_lock<std::mutex> lock(p.mutex);
    if (!p.idle.wait_for(lock, p.options.stop_grace, [&] { return p.active.empty(); }))
      for (const auto& h : p.active) h->cancel();
  }
  // The listener may not have entered its accept loop yet: stop() before that would be lost.
  for (int i = 0; i < 1000 && !p.http.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  p.http.stop();
  if (p.listener.joinable()) p.listener.join();
}

}  // namespace mesh::serving
