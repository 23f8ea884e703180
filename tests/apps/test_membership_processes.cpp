// Membership needs a credential (docs/security.md): real meshnode processes on loopback attacked
// by strangers without the mesh's token, a node joining with `--join TOKEN` and restarting
// without it, and start-up errors for bad credentials.
#include <atomic>
#include <fstream>
#include <iterator>
#include <mutex>
#include <set>

#include <nlohmann/json.hpp>

#include "graph/nn.hpp"
#include "transport/credential_store.hpp"
#include "transport/endpoint.hpp"
#include "node_harness.hpp"
#include "../common/run_command.hpp"

using namespace mesh;
using namespace mesh::test;
using namespace std::chrono_literals;

namespace {

/// What `meshctl --json peers` prints for the node in `state`, found through its state directory
/// alone (endpoint and mesh.token), as a user on that machine would.
nlohmann::json meshctl_peers_json(const std::filesystem::path& state) {
  const auto r = run_command(std::string(MESHCTL_BIN) + " --state-dir " + state.string() + " --json peers");
  INFO(r.output);
  REQUIRE(r.status == 0);
  // meshctl prints the JSON on standard output; run_command merged standard error after it.
  return nlohmann::json::parse(r.output.substr(0, r.output.rfind(']') + 1));
}

/// The node ids `meshctl --json peers` lists for the node in `state`.
std::set<std::string> meshctl_peers(const std::filesystem::path& state) {
  std::set<std::string> ids;
  for (const auto& p : meshctl_peers_json(state)) ids.insert(p["node"].get<std::string>());
  return ids;
}

/// A small job that every node of a mesh of three takes part in.
bool run_small_job(client& c) {
  builder b;
  auto x = b.input("x", dtype::f32, {24, 8});
  auto m = nn::make_mlp(b, "mlp", {8, 16, 4});
  b.output("y", m(x));
  const graph g = *b.finish();
  const auto params = nn::init_parameters(g, 3);
  std::vector<double> xv(24 * 8);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = 0.01 * static_cast<double>(i);
  const tensor_map inputs{{"x", tensor::from_values(dtype::f32, {24, 8}, xv)}};
  auto r = c.run(g, inputs, params, 60s);
  INFO((r ? std::string() : r.error().message));
  return r.has_value();
}

/// What a bare transport endpoint saw while it tried to join.
struct raw_log {
  std::mutex m;
  int ups = 0, messages = 0, refusals = 0;
};

}  // namespace

TEST_CASE("strangers without the token become no member and the mesh keeps working", "[apps][membership]") {
  three_nodes mesh3;  // a, b, c: members of the test mesh (--join test_token())
  auto cl = client::connect(mesh3.ea, member_options());
  REQUIRE(cl);
  REQUIRE(wait_for_peers(**cl, 2));

  // 1. A real meshnode of another mesh (it creates its own secret) told about every member.
  node_process stranger(mesh3.tmp.path / "stranger", {"--peer", mesh3.ea, "--peer", mesh3.eb, "--peer", mesh3.ec}, false);
  const std::string es = stranger.endpoint();
  // 2. A bare endpoint without any secret (the open mesh's empty one), and one with a wrong secret.
  raw_log seen;
  transport::handlers h;
  h.on_peer_up = [&](const node_id&, const transport::peer_info&) {
    std::lock_guard lock(seen.m);
    ++seen.ups;
  };
  h.on_message = [&](const node_id&, transport::channel, std::vector<uint8_t>) {
    std::lock_guard lock(seen.m);
    ++seen.messages;
  };
  h.on_connect_failed = [&](const std::optional<node_id>&, const std::string&, const std::string&) {
    std::lock_guard lock(seen.m);
    ++seen.refusals;
  };
  std::vector<std::unique_ptr<transport::endpoint>> raws;
  for (int secret_byte : {-1, 0x5a}) {
    transport::endpoint_config cfg;
    cfg.bind = "127.0.0.1";
    cfg.protocol_version = msg::protocol_version;
    if (secret_byte >= 0) cfg.mesh_secret.assign(32, static_cast<uint8_t>(secret_byte));
    auto ep = transport::endpoint::start(cfg, h);
    REQUIRE(ep);
    for (const auto* e : {&mesh3.ea, &mesh3.eb, &mesh3.ec}) {
      auto id = node_id::parse(node_id_of(*e));
      REQUIRE(id);
      (*ep)->dial(*id, {e->substr(e->find('@') + 1)});
    }
    raws.push_back(std::move(*ep));
  }
  // 3. A client without the token, and one with a token of another mesh.
  auto open_client = client::connect(mesh3.ea, {.mesh_secret = {}, .connect_timeout = 3s, .idle_timeout = 5s, .mesh_id = {}});
  CHECK_FALSE(open_client);
  const auto other = transport::new_mesh_credential();
  auto other_client = client::connect(mesh3.eb, {.mesh_secret = other.secret, .connect_timeout = 3s, .idle_timeout = 5s, .mesh_id = other.mesh_id});
  CHECK_FALSE(other_client);

  // Time for every dial (and the stranger's redials) to be tried and refused.
  std::this_thread::sleep_for(4s);
  {
    std::lock_guard lock(seen.m);
    CHECK(seen.ups == 0);
    CHECK(seen.messages == 0);
    CHECK(seen.refusals >= 1);
  }
  // Sending without admission goes nowhere.
  auto a_id = node_id::parse(node_id_of(mesh3.ea));
  REQUIRE(a_id);
  CHECK_FALSE(raws[0]->send(*a_id, transport::channel::control, std::vector<uint8_t>{1, 2, 3}));

  // The members see each other and nobody else, as `meshctl peers` shows it.
  const std::set<std::string> members = {node_id_of(mesh3.ea), node_id_of(mesh3.eb), node_id_of(mesh3.ec)};
  for (const auto* dir : {"a", "b", "c"}) {
    INFO("node " << dir);
    const auto peers = meshctl_peers(mesh3.tmp.path / dir);
    CHECK(peers.size() == 2);
    CHECK_FALSE(peers.count(node_id_of(es)));
    for (const auto& p : peers) CHECK(members.count(p));
    // Each peer's heartbeats carried its free device memory (what split plans share layers by).
    for (const auto& p : meshctl_peers_json(mesh3.tmp.path / dir)) {
      INFO(p.dump());
      CHECK(p["free_memory_bytes"].get<uint64_t>() > 0);
      CHECK(p["free_memory_bytes"].get<uint64_t>() <= p["memory_bytes"].get<uint64_t>());
    }
  }
  // The stranger is alone in its own mesh.
  CHECK(meshctl_peers(mesh3.tmp.path / "stranger").empty());
  // And the members still work together.
  CHECK(run_small_job(**cl));
  CHECK(stranger.running());
}

