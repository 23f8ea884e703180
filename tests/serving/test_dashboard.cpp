// The node's own pages end to end: a real server (tiny model, CPU executor) on 127.0.0.1.
// /metrics after real completions, checked by Prometheus's `promtool check metrics` and for the
// counts the completions produced; /api/mesh and the key; the dashboard rendered by a headless
// Chromium from a 3-node snapshot (the DOM must show what the page's JavaScript drew from the
// JSON), and a screenshot. A missing promtool or chromium exits 77 with the reason: ctest
// reports the test as skipped, not passed.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "serving_fixture.hpp"

using namespace mesh;
using namespace mesh::serving;
using namespace mesh::serving::test;
using json = nlohmann::json;

namespace {

/// Exits 77 (skipped, reason printed) when `program` is not installed. Called before anything
/// is started, so that nothing is left running.
void require_program(const std::string& program, const std::string& package) {
  if (mesh::test::run_command("command -v " + program).status == 0) return;
  std::cerr << "SKIPPED: " << program << " is not installed (Debian package " << package
            << "; ./dev.sh deps installs it)" << std::endl;
  std::exit(77);
}

node_view node(std::string id, std::string device, std::string health, double rtt_ms, uint64_t memory) {
  node_view n;
  n.id = std::move(id);
  n.device = std::move(device);
  n.self = health == "self";
  n.health = std::move(health);
  n.rtt_ms = rtt_ms;
  n.memory_bytes = memory;
  if (!n.self) {
    n.address = "10.0.0.2:7000";
    n.bytes_sent = 123456;
    n.bytes_received = 654321;
  }
  return n;
}

const std::string self_id = "5e1f00d5e1f00d5e1f00d5e1f00d0001";
const std::string healthy_id = "beefcafebeefcafebeefcafebeef0002";
const std::string suspect_id = "0ddba11c0ddba11c0ddba11c0ddb0003";

/// A mesh of 3 nodes as a node would describe it: this one, a healthy and a suspect peer; one
/// model split into 2 stages; one training run with its losses.
mesh_snapshot three_node_mesh() {
  mesh_snapshot m;
  m.uptime_s = 3725;
  m.nodes = {node(self_id, "llvmpipe (cpu)", "self", 0, uint64_t{16} << 30),
             node(healthy_id, "NVIDIA H100 (vulkan)", "healthy", 1.25, uint64_t{80} << 30),
             node(suspect_id, "AMD RX 7900 (vulkan)", "suspect", 48.5, uint64_t{24} << 30)};
  model_view model;
  model.id = "llama-split";
  model.layers = 16;
  model.context = 4096;
  model.stages = {{self_id, 0, 6}, {healthy_id, 6, 16}};
  m.models = {model};
  training_view t;
  t.run = 7;
  t.state = "running";
  t.step = 6;
  t.steps = 100;
  t.loss = {4.5, 3.9, 3.1, 2.6, 2.4, 2.2};
  m.trainings = {t};
  return m;
}

std::string metric_line(const std::string& text, const std::string& series) {
  const auto at = text.find("\n" + series + " ");
  if (at == std::string::npos) return "";
  const auto end = text.find('\n', at + 1);
  return text.substr(at + 1 + series.size() + 1, end - at - series.size() - 2);
}

}  // namespace

