#include "serving/local_backend.hpp"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "models/chat_template.hpp"
#include "models/checkpoint.hpp"
#include "models/checkpoint_tokenizer.hpp"
#include "models/peft.hpp"
#include "models/generate.hpp"
#include "models/session.hpp"
#include "models/tokenizer.hpp"

namespace mesh::serving {

using clock_type = std::chrono::steady_clock;

/// A loaded model. Members are destroyed in reverse order: the session before the checkpoint it
/// reads and the executor it runs on.
struct local_backend::model {
  model_info info;
  std::string key;  ///< the checkpoint's path made absolute (by_path requests find it by this)
  std::unique_ptr<gpu::executor> ex;
  std::unique_ptr<models::checkpoint> ckpt;
  std::unique_ptr<models::sequence_model> seq;  ///< a whole-model session, or a split model's pipeline
  split_sequence* split = nullptr;              ///< seq, when split: its stages change on re-plans
  std::vector<bool> slot_busy;                  ///< one per sequence it holds (guarded by mutex_)
  std::optional<models::tokenizer> tok;
  models::chat_tokens special;              ///< BOS/EOS text for chat templates named per request
  std::optional<std::string> template_text; ///< the checkpoint's own template, if any
  std::optional<models::chat_template> tmpl;
  std::string no_template;  ///< why chat is refused when tmpl is empty
  size_t max_queued = 0;
  int64_t prefill_chunk = 0;
  size_t queued = 0;        ///< waiting, the running one not counted (guarded by mutex_)
  uint64_t last_use = 0;    ///< guarded by mutex_
  bool unloaded = false;    ///< guarded by mutex_: requests for it fail
};

struct local_backend::job {
  generation_request request;  ///< kept for a model loaded on demand (prepared once loaded)
  std::shared_ptr<model> m;    ///< null until a by_path model is loaded
  std::vector<int32_t> prompt;
  models::generate_options options;
  bool context_capped = false;
  generation_callbacks callbacks;
  std::shared_ptr<request_handle> handle;
  clock_type::time_point queued_at;
  std::atomic<bool> model_gone{false};  ///< its model was unloaded: end with no_capacity
  // Once admitted (worker thread only, but slot under mutex_):
  int64_t slot = -1;                    ///< the model's sequence it holds
  std::optional<models::generation_run> run;
  int32_t next = 0;                     ///< the token to decode in the next step
  size_t prefilled = 0;                 ///< prompt tokens read so far
  int64_t chunk = 0;                    ///< prompt tokens read per round
  double load_seconds = 0, queue_seconds = 0, prompt_seconds = 0;
  std::vector<token_logprobs> entries, result_logprobs;  ///< waiting for their piece; given out
};

namespace {

// A token's entry as the API shows it: ids become the tokens' bytes.
token_logprobs api_logprobs(const models::tokenizer& tok, const models::token_logprob& t) {
  token_logprobs out;
  out.token = {tok.piece(t.id), t.logprob};
  out.text_offset = t.text_offset;
  for (const auto& [id, lp] : t.top) out.top.push_back({tok.piece(id), lp});
  return out;
}

std::string default_id(const std::filesystem::path& path) {
  std::filesystem::path p = path;
  if (p.filename().empty()) p = p.parent_path();  // "dir/"
  if (p.extension() == ".gguf") return p.stem().string();
  return p.filename().string();
}

/// A checkpoint path made absolute and free of "." and "..", so that two spellings of one
/// checkpoint are one model (symbolic links are not resolved for a path that does not exist).
std::string path_key(const std::filesystem::path& path) {
  std::error_code ec;
  auto p = std::filesystem::weakly_canonical(path, ec);
  return ec ? path.string() : p.string();
}

/// The key of a checkpoint with an adapter merged in: another model than the checkpoint alone.
std::string model_key(const std::filesystem::path& path, const std::filesystem::path& adapter) {
  return adapter.empty() ? path_key(path) : path_key(path) + " + adapter " + path_key(adapter);
}

double seconds_since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

const char* const template_names = "chatml, llama3, llama3.1, llama2, mistral, gemma";

}  // namespace

local_backend::local_backend(local_backend_options options) : options_(std::move(options)) {}

expected<std::unique_ptr<local_backend>> local_backend::create(local_backend_options options,
                                                              std::vector<local_model_options> models) {
  if (!options.make_executor) return make_error(error_code::invalid_argument, "local_backend: no executor factory");
  std::unique_ptr<local_backend> b(new local_backend(std::move(options)));
  for (const auto& o : models)
    if (auto m = b->load(o); !m) return tl::unexpected(m.error());
  b->worker_ = std::thread([p = b.get()] { p->run(); });
  b->loader_ = std::thread([p = b.get()] { p->run_loads(); });
  return b;
}

local_backend::~local_backend() {
  std::deque<std::shared_ptr<job>> left;
  std::deque<pending_load> loads;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    for (auto& j : active_) j->handle->cancel();
  }
  wake_.notify_all();
  load_wake_.notify_all();
  if (worker_.joinable()) worker_.join();
  if (loader_.joinable()) loader_.join();
  {
    std::lock_guard<std::mutex> lock(mutex_);  // both threads have exited: only for form
    left.swap(queue_);
    loads.swap(loads_);
  }
  for (auto& j : left) j->callbacks.on_done(fail(failure_kind::no_capacity, "the server is stopping"));
  for (auto& l : loads) {
    if (l.task) l.task(true);
    else l.done(make_error(error_code::unavailable, l.options.path.string() + ": not loaded: the node is stopping"));
  }
}

