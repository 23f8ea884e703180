// meshnode's settings and its state directory, as a user meets them: bad flags and config files
// are refused with a message that names the problem, one node per state directory, meshctl finds
// a node bound to one address, and a --peer that starts late (or restarts) is reached anyway.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <fstream>

#include "../common/run_command.hpp"
#include "node_harness.hpp"

using namespace mesh;
using namespace mesh::test;
using namespace std::chrono_literals;

namespace {

/// Runs meshnode with `args` (no device measurement happens before settings are checked).
command_result meshnode(const std::string& args) { return run_command(std::string(MESHNODE_BIN) + " " + args); }

/// A UDP port that was free a moment ago.
uint16_t free_udp_port() {
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

void write_file(const std::filesystem::path& p, const std::string& text) { std::ofstream(p) << text; }

}  // namespace

TEST_CASE("meshnode refuses bad settings with a message that names them", "[apps][settings]") {
  temp_dir tmp;
  const std::string dir = " --state-dir " + (tmp.path / "s").string() + " --mdns off --device cpu --port 0";
  struct bad_case {
    std::string args, says;
  };
  const std::string id(64, 'a');
  const std::vector<bad_case> cases = {
      {"--log-level INFOO", "--log-level must be one of"},  // spdlog would have read it as "off"
      {"--peer " + id + "@127.0.0.1", "port"},
      {"--peer " + id + "@127.0.0.1:99999", "port must be 1-65535"},
      {"--peer 127.0.0.1:7420", "must be NODEID@HOST:PORT"},
      {"--heartbeat-ms 2000000000", "--dead-after-ms must exceed"},  // 2 x heartbeat overflowed an int
      {"--blob-cache-bytes 0", "--blob-cache-bytes must be positive"},
      {"--parallel 0", "--parallel must be 1..256"},
      {"--max-job-gflop 0", "--max-job-gflop and --max-job-bytes must be positive"},
  };
  for (const auto& c : cases) {
    INFO(c.args);
    auto r = meshnode(c.args + dir);
    INFO(r.output);
    CHECK(r.status == 2);
    CHECK(r.output.find(c.says) != std::string::npos);
  }
  // Upper-case levels are levels.
  CHECK(meshnode("--log-level WARN --print-id" + dir).status == 0);

  const auto conf = tmp.path / "node.toml";
  const std::vector<bad_case> files = {
      {"port = \"0\"\n", "'port' must be an integer"},
      {"mdns = \"of\"\n", "'mdns' must be"},
      {"peers = \"" + id + "@127.0.0.1:1\"\n", "'peers' must be an array of strings"},
      {"state-dir = \"/tmp/x\"\n", "unknown setting 'state-dir'"},
      {"heartbeat_ms = 99999999999\n", "'heartbeat_ms' must be a smaller integer"},
      {"blob_cache_bytes = \"32G\"\n", "'blob_cache_bytes' must be an integer"},
      {"max_job_gflop = \"lots\"\n", "'max_job_gflop' must be a number"},
      {"parallel = 300\n", "--parallel must be 1..256"},
  };
  for (const auto& c : files) {
    INFO(c.args);
    write_file(conf, c.args);
    auto r = meshnode("--config " + conf.string() + dir);
    INFO(r.output);
    CHECK(r.status == 2);
    CHECK(r.output.find(c.says) != std::string::npos);
  }
  // The command line's spelling works in the file too.
  write_file(conf, "mdns = \"off\"\nport = 0\n");
  CHECK(meshnode("--config " + conf.string() + " --print-id --state-dir " + (tmp.path / "s").string()).status == 0);
}

TEST_CASE("one meshnode per state directory, and meshctl finds a node bound to one address", "[apps][settings]") {
  temp_dir tmp;
  // 127.0.0.2 is this machine too, but a socket bound there does not answer 127.0.0.1.
  node_process a(tmp.path / "a", {"--bind", "127.0.0.2"});
  const std::string ea = a.endpoint();
  CHECK(ea.find("@127.0.0.2:") != std::string::npos);
  auto ctl = run_command(std::string(MESHCTL_BIN) + " --state-dir " + (tmp.path / "a").string() + " status");
  INFO(ctl.output);
  CHECK(ctl.status == 0);

  auto second = meshnode("--state-dir " + (tmp.path / "a").string() + " --mdns off --device cpu --port 0");
  INFO(second.output);
  CHECK(second.status == 2);
  CHECK(second.output.find("another meshnode") != std::string::npos);
  CHECK(a.running());

  // A clean stop removes the endpoint file, so meshctl says at once that no node runs there.
  a.kill(SIGTERM);
  CHECK_FALSE(std::filesystem::exists(tmp.path / "a" / "endpoint"));
  ctl = run_command(std::string(MESHCTL_BIN) + " --state-dir " + (tmp.path / "a").string() + " status");
  CHECK(ctl.status != 0);
  CHECK(ctl.output.find("no running node") != std::string::npos);
}

TEST_CASE("a --peer that starts later, or restarts, is reached without restarting the node", "[apps][settings]") {
  temp_dir tmp;
  const auto a_dir = tmp.path / "a";
  std::filesystem::create_directories(a_dir);
  auto a_id = meshnode("--print-id --state-dir " + a_dir.string());
  REQUIRE(a_id.status == 0);
  a_id.output.pop_back();  // the newline
  const std::string port = std::to_string(free_udp_port());
  node_process b(tmp.path / "b", {"--peer", a_id.output + "@127.0.0.1:" + port});
  auto cb = client::connect(b.endpoint(), member_options());
  REQUIRE(cb);
  std::this_thread::sleep_for(3s);  // b's first dial has nobody to reach
  {
    node_process a(a_dir, {"--port", port});
    a.endpoint();
    INFO(b.log());
    CHECK(wait_for_peers(**cb, 1, 20s));
    a.kill(SIGKILL);
  }
  // b declares a Dead, then keeps dialing it; a comes back on the same port.
  node_process a(a_dir, {"--port", port});
  a.endpoint();
  std::this_thread::sleep_for(1s);
  INFO(b.log());
  CHECK(wait_for_peers(**cb, 1, 30s));
}
