#include "actors/generation_worker.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "actors/generation_stream.hpp"
#include "models/chat_template.hpp"
#include "models/checkpoint.hpp"
#include "models/checkpoint_tokenizer.hpp"
#include "models/generate.hpp"
#include "models/session.hpp"
#include "models/tokenizer.hpp"

namespace mesh::generation {

/// A checkpoint ready to generate: its own executor, the mapped file, the session (weights and
/// KV cache on that executor) and the tokenizer. Members are destroyed in reverse order: the
/// session before the checkpoint it reads and the executor it runs on.
struct worker::loaded_model {
  std::unique_ptr<gpu::executor> ex;
  std::optional<models::checkpoint> ckpt;
  std::optional<models::session> session;
  std::optional<models::tokenizer> tok;
  std::optional<std::string> chat_template;  ///< the checkpoint's template text, if it has one
  uint64_t last_use = 0;
};

namespace {

using clock = std::chrono::steady_clock;

double seconds_since(clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); }

/// The key of a model: its path made absolute and free of "." and "..", so that two spellings of
/// one checkpoint share it (symbolic links are not resolved for a path that does not exist).
std::string model_key(const std::string& path) {
  std::error_code ec;
  auto p = std::filesystem::weakly_canonical(path, ec);
  return ec ? path : p.string();
}

/// The token text of `id` for a chat template (BOS/EOS written into the prompt), or "".
std::string token_text(const models::tokenizer& tok, const std::optional<int32_t>& id) {
  if (!id || *id < 0 || static_cast<size_t>(*id) >= tok.vocab().tokens.size()) return {};
  return tok.piece(*id);
}

}  // namespace

worker::worker(executor_factory make_executor, sender send, worker_options options)
    : make_executor_(std::move(make_executor)), send_(std::move(send)), options_(std::move(options)),
      thread_([this] { run(); }) {}

worker::~worker() {
  std::deque<std::shared_ptr<job>> dropped;
  {
    std::lock_guard<std::mutex> lock(m_);
    stopping_ = true;
    if (running_) running_->cancel = true;
    dropped.swap(waiting_);
    cv_.notify_all();
  }
  thread_.join();
  for (const auto& j : dropped) send(*j, cancelled(j->request.request));
}

void worker::send(const job& j, const msg::message& m) {
  if (j.tell_client) send_(j.client, m);
}

void worker::submit(const node_id& client, msg::generate_request r) {
  auto checked = check_request(r, options_.limits);
  if (!checked) {
    send_(client, failed(r.request, checked.error()));
    return;
  }
  auto j = std::make_shared<job>();
  j->client = client;
  j->options = std::move(*checked);
  j->request = std::move(r);
  std::unique_lock<std::mutex> lock(m_);
  const auto same = [&](const std::shared_ptr<job>& o) { return o->client == client && o->request.request == j->request.request; };
  if ((running_ && same(running_)) || std::any_of(waiting_.begin(), waiting_.end(), same)) {
    lock.unlock();
    send_(client, failed(j->request.request, {error_code::invalid_argument,
                                              fmt::format("generate: request {} is already running or waiting", j->request.request)}));
    return;
  }
  if (waiting_.size() >= options_.max_waiting) {
    const std::string state = fmt::format("{}{} waiting", running_ ? "one generation running, " : "", waiting_.size());
    lock.unlock();
    send_(client, failed(j->request.request, {error_code::limit_exceeded,
                                              fmt::format("generate: the node is busy ({}); try again later", state)}));
    return;
  }
  waiting_.push_back(std::move(j));
  cv_.notify_all();
}

void worker::cancel(const node_id& client, uint64_t request) {
  std::shared_ptr<job> dropped;
  {
    std::lock_guard<std::mutex> lock(m_);
    if (running_ && running_->client == client && running_->request.request == request) {
      running_->cancel = true;
      return;
    }
    auto it = std::find_if(waiting_.begin(), waiting_.end(),
                           [&](const auto& j) { return j->client == client && j->request.request == request; });
    if (it == waiting_.end()) return;
    dropped = std::move(*it);
    waiting_.erase(it);
  }
  send(*dropped, cancelled(request));
}

void worker::client_gone(const node_id& client) {
  std::lock_guard<std::mutex> lock(m_);
  if (running_ && running_->client == client) {
    running_->tell_client = false;
    running_->cancel = true;
  }
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), [&](const auto& j) { return j->client == client; }),
                 waiting_.end());
}

size_t worker::pending() const {
  std::lock_guard<std::mutex> lock(m_);
  return waiting_.size() + (running_ ? 1 : 0);
}