expected<std::shared_ptr<local_backend::model>> local_backend::open_model(const local_model_options& o) {
  const auto in_path = [&](const error& e) { return make_error(e.code, fmt::format("{}: {}", o.path.string(), e.message)); };
  auto m = std::make_shared<model>();
  m->info.id = o.id.empty() ? default_id(o.path) : o.id;
  m->info.path = o.path.string();
  m->key = model_key(o.path, o.adapter);
  auto ckpt = models::checkpoint::open(o.path);
  if (!ckpt) return forward_error(ckpt);
  m->ckpt = std::make_unique<models::checkpoint>(std::move(*ckpt));
  if (!o.adapter.empty()) {
    if (o.split) return make_error(error_code::unsupported, o.path.string() + ": an adapter cannot be merged into a model split over nodes");
    auto config = models::read_model_config(*m->ckpt);
    if (!config) return forward_error(config);
    auto adapter = models::read_lora_adapter(o.adapter);
    if (!adapter) return forward_error(adapter);
    if (auto ok = models::merge_lora_adapter(*m->ckpt, *config, *adapter); !ok)
      return make_error(ok.error().code, o.adapter.string() + ": " + ok.error().message);
  }
  auto ex = options_.make_executor();
  if (!ex) return in_path(ex.error());
  m->ex = std::move(*ex);
  if (o.split) {
    auto config = models::read_model_config(*m->ckpt);
    if (!config) return forward_error(config);
    auto p = o.split({*m->ckpt, *config, o.context, *m->ex, o.parallel > 0 ? o.parallel : options_.parallel});
    if (!p) return in_path(p.error());
    m->split = p->get();
    m->info.stages = m->split->stages();
    m->seq = std::move(*p);
  } else {
    models::session_options so;
    so.context = o.context;
    so.slots = o.parallel > 0 ? o.parallel : options_.parallel;
    so.prepare_decode = true;
    auto sess = models::session::create(*m->ex, *m->ckpt, so);
    if (!sess) return forward_error(sess);
    m->seq = std::make_unique<models::session>(std::move(*sess));
  }
  m->slot_busy.assign(static_cast<size_t>(m->seq->slots()), false);
  auto vocab = models::load_tokenizer(*m->ckpt, m->seq->config());
  if (!vocab) return forward_error(vocab);
  m->template_text = vocab->chat_template;
  auto tok = models::tokenizer::create(std::move(vocab->vocab));
  if (!tok) return forward_error(tok);
  m->tok.emplace(std::move(*tok));
  m->special = models::chat_tokens_of(*m->tok);
  if (!o.chat_template.empty()) {
    // A template named by the operator must exist: a typo is a load error, not a model that
    // silently refuses chats.
    auto t = models::chat_template_by_name(o.chat_template, m->special);
    if (!t) return in_path(t.error());
    m->tmpl = std::move(*t);
  } else if (m->template_text) {
    auto t = models::detect_chat_template(*m->template_text, m->special);
    if (t) m->tmpl = std::move(*t);
    else m->no_template = t.error().message;
  } else {
    m->no_template = fmt::format("the checkpoint {} has no chat template: load it with a template name (one of {}), "
                                 "or use /v1/completions",
                                 o.path.string(), template_names);
  }
  m->info.context = m->seq->context();
  m->info.layers = m->seq->config().n_layers;
  m->info.created = static_cast<int64_t>(std::time(nullptr));
  m->info.chat = m->tmpl.has_value();
  m->max_queued = o.max_queued;
  m->prefill_chunk = o.prefill_chunk > 0 ? o.prefill_chunk : std::max<int64_t>(options_.prefill_chunk, 1);
  return m;
}

