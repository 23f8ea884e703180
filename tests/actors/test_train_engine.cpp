// The training engine of several nodes over a simulated network, each node with its own CPU
// executor: data-parallel training over 3 nodes reaches the parameters of the single-node
// reference (up to float rounding), also when a node dies or joins mid-run and when messages
// arrive in any order; DiLoCo's loss is close to data parallel's; bad specs are refused.
#include <catch2/catch.hpp>

#include <tuple>

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <utility>
#include <variant>

#include "sim_network.hpp"
#include "actors/train_buckets.hpp"
#include "actors/train_engine.hpp"
#include "client/trainer.hpp"
#include "gpu/executor.hpp"
#include "graph/datasets.hpp"
#include "graph/nn.hpp"
#include "model_writer.hpp"
#include "models/checkpoint_tokenizer.hpp"
#include "models/finetune.hpp"
#include "transport/identity.hpp"

#include <fcntl.h>
#include <unistd.h>

using namespace mesh;

namespace {

/// The client signs takeover grants (wire/takeover_grant.hpp) with its key, and nodes check them
/// against its id: unlike the nodes' (test::named), its id is a real Ed25519 public key.
const transport::identity& client_key() {
  static const transport::identity k = transport::identity::from_seed({7, 7, 7});
  return k;
}
node_id client_id() { return client_key().id(); }

/// The client's train_resume asking `node` to take run `train` (coordinated by `old`) over, with
/// its grant of `generation`.
msg::train_resume resume(uint64_t train, const std::string& old, const std::string& node, std::vector<named_tensor> dataset,
                         uint32_t generation = 1) {
  return {train, test::named(old), std::move(dataset), msg::sign_takeover(client_key().secret_key(), train, generation, test::named(node))};
}

struct model_setup {
  graph model;
  tensor_map params;
  tensor_map data;
  int64_t micro_batch = 16;
};

model_setup two_moons_mlp() {
  model_setup s;
  builder b;
  auto x = b.input("x", dtype::f32, {s.micro_batch, 2});
  auto labels = b.input("labels", dtype::i32, {s.micro_batch});
  auto net = nn::make_mlp(b, "mlp", {2, 16, 2});
  b.output("loss", nn::cross_entropy(net(x), labels));
  s.model = *b.finish();
  s.params = nn::init_parameters(s.model, 3);
  auto [xs, ys] = datasets::two_moons(200, 11);
  s.data = {{"x", xs}, {"labels", ys}};
  return s;
}

/// Nodes "node-a".. with CPU executors and a client "client" (client_id()) on the simulated network
/// (tests/common/sim_network.hpp): messages are delivered one at a time, in the order posted, or
/// with `net.set_shuffle(true)` each sender-receiver pair in order and pairs interleaved at random.
struct train_sim {
  struct node {
    std::unique_ptr<train_engine> engine;
    std::unique_ptr<gpu::executor> device;
  };
  std::map<std::string, node> nodes;
  test::sim_network<outbound> net{7, false};
  /// Simulated time: a millisecond passes with every delivery.
  train_engine::clock::time_point now{};
  std::set<std::string> dead;
  std::vector<msg::train_progress> progress;
  std::vector<msg::job_result> results;
  std::map<std::string, std::vector<uint32_t>> shards_received;  ///< dataset shards each node was sent
  std::map<std::string, int64_t> rows_received;
  /// The graph limits a node decodes its messages with (graph_limits{} when not named here).
  std::map<std::string, graph_limits> limits;
  std::vector<msg::train_checkpoint> checkpoints;  // what the client received
  /// Called after each delivered message (tests kill or add nodes here).
  std::function<void(train_sim&)> on_tick;
  /// The message on_tick follows, and who sent it to whom.
  std::string last_from, last_to;
  msg::message last_message;
  /// What the nodes refused for the sender's lack of authority, with the refusing node's name.
  std::vector<std::pair<std::string, refused_message>> refused;
  /// Nodes that stay connected (no peer_dead) but do nothing: messages to them are dropped.
  std::set<std::string> hung;
  /// Nodes whose all-reduce pieces are dropped (they compute and say ready, and send nothing).
  std::set<std::string> mute;
  /// When nothing is left to deliver: advance the clock by this much and call every engine's
  /// tick() (at most idle_ticks times in a row); zero: the run ends when the network is idle.
  std::chrono::milliseconds idle_step{0};
  int idle_ticks = 2000;
  step_deadlines deadlines;
  /// Nodes added from now on take pieces through shared memory (all of them are in this
  /// process, so each maps the others' regions: train_engine::host_shared_memory).
  bool shared_memory = false;
  /// Whether nodes added from now on may reduce through every member's region (host_reduce.hpp).
  bool host_reduce = true;
  /// Whether their devices import the regions (train_engine::set_host_import).
  bool host_import = true;
  /// Whether they copy buckets and sums beside the kernels (train_engine::set_copy_overlap).
  bool copy_overlap = true;
  /// The device of each node added from now on (the CPU back end when empty).
  std::function<std::unique_ptr<gpu::executor>()> make_device;
  /// What the nodes logged (train_engine::take_notices): the node, the text, and the steps the
  /// client had been told of by then.
  struct logged {
    std::string node, text;
    size_t steps = 0;
  };
  std::vector<logged> notices;

  explicit train_sim(int n, step_deadlines d = {}, bool shared = false) : deadlines(d), shared_memory(shared) {
    for (int i = 0; i < n; ++i) add(std::string("node-") + static_cast<char>('a' + i));
  }

  /// Bytes of data files each node's worker read (every node reads the files where they are).
  std::map<std::string, uint64_t> data_bytes;

  void add(const std::string& id) {
    node nd{std::make_unique<train_engine>(test::named(id), deadlines), make_device ? make_device() : gpu::make_cpu_executor(1)};
    if (shared_memory) nd.engine->set_shared_memory(train_engine::host_shared_memory());
    nd.engine->set_host_reduce(host_reduce);
    nd.engine->set_host_import(host_import);
    nd.engine->set_copy_overlap(copy_overlap);
    nd.engine->set_data_opener([this, id](const node_id&, const msg::train_text_data& t) -> expected<models::byte_source> {
      auto file = models::file_source(t.path);
      if (!file) return file;
      return models::byte_source([this, id, file = *file](uint64_t offset, std::span<char> into) {
        auto n = file(offset, into);
        if (n) data_bytes[id] += *n;
        return n;
      });
    });
    for (auto& [other, o] : nodes) {
      nd.engine->peer_up(test::named(other));
      o.engine->peer_up(test::named(id));
    }
    nodes.emplace(id, std::move(nd));
  }

  void kill(const std::string& id) {
    nodes.erase(id);
    dead.insert(id);
    for (auto& [other, o] : nodes) post(other, o.engine->peer_dead(test::named(id), now));
  }

  /// A node's name on the simulated network, and back.
  static node_id id_of(const std::string& name) { return name == "client" ? client_id() : test::named(name); }
  static std::string name_of(const node_id& id) { return id == client_id() ? "client" : test::name_of(id); }

  void post(const std::string& from, std::vector<outbound> out) {
    for (auto& o : out) {
      const std::string to = name_of(o.to);
      net.post(from, to, std::move(o));
    }
  }
  /// What a test sends: to a node by name.
  struct named_out {
    std::string to;
    msg::message m;
  };
  void send(const std::string& from, std::vector<named_out> out) {
    for (auto& o : out) net.post(from, o.to, outbound{id_of(o.to), std::move(o.m)});
  }

  void run_tasks(const std::string& id) {
    auto it = nodes.find(id);
    if (it == nodes.end() || hung.count(id)) return;
    auto ready = it->second.engine->take_ready();
    // Held writes run before the next step's work (the executor takes tasks in order), after
    // the engine took that step's message.
    if (std::any_of(ready.begin(), ready.end(), [](const train_task& t) { return !t.bucket_write; })) run_held_writes(id);
    // As the node's executor: a task whose copies are still under way (train_work_result::
    // copied) is reported once they are done, after the executor ran the tasks behind it, whose
    // results then wait their turn.
    std::vector<std::pair<train_task, expected<train_work_result>>> done;
    for (auto& t : ready) {
      if (t.bucket_write && late_writes.count(id)) {
        held_writes[id].push_back(std::move(t));
        continue;
      }
      auto r = t.work(*it->second.device);
      done.emplace_back(std::move(t), std::move(r));
    }
    for (auto& [t, r] : done) {
      post(id, it->second.engine->on_executed(t, finish_copies(std::move(r)), now));
      for (auto& n : it->second.engine->take_notices()) notices.push_back({id, std::move(n.text), progress.size()});
    }
  }
  /// Nodes whose bucket writes (train_engine::write_bucket) run only just before their next
  /// task, as on a device still busy with the step's other segments when the rounds end.
  std::set<std::string> late_writes;
  std::map<std::string, std::vector<train_task>> held_writes;
  void run_held_writes(const std::string& id) {
    auto held = std::exchange(held_writes[id], {});
    for (auto& t : held) {
      auto r = finish_copies(t.work(*nodes.at(id).device));
      post(id, nodes.at(id).engine->on_executed(t, std::move(r), now));
    }
  }

  void run() {
    int idle = 0;
    for (int guard = 0; guard < 2000000; ++guard) {
      if (net.empty()) {
        if (idle_step.count() == 0 || ++idle > idle_ticks || !results.empty()) break;
        now += idle_step;
        for (auto& [id, nd] : nodes)
          if (!hung.count(id)) post(id, nd.engine->tick(now));
        for (auto& [id, nd] : nodes)
          for (auto& r : nd.engine->take_refused()) refused.emplace_back(id, std::move(r));
        continue;
      }
      idle = 0;
      auto [from, to, o] = *net.next();
      now += std::chrono::milliseconds(1);
      if (dead.count(from) || hung.count(to)) continue;
      if (mute.count(from) && (std::holds_alternative<msg::allreduce_piece>(o.m) || std::holds_alternative<msg::allreduce_piece_shared>(o.m) ||
                               std::holds_alternative<msg::host_reduce_mark>(o.m)))
        continue;
      if (to == "client") {
        if (auto* p = std::get_if<msg::train_progress>(&o.m)) progress.push_back(*p);
        if (auto* r = std::get_if<msg::job_result>(&o.m)) results.push_back(*r);
        if (auto* k = std::get_if<msg::train_checkpoint>(&o.m)) checkpoints.push_back(*k);
        continue;
      }
      auto it = nodes.find(to);
      if (it == nodes.end()) continue;
      if (auto* st = std::get_if<msg::train_step>(&o.m))
        for (const auto& sh : st->shards) {
          shards_received[to].push_back(sh.index);
          rows_received[to] += sh.columns.at(0).value.dims.at(0);
        }
      // Through the real codec, as on the wire: graphs are validated against the receiver's limits.
      auto bytes = msg::encode_message(o.m);
      REQUIRE(bytes);
      const auto own = limits.find(to);
      auto m = msg::decode_message(bytes->data(), bytes->size(), msg::default_decode_budget, own == limits.end() ? nullptr : &own->second);
      REQUIRE(m);
      post(to, it->second.engine->on_message(id_of(from), *m, now));
      for (auto& r : it->second.engine->take_refused()) refused.emplace_back(to, std::move(r));
      run_tasks(to);
      last_from = from;
      last_to = to;
      last_message = std::move(*m);
      if (on_tick) on_tick(*this);
    }
  }

  /// Starts a run from the client at node-a and runs the simulation to the end.
  msg::job_result train(const msg::train_spec& spec) {
    send("client", {{"node-a", msg::open_training{1, spec}}});
    run();
    REQUIRE(results.size() == 1);
    return results[0];
  }
};

/// The final state of a finished run.
tensor_map outputs_of(const msg::job_result& r) {
  tensor_map m;
  for (const auto& o : r.outputs) m[o.name] = o.value;
  return m;
}

/// The step the coordinator says the run reached.
uint64_t reached_step(const msg::job_result& r) { return r.step; }

/// Largest |a - b| / (1 + |b|) over every parameter.
double max_difference(const tensor_map& a, const tensor_map& b) {
  double worst = 0;
  for (const auto& [name, t] : b) {
    REQUIRE(a.count(name));
    const auto x = a.at(name).to_doubles(), y = t.to_doubles();
    REQUIRE(x.size() == y.size());
    for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]) / (1 + std::abs(y[i])));
  }
  return worst;
}

/// Mean loss over the whole dataset with the reference evaluator.
double full_loss(const model_setup& s, const tensor_map& params) {
  double total = 0;
  int n = 0;
  data_order order(s.data.at("x").dims[0], s.micro_batch, 0);
  for (uint64_t i = 0; i < order.per_epoch(); ++i) {
    auto in = take_rows(s.data, order.rows(i));
    auto out = evaluate(s.model, *in, params);
    REQUIRE(out);
    total += out->outputs.at("loss").at(0);
    ++n;
  }
  return total / n;
}

msg::train_spec spec_for(const model_setup& s, train_options o) {
  auto spec = make_train_spec(s.model, s.params, s.data, s.micro_batch, o);
  REQUIRE(spec);
  return *spec;
}

/// A client's spec as a coordinator sends it in a setup: the dataset's columns without rows.
msg::train_spec setup_spec(msg::train_spec spec) {
  spec.dataset_rows = static_cast<uint64_t>(spec.dataset.at(0).value.dims.at(0));
  for (auto& c : spec.dataset) {
    shape none = c.value.dims;
    none[0] = 0;
    c.value = tensor::zeros(c.value.type, none);
  }
  return spec;
}

train_options dp_options(uint64_t steps = 24) {
  train_options o;
  o.steps = steps;
  o.micro_batches = 6;
  o.optimizer = optim::adam_options{.lr = 0.02};
  return o;
}

/// dp_options as DiLoCo: outer steps of 5 inner steps.
train_options diloco_options(uint64_t steps) {
  auto o = dp_options(steps);
  o.method = train_method::diloco;
  o.inner_steps = 5;
  return o;
}

}  // namespace