TEST_CASE("metrics: promtool accepts /metrics after a streamed and a plain completion, counts match",
          "[serving][metrics][promtool]") {
  require_program("promtool", "prometheus");
  server_options o;
  o.snapshot = three_node_mesh;
  served_model served(o);
  const auto scratch = served.dir.path();

  auto plain = curl(scratch, served.url("/v1/completions"),
                    R"({"model": "tiny", "prompt": "Once upon a time", "max_tokens": 10, "temperature": 0})");
  REQUIRE(plain.status == 200);
  const auto pj = json::parse(plain.body);
  auto streamed = curl(scratch, served.url("/v1/chat/completions"),
                       R"({"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 12,
                           "seed": 3, "stream": true, "stream_options": {"include_usage": true}})",
                       "-N");
  REQUIRE(streamed.status == 200);
  const auto events = parse_sse(streamed.body);
  REQUIRE(events.done);
  const auto& usage = events.events.back().at("usage");
  // Pieces: the chunks between the role chunk and the finish and usage chunks.
  const auto pieces = static_cast<int64_t>(events.events.size()) - 3;
  REQUIRE(pieces >= 1);
  REQUIRE(!pj.at("choices")[0].at("text").get<std::string>().empty());  // so it had a first piece

  // A stream's request is counted after its last byte is written, which the client may see
  // first: wait for it to appear.
  std::string text;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  do {
    auto m = curl(scratch, served.url("/metrics"), "");
    REQUIRE(m.status == 200);
    text = m.body;
    if (metric_line(text, R"(meshnode_http_requests_total{route="/v1/chat/completions",status="200"})") == "1") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  } while (std::chrono::steady_clock::now() < end);
  INFO(text);
  models::test::write_file(scratch / "metrics.txt", text);
  auto check = mesh::test::run_command("promtool check metrics < '" + (scratch / "metrics.txt").string() + "'");
  INFO(check.output);
  CHECK(check.status == 0);
  CHECK(check.output.empty());  // no lint complaints either

  const int64_t prompt = pj.at("usage").at("prompt_tokens").get<int64_t>() + usage.at("prompt_tokens").get<int64_t>();
  const int64_t completion =
      pj.at("usage").at("completion_tokens").get<int64_t>() + usage.at("completion_tokens").get<int64_t>();
  CHECK(metric_line(text, R"(meshnode_http_requests_total{route="/v1/completions",status="200"})") == "1");
  CHECK(metric_line(text, R"(meshnode_http_requests_total{route="/v1/chat/completions",status="200"})") == "1");
  CHECK(metric_line(text, R"(meshnode_prompt_tokens_total{model="tiny"})") == std::to_string(prompt));
  CHECK(metric_line(text, R"(meshnode_completion_tokens_total{model="tiny"})") == std::to_string(completion));
  CHECK(metric_line(text, R"(meshnode_time_to_first_token_seconds_count{model="tiny"})") == "2");
  CHECK(metric_line(text, R"(meshnode_time_to_first_token_seconds_bucket{model="tiny",le="+Inf"})") == "2");
  // Gaps: one fewer than the pieces of each request; the streamed one's pieces are known.
  const auto gaps = std::stoll(metric_line(text, R"(meshnode_inter_token_latency_seconds_count{model="tiny"})"));
  CHECK(gaps >= pieces - 1);
  CHECK(metric_line(text, R"(meshnode_request_duration_seconds_count{route="/v1/completions"})") == "1");
  CHECK(metric_line(text, R"(meshnode_request_duration_seconds_count{route="/v1/chat/completions"})") == "1");
  CHECK(metric_line(text, R"(meshnode_queue_requests{state="running"})") == "0");
  CHECK(metric_line(text, R"(meshnode_queue_requests{state="waiting"})") == "0");
  CHECK(metric_line(text, R"(meshnode_peers{health="healthy"})") == "1");
  CHECK(metric_line(text, R"(meshnode_peers{health="suspect"})") == "1");
  CHECK(metric_line(text, R"(meshnode_peers{health="dead"})") == "0");
  CHECK(metric_line(text, "meshnode_peer_rtt_seconds{peer=\"" + suspect_id + "\"}") == "0.0485");
  CHECK(metric_line(text, "meshnode_peer_sent_bytes_total{peer=\"" + healthy_id + "\"}") == "123456");
  CHECK(metric_line(text, "meshnode_peer_received_bytes_total{peer=\"" + healthy_id + "\"}") == "654321");
  CHECK(metric_line(text, "meshnode_models_loaded") == "1");
  CHECK(metric_line(text, R"(meshnode_training_steps_total{run="7"})") == "6");
  CHECK(metric_line(text, R"(meshnode_training_loss{run="7"})") == "2.2");
  CHECK(metric_line(text, "meshnode_uptime_seconds") == "3725");
}

