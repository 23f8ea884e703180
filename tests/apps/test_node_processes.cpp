// Real meshnode processes on loopback: jobs split over three nodes (pipeline, data and tensor
// parallel, with progress), a node killed with SIGKILL,
// bad input from a client, a wrong mesh secret, the executor's supervised restarts, a
// peer's missing hello asked for again, and a job given up on by run()'s timeout whose progress
// reaches no callback after run() returned.
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>

#include "wire/messages.hpp"
#include "graph/nn.hpp"
#include "transport/endpoint.hpp"
#include "node_harness.hpp"
#include "../common/run_command.hpp"

using namespace mesh;
using namespace mesh::test;
using namespace std::chrono_literals;

namespace {

struct job {
  graph g;
  tensor_map inputs, params, reference;
};

job mlp_job(int64_t batch = 32, int64_t width = 64) {
  builder b;
  auto x = b.input("x", dtype::f32, {batch, 16});
  auto m = nn::make_mlp(b, "mlp", {16, width, width, width, 8});
  b.output("probs", nn::softmax(m(x)));
  job j;
  j.g = *b.finish();
  j.params = nn::init_parameters(j.g, 11);
  std::vector<double> xv(static_cast<size_t>(batch * 16));
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::sin(0.1 * static_cast<double>(i));
  j.inputs["x"] = tensor::from_values(dtype::f32, {batch, 16}, xv);
  j.reference = evaluate(j.g, j.inputs, j.params)->outputs;
  return j;
}

/// A bare transport endpoint of this protocol version and of the test mesh on loopback, dialing the node at `endpoint`
/// ("ID@HOST:PORT", whose id is `node`): a peer whose every message the test writes itself.
expected<std::unique_ptr<transport::endpoint>> dial_as_raw_peer(const std::string& endpoint, const node_id& node,
                                                                transport::handlers h) {
  transport::endpoint_config cfg;
  cfg.bind = "127.0.0.1";
  cfg.protocol_version = msg::protocol_version;
  cfg.mesh_secret = test_credential().secret;  // a member of the test mesh, so admission lets it in
  auto ep = transport::endpoint::start(cfg, std::move(h));
  if (ep) (*ep)->dial(node, {endpoint.substr(endpoint.find('@') + 1)});
  return ep;
}

}  // namespace

TEST_CASE("a job split over 3 meshnode processes equals the local reference", "[apps][node]") {
  three_nodes mesh3;
  auto cl = client::connect(mesh3.ea, member_options());
  REQUIRE(cl);
  REQUIRE(wait_for_peers(**cl, 2));
  const job j = mlp_job();
  auto r = (*cl)->run(j.g, j.inputs, j.params, 60s);
  INFO((r ? std::string() : r.error().message));
  REQUIRE(r);
  CHECK(r->workers.size() >= 2);
  CHECK(normalised_error(r->outputs.at("probs"), j.reference.at("probs")) < 1e-5);
  auto s = (*cl)->status();
  REQUIRE(s);
  REQUIRE(s->jobs.size() == 1);
  CHECK(s->jobs[0].state == job_state::done);
}

TEST_CASE("data-parallel, tensor-parallel and automatic jobs over 3 processes, with progress", "[apps][node]") {
  three_nodes mesh3;
  auto cl = client::connect(mesh3.ea, member_options());
  REQUIRE(cl);
  REQUIRE(wait_for_peers(**cl, 2));
  const job j = mlp_job(48, 64);
  for (auto how : {strategy::data_parallel, strategy::tensor_parallel, strategy::automatic}) {
    INFO(to_string(how));
    std::mutex m;
    std::vector<job_progress_info> seen;
    job_options o;
    o.how = how;
    o.timeout = 60s;
    o.on_progress = [&](const job_progress_info& p) {
      std::lock_guard<std::mutex> lock(m);
      seen.push_back(p);
    };
    auto r = (*cl)->run(j.g, j.inputs, j.params, o);
    INFO((r ? std::string() : r.error().message));
    REQUIRE(r);
    if (how != strategy::automatic) {
      CHECK(r->ran_as == how);
      CHECK(r->workers.size() >= 3);  // every node computed part of it
    }
    CHECK(normalised_error(r->outputs.at("probs"), j.reference.at("probs")) < 1e-5);
    // Progress and a small result travel in order on the control stream, and the client calls
    // back before it completes the future: every stage has been reported by now.
    std::lock_guard<std::mutex> lock(m);
    REQUIRE_FALSE(seen.empty());
    CHECK(seen.back().stages_done == seen.back().stages);
    CHECK(seen.size() == seen.back().stages);
  }
  auto s = (*cl)->status();
  REQUIRE(s);
  REQUIRE(s->jobs.size() == 3);
  CHECK(s->jobs[0].kind == job_kind::data_parallel);
  CHECK(s->jobs[1].kind == job_kind::tensor_parallel);
}

