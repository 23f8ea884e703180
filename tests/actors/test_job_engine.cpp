// The job engine of several nodes over a simulated network: a job split over 3 nodes equals the
// local reference; a node dying mid-job makes the coordinator re-plan and the job still completes
// correctly (pipeline, data- and tensor-parallel plans); bad graphs from a client get clear errors
// and every node keeps working.
#include <catch2/catch.hpp>

#include <functional>

#include <deque>
#include <map>
#include <random>
#include <set>

#include "sim_network.hpp"
#include "actors/job_engine.hpp"
#include "graph/nn.hpp"
#include "wire/wire_graph.hpp"

using namespace mesh;

namespace {

/// Nodes "a", "b", "c" and a client "cli" on the simulated network (tests/common/sim_network.hpp:
/// each sender-receiver pair in order, pairs interleaved at random); each node's ready stages run
/// on the reference evaluator.
struct mesh_sim {
  std::map<std::string, job_engine> nodes;
  test::sim_network<outbound> net{12345};
  /// Simulated time: a millisecond passes with every delivery.
  job_engine::clock::time_point now{};
  std::set<std::string> dead;
  std::vector<msg::job_result> results;  // what the client received
  std::vector<msg::job_progress> progress;
  int delivered = 0;
  int fragments_sent = 0;  // run_stage messages that carried a fragment
  /// Called after each message a node handled (tests play a malicious member here).
  std::function<void(mesh_sim&, const std::string& to, const msg::message&)> after_delivery;
  std::vector<refused_message> refused;  // what the nodes refused for the sender's lack of authority

  /// Stages for which this returns true fail on their node instead of running.
  std::function<bool(const stage_task&)> fail_task;
  std::vector<std::string> forgotten;  // resident keys the workers let go (for their executors)
  std::set<std::string> forgotten_set;
  int resident_after_forget = 0;       // stages run as resident after their key was let go (a leak)

  /// Nodes that stay connected (no peer_dead) and do nothing: messages to them are dropped.
  std::set<std::string> hung;

  explicit mesh_sim(std::vector<double> speeds = {1, 1, 1}, int64_t memory = int64_t{1} << 40, stage_deadlines deadlines = {}) {
    const char* names[] = {"a", "b", "c"};
    for (size_t i = 0; i < speeds.size(); ++i)
      nodes.emplace(names[i], job_engine(test::named(names[i]), {names[i], speeds[i] * 1e-6, 1e3, 1e3, memory}, 1, deadlines));
    for (auto& [id, e] : nodes)
      for (size_t i = 0; i < speeds.size(); ++i)
        if (names[i] != id) e.peer_up(test::named(names[i]), {names[i], speeds[i] * 1e-6, 1e3, 1e3, memory});
  }

  /// Stages waiting or running on the live nodes.
  size_t stages_held() const {
    size_t n = 0;
    for (const auto& [id, e] : nodes)
      if (!dead.count(id)) n += e.running_stages();
    return n;
  }

  void post(const std::string& from, std::vector<outbound> out) {
    net.post_all(from, std::move(out));
  }
  /// What a test sends: to a node by name.
  struct named_out {
    std::string to;
    msg::message m;
  };
  void send(const std::string& from, std::vector<named_out> out) {
    for (auto& o : out) net.post(from, o.to, outbound{test::named(o.to), std::move(o.m)});
  }

  /// Delivers messages until the queue is empty or `limit` deliveries happened.
  void run(int limit = 100000) {
    while (!net.empty() && limit-- > 0) {
      auto [from, to, o] = *net.next();
      now += std::chrono::milliseconds(1);
      if (dead.count(from) || dead.count(to) || hung.count(to)) continue;  // a dead node sends and receives nothing
      ++delivered;
      if (to == "cli") {
        if (auto* r = std::get_if<msg::job_result>(&o.m)) results.push_back(*r);
        if (auto* p = std::get_if<msg::job_progress>(&o.m)) progress.push_back(*p);
        continue;
      }
      if (auto* rs = std::get_if<msg::run_stage>(&o.m)) fragments_sent += !rs->fragment.empty();
      // Through the real codec, as on the wire.
      auto bytes = msg::encode_message(o.m);
      REQUIRE(bytes);
      auto m = msg::decode_message(bytes->data(), bytes->size());
      REQUIRE(m);
      auto& e = nodes.at(to);
      post(to, e.on_message(test::named(from), *m, now));
      for (auto& r : e.take_refused()) refused.push_back(std::move(r));
      for (auto& t : e.take_ready()) {
        if (!t.resident_key.empty() && forgotten_set.count(t.resident_key)) ++resident_after_forget;
        if (fail_task && fail_task(t)) post(to, e.on_executed(t, make_error(error_code::device, "simulated failure"), now));
        else post(to, e.on_executed(t, evaluate(*t.g, t.inputs, t.params).map([](evaluation r) { return r.outputs; }), now));
      }
      for (auto& k : e.take_forgotten()) {
        forgotten.push_back(k);
        forgotten_set.insert(k);
      }
      if (after_delivery) after_delivery(*this, to, *m);
    }
  }