void worker::run() {
  for (;;) {
    std::shared_ptr<job> j;
    {
      std::unique_lock<std::mutex> lock(m_);
      cv_.wait(lock, [&] { return stopping_ || !waiting_.empty(); });
      if (stopping_) return;
      j = std::move(waiting_.front());
      waiting_.pop_front();
      running_ = j;
    }
    serve(*j);
    std::lock_guard<std::mutex> lock(m_);
    running_.reset();
  }
}

expected<worker::loaded_model*> worker::model(const std::string& path, double& load_seconds) {
  const std::string key = model_key(path);
  load_seconds = 0;
  if (auto it = models_.find(key); it != models_.end()) {
    it->second->last_use = ++uses_;
    return it->second.get();
  }
  const auto t0 = clock::now();
  // Room first: the model going out frees its device memory before the new one takes any.
  while (!models_.empty() && models_.size() >= options_.max_models) {
    auto oldest = std::min_element(models_.begin(), models_.end(),
                                   [](const auto& a, const auto& b) { return a.second->last_use < b.second->last_use; });
    models_.erase(oldest);
  }
  auto lm = std::make_unique<loaded_model>();
  auto ckpt = models::checkpoint::open(path);
  if (!ckpt) return forward_error(ckpt);
  lm->ckpt.emplace(std::move(*ckpt));
  auto ex = make_executor_();
  if (!ex) return forward_error(ex);
  lm->ex = std::move(*ex);
  models::session_options so;
  so.context = options_.context;
  auto s = models::session::create(*lm->ex, *lm->ckpt, so);
  if (!s) return forward_error(s);
  lm->session.emplace(std::move(*s));
  auto vocab = models::load_tokenizer(*lm->ckpt, lm->session->config());
  if (!vocab) return forward_error(vocab);
  lm->chat_template = vocab->chat_template;
  auto tok = models::tokenizer::create(std::move(vocab->vocab));
  if (!tok) return forward_error(tok);
  lm->tok.emplace(std::move(*tok));
  lm->last_use = ++uses_;
  load_seconds = seconds_since(t0);
  return models_.emplace(key, std::move(lm)).first->second.get();
}

void worker::serve(job& j) {
  const auto& r = j.request;
  if (j.cancel) {
    send(j, cancelled(r.request));
    return;
  }
  double load_seconds = 0;
  auto lm = model(r.model, load_seconds);
  if (!lm) {
    send(j, failed(r.request, lm.error()));
    return;
  }
  auto& m = **lm;
  // The prompt: as given, or rendered as one user message by the checkpoint's chat template
  // (which writes BOS itself where the family wants it, so no special tokens are added).
  std::string text = r.prompt;
  models::encode_options eo;
  if (r.chat) {
    const models::chat_tokens special{token_text(*m.tok, m.tok->vocab().bos_id), token_text(*m.tok, m.tok->vocab().eos_id)};
    if (!m.chat_template && r.chat_template.empty()) {
      send(j, failed(r.request, {error_code::not_found, fmt::format("generate: {} has no chat template; name one with "
                                                                    "--chat-template NAME, or send the prompt without --chat",
                                                                    r.model)}));
      return;
    }
    auto tmpl = r.chat_template.empty() ? models::detect_chat_template(*m.chat_template, special)
                                        : models::chat_template_by_name(r.chat_template, special);
    if (!tmpl) {
      send(j, failed(r.request, {tmpl.error().code, r.model + ": " + tmpl.error().message}));
      return;
    }
    const models::chat_message user{"user", r.prompt};
    auto rendered = tmpl->render({&user, 1}, true);
    if (!rendered) {
      send(j, failed(r.request, rendered.error()));
      return;
    }
    text = std::move(*rendered);
    eo.add_special = false;
  }
  auto ids = m.tok->encode(text, eo);
  if (!ids) {
    send(j, failed(r.request, ids.error()));
    return;
  }
  auto fit = fit_context(static_cast<int64_t>(ids->size()), j.options.max_tokens, m.session->context(), r.model);
  if (!fit) {
    send(j, failed(r.request, fit.error()));
    return;
  }
  auto options = j.options;
  options.max_tokens = fit->max_tokens;
  generation_stream stream(r.request);
  // Checked at every token (not only when text comes out): a withdrawn request stops within one
  // decode step.
  options.on_token = [&](int64_t n) {
    stream.token(n);
    return !j.cancel;
  };
  m.session->reset();
  auto g = models::generate(*m.session, *m.tok, *ids, options, [&](std::string_view piece) {
    send(j, stream.piece(piece));
    return !j.cancel;
  });
  if (!g) {
    send(j, failed(r.request, g.error()));
    return;
  }
  send(j, stream.done(*g, *fit, load_seconds));
}

}  // namespace mesh::generation