expected<model_info> local_backend::load(const local_model_options& o) {
  const std::string id = o.id.empty() ? default_id(o.path) : o.id;
  const auto taken = [&]() -> std::optional<error> {
    for (const auto& x : models_)
      if (x->info.id == id)
        return error{error_code::invalid_argument, fmt::format("{}: a model with the id '{}' is already loaded", o.path.string(), id)};
    return std::nullopt;
  };
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto e = taken()) return tl::unexpected(*e);
  }
  auto m = open_model(o);
  if (!m) return tl::unexpected(m.error());
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto e = taken()) return tl::unexpected(*e);  // loaded meanwhile by another caller
  ++stats_.loads;
  models_.push_back(*m);
  return (*m)->info;
}

void local_backend::load_async(local_model_options options, std::function<void(expected<model_info>)> done) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopping_) {
      loads_.push_back({std::move(options), std::move(done), {}});
      load_wake_.notify_one();
      return;
    }
  }
  done(make_error(error_code::unavailable, options.path.string() + ": not loaded: the node is stopping"));
}

void local_backend::run_loads() {
  for (;;) {
    pending_load l;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      load_wake_.wait(lock, [&] { return stopping_ || !loads_.empty(); });
      if (stopping_) return;
      l = std::move(loads_.front());
      loads_.pop_front();
    }
    if (l.task) l.task(false);
    else l.done(load(l.options));
  }
}

void local_backend::replan_async(std::string id, size_t nodes, std::function<void(expected<std::vector<model_stage_info>>)> done) {
  auto task = [this, id = std::move(id), nodes, done = std::move(done)](bool stopping) {
    if (stopping) return done(make_error(error_code::unavailable, fmt::format("model '{}' not re-planned: the node is stopping", id)));
    done(replan(id, nodes));
  };
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopping_) {
      loads_.push_back({{}, {}, std::move(task)});
      load_wake_.notify_one();
      return;
    }
  }
  task(true);
}

expected<void> local_backend::unload(const std::string& id) {
  std::shared_ptr<model> gone;
  std::vector<std::shared_ptr<job>> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = std::find_if(models_.begin(), models_.end(), [&](const auto& m) { return m->info.id == id; });
    if (it == models_.end())
      return make_error(error_code::not_found, fmt::format("no model '{}' is loaded", id));
    gone = std::move(*it);
    models_.erase(it);
    gone->unloaded = true;
    for (auto q = queue_.begin(); q != queue_.end();) {
      if ((*q)->m == gone) {
        dropped.push_back(std::move(*q));
        q = queue_.erase(q);
      } else {
        ++q;
      }
    }
    gone->queued = 0;
    for (auto& j : active_)
      if (j->m == gone) {
        j->model_gone = true;
        j->handle->cancel();
      }
  }
  for (auto& j : dropped) j->callbacks.on_done(fail(failure_kind::no_capacity, fmt::format("model '{}' was unloaded", id)));
  return {};  // `gone` is freed here, or by the running job when it ends
}