TEST_CASE("a node killed with SIGKILL mid-job: the job completes on the survivors", "[apps][node]") {
  three_nodes mesh3;
  auto cl = client::connect(mesh3.ea, member_options());
  REQUIRE(cl);
  REQUIRE(wait_for_peers(**cl, 2));
  // Stages big enough to take a while, so that c dies while computing its stage; a must notice
  // (heartbeats stop), re-plan over a and b, and still answer correctly. (256 x 384 finished
  // within the 150 ms before the kill in half the runs of an unsanitized Debug build; with the CPU
  // executor's blocked GEMM, 512 x 768 ended between two heartbeats in each of 5 attempts once.)
  const job j = mlp_job(1024, 768);
  // The victim is a worker that holds a stage of this job: the plan follows measured speeds and
  // may leave a node out (killing c when the plan used a and b only failed the test in CI).
  // Heartbeats (every 250 ms) report each peer's running stages; a job whose stages all end
  // between two of them is waited for and submitted again, up to 30 times (CI saw none running
  // within 2 s once).
  // A heartbeat is up to 250 ms old when the status shows it: a victim may have delivered its
  // stage before the kill (the job then ends on its first attempt); it is started again from its
  // state directory and the job submitted again.
  std::string victim;
  expected<job_outcome> r = make_error(error_code::internal, "no job submitted");
  for (int round = 0; round < 4; ++round) {
    victim.clear();
    std::future<expected<job_outcome>> pending;
    for (int attempt = 0; attempt < 30 && victim.empty(); ++attempt) {
      pending = (*cl)->submit(j.g, j.inputs, j.params);
      for (int i = 0; i < 500 && victim.empty() && pending.wait_for(0s) != std::future_status::ready; ++i) {
        if (auto s = (*cl)->status())
          for (const auto& p : s->peers)
            if (p.running_stages > 0 && (p.node.to_string() == node_id_of(mesh3.eb) || p.node.to_string() == node_id_of(mesh3.ec)))
              victim = p.node.to_string();
        if (victim.empty()) std::this_thread::sleep_for(10ms);
      }
      if (victim.empty()) REQUIRE(pending.wait_for(120s) == std::future_status::ready);
    }
    REQUIRE_FALSE(victim.empty());
    const bool b_dies = victim == node_id_of(mesh3.eb);
    (b_dies ? mesh3.b : mesh3.c)->kill(SIGKILL);
    REQUIRE(pending.wait_for(120s) == std::future_status::ready);
    r = pending.get();
    INFO((r ? std::string() : r.error().message) << "\nnode a log:\n" << mesh3.a->log());
    REQUIRE(r);
    if (r->attempts != 1) break;
    WARN("round " << round << ": the victim had delivered its stage before the kill; it starts again");
    if (b_dies) {
      mesh3.b = std::make_unique<node_process>(mesh3.tmp.path / "b", std::vector<std::string>{"--peer", mesh3.ea});
      mesh3.eb = mesh3.b->endpoint();
    } else {
      mesh3.c = std::make_unique<node_process>(mesh3.tmp.path / "c", std::vector<std::string>{"--peer", mesh3.ea, "--peer", mesh3.eb});
      mesh3.ec = mesh3.c->endpoint();
    }
    REQUIRE(wait_for_peers(**cl, 2, 60s));
  }
  INFO((r ? std::string() : r.error().message) << "\nnode a log:\n" << mesh3.a->log());
  REQUIRE(r);
  CHECK(r->attempts == 2);
  CHECK(std::find(r->workers.begin(), r->workers.end(), *node_id::parse(victim)) == r->workers.end());
  CHECK(normalised_error(r->outputs.at("probs"), j.reference.at("probs")) < 1e-5);
  CHECK(mesh3.a->running());
  CHECK((victim == node_id_of(mesh3.eb) ? mesh3.c : mesh3.b)->running());  // the survivor
}

