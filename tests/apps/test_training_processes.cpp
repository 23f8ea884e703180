// Training across real meshnode processes: data parallel over 3 nodes equals a 1-node run (also
// a 1M-parameter model in buckets, the ring's passes on several threads per node), a
// peer killed with SIGKILL mid-training leaves the run complete with every step applied once,
// the coordinating node killed the same way leaves the run to a survivor (coordinator failover;
// also when the first node the client tries is dead too), a peer restarted mid-run rejoins and
// the run still ends where a 1-node run does,
// a checkpoint saved, loaded and resumed continues the same loss curve, a training given up
// on by its timeout calls none of fit()'s callbacks after fit() returned, and a member forging a
// takeover of the run is refused while the run finishes.
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>

#include "client/trainer.hpp"
#include "graph/datasets.hpp"
#include "graph/nn.hpp"
#include "graph/safetensors.hpp"
#include "node_harness.hpp"
#include "training_problem.hpp"
#include "transport/endpoint.hpp"

using namespace mesh;
using namespace mesh::test;
using namespace std::chrono_literals;

TEST_CASE("data-parallel training over 3 meshnode processes equals a single node", "[apps][train]") {
  const auto p = moons();
  const auto reference = single_node_state(p, 20);

  three_nodes mesh;
  auto c = client::connect(mesh.ea, member_options());
  REQUIRE(c);
  REQUIRE(wait_for_peers(**c, 2));
  std::vector<train_progress_info> seen;
  auto r = trainer(**c, p.model, p.params, p.data, options(20)).fit([&](const train_progress_info& i) { seen.push_back(i); });
  INFO((r ? "" : r.error().message));
  REQUIRE(r);
  CHECK(r->workers.size() == 3);
  REQUIRE(seen.size() == 20);
  CHECK(seen.back().peers == 3);
  CHECK(seen.back().bytes_sent > 0);
  CHECK(r->state.at("opt.adam.t").at(0) == 20.0);
  CHECK(max_difference(r->state, reference) < 1e-4);
  CHECK(r->losses.back() < r->losses.front());
  // The trained model, evaluated by one-shot jobs on the mesh.
  auto before = evaluate_loss(**c, p.model, p.params, p.data);
  auto after = evaluate_loss(**c, p.model, parameters_only(r->state), p.data);
  REQUIRE(before);
  REQUIRE(after);
  CHECK(*after < *before * 0.8);
  // The three processes share this host: their pieces went through shared memory.
  int shared = 0;
  for (const auto* n : {mesh.a.get(), mesh.b.get(), mesh.c.get()}) shared += n->log().find("go through shared memory") != std::string::npos;
  CHECK(shared == 3);
}

namespace {

/// The two-moons problem with an MLP of two hidden layers `width` wide (2 - width - width - 2):
/// a model large enough for several buckets.
problem wide_moons(int64_t width) {
  problem p = moons();
  builder b;
  auto x = b.input("x", dtype::f32, {16, 2});
  auto labels = b.input("labels", dtype::i32, {16});
  auto net = nn::make_mlp(b, "mlp", {2, width, width, 2});
  b.output("loss", nn::cross_entropy(net(x), labels));
  p.model = *b.finish();
  p.params = nn::init_parameters(p.model, 5);
  return p;
}

}  // namespace

