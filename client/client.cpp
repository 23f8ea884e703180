#include "client/client.hpp"

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "wire/wire_graph.hpp"
#include "transport/endpoint.hpp"

namespace mesh {

class client_impl {
 public:
  std::mutex m;
  std::condition_variable cv;
  bool up = false;
  std::string failure;  // why the connection failed or went down
  std::unique_ptr<transport::endpoint> ep;
  /// This client's throw-away key pair: the endpoint's identity, and the key it signs takeover
  /// grants with (wire/takeover_grant.hpp), which nodes check against its id.
  transport::identity key = transport::identity::generate();
  node_id node;  ///< the node this client talks to: messages from any other peer are dropped
  uint64_t next_id = 1;
  std::map<uint64_t, std::promise<expected<job_outcome>>> jobs;
  std::map<uint64_t, std::promise<expected<msg::status_reply>>> statuses;
  std::map<uint64_t, std::promise<expected<msg::models_reply>>> model_calls;  ///< client::models()
  std::map<uint64_t, std::function<void(const msg::train_progress&)>> progress;  // by training id
  std::map<uint64_t, std::function<void(const msg::train_checkpoint&)>> checkpoints;  // by training id
  std::map<uint64_t, std::function<void(const job_progress_info&)>> job_progress;  // by job id
  /// Generations in flight (client::generate), by request id.
  struct generation_call {
    generation_callback on_piece;
    std::string text;
    std::chrono::steady_clock::time_point sent;
    double first_piece_seconds = -1;
    bool withdrawn = false;  ///< on_piece said stop: the cancel was sent
    std::promise<expected<msg::generate_done>> done;
  };
  std::map<uint64_t, std::shared_ptr<generation_call>> generations;
  /// Callbacks running now (they run without the lock), by request id, with the thread running
  /// each: withdraw() waits until none of its request runs, so that a caller who gave up may
  /// free what they capture.
  std::multimap<uint64_t, std::thread::id> calling;

  // Coordinator failover (train_engine.hpp): trainings outlive the node that coordinates them.
  struct training {
    node_id coordinator;
    /// Takeover grants made for the run so far: the next one's generation is one more, so it
    /// supersedes every earlier coordinator of the run.
    uint32_t grants = 0;
  };
  std::map<uint64_t, training> trainings;  ///< open trainings by id
  /// Their datasets: workers hold only shards, a node taking a run over needs it all again.
  std::map<uint64_t, std::vector<msg::named_tensor>> training_data;
  /// Other nodes of the mesh as the last status reply listed them: where to resume.
  std::vector<std::pair<node_id, std::string>> others;
  std::vector<std::pair<node_id, std::string>> candidates;  ///< not tried yet
  bool failing_over = false;
  std::set<uint64_t> resuming;  ///< asked to be taken over; no progress from the new node yet
  uint64_t progress_seen = 0;

  /// Fails every pending request; trainings too unless `keep_trainings`.
  void fail_all(const std::string& why, bool keep_trainings = false) {
    for (auto it = jobs.begin(); it != jobs.end();) {
      if (keep_trainings && trainings.count(it->first)) {
        ++it;
        continue;
      }
      it->second.set_value(make_error(error_code::network, why));
      progress.erase(it->first);
      checkpoints.erase(it->first);
      job_progress.erase(it->first);
      trainings.erase(it->first);
      training_data.erase(it->first);
      it = jobs.erase(it);
    }
    for (auto& [id, p] : statuses) p.set_value(make_error(error_code::network, why));
    statuses.clear();
    for (auto& [id, p] : model_calls) p.set_value(make_error(error_code::network, why));
    model_calls.clear();
    for (auto& [id, g] : generations) g->done.set_value(make_error(error_code::network, why));
    generations.clear();
  }

  /// Asks the node for its view of the mesh; the reply refreshes `others` (no one waits for it).
  void refresh_others() {
    if (!up) return;
    if (auto bytes = msg::encode_message(msg::status_request{next_id++}))
      (void)ep->send(node, transport::channel::control, std::move(*bytes));
  }