TEST_CASE("data-parallel training on 3 nodes equals the single-node reference", "[actors][train]") {
  const auto s = two_moons_mlp();
  const auto spec = spec_for(s, dp_options());
  train_sim one(1);
  const auto reference = one.train(spec);
  REQUIRE(reference.ok);
  train_sim three(3);
  const auto r = three.train(spec);
  INFO(r.error);
  REQUIRE(r.ok);
  CHECK(r.workers.size() == 3);
  const auto ref_state = outputs_of(reference), state = outputs_of(r);
  CHECK(state.at("opt.adam.t").at(0) == 24.0);  // every step applied exactly once
  CHECK(reached_step(r) == 24);                 // and the result says so
  CHECK(max_difference(state, ref_state) < 1e-4);
  REQUIRE(three.progress.size() == 24);
  for (size_t i = 0; i < three.progress.size(); ++i) {
    CHECK(three.progress[i].step == i + 1);
    CHECK(three.progress[i].peers == 3);
  }
  CHECK(three.progress.back().loss < three.progress.front().loss);
  CHECK(full_loss(s, parameters_only(state)) < full_loss(s, s.params) * 0.8);
  // The coordinator keeps the loss of every step for the dashboard: the losses it reported.
  size_t curves = 0;
  for (const auto& [id, n] : three.nodes)
    for (const auto& [run, losses] : n.engine->curves()) {
      ++curves;
      REQUIRE(losses.size() == three.progress.size());
      for (size_t i = 0; i < losses.size(); ++i) CHECK(losses[i] == three.progress[i].loss);
    }
  CHECK(curves == 1);
}

namespace {

/// The two-moons MLP's data-parallel run with each of its 4 gradients a bucket of its own (1 byte
/// closes a bucket), and where one node of its own ends that run.
std::pair<msg::train_spec, msg::job_result> bucket_per_gradient() {
  auto o = dp_options();
  o.bucket_bytes = 1;
  auto spec = spec_for(two_moons_mlp(), o);
  train_sim one(1);
  auto reference = one.train(spec);
  REQUIRE(reference.ok);
  return {std::move(spec), std::move(reference)};
}

}  // namespace

TEST_CASE("gradients all-reduced in buckets, each after its segment of the backward pass, give the single-node result",
          "[actors][train][buckets]") {
  // A segment and a ring round for each of the MLP's 4 gradients, while a step's micro-batches
  // spread over the members (some with none: 8 nodes, 6 micro-batches).
  const auto [spec, reference] = bucket_per_gradient();
  for (const int nodes : {3, 8}) {
    INFO(nodes << " nodes");
    train_sim sim(nodes);
    sim.net.set_shuffle(true);
    int buckets_seen = 0;
    sim.on_tick = [&](train_sim& t) {
      if (const auto* p = std::get_if<msg::allreduce_piece>(&t.last_message))
        buckets_seen = std::max(buckets_seen, static_cast<int>(p->round % bucketed_allreduce::max_buckets) + 1);
    };
    const auto r = sim.train(spec);
    INFO(r.error);
    REQUIRE(r.ok);
    CHECK(buckets_seen == 4);
    CHECK(max_difference(outputs_of(r), outputs_of(reference)) < 1e-4);
    CHECK(outputs_of(r).at("opt.adam.t").at(0) == 24.0);
  }
  // A node dying mid-run: its buckets' rounds are redone with the step, nothing applied twice.
  train_sim sim(3);
  sim.on_tick = [](train_sim& t) {
    if (!t.dead.count("node-b") && t.progress.size() == 9) t.kill("node-b");
  };
  const auto r = sim.train(spec);
  INFO(r.error);
  REQUIRE(r.ok);
  CHECK(max_difference(outputs_of(r), outputs_of(reference)) < 1e-4);
  // A node dying once a bucket's round has ended and its sum was written into the accumulators
  // (train_engine::write_bucket), while later buckets' rounds still go: the step is redone from
  // gradients computed again, and nothing of the abandoned attempt is applied.
  train_sim late(3);
  bool killed = false;
  late.on_tick = [&](train_sim& t) {
    if (killed || t.progress.size() != 5) return;
    const auto* p = std::get_if<msg::allreduce_piece>(&t.last_message);
    if (p && p->round % bucketed_allreduce::max_buckets == 1 && p->ring_step == 3) {  // bucket 1's last ring step (3 nodes)
      t.kill("node-b");
      killed = true;
    }
  };
  const auto l = late.train(spec);
  INFO(l.error);
  REQUIRE(l.ok);
  CHECK(killed);
  CHECK(max_difference(outputs_of(l), outputs_of(reference)) < 1e-4);
}

namespace {

/// An executor whose write_parameters fails once, at its `fail_at`-th call (1-based).
class failing_writes final : public gpu::executor {
 public:
  failing_writes(std::unique_ptr<gpu::executor> inner, int fail_at) : inner_(std::move(inner)), fail_at_(fail_at) {}
  const gpu::device_info& info() const override { return inner_->info(); }
  expected<gpu::program_id> load(const graph& g) override { return inner_->load(g); }
  expected<void> set_parameters(const tensor_map& p) override { return inner_->set_parameters(p); }
  expected<void> set_parameter_view(const std::string& n, const tensor_view& v) override { return inner_->set_parameter_view(n, v); }
  expected<tensor_map> get_parameters(const std::vector<std::string>& n) override { return inner_->get_parameters(n); }
  expected<void> read_parameters(const std::vector<std::string>& n, std::span<uint8_t> out) override { return inner_->read_parameters(n, out); }
  expected<void> write_parameters(const std::vector<std::string>& n, std::span<const uint8_t> bytes) override {
    if (++writes == fail_at_) return make_error(error_code::device, "staging memory exhausted (injected)");
    return inner_->write_parameters(n, bytes);
  }
  expected<tensor_map> run(gpu::program_id id, const tensor_map& in) override { return inner_->run(id, in); }
  expected<tensor_map> run_repeated(gpu::program_id id, const tensor_map& in, int64_t times) override {
    return inner_->run_repeated(id, in, times);
  }
  void unload(gpu::program_id id) override { inner_->unload(id); }
  size_t drop_parameters(const std::string& prefix) override { return inner_->drop_parameters(prefix); }
  gpu::kernel_stats stats() const override { return inner_->stats(); }
  int writes = 0;

 private:
  std::unique_ptr<gpu::executor> inner_;
  int fail_at_;
};

}  // namespace

TEST_CASE("a bucket's sum that cannot be written fails its step on that node, which is left out, and nothing wrong is applied",
          "[actors][train][buckets]") {
  // node-b's writes of reduced buckets run just before its next step's work (its device busy
  // with the other segments): one fails after the step it belongs to was superseded, so only
  // the commit can notice. Applying the bucket's own unreduced gradients would move node-b's
  // replica away from the others; the run must instead go on without node-b.
  const auto [spec, reference] = bucket_per_gradient();
  train_sim sim(3);
  auto* device = new failing_writes(gpu::make_cpu_executor(1), 9);  // a write of the third step
  sim.nodes.at("node-b").device.reset(device);
  sim.late_writes.insert("node-b");
  const auto r = sim.train(spec);
  INFO(r.error);
  REQUIRE(r.ok);
  CHECK(device->writes >= 9);
  // node-b's failed step left it out for a while (it is set up again as a live peer after).
  CHECK(std::any_of(sim.progress.begin(), sim.progress.end(), [](const msg::train_progress& p) { return p.peers == 2; }));
  CHECK(max_difference(outputs_of(r), outputs_of(reference)) < 1e-4);  // 4e-4 when the commit applies the unreduced bucket
}

TEST_CASE("all-reduce pieces through shared memory give the result of pieces in messages, bit for bit", "[actors][train][shm]") {
  // Every node of the simulation is in this process, so each maps its predecessor's region as
  // nodes on one host do. Data parallel in buckets, and DiLoCo with int8 outer gradients (a
  // block format), each against the same run with every piece in its message. The pieces keep
  // going around the ring (no host all-reduce, which sums in another order).
  const auto s = two_moons_mlp();
  auto dp = dp_options();
  dp.bucket_bytes = 1;
  auto diloco = diloco_options(20);
  diloco.compression = wire_format::int8;
  for (const auto& o : {dp, diloco}) {
    INFO((o.method == train_method::diloco ? "DiLoCo int8" : "data parallel in buckets"));
    const auto spec = spec_for(s, o);
    train_sim inline_pieces(3);
    const auto expected_result = inline_pieces.train(spec);
    REQUIRE(expected_result.ok);
    train_sim shared(0, {}, true);
    shared.host_reduce = false;
    for (const char* n : {"node-a", "node-b", "node-c"}) shared.add(n);
    std::map<std::string, int> kinds;
    std::vector<uint64_t> inline_steps;  // the steps whose pieces still went in messages
    shared.on_tick = [&](train_sim& t) {
      ++kinds[msg::kind_name(t.last_message)];
      if (std::holds_alternative<msg::allreduce_piece>(t.last_message)) inline_steps.push_back(t.progress.size());
    };
    const auto r = shared.train(spec);
    INFO(r.error);
    REQUIRE(r.ok);
    CHECK(outputs_of(r) == outputs_of(expected_result));
    CHECK(kinds["shared_region_offer"] >= 3);  // each member offers its successor
    CHECK(kinds["shared_region_answer"] == kinds["shared_region_offer"]);
    CHECK(kinds["allreduce_piece_shared"] > 0);
    // Pieces go in messages only until the successors have answered: in the first round.
    for (uint64_t step : inline_steps) CHECK(step == 0);
    CHECK(kinds["allreduce_piece_shared"] > 4 * kinds["allreduce_piece"]);
  }
}

TEST_CASE("members that all share a host sum their gradients through each other's regions, and equal a single node",
          "[actors][train][shm][host_reduce]") {
  // A bucket per gradient on 3 nodes of this process, delivered in a shuffled order: each member
  // offers its region to every other; once all said so (train_ready), the steps go through the
  // regions (host_reduce_mark), the pieces only in the first ones.
  const auto [spec, reference] = bucket_per_gradient();
  for (const int nodes : {2, 3, 4}) {
    INFO(nodes << " nodes");
    train_sim sim(nodes, {}, true);
    sim.net.set_shuffle(true);
    std::map<std::string, int> kinds;
    std::set<uint64_t> piece_steps, mark_steps, host_steps;
    sim.on_tick = [&](train_sim& t) {
      ++kinds[msg::kind_name(t.last_message)];
      if (std::holds_alternative<msg::allreduce_piece>(t.last_message) || std::holds_alternative<msg::allreduce_piece_shared>(t.last_message))
        piece_steps.insert(t.progress.size());
      if (std::holds_alternative<msg::host_reduce_mark>(t.last_message)) mark_steps.insert(t.progress.size());
      if (const auto* st = std::get_if<msg::train_step>(&t.last_message); st && st->host_reduce) host_steps.insert(st->step);
    };
    const auto r = sim.train(spec);
    INFO(r.error);
    REQUIRE(r.ok);
    CHECK(max_difference(outputs_of(r), outputs_of(reference)) < 1e-4);
    // Every member offered every other its region; the first steps around the ring (offers
    // answered during the first, reported in the second's train_ready; an offer that came
    // before its receiver's setup is made again at the next step), every later one through the
    // regions: 4 buckets, 2 marks each to every other member.
    CHECK(kinds["shared_region_offer"] >= nodes * (nodes - 1));
    REQUIRE(!host_steps.empty());
    const uint64_t first = *host_steps.begin();
    CHECK(first >= 2);
    CHECK(first <= 3);
    CHECK(host_steps.size() == spec.steps - first);
    REQUIRE(!piece_steps.empty());
    CHECK(*piece_steps.rbegin() < first);
    CHECK(mark_steps.size() == host_steps.size());
    CHECK(kinds["host_reduce_mark"] == static_cast<int>(host_steps.size()) * 4 * 2 * nodes * (nodes - 1));
    CHECK(sim.refused.empty());
  }
}

TEST_CASE("on a discrete GPU's path the device copies the host all-reduce's gradients and sums to and from the regions itself",
          "[actors][train][shm][host_reduce][vulkan]") {
  // Three nodes on lavapipe, moving their tensors through copy commands as a discrete GPU does
  // (map_device_memory off), under the validation layers: each imports its own region and the
  // others' once (executor::import_host_memory), reads its buckets into its region and writes
  // the sums from the three, and the run equals one node's.
  const auto [spec, reference] = bucket_per_gradient();
  // One executor lives until exit on purpose (as tests/gpu/harness.hpp's): destroying the last
  // Vulkan instance unloads the driver, and LeakSanitizer could then not name (nor suppress) what
  // the driver leaked.
  static gpu::executor* const kept = [] {
    auto ex = gpu::make_vulkan_executor();
    REQUIRE(ex);
    return ex->release();
  }();
  (void)kept;
  // With the copies beside the kernels (the default) and without (each before its task returns).
  for (const bool overlap : {true, false}) {
    INFO((overlap ? "copies beside the kernels" : "copies before each task returns"));
    train_sim sim(0, {}, true);
    sim.copy_overlap = overlap;
    std::vector<gpu::executor*> devices;
    sim.make_device = [&] {
      gpu::vulkan_options o;
      o.map_device_memory = false;
      o.validation = true;
      auto ex = gpu::make_vulkan_executor(o);
      INFO((ex ? "" : ex.error().to_string()));
      REQUIRE(ex);
      devices.push_back(ex->get());
      return std::move(*ex);
    };
    for (const char* n : {"node-a", "node-b", "node-c"}) sim.add(n);
    std::set<uint64_t> host_steps;
    sim.on_tick = [&](train_sim& t) {
      if (const auto* st = std::get_if<msg::train_step>(&t.last_message); st && st->host_reduce) host_steps.insert(st->step);
    };
    const auto r = sim.train(spec);
    INFO(r.error);
    REQUIRE(r.ok);
    CHECK(max_difference(outputs_of(r), outputs_of(reference)) < 1e-4);
    REQUIRE(!host_steps.empty());
    // The gradients of the host steps (from the third on) went in and the sums came out without
    // staging: at least each step's gradient bytes twice per node.
    REQUIRE(devices.size() == 3);
    uint64_t gradient_bytes = 0;
    for (const auto& [name, value] : outputs_of(reference))
      if (name.rfind("opt.", 0) != 0) gradient_bytes += value.bytes.size();
    // Beside the kernels: in each host step every bucket but the last is read back while the
    // next segment runs, and every sum written while the others are reduced; later work sharing
    // their accumulators (the next step's first program; never the next segment) waited for them.
    const uint64_t buckets = 4;  // bucket_per_gradient: the MLP's 4 gradients
    for (auto* d : devices) {
      const auto st = d->stats();
      CHECK(st.imported_copy_bytes >= 2 * (spec.steps - 3) * gradient_bytes);
      if (overlap) {
        CHECK(st.async_copies >= host_steps.size() * (2 * buckets - 1));
        CHECK(st.async_copy_waits >= host_steps.size() - 1);
        CHECK(st.async_copy_waits <= st.async_copies);
      } else {
        CHECK(st.async_copies == 0);
      }
      CHECK(st.validation_errors == 0);
    }
    // Each node says once what its device copies itself, the three regions at once, in a step
    // before the first host step (the imports' cost falls outside the host steps).
    std::set<std::string> told;
    for (const auto& n : sim.notices)
      if (n.text.find("the device copies gradients and sums to and from 3 shared regions itself") != std::string::npos) {
        CHECK(told.insert(n.node).second);
        CHECK(n.steps < *host_steps.begin());
      }
    CHECK(told.size() == 3);
    // And once that its copies go beside the kernels (with them on).
    std::set<std::string> beside;
    for (const auto& n : sim.notices)
      if (n.text.find("writes their sums beside its kernels") != std::string::npos) CHECK(beside.insert(n.node).second);
    CHECK(beside.size() == (overlap ? 3u : 0u));
  }
}