expected<std::vector<model_stage_info>> local_backend::replan(const std::string& id, size_t nodes) {
  std::shared_ptr<model> m;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& x : models_)
      if (x->info.id == id) m = x;
  }
  if (!m) return make_error(error_code::not_found, fmt::format("no model '{}' is loaded", id));
  if (!m->split) return make_error(error_code::invalid_argument, fmt::format("model '{}' is not split over the mesh: load it with a split to plan it", id));
  // The model object outlives an unload meanwhile (this reference): the re-plan finishes on it.
  if (auto ok = m->split->replan(nodes); !ok) return tl::unexpected(ok.error());
  return m->split->stages();
}

void local_backend::cancel(const std::shared_ptr<request_handle>& handle) {
  handle->cancel();
  std::shared_ptr<job> waiting;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = std::find_if(queue_.begin(), queue_.end(), [&](const auto& j) { return j->handle == handle; });
    if (it == queue_.end()) return;
    waiting = std::move(*it);
    queue_.erase(it);
    if (waiting->m) --waiting->m->queued;
    else --path_queued_;
    ++stats_.cancelled;
  }
  waiting->callbacks.on_done(fail(failure_kind::cancelled, "cancelled while queued"));
}

std::vector<model_info> local_backend::models() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<model_info> out;
  for (const auto& m : models_) {
    out.push_back(m->info);
    if (m->split) out.back().stages = m->split->stages();
  }
  return out;
}

backend_queue local_backend::queue() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {static_cast<int64_t>(active_.size()), static_cast<int64_t>(queue_.size())};
}

local_backend_stats local_backend::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

std::shared_ptr<local_backend::model> local_backend::find(const generation_request& r) const {
  for (const auto& m : models_)
    if (m->info.id == r.model && r.adapter.empty()) return m;
  if (r.by_path) {
    const std::string key = model_key(r.model, r.adapter);
    for (const auto& m : models_)
      if (m->key == key) return m;
  }
  return nullptr;
}

result<void> local_backend::prepare(model& m, job& j) const {
  auto& request = j.request;
  // Rendering and encoding: what is wrong with a request is known before it waits in the queue
  // (for a loaded model; one loaded on demand is checked once it is loaded).
  std::string text;
  models::encode_options eo;
  const char* input = request.chat ? "messages" : "prompt";
  if (request.chat) {
    std::optional<models::chat_template> named;
    const models::chat_template* tmpl = m.tmpl ? &*m.tmpl : nullptr;
    if (!request.chat_template.empty()) {
      auto t = models::chat_template_by_name(request.chat_template, m.special);
      if (!t) return fail(failure_kind::invalid_request, t.error().message, "chat_template");
      named = std::move(*t);
      tmpl = &*named;
    }
    if (!tmpl && request.by_path)  // a node's client (meshctl) names a template with a flag
      return fail(failure_kind::invalid_request,
                  fmt::format("{} has no chat template; name one with --chat-template NAME ({}), or send the prompt "
                              "without --chat",
                              request.model, template_names),
                  "messages");
    if (!tmpl) return fail(failure_kind::invalid_request, m.no_template, "messages");
    auto rendered = tmpl->render(request.messages, /*add_generation_prompt=*/true);
    if (!rendered) return fail(failure_kind::invalid_request, rendered.error().message, "messages");
    text = std::move(*rendered);
    eo.add_special = false;  // the template writes BOS where it belongs
  } else {
    text = std::move(request.prompt);
  }
  // parse_special: the template's turn markers must become their control tokens. It also means
  // that control-token text inside a message becomes those tokens (as in llama.cpp's server).
  eo.parse_special = true;
  auto ids = m.tok->encode(text, eo);
  if (!ids)
    return fail(ids.error().code == error_code::limit_exceeded ? failure_kind::too_long : failure_kind::invalid_request,
                ids.error().message, input);
  if (ids->empty()) return fail(failure_kind::invalid_request, "the prompt is empty", input);
  const int64_t n = static_cast<int64_t>(ids->size()), context = m.info.context;
  if (n >= context)
    return fail(failure_kind::too_long,
                fmt::format("the prompt is {} tokens, but model '{}' has a context of {} positions", n, m.info.id, context),
                input);
  int64_t max_tokens = context - n;
  if (request.max_tokens) {
    if (n + *request.max_tokens > context) {
      if (!request.cap_to_context)
        return fail(failure_kind::too_long,
                    fmt::format("{} prompt tokens plus max_tokens {} pass the context of {} positions of model '{}'", n,
                                *request.max_tokens, context, m.info.id),
                    "max_tokens");
      j.context_capped = true;
    } else {
      max_tokens = *request.max_tokens;
    }
  }
  if (auto s = models::sampler::create(request.sampling); !s)
    return fail(failure_kind::invalid_request, s.error().message);
  j.prompt = std::move(*ids);
  j.options.sampling = request.sampling;
  j.options.max_tokens = max_tokens;
  j.options.stop = std::move(request.stop);
  j.options.stop_at_eos = !request.ignore_eos;
  j.options.logprobs = request.logprobs;
  return {};
}