TEST_CASE("a 1M-parameter model in buckets over 3 meshnode processes, around the ring and then through the host all-reduce, "
          "equals a single node",
          "[apps][train]") {
  // Pieces of the 1024 x 1024 weight's bucket are 87K values, so each ring pass is split into
  // parts that the nodes' host-copy threads share (MESH_COPY_THREADS; this host's default is
  // one thread), and each bucket's sum is written into the accumulators as its round ends.
  // Once every node maps the others' regions (the first two steps), the steps sum through them
  // (host_reduce.hpp): each bucket read back into the node's region, its sum written to the
  // device from the three regions.
  const problem p = wide_moons(1024);
  const uint64_t steps = 6;
  const auto reference = single_node_state(p, steps);
  ::setenv("MESH_COPY_THREADS", "3", 1);
  three_nodes mesh;
  ::unsetenv("MESH_COPY_THREADS");
  auto c = client::connect(mesh.ea, member_options());
  REQUIRE(c);
  REQUIRE(wait_for_peers(**c, 2));
  auto o = options(steps);
  o.bucket_bytes = 1 << 20;  // the big weight a bucket of its own, the others around it
  auto r = trainer(**c, p.model, p.params, p.data, o).fit();
  INFO((r ? "" : r.error().message));
  REQUIRE(r);
  if (r->workers.size() != 3)  // what each node saw
    for (const auto* n : {mesh.a.get(), mesh.b.get(), mesh.c.get()}) WARN("node log:\n" << n->log());
  CHECK(r->workers.size() == 3);
  CHECK(r->state.at("opt.adam.t").at(0) == static_cast<float>(steps));
  CHECK(max_difference(r->state, reference) < 1e-4);
  int shared = 0, host = 0;
  for (const auto* n : {mesh.a.get(), mesh.b.get(), mesh.c.get()}) {
    shared += n->log().find("go through shared memory") != std::string::npos;
    host += n->log().find("summed through their shared memory (host all-reduce)") != std::string::npos;
  }
  CHECK(shared == 3);
  CHECK(host == 3);
}

TEST_CASE("on a discrete GPU's path 3 meshnode processes copy the host all-reduce's buckets and sums beside the kernels, "
          "and equal a single node",
          "[apps][train][vulkan]") {
  // Vulkan (lavapipe) with its memory not mapped (MESH_MAP_DEVICE_MEMORY=off), as a discrete
  // GPU's: once every node maps the others' regions, each device imports them, reads its buckets
  // into its region and writes the sums from the three on its copy queue while the executor goes
  // on, and the executor actor hands each result over once its copy is done.
  const problem p = wide_moons(256);
  const uint64_t steps = 6;
  const auto reference = single_node_state(p, steps);
  ::setenv("MESH_MAP_DEVICE_MEMORY", "off", 1);
  three_nodes mesh({"--device", "vulkan"});
  ::unsetenv("MESH_MAP_DEVICE_MEMORY");
  auto c = client::connect(mesh.ea, member_options());
  REQUIRE(c);
  REQUIRE(wait_for_peers(**c, 2));
  auto o = options(steps);
  o.bucket_bytes = 1 << 16;  // the 256 x 256 weight a bucket of its own, the others around it
  auto r = trainer(**c, p.model, p.params, p.data, o).fit();
  INFO((r ? "" : r.error().message));
  REQUIRE(r);
  CHECK(r->workers.size() == 3);
  CHECK(max_difference(r->state, reference) < 1e-4);
  int host = 0, imported = 0, beside = 0;
  for (const auto* n : {mesh.a.get(), mesh.b.get(), mesh.c.get()}) {
    host += n->log().find("summed through their shared memory (host all-reduce)") != std::string::npos;
    imported += n->log().find("the device copies gradients and sums to and from 3 shared regions itself") != std::string::npos;
    beside += n->log().find("writes their sums beside its kernels") != std::string::npos;
  }
  if (imported != 3 || beside != 3)
    for (const auto* n : {mesh.a.get(), mesh.b.get(), mesh.c.get()}) WARN("node log:\n" << n->log());
  CHECK(host == 3);
  CHECK(imported == 3);
  CHECK(beside == 3);
}

TEST_CASE("with --shared-memory off every all-reduce piece crosses the transport, and the result is the same", "[apps][train]") {
  const auto p = moons();
  const auto reference = single_node_state(p, 12);
  three_nodes mesh({"--shared-memory", "off"});
  auto c = client::connect(mesh.ea, member_options());
  REQUIRE(c);
  REQUIRE(wait_for_peers(**c, 2));
  auto r = trainer(**c, p.model, p.params, p.data, options(12)).fit();
  INFO((r ? "" : r.error().message));
  REQUIRE(r);
  CHECK(r->workers.size() == 3);
  CHECK(max_difference(r->state, reference) < 1e-4);
  for (const auto* n : {mesh.a.get(), mesh.b.get(), mesh.c.get()}) CHECK(n->log().find("shared memory") == std::string::npos);
}