TEST_CASE("a node joins with --join TOKEN and restarts without the flag", "[apps][membership]") {
  temp_dir tmp;
  // The first node: no credential anywhere, so it creates a mesh and keeps its token.
  node_process a(tmp.path / "a", {}, false);
  const std::string ea = a.endpoint();
  CHECK(a.log().find("created a new mesh") != std::string::npos);
  const auto invite = run_command(std::string(MESHCTL_BIN) + " --state-dir " + (tmp.path / "a").string() + " invite 2>/dev/null");
  INFO(invite.output);
  REQUIRE(invite.status == 0);
  const std::string token = invite.output.substr(0, invite.output.find('\n'));
  REQUIRE(transport::decode_join_token(token));

  auto b = std::make_unique<node_process>(tmp.path / "b", std::vector<std::string>{"--join", token, "--peer", ea}, false);
  const std::string eb = b->endpoint();
  CHECK(b->log().find("from the --join token") != std::string::npos);
  // meshctl and the client API find the credential in the node's state directory.
  auto options = options_for_local_node(tmp.path / "a");
  REQUIRE(options);
  auto cl = client::connect(ea, *options);
  REQUIRE(cl);
  REQUIRE(wait_for_peers(**cl, 1));
  CHECK(meshctl_peers(tmp.path / "b") == std::set<std::string>{node_id_of(ea)});

  // Restart b with no credential flag: it uses the token it kept.
  b.reset();
  b = std::make_unique<node_process>(tmp.path / "b", std::vector<std::string>{"--peer", ea}, false);
  const std::string eb2 = b->endpoint();
  CHECK(node_id_of(eb2) == node_id_of(eb));
  CHECK(b->log().find("token in the state directory") != std::string::npos);
  // A --join aimed at the state directory of the running b is refused before it writes there:
  // b keeps its token.
  const auto token_of_b = [&] {
    std::ifstream f(tmp.path / "b" / transport::credential_file_name);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  const std::string kept = token_of_b();
  REQUIRE_FALSE(kept.empty());
  const auto clash = run_command(std::string(MESHNODE_BIN) + " --device cpu --mdns off --port 0 --state-dir " +
                                 (tmp.path / "b").string() + " --join " + test_token());
  INFO(clash.output);
  CHECK(clash.status == 2);
  CHECK(clash.output.find("another meshnode") != std::string::npos);
  CHECK(token_of_b() == kept);  // test_token() is another mesh than a's
  const auto until = std::chrono::steady_clock::now() + 30s;
  bool back = false;
  while (!back && std::chrono::steady_clock::now() < until) {
    const auto peers = meshctl_peers(tmp.path / "a");
    back = peers.count(node_id_of(eb2)) == 1;
    if (!back) std::this_thread::sleep_for(200ms);
  }
  CHECK(back);
}

TEST_CASE("meshnode refuses a mistyped token and conflicting credentials at start", "[apps][membership]") {
  temp_dir tmp;
  const std::string node = std::string(MESHNODE_BIN) + " --device cpu --mdns off --port 0 --state-dir " + (tmp.path / "n").string();
  std::string typo = test_token();
  typo[20] = typo[20] == 'a' ? 'b' : 'a';
  auto r = run_command(node + " --join " + typo);
  CHECK(r.status == 2);
  CHECK(r.output.find("checksum") != std::string::npos);
  r = run_command(node + " --join not-a-token");
  CHECK(r.status == 2);
  CHECK(r.output.find("not a meshnode join token") != std::string::npos);
  r = run_command(node + " --open --join " + test_token());
  CHECK(r.status == 2);
  CHECK(r.output.find("exclude each other") != std::string::npos);
  // A state directory that is a symbolic link is refused.
  std::filesystem::create_directories(tmp.path / "real");
  std::filesystem::create_directory_symlink(tmp.path / "real", tmp.path / "link");
  r = run_command(std::string(MESHNODE_BIN) + " --device cpu --mdns off --port 0 --state-dir " + (tmp.path / "link").string());
  CHECK(r.status == 2);
  CHECK(r.output.find("symbolic link") != std::string::npos);
}

TEST_CASE("an open mesh is a choice the node warns about", "[apps][membership]") {
  temp_dir tmp;
  node_process a(tmp.path / "a", {"--open"});
  const std::string ea = a.endpoint();
  CHECK(a.log().find("open mesh (--open)") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(tmp.path / "a" / transport::credential_file_name));
  auto cl = client::connect(ea, {});  // no credential needed
  CHECK(cl);
}