result<std::shared_ptr<request_handle>> local_backend::start(generation_request request, generation_callbacks callbacks) {
  auto j = std::make_shared<job>();
  j->request = std::move(request);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    j->m = find(j->request);
  }
  if (!j->m && !j->request.by_path) {
    std::string ids;
    for (const auto& m : models()) ids += (ids.empty() ? "" : ", ") + m.id;
    return fail(failure_kind::model_not_found,
                fmt::format("The model '{}' does not exist (loaded: {})", j->request.model, ids.empty() ? "none" : ids), "model");
  }
  if (j->m)
    if (auto ok = prepare(*j->m, *j); !ok) return tl::unexpected(ok.error());
  j->callbacks = std::move(callbacks);
  j->handle = std::make_shared<request_handle>();
  j->queued_at = clock_type::now();
  auto handle = j->handle;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return fail(failure_kind::no_capacity, "the server is stopping");
    if (j->m) {
      if (j->m->unloaded) return fail(failure_kind::no_capacity, fmt::format("model '{}' was unloaded", j->m->info.id));
      if (j->m->queued >= j->m->max_queued)
        return fail(failure_kind::queue_full,
                    fmt::format("model '{}' has {} requests waiting, its limit: retry later", j->m->info.id, j->m->queued));
      ++j->m->queued;
    } else {
      if (path_queued_ >= options_.max_path_queued)
        return fail(failure_kind::queue_full,
                    fmt::format("{} requests wait for models to load, the limit: retry later", path_queued_));
      ++path_queued_;
    }
    queue_.push_back(std::move(j));
  }
  wake_.notify_one();
  return handle;
}

void local_backend::run() {
  for (;;) {
    std::vector<std::shared_ptr<job>> admitted, active;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty() || !active_.empty(); });
      if (stopping_ && active_.empty()) return;
      if (!stopping_) admitted = admit();
    }
    for (const auto& j : admitted) begin(j);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      active = active_;
    }
    // One round per model: a prompt chunk for each request still reading one, then one decode
    // step for all the others together (in admission order).
    while (!active.empty()) {
      const std::shared_ptr<model> m = active.front()->m;
      std::vector<std::shared_ptr<job>> of_m;
      std::erase_if(active, [&](const auto& j) {
        if (j->m != m) return false;
        of_m.push_back(j);
        return true;
      });
      step(m, of_m);
    }
  }
}

std::vector<std::shared_ptr<local_backend::job>> local_backend::admit() {
  std::vector<std::shared_ptr<job>> admitted;
  for (auto it = queue_.begin(); it != queue_.end();) {
    job& j = **it;
    if (!j.m) {
      // A model loaded on demand: loading it holds the worker, and evicting another such model
      // must not pull one out from under a running request, so it starts only when nothing runs.
      if (!active_.empty() || !admitted.empty()) break;
      --path_queued_;
    } else {
      auto free = std::find(j.m->slot_busy.begin(), j.m->slot_busy.end(), false);
      if (free == j.m->slot_busy.end()) {  // its model is full: later requests for others may start
        ++it;
        continue;
      }
      *free = true;
      j.slot = free - j.m->slot_busy.begin();
      --j.m->queued;
    }
    admitted.push_back(*it);
    active_.push_back(*it);
    it = queue_.erase(it);
  }
  return admitted;
}

