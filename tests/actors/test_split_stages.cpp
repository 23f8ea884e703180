// A model split over a simulated mesh: the serving node's stage calls and each peer's stage host
// exchange real encoded messages (encode_message / decode_message on every hop), so the wire, the
// stage host's checks and the remote links run as between nodes, without sockets. The split
// model, served through the model host, gives exactly the whole model's text; a peer without the
// file, a stranger stepping someone's stage, a full host and a peer that dies are errors that
// name the node.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "actors/remote_stage.hpp"
#include "actors/split_model.hpp"
#include "actors/split_roster.hpp"
#include "actors/stage_host.hpp"
#include "fetch_link.hpp"
#include "models/checkpoint.hpp"
#include "models/model_config.hpp"
#include "models/model_weights.hpp"
#include "model_writer.hpp"
#include "serving/local_backend.hpp"
#include "test_ids.hpp"

using namespace mesh;
using namespace mesh::models::test;
using namespace std::chrono_literals;

namespace {

/// The message as the other node decodes it.
expected<msg::message> carried(const msg::message& m) {
  auto bytes = msg::encode_message(m);
  if (!bytes) return tl::unexpected(bytes.error());
  return msg::decode_message(bytes->data(), bytes->size());
}

std::function<expected<std::unique_ptr<gpu::executor>>()> cpu_executors() {
  return [] { return expected<std::unique_ptr<gpu::executor>>(gpu::make_cpu_executor(1)); };
}

/// The serving node "srv" and peers with stage hosts; links can be cut (a node that died).
struct sim_mesh {
  const node_id srv = test::named("srv");
  std::shared_ptr<generation::stage_calls> calls;
  std::map<node_id, std::unique_ptr<generation::stage_host>> hosts;
  std::mutex m;
  std::set<node_id> cut;
  std::set<node_id> silent;  ///< still connected (sends succeed) but never answering: a hung node
  std::atomic<int> undecodable{0};
  std::atomic<int> logit_replies{0};  ///< step replies that are not hidden rows [rows, hidden_size]
  int64_t hidden_size = 64;

  explicit sim_mesh(const std::vector<node_id>& peers, size_t max_stages = 4) {
    calls = std::make_shared<generation::stage_calls>([this](const node_id& to, const msg::message& out) {
      {
        std::lock_guard<std::mutex> lock(m);
        if (cut.count(to)) return false;
        if (silent.count(to)) return true;  // connected, and never answers
      }
      auto in = carried(out);
      if (!in) return ++undecodable, true;
      auto& h = *hosts.at(to);
      if (auto* o = std::get_if<msg::stage_open>(&*in)) h.open(srv, *o);
      else if (auto* s = std::get_if<msg::stage_step>(&*in)) h.step(srv, *s);
      else if (auto* c = std::get_if<msg::stage_close>(&*in)) h.close(srv, *c);
      return true;
    });
    for (const auto& p : peers) {
      generation::stage_host_options o;
      o.make_executor = cpu_executors();
      o.max_stages = max_stages;
      o.self = p.short_string();
      hosts[p] = std::make_unique<generation::stage_host>(o, [this, p](const node_id&, const msg::message& out) {
        {
          std::lock_guard<std::mutex> lock(m);
          if (cut.count(p)) return;
        }
        auto in = carried(out);
        if (!in) return void(++undecodable);
        if (auto* r = std::get_if<msg::stage_reply>(&*in)) {
          const auto& dims = r->output.dims;
          if (r->ok && !(dims.size() == 1 && dims[0] == 0) && !(dims.size() == 2 && dims[1] == hidden_size)) ++logit_replies;
          calls->deliver(p, *r);
        }
      });
    }
  }
  void kill(const node_id& p) {
    std::lock_guard<std::mutex> lock(m);
    cut.insert(p);
  }
  void hang(const node_id& p) {
    std::lock_guard<std::mutex> lock(m);
    silent.insert(p);
  }
  size_t held(const node_id& p) { return hosts.at(p)->stages(); }
};

struct outcome_wait {
  std::promise<serving::generation_outcome> done;
  serving::generation_callbacks callbacks() {
    serving::generation_callbacks cb;
    cb.on_done = [this](serving::generation_outcome o) { done.set_value(std::move(o)); };
    return cb;
  }
};

serving::generation_outcome run(serving::local_backend& b, const std::string& model, uint64_t seed) {
  serving::generation_request r;
  r.model = model;
  r.prompt = "one two three four five six";
  r.max_tokens = 10;
  r.ignore_eos = true;
  if (seed) {
    r.sampling.temperature = 0.8f;
    r.sampling.seed = seed;
  }
  outcome_wait w;
  auto f = w.done.get_future();
  auto started = b.start(r, w.callbacks());
  if (!started) return tl::unexpected(started.error());
  return f.get();
}

model_spec four_layers() {
  model_spec s;
  s.layers = 4;
  s.context = 256;
  return s;
}

/// A lost message fails the test in a minute, not in the node's ten.
const generation::remote_stage_timeouts short_waits{60s, 60s};

/// What the split tests share: a GGUF model of `layers` layers, a simulated mesh of `peers`, and
/// the serving node's model host over CPU executors.
struct split_fixture {
  static constexpr uint64_t gb = 1'000'000'000;
  temp_dir dir;
  std::filesystem::path path = dir / "m.gguf";
  sim_mesh mesh;
  std::unique_ptr<serving::local_backend> host;