TEST_CASE("a host all-reduce that stalls is redone around the ring, which the run keeps", "[actors][train][shm][host_reduce]") {
  // node-c's marks go nowhere during the first host all-reduce step: every member is ready, the
  // step stalls and is redone around the ring (node-c's pieces get through again), and no later
  // step reduces through the regions. Nobody is left out; the result equals one node's.
  const auto [spec, reference] = bucket_per_gradient();
  train_sim sim(3, {}, true);
  sim.idle_step = std::chrono::milliseconds(500);
  std::vector<bool> host;  // each train_step node-a got: host_reduce or not
  sim.on_tick = [&](train_sim& t) {
    const auto* st = std::get_if<msg::train_step>(&t.last_message);
    if (!st || t.last_to != "node-a" || st->stop) return;
    host.push_back(st->host_reduce);
    if (st->host_reduce && std::count(host.begin(), host.end(), true) == 1) t.mute.insert("node-c");
    if (!st->host_reduce) t.mute.clear();
  };
  const auto r = sim.train(spec);
  INFO(r.error);
  REQUIRE(r.ok);
  CHECK(max_difference(outputs_of(r), outputs_of(reference)) < 1e-4);
  CHECK(std::count(host.begin(), host.end(), true) == 1);
  REQUIRE(host.size() > 4);
  CHECK(host.back() == false);
  CHECK(sim.progress.back().peers == 3);
  CHECK(r.workers.size() == 3);
}

TEST_CASE("a host all-reduce's marks a node cannot trust are refused, and the run goes on", "[actors][train][shm][host_reduce][security]") {
  const auto [spec, reference] = bucket_per_gradient();
  train_sim sim(3, {}, true);
  msg::host_reduce_mark seen;  // a mark of node-b's to node-a
  bool sent = false;
  const int not_a_region = ::open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  REQUIRE(not_a_region >= 0);
  sim.on_tick = [&](train_sim& t) {
    if (const auto* m = std::get_if<msg::host_reduce_mark>(&t.last_message); m && t.last_from == "node-b" && t.last_to == "node-a") seen = *m;
    if (sent || seen.round == 0) return;
    sent = true;
    // A stranger's mark (no member of the ring: refused before any file is opened), a member's
    // mark of no such phase and one it sent already, and a member's mark naming a file that is
    // no region (refused and answered no).
    msg::host_reduce_mark stranger = seen, bad_phase = seen, again = seen, no_region = seen;
    bad_phase.phase = 7;
    no_region.round = seen.round + 1;
    no_region.pid = static_cast<uint32_t>(getpid());
    no_region.fd = static_cast<uint32_t>(not_a_region);
    // Delivered at once, while node-a's round of that step still goes on.
    auto& a = *t.nodes.at("node-a").engine;
    for (const auto& [from, m] : {std::pair{"node-x", stranger}, std::pair{"node-b", bad_phase}, std::pair{"node-b", again},
                                  std::pair{"node-b", no_region}}) {
      t.post("node-a", a.on_message(test::named(from), m, t.now));
      for (auto& refusal : a.take_refused()) t.refused.emplace_back("node-a", std::move(refusal));
    }
  };
  const auto r = sim.train(spec);
  INFO(r.error);
  REQUIRE(r.ok);
  ::close(not_a_region);
  CHECK(max_difference(outputs_of(r), outputs_of(reference)) < 1e-4);
  std::set<std::string> why;
  for (const auto& [node, refusal] : sim.refused) {
    if (refusal.kind != "host_reduce_mark") continue;
    CHECK(node == "node-a");
    for (const char* w : {"not in this node's ring", "no such phase", "seen before", "not a shared region"})
      if (refusal.why.find(w) != std::string::npos) why.insert(w);
  }
  CHECK(why == std::set<std::string>{"not in this node's ring", "no such phase", "seen before", "not a shared region"});
}

TEST_CASE("shared-memory pieces and offers a node cannot trust are refused, and the run goes on", "[actors][train][shm][security]") {
  const auto s = two_moons_mlp();
  const auto spec = spec_for(s, dp_options(6));
  train_sim sim(3, {}, true);
  std::vector<msg::shared_region_answer> answers;
  std::map<std::string, std::string> successor;  // from the offers: each member offers its successor
  msg::shared_region_offer offer_to_a;            // node-a's predecessor's region
  bool sent = false;
  const int not_a_region = ::open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  REQUIRE(not_a_region >= 0);
  sim.on_tick = [&](train_sim& t) {
    if (const auto* o = std::get_if<msg::shared_region_offer>(&t.last_message)) {
      successor[t.last_from] = t.last_to;
      if (t.last_to == "node-a") offer_to_a = *o;
    }
    if (const auto* a = std::get_if<msg::shared_region_answer>(&t.last_message); a) answers.push_back(*a);
    if (sent || t.progress.size() != 2) return;
    sent = true;
    const node_id coordinator = test::named("node-a");
    std::string predecessor, other;  // of node-a in the ring
    for (const auto& [from, to] : successor)
      if (to == "node-a") predecessor = from;
    for (const auto* n : {"node-b", "node-c"})
      if (n != predecessor) other = n;
    REQUIRE(!predecessor.empty());
    // node-a's predecessor sends it a piece in a "region" that is a file of this process but no
    // region, and one past the end of its real region; the other member a piece in its region
    // (not the predecessor's: refused before anything is opened); node-a offers a file that is
    // no region.
    const auto& o = offer_to_a;
    t.send(predecessor, {{"node-a", msg::allreduce_piece_shared{1, coordinator, 0, 0, 0, static_cast<uint32_t>(getpid()),
                                                                static_cast<uint32_t>(not_a_region), 4096, std::vector<uint8_t>(16, 1), 0, 64}}});
    t.send(predecessor, {{"node-a", msg::allreduce_piece_shared{1, coordinator, 0, 0, 0, o.pid, o.fd, o.size, o.nonce, o.size, 64}}});
    t.send(other, {{"node-a", msg::allreduce_piece_shared{1, coordinator, 0, 0, 0, o.pid, o.fd, o.size, o.nonce, 0, 64}}});
    t.send("node-a", {{other, msg::shared_region_offer{1, coordinator, static_cast<uint32_t>(getpid()),
                                                       static_cast<uint32_t>(not_a_region), 4096, std::vector<uint8_t>(16, 1)}}});
  };
  const auto r = sim.train(spec);
  INFO(r.error);
  REQUIRE(r.ok);
  CHECK(outputs_of(r).at("opt.adam.t").at(0) == 6.0);
  ::close(not_a_region);
  bool refused_unmapped = false, refused_bounds = false, refused_stranger = false;
  for (const auto& [node, r] : sim.refused) {
    if (r.kind != "allreduce_piece_shared") continue;
    CHECK(node == "node-a");
    refused_unmapped = refused_unmapped || r.why.find("the piece's shared region: ") != std::string::npos;
    refused_bounds = refused_bounds || r.why.find("past its shared region") != std::string::npos;
    refused_stranger = refused_stranger || r.why.find("not this node's ring predecessor") != std::string::npos;
  }
  CHECK(refused_unmapped);
  CHECK(refused_bounds);
  CHECK(refused_stranger);
  // node-a's offer was turned down, and so was the piece in no region, with the reason.
  int told = 0;
  for (const auto& a : answers) told += !a.ok && a.error.find("not a shared region") != std::string::npos;
  CHECK(told == 2);
}

TEST_CASE("the gradient program cut into segments gives the whole program's updates and outputs", "[actors][train][buckets]") {
  const auto s = two_moons_mlp();
  auto spec = spec_for(s, dp_options());
  auto graphs = check_train_spec(spec);
  REQUIRE(graphs);
  // The gradients in the order the backward pass finishes them: the last layer's first.
  auto grads = graphs->grads;
  auto sizes = graphs->grad_sizes;
  auto dims = graphs->grad_dims;
  const auto ends = order_into_buckets(*graphs->grad, grads, sizes, dims, 1, bucketed_allreduce::max_buckets);
  REQUIRE(ends.size() == grads.size());
  CHECK(grads.front().find("mlp.1") != std::string::npos);  // the output layer's (layers mlp.0, mlp.1)
  CHECK(order_into_buckets(*graphs->grad, grads, sizes, dims, 0, 256) == std::vector<size_t>{grads.size()});
  // Accumulate every gradient into a parameter, as a worker does, then cut per gradient.
  builder b(*graphs->grad);
  std::vector<std::vector<std::string>> groups;
  for (const auto& name : grads) {
    const expr g = b.at(graphs->grad->find_output(name));
    b.update(b.parameter("acc." + name, dtype::f32, g.dims()), g);
    groups.push_back({"acc." + name});
  }
  auto whole = b.finish();
  REQUIRE(whole);
  whole->outputs = {{"loss", graphs->grad->find_output("loss")}};
  auto cut = segment_by_updates(*whole, groups, "seg.");
  REQUIRE(cut);
  REQUIRE(cut->segments.size() == grads.size());
  CHECK(!cut->saved.empty());
  auto in = take_rows(s.data, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15});
  REQUIRE(in);
  tensor_map params = s.params;
  for (const auto& name : grads) params["acc." + name] = tensor::zeros(dtype::f32, dims[static_cast<size_t>(&name - grads.data())]);
  auto expected_run = evaluate(*whole, *in, params);
  REQUIRE(expected_run);
  tensor_map state = params;
  for (auto& [name, t] : cut->saved) state[name] = t;
  double loss = 0;
  for (size_t k = 0; k < cut->segments.size(); ++k) {
    REQUIRE(validate(cut->segments[k]));
    tensor_map reads;
    for (const auto& name : cut->inputs[k]) reads[name] = in->at(name);
    auto run = evaluate(cut->segments[k], reads, state);
    INFO("segment " << k << ": " << (run ? std::string() : run.error().message));
    REQUIRE(run);
    if (k == 0) loss = run->outputs.at("loss").at(0);
    state = run->params;
  }
  CHECK(loss == expected_run->outputs.at("loss").at(0));
  for (const auto& name : grads) CHECK(state.at("acc." + name).bytes == expected_run->params.at("acc." + name).bytes);
}

TEST_CASE("a segment makes an earlier segment's views again instead of reading saved copies of them", "[actors][train][buckets]") {
  // Segment 0 computes h = x w^T (w's transpose a view of a parameter), the bias broadcast to h's
  // shape (a view of a parameter) and r = reshape(h + bias); segment 1 reads r, w's transpose and
  // the broadcast bias again. It reads h + bias back where segment 0 saved it and makes the
  // views itself: no view is saved, and the cut equals the whole program.
  builder b;
  const expr x = b.input("x", dtype::f32, {4, 3});
  const expr w = b.parameter("w", dtype::f32, {5, 3});
  const expr wt = transpose(w);
  const expr bias = broadcast_to(b.parameter("bias", dtype::f32, {5}), {4, 5});
  const expr hb = matmul(x, wt) + bias;
  const expr r = reshape(hb, {20});
  b.update(b.parameter("acc.a", dtype::f32, {20}), r * 1.5);
  b.update(b.parameter("acc.c", dtype::f32, {20}), r + reshape(bias, {20}) + reshape(matmul(x * 2.0, wt), {20}));
  auto whole = b.finish();
  REQUIRE(whole);
  auto cut = segment_by_updates(*whole, {{"acc.a"}, {"acc.c"}}, "seg.");
  REQUIRE(cut);
  REQUIRE(cut->segments.size() == 2);
  CHECK(cut->saved.size() == 1);  // h + bias
  for (const auto& [name, t] : cut->saved) {
    const auto id = static_cast<node_index>(std::stoll(name.substr(std::string("seg.x.").size())));
    CHECK((*whole)[id].op == op_kind::add);
    CHECK(t.dims == shape{4, 5});
  }
  int views = 0;
  for (const auto& n : cut->segments[1].nodes)
    views += n.op == op_kind::reshape || n.op == op_kind::permute || n.op == op_kind::broadcast;
  CHECK(views >= 4);  // r's reshape, the bias's broadcast and reshape, w's transpose
  const tensor_map in{{"x", tensor::from_floats({4, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})}};
  tensor_map params{{"w", tensor::from_floats({5, 3}, {1, -1, 2, 0.5, 3, -2, 1, 1, 1, 0, 2, -1, 4, 0.25, -3})},
                    {"bias", tensor::from_floats({5}, {0.5, -1, 2, 0, 1})},
                    {"acc.a", tensor::zeros(dtype::f32, {20})},
                    {"acc.c", tensor::zeros(dtype::f32, {20})}};
  auto want = evaluate(*whole, in, params);
  REQUIRE(want);
  tensor_map state = params;
  for (auto& [name, t] : cut->saved) state[name] = t;
  for (size_t k = 0; k < 2; ++k) {
    REQUIRE(validate(cut->segments[k]));
    tensor_map reads;
    for (const auto& name : cut->inputs[k]) reads[name] = in.at(name);
    auto run = evaluate(cut->segments[k], reads, state);
    REQUIRE(run);
    state = run->params;
  }
  CHECK(state.at("acc.a").bytes == want->params.at("acc.a").bytes);
  CHECK(state.at("acc.c").bytes == want->params.at("acc.c").bytes);
}