  /// The connection to `node` is gone while trainings run: dial the next node that may take them
  /// over; with none left, they fail with `why`.
  void try_next_node(const std::string& why) {
    if (!candidates.empty()) {
      auto [id, address] = candidates.front();
      candidates.erase(candidates.begin());
      node = id;
      failing_over = true;
      ep->dial(id, {address});
      return;
    }
    failing_over = false;
    failure = why;
    fail_all(why);
  }

  /// Connected to a node while failing over: say who we are and ask it to take the runs over.
  void resume_trainings() {
    failing_over = false;
    std::vector<msg::message> out{msg::hello{}};
    std::get<msg::hello>(out[0]).is_client = true;
    for (auto& [train, t] : trainings) {
      // The client's signed word that `node` coordinates the run from now on: nodes end the
      // run's earlier generations for nothing less.
      const auto grant = msg::sign_takeover(key.secret_key(), train, ++t.grants, node);
      out.push_back(msg::train_resume{train, t.coordinator, training_data[train], grant});
      resuming.insert(train);
    }
    for (const auto& m : out)
      if (auto bytes = msg::encode_message(m)) {
        const auto ch = bytes->size() > msg::max_control_message ? transport::channel::bulk : transport::channel::control;
        (void)ep->send(node, ch, std::move(*bytes));
      }
  }

  /// Calls the callback registered for `id` in `callbacks`, if any, with `arg`: copied under the
  /// lock and called without it, so that it may use the client; `calling` lists it meanwhile,
  /// so that withdraw() can wait for it to finish.
  template <class F, class Arg>
  void call_back(const std::map<uint64_t, F>& callbacks, uint64_t id, const Arg& arg) {
    F f;
    std::multimap<uint64_t, std::thread::id>::iterator running;
    {
      std::lock_guard<std::mutex> lock(m);
      auto it = callbacks.find(id);
      if (it == callbacks.end() || !it->second) return;
      f = it->second;
      running = calling.emplace(id, std::this_thread::get_id());
    }
    struct finished {
      client_impl* self;
      std::multimap<uint64_t, std::thread::id>::iterator running;
      ~finished() {  // also when the callback throws
        std::lock_guard<std::mutex> lock(self->m);
        self->calling.erase(running);
        self->cv.notify_all();
      }
    } done{this, running};
    f(arg);
  }

  /// Forgets request `id` (see pending_request::withdraw): once this returns, none of its
  /// callbacks runs or will run, except one that is the caller itself.
  void withdraw(uint64_t id) {
    std::unique_lock<std::mutex> lock(m);
    if (auto it = jobs.find(id); it != jobs.end()) {
      it->second.set_value(make_error(error_code::timeout, "withdrawn by the caller before it finished"));
      jobs.erase(it);
    }
    progress.erase(id);
    checkpoints.erase(id);
    job_progress.erase(id);
    generations.erase(id);
    trainings.erase(id);  // nor is it resumed on another node if this one goes away
    training_data.erase(id);
    resuming.erase(id);
    // A callback of `id` may have been copied before the erase and be running now on the
    // network thread: wait for it, unless it is the one calling withdraw() (it would wait for
    // itself).
    const auto me = std::this_thread::get_id();
    cv.wait(lock, [&] {
      const auto [first, last] = calling.equal_range(id);
      return std::none_of(first, last, [&](const auto& kv) { return kv.second != me; });
    });
  }