  /// Lets `d` of simulated time pass and calls every live node's tick(), then delivers.
  void tick(std::chrono::milliseconds d) {
    now += d;
    for (auto& [id, e] : nodes) {
      if (dead.count(id) || hung.count(id)) continue;
      post(id, e.tick(now));
      for (auto& r : e.take_refused()) refused.push_back(std::move(r));
    }
    run();
  }

  void kill(const std::string& id) {
    dead.insert(id);
    for (auto& [other, e] : nodes)
      if (!dead.count(other)) post(other, e.peer_dead(test::named(id), now));
  }
};

struct model {
  graph g;
  tensor_map tensors;
  tensor_map reference;
};

model mlp_job() {
  builder b;
  auto x = b.input("x", dtype::f32, {16, 8});
  auto m = nn::make_mlp(b, "mlp", {8, 32, 32, 32, 4});
  b.output("probs", nn::softmax(m(x)));
  b.output("hidden_sum", sum_all(m.layers[0](x)));
  model out;
  out.g = *b.finish();
  out.tensors = nn::init_parameters(out.g, 5);
  std::vector<double> xv(128);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::sin(0.3 * static_cast<double>(i));
  out.tensors["x"] = tensor::from_values(dtype::f32, {16, 8}, xv);
  tensor_map params = out.tensors;
  params.erase("x");
  out.reference = evaluate(out.g, {{"x", out.tensors["x"]}}, params)->outputs;
  return out;
}

msg::submit_job submission(const model& m, uint64_t id, strategy s = strategy::pipeline) {
  return {id, graph_payload(wire_graph{m.g, m.tensors}), s};
}

/// Rows computed from their own input row only: data parallel applies.
model row_job() {
  builder b;
  auto x = b.input("x", dtype::f32, {17, 8});
  auto m = nn::make_mlp(b, "mlp", {8, 32, 24, 4});
  b.output("probs", nn::softmax(m(x)));
  model out;
  out.g = *b.finish();
  out.tensors = nn::init_parameters(out.g, 9);
  std::vector<double> xv(17 * 8);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::cos(0.7 * static_cast<double>(i));
  out.tensors["x"] = tensor::from_values(dtype::f32, {17, 8}, xv);
  tensor_map params = out.tensors;
  params.erase("x");
  out.reference = evaluate(out.g, {{"x", out.tensors["x"]}}, params)->outputs;
  return out;
}

void check_outputs(const msg::job_result& r, const model& m) {
  INFO(r.error);
  REQUIRE(r.ok);
  REQUIRE(r.outputs.size() == m.reference.size());
  for (const auto& o : r.outputs) {
    CHECK(o.value.dims == m.reference.at(o.name).dims);
    CHECK(normalised_error(o.value, m.reference.at(o.name)) < 1e-12);
  }
}

/// The model as a client opens it as a session: its graph and parameters, not its input "x".
graph_payload session_wire(const model& m) {
  tensor_map params = m.tensors;
  params.erase("x");
  return graph_payload(wire_graph{m.g, params});
}

}  // namespace

TEST_CASE("a job split over 3 nodes equals the local reference", "[actors][jobs]") {
  mesh_sim sim;
  const model m = mlp_job();
  sim.send("cli", {{"a", submission(m, 1)}});
  sim.run();
  REQUIRE(sim.results.size() == 1);
  const auto& r = sim.results[0];
  INFO(r.error);
  REQUIRE(r.ok);
  CHECK(r.workers.size() == 3);  // every node ran a stage
  for (const auto& o : r.outputs) CHECK(normalised_error(o.value, m.reference.at(o.name)) == 0);
  CHECK(sim.nodes.at("a").jobs(sim.now).at(0).state == job_state::done);
  CHECK(sim.nodes.at("a").jobs(sim.now).at(0).seconds > 0);  // simulated time, passed in
}

TEST_CASE("a node dying mid-job: the coordinator re-plans and the job completes", "[actors][jobs]") {
  for (const char* victim : {"b", "c"}) {
    mesh_sim sim;
    const model m = mlp_job();
    sim.send("cli", {{"a", submission(m, 7)}});
    sim.run(2);  // the stages are on their way; nothing has finished
    sim.kill(victim);
    sim.run();
    REQUIRE(sim.results.size() == 1);
    const auto& r = sim.results[0];
    INFO(victim << ": " << r.error);
    REQUIRE(r.ok);
    CHECK(r.attempts == 2);
    CHECK(std::find(r.workers.begin(), r.workers.end(), test::named(victim)) == r.workers.end());
    for (const auto& o : r.outputs) CHECK(normalised_error(o.value, m.reference.at(o.name)) == 0);
  }
}