  split_fixture(const std::vector<node_id>& peers, int64_t layers, models::tensor_type type) : mesh(peers) {
    model_spec spec = four_layers();
    spec.layers = layers;
    write_gguf_model(path, spec, type);
    serving::local_backend_options bo;
    bo.make_executor = cpu_executors();
    auto b = serving::local_backend::create(bo);
    REQUIRE(b);
    host = std::move(*b);
  }
  /// The model file under `id`.
  serving::local_model_options model(const std::string& id) const {
    serving::local_model_options o;
    o.path = path;
    o.id = id;
    return o;
  }
};


/// The nodes holding model `id`'s stages now, in order.
std::vector<std::string> stage_nodes_of(const serving::local_backend& host, const std::string& id) {
  std::vector<std::string> out;
  for (const auto& m : host.models())
    if (m.id == id)
      for (const auto& st : m.stages) out.push_back(st.node);
  return out;
}

bool eventually(const std::function<bool()>& f) {
  for (int i = 0; i < 3000; ++i) {  // 30 s: a bound for slow sanitizer runs, not a wait
    if (f()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

}  // namespace

TEST_CASE("a model split over three nodes serves the whole model's text, and unloading closes its stages", "[generation][split]") {
  const node_id p1 = test::named("p1"), p2 = test::named("p2");
  split_fixture f({p1, p2}, 4, models::tensor_type::q8_0);
  REQUIRE(f.host->load(f.model("whole")));
  serving::local_model_options split = f.model("split");
  split.split = generation::make_split_builder(f.mesh.calls, f.mesh.srv, {{f.mesh.srv, f.gb, 10}, {p1, f.gb, 10}, {p2, f.gb, 10}}, f.path.string(),
                                               short_waits);
  auto info = f.host->load(split);
  INFO((info ? std::string() : info.error().message));
  REQUIRE(info);
  REQUIRE(info->stages.size() == 3);
  CHECK(info->stages[0].node == f.mesh.srv.to_string());
  CHECK(info->stages[1].node == p1.to_string());
  CHECK(info->stages[2].node == p2.to_string());
  CHECK(info->stages[0].first_layer == 0);
  CHECK(info->stages[2].end_layer == 4);
  CHECK(info->stages[0].end_layer == info->stages[1].first_layer);
  CHECK(info->context == 256);
  CHECK(f.mesh.held(p1) == 1);
  CHECK(f.mesh.held(p2) == 1);

  for (const uint64_t seed : {uint64_t{0}, uint64_t{42}}) {
    auto a = run(*f.host, "whole", seed);
    auto s = run(*f.host, "split", seed);
    REQUIRE(a);
    INFO((s ? std::string() : s.error().message));
    REQUIRE(s);
    CHECK(s->text == a->text);
    CHECK(s->completion_tokens == 10);
  }
  CHECK(f.mesh.undecodable == 0);
  // The serving node holds the first stage and applies the head: the last stage sent hidden
  // rows, never logits.
  CHECK(f.mesh.logit_replies == 0);

  REQUIRE(f.host->unload("split"));
  CHECK(eventually([&] { return f.mesh.held(p1) == 0 && f.mesh.held(p2) == 0; }));
}

/// A greedy (seed 0) or seeded generation of `tokens` tokens; `at_token` runs after each token.
serving::generation_outcome run_long(serving::local_backend& b, const std::string& model, int64_t tokens,
                                     std::function<void(int64_t)> at_token = {}) {
  serving::generation_request r;
  r.model = model;
  r.prompt = "one two three four five six";
  r.max_tokens = tokens;
  r.ignore_eos = true;
  outcome_wait w;
  auto cb = w.callbacks();
  cb.on_token = std::move(at_token);
  auto f = w.done.get_future();
  auto started = b.start(r, cb);
  if (!started) return tl::unexpected(started.error());
  return f.get();
}

TEST_CASE("a stage node that dies mid-generation moves its layers to the survivors and the text is unchanged", "[generation][split][failover]") {
  const node_id p1 = test::named("p1"), p2 = test::named("p2");
  split_fixture f({p1, p2}, 6, models::tensor_type::q8_0);
  REQUIRE(f.host->load(f.model("whole")));
  serving::local_model_options o = f.model("split");
  std::vector<std::string> log;
  std::mutex log_m;
  o.split = generation::make_split_builder(f.mesh.calls, f.mesh.srv, {{f.mesh.srv, f.gb, 10}, {p1, f.gb, 10}, {p2, f.gb, 10}}, f.path.string(),
                                           short_waits, nullptr, [&](const std::string& line) {
                                             std::lock_guard<std::mutex> lock(log_m);
                                             log.push_back(line);
                                           });
  auto info = f.host->load(o);
  REQUIRE(info);
  REQUIRE(info->stages.size() == 3);

  auto undisturbed = run_long(*f.host, "whole", 40);
  REQUIRE(undisturbed);
  auto split_too = run_long(*f.host, "split", 40);
  REQUIRE(split_too);
  REQUIRE(split_too->text == undisturbed->text);

  // p2 (the last stage) goes away after the 12th token: the request goes on over srv and p1.
  auto r = run_long(*f.host, "split", 40, [&](int64_t n) {
    if (n == 12) f.mesh.kill(p2);
  });
  INFO((r ? std::string() : r.error().message));
  for (const auto& l : log) INFO(l);
  REQUIRE(r);
  CHECK(r->text == undisturbed->text);
  CHECK(r->completion_tokens == 40);
  auto now = f.host->models();
  const auto it = std::find_if(now.begin(), now.end(), [](const auto& m) { return m.id == "split"; });
  REQUIRE(it != now.end());
  REQUIRE(it->stages.size() == 2);
  CHECK(it->stages[0].node == f.mesh.srv.to_string());
  CHECK(it->stages[1].node == p1.to_string());
  CHECK(it->stages[0].first_layer == 0);
  CHECK(it->stages[1].end_layer == 6);
  // p1 holds the new stage only: the old one was closed.
  CHECK(eventually([&] { return f.mesh.held(p1) == 1; }));
  // And the next request runs on the new plan from its start.
  auto again = run_long(*f.host, "split", 40);
  REQUIRE(again);
  CHECK(again->text == undisturbed->text);
  CHECK(f.mesh.undecodable == 0);
}

TEST_CASE("a stage node that stays connected but stops answering is failed over at its measured deadline", "[generation][split][failover]") {
  // The step timeout is a minute; p2's steps take milliseconds here, so once a few are measured
  // its deadline is the floor (1 s), and a p2 that hangs after the 12th token costs about that.
  const node_id p1 = test::named("p1"), p2 = test::named("p2");
  split_fixture f({p1, p2}, 6, models::tensor_type::q8_0);
  REQUIRE(f.host->load(f.model("whole")));
  serving::local_model_options o = f.model("split");
  generation::remote_stage_timeouts waits = short_waits;
  waits.floor = 1s;
  o.split = generation::make_split_builder(f.mesh.calls, f.mesh.srv, {{f.mesh.srv, f.gb, 10}, {p1, f.gb, 10}, {p2, f.gb, 10}}, f.path.string(), waits);
  REQUIRE(f.host->load(o));
  auto undisturbed = run_long(*f.host, "whole", 40);
  REQUIRE(undisturbed);
  const auto started = std::chrono::steady_clock::now();
  auto r = run_long(*f.host, "split", 40, [&](int64_t n) {
    if (n == 12) f.mesh.hang(p2);
  });
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  INFO((r ? std::string() : r.error().message));
  REQUIRE(r);
  CHECK(r->text == undisturbed->text);
  CHECK(took < 30.0);  // not the minute of the step timeout
  const auto stages = stage_nodes_of(*f.host, "split");
  CHECK(std::find(stages.begin(), stages.end(), p2.to_string()) == stages.end());
}

/// A request for `model` as the batching test sends it: its own prompt and seed.
serving::generation_request batch_request(const std::string& model, int i) {
  serving::generation_request r;
  r.model = model;
  r.prompt = std::string("one two three four five six seven eight").substr(0, 8 + 6 * static_cast<size_t>(i));
  r.max_tokens = 24;
  r.ignore_eos = true;
  if (i % 2) {
    r.sampling.temperature = 0.8f;
    r.sampling.seed = 100 + static_cast<uint64_t>(i);
  }
  return r;
}

/// Loads "whole" (one request at a time) and "split" (over this node, p1 and p2, `parallel`
/// requests at once), both reading prompts `chunk` tokens a round (0: the default), and returns
/// the whole model's text for batch_request(i) alone, for i < n.
std::vector<std::string> load_whole_and_split(split_fixture& f, const node_id& p1, const node_id& p2, int n, int64_t chunk = 0) {
  serving::local_model_options whole = f.model("whole");
  whole.parallel = 1;
  whole.prefill_chunk = chunk;
  REQUIRE(f.host->load(whole));
  serving::local_model_options o = f.model("split");
  o.parallel = 4;
  o.prefill_chunk = chunk;
  o.split = generation::make_split_builder(f.mesh.calls, f.mesh.srv, {{f.mesh.srv, f.gb, 10}, {p1, f.gb, 10}, {p2, f.gb, 10}}, f.path.string(),
                                           short_waits);
  REQUIRE(f.host->load(o));
  std::vector<std::string> alone;
  for (int i = 0; i < n; ++i) {
    outcome_wait w;
    auto done = w.done.get_future();
    REQUIRE(f.host->start(batch_request("whole", i), w.callbacks()));
    auto r = done.get();
    REQUIRE(r);
    alone.push_back(r->text);
  }
  return alone;
}


TEST_CASE("a prompt read on a split model goes beside the running requests' steps, which it does not change", "[generation][split][batch]") {
  const node_id p1 = test::named("p1"), p2 = test::named("p2");
  split_fixture f({p1, p2}, 6, models::tensor_type::q8_0);
  // Prompts read 2 tokens a round: the late request's prompt takes several rounds.
  constexpr int n = 4;
  const auto alone = load_whole_and_split(f, p1, p2, n, 2);
  // Three requests decode; the fourth (the longest prompt) arrives once the first has 5 tokens.
  std::vector<outcome_wait> waits(n);
  std::vector<std::future<serving::generation_outcome>> done;
  std::promise<void> five;
  auto fifth = five.get_future();
  std::atomic<bool> told{false};
  for (int i = 0; i < n - 1; ++i) {
    auto cb = waits[static_cast<size_t>(i)].callbacks();
    if (i == 0)
      cb.on_token = [&](int64_t t) {
        if (t == 5 && !told.exchange(true)) five.set_value();
      };
    done.push_back(waits[static_cast<size_t>(i)].done.get_future());
    REQUIRE(f.host->start(batch_request("split", i), cb));
  }
  fifth.wait();
  const int64_t before = f.host->stats().steps_beside_prompts;
  done.push_back(waits[n - 1].done.get_future());
  REQUIRE(f.host->start(batch_request("split", n - 1), waits[n - 1].callbacks()));
  for (int i = 0; i < n; ++i) {
    auto r = done[static_cast<size_t>(i)].get();
    INFO("request " << i);
    INFO((r ? std::string() : r.error().message));
    REQUIRE(r);
    CHECK(r->text == alone[static_cast<size_t>(i)]);
  }
  CHECK(f.host->stats().steps_beside_prompts > before);  // the running requests went on meanwhile
  CHECK(f.mesh.undecodable == 0);
}

TEST_CASE("requests running together on a split model share its steps, and a stage node lost under them moves them all", "[generation][split][failover][batch]") {
  const node_id p1 = test::named("p1"), p2 = test::named("p2");
  split_fixture f({p1, p2}, 6, models::tensor_type::q8_0);
  constexpr int n = 4;
  const auto alone = load_whole_and_split(f, p1, p2, n);
  CHECK(f.host->stats().widest_step == 1);

  // All at once; in the second round p2 (the last stage) is lost after one request's 10th token.
  for (const bool lose : {false, true}) {
    std::vector<outcome_wait> waits(n);
    std::vector<std::future<serving::generation_outcome>> done;
    std::atomic<bool> killed{false};
    for (int i = 0; i < n; ++i) {
      auto cb = waits[static_cast<size_t>(i)].callbacks();
      if (lose && i == 0)
        cb.on_token = [&](int64_t t) {
          if (t == 10 && !killed.exchange(true)) f.mesh.kill(p2);
        };
      done.push_back(waits[static_cast<size_t>(i)].done.get_future());
      REQUIRE(f.host->start(batch_request("split", i), cb));
    }
    for (int i = 0; i < n; ++i) {
      auto r = done[static_cast<size_t>(i)].get();
      INFO("request " << i << (lose ? ", p2 lost" : ""));
      INFO((r ? std::string() : r.error().message));
      REQUIRE(r);
      CHECK(r->text == alone[static_cast<size_t>(i)]);
      CHECK(r->completion_tokens == 24);
    }
    CHECK(f.host->stats().widest_step >= 2);
    CHECK(f.host->stats().most_micro_batches >= 2);  // the 3 stages took micro-batches at once
    CHECK(f.host->stats().chained_steps > 0);        // which went on without waiting for each other
    CHECK(killed == lose);
  }
  auto now = f.host->models();
  const auto it = std::find_if(now.begin(), now.end(), [](const auto& m) { return m.id == "split"; });
  REQUIRE(it != now.end());
  CHECK(it->stages.size() == 2);
  CHECK(f.mesh.undecodable == 0);
}

TEST_CASE("a stage node that dies when no plan fits the nodes left fails the request saying why", "[generation][split][failover]") {
  const node_id p1 = test::named("p1");
  split_fixture f({p1}, 4, models::tensor_type::f32);
  serving::local_model_options o = f.model("split");
  // This node has room for nothing: p1 holds every layer, and once it is gone nothing fits.
  o.split = generation::make_split_builder(f.mesh.calls, f.mesh.srv, {{f.mesh.srv, 1, 5}, {p1, 1 << 30, 5}}, f.path.string(), short_waits);
  auto info = f.host->load(o);
  REQUIRE(info);
  REQUIRE(info->stages.size() == 1);
  CHECK(info->stages[0].node == p1.to_string());
  REQUIRE(run(*f.host, "split", 0));
  f.mesh.kill(p1);
  auto r = run(*f.host, "split", 0);
  REQUIRE_FALSE(r);
  CHECK(r.error().kind == serving::failure_kind::no_capacity);
  INFO(r.error().message);
  CHECK(r.error().message.find("node " + p1.short_string() + " is not connected") != std::string::npos);
  CHECK(r.error().message.find("stage 1 of 1") != std::string::npos);
  CHECK(r.error().message.find("no re-plan over the nodes left: stage plan: the model needs") != std::string::npos);
  CHECK(r.error().message.find("the 1 nodes have 1 B free") != std::string::npos);
  // The host goes on: the next request fails the same way, nothing hangs; the listing shows no stages.
  auto next = run(*f.host, "split", 0);
  REQUIRE_FALSE(next);
  CHECK(next.error().message.find("no re-plan over the nodes left") != std::string::npos);
  auto now = f.host->models();
  REQUIRE(now.size() == 1);
  CHECK(now[0].stages.empty());

  // A call waiting for a node that leaves fails at once, naming it.
  auto silent = std::make_shared<generation::stage_calls>([](const node_id&, const msg::message&) { return true; });
  auto waiting = std::async(std::launch::async, [&] { return silent->call(p1, msg::stage_step{}, std::chrono::minutes(5)); });
  std::this_thread::sleep_for(50ms);
  silent->peer_gone(p1);
  auto gone = waiting.get();
  REQUIRE_FALSE(gone);
  CHECK(gone.error().message == "node " + p1.short_string() + " left the mesh (its connection closed)");
  auto late = silent->call(p1, msg::stage_step{}, 20ms);
  REQUIRE_FALSE(late);
  CHECK(late.error().message.find("did not answer stage_step") != std::string::npos);
}

TEST_CASE("with a roster, a departure re-plans at once and a node that joins widens the plan while a request runs", "[generation][split][failover]") {
  const node_id p1 = test::named("p1"), p2 = test::named("p2"), p3 = test::named("p3");
  split_fixture f({p1, p2, p3}, 6, models::tensor_type::q8_0);
  auto roster = std::make_shared<generation::split_roster>();
  roster->joined({p1, f.gb, 10});
  roster->joined({p2, f.gb, 10});
  REQUIRE(f.host->load(f.model("whole")));
  serving::local_model_options o = f.model("split");
  o.split = generation::make_split_builder(f.mesh.calls, f.mesh.srv, {{f.mesh.srv, f.gb, 10}, {p1, f.gb, 10}, {p2, f.gb, 10}}, f.path.string(),
                                           short_waits, roster);
  REQUIRE(f.host->load(o));
  const auto stage_nodes = [&] { return stage_nodes_of(*f.host, "split"); };
  REQUIRE(stage_nodes() == std::vector<std::string>{f.mesh.srv.to_string(), p1.to_string(), p2.to_string()});
  auto undisturbed = run_long(*f.host, "whole", 40);
  REQUIRE(undisturbed);

  // p2 leaves while nothing runs: the plan moves without waiting for a request.
  f.mesh.kill(p2);
  roster->left(p2);
  CHECK(eventually([&] { return stage_nodes() == std::vector<std::string>{f.mesh.srv.to_string(), p1.to_string()}; }));

  // p3 joins while a generation runs: the plan widens to three nodes again; the text is the same.
  std::atomic<bool> told{false};
  auto r = run_long(*f.host, "split", 40, [&](int64_t n) {
    if (n == 5 && !told.exchange(true)) roster->joined({p3, f.gb, 10});
  });
  INFO((r ? std::string() : r.error().message));
  REQUIRE(r);
  CHECK(r->text == undisturbed->text);
  CHECK(eventually([&] { return stage_nodes() == std::vector<std::string>{f.mesh.srv.to_string(), p1.to_string(), p3.to_string()}; }));
  auto again = run_long(*f.host, "split", 40);
  REQUIRE(again);
  CHECK(again->text == undisturbed->text);
  CHECK(eventually([&] { return f.mesh.held(p3) == 1 && f.mesh.held(p1) == 1; }));
  REQUIRE(f.host->unload("split"));
  CHECK(eventually([&] { return f.mesh.held(p1) == 0 && f.mesh.held(p3) == 0; }));
  roster->close();
}

TEST_CASE("a split at its full width takes a node that joined when asked to re-plan, while a request runs", "[generation][split][failover]") {
  const node_id p1 = test::named("p1"), p2 = test::named("p2");
  split_fixture f({p1, p2}, 6, models::tensor_type::q8_0);
  auto roster = std::make_shared<generation::split_roster>();
  roster->joined({p1, f.gb, 10});
  REQUIRE(f.host->load(f.model("whole")));
  serving::local_model_options o = f.model("split");
  o.split = generation::make_split_builder(f.mesh.calls, f.mesh.srv, {{f.mesh.srv, f.gb, 10}, {p1, f.gb, 10}}, f.path.string(),
                                           short_waits, roster);
  REQUIRE(f.host->load(o));
  const auto stage_nodes = [&] { return stage_nodes_of(*f.host, "split"); };
  const std::vector<std::string> two{f.mesh.srv.to_string(), p1.to_string()}, three{f.mesh.srv.to_string(), p1.to_string(), p2.to_string()};
  REQUIRE(stage_nodes() == two);
  auto undisturbed = run_long(*f.host, "whole", 40);
  REQUIRE(undisturbed);

  // p2 joins: the plan is at the width it asked for, so it does not move by itself.
  roster->joined({p2, f.gb, 10});
  auto r = run_long(*f.host, "split", 12);
  REQUIRE(r);
  CHECK(stage_nodes() == two);
  CHECK(f.mesh.held(p2) == 0);

  // Asked to plan over three nodes while a generation runs: p2 takes a share; the text is the same.
  std::promise<expected<std::vector<serving::model_stage_info>>> replanned;
  auto answer = replanned.get_future();
  std::atomic<bool> asked{false};
  r = run_long(*f.host, "split", 40, [&](int64_t n) {
    if (n == 5 && !asked.exchange(true))
      f.host->replan_async("split", 3, [&](expected<std::vector<serving::model_stage_info>> s) { replanned.set_value(std::move(s)); });
  });
  INFO((r ? std::string() : r.error().message));
  REQUIRE(r);
  CHECK(r->text == undisturbed->text);
  auto stages = answer.get();
  REQUIRE(stages);
  CHECK(stages->size() == 3);
  CHECK(stage_nodes() == three);
  CHECK(f.mesh.held(p2) == 1);
  auto again = run_long(*f.host, "split", 40);
  REQUIRE(again);
  CHECK(again->text == undisturbed->text);

  // Back to two nodes: the newest is let go. Errors name what was wrong; the plan stands.
  REQUIRE(f.host->replan("split", 2));
  CHECK(stage_nodes() == two);
  CHECK(eventually([&] { return f.mesh.held(p2) == 0; }));
  auto missing = f.host->replan("nothing", 2);
  REQUIRE(!missing);
  CHECK(missing.error().code == error_code::not_found);
  auto whole = f.host->replan("whole", 2);
  REQUIRE(!whole);
  CHECK(whole.error().message.find("not split") != std::string::npos);
  CHECK(stage_nodes() == two);
  roster->close();
}

TEST_CASE("re-plans share layers by free memory, and a loss counts the dropped stages' memory as free again", "[generation][split][failover]") {
  const node_id p1 = test::named("p1"), p2 = test::named("p2");
  split_fixture f({p1, p2}, 6, models::tensor_type::q8_0);
  auto memory = std::make_shared<generation::free_memory>(f.mesh.srv, [] { return split_fixture::gb; });
  auto roster = std::make_shared<generation::split_roster>(memory);
  roster->joined({p1, f.gb, 10});
  roster->joined({p2, f.gb, 10});
  serving::local_model_options o = f.model("split");
  o.split = generation::make_split_builder(f.mesh.calls, f.mesh.srv, {{f.mesh.srv, f.gb, 10}, {p1, f.gb, 10}, {p2, f.gb, 10}}, f.path.string(),
                                           short_waits, roster);
  REQUIRE(f.host->load(o));
  const auto stages = [&] {
    std::vector<std::string> out;
    for (const auto& m : f.host->models())
      if (m.id == "split")
        for (const auto& st : m.stages) out.push_back(fmt::format("{}:{}-{}", st.node.substr(0, 4), st.first_layer, st.end_layer));
    return out;
  };
  const auto at = [](const node_id& n, int first, int end) { return fmt::format("{}:{}-{}", n.to_string().substr(0, 4), first, end); };
  REQUIRE(stages() == std::vector<std::string>{at(f.mesh.srv, 0, 2), at(p1, 2, 4), at(p2, 4, 6)});
  REQUIRE(run(*f.host, "split", 0));

  // p2's heartbeat says nothing is free beyond the stage it holds; then p1 is lost. The re-plan
  // drops p2's stage first, so p2 can hold as much as it held, not more: two layers of the six,
  // where shares by speed alone would give it three. Counted without its old stage it would get none.
  memory->reported(p2, 0);
  f.mesh.kill(p1);
  roster->left(p1);
  CHECK(eventually([&] { return stages() == std::vector<std::string>{at(f.mesh.srv, 0, 4), at(p2, 4, 6)}; }));
  INFO(fmt::format("{}", fmt::join(stages(), ", ")));
  REQUIRE(run(*f.host, "split", 0));
  REQUIRE(f.host->unload("split"));
  roster->close();
}

TEST_CASE("a stage host loads from its own copy, serves only the stage's owner and bounds its stages", "[generation][split]") {
  temp_dir dir;
  const auto path = dir / "m.gguf";
  write_gguf_model(path, four_layers(), models::tensor_type::f32);
  const node_id a = test::named("a"), b = test::named("b");
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::pair<node_id, msg::stage_reply>> inbox;
  generation::stage_host_options o;
  o.make_executor = cpu_executors();
  o.max_stages = 2;
  o.self = "host1234";
  generation::stage_host host(o, [&](const node_id& to, const msg::message& out) {
    auto in = carried(out);
    std::lock_guard<std::mutex> lock(m);
    if (in && std::holds_alternative<msg::stage_reply>(*in)) inbox.emplace_back(to, std::get<msg::stage_reply>(*in));
    cv.notify_all();
  });
  const auto reply = [&](uint64_t call) {
    std::unique_lock<std::mutex> lock(m);
    const bool got = cv.wait_for(lock, 60s, [&] {
      return std::any_of(inbox.begin(), inbox.end(), [&](const auto& r) { return r.second.call == call; });
    });
    REQUIRE(got);
    auto it = std::find_if(inbox.begin(), inbox.end(), [&](const auto& r) { return r.second.call == call; });
    return *it;
  };

  host.open(a, {1, 5, path.string(), 0, 2, 64});
  auto opened = reply(1);
  CHECK(opened.first == a);
  CHECK(opened.second.ok);
  const auto tokens = tensor::from_ints({3}, {4, 5, 6});
  host.step(a, {2, 5, 0, 0, tokens, {}});
  auto stepped = reply(2);
  REQUIRE(stepped.second.ok);
  CHECK(stepped.second.output.dims == shape{3, 64});

  // Another node naming the same stage finds none: only its owner steps or closes it.
  host.step(b, {3, 5, 0, 3, tokens, {}});
  auto stranger = reply(3);
  CHECK(stranger.first == b);
  CHECK_FALSE(stranger.second.ok);
  CHECK(stranger.second.code == error_code::not_found);
  CHECK(stranger.second.error == "node host1234 holds no stage 5 of node " + b.short_string());
  host.close(b, {5});
  host.step(a, {4, 5, 0, 3, tensor::from_ints({1}, {7}), {}});
  CHECK(reply(4).second.ok);

  // Wrong input for the stage; a step out of step.
  host.step(a, {5, 5, 0, 4, tensor::from_floats({1, 64}, std::vector<float>(64, 0.5f)), {}});
  auto wrong = reply(5);
  CHECK_FALSE(wrong.second.ok);
  CHECK(wrong.second.error == "node host1234: stage_step: the first stage takes token ids, i32 [rows]");
  host.step(a, {6, 5, 0, 9, tokens, {}});
  auto skipped = reply(6);
  CHECK_FALSE(skipped.second.ok);
  CHECK(skipped.second.error.find("a step at position 9 of slot 0, but the stage stands at 4") != std::string::npos);

  // A path this node has no file at: the error names the node and the path.
  const auto missing = (dir / "elsewhere.gguf").string();
  host.open(a, {7, 6, missing, 2, 4, 64});
  auto lacking = reply(7);
  CHECK_FALSE(lacking.second.ok);
  CHECK(lacking.second.error.rfind("node host1234: cannot load layers [2, 4) of " + missing + ": ", 0) == 0);
  // Layers the model lacks.
  host.open(a, {8, 6, path.string(), 2, 9, 64});
  CHECK(reply(8).second.error.find("layers [2, 9) of a model with 4 layers") != std::string::npos);

  // The bound: two stages held, a third is refused.
  host.open(b, {9, 1, path.string(), 2, 4, 64});
  CHECK(reply(9).second.ok);
  host.open(b, {10, 2, path.string(), 2, 4, 64});
  auto full = reply(10);
  CHECK(full.second.code == error_code::limit_exceeded);
  CHECK(full.second.error == "node host1234: it holds 2 stages for peers, its limit");
  CHECK(host.stages() == 2);
  // An owner that leaves loses its stages; the room is there again.
  host.owner_gone(a);
  host.open(b, {11, 2, path.string(), 2, 4, 64});
  CHECK(reply(11).second.ok);
  CHECK(host.stages() == 2);

  // Stages of several sequences: a run into one slot, then batched steps (a row per slot, in any
  // order); the last stage answers a row of logits per sequence.
  host.owner_gone(b);
  host.open(a, {12, 7, path.string(), 0, 2, 64, 3});
  REQUIRE(reply(12).second.ok);
  host.open(a, {13, 8, path.string(), 2, 4, 64, 3});
  REQUIRE(reply(13).second.ok);
  host.step(a, {14, 7, 2, 0, tokens, {}});  // slot 2: 3 tokens
  auto first = reply(14);
  REQUIRE(first.second.ok);
  host.step(a, {15, 8, 2, 0, first.second.output, {}});
  REQUIRE(reply(15).second.ok);
  const auto pair = tensor::from_ints({2}, {8, 9});
  host.step(a, {16, 7, 0, 0, pair, {{2, 3}, {0, 0}}});
  auto batched = reply(16);
  INFO(batched.second.error);
  REQUIRE(batched.second.ok);
  CHECK(batched.second.output.dims == shape{2, 64});
  host.step(a, {17, 8, 0, 0, batched.second.output, {{2, 3}, {0, 0}}});
  auto logits = reply(17);
  INFO(logits.second.error);
  REQUIRE(logits.second.ok);
  REQUIRE(logits.second.output.dims.size() == 2);
  CHECK(logits.second.output.dims[0] == 2);
  // Batches the host refuses, naming what is wrong.
  host.step(a, {18, 7, 0, 0, pair, {{3, 0}, {0, 1}}});
  CHECK(reply(18).second.error == "node host1234: stage_step: slot 3 does not exist (the stage holds 3)");
  host.step(a, {19, 7, 0, 0, pair, {{1, 0}, {1, 0}}});
  CHECK(reply(19).second.error == "node host1234: stage_step: slot 1 named twice in one batched step");
  host.step(a, {20, 7, 0, 0, pair, {{1, 0}}});
  CHECK(reply(20).second.error == "node host1234: stage_step: a batched step names 1 rows for 2 rows of input");
  host.step(a, {21, 7, 0, 0, pair, {{2, 3}, {0, 1}}});  // slot 2 already stands at 4
  CHECK(reply(21).second.error.find("a step at position 3 of slot 2, which stands at 4 (it missed a step)") != std::string::npos);
  host.step(a, {22, 7, 5, 0, pair, {}});
  CHECK(reply(22).second.error == "node host1234: stage_step: slot 5 does not exist (the stage holds 3)");
  host.open(a, {23, 9, path.string(), 0, 2, 64, 0});
  CHECK(reply(23).second.error == "node host1234: stage_open: 0 slots (1 to 256)");
}

namespace {

/// A stage node with a blob cache in `dir`, fetching from the serving node of `link`, and what
/// it answers; open() and step() wait for the reply.
struct stage_node_rig {
  test::fetch_link& link;
  std::shared_ptr<blobs::blob_store> store;
  std::mutex m;
  std::condition_variable cv;
  std::map<uint64_t, msg::stage_reply> replies;
  std::vector<std::string> lines;
  std::unique_ptr<generation::stage_host> host;

  stage_node_rig(test::fetch_link& l, const std::filesystem::path& dir) : link(l) {
    auto s = blobs::blob_store::open(dir, uint64_t{1} << 30);
    REQUIRE(s);
    store = *s;
    generation::stage_host_options o;
    o.make_executor = cpu_executors();
    o.self = link.peer.short_string();
    o.blobs = store;
    o.fetcher = link.fetcher;
    o.max_stages = 8;
    o.log = [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(m);
      lines.push_back(line);
    };
    host = std::make_unique<generation::stage_host>(o, [this](const node_id&, const msg::message& out) {
      auto r = std::get<msg::stage_reply>(test::over_the_wire(out));
      std::lock_guard<std::mutex> lock(m);
      replies[r.call] = r;
      cv.notify_all();
    });
  }
  msg::stage_reply reply(uint64_t call) {
    std::unique_lock<std::mutex> lock(m);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return replies.count(call) > 0; }));
    return replies[call];
  }
  msg::stage_reply open(uint64_t call, uint64_t stage, const std::string& path, models::layer_range layers,
                        std::vector<msg::blob_file> offered) {
    msg::stage_open op;
    op.call = call;
    op.stage = stage;
    op.path = path;
    op.first_layer = static_cast<uint32_t>(layers.first);
    op.end_layer = static_cast<uint32_t>(layers.end);
    op.head = layers.head;
    op.context = 32;
    op.files = std::move(offered);
    host->open(link.srv, op);
    return reply(call);
  }
  msg::stage_reply step(uint64_t call, uint64_t stage, bool tokens, int64_t hidden_size) {
    msg::stage_step st;
    st.call = call;
    st.stage = stage;
    st.input = tokens ? tensor::from_values(dtype::i32, {3}, {5, 9, 2})
                      : tensor::from_floats({3, hidden_size}, std::vector<float>(static_cast<size_t>(3 * hidden_size), 0.25f));
    host->step(link.srv, st);
    return reply(call);
  }
  size_t logged(const std::string& what) {
    std::lock_guard<std::mutex> lock(m);
    return static_cast<size_t>(std::count_if(lines.begin(), lines.end(), [&](const auto& l) { return l.find(what) != std::string::npos; }));
  }
};

/// The offered files with the byte ranges a stage of `layers` reads, as the serving node sends them.
std::vector<msg::blob_file> with_stage_ranges(std::vector<msg::blob_file> files, const models::checkpoint& ckpt, models::layer_range layers) {
  auto config = models::read_model_config(ckpt);
  REQUIRE(config);
  auto ranges = models::stage_file_ranges(*config, ckpt, layers);
  REQUIRE(ranges);
  REQUIRE(ranges->size() == files.size());
  for (size_t i = 0; i < files.size(); ++i)
    for (const auto& r : (*ranges)[i]) files[i].ranges.push_back({r.offset, r.length});
  return files;
}

/// What fetching `files` (with ranges) moves: each file's chunk list and the chunks its ranges touch.
uint64_t chunked_bytes(const std::vector<msg::blob_file>& files) {
  uint64_t total = 0;
  for (const auto& f : files) {
    const uint64_t chunks = (f.size + blobs::chunk_bytes - 1) / blobs::chunk_bytes;
    std::set<uint64_t> touched;
    for (const auto& r : f.ranges)
      for (uint64_t c = r.offset / blobs::chunk_bytes; c * blobs::chunk_bytes < r.offset + r.length; ++c) touched.insert(c);
    total += chunks * sizeof(blobs::digest);
    for (const uint64_t c : touched) total += std::min<uint64_t>(blobs::chunk_bytes, f.size - c * blobs::chunk_bytes);
  }
  return total;
}

}  // namespace