TEST_CASE("api/mesh and metrics need the key when one is set, the page does not", "[serving][metrics]") {
  server_options o;
  o.api_key = "sk-dash";
  o.snapshot = three_node_mesh;
  served_model served(o);
  const auto scratch = served.dir.path();
  const std::string key = "-H 'Authorization: Bearer sk-dash'";

  auto page = curl(scratch, served.url("/"), "", "-D '" + (scratch / "headers.txt").string() + "'");
  CHECK(page.status == 200);
  CHECK(page.body.find(R"(<span id="node-count">)") != std::string::npos);
  const auto headers = read_text(scratch / "headers.txt");
  CHECK(headers.find("text/html") != std::string::npos);
  CHECK(headers.find("Content-Security-Policy: default-src 'none'") != std::string::npos);
  // Nothing on the page comes from elsewhere: no URL but the SVG namespace's name, no external
  // script, style sheet, font or image.
  std::string page_text = page.body;
  for (size_t at; (at = page_text.find("http://www.w3.org/2000/svg")) != std::string::npos;) page_text.erase(at, 26);
  for (const char* outside : {"http://", "https://", "<script src", "<link", "@import", "url("}) {
    INFO(outside);
    CHECK(page_text.find(outside) == std::string::npos);
  }

  for (const char* path : {"/api/mesh", "/metrics"}) {
    INFO(path);
    auto refused = curl(scratch, served.url(path), "");
    CHECK(refused.status == 401);
    CHECK(json::parse(refused.body).at("error").at("code") == "invalid_api_key");
    CHECK(curl(scratch, served.url(path), "", "-H 'Authorization: Bearer wrong'").status == 401);
    CHECK(curl(scratch, served.url(path), "", key).status == 200);
  }

  auto mesh_reply = curl(scratch, served.url("/api/mesh"), "", key);
  const auto j = json::parse(mesh_reply.body);
  REQUIRE(j.at("nodes").size() == 3);
  CHECK(j.at("nodes")[0].at("id") == self_id);
  CHECK(j.at("models")[0].at("stages").size() == 2);
  CHECK(j.at("trainings")[0].at("loss").size() == 6);
  CHECK(j.at("serving").at("models")[0].at("id") == "tiny");
  CHECK(j.at("serving").at("series").at("requests").size() == 120);
  // The 401s above were answered and counted (by route and status).
  auto m = curl(scratch, served.url("/metrics"), "", key);
  CHECK(metric_line(m.body, R"(meshnode_http_requests_total{route="/api/mesh",status="401"})") == "2");
}

TEST_CASE("api/mesh without a mesh: no nodes, this process's models", "[serving][metrics]") {
  served_model served;
  auto r = curl(served.dir.path(), served.url("/api/mesh"), "");
  REQUIRE(r.status == 200);
  const auto j = json::parse(r.body);
  CHECK(j.at("nodes").empty());
  REQUIRE(j.at("models").size() == 1);
  CHECK(j.at("models")[0].at("id") == "tiny");
  CHECK(j.at("models")[0].at("context") == tiny_spec().context);
  CHECK(j.at("models")[0].at("stages").empty());
  CHECK(j.at("trainings").empty());
  CHECK(j.at("uptime_s").get<double>() >= 0);
}

namespace {

/// This process's children: after Chromium's main process has exited (popen's child is reaped
/// by pclose), the helpers it left (the crash handler detaches itself) that were handed to us.
std::vector<pid_t> children() {
  std::vector<pid_t> out;
  const std::string me = std::to_string(::getpid());
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string pid = entry.path().filename();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::istringstream status(read_text(entry.path() / "status"));
    for (std::string line; std::getline(status, line);)
      if (line.rfind("PPid:", 0) == 0) {
        if (line.substr(line.find_first_not_of(" \t", 5)) == me) out.push_back(std::stoi(pid));
        break;
      }
  }
  return out;
}