TEST_CASE("data-parallel training on 3 nodes with AdamW or SGD with momentum equals the single-node reference",
          "[actors][train]") {
  const auto s = two_moons_mlp();
  struct optimizer_case {
    const char* name;
    std::variant<optim::adam_options, optim::sgd_options> with, without;  ///< with and without the feature
    const char* state;  ///< optimizer state the feature keeps ("" if none)
  };
  const optimizer_case cases[] = {
      {"AdamW", optim::adam_options{.lr = 0.02, .weight_decay = 0.01}, optim::adam_options{.lr = 0.02}, "opt.adam.m.mlp.0.w"},
      {"SGD with momentum", optim::sgd_options{.lr = 0.1, .momentum = 0.9}, optim::sgd_options{.lr = 0.1}, "opt.sgd.v.mlp.0.w"},
  };
  for (const auto& oc : cases) {
    INFO(oc.name);
    auto o = dp_options();
    o.optimizer = oc.with;
    const auto spec = spec_for(s, o);
    train_sim one(1), three(3);
    const auto reference = one.train(spec);
    const auto r = three.train(spec);
    INFO(r.error);
    REQUIRE(reference.ok);
    REQUIRE(r.ok);
    CHECK(r.workers.size() == 3);
    CHECK(reached_step(r) == 24);
    const auto state = outputs_of(r);
    CHECK(max_difference(state, outputs_of(reference)) < 1e-4);
    // The optimizer's state travelled with the run and was updated by it.
    REQUIRE(state.count(oc.state));
    const auto v = state.at(oc.state).to_doubles();
    CHECK(std::any_of(v.begin(), v.end(), [](double x) { return x != 0; }));
    // Weight decay / momentum changed the result by far more than the tolerance above: the
    // comparison checks that the feature ran the same on 3 nodes, not that it did nothing.
    auto plain = o;
    plain.optimizer = oc.without;
    train_sim other(3);
    const auto without = other.train(spec_for(s, plain));
    REQUIRE(without.ok);
    const double effect = max_difference(parameters_only(state), parameters_only(outputs_of(without)));
    INFO("largest relative change the feature made: " << effect);
    CHECK(effect > 1e-3);
    CHECK(full_loss(s, parameters_only(state)) < full_loss(s, s.params) * 0.8);
  }
}

TEST_CASE("messages in any order give the same result", "[actors][train]") {
  const auto s = two_moons_mlp();
  const auto spec = spec_for(s, dp_options(10));
  train_sim ordered(3), shuffled(3);
  shuffled.net.set_shuffle(true);
  const auto a = ordered.train(spec), b = shuffled.train(spec);
  REQUIRE(a.ok);
  REQUIRE(b.ok);
  // The same members sum in the same ring order: bit-identical, not just close.
  CHECK(outputs_of(a) == outputs_of(b));
}

TEST_CASE("a node dying mid-run: the run completes, no step lost or applied twice", "[actors][train]") {
  const auto s = two_moons_mlp();
  const auto spec = spec_for(s, dp_options());
  train_sim one(1);
  const auto reference = one.train(spec);
  train_sim sim(3);
  sim.net.set_shuffle(true);
  sim.on_tick = [](train_sim& t) {
    if (!t.dead.count("node-c") && t.progress.size() == 7) t.kill("node-c");
  };
  const auto r = sim.train(spec);
  INFO(r.error);
  REQUIRE(r.ok);
  const auto state = outputs_of(r);
  CHECK(state.at("opt.adam.t").at(0) == 24.0);
  // The dead node's micro-batches went to the survivors: the same data per step as the reference.
  CHECK(max_difference(state, outputs_of(reference)) < 1e-4);
  REQUIRE(sim.progress.size() == 24);
  for (size_t i = 0; i < sim.progress.size(); ++i) CHECK(sim.progress[i].step == i + 1);
  CHECK(sim.progress.back().peers == 2);
}

TEST_CASE("the coordinator dying mid-run: a survivor takes over on the client's train_resume", "[actors][train]") {
  const auto s = two_moons_mlp();
  for (const bool diloco : {false, true}) {
    INFO((diloco ? "DiLoCo" : "data parallel"));
    const auto o = diloco ? diloco_options(30) : dp_options(24);
    const auto spec = spec_for(s, o);
    // The reference: data parallel equals one node; DiLoCo (whose result depends on the number
    // of workers) is compared with the same run where another node dies at the same point.
    train_sim one(diloco ? 3 : 1);
    if (diloco)
      one.on_tick = [](train_sim& t) {
        if (!t.dead.count("node-c") && t.progress.size() == 2) t.kill("node-c");
      };
    const auto reference = one.train(spec);
    REQUIRE(reference.ok);
    train_sim sim(3);
    sim.net.set_shuffle(true);
    // node-a coordinates (the client opened the run there); it dies after a few steps, and the
    // client, having lost its connection, asks node-c to take over.
    sim.on_tick = [&](train_sim& t) {
      if (!t.dead.count("node-a") && t.progress.size() == (diloco ? 2u : 7u)) {
        t.kill("node-a");
        t.send("client", {{"node-c", resume(1, "node-a", "node-c", spec.dataset)}});
      }
    };
    const auto r = sim.train(spec);
    INFO(r.error);
    REQUIRE(r.ok);
    const auto state = outputs_of(r);
    // Every step applied exactly once (DiLoCo: every inner step of every outer step).
    CHECK(state.at("opt.adam.t").at(0) == (diloco ? 30.0 : 24.0));
    CHECK(reached_step(r) == (diloco ? 30u : 24u));
    if (!diloco) {
      CHECK(max_difference(state, outputs_of(reference)) < 1e-4);
    } else {
      // After a takeover every worker starts from the new coordinator's state, inner optimizer
      // moments included (as a node joining mid-run does), so the runs differ a little.
      const double loss = full_loss(s, parameters_only(state)), ref = full_loss(s, parameters_only(outputs_of(reference)));
      INFO("loss after the takeover " << loss << ", without " << ref);
      CHECK(loss <= ref * 1.10 + 0.02);
    }
    CHECK(sim.progress.back().step == (diloco ? 30u : 24u));
    CHECK(sim.progress.back().peers == 2);
    CHECK(std::find(r.workers.begin(), r.workers.end(), test::named("node-a")) == r.workers.end());
  }
}

TEST_CASE("a client cut off from a live coordinator resumes elsewhere and the old run stops", "[actors][train]") {
  const auto s = two_moons_mlp();
  const auto spec = spec_for(s, dp_options());
  train_sim one(1);
  const auto reference = one.train(spec);
  train_sim sim(3);
  sim.net.set_shuffle(true);
  bool cut = false;
  sim.on_tick = [&](train_sim& t) {
    if (!cut && t.progress.size() == 6) {
      cut = true;
      // node-a still runs, but its connection to the client is gone: the client thinks it dead
      // and asks node-b, whose worker run of node-a's run is still live.
      t.post("node-a", t.nodes.at("node-a").engine->peer_dead(client_id(), t.now));
      t.send("client", {{"node-b", resume(1, "node-a", "node-b", spec.dataset)}});
    }
  };
  sim.send("client", {{"node-a", msg::open_training{1, spec}}});
  sim.run();
  REQUIRE(sim.results.size() == 1);  // node-a's run stopped when node-b's setup reached it
  const auto& r = sim.results[0];
  INFO(r.error);
  REQUIRE(r.ok);
  CHECK(outputs_of(r).at("opt.adam.t").at(0) == 24.0);
  CHECK(max_difference(outputs_of(r), outputs_of(reference)) < 1e-4);
  CHECK(r.workers.size() == 3);  // node-a works in node-b's run
  bool a_stopped = false;
  for (const auto& j : sim.nodes.at("node-a").engine->jobs(sim.now)) a_stopped = a_stopped || j.state == job_state::moved;
  CHECK(a_stopped);
}

TEST_CASE("a run whose client is gone ends after the grace time", "[actors][train]") {
  const auto s = two_moons_mlp();
  const auto spec = spec_for(s, dp_options(2000));
  train_sim sim(2);
  bool lost = false;
  sim.on_tick = [&](train_sim& t) {
    if (!lost && t.progress.size() == 3) {
      lost = true;
      auto& a = *t.nodes.at("node-a").engine;
      t.post("node-a", a.peer_dead(client_id(), t.now));
      CHECK(a.tick(t.now + std::chrono::seconds(1)).empty());  // still within the grace time: training goes on
      t.post("node-a", a.tick(t.now + train_engine::client_grace + std::chrono::seconds(1)));
    }
  };
  sim.send("client", {{"node-a", msg::open_training{1, spec}}});
  sim.run();
  CHECK(sim.results.empty());  // nobody to tell
  CHECK(sim.progress.size() < 2000);
  REQUIRE(sim.nodes.at("node-a").engine->jobs(sim.now).size() == 1);
  CHECK(sim.nodes.at("node-a").engine->jobs(sim.now)[0].state == job_state::failed);
  CHECK(sim.nodes.at("node-b").engine->running() == 0);  // told to stop
}

TEST_CASE("train_resume to a node without the run, or from another client, is refused", "[actors][train]") {
  const auto s = two_moons_mlp();
  const auto spec = spec_for(s, dp_options(12));
  train_sim sim(3);
  bool asked = false;
  sim.on_tick = [&](train_sim& t) {
    if (!asked && t.progress.size() == 3) {
      asked = true;
      // Not the client that opened the run: refused, and the run goes on.
      t.post("node-c", {{"node-b", resume(1, "node-a", "node-b", spec.dataset)}});
      // A run that never existed.
      t.send("client", {{"node-b", resume(7, "node-a", "node-b", spec.dataset)}});
    }
  };
  sim.send("client", {{"node-a", msg::open_training{1, spec}}});
  sim.run();
  REQUIRE(sim.results.size() == 2);
  const auto& refused = sim.results[0].job == 7 ? sim.results[0] : sim.results[1];
  const auto& r = sim.results[0].job == 1 ? sim.results[0] : sim.results[1];
  CHECK_FALSE(refused.ok);
  CHECK_THAT(refused.error, Catch::Contains("holds no state of training 7"));
  REQUIRE(r.ok);
  CHECK(outputs_of(r).at("opt.adam.t").at(0) == 12.0);
  train_sim lone(1);
  lone.send("client", {{"node-a", resume(3, "node-x", "node-a", spec.dataset)}});
  lone.run();
  REQUIRE(lone.results.size() == 1);
  CHECK_FALSE(lone.results[0].ok);
  CHECK_THAT(lone.results[0].error, Catch::Contains("holds no state of training 3"));
}

TEST_CASE("the dataset is sharded: each worker gets only its shards, a dead worker's move to the survivors", "[actors][train]") {
  const auto s = two_moons_mlp();  // 200 rows, 6 micro-batches of 16 per step: 6 shards of 33-34 rows
  const auto spec = spec_for(s, dp_options());
  for (const auto& column : spec.dataset) INFO(column.name);
  train_sim sim(3);
  std::map<std::string, std::vector<uint32_t>> before_death;
  sim.on_tick = [&](train_sim& t) {
    if (!t.dead.count("node-c") && t.progress.size() == 7) {
      before_death = t.shards_received;
      t.kill("node-c");
    }
  };
  const auto r = sim.train(spec);
  REQUIRE(r.ok);
  // Before the death: 2 shards each, disjoint, together the whole dataset.
  REQUIRE(before_death.size() == 3);
  std::set<uint32_t> all;
  for (const auto& [node, shards] : before_death) {
    CHECK(shards.size() == 2);
    all.insert(shards.begin(), shards.end());
  }
  CHECK(all.size() == 6);
  // After it: each survivor got more shards (node-c's slots), none twice.
  for (const std::string node : {"node-a", "node-b"}) {
    const auto& got = sim.shards_received.at(node);
    CHECK(got.size() == 3);
    CHECK(std::set<uint32_t>(got.begin(), got.end()).size() == got.size());
    CHECK(sim.rows_received.at(node) < 200);
  }
  CHECK(sim.rows_received.at("node-a") + sim.rows_received.at("node-b") == 200);  // 200 rows, each sent once
  // The data each step used is the same as on one node: the result equals the reference.
  train_sim one(1);
  CHECK(max_difference(outputs_of(r), outputs_of(one.train(spec))) < 1e-4);
}

TEST_CASE("a redone step finds the shards an earlier attempt carried", "[actors][train]") {
  const auto s = two_moons_mlp();
  auto o = dp_options();
  o.micro_batches = 8;  // 8 slots, 8 shards: a{0,4} b{1,5} c{2,6} d{3,7}
  const auto spec = spec_for(s, o);
  train_sim one(1);
  const auto reference = one.train(spec);
  train_sim sim(4);
  bool killed = false;
  sim.on_tick = [&](train_sim& t) {
    if (killed || t.progress.size() != 5) return;
    killed = true;
    // Attempt 2 gives c's slots (and shards 2, 6) to a and b; attempt 3 gives them d's, and
    // carries only the shards they have not been sent, so a's attempt 3 needs shard 2 from its
    // attempt 2 (which the transport delivers first: the coordinator sent it first).
    t.kill("node-c");
    t.kill("node-d");
  };
  const auto r = sim.train(spec);
  INFO(r.error);
  REQUIRE(r.ok);
  CHECK(outputs_of(r).at("opt.adam.t").at(0) == 24.0);
  CHECK(max_difference(outputs_of(r), outputs_of(reference)) < 1e-4);
  CHECK(sim.progress.back().peers == 2);
}

TEST_CASE("a node joining mid-run is used from the next step", "[actors][train]") {
  const auto s = two_moons_mlp();
  const auto spec = spec_for(s, dp_options());
  train_sim one(1);
  const auto reference = one.train(spec);
  train_sim sim(2);
  sim.on_tick = [](train_sim& t) {
    if (!t.nodes.count("node-c") && t.progress.size() == 5) t.add("node-c");
  };
  const auto r = sim.train(spec);
  INFO(r.error);
  REQUIRE(r.ok);
  CHECK(max_difference(outputs_of(r), outputs_of(reference)) < 1e-4);
  CHECK(sim.progress.front().peers == 2);
  CHECK(sim.progress.back().peers == 3);
  CHECK(outputs_of(r).at("opt.adam.t").at(0) == 24.0);
}

TEST_CASE("DiLoCo with 4-bit outer gradients: nodes join and leave between outer steps and the run goes on",
          "[actors][train]") {
  const auto s = two_moons_mlp();
  auto o = diloco_options(60);
  o.compression = wire_format::fp4;
  const auto spec = spec_for(s, o);
  train_sim sim(2);
  sim.on_tick = [](train_sim& t) {
    if (!t.nodes.count("node-c") && !t.dead.count("node-c") && t.progress.size() == 3) t.add("node-c");
    if (!t.dead.count("node-b") && t.progress.size() == 7) t.kill("node-b");
  };
  const auto r = sim.train(spec);
  INFO(r.error);
  REQUIRE(r.ok);
  CHECK(reached_step(r) == 60);
  REQUIRE(sim.progress.size() == 12);  // 60 inner steps in outer steps of 5
  std::vector<uint32_t> peers;
  for (const auto& p : sim.progress) peers.push_back(p.peers);
  CHECK(peers.front() == 2);
  CHECK(std::find(peers.begin(), peers.end(), 3u) != peers.end());  // node-c took part once it joined
  CHECK(peers.back() == 2);                                          // and node-b's leaving was survived
  CHECK(full_loss(s, parameters_only(outputs_of(r))) < full_loss(s, s.params) * 0.8);
}