TEST_CASE("malformed or hostile jobs get clear errors and the mesh keeps working", "[actors][jobs]") {
  mesh_sim sim;
  const model m = mlp_job();
  msg::submit_job garbage{1, graph_payload::from_bytes("nope", 4), strategy::pipeline};
  auto missing = submission(m, 2);
  {
    wire_graph w{m.g, m.tensors};
    w.tensors.erase("mlp.0.w");
    missing.graph = graph_payload(std::move(w));
  }
  auto bad_graph = submission(m, 3);
  {
    graph g = m.g;
    g.nodes.back().dims = {99};  // declared shape lies
    bad_graph.graph = graph_payload(wire_graph{g, m.tensors});
  }
  // (A strategy out of range never reaches the engine: the decoder refuses it, tests/wire.)
  auto reserved = submission(m, 5);  // an input named like the values stages pass each other
  {
    graph g = m.g;
    tensor_map t = m.tensors;
    const node_index x = g.find_leaf("x");
    g.nodes[static_cast<size_t>(x)].attrs.name = "cut.3";
    t["cut.3"] = t.at("x");
    t.erase("x");
    reserved.graph = graph_payload(wire_graph{g, t});
  }
  sim.send("cli", {{"b", garbage}, {"b", missing}, {"c", bad_graph}, {"a", reserved}});
  sim.run();
  REQUIRE(sim.results.size() == 4);
  for (const auto& r : sim.results) {
    INFO("job " << r.job << ": " << r.error);
    CHECK_FALSE(r.ok);
    CHECK_FALSE(r.error.empty());
    if (r.job == 5) CHECK(r.error.find("reserved") != std::string::npos);
  }
  // Every node still runs jobs.
  for (const char* coordinator : {"a", "b", "c"}) sim.send("cli", {{coordinator, submission(m, 10 + coordinator[0])}});
  sim.run();
  REQUIRE(sim.results.size() == 7);
  for (size_t i = 4; i < 7; ++i) CHECK(sim.results[i].ok);
}

TEST_CASE("an inference session loads the model once and serves many calls", "[actors][jobs]") {
  mesh_sim sim;
  const model m = mlp_job();
  sim.send("cli", {{"a", msg::open_session{1, session_wire(m)}}});
  sim.run();
  REQUIRE(sim.results.size() == 1);
  INFO(sim.results[0].error);
  REQUIRE(sim.results[0].ok);
  const size_t stages = sim.results[0].workers.size();
  CHECK(stages == 3);
  // Five calls in flight at once: they stream through the stages.
  for (uint64_t call = 10; call < 15; ++call) sim.send("cli", {{"a", msg::infer{1, call, {{"x", m.tensors.at("x")}}}}});
  sim.run();
  REQUIRE(sim.results.size() == 6);
  for (size_t i = 1; i < 6; ++i) {
    INFO(sim.results[i].error);
    REQUIRE(sim.results[i].ok);
    for (const auto& o : sim.results[i].outputs) CHECK(normalised_error(o.value, m.reference.at(o.name)) == 0);
  }
  CHECK(sim.fragments_sent == static_cast<int>(stages));  // each stage's fragment travelled once
  // A call to an unknown session and a call with a wrong input are clear errors.
  sim.send("cli", {{"a", msg::infer{99, 20, {}}}, {"a", msg::infer{1, 21, {{"x", tensor::zeros(dtype::f32, {2})}}}}});
  sim.run();
  REQUIRE(sim.results.size() == 8);
  CHECK_FALSE(sim.results[6].ok);
  CHECK(sim.results[6].error.find("no open session") != std::string::npos);
  CHECK_FALSE(sim.results[7].ok);
  CHECK(sim.results[7].error.find("\"x\"") != std::string::npos);
}