TEST_CASE("a malformed, oversized or too costly graph gets a clear error and every node keeps running", "[apps][node]") {
  three_nodes mesh3;
  auto cl = client::connect(mesh3.eb, member_options());
  REQUIRE(cl);
  REQUIRE(wait_for_peers(**cl, 2));
  job bad = mlp_job();
  bad.g.nodes.back().dims = {3, 3};  // the declared shape lies
  auto r = (*cl)->run(bad.g, bad.inputs, bad.params, 30s);
  REQUIRE_FALSE(r);
  INFO(r.error().message);
  CHECK(r.error().message.find("the graph was rejected") != std::string::npos);
  CHECK(r.error().message.find("declared") != std::string::npos);
  job missing = mlp_job();
  missing.inputs.clear();  // a missing input is named
  auto m = (*cl)->run(missing.g, missing.inputs, missing.params, 30s);
  REQUIRE_FALSE(m);
  CHECK(m.error().message.find("\"x\"") != std::string::npos);
  // An oversized graph: a scalar broadcast to 2^34 elements (64 GiB), beyond the node's limits.
  graph huge;
  huge.nodes.resize(2);
  huge.nodes[0].op = op_kind::constant;
  huge.nodes[0].attrs.values = {1.0};
  huge.nodes[1].op = op_kind::broadcast;
  huge.nodes[1].dims = {int64_t{1} << 17, int64_t{1} << 17};
  huge.nodes[1].inputs = {0};
  huge.outputs = {{"y", 1}};
  auto h = (*cl)->run(huge, {}, {}, 30s);
  REQUIRE_FALSE(h);
  INFO(h.error().message);
  CHECK(h.error().message.find("the graph was rejected") != std::string::npos);
  // A FLOP bomb: two 20,000 x 20,000 splats multiplied, a few bytes that ask for 1.6e13 FLOP,
  // past the node's compute budget (--max-job-gflop, 10,000 by default).
  builder fb;
  fb.output("y", matmul(fb.fill(1.0, dtype::f32, {20000, 20000}), fb.fill(2.0, dtype::f32, {20000, 20000})));
  auto bomb = fb.finish();
  REQUIRE(bomb);
  auto f = (*cl)->run(*bomb, {}, {}, 30s);
  REQUIRE_FALSE(f);
  INFO(f.error().message);
  CHECK(f.error().message.find("the graph was rejected") != std::string::npos);
  CHECK(f.error().message.find("more than 10000 GFLOP") != std::string::npos);
  const job j = mlp_job();
  auto ok = (*cl)->run(j.g, j.inputs, j.params, 60s);
  if (!ok) FAIL("a valid job after the bad ones failed: " << ok.error().message);
  CHECK(mesh3.a->running());
  CHECK(mesh3.b->running());
  CHECK(mesh3.c->running());
}

