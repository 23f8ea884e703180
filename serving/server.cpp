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

#include "serving/response.hpp"

namespace mesh::serving {

using clock_type = std::chrono::steady_clock;

namespace {

/// What a request's backend callbacks hand to the HTTP thread that answers it. Shared: the
/// backend may call on_done after the HTTP side gave up (timeout, client gone).
struct exchange {
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::string> pieces;
  std::optional<generation_outcome> outcome;
};

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
    response_meta meta{make_response_id(chat), static_cast<int64_t>(std::time(nullptr)), parsed->generation.model, chat};
    const bool stream = parsed->stream, include_usage = parsed->include_usage;
    const auto deadline = arrived + options.request_timeout;

    auto ex = std::make_shared<exchange>();
    generation_callbacks cb;
    if (stream)
      cb.on_piece = [ex](std::string_view piece) {
        {
          std::lock_guard<std::mutex> lock(ex->mutex);
          ex->pieces.emplace_back(piece);
        }
        ex->changed.notify_all();
      };
    cb.on_done = [ex](generation_outcome outcome) {
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

    if (!stream) {
      std::unique_lock<std::mutex> lock(ex->mutex);
      const bool done = ex->changed.wait_until(lock, deadline, [&] { return ex->outcome.has_value(); });
      if (!done) {
        lock.unlock();
        handle->cancel();
        untrack(handle);
        return send_error(res, {failure_kind::timeout, "the request did not finish in time and was cancelled", ""});
      }
      generation_outcome outcome = std::move(*ex->outcome);
      lock.unlock();
      untrack(handle);
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
            std::deque<std::string> pieces;
            std::optional<generation_outcome> outcome;
            {
              std::unique_lock<std::mutex> lock(ex->mutex);
              const auto until = std::min(deadline, clock_type::now() + options.keepalive_interval);
              ex->changed.wait_until(lock, until, [&] { return !ex->pieces.empty() || ex->outcome.has_value(); });
              pieces.swap(ex->pieces);
              if (ex->outcome) outcome = std::move(ex->outcome);
            }
            for (const auto& p : pieces)
              if (!write(sse_event(piece_chunk_json(meta, p, include_usage)))) return gone();
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
        [this, handle](bool success) {
          if (!success) handle->cancel();
          untrack(handle);
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
  http.set_error_handler([self](const httplib::Request& req, httplib::Response& res) { self->error_page(req, res); });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    send_error(res, {failure_kind::internal, "the server failed while handling the request", ""});
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