TEST_CASE("a stage node without the checkpoint fetches a Hugging Face directory's files and loads its layers from them", "[generation][split][blobs]") {
  temp_dir dir;
  const auto hf = dir / "hf";
  write_hf_model(hf, four_layers(), "F32", 3);  // config.json, an index and three shards
  auto ckpt = models::checkpoint::open(hf);
  REQUIRE(ckpt);
  REQUIRE(ckpt->files().size() == 5);
  test::fetch_link link;
  auto files = link.offers.offer_checkpoint(hf, ckpt->files());
  REQUIRE(files);
  REQUIRE(files->size() == 5);
  stage_node_rig node(link, dir / "blobs");
  const auto elsewhere = (dir / "elsewhere" / "hf").string();

  // From the node's own copy, then from a path it lacks, with the files offered.
  auto own = node.open(1, 1, hf.string(), {0, 2}, {});
  INFO(own.error);
  REQUIRE(own.ok);
  auto fetched = node.open(2, 2, elsewhere, {0, 2}, *files);
  INFO(fetched.error);
  REQUIRE(fetched.ok);
  for (const auto& f : *files) CHECK(node.store->contains(f.id));
  const uint64_t moved = link.fetcher->fetched_bytes();
  uint64_t total = 0;
  for (const auto& f : *files) total += f.size;
  CHECK(moved == total);
  auto a = node.step(3, 1, true, 0), b = node.step(4, 2, true, 0);
  REQUIRE(a.ok);
  REQUIRE(b.ok);
  CHECK(a.output.bytes == b.output.bytes);  // the same hidden rows, bit for bit

  // Opened again: every file from the cache, nothing moves.
  auto again = node.open(5, 3, elsewhere, {0, 2}, *files);
  REQUIRE(again.ok);
  CHECK(link.fetcher->fetched_bytes() == moved);
  CHECK(node.logged("from the cache (no transfer)") == files->size());
  // A file name that would leave the view's directory is refused before anything is fetched.
  auto bad = *files;
  bad[1].name = "../config.json";
  auto refused = node.open(6, 4, elsewhere, {0, 2}, bad);
  CHECK_FALSE(refused.ok);
  CHECK(refused.error.find("is not a plain file name") != std::string::npos);
}