TEST_CASE("a session survives a dead worker: it is re-planned and calls still answer", "[actors][jobs]") {
  mesh_sim sim;
  const model m = mlp_job();
  sim.send("cli", {{"a", msg::open_session{1, session_wire(m)}}});
  sim.run();
  REQUIRE(sim.results.at(0).ok);
  sim.send("cli", {{"a", msg::infer{1, 2, {{"x", m.tensors.at("x")}}}}});
  sim.run(3);  // the call is in flight
  sim.kill("b");
  sim.send("cli", {{"a", msg::infer{1, 3, {{"x", m.tensors.at("x")}}}}});
  sim.run();
  REQUIRE(sim.results.size() == 3);
  for (size_t i = 1; i < 3; ++i) {
    INFO(sim.results[i].error);
    REQUIRE(sim.results[i].ok);
    CHECK(std::find(sim.results[i].workers.begin(), sim.results[i].workers.end(), test::named("b")) == sim.results[i].workers.end());
    for (const auto& o : sim.results[i].outputs) CHECK(normalised_error(o.value, m.reference.at(o.name)) == 0);
  }
}

TEST_CASE("data-parallel and tensor-parallel jobs equal the reference and report progress", "[actors][jobs]") {
  const model m = row_job();
  for (auto how : {strategy::data_parallel, strategy::tensor_parallel, strategy::automatic}) {
    INFO(to_string(how));
    mesh_sim sim({1, 2, 3});
    sim.send("cli", {{"b", submission(m, 5, how)}});
    sim.run();
    REQUIRE(sim.results.size() == 1);
    check_outputs(sim.results[0], m);
    const auto ran = sim.results[0].ran_as;
    if (how != strategy::automatic) CHECK(ran == how);
    if (ran != strategy::pipeline) CHECK(sim.results[0].workers.size() >= 3);
    // One progress message per stage, counting 1..stages (the simulated network reorders them).
    REQUIRE_FALSE(sim.progress.empty());
    std::set<uint32_t> counts;
    for (const auto& p : sim.progress) {
      CHECK(p.stages == sim.progress.front().stages);
      counts.insert(p.stages_done);
    }
    CHECK(counts.size() == sim.progress.front().stages);
    CHECK(*counts.rbegin() == sim.progress.front().stages);
    CHECK(std::string(to_string(sim.nodes.at("b").jobs(sim.now).at(0).kind)) == to_string(ran));
  }
}

TEST_CASE("a node dying mid-job re-plans data- and tensor-parallel jobs too", "[actors][jobs]") {
  const model m = row_job();
  for (auto how : {strategy::data_parallel, strategy::tensor_parallel}) {
    for (const char* victim : {"a", "c"}) {
      INFO(to_string(how) << ", " << victim << " dies");
      mesh_sim sim;
      sim.send("cli", {{"b", submission(m, 3, how)}});
      sim.run(2);
      sim.kill(victim);
      sim.run();
      REQUIRE(sim.results.size() == 1);
      check_outputs(sim.results[0], m);
      CHECK(sim.results[0].attempts == 2);
      CHECK(std::find(sim.results[0].workers.begin(), sim.results[0].workers.end(), test::named(victim)) == sim.results[0].workers.end());
    }
  }
}

TEST_CASE("data parallel on a graph that mixes batch rows is refused, automatic still runs it", "[actors][jobs]") {
  const model m = mlp_job();  // its "hidden_sum" adds over every row
  mesh_sim sim;
  sim.send("cli", {{"a", submission(m, 1, strategy::data_parallel)}});
  sim.run();
  REQUIRE(sim.results.size() == 1);
  CHECK_FALSE(sim.results[0].ok);
  CHECK(sim.results[0].error.find("batch axis") != std::string::npos);
  sim.send("cli", {{"a", submission(m, 2, strategy::automatic)}});
  sim.run();
  REQUIRE(sim.results.size() == 2);
  check_outputs(sim.results[1], m);
  CHECK(sim.results[1].ran_as != strategy::data_parallel);
}

TEST_CASE("a failed job's other stages are let go on every worker", "[actors][jobs]") {
  // Stage 0 fails: the stages downstream wait for activations that will never come.
  mesh_sim sim;
  const model m = mlp_job();
  sim.fail_task = [](const stage_task& t) { return t.stage == 0; };
  sim.send("cli", {{"a", msg::submit_job{1, graph_payload(wire_graph{m.g, m.tensors}), strategy::pipeline}}});
  sim.run();
  REQUIRE(sim.results.size() == 1);
  CHECK_FALSE(sim.results[0].ok);
  CHECK(sim.stages_held() == 0);  // they showed as load in heartbeats and meshctl for ever
}

TEST_CASE("a job re-planned after a death leaves no stage of its first attempt waiting", "[actors][jobs]") {
  mesh_sim sim;
  const model m = mlp_job();
  sim.send("cli", {{"a", msg::submit_job{7, graph_payload(wire_graph{m.g, m.tensors}), strategy::pipeline}}});
  sim.run(2);
  sim.kill("b");
  sim.run();
  REQUIRE(sim.results.size() == 1);
  INFO(sim.results[0].error);
  CHECK(sim.results[0].ok);
  CHECK(sim.results[0].attempts == 2);
  CHECK(sim.stages_held() == 0);
}