TEST_CASE("a peer killed with SIGKILL mid-training: the run completes with every step applied once",
          "[apps][train]") {
  const auto p = moons();
  three_nodes mesh;
  auto c = client::connect(mesh.ea, member_options());
  REQUIRE(c);
  REQUIRE(wait_for_peers(**c, 2));
  bool killed = false;
  uint32_t peers_at_end = 0;
  auto r = trainer(**c, p.model, p.params, p.data, options(60)).fit([&](const train_progress_info& i) {
    if (i.step == 10 && !killed) {
      mesh.c->kill(SIGKILL);
      killed = true;
    }
    peers_at_end = i.peers;
  });
  INFO((r ? "" : r.error().message));
  REQUIRE(r);
  CHECK(killed);
  CHECK(r->state.at("opt.adam.t").at(0) == 60.0);
  CHECK(r->step == 60);  // the step the coordinator reached, which Adam's counter confirms
  CHECK(r->losses.size() == 60);
  CHECK(peers_at_end == 2);
  CHECK(mesh.a->running());
  CHECK(mesh.b->running());
}

TEST_CASE("checkpoint save -> load -> resume continues the same loss curve, also from a checkpoint taken mid-run", "[apps][train]") {
  const auto p = moons();
  temp_dir dir;
  node_process node(dir.path / "n");
  auto c = client::connect(node.endpoint(), member_options());
  REQUIRE(c);
  // The straight run also saves a checkpoint every 8 steps from its callback, as a user would.
  auto straight_options = options(24);
  std::vector<uint64_t> saved;
  straight_options.checkpoint_every = 8;
  straight_options.on_checkpoint = [&](uint64_t step, const tensor_map& state) {
    const auto f = dir.path / ("every8-" + std::to_string(step) + ".safetensors");
    if (save_safetensors(f, {state, {{"step", std::to_string(step)}}})) saved.push_back(step);
  };
  auto straight = trainer(**c, p.model, p.params, p.data, straight_options).fit();
  REQUIRE(straight);
  CHECK(saved == std::vector<uint64_t>{8, 16});

  auto first = trainer(**c, p.model, p.params, p.data, options(12)).fit();
  REQUIRE(first);
  const auto file = dir.path / "ckpt.safetensors";
  CHECK(first->step == 12);
  REQUIRE(save_safetensors(file, {first->state, {{"step", std::to_string(first->step)}}}));
  auto loaded = load_safetensors(file);
  REQUIRE(loaded);
  CHECK(loaded->metadata.at("step") == "12");
  auto o = options(24);
  o.start_step = std::stoull(loaded->metadata.at("step"));
  auto second = trainer(**c, p.model, loaded->tensors, p.data, o).fit();
  INFO((second ? "" : second.error().message));
  REQUIRE(second);
  CHECK(second->step == 24);
  REQUIRE(second->losses.size() == 12);
  for (size_t i = 0; i < 12; ++i) CHECK(second->losses[i] == Approx(straight->losses[12 + i]).epsilon(1e-5));
  CHECK(max_difference(second->state, straight->state) < 1e-5);

  // Resumed from the checkpoint the straight run saved at step 16: the same last 8 steps.
  auto mid = load_safetensors(dir.path / "every8-16.safetensors");
  REQUIRE(mid);
  auto o16 = options(24);
  o16.start_step = std::stoull(mid->metadata.at("step"));
  CHECK(o16.start_step == 16);
  auto third = trainer(**c, p.model, mid->tensors, p.data, o16).fit();
  INFO((third ? "" : third.error().message));
  REQUIRE(third);
  REQUIRE(third->losses.size() == 8);
  for (size_t i = 0; i < 8; ++i) CHECK(third->losses[i] == Approx(straight->losses[16 + i]).epsilon(1e-5));
  CHECK(max_difference(third->state, straight->state) < 1e-5);
}