  /// A piece of a generation: kept, and given to the caller's callback without the lock (listed
  /// in `calling` meanwhile, as call_back does); a callback that says stop withdraws the request
  /// at the node.
  void on_piece(const msg::generate_piece& p) {
    std::shared_ptr<generation_call> g;
    std::multimap<uint64_t, std::thread::id>::iterator running;
    {
      std::lock_guard<std::mutex> lock(m);
      auto it = generations.find(p.request);
      if (it == generations.end()) return;
      g = it->second;
      if (g->first_piece_seconds < 0)
        g->first_piece_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - g->sent).count();
      g->text += p.text;
      if (!g->on_piece || g->withdrawn) return;
      running = calling.emplace(p.request, std::this_thread::get_id());
    }
    bool more = true;
    {
      struct finished {
        client_impl* self;
        std::multimap<uint64_t, std::thread::id>::iterator running;
        ~finished() {
          std::lock_guard<std::mutex> lock(self->m);
          self->calling.erase(running);
          self->cv.notify_all();
        }
      } done{this, running};
      more = g->on_piece(p.text, p.tokens);
    }
    if (more) return;
    std::lock_guard<std::mutex> lock(m);
    g->withdrawn = true;
    if (up)
      if (auto bytes = msg::encode_message(msg::generate_cancel{p.request}))
        (void)ep->send(node, transport::channel::control, std::move(*bytes));
  }

  void on_message(std::vector<uint8_t> bytes) {
    auto decoded = msg::decode_message(bytes.data(), bytes.size());
    if (!decoded) return;
    if (auto* p = std::get_if<msg::train_progress>(&*decoded)) {
      {
        std::lock_guard<std::mutex> lock(m);
        if (resuming.erase(p->train) && trainings.count(p->train)) trainings[p->train].coordinator = node;  // taken over
        if (++progress_seen % 16 == 0) refresh_others();  // members come and go during a run
      }
      call_back(progress, p->train, *p);
      return;
    }
    if (auto* k = std::get_if<msg::train_checkpoint>(&*decoded)) {
      call_back(checkpoints, k->train, *k);
      return;
    }
    if (auto* p = std::get_if<msg::generate_piece>(&*decoded)) {
      on_piece(*p);
      return;
    }
    if (auto* d = std::get_if<msg::generate_done>(&*decoded)) {
      std::lock_guard<std::mutex> lock(m);
      auto it = generations.find(d->request);
      if (it == generations.end()) return;
      it->second->done.set_value(std::move(*d));
      generations.erase(it);
      return;
    }
    if (auto* p = std::get_if<msg::job_progress>(&*decoded)) {
      call_back(job_progress, p->job, job_progress_info{p->stages_done, p->stages, p->attempt, p->worker});
      return;
    }
    std::lock_guard<std::mutex> lock(m);
    if (auto* r = std::get_if<msg::job_result>(&*decoded)) {
      auto it = jobs.find(r->job);
      if (it == jobs.end()) return;
      if (!r->ok && resuming.count(r->job) && resuming.size() == trainings.size() && !candidates.empty()) {
        // This node could not take the runs over (restarted, or never a member): the next one.
        failure = r->error;
        resuming.clear();
        try_next_node("no node could take the training over (last: " + r->error + ")");
        return;
      }
      resuming.erase(r->job);
      if (!r->ok) {
        it->second.set_value(make_error(error_code::invalid_argument, r->error));
      } else {
        job_outcome out;
        for (auto& o : r->outputs) out.outputs[o.name] = std::move(o.value);
        out.attempts = r->attempts;
        out.workers = r->workers;
        out.step = r->step;
        out.ran_as = r->ran_as;
        it->second.set_value(std::move(out));
      }
      jobs.erase(it);
      progress.erase(r->job);
      checkpoints.erase(r->job);
      job_progress.erase(r->job);
      trainings.erase(r->job);
      training_data.erase(r->job);
    } else if (auto* mr = std::get_if<msg::models_reply>(&*decoded)) {
      auto it = model_calls.find(mr->id);
      if (it == model_calls.end()) return;
      if (mr->ok) it->second.set_value(std::move(*mr));
      else it->second.set_value(make_error(mr->code, mr->error));
      model_calls.erase(it);
    } else if (auto* s = std::get_if<msg::status_reply>(&*decoded)) {
      others.clear();
      for (const auto& peer : s->peers) {
        if (peer.health != peer_health::dead && !peer.address.empty()) others.emplace_back(peer.node, peer.address);
      }
      auto it = statuses.find(s->id);
      if (it == statuses.end()) return;
      it->second.set_value(*s);
      statuses.erase(it);
    }
  }
};