TEST_CASE("a long-lived session still answers after 256 other sessions passed through its worker", "[actors][jobs]") {
  // The worker caches 256 session fragments. Closed sessions now let theirs go at once; and a
  // fragment that had to make room is sent again instead of leaving the call parked for ever.
  mesh_sim sim({1});
  const model m = mlp_job();
  const auto wire = session_wire(m);
  sim.send("cli", {{"a", msg::open_session{1, wire}}});
  sim.run();
  sim.send("cli", {{"a", msg::infer{1, 100, {{"x", m.tensors.at("x")}}}}});
  sim.run();
  REQUIRE(sim.results.size() == 2);
  CHECK(sim.forgotten.empty());
  for (uint64_t s = 2; s < 2 + 300; ++s) {
    sim.send("cli", {{"a", msg::open_session{s, wire}}});
    sim.run();  // the simulated network reorders: the call must not overtake the open
    sim.send("cli", {{"a", msg::infer{s, 1000 + s, {{"x", m.tensors.at("x")}}}}});
    sim.run();
    sim.send("cli", {{"a", msg::close_session{s}}});
    sim.run();
  }
  CHECK(sim.forgotten.size() == 300);  // each closed session's fragment, for the executor to free
  const size_t before = sim.results.size();
  sim.send("cli", {{"a", msg::infer{1, 101, {{"x", m.tensors.at("x")}}}}});
  sim.run();
  REQUIRE(sim.results.size() == before + 1);
  INFO(sim.results.back().error);
  CHECK(sim.results.back().ok);
  CHECK(sim.stages_held() == 0);
}

TEST_CASE("a session call whose fragment was evicted gets the fragment sent again", "[actors][jobs]") {
  // 257 sessions open at once on one worker: the least recently used fragment makes room.
  mesh_sim sim({1});
  const model m = mlp_job();
  const auto wire = session_wire(m);
  for (uint64_t s = 1; s <= 257; ++s) {
    sim.send("cli", {{"a", msg::open_session{s, wire}}});
    sim.run();
    sim.send("cli", {{"a", msg::infer{s, 1000 + s, {{"x", m.tensors.at("x")}}}}});
    sim.run();
  }
  for (const auto& r : sim.results) REQUIRE(r.ok);
  CHECK(sim.forgotten.size() == 1);  // session 1's fragment, the least recently used
  const size_t before = sim.results.size();
  const int fragments = sim.fragments_sent;
  sim.send("cli", {{"a", msg::infer{1, 5000, {{"x", m.tensors.at("x")}}}}});
  sim.run();
  REQUIRE(sim.results.size() == before + 1);
  INFO(sim.results.back().error);
  CHECK(sim.results.back().ok);
  CHECK(sim.fragments_sent == fragments + 1);
}

TEST_CASE("sessions of a client that left are ended, and their workers let the fragments go", "[actors][jobs]") {
  mesh_sim sim;
  const model m = mlp_job();
  sim.send("cli", {{"a", msg::open_session{1, session_wire(m)}}});
  sim.run();
  sim.send("cli", {{"a", msg::infer{1, 2, {{"x", m.tensors.at("x")}}}}});
  sim.run();
  REQUIRE(sim.results.size() == 2);
  REQUIRE(sim.results[0].workers.size() == 3);
  sim.post("a", sim.nodes.at("a").peer_dead(test::named("cli"), sim.now));
  sim.run();
  CHECK(sim.forgotten.size() == 3);  // one fragment on each node
  sim.send("cli", {{"a", msg::infer{1, 3, {{"x", m.tensors.at("x")}}}}});
  sim.run();
  REQUIRE(sim.results.size() == 3);
  CHECK(sim.results[2].error.find("no open session") != std::string::npos);
}