TEST_CASE("a peer restarted mid-training rejoins with the current parameters", "[apps][train]") {
  const auto p = moons();
  const auto reference = single_node_state(p, 400);

  three_nodes mesh;
  auto c = client::connect(mesh.ea, member_options());
  REQUIRE(c);
  REQUIRE(wait_for_peers(**c, 2));
  enum { before, killed, restarted } phase = before;
  std::vector<uint32_t> peers;
  auto r = trainer(**c, p.model, p.params, p.data, options(400)).fit([&](const train_progress_info& i) {
    peers.push_back(i.peers);
    if (phase == before && i.step == 10) {
      mesh.c->kill(SIGKILL);
      phase = killed;
    } else if (phase == killed && i.peers == 2) {
      // Same state directory, so the same node id: a crashed node coming back.
      mesh.c = std::make_unique<node_process>(mesh.tmp.path / "c", std::vector<std::string>{"--peer", mesh.ea});
      phase = restarted;
    }
  });
  INFO((r ? "" : r.error().message));
  REQUIRE(r);
  REQUIRE(phase == restarted);
  CHECK(r->state.at("opt.adam.t").at(0) == 400.0);
  CHECK(r->step == 400);
  CHECK(std::find(peers.begin(), peers.end(), 2u) != peers.end());
  CHECK(peers.back() == 3);  // it was set up with the state of the moment and used again
  CHECK(r->workers.size() == 3);
  // Every step summed the same micro-batches as on one node; only which worker summed which (and
  // so the order of the float additions) changed with the membership. A rejoined node that
  // started from stale or zero state would be off by far more than rounding.
  CHECK(max_difference(r->state, reference) < 1e-4);
}

TEST_CASE("the coordinating node killed with SIGKILL mid-training: a survivor takes the run over",
          "[apps][train]") {
  const auto p = moons();
  const auto reference = single_node_state(p, 60);

  three_nodes mesh;
  auto c = client::connect(mesh.ea, member_options());  // node a coordinates the run
  REQUIRE(c);
  REQUIRE(wait_for_peers(**c, 2));
  bool killed = false;
  uint32_t peers_at_end = 0;
  auto r = trainer(**c, p.model, p.params, p.data, options(60)).fit([&](const train_progress_info& i) {
    if (i.step == 10 && !killed) {
      mesh.a->kill(SIGKILL);
      killed = true;
    }
    peers_at_end = i.peers;
  });
  INFO((r ? "" : r.error().message));
  REQUIRE(r);
  CHECK(killed);
  CHECK((*c)->node().to_string() != node_id_of(mesh.ea));  // moved to the node that took over
  CHECK(r->state.at("opt.adam.t").at(0) == 60.0);  // every step applied exactly once
  CHECK(r->step == 60);                            // as the new coordinator reports
  CHECK(max_difference(r->state, reference) < 1e-4);
  CHECK(r->losses.size() == 60);
  CHECK(peers_at_end == 2);
  CHECK(mesh.b->running());
  CHECK(mesh.c->running());
}

TEST_CASE("the coordinator and the first node the client tries both killed: the last survivor takes over",
          "[apps][train]") {
  const auto p = moons();
  const auto reference = single_node_state(p, 60);

  three_nodes mesh;
  auto c = client::connect(mesh.ea, member_options());
  REQUIRE(c);
  REQUIRE(wait_for_peers(**c, 2));
  // The client tries the other nodes in the order of their ids (the status report's order):
  // kill the coordinator and the first of those, so that the client's first dial fails.
  const bool b_first = node_id_of(mesh.eb) < node_id_of(mesh.ec);
  const std::string survivor = node_id_of(b_first ? mesh.ec : mesh.eb);
  bool killed = false;
  auto r = trainer(**c, p.model, p.params, p.data, options(60)).fit([&](const train_progress_info& i) {
    if (i.step == 10 && !killed) {
      mesh.a->kill(SIGKILL);
      (b_first ? mesh.b : mesh.c)->kill(SIGKILL);
      killed = true;
    }
  });
  INFO((r ? "" : r.error().message));
  REQUIRE(r);
  CHECK(killed);
  CHECK((*c)->node().to_string() == survivor);
  CHECK(r->state.at("opt.adam.t").at(0) == 60.0);
  CHECK(max_difference(r->state, reference) < 1e-4);
  CHECK(r->losses.size() == 60);
  CHECK(r->workers == std::vector<node_id>{*node_id::parse(survivor)});
}