client::client(std::shared_ptr<client_impl> impl) : impl_(std::move(impl)) {}

client::~client() {
  if (impl_->ep) impl_->ep->stop();
  std::lock_guard<std::mutex> lock(impl_->m);
  impl_->up = false;
  impl_->failure = "client closed";
  impl_->fail_all("client closed");
}

node_id client::node() const { return impl_->node; }

expected<std::unique_ptr<client>> client::connect(const std::string& node_or_mdns, client_options options) {
  std::string node = node_or_mdns;
  if (node.empty() || node == "mdns") {
    auto found = find_node(options, options.connect_timeout);
    if (!found) return tl::unexpected(found.error());
    node = std::move(*found);
  }
  const auto at = node.find('@');
  if (at == std::string::npos) return make_error(error_code::invalid_argument, "node \"" + node + "\" must be NODEID@HOST:PORT");
  auto id = node_id::parse(node.substr(0, at));
  if (!id) return make_error(error_code::invalid_argument, "node \"" + node + "\": " + id.error().message);
  auto impl = std::make_shared<client_impl>();
  client_impl* p = impl.get();
  p->node = *id;
  transport::handlers h;
  h.on_peer_up = [p](const node_id& id, const transport::peer_info&) {
    std::lock_guard<std::mutex> lock(p->m);
    if (id != p->node) return;
    p->up = true;
    if (p->failing_over) p->resume_trainings();
    p->cv.notify_all();
  };
  h.on_peer_down = [p](const node_id& id, const transport::peer_down& down) {
    std::lock_guard<std::mutex> lock(p->m);
    if (id != p->node) return;  // a node given up on during a failover
    p->up = false;
    p->failure = "connection to the node lost: " + down.reason;
    p->fail_all(p->failure, true);
    if (!p->trainings.empty()) {
      p->candidates.clear();
      for (const auto& o : p->others)
        if (o.first != id) p->candidates.push_back(o);
      p->try_next_node("connection to the coordinating node lost (" + down.reason + ") and no other node could take the training over");
    }
    p->cv.notify_all();
  };
  h.on_connect_failed = [p](const std::optional<node_id>& who, const std::string& addr, const std::string& why) {
    std::lock_guard<std::mutex> lock(p->m);
    p->failure = "cannot connect to " + addr + ": " + why;
    if (p->failing_over && who == p->node)
      p->try_next_node("the coordinating node was lost and no other node of the run could be reached (last: " + p->failure + ")");
    p->cv.notify_all();
  };
  h.on_message = [p](const node_id& from, transport::channel, std::vector<uint8_t> bytes) {
    {
      // Results, progress and status replies are believed only from the node the requests went
      // to: any member can dial a client, and a status reply from it would name the nodes a
      // training's dataset goes to on failover.
      std::lock_guard<std::mutex> lock(p->m);
      if (from != p->node) return;
    }
    p->on_message(std::move(bytes));
  };
  transport::endpoint_config ec;
  ec.id = p->key;
  ec.mesh_secret = options.mesh_secret;
  ec.bind = "0.0.0.0";
  ec.protocol_version = msg::protocol_version;
  // A node that dies without a word (SIGKILL, power) is noticed by the idle timeout: short, so a
  // training fails over soon after the nodes' own failure detector (~2.5 s) has acted.
  ec.idle_timeout = options.idle_timeout;
  ec.keep_alive = std::min(ec.keep_alive, options.idle_timeout / 4);
  auto ep = transport::endpoint::start(ec, h);
  if (!ep) return tl::unexpected(ep.error());
  p->ep = std::move(*ep);
  p->ep->dial(*id, {node.substr(at + 1)});
  {
    std::unique_lock<std::mutex> lock(p->m);
    if (!p->cv.wait_for(lock, options.connect_timeout, [p] { return p->up || !p->failure.empty(); }))
      return make_error(error_code::timeout, "no answer from " + node + " within " +
                                                 std::to_string(options.connect_timeout.count()) + " ms");
    if (!p->up) return make_error(error_code::network, p->failure);
  }
  msg::hello hi;
  hi.is_client = true;
  auto bytes = msg::encode_message(hi);
  if (!bytes) return tl::unexpected(bytes.error());
  if (auto ok = p->ep->send(*id, transport::channel::control, std::move(*bytes)); !ok) return tl::unexpected(ok.error());
  return std::unique_ptr<client>(new client(std::move(impl)));
}