TEST_CASE("a session that cannot be re-planned after a death ends, and its calls get an error", "[actors][jobs]") {
  // Open over a and b; c joins with too little memory; b dies: the model no longer fits. Calls
  // used to go on to the dead node, unanswered.
  const model m = mlp_job();
  bool tried = false;
  for (int64_t mem = 16000; mem <= 40000 && !tried; mem += 2000) {
    mesh_sim sim({1, 1}, mem);
    sim.send("cli", {{"a", msg::open_session{1, session_wire(m)}}});
    sim.run();
    if (!sim.results.at(0).ok || sim.results[0].workers.size() != 2) continue;
    tried = true;
    sim.nodes.emplace("c", job_engine(test::named("c"), {"c", 1e-6, 1e3, 1e3, 1000}));
    for (auto& [id, e] : sim.nodes)
      if (id != "c") {
        e.peer_up(test::named("c"), {"c", 1e-6, 1e3, 1e3, 1000});
        sim.nodes.at("c").peer_up(test::named(id), {id, 1e-6, 1e3, 1e3, mem});
      }
    sim.send("cli", {{"a", msg::infer{1, 2, {{"x", m.tensors.at("x")}}}}});
    sim.run(2);
    sim.kill("b");
    sim.send("cli", {{"a", msg::infer{1, 3, {{"x", m.tensors.at("x")}}}}});
    sim.run();
    REQUIRE(sim.results.size() == 3);  // the open and both calls: each answered
    for (size_t i = 1; i < 3; ++i) {
      INFO(sim.results[i].error);
      CHECK_FALSE(sim.results[i].ok);
      const bool said = sim.results[i].error.find("cannot be re-planned") != std::string::npos ||
                        sim.results[i].error.find("no open session") != std::string::npos;
      CHECK(said);
    }
    CHECK(sim.stages_held() == 0);
  }
  CHECK(tried);
}

TEST_CASE("a session closed while a call is in flight leaves nothing resident", "[actors][jobs]") {
  // A stage still waiting for its activation when the close arrives runs afterwards: it must not
  // make its fragment resident again, after the executor was told to free it.
  const model m = mlp_job();
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    INFO("seed " << seed);
    mesh_sim sim;
    sim.net = test::sim_network<outbound>(seed);
    sim.send("cli", {{"a", msg::open_session{1, session_wire(m)}}});
    sim.run();
    sim.send("cli", {{"a", msg::infer{1, 2, {{"x", m.tensors.at("x")}}}}});
    sim.run(static_cast<int>(seed % 7) + 1);
    sim.send("cli", {{"a", msg::close_session{1}}});
    sim.run();
    CHECK(sim.resident_after_forget == 0);
    CHECK(sim.stages_held() == 0);
  }
}

TEST_CASE("a restarted coordinator's jobs run on workers that knew its earlier life", "[actors][jobs]") {
  // Workers remember cancelled jobs and cached fragments by (coordinator, job id); a restarted
  // node numbers its jobs afresh (the node starts from its start time, this test from 1).
  mesh_sim sim;
  const model m = mlp_job();
  sim.fail_task = [](const stage_task& t) { return t.stage == 0; };
  sim.send("cli", {{"a", msg::submit_job{1, graph_payload(wire_graph{m.g, m.tensors}), strategy::pipeline}}});
  sim.run();
  REQUIRE(sim.results.size() == 1);
  REQUIRE_FALSE(sim.results[0].ok);
  sim.fail_task = nullptr;
  // "a" restarts: a fresh engine, and its hello reaches the others again.
  sim.nodes.erase("a");
  sim.nodes.emplace("a", job_engine(test::named("a"), {"a", 1e-6, 1e3, 1e3, int64_t{1} << 40}));
  for (const char* other : {"b", "c"}) {
    sim.nodes.at("a").peer_up(test::named(other), {other, 1e-6, 1e3, 1e3, int64_t{1} << 40});
    sim.nodes.at(other).peer_up(test::named("a"), {"a", 1e-6, 1e3, 1e3, int64_t{1} << 40});
  }
  sim.send("cli", {{"a", msg::submit_job{1, graph_payload(wire_graph{m.g, m.tensors}), strategy::pipeline}}});
  sim.run();
  REQUIRE(sim.results.size() == 2);
  INFO(sim.results[1].error);
  CHECK(sim.results[1].ok);
}

TEST_CASE("an activation from a node that does not run the producing stage is refused", "[actors][jobs][security]") {
  // A member that is no producer of a stage's input sends the stage its own numbers as soon as
  // the stage is set up, before the real value can come: before activations were checked against
  // the producing stage's node, its value was taken and the real one dropped as a duplicate.
  const auto m = mlp_job();
  mesh_sim sim;
  // One global order: the forged values (sent right after each stage is set up) arrive before
  // the coordinator can open the route for the real ones.
  sim.net.set_shuffle(false);
  int forged = 0;
  sim.after_delivery = [&](mesh_sim& t, const std::string& to, const msg::message& msg) {
    const auto* rs = std::get_if<msg::run_stage>(&msg);
    if (!rs || rs->awaited.empty() || rs->fragment.empty()) return;
    auto frag = rs->fragment.get("the fragment");
    REQUIRE(frag);
    for (const auto& a : rs->awaited) {
      const auto& leaf = (*frag)->g[(*frag)->g.find_leaf(a.name)];
      tensor bogus = tensor::zeros(leaf.type, leaf.dims);
      std::fill(bogus.bytes.begin(), bogus.bytes.end(), uint8_t{0x3f});  // plausible floats, wrong ones
      t.send("m", {{to, msg::activation{rs->coordinator, rs->job, rs->attempt, rs->stage, {a.name, bogus}}}});
      ++forged;
    }
  };
  sim.send("cli", {{"a", submission(m, 1)}});
  sim.run();
  REQUIRE(forged > 0);
  REQUIRE(sim.results.size() == 1);
  check_outputs(sim.results[0], m);
  CHECK(sim.refused.size() == static_cast<size_t>(forged));
  for (const auto& r : sim.refused) {
    CHECK(r.from == test::named("m"));
    CHECK(r.kind == "activation");
    CHECK_THAT(r.why, Catch::Contains("not from this sender"));
  }
}

