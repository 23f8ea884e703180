#include "serving/local_backend.hpp"

#include <chrono>
#include <ctime>
#include <optional>

#include <fmt/format.h>

#include "models/chat_template.hpp"
#include "models/checkpoint.hpp"
#include "models/checkpoint_tokenizer.hpp"
#include "models/generate.hpp"
#include "models/session.hpp"
#include "models/tokenizer.hpp"

namespace mesh::serving {

using clock_type = std::chrono::steady_clock;

struct local_backend::model {
  model_info info;
  // The session reads the checkpoint's mapping: both live here, the checkpoint at a fixed address.
  std::unique_ptr<models::checkpoint> ckpt;
  std::optional<models::session> sess;
  std::optional<models::tokenizer> tok;
  std::optional<models::chat_template> tmpl;
  std::string no_template;  ///< why chat is refused when tmpl is empty
  size_t max_queued = 0;
  size_t queued = 0;  ///< waiting, the running one not counted (guarded by mutex_)
};

struct local_backend::job {
  model* m = nullptr;
  std::vector<int32_t> prompt;
  models::generate_options options;
  generation_callbacks callbacks;
  std::shared_ptr<request_handle> handle;
  clock_type::time_point queued_at;
};

namespace {

std::string default_id(const std::filesystem::path& path) {
  std::filesystem::path p = path;
  if (p.filename().empty()) p = p.parent_path();  // "dir/"
  if (p.extension() == ".gguf") return p.stem().string();
  return p.filename().string();
}

std::string join_ids(const std::vector<model_info>& models) {
  std::string s;
  for (const auto& m : models) s += (s.empty() ? "" : ", ") + m.id;
  return s.empty() ? "none" : s;
}

}  // namespace

expected<std::unique_ptr<local_backend>> local_backend::create(gpu::executor& ex, std::vector<local_model_options> models) {
  std::unique_ptr<local_backend> b(new local_backend());
  for (size_t i = 0; i < models.size(); ++i) {
    const auto& o = models[i];
    auto m = std::make_unique<model>();
    m->info.id = o.id.empty() ? default_id(o.path) : o.id;
    for (const auto& other : b->models_)
      if (other->info.id == m->info.id)
        return make_error(error_code::invalid_argument,
                          fmt::format("{}: a model with the id '{}' is already loaded", o.path.string(), m->info.id));
    auto ckpt = models::checkpoint::open(o.path);
    if (!ckpt) return forward_error(ckpt);
    m->ckpt = std::make_unique<models::checkpoint>(std::move(*ckpt));
    models::session_options so;
    so.context = o.context;
    so.prefix = fmt::format("m{}.", i);  // sessions share the executor's parameter names
    auto sess = models::session::create(ex, *m->ckpt, so);
    if (!sess) return forward_error(sess);
    m->sess.emplace(std::move(*sess));
    auto vocab = models::load_tokenizer(*m->ckpt, m->sess->config());
    if (!vocab) return forward_error(vocab);
    auto tok = models::tokenizer::create(vocab->vocab);
    if (!tok) return forward_error(tok);
    m->tok.emplace(std::move(*tok));
    models::chat_tokens special;
    const auto& v = m->tok->vocab();
    if (v.bos_id) special.bos = m->tok->piece(*v.bos_id);
    if (v.eos_id) special.eos = m->tok->piece(*v.eos_id);
    if (!o.chat_template.empty()) {
      // A template named by the operator must exist: a typo is a load error, not a model that
      // silently refuses chats.
      auto t = models::chat_template_by_name(o.chat_template, special);
      if (!t) return make_error(t.error().code, fmt::format("{}: {}", o.path.string(), t.error().message));
      m->tmpl = std::move(*t);
    } else if (vocab->chat_template) {
      auto t = models::detect_chat_template(*vocab->chat_template, special);
      if (t) m->tmpl = std::move(*t);
      else m->no_template = t.error().message;
    } else {
      m->no_template = fmt::format("the checkpoint {} has no chat template: load it with a template name (one of chatml, "
                                   "llama3, llama3.1, llama2, mistral, gemma), or use /v1/completions",
                                   o.path.string());
    }
    m->info.context = m->sess->context();
    m->info.created = static_cast<int64_t>(std::time(nullptr));
    m->info.chat = m->tmpl.has_value();
    m->max_queued = o.max_queued;
    b->models_.push_back(std::move(m));
  }
  b->worker_ = std::thread([p = b.get()] { p->run(); });
  return b;
}

local_backend::~local_backend() {
  std::deque<std::unique_ptr<job>> left;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
  left.swap(queue_);  // the worker has exited: nothing else touches the queue
  for (auto& j : left) j->callbacks.on_done(fail(failure_kind::no_capacity, "the server is stopping"));
}

std::vector<model_info> local_backend::models() const {
  std::vector<model_info> out;
  for (const auto& m : models_) out.push_back(m->info);
  return out;
}

backend_queue local_backend::queue() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {running_ ? 1 : 0, static_cast<int64_t>(queue_.size())};
}

local_backend_stats local_backend::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