namespace {

/// A request sent (id > 0) or failed before it was (id 0, the future holds why).
struct sent_request {
  uint64_t id = 0;
  std::future<expected<job_outcome>> future;
};

}  // namespace

/// Sends `m` (whose reply is a job_result with the id `assign` writes into it; `assign` also
/// registers its callbacks, under the lock) and returns the future of that reply.
template <class Msg, class Assign>
sent_request request(client_impl& impl, Msg m, Assign assign) {
  std::promise<expected<job_outcome>> promise;
  sent_request out{0, promise.get_future()};
  std::lock_guard<std::mutex> lock(impl.m);
  if (!impl.up) {
    promise.set_value(make_error(error_code::network, impl.failure.empty() ? "not connected" : impl.failure));
    return out;
  }
  const uint64_t id = impl.next_id++;
  assign(m, id);
  // From here on the callbacks are registered: every failure below unregisters them (the id is
  // never used again), or they would stay for good.
  const auto fail = [&](const error& e) {
    impl.progress.erase(id);
    impl.checkpoints.erase(id);
    impl.job_progress.erase(id);
    impl.trainings.erase(id);
    impl.training_data.erase(id);
    promise.set_value(tl::unexpected(e));
    return std::move(out);
  };
  auto bytes = msg::encode_message(m);
  if (!bytes) return fail(bytes.error());
  // Large requests (graphs with parameters) on a bulk stream, small ones on the control stream.
  const auto ch = bytes->size() > msg::max_control_message ? transport::channel::bulk : transport::channel::control;
  if (auto ok = impl.ep->send(impl.node, ch, std::move(*bytes)); !ok) return fail(ok.error());
  impl.jobs.emplace(id, std::move(promise));
  out.id = id;
  return out;
}

pending_request::pending_request(pending_request&& other) noexcept
    : done(std::move(other.done)), impl_(std::move(other.impl_)), id_(std::exchange(other.id_, 0)) {}