TEST_CASE("a stage waits for each awaited value from the node the coordinator named", "[actors][jobs][security]") {
  // One worker, driven directly: node p produces "cut.1" for stage 1 of coordinator c's job 5.
  builder b;
  auto x = b.input("cut.1", dtype::f32, {2});
  b.output("y", x * 2.0);
  const node_id c = test::named("c"), p = test::named("p"), intruder = test::named("m");
  job_engine w(test::named("w"), {"w", 1e-6, 1e3, 1e3, int64_t{1} << 30});
  msg::run_stage r{5, 1, 1, c, graph_payload(wire_graph{*b.finish(), {}}), {{"cut.1", p}}, {}, 0, {}};
  auto out = w.on_message(c, r, {});
  REQUIRE(out.size() == 1);
  CHECK(std::holds_alternative<msg::stage_accepted>(out[0].m));
  const tensor real = tensor::from_values(dtype::f32, {2}, {1, 2}), fake = tensor::from_values(dtype::f32, {2}, {100, 200});
  CHECK(w.on_message(intruder, msg::activation{c, 5, 1, 1, {"cut.1", fake}}, {}).empty());
  CHECK(w.take_ready().empty());
  auto refused = w.take_refused();
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].from == intruder);
  CHECK_THAT(refused[0].why, Catch::Contains("\"cut.1\" for stage 1 of job 5"));
  // The coordinator itself is no producer either.
  CHECK(w.on_message(c, msg::activation{c, 5, 1, 1, {"cut.1", fake}}, {}).empty());
  CHECK(w.take_refused().size() == 1);
  CHECK(w.on_message(p, msg::activation{c, 5, 1, 1, {"cut.1", real}}, {}).empty());
  auto ready = w.take_ready();
  REQUIRE(ready.size() == 1);
  CHECK(ready[0].inputs.at("cut.1") == real);
  CHECK(w.take_refused().empty());
  // A run_stage that names no sender for a value is refused at once, to its coordinator.
  msg::run_stage nameless = r;
  nameless.job = 6;
  nameless.awaited[0].from = {};
  out = w.on_message(c, nameless, {});
  REQUIRE(out.size() == 1);
  const auto* done = std::get_if<msg::stage_done>(&out[0].m);
  REQUIRE(done);
  CHECK_FALSE(done->ok);
  CHECK_THAT(done->error, Catch::Contains("names no node that sends it"));
}

TEST_CASE("a stage node that stays connected but never runs its stage is re-planned around at the deadline", "[actors][jobs][security]") {
  // The deadline is factor x the planner's estimate of the stage from the node's measured speed:
  // here the estimate itself (factor 1, no floor), taken from the same plan the coordinator makes.
  stage_deadlines d;
  d.factor = 1;
  d.floor = std::chrono::seconds(0);
  d.bench = std::chrono::seconds(600);
  mesh_sim sim({1, 1, 1}, int64_t{1} << 40, d);
  const model m = mlp_job();
  std::vector<device_profile> devices;
  for (const char* n : {"a", "b", "c"}) devices.push_back({n, 1e-6, 1e3, 1e3, int64_t{1} << 40});
  const auto p = partition(m.g, devices, strategy::pipeline);
  REQUIRE(p);
  REQUIRE(p->stages.size() == 3);
  const double first_stage = p->stages[0].seconds, c_stage = p->stages[2].seconds;
  REQUIRE(c_stage > 1.0);
  sim.hung.insert("c");  // heartbeats (no peer_dead), never answers
  sim.send("cli", {{"a", submission(m, 3)}});
  sim.run();
  REQUIRE(sim.results.empty());
  // Stage c's clock starts when its inputs are ready (stage b done): a tick before its estimate
  // has passed re-plans nothing.
  const auto start = sim.now;
  sim.tick(std::chrono::milliseconds(static_cast<int64_t>(c_stage * 1000 * 0.9)));
  CHECK(sim.results.empty());
  CHECK(sim.refused.empty());
  for (int i = 0; i < 100 && sim.results.empty(); ++i) sim.tick(std::chrono::milliseconds(100));
  REQUIRE(sim.results.size() == 1);
  const auto& r = sim.results[0];
  check_outputs(r, m);
  CHECK(r.attempts == 2);
  CHECK(std::find(r.workers.begin(), r.workers.end(), test::named("c")) == r.workers.end());
  const double waited = std::chrono::duration<double>(sim.now - start).count();
  CHECK(waited >= c_stage);
  CHECK(waited < c_stage + first_stage + 1.0);
  REQUIRE(sim.refused.size() == 1);
  CHECK(sim.refused[0].from == test::named("c"));
  CHECK(sim.refused[0].kind == "run_stage deadline");
  CHECK(sim.refused[0].why.find("stage 2 of job") != std::string::npos);

  // Benched: the next job is planned over a and b only, and runs at once.
  sim.send("cli", {{"a", submission(m, 4)}});
  sim.run();
  REQUIRE(sim.results.size() == 2);
  check_outputs(sim.results[1], m);
  CHECK(sim.results[1].attempts == 1);
  CHECK(std::find(sim.results[1].workers.begin(), sim.results[1].workers.end(), test::named("c")) == sim.results[1].workers.end());
}