/// Ends and reaps every process Chromium left behind. As a subreaper this process adopts them
/// (instead of init, which here does not reap them promptly), so none outlives the test.
void end_left_behind() {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (auto left = children(); !left.empty() && std::chrono::steady_clock::now() < until; left = children()) {
    for (const pid_t p : left) {
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
    }
  }
}

/// Headless Chromium on `url`, as root needs it (no sandbox) and with its profile in `dir`:
/// `what` is --dump-dom or --screenshot=FILE.
mesh::test::command_result chromium(const std::filesystem::path& dir, const std::string& url, const std::string& what) {
  const std::string profile = (dir / "chromium-profile").string();
  const std::string cmd = "HOME='" + dir.string() + "' timeout -k 5 90 chromium --headless --no-sandbox --disable-gpu " +
                          "--disable-dev-shm-usage --no-first-run --no-default-browser-check --disable-extensions " +
                          "--user-data-dir='" + profile + "' --virtual-time-budget=5000 --window-size=1280,900 " + what +
                          " '" + url + "'";
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  auto r = mesh::test::run_command(cmd);
  end_left_behind();
  return r;
}

}  // namespace

TEST_CASE("dashboard: headless chromium renders the nodes, models and runs of a 3-node mesh", "[serving][dashboard]") {
  require_program("chromium", "chromium");
  server_options o;
  o.snapshot = three_node_mesh;
  served_model served(o);
  const auto scratch = served.dir.path();

  auto dom = chromium(scratch, served.url("/"), "--dump-dom");
  INFO(dom.output);
  REQUIRE(dom.status == 0);
  // Drawn by the page's script from /api/mesh: the static page says "…" until it ran.
  CHECK(dom.output.find(R"(<span id="node-count">3</span> <span id="node-count-label">nodes</span>)") != std::string::npos);
  for (const auto& id : {self_id, healthy_id, suspect_id}) {
    CHECK(dom.output.find("data-node-id=\"" + id + "\"") != std::string::npos);
    CHECK(dom.output.find(id.substr(0, 12)) != std::string::npos);
  }
  CHECK(dom.output.find(R"(<td class="h-suspect"><span class="dot"></span>suspect</td>)") != std::string::npos);
  CHECK(dom.output.find(R"(<td class="h-healthy"><span class="dot"></span>healthy</td>)") != std::string::npos);
  CHECK(dom.output.find("48.5 ms") != std::string::npos);          // a link's round-trip time
  CHECK(dom.output.find("llama-split") != std::string::npos);      // the model and its 2 stages
  CHECK(dom.output.find(": layers 0–5 (6)") != std::string::npos);
  CHECK(dom.output.find(": layers 6–15 (10)") != std::string::npos);
  CHECK(dom.output.find("run 7") != std::string::npos);            // the training run and its last loss
  CHECK(dom.output.find("loss 2.20") != std::string::npos);
  CHECK(dom.output.find("<polyline") != std::string::npos);         // its loss curve
  CHECK(dom.output.find(R"(<div id="status" class="">updated )") != std::string::npos);  // no fetch error shown

  // A screenshot, kept in the build tree for a person to look at.
  const std::filesystem::path png = MESH_SERVING_SCREENSHOT;
  std::filesystem::remove(png);
  auto shot = chromium(scratch, served.url("/"), "--screenshot='" + png.string() + "'");
  INFO(shot.output);
  REQUIRE(shot.status == 0);
  REQUIRE(std::filesystem::exists(png));
  const std::string bytes = read_text(png);
  REQUIRE(bytes.size() > 24);
  CHECK(bytes.substr(0, 8) == "\x89PNG\r\n\x1a\n");
  auto be32 = [&](size_t at) {
    return (uint32_t(uint8_t(bytes[at])) << 24) | (uint32_t(uint8_t(bytes[at + 1])) << 16) |
           (uint32_t(uint8_t(bytes[at + 2])) << 8) | uint32_t(uint8_t(bytes[at + 3]));
  };
  CHECK(be32(16) == 1280);  // IHDR width and height
  CHECK(be32(20) == 900);
  // A blank page compresses to a few kilobytes; tables, text and charts do not.
  CHECK(bytes.size() > 30000);
}