TEST_CASE("streaming DiLoCo: fragments synchronised in turn, each all-reduce a fragment's share of the bytes",
          "[actors][train]") {
  const auto s = two_moons_mlp();
  auto whole = diloco_options(60);
  whole.inner_steps = 10;
  auto streaming = whole;
  streaming.fragments = 2;  // the MLP's 4 parameters in 2 fragments; one synchronised every 5 steps
  train_sim a(3), b(3);
  const auto r1 = a.train(spec_for(s, whole));
  const auto r2 = b.train(spec_for(s, streaming));
  INFO(r1.error << r2.error);
  REQUIRE(r1.ok);
  REQUIRE(r2.ok);
  CHECK(reached_step(r2) == 60);
  REQUIRE(a.progress.size() == 6);
  REQUIRE(b.progress.size() == 12);  // a fragment's turn every 5 inner steps
  uint64_t bytes1 = 0, bytes2 = 0, largest2 = 0;
  for (const auto& p : a.progress) bytes1 += p.bytes_sent;
  for (const auto& p : b.progress) {
    bytes2 += p.bytes_sent;
    largest2 = std::max(largest2, p.bytes_sent);
  }
  const uint64_t step1 = a.progress.back().bytes_sent;
  WARN("DiLoCo H=10: " << bytes1 << " bytes in all, " << step1 << " per averaging; streaming, 2 fragments: " << bytes2
                       << " in all, at most " << largest2 << " per averaging");
  CHECK(largest2 < step1 * 0.8);              // each all-reduce carries a fragment, not everything
  CHECK(bytes2 < bytes1 * 1.25);              // and in all about as much (each fragment every H steps)
  const double l1 = full_loss(s, parameters_only(outputs_of(r1))), l2 = full_loss(s, parameters_only(outputs_of(r2)));
  WARN("full-dataset loss: DiLoCo " << l1 << ", streaming " << l2 << " (start " << full_loss(s, s.params) << ")");
  CHECK(l2 < full_loss(s, s.params) * 0.8);
  CHECK(l2 < l1 * 1.5);  // measured: 0.224 against 0.185 (each fragment waits for its turn)
  // The fragments change in turn: a run redone from the same spec is the same run.
  train_sim c(3);
  const auto r3 = c.train(spec_for(s, streaming));
  REQUIRE(r3.ok);
  CHECK(outputs_of(r3) == outputs_of(r2));
  // More fragments than parameters: refused, naming the bound.
  streaming.fragments = 9;
  train_sim d(1);
  const auto bad = d.train(spec_for(s, streaming));
  CHECK(!bad.ok);
  CHECK(bad.error.find("fragments must be in 1..4") != std::string::npos);
}

TEST_CASE("DiLoCo with overlap: the delta is taken before the round's last inner steps, which the outer step mixes in",
          "[actors][train][overlap]") {
  const auto s = two_moons_mlp();
  // Outer learning rate 1 and no momentum: the new outer parameters are the local ones the delta
  // was taken from, so the result follows from plain runs of 2 and 4 inner steps.
  auto base = diloco_options(4);
  base.inner_steps = 4;
  base.outer_lr = 1;
  base.outer_momentum = 0;
  auto overlapped = base;
  overlapped.overlap_steps = 2;
  overlapped.overlap_mix = 0.25;
  auto half = base;
  half.steps = 2;
  half.inner_steps = 2;
  train_sim a(1), b(1), c(1);
  const auto r_overlap = a.train(spec_for(s, overlapped)), r_four = b.train(spec_for(s, base)), r_two = c.train(spec_for(s, half));
  INFO(r_overlap.error << r_four.error << r_two.error);
  REQUIRE(r_overlap.ok);
  REQUIRE(r_four.ok);
  REQUIRE(r_two.ok);
  const auto o = outputs_of(r_overlap), four = outputs_of(r_four), two = outputs_of(r_two);
  double worst_outer = 0, worst_local = 0;
  for (const auto& [name, t] : s.params) {
    const auto outer = o.at("outer." + name).to_doubles(), local = o.at(name).to_doubles();
    const auto after2 = two.at(name).to_doubles(), after4 = four.at(name).to_doubles();
    for (size_t i = 0; i < outer.size(); ++i) {
      worst_outer = std::max(worst_outer, std::abs(outer[i] - after2[i]));                                   // the delta: 2 steps in
      worst_local = std::max(worst_local, std::abs(local[i] - (0.25 * after4[i] + 0.75 * after2[i])));  // mixed with 4 steps in
    }
  }
  CHECK(worst_outer < 1e-6);
  CHECK(worst_local < 1e-6);
  // The round's loss is over the 2 inner steps before the delta: the 2-step run's.
  REQUIRE(a.progress.size() == 1);
  REQUIRE(c.progress.size() == 1);
  CHECK(a.progress[0].loss == Approx(c.progress[0].loss).epsilon(1e-6));
}

TEST_CASE("streaming DiLoCo with overlap on 3 nodes: the same bytes, the loss falls, a death mid-run is survived",
          "[actors][train][overlap]") {
  const auto s = two_moons_mlp();
  auto plain = diloco_options(60);
  plain.inner_steps = 10;
  plain.fragments = 2;
  auto overlapped = plain;
  overlapped.overlap_steps = 2;  // of each round's 5 inner steps
  train_sim a(3), b(3);
  const auto r1 = a.train(spec_for(s, plain)), r2 = b.train(spec_for(s, overlapped));
  INFO(r1.error << r2.error);
  REQUIRE(r1.ok);
  REQUIRE(r2.ok);
  CHECK(reached_step(r2) == 60);
  REQUIRE(b.progress.size() == a.progress.size());
  uint64_t bytes1 = 0, bytes2 = 0;
  for (const auto& p : a.progress) bytes1 += p.bytes_sent;
  for (const auto& p : b.progress) bytes2 += p.bytes_sent;
  CHECK(bytes2 == bytes1);
  const double start = full_loss(s, s.params), l1 = full_loss(s, parameters_only(outputs_of(r1))),
               l2 = full_loss(s, parameters_only(outputs_of(r2)));
  WARN("streaming DiLoCo, 2 fragments: loss " << start << " -> " << l1 << " without overlap, " << l2 << " with 2 of 5 steps overlapped");
  CHECK(l2 < start * 0.8);
  CHECK(l2 < l1 * 1.5);
  // A member dies mid-run: its round is redone on the survivors (from the local state each round
  // started from) and the run finishes.
  train_sim c(3);
  c.on_tick = [](train_sim& sim) {
    if (!sim.progress.empty() && sim.progress.size() == 5 && !sim.dead.count("node-c")) sim.kill("node-c");
  };
  const auto r3 = c.train(spec_for(s, overlapped));
  INFO(r3.error);
  REQUIRE(r3.ok);
  CHECK(reached_step(r3) == 60);
  CHECK(full_loss(s, parameters_only(outputs_of(r3))) < start * 0.8);
  // More overlapped steps than a round has: refused.
  overlapped.overlap_steps = 5;
  CHECK_FALSE(make_train_spec(s.model, s.params, s.data, s.micro_batch, overlapped));
}

TEST_CASE("DiLoCo reaches a loss close to data parallel with far fewer bytes", "[actors][train]") {
  const auto s = two_moons_mlp();
  const auto dp = dp_options(60), dl = diloco_options(60);
  train_sim a(3), b(3);
  const auto rdp = a.train(spec_for(s, dp));
  const auto rdl = b.train(spec_for(s, dl));
  INFO(rdl.error);
  REQUIRE(rdp.ok);
  REQUIRE(rdl.ok);
  const double loss_dp = full_loss(s, parameters_only(outputs_of(rdp)));
  const double loss_dl = full_loss(s, parameters_only(outputs_of(rdl)));
  uint64_t bytes_dp = 0, bytes_dl = 0;
  for (const auto& p : a.progress) bytes_dp += p.bytes_sent;
  for (const auto& p : b.progress) bytes_dl += p.bytes_sent;
  INFO("data parallel loss " << loss_dp << " (" << bytes_dp << " B), DiLoCo " << loss_dl << " (" << bytes_dl << " B)");
  CHECK(b.progress.size() == 12);  // one report per outer step
  CHECK(loss_dl < full_loss(s, s.params) * 0.8);
  CHECK(loss_dl <= loss_dp * 1.05);  // within 5% of data parallel (lower is fine)
  CHECK(bytes_dl * 4 < bytes_dp);
}

TEST_CASE("DiLoCo with int8 and fp4 outer gradients reaches data parallel's loss with a fraction of its bytes", "[actors][train]") {
  // The outer gradients (outer copy - local parameters) go around the ring in blocks of 32 with
  // one f32 scale each: int8 and fp4 (E3M0). This model's 84 floats make pieces of 7 values, so
  // the scales weigh more than on a real model (int8 2.5x fewer bytes than f32 here, 3.6x on
  // whole blocks; fp4 3.5x here, 6.4x on whole blocks).
  const auto s = two_moons_mlp();
  train_sim dp_sim(3), base(3);
  const auto rdp = dp_sim.train(spec_for(s, dp_options(60)));
  auto o = diloco_options(60);
  const auto r32 = base.train(spec_for(s, o));
  REQUIRE(rdp.ok);
  REQUIRE(r32.ok);
  const double loss_dp = full_loss(s, parameters_only(outputs_of(rdp))), loss32 = full_loss(s, parameters_only(outputs_of(r32)));
  uint64_t bytes_dp = 0, bytes32 = 0;
  for (const auto& p : dp_sim.progress) bytes_dp += p.bytes_sent;
  for (const auto& p : base.progress) bytes32 += p.bytes_sent;
  for (const auto& [format, max_bytes_ratio] : {std::pair{wire_format::int8, 0.45}, std::pair{wire_format::fp4, 0.33}}) {
    o.compression = format;
    train_sim sim(3);
    const auto r = sim.train(spec_for(s, o));
    INFO(to_string(format) << ": " << r.error);
    REQUIRE(r.ok);
    const double loss = full_loss(s, parameters_only(outputs_of(r)));
    uint64_t bytes = 0;
    for (const auto& p : sim.progress) bytes += p.bytes_sent;
    WARN("60 steps on 3 nodes: DiLoCo " << to_string(format) << " loss " << loss << " with " << bytes << " all-reduce bytes; DiLoCo f32 "
                                       << loss32 << " with " << bytes32 << "; data parallel " << loss_dp << " with " << bytes_dp << " ("
                                       << static_cast<double>(bytes_dp) / static_cast<double>(bytes) << "x the bytes)");
    CHECK(loss <= loss_dp * 1.02);  // the issue's bar: data parallel's loss within 2%
    if (format == wire_format::int8) CHECK(loss <= loss32 * 1.05);
    CHECK(static_cast<double>(bytes) <= static_cast<double>(bytes32) * max_bytes_ratio);
  }
}

namespace {

/// Where a run first reaches a full-dataset loss: its step, that loss, and the all-reduce bytes
/// all workers sent up to there.
struct reached {
  uint64_t step = 0;
  double loss = 0;
  uint64_t bytes = 0;
};

/// The first multiple of `every` steps (at most `max_steps`) after which a run with options `o`
/// on 3 nodes has a full-dataset loss <= `target`; step 0 if it never does. Each candidate is a
/// run of its own: a run of N steps is exactly the first N steps of a longer one (the data order
/// depends only on the seed and the step, and with N a multiple of DiLoCo's H the run ends on an
/// outer step), so nothing has to be read from the devices mid-run.
reached first_reaching(const model_setup& s, train_options o, double target, uint64_t every, uint64_t max_steps) {
  for (uint64_t n = every; n <= max_steps; n += every) {
    o.steps = n;
    train_sim sim(3);
    const auto r = sim.train(spec_for(s, o));
    REQUIRE(r.ok);
    reached out{n, full_loss(s, parameters_only(outputs_of(r))), 0};
    for (const auto& p : sim.progress) out.bytes += p.bytes_sent;
    if (out.loss <= target) return out;
  }
  return {};
}

}  // namespace

TEST_CASE("DiLoCo reaches the loss of data parallel with fewer all-reduce bytes", "[actors][train]") {
  const auto s = two_moons_mlp();
  const auto dp = dp_options(), dl = diloco_options(24);
  // 0.20 lies where data parallel's loss still falls steadily (it sits near 0.25 from step 25
  // to 55), so the step that first reaches it does not hinge on a plateau. Both runs are looked
  // at every 5 steps (DiLoCo's outer steps); its loss is not monotone (0.27 after 25 steps, 0.31
  // after 30), hence "first".
  const double target = 0.20;
  const auto rdp = first_reaching(s, dp, target, 5, 150);
  const auto rdl = first_reaching(s, dl, target, 5, 150);
  WARN("full-dataset loss <= " << target << ": data parallel after " << rdp.step << " steps (loss " << rdp.loss << ", "
                               << rdp.bytes << " all-reduce bytes), DiLoCo (H = 5) after " << rdl.step << " steps (loss "
                               << rdl.loss << ", " << rdl.bytes << " bytes): "
                               << (rdl.bytes ? static_cast<double>(rdp.bytes) / static_cast<double>(rdl.bytes) : 0.0)
                               << "x fewer bytes");
  REQUIRE(rdp.step > 0);
  REQUIRE(rdl.step > 0);
  // Under a quarter: averaging once per 5 steps saves 5x per step, and DiLoCo must not need
  // more steps than data parallel to get there.
  CHECK(rdl.bytes * 4 < rdp.bytes);
}

TEST_CASE("a DiLoCo step redone after a death is not applied twice", "[actors][train]") {
  const auto s = two_moons_mlp();
  const auto spec = spec_for(s, diloco_options(30));
  train_sim sim(3);
  sim.net.set_shuffle(true);
  sim.on_tick = [](train_sim& t) {
    if (!t.dead.count("node-b") && t.progress.size() == 2) t.kill("node-b");
  };
  const auto r = sim.train(spec);
  INFO(r.error);
  REQUIRE(r.ok);
  // Each survivor ran every inner step once per outer step (a redone step restarts from the
  // snapshot): the inner Adam counter is 30.
  CHECK(outputs_of(r).at("opt.adam.t").at(0) == 30.0);
  REQUIRE(sim.progress.size() == 6);
  CHECK(sim.progress.back().step == 30);
}