TEST_CASE("a benched node gets stages again after the bench time", "[actors][jobs][security]") {
  stage_deadlines d;
  d.factor = 0;
  d.floor = std::chrono::seconds(5);
  d.bench = std::chrono::seconds(60);
  mesh_sim sim({1, 1, 1}, int64_t{1} << 40, d);
  const model m = mlp_job();
  sim.hung.insert("b");
  sim.send("cli", {{"a", submission(m, 1)}});
  sim.run();
  for (int i = 0; i < 20 && sim.results.empty(); ++i) sim.tick(std::chrono::seconds(1));
  REQUIRE(sim.results.size() == 1);
  check_outputs(sim.results[0], m);
  sim.hung.clear();  // b answers again
  sim.tick(std::chrono::seconds(61));
  sim.send("cli", {{"a", submission(m, 2)}});
  sim.run();
  REQUIRE(sim.results.size() == 2);
  check_outputs(sim.results[1], m);
  CHECK(std::find(sim.results[1].workers.begin(), sim.results[1].workers.end(), test::named("b")) != sim.results[1].workers.end());
}

TEST_CASE("stages one coordinator leaves waiting on a worker are bounded, and another coordinator's still run", "[actors][jobs][security]") {
  // Coordinator m hands worker w stages whose activations never come: the 257th is refused at
  // once (limit_exceeded, to m, and counted), and an honest coordinator's stage still runs.
  builder b;
  auto x = b.input("cut.1", dtype::f32, {2});
  b.output("y", x * 2.0);
  const graph g = *b.finish();
  const node_id m = test::named("m"), p = test::named("p"), c = test::named("c");
  job_engine w(test::named("w"), {"w", 1e-6, 1e3, 1e3, int64_t{1} << 30});
  for (uint64_t job = 1; job <= 256; ++job) {
    msg::run_stage r{job, 1, 1, m, graph_payload(wire_graph{g, {}}), {{"cut.1", p}}, {}, 0, {}};
    auto out = w.on_message(m, r, {});
    REQUIRE(out.size() == 1);
    REQUIRE(std::holds_alternative<msg::stage_accepted>(out[0].m));
  }
  CHECK(w.running_stages() == 256);
  msg::run_stage over{257, 1, 1, m, graph_payload(wire_graph{g, {}}), {{"cut.1", p}}, {}, 0, {}};
  auto out = w.on_message(m, over, {});
  REQUIRE(out.size() == 1);
  CHECK(out[0].to == m);
  const auto* done = std::get_if<msg::stage_done>(&out[0].m);
  REQUIRE(done);
  CHECK(done->code == error_code::limit_exceeded);
  CHECK_THAT(done->error, Catch::Contains("256 waiting stages of this coordinator"));
  auto refused = w.take_refused();
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].from == m);
  CHECK(w.running_stages() == 256);
  // Another coordinator is not held to m's count.
  msg::run_stage honest{9, 1, 1, c, graph_payload(wire_graph{g, {}}), {{"cut.1", p}}, {}, 0, {}};
  out = w.on_message(c, honest, {});
  REQUIRE(out.size() == 1);
  CHECK(std::holds_alternative<msg::stage_accepted>(out[0].m));
  CHECK(w.on_message(p, msg::activation{c, 9, 1, 1, {"cut.1", tensor::from_values(dtype::f32, {2}, {1, 2})}}, {}).empty());
  CHECK(w.take_ready().size() == 1);
}