TEST_CASE("a stage node fetches only the chunks its layers read, for a GGUF file and a sharded directory", "[generation][split][blobs]") {
  temp_dir dir;
  // Big enough that a layer spans chunks of 1 MiB: 8 layers of about 1.6 MB (f32).
  model_spec spec = four_layers();
  spec.layers = 8;
  spec.hidden = 256;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.head_dim = 64;
  spec.ffn = 384;
  write_gguf_model(dir / "m.gguf", spec, models::tensor_type::f32);
  write_hf_model(dir / "hf", spec, "F32", 2);
  for (const auto& path : {dir / "m.gguf", dir / "hf"}) {
    INFO(path);
    auto ckpt = models::checkpoint::open(path);
    REQUIRE(ckpt);
    test::fetch_link link;
    auto files = link.offers.offer_checkpoint(path, ckpt->files());
    REQUIRE(files);
    uint64_t total = 0;
    for (const auto& f : *files) total += f.size;
    stage_node_rig node(link, dir / ("blobs-" + path.filename().string()));
    const auto elsewhere = (dir / "elsewhere" / path.filename()).string();
    // The middle layers, then the last ones (without the head): each stage's output is the one
    // the node's own copy gives, bit for bit; each fetched only part of the files.
    const models::layer_range middle{2, 4}, last{6, 8, false};
    REQUIRE(node.open(1, 1, path.string(), middle, {}).ok);
    const auto middle_files = with_stage_ranges(*files, *ckpt, middle);
    auto part = node.open(2, 2, elsewhere, middle, middle_files);
    INFO(part.error);
    REQUIRE(part.ok);
    const uint64_t first = link.fetcher->fetched_bytes();
    CHECK(first == chunked_bytes(middle_files));  // the chunk lists and the chunks its ranges touch
    CHECK(first < total * 3 / 5);
    auto a = node.step(3, 1, false, spec.hidden), b = node.step(4, 2, false, spec.hidden);
    REQUIRE(a.ok);
    REQUIRE(b.ok);
    CHECK(a.output.bytes == b.output.bytes);
    REQUIRE(node.open(5, 3, path.string(), last, {}).ok);
    REQUIRE(node.open(6, 4, elsewhere, last, with_stage_ranges(*files, *ckpt, last)).ok);
    CHECK(link.fetcher->fetched_bytes() > first);
    CHECK(link.fetcher->fetched_bytes() < total);
    auto c = node.step(7, 3, false, spec.hidden), d = node.step(8, 4, false, spec.hidden);
    REQUIRE(c.ok);
    REQUIRE(d.ok);
    CHECK(c.output.bytes == d.output.bytes);
    // The middle again: its chunks are in the cache.
    const uint64_t before = link.fetcher->fetched_bytes();
    auto cached = node.open(9, 5, elsewhere, middle, with_stage_ranges(*files, *ckpt, middle));
    INFO(cached.error);
    REQUIRE(cached.ok);
    CHECK(link.fetcher->fetched_bytes() == before);
    CHECK(node.logged("chunks this stage reads") >= 1);
  }
}

TEST_CASE("a split picks this node first and the peers with the most memory", "[generation][split]") {
  constexpr uint64_t gib = uint64_t{1} << 30;
  const generation::split_candidate self{test::named("s"), 100 * gib, 1};
  // y has a few MB more than w: the same in whole GiB, so the lower id goes first.
  std::vector<generation::split_candidate> peers{{test::named("x"), 50 * gib, 1}, {test::named("y"), 80 * gib + 3'000'000, 1},
                                                 {test::named("w"), 80 * gib, 2}};
  auto two = generation::pick_split_nodes(self, peers, 3);
  REQUIRE(two);
  REQUIRE(two->size() == 3);
  CHECK((*two)[0].id == self.id);
  CHECK((*two)[1].id == test::named("w"));  // 80 GiB, the lower id of the two
  CHECK((*two)[2].id == test::named("y"));
  auto many = generation::pick_split_nodes(self, peers, 5);
  REQUIRE_FALSE(many);
  CHECK(many.error().message == "a split over 5 nodes needs 4 healthy peers; this node has 3");
  CHECK_FALSE(generation::pick_split_nodes(self, peers, 1));
}