TEST_CASE("a node that lost the run refuses the takeover and the client tries the next one", "[apps][train]") {
  const auto p = moons();
  three_nodes mesh;
  auto c = client::connect(mesh.ea, member_options());
  REQUIRE(c);
  REQUIRE(wait_for_peers(**c, 2));
  const auto port_of = [](const std::string& endpoint) { return endpoint.substr(endpoint.rfind(':') + 1); };
  // The first node the client will try (lowest id) is restarted at once on the same port: it is
  // reachable and has the same id, but a fresh process holds nothing of the run.
  const bool b_first = node_id_of(mesh.eb) < node_id_of(mesh.ec);
  const std::string fresh = b_first ? "b" : "c", other = node_id_of(b_first ? mesh.ec : mesh.eb);
  const std::string fresh_port = port_of(b_first ? mesh.eb : mesh.ec), other_endpoint = b_first ? mesh.ec : mesh.eb;
  bool done = false;
  auto r = trainer(**c, p.model, p.params, p.data, options(60)).fit([&](const train_progress_info& i) {
    if (i.step == 10 && !done) {
      mesh.a->kill(SIGKILL);
      auto& node = b_first ? mesh.b : mesh.c;
      node->kill(SIGKILL);
      node = std::make_unique<node_process>(mesh.tmp.path / fresh,
                                            std::vector<std::string>{"--port", fresh_port, "--peer", other_endpoint});
      done = true;
    }
  });
  INFO((r ? "" : r.error().message));
  REQUIRE(r);
  CHECK(done);
  CHECK((*c)->node().to_string() == other);  // the restarted node said no; the other one took the run over
  CHECK(r->state.at("opt.adam.t").at(0) == 60.0);
  CHECK(r->losses.size() == 60);
}

TEST_CASE("a training given up on by its timeout calls back nothing after fit returns", "[apps][train]") {
  // fit()'s callbacks capture its stack frame and the trainer: a progress or checkpoint message
  // the node sends after fit gave up must not reach them (the node keeps the run going, since
  // nothing tells it to stop). Counted through shared state, so that the test means something
  // without AddressSanitizer too; under it, a call into the dead frame is reported as well.
  const auto p = moons();
  temp_dir dir;
  node_process solo(dir.path / "solo");
  auto c = client::connect(solo.endpoint(), member_options());
  REQUIRE(c);
  struct counts {
    std::atomic<bool> returned{false};
    std::atomic<int> progress{0}, progress_after{0}, checkpoints{0}, checkpoints_after{0};
  };
  auto n = std::make_shared<counts>();
  auto o = options(1000000);  // far more than fits in the timeout
  o.timeout = 2s;
  o.checkpoint_every = 1;
  o.on_checkpoint = [n](uint64_t, const tensor_map&) {
    ++n->checkpoints;
    if (n->returned) ++n->checkpoints_after;
  };
  {
    // The trainer, its options and the progress function all die with this scope.
    auto r = trainer(**c, p.model, p.params, p.data, o).fit([n](const train_progress_info&) {
      ++n->progress;
      if (n->returned) ++n->progress_after;
    });
    n->returned = true;
    REQUIRE_FALSE(r);
    CHECK(r.error().code == error_code::timeout);
  }
  CHECK(n->progress > 0);  // the run was going when fit gave up...
  CHECK(n->checkpoints > 0);
  std::this_thread::sleep_for(3s);  // ...and the node keeps sending its progress
  CHECK(n->progress_after == 0);
  CHECK(n->checkpoints_after == 0);
  // The client is still usable.
  CHECK((*c)->status());
}