expected<std::shared_ptr<local_backend::model>> local_backend::path_model(const std::string& path, const std::string& adapter,
                                                                         double& load_seconds) {
  load_seconds = 0;
  const std::string key = model_key(path, adapter);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& m : models_)
      if (m->key == key) return m;  // loaded while the request waited
    // Room first: the model going out frees its device memory before the new one takes any.
    for (;;) {
      size_t on_demand = 0;
      std::shared_ptr<model>* oldest = nullptr;
      for (auto& m : models_)
        if (m->info.on_demand) {
          ++on_demand;
          if (!oldest || m->last_use < (*oldest)->last_use) oldest = &m;
        }
      if (on_demand < std::max<size_t>(options_.max_path_models, 1) || !oldest) break;
      // Nothing queued names it (requests for on-demand models hold no model until they run).
      models_.erase(models_.begin() + (oldest - models_.data()));
    }
  }
  const auto t0 = clock_type::now();
  local_model_options o;
  o.path = path;
  o.adapter = adapter;
  o.id = key;
  o.context = options_.path_context;
  o.max_queued = options_.max_path_queued;
  auto m = open_model(o);
  if (!m) return m;
  (*m)->info.on_demand = true;
  load_seconds = seconds_since(t0);
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.loads;
  models_.push_back(*m);
  return *m;
}

void local_backend::complete(const std::shared_ptr<job>& jp, generation_outcome outcome) {
  job& j = *jp;
  if (!outcome && outcome.error().kind == failure_kind::cancelled && j.model_gone)
    outcome = fail(failure_kind::no_capacity, fmt::format("model '{}' was unloaded", j.m->info.id));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (j.m && j.slot >= 0) j.m->slot_busy[static_cast<size_t>(j.slot)] = false;
    std::erase(active_, jp);
    if (outcome) {
      ++stats_.completed;
      stats_.completion_tokens += outcome->completion_tokens;
    } else if (outcome.error().kind == failure_kind::cancelled) {
      ++stats_.cancelled;
    } else {
      ++stats_.failed;
    }
  }
  j.run.reset();
  j.callbacks.on_done(std::move(outcome));
}

namespace {

/// What a model's error means to a client: a context overrun is too long; a split model's stage
/// on a node that left is "unavailable": the service, not the request, is at fault (503), and the
/// message names the node.
failure_kind kind_of(const error& e) {
  return e.code == error_code::limit_exceeded ? failure_kind::too_long
         : e.code == error_code::unavailable  ? failure_kind::no_capacity
                                              : failure_kind::internal;
}

}  // namespace

void local_backend::begin(const std::shared_ptr<job>& jp) {
  job& j = *jp;
  if (j.handle->cancelled()) return complete(jp, fail(failure_kind::cancelled, "cancelled while queued"));
  if (!j.m) {
    auto m = path_model(j.request.model, j.request.adapter, j.load_seconds);
    if (!m) {
      // A checkpoint that is not there is an unknown model; one that does not load is a bad request.
      const auto kind = m.error().code == error_code::not_found || m.error().code == error_code::io_error
                            ? failure_kind::model_not_found
                            : failure_kind::invalid_request;
      return complete(jp, fail(kind, m.error().message, "model"));
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);  // nothing else runs (admit()): slot 0 is free
      j.m = *m;
      j.slot = 0;
      j.m->slot_busy[0] = true;
    }
    if (auto ok = prepare(*j.m, j); !ok) return complete(jp, tl::unexpected(ok.error()));
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    j.m->last_use = ++uses_;
  }
  j.queue_seconds = std::max(0.0, seconds_since(j.queued_at) - j.load_seconds);
  model& m = *j.m;
  // Checked at every token (not only when text comes out): a cancelled request stops within one
  // decode step.
  j.options.on_token = [&j, this](int64_t n) {
    if (j.callbacks.on_token) j.callbacks.on_token(n);
    return !j.handle->cancelled() && !stopping_.load();
  };
  // Log-probabilities come just before the piece they go with (generate.hpp).
  j.options.on_logprobs = [&j, &m](std::vector<models::token_logprob> tokens) {
    for (const auto& t : tokens) j.entries.push_back(api_logprobs(*m.tok, t));
  };
  const auto on_piece = [&j, this](std::string_view piece) {
    // Checked before and after handing the piece on: a client that went away while the piece
    // was written stops the next token, not one more.
    if (j.handle->cancelled() || stopping_.load()) return false;
    if (j.callbacks.on_piece) j.callbacks.on_piece(piece, j.entries);
    j.result_logprobs.insert(j.result_logprobs.end(), std::make_move_iterator(j.entries.begin()),
                             std::make_move_iterator(j.entries.end()));
    j.entries.clear();
    return !j.handle->cancelled();
  };
  auto run = models::generation_run::start(*m.tok, m.seq->config(), j.prompt, 0, m.seq->context(), j.options, on_piece);
  if (!run) return complete(jp, fail(kind_of(run.error()), run.error().message));
  j.run.emplace(std::move(*run));
  m.seq->reset(j.slot);
  j.chunk = m.prefill_chunk;
}