pending_request& pending_request::operator=(pending_request&& other) noexcept {
  if (this != &other) {
    withdraw();
    done = std::move(other.done);
    impl_ = std::move(other.impl_);
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

pending_request::~pending_request() { withdraw(); }

void pending_request::withdraw() {
  if (impl_ && id_ != 0) impl_->withdraw(id_);
  id_ = 0;
}

expected<std::unique_ptr<inference_session>> client::open_inference(const graph& model, const tensor_map& params,
                                                                    std::chrono::milliseconds timeout) {
  uint64_t session = 0;
  auto f = request(*impl_, msg::open_session{0, graph_payload(wire_graph{model, params})}, [&](msg::open_session& m, uint64_t id) { m.session = session = id; }).future;
  if (f.wait_for(timeout) != std::future_status::ready) return make_error(error_code::timeout, "the model was not loaded in time");
  auto r = f.get();
  if (!r) return tl::unexpected(r.error());
  return std::unique_ptr<inference_session>(new inference_session(impl_, session, r->workers));
}

std::future<expected<job_outcome>> inference_session::infer(const tensor_map& inputs) {
  msg::infer call;
  call.session = id_;
  for (const auto& [name, t] : inputs) call.inputs.push_back({name, t});
  return request(*impl_, std::move(call), [](msg::infer& m, uint64_t id) { m.call = id; }).future;
}

inference_session::~inference_session() {
  std::lock_guard<std::mutex> lock(impl_->m);
  if (!impl_->up) return;
  if (auto bytes = msg::encode_message(msg::close_session{id_})) (void)impl_->ep->send(impl_->node, transport::channel::control, std::move(*bytes));
}

std::future<expected<job_outcome>> client::submit(const graph& g, const tensor_map& inputs, const tensor_map& params,
                                                  strategy s) {
  job_options o;
  o.how = s;
  return submit(g, inputs, params, std::move(o));
}

namespace {

sent_request send_job(client_impl& impl, const graph& g, const tensor_map& inputs, const tensor_map& params,
                      job_options options) {
  wire_graph w{g, inputs};
  for (const auto& [name, t] : params) w.tensors[name] = t;
  // A graph too large for the format fails in request(), where the message is encoded.
  return request(impl, msg::submit_job{0, graph_payload(std::move(w)), options.how},
                 [&](msg::submit_job& m, uint64_t id) {
                   m.job = id;
                   if (options.on_progress) impl.job_progress[id] = std::move(options.on_progress);
                 });
}

sent_request send_training(client_impl& impl, const msg::train_spec& spec,
                           std::function<void(const msg::train_progress&)> on_progress,
                           std::function<void(const msg::train_checkpoint&)> on_checkpoint) {
  // The id is assigned (and the callback registered) under the lock, before anything is sent.
  return request(impl, msg::open_training{0, spec}, [&](msg::open_training& m, uint64_t id) {
    m.train = id;
    if (on_progress) impl.progress[id] = std::move(on_progress);
    if (on_checkpoint) impl.checkpoints[id] = std::move(on_checkpoint);
    impl.trainings[id] = {impl.node, 0};
    impl.training_data[id] = spec.dataset;
    impl.refresh_others();  // who could take over if this node dies
  });
}

}  // namespace

std::future<expected<job_outcome>> client::submit(const graph& g, const tensor_map& inputs, const tensor_map& params,
                                                  job_options options) {
  return send_job(*impl_, g, inputs, params, std::move(options)).future;
}

pending_request client::start_job(const graph& g, const tensor_map& inputs, const tensor_map& params, job_options options) {
  auto sent = send_job(*impl_, g, inputs, params, std::move(options));
  return pending_request(impl_, sent.id, std::move(sent.future));
}

std::future<expected<job_outcome>> client::train(const msg::train_spec& spec,
                                                 std::function<void(const msg::train_progress&)> on_progress,
                                                 std::function<void(const msg::train_checkpoint&)> on_checkpoint) {
  return send_training(*impl_, spec, std::move(on_progress), std::move(on_checkpoint)).future;
}

pending_request client::start_training(const msg::train_spec& spec,
                                       std::function<void(const msg::train_progress&)> on_progress,
                                       std::function<void(const msg::train_checkpoint&)> on_checkpoint) {
  auto sent = send_training(*impl_, spec, std::move(on_progress), std::move(on_checkpoint));
  return pending_request(impl_, sent.id, std::move(sent.future));
}

expected<job_outcome> client::run(const graph& g, const tensor_map& inputs, const tensor_map& params,
                                  std::chrono::milliseconds timeout) {
  job_options o;
  o.timeout = timeout;
  return run(g, inputs, params, std::move(o));
}

expected<job_outcome> client::run(const graph& g, const tensor_map& inputs, const tensor_map& params, job_options options) {
  const auto timeout = options.timeout;
  // The handle withdraws on_progress on every way out, so that it may capture run()'s caller's
  // locals: progress the node sends after a timeout goes nowhere.
  auto pending = start_job(g, inputs, params, std::move(options));
  const bool in_time = pending.done.wait_for(timeout) == std::future_status::ready;
  pending.withdraw();  // before returning: a callback running now finishes first
  if (!in_time)
    return make_error(error_code::timeout, "the job did not finish within " + std::to_string(timeout.count()) + " ms");
  return pending.done.get();
}

expected<generation_outcome> client::generate(const std::string& model, const std::string& prompt,
                                              const generation_options& options, generation_callback on_piece) {
  auto call = std::make_shared<client_impl::generation_call>();
  call->on_piece = std::move(on_piece);
  auto done = call->done.get_future();
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(impl_->m);
    if (!impl_->up) return make_error(error_code::network, impl_->failure.empty() ? "not connected" : impl_->failure);
    id = impl_->next_id++;
    msg::generate_request r{id, model, prompt, options.chat, options.chat_template, options.sampling, options.stop, options.max_tokens,
                            options.adapter};
    auto bytes = msg::encode_message(r);
    if (!bytes) return tl::unexpected(bytes.error());
    call->sent = std::chrono::steady_clock::now();
    impl_->generations[id] = call;
    const auto ch = bytes->size() > msg::max_control_message ? transport::channel::bulk : transport::channel::control;
    if (auto ok = impl_->ep->send(impl_->node, ch, std::move(*bytes)); !ok) {
      impl_->generations.erase(id);
      return tl::unexpected(ok.error());
    }
  }
  const bool in_time = done.wait_for(options.timeout) == std::future_status::ready;
  if (!in_time) {
    std::lock_guard<std::mutex> lock(impl_->m);
    if (impl_->up)  // the node stops at its next token
      if (auto bytes = msg::encode_message(msg::generate_cancel{id}))
        (void)impl_->ep->send(impl_->node, transport::channel::control, std::move(*bytes));
  }
  impl_->withdraw(id);  // a callback running now finishes first; none runs after this
  if (!in_time)
    return make_error(error_code::timeout, "the generation did not finish within " + std::to_string(options.timeout.count()) +
                                               " ms; it was withdrawn");
  auto d = done.get();
  if (!d) return tl::unexpected(d.error());
  if (!d->ok) return make_error(d->code, d->error);
  generation_outcome out;
  out.text = std::move(call->text);
  out.finish = d->finish;
  out.prompt_tokens = d->prompt_tokens;
  out.tokens = d->tokens;
  out.load_seconds = d->load_seconds;
  out.prompt_seconds = d->prompt_seconds;
  out.generate_seconds = d->generate_seconds;
  out.first_piece_seconds = call->first_piece_seconds;
  return out;
}

expected<msg::status_reply> client::status(std::chrono::milliseconds timeout) {
  std::future<expected<msg::status_reply>> f;
  {
    std::lock_guard<std::mutex> lock(impl_->m);
    if (!impl_->up) return make_error(error_code::network, impl_->failure.empty() ? "not connected" : impl_->failure);
    const uint64_t id = impl_->next_id++;
    auto bytes = msg::encode_message(msg::status_request{id});
    if (!bytes) return tl::unexpected(bytes.error());
    if (auto ok = impl_->ep->send(impl_->node, transport::channel::control, std::move(*bytes)); !ok) return tl::unexpected(ok.error());
    f = impl_->statuses[id].get_future();
  }
  if (f.wait_for(timeout) != std::future_status::ready) return make_error(error_code::timeout, "no status reply in time");
  return f.get();
}

expected<msg::models_reply> client::models(msg::models_request request, std::chrono::milliseconds timeout) {
  std::future<expected<msg::models_reply>> f;
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(impl_->m);
    if (!impl_->up) return make_error(error_code::network, impl_->failure.empty() ? "not connected" : impl_->failure);
    id = request.id = impl_->next_id++;
    auto bytes = msg::encode_message(request);
    if (!bytes) return tl::unexpected(bytes.error());
    if (auto ok = impl_->ep->send(impl_->node, transport::channel::control, std::move(*bytes)); !ok) return tl::unexpected(ok.error());
    f = impl_->model_calls[id].get_future();
  }
  if (f.wait_for(timeout) != std::future_status::ready) {
    std::lock_guard<std::mutex> lock(impl_->m);
    impl_->model_calls.erase(id);
    return make_error(error_code::timeout, "no answer from the node within " + std::to_string(timeout.count() / 1000) + " s");
  }
  return f.get();
}

}  // namespace mesh