TEST_CASE("a client with the wrong mesh secret is refused", "[apps][node]") {
  temp_dir tmp;
  const auto secret = tmp.path / "secret";
  {
    std::ofstream f(secret);
    f << std::string(64, 'a') << "\n";
  }
  std::filesystem::permissions(secret, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  node_process a(tmp.path / "a", {"--secret-file", secret.string()});
  const std::string ea = a.endpoint();
  client_options wrong;
  wrong.mesh_secret.assign(32, 0xbb);
  auto refused = client::connect(ea, wrong);
  REQUIRE_FALSE(refused);
  INFO(refused.error().message);
  CHECK(refused.error().code == error_code::network);
  client_options right;
  right.mesh_secret.assign(32, 0xaa);
  auto admitted = client::connect(ea, right);
  INFO((admitted ? std::string() : admitted.error().message));
  REQUIRE(admitted);
  CHECK(a.running());
}

TEST_CASE("the supervisor restarts a crashed executor, and gives up after too many crashes", "[apps][node]") {
  temp_dir tmp;
  node_process a(tmp.path / "a");
  const std::string ea = a.endpoint();
  auto cl = client::connect(ea, member_options());
  REQUIRE(cl);
  a.signal(SIGUSR1);  // simulated device loss
  std::this_thread::sleep_for(500ms);
  const job j = mlp_job(4);
  auto r = (*cl)->run(j.g, j.inputs, j.params, 60s);
  INFO((r ? std::string() : r.error().message) << "\n" << a.log());
  REQUIRE(r);
  CHECK(a.log().find("restart 1 of 5") != std::string::npos);
  for (int i = 0; i < 6; ++i) {  // a persistent fault: more crashes than the budget allows
    a.signal(SIGUSR1);
    std::this_thread::sleep_for(300ms);
  }
  CHECK(a.wait_exit(20s) == 3);
  CHECK(a.log().find("stopping the node") != std::string::npos);
}

TEST_CASE("an inference session across 3 nodes serves overlapping calls", "[apps][node]") {
  three_nodes mesh3;
  auto cl = client::connect(mesh3.ec, member_options());
  REQUIRE(cl);
  REQUIRE(wait_for_peers(**cl, 2));
  const job j = mlp_job(8, 128);
  auto session = (*cl)->open_inference(j.g, j.params);
  INFO((session ? std::string() : session.error().message));
  REQUIRE(session);
  CHECK((*session)->workers().size() >= 2);
  std::vector<std::future<expected<job_outcome>>> calls;
  for (int i = 0; i < 8; ++i) calls.push_back((*session)->infer(j.inputs));
  for (auto& f : calls) {
    REQUIRE(f.wait_for(60s) == std::future_status::ready);
    auto r = f.get();
    INFO((r ? std::string() : r.error().message));
    REQUIRE(r);
    CHECK(normalised_error(r->outputs.at("probs"), j.reference.at("probs")) < 1e-5);
  }
}

TEST_CASE("nodes find each other with mDNS, with no peers given", "[apps][node][mdns]") {
  if (std::system("avahi-daemon -c >/dev/null 2>&1") != 0) {
    WARN("skipped: avahi-daemon is not running (./dev.sh test starts it when run as root)");
    return;
  }
  temp_dir tmp;
  // A secret of this test only: the nodes form their own mesh, apart from any other on the LAN.
  const auto secret = tmp.path / "secret";
  std::string hex;
  for (int i = 0; i < 32; ++i) hex += "0123456789abcdef"[(getpid() + i * 7) % 16];
  hex += hex;
  {
    std::ofstream f(secret);
    f << hex << "\n";
  }
  std::filesystem::permissions(secret, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  const std::vector<std::string> args = {"--mdns", "on", "--secret-file", secret.string()};
  node_process a(tmp.path / "a", args), b(tmp.path / "b", args), c(tmp.path / "c", args);
  const std::string ea = a.endpoint();
  const std::string eb = b.endpoint(), ec = c.endpoint();
  client_options opts;
  for (size_t i = 0; i < 64; i += 2) opts.mesh_secret.push_back(static_cast<uint8_t>(std::stoul(hex.substr(i, 2), nullptr, 16)));
  // Every node must see both others (mDNS makes them dial each other at once: a hello lost with
  // the connection dropped as the duplicate used to leave one node short of a peer).
  for (const auto& [e, n] : {std::pair{eb, &b}, std::pair{ec, &c}}) {
    auto other = client::connect(e, opts);
    REQUIRE(other);
    INFO(n->log());
    CHECK(wait_for_peers(**other, 2, std::chrono::seconds(20)));
  }
  auto cl = client::connect(ea, opts);
  INFO((cl ? std::string() : cl.error().message));
  REQUIRE(cl);
  INFO(a.log());
  REQUIRE(wait_for_peers(**cl, 2, std::chrono::seconds(20)));
  const job j = mlp_job();
  auto r = (*cl)->run(j.g, j.inputs, j.params, 60s);
  REQUIRE(r);
  CHECK(normalised_error(r->outputs.at("probs"), j.reference.at("probs")) < 1e-5);
}

TEST_CASE("peer exchange: nodes that know only one peer find the whole mesh", "[apps][node]") {
  temp_dir tmp;
  node_process a(tmp.path / "a");
  const std::string ea = a.endpoint();
  node_process b(tmp.path / "b", {"--peer", ea});
  b.endpoint();
  node_process c(tmp.path / "c", {"--peer", ea});  // c is told only about a
  const std::string ec = c.endpoint();
  auto cl = client::connect(ec, member_options());
  REQUIRE(cl);
  INFO(c.log());
  CHECK(wait_for_peers(**cl, 2, std::chrono::seconds(20)));  // a, and b learned from a
}

TEST_CASE("a peer whose hello does not come is asked for it, and a repeated hello is answered, not joined twice",
          "[apps][node]") {
  // Two nodes that dial each other at once keep one of the two connections; a hello that went
  // out on the other one is lost (the demo's nodes then missed a peer). Here a bare transport
  // endpoint plays a peer that never sends its hello: the node must ask for it (a hello with
  // answer_me), and answer the peer's own repeated hello without a second join.
  temp_dir tmp;
  node_process a(tmp.path / "a");
  const std::string ea = a.endpoint();
  auto node = node_id::parse(node_id_of(ea));
  REQUIRE(node);

  std::mutex mu;
  std::condition_variable cv;
  std::vector<msg::hello> hellos;  // hellos from the node, in arrival order
  bool up = false;
  transport::handlers h;
  h.on_peer_up = [&](const node_id&, const transport::peer_info&) {
    std::lock_guard l(mu);
    up = true;
    cv.notify_all();
  };
  h.on_message = [&](const node_id&, transport::channel, std::vector<uint8_t> bytes) {
    auto m = msg::decode_message(bytes.data(), bytes.size());
    if (!m) return;
    if (auto* hi = std::get_if<msg::hello>(&*m)) {
      std::lock_guard l(mu);
      hellos.push_back(*hi);
      cv.notify_all();
    }
  };
  auto ep = dial_as_raw_peer(ea, *node, h);
  REQUIRE(ep);
  std::unique_lock l(mu);
  REQUIRE(cv.wait_for(l, 20s, [&] { return up && !hellos.empty(); }));
  CHECK_FALSE(hellos[0].answer_me);
  // No hello from us: within a few seconds the node asks for it.
  REQUIRE(cv.wait_for(l, 10s, [&] { return hellos.size() >= 2; }));
  CHECK(hellos[1].answer_me);
  CHECK(hellos[1].incarnation == hellos[0].incarnation);

  // Our hello: the node takes us in, answers our repeat and stops asking.
  msg::hello ours;
  ours.incarnation = 7;
  ours.device_name = "test peer";
  ours.device = device_kind::cpu;
  auto send = [&](const msg::hello& x) {
    auto bytes = msg::encode_message(x);
    REQUIRE(bytes);
    REQUIRE((*ep)->send(*node, transport::channel::control, std::move(*bytes)));
  };
  send(ours);
  l.unlock();
  std::this_thread::sleep_for(1200ms);  // a request already on its way may still arrive
  l.lock();
  const size_t before = hellos.size();
  ours.answer_me = true;
  send(ours);
  REQUIRE(cv.wait_for(l, 10s, [&] { return hellos.size() > before; }));
  CHECK_FALSE(hellos.back().answer_me);  // an answer, not another request
  l.unlock();
  std::this_thread::sleep_for(2500ms);
  l.lock();
  CHECK(hellos.size() == before + 1);  // nothing more: the node has our hello
  l.unlock();
  const std::string log = a.log();
  size_t joins = 0;
  for (size_t p = log.find("joined"); p != std::string::npos; p = log.find("joined", p + 1)) ++joins;
  CHECK(joins == 1);
  CHECK(a.running());
}

TEST_CASE("messages of another protocol version or malformed are refused, logged and counted in meshctl peers",
          "[apps][node]") {
  // A bare transport endpoint plays a member (it says hello) whose later messages the node must
  // refuse: one of protocol version + 1, one that is not a message at all. The connection stays,
  // the node keeps running, and its status (what meshctl peers prints) counts both with the
  // last reason.
  temp_dir tmp;
  node_process a(tmp.path / "a");
  const std::string ea = a.endpoint();
  auto node = node_id::parse(node_id_of(ea));
  REQUIRE(node);
  std::atomic<bool> up{false};
  transport::handlers h;
  h.on_peer_up = [&](const node_id&, const transport::peer_info&) { up = true; };
  auto ep = dial_as_raw_peer(ea, *node, h);
  REQUIRE(ep);
  for (int i = 0; i < 200 && !up; ++i) std::this_thread::sleep_for(50ms);
  REQUIRE(up);
  const std::string me = (*ep)->id().to_string();
  msg::hello ours;
  ours.incarnation = 7;
  ours.device_name = "raw peer";
  auto hello = msg::encode_message(ours);
  REQUIRE(hello);
  REQUIRE((*ep)->send(*node, transport::channel::control, std::move(*hello)));
  auto other_version = *msg::encode_message(msg::heartbeat{7, 1, 0, 0});
  other_version[0] = static_cast<uint8_t>(msg::protocol_version + 1);  // the u16 version, little-endian
  REQUIRE((*ep)->send(*node, transport::channel::control, other_version));
  const std::vector<uint8_t> garbage = {msg::protocol_version & 0xff, msg::protocol_version >> 8, 2, 0xff, 0xff};
  REQUIRE((*ep)->send(*node, transport::channel::control, garbage));

  auto cl = client::connect(ea, member_options());
  REQUIRE(cl);
  std::optional<msg::peer_status> seen;
  for (int i = 0; i < 100; ++i) {
    if (auto s = (*cl)->status())
      for (const auto& p : s->peers)
        if (p.node.to_string() == me && p.refused == 2) seen = p;
    if (seen) break;
    std::this_thread::sleep_for(100ms);
  }
  INFO(a.log());
  REQUIRE(seen);
  CHECK(seen->last_refusal.find("decode_error: submit_job") == 0);
  const std::string log = a.log();
  CHECK(log.find("refused a message from " + me.substr(0, 8) + ": version_mismatch: a message of protocol version " +
                 std::to_string(msg::protocol_version + 1)) != std::string::npos);
  CHECK((*ep)->connected(*node));  // one bad message costs that message, not the connection
  CHECK(a.running());

  // meshctl peers shows the count and the reason.
  auto ctl = run_command(std::string(MESHCTL_BIN) + " --state-dir " + (tmp.path / "a").string() + " peers");
  INFO(ctl.output);
  CHECK(ctl.status == 0);
  CHECK(ctl.output.find("REFUSED") != std::string::npos);
  CHECK(ctl.output.find(me.substr(0, 8) + " refused 2 message(s); last: decode_error") != std::string::npos);
}

TEST_CASE("a job given up on by the timeout of run() reports no progress after run returns", "[apps][node]") {
  temp_dir dir;
  node_process solo(dir.path / "solo");
  auto cl = client::connect(solo.endpoint(), member_options());
  REQUIRE(cl);
  struct counts {
    std::atomic<bool> returned{false};
    std::atomic<int> after{0}, later_job{0};
  };
  auto n = std::make_shared<counts>();
  const job j = mlp_job(64, 128);  // takes far longer than the 1 ms timeout below, and its
                                   // progress comes right after run() has given up
  job_options o;
  o.timeout = 1ms;
  o.on_progress = [n](const job_progress_info&) {
    if (n->returned) ++n->after;
  };
  auto r = (*cl)->run(j.g, j.inputs, j.params, o);
  n->returned = true;
  REQUIRE_FALSE(r);
  CHECK(r.error().code == error_code::timeout);
  // The node still runs the job and reports its stages. A second job, submitted later, finishes
  // after the first one has reported (the node runs them in order); then a little longer still.
  job_options second;
  second.on_progress = [n](const job_progress_info&) { ++n->later_job; };
  auto later = (*cl)->submit(j.g, j.inputs, j.params, second);
  REQUIRE(later.wait_for(120s) == std::future_status::ready);
  CHECK(later.get());
  CHECK(n->later_job > 0);  // progress does flow for a job someone waits for
  std::this_thread::sleep_for(1s);
  CHECK(n->after == 0);
}