void local_backend::prefill(const std::shared_ptr<job>& jp) {
  job& j = *jp;
  model& m = *j.m;
  // Cancellation is seen between chunks too: a long prompt of a client that left stops early.
  if (j.handle->cancelled() || stopping_.load()) return complete(jp, fail(failure_kind::cancelled, "cancelled"));
  const size_t n = std::min(static_cast<size_t>(j.chunk), j.prompt.size() - j.prefilled);
  const std::span<const int32_t> chunk(j.prompt.data() + j.prefilled, n);
  const auto t0 = clock_type::now();
  auto logits = m.seq->prefill(j.slot, chunk);
  if (!logits) return complete(jp, fail(kind_of(logits.error()), logits.error().message));
  j.prompt_seconds += seconds_since(t0);
  j.prefilled += n;
  if (j.prefilled < j.prompt.size()) return;  // the next chunk in the next round
  j.run->prompt_done(j.prompt_seconds);
  advance(jp, *logits);
}

bool local_backend::others_waiting(const model& m, size_t running) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_ || active_.size() != running) return true;  // another model's requests wait for their round
  for (const auto& j : queue_)
    if (j->m.get() != &m || std::find(m.slot_busy.begin(), m.slot_busy.end(), false) != m.slot_busy.end()) return true;
  return false;
}

void local_backend::step(const std::shared_ptr<model>& m, const std::vector<std::shared_ptr<job>>& all) {
  std::vector<std::shared_ptr<job>> reading, jobs;  // still reading their prompts; past them, with a token to decode
  for (const auto& j : all) (j->prefilled < j->prompt.size() ? reading : jobs).push_back(j);
  // A whole-model session runs one thing at a time: each prompt chunk, then one step of every
  // row in one graph run.
  if (!m->split) {
    for (const auto& j : reading) prefill(j);  // may end it, or take it past its prompt
    if (jobs.size() == 1 && reading.empty() && jobs[0]->run->greedy() && m->seq->greedy_chunk() > 0)
      decode_greedy(m, jobs[0]);
    else if (!jobs.empty())
      decode_lane(m, jobs, 1, nullptr, all.size());
    return;
  }
  // A split model's stages each run one step at a time, so work stepped from several threads
  // flows through them as a pipeline: while one micro-batch is on a stage or on the wire to it,
  // the others use the other stages. The decode rows go as one micro-batch per stage (contiguous
  // runs of slots), and the prompt chunks of this round are read beside them, up to one per
  // stage at a time. Decode micro-batches go on to their next steps while chunks are read and
  // otherwise until one of their requests ends or something else needs the worker (see
  // decode_lane); then each finishes the step it is in, and the round ends.
  const size_t depth = std::max<size_t>(1, m->split->stages().size());
  const size_t readers = std::min(reading.size(), depth);
  std::atomic<size_t> readers_left{readers};
  std::atomic<bool> round_over{false};
  std::vector<std::thread> threads;
  for (size_t r = 0; r < readers; ++r)
    threads.emplace_back([&, r] {
      for (size_t i = r; i < reading.size(); i += depth) prefill(reading[i]);
      --readers_left;
    });
  const size_t groups = std::min(jobs.size(), depth);
  std::sort(jobs.begin(), jobs.end(), [](const auto& a, const auto& b) { return a->slot < b->slot; });
  std::vector<std::vector<std::shared_ptr<job>>> lanes(groups);
  for (size_t i = 0; i < jobs.size(); ++i) lanes[i * groups / jobs.size()].push_back(jobs[i]);
  const lane_control control{round_over, readers_left, readers > 0};
  for (size_t g = 0; g < groups; ++g)
    threads.emplace_back([&, g] { decode_lane(m, lanes[g], groups, &control, all.size()); });
  for (auto& t : threads) t.join();
}