TEST_CASE("checkpoints every K steps: a run resumed from one ends where the straight run ends", "[actors][train]") {
  // Data parallel (24 steps) and DiLoCo (outer steps of 5 inner steps: a checkpoint when a step
  // crosses a multiple of 10), 3 nodes. The client gets the state at each multiple of 10 below
  // the last step (the last step's state is the result); a run started from the checkpoint at
  // step 10 with start_step = 10 ends with the straight run's state.
  const auto s = two_moons_mlp();
  for (const bool diloco : {false, true}) {
    INFO((diloco ? "DiLoCo" : "data parallel"));
    const auto o = diloco ? diloco_options(30) : dp_options(24);
    auto spec = spec_for(s, o);
    spec.checkpoint_every = 10;
    train_sim straight(3);
    const auto r = straight.train(spec);
    INFO(r.error);
    REQUIRE(r.ok);
    REQUIRE(straight.checkpoints.size() == 2);
    CHECK(straight.checkpoints[0].step == 10);
    CHECK(straight.checkpoints[1].step == 20);
    tensor_map at10;
    for (const auto& t : straight.checkpoints[0].state) at10[t.name] = t.value;
    CHECK(at10.size() == outputs_of(r).size());  // the whole state, as the result names it
    if (!diloco) CHECK(at10.at("opt.adam.t").at(0) == 10.0);

    auto resumed_spec = spec;
    resumed_spec.start_step = 10;
    resumed_spec.state.clear();
    for (const auto& [name, t] : at10) resumed_spec.state.push_back({name, t});
    train_sim resumed(3);
    const auto r2 = resumed.train(resumed_spec);
    INFO(r2.error);
    REQUIRE(r2.ok);
    CHECK(r2.step == r.step);
    CHECK(resumed.checkpoints.size() == 1);  // step 20 only
    if (!diloco) {
      CHECK(max_difference(outputs_of(r2), outputs_of(r)) < 1e-5);
    } else {
      // Each DiLoCo worker keeps its own inner optimizer moments, and a state (checkpoint or
      // result) holds the coordinator's: the resumed workers all start from those, so the run
      // continues from the same parameters and outer state but not bit for bit.
      const double straight_loss = full_loss(s, parameters_only(outputs_of(r)));
      const double resumed_loss = full_loss(s, parameters_only(outputs_of(r2)));
      INFO("full-dataset loss: straight " << straight_loss << ", resumed " << resumed_loss);
      CHECK(std::abs(resumed_loss - straight_loss) < 0.05 * straight_loss);
    }
  }
}

TEST_CASE("bad training specs are refused with a reason", "[actors][train]") {
  const auto s = two_moons_mlp();
  auto spec = spec_for(s, dp_options());
  const auto refused = [&](msg::train_spec bad) {
    train_sim sim(2);
    const auto r = sim.train(bad);
    CHECK_FALSE(r.ok);
    return r.error;
  };
  auto bad = spec;
  bad.dataset.clear();
  CHECK_THAT(refused(bad), Catch::Contains("no column"));
  bad = spec;
  {
    auto bytes = *encode(*spec.grad.value);  // truncated on its way: the decoder refuses it
    bad.grad = graph_payload::from_bytes(bytes.data(), bytes.size() / 2);
  }
  CHECK_THAT(refused(bad), Catch::Contains("gradient graph was rejected"));
  bad = spec;
  bad.state.pop_back();
  CHECK_THAT(refused(bad), Catch::Contains("no value for parameter"));
  bad = spec;
  bad.steps = 0;
  CHECK_THAT(refused(bad), Catch::Contains("nothing to train"));
  bad = spec;
  bad.micro_batch = 7;
  CHECK_THAT(refused(bad), Catch::Contains("micro_batch"));
}

TEST_CASE("the coordinator's device restarted before a report-state step: the run fails, it does not hang",
          "[actors][train]") {
  // The final step, and a checkpoint step, are reported by the coordinator's own worker (no
  // ring). A worker that has lost its state used to answer only ring steps.
  const auto s = two_moons_mlp();
  for (const bool final_step : {true, false}) {
    INFO((final_step ? "final step" : "checkpoint step"));
    auto o = dp_options(final_step ? 3 : 6);
    if (!final_step) o.checkpoint_every = 2;
    train_sim sim(2);
    bool restarted = false;
    sim.on_tick = [&](train_sim& t) {
      if (restarted) return;
      t.net.for_each([&](const std::string&, const std::string& to, const outbound& out) {
        if (auto* st = std::get_if<msg::train_step>(&out.m); !restarted && st && st->report_state && to == "node-a") {
          restarted = true;
          t.nodes.at("node-a").engine->executor_restarted();
        }
      });
    };
    sim.send("client", {{"node-a", msg::open_training{1, spec_for(s, o)}}});
    sim.run();
    REQUIRE(restarted);
    REQUIRE(sim.results.size() == 1);
    CHECK_FALSE(sim.results[0].ok);
    CHECK(sim.results[0].error.find("could not report the training state") != std::string::npos);
  }
}

TEST_CASE("a coordinator that loses its client keeps training through the grace time", "[actors][train]") {
  const auto s = two_moons_mlp();
  train_sim sim(2);
  bool lost = false;
  sim.on_tick = [&](train_sim& t) {
    if (!lost && t.progress.size() == 3) {
      lost = true;
      for (auto& [id, nd] : t.nodes) t.post(id, nd.engine->peer_dead(client_id(), t.now));
    }
  };
  sim.send("client", {{"node-a", msg::open_training{1, spec_for(s, dp_options(20))}}});
  sim.run();
  REQUIRE(lost);
  // The client may only be cut off from this node: the run goes on to its end (before the fix
  // the coordinator's own worker dropped the run and the ring stalled at step 3).
  CHECK(sim.progress.size() == 20);
  REQUIRE(sim.results.size() == 1);
  CHECK(sim.results[0].ok);
}

TEST_CASE("a worker that refuses the setup answers the run's steps, so the run goes on without it", "[actors][train]") {
  const auto s = two_moons_mlp();
  train_sim sim(2);
  graph_limits tight;
  tight.max_nodes = 4;  // the training graphs are larger: node-c refuses every setup
  train_sim::node strict{std::make_unique<train_engine>(test::named("node-c")), gpu::make_cpu_executor(1)};
  sim.limits["node-c"] = tight;  // applied where node-c decodes its messages
  for (auto& [other, o] : sim.nodes) {
    strict.engine->peer_up(test::named(other));
    o.engine->peer_up(test::named("node-c"));
  }
  sim.nodes.emplace("node-c", std::move(strict));
  sim.net.set_shuffle(true);
  const auto r = sim.train(spec_for(s, dp_options(6)));
  INFO(r.error);
  CHECK(r.ok);
  CHECK(sim.progress.size() == 6);
}

TEST_CASE("a finished run leaves no program or parameter on any worker's device", "[actors][train]") {
  // Every run loaded five programs and its state and accumulators on each worker, and nothing
  // freed them: a node's device memory grew with every training run.
  const auto s = two_moons_mlp();
  train_sim sim(3);
  const auto r = sim.train(spec_for(s, dp_options(4)));
  REQUIRE(r.ok);
  for (auto& [id, nd] : sim.nodes) {
    INFO(id);
    // The run's state was named "tr.<coordinator>.<run>.<name>" on every worker: gone now. (A
    // loaded program keeps its parameters, so this also says the programs were unloaded.)
    CHECK(nd.device->drop_parameters("tr.") == 0);
    CHECK(nd.device->drop_parameters("acc.") == 0);
  }
}

TEST_CASE("a setup from a coordinator that was taken over does not stop the run that took it over", "[actors][train]") {
  // node-a coordinated the run and only lost its client; the client resumed it on node-b
  // (generation 1). node-a, still running it for its grace time, may set node-c up again: that
  // setup must not end node-b's run on node-c, whatever order the two coordinators' messages
  // arrive in.
  const auto s = two_moons_mlp();
  const auto spec = setup_spec(spec_for(s, dp_options(4)));
  const node_id a = test::named("node-a"), b = test::named("node-b"), c = test::named("node-c"), client = client_id();
  for (const bool taken_over_first : {true, false}) {
    INFO("the takeover's setup arrives " << (taken_over_first ? "first" : "second"));
    train_engine w(c);
    w.peer_up(a);
    w.peer_up(b);
    const msg::train_setup stale{3, spec, client, 1, {}}, fresh{7, spec, client, 1, msg::sign_takeover(client_key().secret_key(), 1, 1, b)};
    (void)w.on_message(taken_over_first ? b : a, taken_over_first ? msg::message(fresh) : msg::message(stale), {});
    (void)w.on_message(taken_over_first ? a : b, taken_over_first ? msg::message(stale) : msg::message(fresh), {});
    CHECK(w.running() == 1);  // node-b's run only
    msg::train_step step;
    step.train = 3;
    step.attempt = 1;
    step.ring = {a, c};
    auto out = w.on_message(a, step, {});  // node-a's step is refused, so node-a goes on without node-c
    REQUIRE(out.size() == 1);
    const auto* r = std::get_if<msg::train_reduced>(&out[0].m);
    REQUIRE(r);
    CHECK_FALSE(r->ok);
    if (taken_over_first) CHECK_THAT(r->error, Catch::Contains("took this run over"));
    step.train = 7;
    step.ring = {b, c};
    out = w.on_message(b, step, {});
    for (const auto& o : out) CHECK_FALSE(std::holds_alternative<msg::train_reduced>(o.m));  // node-b's run takes the step
  }
}

TEST_CASE("a forged takeover setup from another member is refused and the honest run finishes", "[actors][train][security]") {
  // node-m, a member like any other, names the client's run in setups of its own at ever higher
  // generations. Before takeovers needed the client's grant, the first of them ended the run on
  // every worker and marked the coordinator's run moved: the client never got a result.
  const auto s = two_moons_mlp();
  const auto spec = spec_for(s, dp_options(12));
  train_sim one(1);
  const auto reference = one.train(spec);
  REQUIRE(reference.ok);
  train_sim sim(3);
  sim.net.set_shuffle(true);
  const node_id m = test::named("node-m");
  const auto forged = setup_spec(spec);
  std::array<uint8_t, 32> other_seed{};
  other_seed.fill(9);
  const auto other_key = transport::identity::from_seed(other_seed);
  const std::vector<msg::takeover_grant> grants = {
      {5, m, {}},                                                            // a made-up signature
      msg::sign_takeover(client_key().secret_key(), 1, 6, test::named("node-b")),  // the client's, for another node
      msg::sign_takeover(other_key.secret_key(), 1, 7, m),                   // signed by another key than the client's
      msg::sign_takeover(client_key().secret_key(), 2, 8, m),                // the client's, for another of its runs
  };
  bool sent = false;
  sim.on_tick = [&](train_sim& t) {
    if (sent || t.progress.size() != 3) return;
    sent = true;
    for (const char* to : {"node-a", "node-b", "node-c"}) {
      std::vector<train_sim::named_out> out;
      for (size_t i = 0; i < grants.size(); ++i) out.push_back({to, msg::train_setup{100 + i, forged, client_id(), 1, grants[i]}});
      // No grant at all: a run of node-m's own, which ends nothing.
      out.push_back({to, msg::train_setup{200, forged, client_id(), 1, {}}});
      t.send("node-m", std::move(out));
    }
  };
  const auto r = sim.train(spec);
  REQUIRE(sent);
  INFO(r.error);
  REQUIRE(r.ok);
  CHECK(outputs_of(r).at("opt.adam.t").at(0) == 12.0);
  CHECK(max_difference(outputs_of(r), outputs_of(reference)) < 1e-4);
  CHECK(r.workers.size() == 3);
  const auto jobs = sim.nodes.at("node-a").engine->jobs(sim.now);
  REQUIRE(jobs.size() == 1);
  CHECK(jobs[0].state == job_state::done);  // finished, not "moved" to node-m
  // Each forged grant refused and counted on every node, naming why.
  std::map<std::string, int> refused_setups;
  for (const auto& [node, why] : sim.refused) {
    CHECK(why.from == m);
    CHECK(why.kind == "train_setup");
    const bool named = why.why.find("not signed by the run's client") != std::string::npos || why.why.find("grant is for node") != std::string::npos;
    CHECK(named);
    ++refused_setups[node];
  }
  for (const char* node : {"node-a", "node-b", "node-c"}) CHECK(refused_setups[node] == 4);
  // The setup without a grant started node-m's own run there, and only that (beside the honest
  // run's stopped part, kept for the client's grace time).
  CHECK(sim.nodes.at("node-b").engine->running() == 2);
  CHECK(sim.nodes.at("node-c").engine->running() == 2);
  for (const char* node : {"node-b", "node-c"}) sim.nodes.at(node).engine->tick(sim.now + train_engine::client_grace + std::chrono::seconds(1));
  CHECK(sim.nodes.at("node-b").engine->running() == 1);
  CHECK(sim.nodes.at("node-c").engine->running() == 1);
}

TEST_CASE("a train_resume whose grant is not for this node, or was altered, is refused and the run goes on", "[actors][train][security]") {
  const auto s = two_moons_mlp();
  const auto spec = spec_for(s, dp_options(12));
  train_sim one(1);
  const auto reference = one.train(spec);
  train_sim sim(3);
  bool asked = false;
  sim.on_tick = [&](train_sim& t) {
    if (asked || t.progress.size() != 3) return;
    asked = true;
    auto altered = resume(1, "node-a", "node-b", spec.dataset);
    altered.takeover.generation = 4;  // raised after the client signed 1
    t.send("client", {{"node-b", resume(1, "node-a", "node-c", spec.dataset)}, {"node-b", altered}});
  };
  sim.send("client", {{"node-a", msg::open_training{1, spec}}});
  sim.run();
  REQUIRE(asked);
  REQUIRE(sim.results.size() == 3);
  int refusals = 0;
  for (const auto& r : sim.results) {
    if (r.ok) {
      CHECK(max_difference(outputs_of(r), outputs_of(reference)) < 1e-4);
      CHECK(r.workers.size() == 3);  // node-b stayed in node-a's run
      continue;
    }
    ++refusals;
    CHECK_THAT(r.error, Catch::Contains("train_resume refused"));
  }
  CHECK(refusals == 2);
  CHECK(sim.refused.size() == 2);
  for (const auto& [node, why] : sim.refused) CHECK((node == "node-b" && why.from == client_id() && why.kind == "train_resume"));
}