TEST_CASE("a member forging a takeover of a 3-node run is refused and the run finishes", "[apps][train][security]") {
  // The malicious member: a bare endpoint with the mesh's credential that speaks the protocol. It
  // learns the run's client and id from a status report, as any member can, and sends every node
  // a valid setup of that run at a higher generation, with a grant it made up. Before takeovers
  // needed the client's signed grant, that ended the run on every worker and marked the
  // coordinator's run moved: fit() waited out its timeout.
  const auto p = moons();
  three_nodes mesh;
  auto c = client::connect(mesh.ea, member_options());
  REQUIRE(c);
  REQUIRE(wait_for_peers(**c, 2));

  std::atomic<int> ups{0};
  transport::handlers h;
  h.on_peer_up = [&](const node_id&, const transport::peer_info&) { ++ups; };
  transport::endpoint_config cfg;
  cfg.bind = "127.0.0.1";
  cfg.protocol_version = msg::protocol_version;
  cfg.mesh_secret = test_credential().secret;
  auto evil = transport::endpoint::start(cfg, h);
  REQUIRE(evil);
  std::vector<node_id> nodes;
  for (const auto* e : {&mesh.ea, &mesh.eb, &mesh.ec}) {
    auto id = node_id::parse(node_id_of(*e));
    REQUIRE(id);
    nodes.push_back(*id);
    (*evil)->dial(*id, {e->substr(e->find('@') + 1)});
  }
  for (int i = 0; i < 100 && ups < 3; ++i) std::this_thread::sleep_for(100ms);
  REQUIRE(ups == 3);
  // No Catch2 assertion inside: the attacker's thread uses it too.
  std::atomic<int> unsent{0};
  const auto send = [&](const node_id& to, const msg::message& m) {
    auto bytes = msg::encode_message(m);
    if (!bytes) {
      ++unsent;
      return;
    }
    const auto ch = bytes->size() > msg::max_control_message ? transport::channel::bulk : transport::channel::control;
    if (!(*evil)->send(to, ch, std::move(*bytes))) ++unsent;
  };
  msg::hello hi;
  hi.is_client = true;  // so that no node plans work onto it
  for (const auto& n : nodes) send(n, hi);

  // A setup any node would take: the run's own graphs and state, the dataset's columns without rows.
  auto spec = make_train_spec(p.model, p.params, p.data, 16, options(60));
  REQUIRE(spec);
  spec->dataset_rows = static_cast<uint64_t>(spec->dataset.at(0).value.dims.at(0));
  for (auto& column : spec->dataset) {
    shape none = column.value.dims;
    none[0] = 0;
    column.value = tensor::zeros(column.value.type, none);
  }
  std::atomic<bool> started{false};
  std::atomic<int> forged{0};
  std::thread attacker([&] {
    for (int i = 0; i < 600 && !started; ++i) std::this_thread::sleep_for(50ms);
    auto spy = client::connect(mesh.ea, member_options());
    if (!spy) return;
    auto status = (*spy)->status();
    if (!status) return;
    for (const auto& j : status->jobs) {
      if (j.kind != job_kind::training || j.state != job_state::running) continue;
      msg::train_setup forged_setup{999, *spec, j.client, j.job, {1, (*evil)->id(), {}}};
      for (const auto& n : nodes) send(n, forged_setup);
      ++forged;
    }
  });
  auto r = trainer(**c, p.model, p.params, p.data, options(60)).fit([&](const train_progress_info& i) {
    if (i.step >= 2) started = true;
  });
  attacker.join();
  INFO((r ? "" : r.error().message));
  REQUIRE(forged == 1);
  CHECK(unsent == 0);
  REQUIRE(r);
  CHECK(r->state.at("opt.adam.t").at(0) == 60.0);
  CHECK(r->step == 60);
  CHECK(r->losses.size() == 60);
  CHECK(r->workers.size() == 3);
  // Every node refused the setup, logged why, and went on.
  const std::string line = "refused train_setup from " + (*evil)->id().short_string();
  for (auto* n : {mesh.a.get(), mesh.b.get(), mesh.c.get()}) {
    bool logged = false;
    for (int i = 0; i < 50 && !logged; ++i) {
      logged = n->log().find(line) != std::string::npos;
      if (!logged) std::this_thread::sleep_for(100ms);
    }
    INFO(n->log());
    CHECK(logged);
    CHECK(n->running());
  }
  (*evil)->stop();
}