void local_backend::decode_lane(const std::shared_ptr<model>& m, const std::vector<std::shared_ptr<job>>& mine, size_t lanes,
                                const lane_control* control, size_t running) {
  for (int64_t steps = 0;; ++steps) {
    std::vector<models::slot_token> part;
    for (const auto& j : mine) part.push_back({j->slot, j->next});
    const bool beside_prompts = control && control->readers_left > 0;
    auto out = m->seq->decode(part);
    if (out) {
      std::lock_guard<std::mutex> lock(mutex_);
      ++stats_.decode_steps;
      stats_.decoded_tokens += static_cast<int64_t>(out->size());
      stats_.widest_step = std::max(stats_.widest_step, static_cast<int64_t>(out->size()));
      if (m->split) stats_.most_micro_batches = std::max(stats_.most_micro_batches, static_cast<int64_t>(lanes));
      if (steps > 0) ++stats_.chained_steps;
      if (beside_prompts) ++stats_.steps_beside_prompts;
    }
    bool ended = false;
    for (size_t i = 0; i < mine.size(); ++i) {
      if (out) advance(mine[i], (*out)[i]);
      else complete(mine[i], fail(kind_of(out.error()), out.error().message));
      ended = ended || !mine[i]->run;  // complete() ends its generation
    }
    if (!control) return;
    // While this round's prompt chunks are read, the lane goes on until they are in (a request
    // whose prompt is then done joins the micro-batches in the next round); otherwise until
    // anything else needs the worker.
    if (ended || (control->reading ? control->readers_left == 0 : others_waiting(*m, running))) control->round_over = true;
    if (control->round_over) return;
  }
}

void local_backend::decode_greedy(const std::shared_ptr<model>& m, const std::shared_ptr<job>& jp) {
  auto chunk = jp->run->decode_chunk(*m->seq, jp->slot, jp->next);
  if (!chunk) return complete(jp, fail(kind_of(chunk.error()), chunk.error().message));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.decode_steps += chunk->decoded;
    stats_.decoded_tokens += chunk->decoded;
    stats_.widest_step = std::max<int64_t>(stats_.widest_step, 1);
  }
  settle(jp, std::move(chunk->next));
}

void local_backend::advance(const std::shared_ptr<job>& jp, std::span<const float> logits) {
  settle(jp, jp->run->next(logits));
}

void local_backend::settle(const std::shared_ptr<job>& jp, expected<std::optional<int32_t>> next) {
  job& j = *jp;
  if (!next) return complete(jp, fail(failure_kind::internal, next.error().message));
  if (*next) {
    j.next = **next;
    return;  // decoded in the next step
  }
  models::generation g = j.run->finish();
  if (g.reason == models::stop_reason::callback) return complete(jp, fail(failure_kind::cancelled, "cancelled"));
  generation_result r;
  r.reason = g.reason == models::stop_reason::max_tokens ? finish_reason::length : finish_reason::stop;
  r.stop = g.reason;
  r.context_capped = j.context_capped;
  r.text = std::move(g.text);
  r.prompt_tokens = static_cast<int64_t>(j.prompt.size());
  r.completion_tokens = static_cast<int64_t>(g.tokens.size());
  r.queue_seconds = j.queue_seconds;
  r.load_seconds = j.load_seconds;
  r.prompt_seconds = g.prompt_seconds;
  r.generate_seconds = g.generate_seconds;
  r.logprobs = std::move(j.result_logprobs);
  complete(jp, std::move(r));
}

}  // namespace mesh::serving