result<std::shared_ptr<request_handle>> local_backend::start(generation_request request, generation_callbacks callbacks) {
  model* m = nullptr;
  for (const auto& x : models_)
    if (x->info.id == request.model) m = x.get();
  if (!m)
    return fail(failure_kind::model_not_found,
                fmt::format("The model '{}' does not exist (loaded: {})", request.model, join_ids(models())), "model");

  // Rendering and encoding run here, on the caller's thread (the tokenizer is thread-safe), so
  // that what is wrong with a request is known before it waits in the queue.
  std::string text;
  models::encode_options eo;
  const char* input = request.chat ? "messages" : "prompt";
  if (request.chat) {
    if (!m->tmpl) return fail(failure_kind::invalid_request, m->no_template, "messages");
    auto rendered = m->tmpl->render(request.messages, /*add_generation_prompt=*/true);
    if (!rendered) return fail(failure_kind::invalid_request, rendered.error().message, "messages");
    text = std::move(*rendered);
    eo.add_special = false;  // the template writes BOS where it belongs
  } else {
    text = std::move(request.prompt);
  }
  // parse_special: the template's turn markers must become their control tokens. It also means
  // that control-token text inside a message becomes those tokens (as in llama.cpp's server).
  eo.parse_special = true;
  auto ids = m->tok->encode(text, eo);
  if (!ids)
    return fail(ids.error().code == error_code::limit_exceeded ? failure_kind::too_long : failure_kind::invalid_request,
                ids.error().message, input);
  if (ids->empty()) return fail(failure_kind::invalid_request, "the prompt is empty", input);
  const int64_t n = static_cast<int64_t>(ids->size()), context = m->info.context;
  if (n >= context)
    return fail(failure_kind::too_long,
                fmt::format("the prompt is {} tokens, but model '{}' has a context of {} positions", n, m->info.id, context),
                input);
  int64_t max_tokens = context - n;
  if (request.max_tokens) {
    if (n + *request.max_tokens > context)
      return fail(failure_kind::too_long,
                  fmt::format("{} prompt tokens plus max_tokens {} pass the context of {} positions of model '{}'", n,
                              *request.max_tokens, context, m->info.id),
                  "max_tokens");
    max_tokens = *request.max_tokens;
  }
  if (auto s = models::sampler::create(request.sampling); !s)
    return fail(failure_kind::invalid_request, s.error().message);

  auto j = std::make_unique<job>();
  j->m = m;
  j->prompt = std::move(*ids);
  j->options.sampling = request.sampling;
  j->options.max_tokens = max_tokens;
  j->options.stop = std::move(request.stop);
  j->options.stop_at_eos = !request.ignore_eos;
  j->callbacks = std::move(callbacks);
  j->handle = std::make_shared<request_handle>();
  j->queued_at = clock_type::now();
  auto handle = j->handle;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return fail(failure_kind::no_capacity, "the server is stopping");
    if (m->queued >= m->max_queued)
      return fail(failure_kind::queue_full,
                  fmt::format("model '{}' has {} requests waiting, its limit: retry later", m->info.id, m->queued));
    ++m->queued;
    queue_.push_back(std::move(j));
  }
  wake_.notify_one();
  return handle;
}

void local_backend::run() {
  for (;;) {
    std::unique_ptr<job> j;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      j = std::move(queue_.front());
      queue_.pop_front();
      --j->m->queued;
      running_ = true;
    }
    execute(*j);
    std::lock_guard<std::mutex> lock(mutex_);
    running_ = false;
  }
}

void local_backend::execute(job& j) {
  auto finish = [&](generation_outcome outcome) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (outcome) {
        ++stats_.completed;
        stats_.completion_tokens += outcome->completion_tokens;
      } else if (outcome.error().kind == failure_kind::cancelled) {
        ++stats_.cancelled;
      } else {
        ++stats_.failed;
      }
    }
    j.callbacks.on_done(std::move(outcome));
  };
  if (j.handle->cancelled()) return finish(fail(failure_kind::cancelled, "cancelled while queued"));
  const double queue_seconds = std::chrono::duration<double>(clock_type::now() - j.queued_at).count();
  model& m = *j.m;
  m.sess->reset();
  auto g = models::generate(*m.sess, *m.tok, j.prompt, j.options, [&](std::string_view piece) {
    // Checked before and after handing the piece on: a client that went away while the piece
    // was written stops the next token, not one more.
    if (j.handle->cancelled() || stopping_.load()) return false;
    if (j.callbacks.on_piece) j.callbacks.on_piece(piece);
    return !j.handle->cancelled();
  });
  if (!g) {
    const auto kind = g.error().code == error_code::limit_exceeded ? failure_kind::too_long : failure_kind::internal;
    return finish(fail(kind, g.error().message));
  }
  if (g->reason == models::stop_reason::callback) return finish(fail(failure_kind::cancelled, "cancelled"));
  generation_result r;
  r.reason = g->reason == models::stop_reason::max_tokens ? finish_reason::length : finish_reason::stop;
  r.text = std::move(g->text);
  r.prompt_tokens = static_cast<int64_t>(j.prompt.size());
  r.completion_tokens = static_cast<int64_t>(g->tokens.size());
  r.queue_seconds = queue_seconds;
  r.prompt_seconds = g->prompt_seconds;
  r.generate_seconds = g->generate_seconds;
  finish(std::move(r));
}

}  // namespace mesh::serving