TEST_CASE("all-reduce pieces, step answers and states from outside the ring are refused and counted", "[actors][train][security]") {
  const auto s = two_moons_mlp();
  const auto spec = spec_for(s, dp_options(12));
  train_sim one(1);
  const auto reference = one.train(spec);
  train_sim sim(3);
  sim.net.set_shuffle(true);
  const auto refusals_of = [&](const std::string& kind) {
    return std::count_if(sim.refused.begin(), sim.refused.end(), [&](const auto& r) { return r.second.kind == kind; });
  };
  int forged = 0;
  // node-m copies what is in flight, poisoned, and sends it from itself to the same receiver:
  // a piece full of NaNs, a failure for a step a member computed, a ready for the step, and a
  // state for the coordinator's result; again until each kind was refused once (a copy that
  // arrives after its round or step is merely stale).
  sim.on_tick = [&](train_sim& t) {
    if (forged > 2000) return;
    std::vector<train_sim::named_out> out;
    t.net.for_each([&](const std::string& from, const std::string& to, const outbound& o) {
      if (from == "node-m" || to == "client") return;
      if (auto* p = std::get_if<msg::allreduce_piece>(&o.m); p && refusals_of("allreduce_piece") == 0) {
        auto bad = *p;
        std::fill(bad.payload.begin(), bad.payload.end(), uint8_t{0xff});
        out.push_back({to, bad});
      }
      if (auto* r = std::get_if<msg::train_reduced>(&o.m); r && r->ok && refusals_of("train_reduced") == 0) {
        auto bad = *r;
        bad.ok = false;
        bad.error = "forged";
        out.push_back({to, bad});
      }
      if (auto* r = std::get_if<msg::train_ready>(&o.m); r && refusals_of("train_ready") == 0) out.push_back({to, *r});
    });
    if (refusals_of("train_state") == 0 && t.progress.size() >= 2)
      out.push_back({"node-a", msg::train_state{1, t.progress.back().step, {{"opt.adam.t", tensor::scalar(1e9, dtype::f32)}}}});
    forged += static_cast<int>(out.size());
    t.send("node-m", std::move(out));
  };
  sim.send("client", {{"node-a", msg::open_training{1, spec}}});
  sim.run();
  REQUIRE(sim.results.size() == 1);
  const auto& r = sim.results[0];
  INFO(r.error);
  REQUIRE(r.ok);
  CHECK(outputs_of(r).at("opt.adam.t").at(0) == 12.0);
  CHECK(max_difference(outputs_of(r), outputs_of(reference)) < 1e-4);
  CHECK(r.workers.size() == 3);  // no member was dropped for a forged failure
  for (const char* kind : {"allreduce_piece", "train_reduced", "train_ready", "train_state"}) {
    INFO(kind);
    CHECK(refusals_of(kind) >= 1);
  }
  for (const auto& [node, why] : sim.refused) CHECK(why.from == test::named("node-m"));
}

TEST_CASE("a member that heartbeats but never computes its step is left out at the deadline and the run goes on", "[actors][train][security]") {
  const auto s = two_moons_mlp();
  const auto spec = spec_for(s, dp_options());
  train_sim one(1);
  const auto reference = one.train(spec);
  // Steps here take tens of simulated milliseconds: the measured deadline is the floor (10 s).
  train_sim sim(3);
  sim.net.set_shuffle(true);
  sim.idle_step = std::chrono::milliseconds(100);
  train_engine::clock::time_point hung_at{}, next_step_at{};
  sim.on_tick = [&](train_sim& t) {
    if (t.hung.empty() && t.progress.size() == 7) {
      t.hung.insert("node-c");  // connected (no peer_dead), silent
      hung_at = t.now;
    }
    if (next_step_at == train_engine::clock::time_point{} && t.progress.size() == 8) next_step_at = t.now;
  };
  const auto r = sim.train(spec);
  INFO(r.error);
  REQUIRE(r.ok);
  const auto state = outputs_of(r);
  CHECK(state.at("opt.adam.t").at(0) == 24.0);
  // node-c's micro-batches went to the others: the same data per step as the reference.
  CHECK(max_difference(state, outputs_of(reference)) < 1e-4);
  REQUIRE(sim.progress.size() == 24);
  for (size_t i = 0; i < sim.progress.size(); ++i) CHECK(sim.progress[i].step == i + 1);
  CHECK(sim.progress.back().peers == 2);
  // The step waited for the deadline (10 s, the floor) and not much longer.
  const double waited = std::chrono::duration<double>(next_step_at - hung_at).count();
  CHECK(waited >= 10.0);
  CHECK(waited < 11.0);
  // The coordinator said why: node-c left out, counted against it; and it was not set up again.
  int left_out = 0;
  for (const auto& [at, ref] : sim.refused)
    if (at == "node-a" && ref.kind == "train_step deadline" && ref.from == test::named("node-c")) ++left_out;
  CHECK(left_out == 1);
  CHECK(std::find(r.workers.begin(), r.workers.end(), test::named("node-c")) == r.workers.end());
}

TEST_CASE("a member silent from the first step is left out after the first-step deadline", "[actors][train][security]") {
  const auto s = two_moons_mlp();
  const auto spec = spec_for(s, dp_options(6));
  train_sim one(1);
  const auto reference = one.train(spec);
  step_deadlines d;
  d.first = std::chrono::seconds(60);
  train_sim sim(3, d);
  sim.idle_step = std::chrono::milliseconds(500);
  sim.hung.insert("node-b");
  const auto r = sim.train(spec);
  INFO(r.error);
  REQUIRE(r.ok);
  CHECK(max_difference(outputs_of(r), outputs_of(reference)) < 1e-4);
  REQUIRE(sim.progress.size() == 6);
  CHECK(sim.progress[0].peers == 2);
  // No step was measured yet: the first step waited the first-step deadline, not the floor.
  CHECK(std::chrono::duration<double>(sim.now.time_since_epoch()).count() >= 60.0);
  CHECK(std::chrono::duration<double>(sim.now.time_since_epoch()).count() < 62.0);
}

TEST_CASE("the deadline follows the measured step time", "[actors][train][security]") {
  // With no floor, the deadline is `factor` times the longest recent step: a run whose steps
  // take about 40 simulated ms waits a few seconds at factor 100, not the 10 s floor.
  const auto s = two_moons_mlp();
  const auto spec = spec_for(s, dp_options());
  step_deadlines d;
  d.factor = 100;
  d.floor = std::chrono::seconds(0);
  train_sim sim(3, d);
  sim.idle_step = std::chrono::milliseconds(10);
  train_engine::clock::time_point hung_at{}, next_step_at{};
  sim.on_tick = [&](train_sim& t) {
    if (t.hung.empty() && t.progress.size() == 7) {
      t.hung.insert("node-c");
      hung_at = t.now;
    }
    if (next_step_at == train_engine::clock::time_point{} && t.progress.size() == 8) next_step_at = t.now;
  };
  const auto r = sim.train(spec);
  INFO(r.error);
  REQUIRE(r.ok);
  REQUIRE(sim.progress.size() == 24);
  const double waited = std::chrono::duration<double>(next_step_at - hung_at).count();
  CHECK(waited > 0.5);
  CHECK(waited < 10.0);
}

TEST_CASE("a ring member that says ready but sends no pieces is found and left out, and the run goes on", "[actors][train][security]") {
  // node-c computes, says ready and answers the coordinator, but its all-reduce pieces go
  // nowhere. At the deadline the coordinator asks every member how many pieces it took: node-c's
  // successor took none, so node-c is left out and the step redone. The result equals one node's.
  const auto s = two_moons_mlp();
  const auto spec = spec_for(s, dp_options());
  train_sim one(1);
  const auto reference = one.train(spec);
  train_sim sim(3);
  sim.net.set_shuffle(true);
  sim.idle_step = std::chrono::milliseconds(500);
  sim.on_tick = [](train_sim& t) {
    if (t.mute.empty() && t.progress.size() == 5) t.mute.insert("node-c");
  };
  const auto r = sim.train(spec);
  INFO(r.error);
  REQUIRE(r.ok);
  CHECK(max_difference(outputs_of(r), outputs_of(reference)) < 1e-4);
  CHECK(outputs_of(r).at("opt.adam.t").at(0) == 24.0);
  CHECK(sim.progress.back().peers == 2);
  int blamed = 0;
  for (const auto& [at, ref] : sim.refused)
    if (at == "node-a" && ref.kind == "train_step deadline" && ref.from == test::named("node-c") &&
        ref.why.find("stalled at this member") != std::string::npos)
      ++blamed;
  CHECK(blamed == 1);
  CHECK(std::find(r.workers.begin(), r.workers.end(), test::named("node-c")) == r.workers.end());
}

TEST_CASE("a ring stalled by the coordinator's own part is redone once, then the run fails with the reason", "[actors][train][security]") {
  // The coordinator cannot leave itself out: when the member that took the fewest pieces is
  // its successor, the step is redone once and a second stall ends the run with the reason.
  const auto s = two_moons_mlp();
  const auto spec = spec_for(s, dp_options());
  train_sim sim(3);
  sim.net.set_shuffle(true);
  sim.idle_step = std::chrono::milliseconds(500);
  sim.on_tick = [](train_sim& t) {
    if (t.mute.empty() && t.progress.size() == 5) t.mute.insert("node-a");
  };
  const auto r = sim.train(spec);
  REQUIRE_FALSE(r.ok);
  CHECK(r.code == error_code::timeout);
  CHECK(r.error.find("stalled twice") != std::string::npos);
  CHECK(sim.progress.size() == 5);
}

TEST_CASE("the coordinator dying as the run ends: a survivor still finishes it on train_resume", "[actors][train]") {
  // The coordinator decided the last step and told the other members to stop; it dies before
  // its own worker's state (the result) reaches the client. The survivors kept their part of
  // the run: one takes it over, redoes the last step and delivers the result.
  const auto s = two_moons_mlp();
  const auto spec = spec_for(s, dp_options());
  train_sim one(1);
  const auto reference = one.train(spec);
  for (const char* when : {"after node-c's stop", "after the last progress"}) {
    INFO(when);
    train_sim sim(3);
    sim.net.set_shuffle(true);
    const bool at_stop = std::string(when) == "after node-c's stop";
    sim.on_tick = [&](train_sim& t) {
      if (t.dead.count("node-a") || !t.results.empty()) return;
      const auto* st = std::get_if<msg::train_step>(&t.last_message);
      const bool stop_reached_c = st && st->stop && t.last_from == "node-a" && t.last_to == "node-c";
      if (at_stop ? stop_reached_c : t.progress.size() == 24) {
        t.kill("node-a");
        t.send("client", {{"node-c", resume(1, "node-a", "node-c", spec.dataset)}});
      }
    };
    const auto r = sim.train(spec);
    INFO(r.error);
    REQUIRE(r.ok);
    REQUIRE(sim.dead.count("node-a"));
    const auto state = outputs_of(r);
    CHECK(state.at("opt.adam.t").at(0) == 24.0);
    CHECK(reached_step(r) == 24u);
    CHECK(max_difference(state, outputs_of(reference)) < 1e-4);
    CHECK(std::find(r.workers.begin(), r.workers.end(), test::named("node-a")) == r.workers.end());
  }
}

TEST_CASE("a finished run's parts on the other members go after the client's grace time", "[actors][train]") {
  const auto s = two_moons_mlp();
  const auto spec = spec_for(s, dp_options(6));
  train_sim sim(3);
  const auto r = sim.train(spec);
  REQUIRE(r.ok);
  // node-b and node-c keep their stopped part for the grace time, then let it go.
  CHECK(sim.nodes.at("node-b").engine->running() == 1);
  sim.post("node-b", sim.nodes.at("node-b").engine->tick(sim.now + train_engine::client_grace / 2));
  CHECK(sim.nodes.at("node-b").engine->running() == 1);
  sim.post("node-b", sim.nodes.at("node-b").engine->tick(sim.now + train_engine::client_grace + std::chrono::seconds(1)));
  CHECK(sim.nodes.at("node-b").engine->running() == 0);
}

TEST_CASE("a member's own runs are bounded on each node, and its orphans go before an honest one", "[actors][train][security]") {
  // "mallory" (a member whose id sorts before node-a's) sets up runs of its own on node-b and
  // node-c naming the honest client, then leaves; later the honest run's coordinator dies too.
  // Each node keeps at most 8 live runs of one coordinator, and when orphans are too many the
  // coordinator with the most loses its own first: the honest run can still be resumed.
  const auto s = two_moons_mlp();
  const auto spec = spec_for(s, dp_options());
  train_sim one(1);
  const auto reference = one.train(spec);
  train_sim sim(3);
  REQUIRE(test::named("mallory") < test::named("node-a"));
  bool sent = false;
  sim.on_tick = [&](train_sim& t) {
    if (t.progress.size() == 3 && !sent) {
      sent = true;
      for (const char* node : {"node-b", "node-c"})
        for (uint64_t run = 1; run <= 9; ++run)
          t.send("mallory", {{node, msg::train_setup{run, setup_spec(spec), client_id(), 1, {}}}});
    }
    if (t.progress.size() == 5 && !t.dead.count("mallory")) t.kill("mallory");
    if (t.progress.size() == 7 && !t.dead.count("node-a")) {
      t.kill("node-a");
      t.send("client", {{"node-c", resume(1, "node-a", "node-c", spec.dataset)}});
    }
  };
  const auto r = sim.train(spec);
  INFO(r.error);
  REQUIRE(r.ok);
  CHECK(outputs_of(r).at("opt.adam.t").at(0) == 24.0);
  CHECK(max_difference(outputs_of(r), outputs_of(reference)) < 1e-4);
  // The ninth setup on each node was refused and counted against mallory.
  int over = 0;
  for (const auto& [node, ref] : sim.refused)
    if (ref.from == test::named("mallory") && ref.kind == "train_setup" && ref.why.find("runs of this coordinator") != std::string::npos) ++over;
  CHECK(over == 2);
}

TEST_CASE("a newcomer whose pieces do not get through yet is set up again later, and the run goes on", "[actors][train][security]") {
  // node-c joins after 5 steps, but its all-reduce pieces go nowhere for a while (it is not yet
  // connected to its ring neighbours): its first step stalls with every member ready. It goes
  // back to the newcomers and the step is redone without it; once its pieces get through it is
  // set up again and trains. The result equals one node's.
  const auto s = two_moons_mlp();
  const auto spec = spec_for(s, dp_options(40));
  train_sim one(1);
  const auto reference = one.train(spec);
  train_sim sim(2);
  sim.idle_step = std::chrono::milliseconds(500);
  bool joined = false;
  sim.on_tick = [&](train_sim& t) {
    if (!joined && t.progress.size() == 5) {
      joined = true;
      t.add("node-c");
      t.mute.insert("node-c");
    }
    if (t.progress.size() == 8) t.mute.clear();
  };
  const auto r = sim.train(spec);
  INFO(r.error);
  REQUIRE(r.ok);
  CHECK(max_difference(outputs_of(r), outputs_of(reference)) < 1e-4);
  CHECK(outputs_of(r).at("opt.adam.t").at(0) == 40.0);
  CHECK(sim.progress.back().peers == 3);
  CHECK(std::find(r.workers.begin(), r.workers.end(), test::named("node-c")) != r.workers.end());
}

namespace {

/// A small random Llama checkpoint as a fine-tuning model, and a corpus it can learn: each row
/// counts up by a step of its own from a start of its own (mod the vocabulary), so the next token
/// follows from the last two.
struct finetune_setup {
  models::finetune_model model;
  tensor_map data;
};

finetune_setup tiny_llama_finetune(const std::filesystem::path& dir, int64_t lora_rank, dtype compute = dtype::f32) {
  models::test::model_spec spec;
  spec.vocab = 64;
  spec.hidden = 32;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.head_dim = 8;
  spec.ffn = 64;
  models::test::write_hf_model(dir, spec, "F32");
  auto ckpt = models::checkpoint::open(dir);
  REQUIRE(ckpt);
  auto cfg = models::read_model_config(*ckpt);
  REQUIRE(cfg);
  models::finetune_options o;
  o.batch = 2;
  o.sequence = 8;
  o.lora.rank = lora_rank;
  o.compute = compute;
  auto m = models::build_finetune_model(*cfg, *ckpt, o);
  REQUIRE(m);
  finetune_setup s{std::move(*m), {}};
  const int64_t rows = 48, t = o.sequence;
  std::vector<int32_t> tokens, targets;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i <= t; ++i) {
      const auto v = static_cast<int32_t>((r * 7 + i * (1 + r % 3)) % spec.vocab);
      if (i < t) tokens.push_back(v);
      if (i > 0) targets.push_back(v);
    }
  s.data = {{"tokens", tensor::from_ints({rows, t}, tokens)},
            {"targets", tensor::from_ints({rows, t}, targets)},
            {"mask", tensor::from_floats({rows, t}, std::vector<float>(static_cast<size_t>(rows * t), 1.0f))}};
  return s;
}

}  // namespace

TEST_CASE("LoRA fine-tuning of a checkpoint on 3 nodes equals one node, trains only the adapters, and the loss falls",
          "[actors][train][finetune]") {
  models::test::temp_dir dir;
  const auto s = tiny_llama_finetune(dir / "llama", 4);
  train_options o = dp_options(16);
  o.optimizer = optim::adam_options{.lr = 0.01};
  o.trainable = s.model.trainable;
  auto spec = make_train_spec(s.model.g, s.model.state, s.data, 2, o);
  REQUIRE(spec);
  train_sim one(1);
  const auto reference = one.train(*spec);
  INFO(reference.error);
  REQUIRE(reference.ok);
  train_sim three(3);
  const auto r = three.train(*spec);
  INFO(r.error);
  REQUIRE(r.ok);
  CHECK(r.workers.size() == 3);
  const auto state = outputs_of(r), ref_state = outputs_of(reference);
  CHECK(max_difference(state, ref_state) < 1e-4);
  // The frozen weights come back as they went, the adapters moved, and only they have
  // optimizer state.
  for (const auto& [name, t] : s.model.state) {
    INFO(name);
    REQUIRE(state.count(name));
    const bool adapter = name.find(".lora_") != std::string::npos;
    CHECK((state.at(name).bytes == t.bytes) == !adapter);
    CHECK(state.count("opt.adam.m." + name) == (adapter ? 1u : 0u));
  }
  REQUIRE(three.progress.size() == 16);
  CHECK(three.progress.back().loss < three.progress.front().loss * 0.9);
  // Each step's all-reduce carries the adapters' gradients only: a ring of 3 sends each value
  // 2 (n - 1) = 4 times in all (plus the loss), a tenth of what full fine-tuning would send.
  uint64_t adapter_bytes = 0, frozen_bytes = 0;
  for (const auto& [name, t] : s.model.state)
    (name.find(".lora_") != std::string::npos ? adapter_bytes : frozen_bytes) += t.bytes.size();
  const uint64_t step_bytes = three.progress.back().bytes_sent;
  WARN("LoRA step: " << step_bytes << " all-reduce bytes; adapters " << adapter_bytes << " B, frozen weights " << frozen_bytes
                     << " B; loss " << three.progress.front().loss << " -> " << three.progress.back().loss);
  CHECK(step_bytes >= 4 * adapter_bytes);
  CHECK(step_bytes < 5 * adapter_bytes);
  CHECK(step_bytes * 10 < 4 * frozen_bytes);  // a full fine-tune would send 4 x every weight
}

namespace {
double scalar_of(const tensor_map& state, const std::string& name) {
  REQUIRE(state.count(name));
  return state.at(name).to_doubles().at(0);
}
}  // namespace

TEST_CASE("mixed precision: f16 products with loss scaling on 3 nodes equal one node and follow the f32 run",
          "[actors][train][finetune][mixed]") {
  models::test::temp_dir dir;
  const auto f32 = tiny_llama_finetune(dir / "llama", 0);
  const auto f16 = tiny_llama_finetune(dir / "llama", 0, dtype::f16);
  train_options o = dp_options(12);
  o.optimizer = optim::adam_options{.lr = 0.01};
  auto plain = make_train_spec(f32.model.g, f32.model.state, f32.data, 2, o);
  REQUIRE(plain);
  // A scale of 2^20 overflows f16 at first (the first steps are skipped, each halving it), and
  // a growth interval of 3 doubles it again after 3 finite steps in a row.
  o.loss_scale = optim::loss_scaling{.initial = 1 << 20, .growth_interval = 3};
  auto mixed = make_train_spec(f16.model.g, f16.model.state, f16.data, 2, o);
  REQUIRE(mixed);
  train_sim one(1), three(3), exact(1);
  const auto r1 = one.train(*mixed), r3 = three.train(*mixed), rf = exact.train(*plain);
  INFO(r1.error << r3.error << rf.error);
  REQUIRE(r1.ok);
  REQUIRE(r3.ok);
  REQUIRE(rf.ok);
  const auto s1 = outputs_of(r1), s3 = outputs_of(r3), sf = outputs_of(rf);
  // Every node takes the same decisions (they see the same all-reduced gradients).
  CHECK(max_difference(s3, s1) < 1e-4);
  const double taken = scalar_of(s1, "opt.adam.t"), scale = scalar_of(s1, optim::loss_scale_name);
  const double skipped = 12 - taken;
  WARN("f16 with loss scaling: " << skipped << " of 12 steps skipped, final scale " << scale << ", loss "
                                 << one.progress.front().loss << " -> " << one.progress.back().loss << "; f32 "
                                 << exact.progress.front().loss << " -> " << exact.progress.back().loss);
  CHECK(skipped >= 1);   // 2^20 overflowed
  CHECK(taken >= 6);     // and the scale came down to where steps go through
  // S = 2^20 / 2^skipped x 2^growths: a power of two, below the start.
  const double e = std::log2(scale);
  CHECK(e == std::round(e));
  CHECK(scale < (1 << 20));
  // f16 products follow the f32 run closely (the tiny model's values are far from f16's limits).
  CHECK(one.progress.back().loss < one.progress.front().loss * 0.9);
  CHECK(std::abs(one.progress.front().loss - exact.progress.front().loss) < 0.01 * exact.progress.front().loss);
}

TEST_CASE("loss scaling: a step whose gradients overflow changes nothing but the scale, finite steps grow it",
          "[actors][train][finetune][mixed]") {
  models::test::temp_dir dir;
  const auto s = tiny_llama_finetune(dir / "llama", 0, dtype::f16);
  SECTION("overflow: skipped, scale halved") {
    train_options o = dp_options(1);
    o.loss_scale = optim::loss_scaling{.initial = 0x1p60, .growth_interval = 5};
    auto spec = make_train_spec(s.model.g, s.model.state, s.data, 2, o);
    REQUIRE(spec);
    train_sim two(2);
    const auto r = two.train(*spec);
    INFO(r.error);
    REQUIRE(r.ok);
    const auto state = outputs_of(r);
    for (const auto& [name, t] : s.model.state) {
      INFO(name);
      CHECK(state.at(name).bytes == t.bytes);  // the parameters as they were
      CHECK(max_difference({{"m", state.at("opt.adam.m." + name)}}, {{"m", tensor::zeros(dtype::f32, t.dims)}}) == 0);
    }
    CHECK(scalar_of(state, "opt.adam.t") == 0);
    CHECK(scalar_of(state, optim::loss_scale_name) == 0x1p59);
    CHECK(scalar_of(state, optim::loss_scale_good_name) == 0);
  }
  SECTION("finite: taken, and the scale doubles every growth interval") {
    train_options o = dp_options(5);
    o.loss_scale = optim::loss_scaling{.initial = 1, .growth_interval = 2};
    auto spec = make_train_spec(s.model.g, s.model.state, s.data, 2, o);
    REQUIRE(spec);
    train_sim two(2);
    const auto r = two.train(*spec);
    INFO(r.error);
    REQUIRE(r.ok);
    const auto state = outputs_of(r);
    CHECK(scalar_of(state, "opt.adam.t") == 5);
    CHECK(scalar_of(state, optim::loss_scale_name) == 4);  // doubled after steps 2 and 4
    CHECK(scalar_of(state, optim::loss_scale_good_name) == 1);
  }
  SECTION("a bad scaling option is refused") {
    train_options o = dp_options(1);
    o.loss_scale = optim::loss_scaling{.initial = 0};
    auto spec = make_train_spec(s.model.g, s.model.state, s.data, 2, o);
    REQUIRE_FALSE(spec);
    CHECK_THAT(spec.error().message, Catch::Contains("loss scaling"));
  }
}

TEST_CASE("train_options::trainable names a parameter the model lacks: refused, naming it", "[actors][train][finetune]") {
  const auto s = two_moons_mlp();
  auto o = dp_options();
  o.trainable = {"mlp.0.w", "no.such.weight"};
  auto spec = make_train_spec(s.model, s.params, s.data, s.micro_batch, o);
  REQUIRE_FALSE(spec);
  CHECK_THAT(spec.error().message, Catch::Contains("\"no.such.weight\""));
}

namespace {

/// LoRA fine-tuning of a small random Llama (GGUF, with a byte-level vocabulary) whose data is a
/// text file the workers read themselves: documents the model can learn, few enough that a run
/// of 24 steps goes through each shard's rows several times.
struct text_run {
  models::finetune_model model;
  msg::train_spec spec;
  std::filesystem::path data;
};

text_run tiny_llama_on_text(const std::filesystem::path& dir, uint64_t steps) {
  models::test::model_spec ms;
  ms.vocab = 260;
  ms.hidden = 32;
  ms.heads = 4;
  ms.kv_heads = 2;
  ms.head_dim = 8;
  ms.ffn = 64;
  const auto path = dir / "tiny.gguf";
  models::test::write_gguf_model(path, ms, models::tensor_type::f32);
  auto ckpt = models::checkpoint::open(path);
  REQUIRE(ckpt);
  auto cfg = models::read_model_config(*ckpt);
  REQUIRE(cfg);
  auto tok = models::load_tokenizer(*ckpt, *cfg);
  REQUIRE(tok);
  models::finetune_options fo;
  fo.batch = 2;
  fo.sequence = 8;
  fo.lora.rank = 4;
  auto m = models::build_finetune_model(*cfg, *ckpt, fo);
  REQUIRE(m);
  text_run r{std::move(*m), {}, dir / "corpus.txt"};
  {
    std::ofstream f(r.data);
    const char* lines[] = {"the cat sat on the mat.", "a dog sat on a log.", "the cat and the dog."};
    for (int i = 0; i < 12; ++i) f << lines[i % 3] << "\n\n";
  }
  train_options o = dp_options(steps);
  o.micro_batches = 3;
  o.optimizer = optim::adam_options{.lr = 0.01};
  o.trainable = r.model.trainable;
  auto spec = make_train_spec(r.model.g, r.model.state, {}, fo.batch, o);
  REQUIRE(spec);
  auto text = make_text_data(r.data.string(), models::data_format::text, 8, tok->vocab, std::nullopt);
  text.shuffle_rows = 4;  // blocks of 4 rows: each epoch of a shard is several blocks
  text.file.size = std::filesystem::file_size(r.data);  // what the node's shell fills in when it offers the file
  text.file.id[0] = 1;
  spec->text = {text};
  r.spec = std::move(*spec);
  return r;
}

}  // namespace

TEST_CASE("workers read their shards of a data file: 3 nodes equal 1, a death mid-epoch skips and repeats no row",
          "[actors][train][finetune]") {
  models::test::temp_dir dir;
  const auto run = tiny_llama_on_text(dir.path(), 24);
  train_sim one(1);
  const auto reference = one.train(run.spec);
  INFO(reference.error);
  REQUIRE(reference.ok);
  REQUIRE(one.progress.size() == 24);
  CHECK(one.progress.back().loss < one.progress.front().loss * 0.8);
  const auto file_size = std::filesystem::file_size(run.data);

  train_sim three(3);
  const auto r = three.train(run.spec);
  INFO(r.error);
  REQUIRE(r.ok);
  CHECK(r.workers.size() == 3);
  CHECK(max_difference(outputs_of(r), outputs_of(reference)) < 1e-4);
  // Nothing of the data travelled in the steps: each worker read its file, not all of it each time.
  CHECK(three.shards_received.empty());
  for (const auto& [node, bytes] : three.data_bytes) {
    INFO(node << " read " << bytes << " bytes of a " << file_size << "-byte file");
    CHECK(bytes > 0);
  }

  // A worker dies mid-epoch (a shard's rows go round every 4 steps here): its slot and shard move
  // to a survivor, which reads that shard from its start and carries on at the same draw.
  train_sim sim(3);
  sim.on_tick = [](train_sim& t) {
    if (!t.dead.count("node-c") && t.progress.size() == 10) t.kill("node-c");
  };
  const auto d = sim.train(run.spec);
  INFO(d.error);
  REQUIRE(d.ok);
  CHECK(sim.progress.back().peers == 2);
  CHECK(max_difference(outputs_of(d), outputs_of(reference)) < 1e-4);
}

TEST_CASE("a data file with a bad record fails the run with the record's place, whichever worker meets it",
          "[actors][train][finetune]") {
  models::test::temp_dir dir;
  auto run = tiny_llama_on_text(dir.path(), 8);
  const auto bad = dir / "bad.jsonl";
  {
    std::ofstream f(bad);
    for (int i = 0; i < 20; ++i) f << "{\"text\": \"the cat sat on the mat.\"}\n";
    f << "{\"text\": 7}\n";
    for (int i = 0; i < 20; ++i) f << "{\"text\": \"a dog sat on a log.\"}\n";
  }
  run.spec.text[0].path = bad.string();
  run.spec.text[0].format = static_cast<uint8_t>(models::data_format::jsonl);
  run.spec.text[0].file.size = std::filesystem::file_size(bad);
  run.spec.text[0].shuffle_rows = 1024;  // a shard's first draw reads all of it
  train_sim sim(3);
  const auto r = sim.train(run.spec);
  CHECK(!r.ok);
  CHECK(r.code == error_code::decode_error);
  INFO(r.error);
  CHECK(r.error.find("cannot read the training data") != std::string::npos);
  CHECK(r.error.find("\"text\" must be a string, not number") != std::string::npos);
  CHECK(r.error.find(bad.string()) != std::string::npos);
}
