// mesh-demo: the README's first command. Starts meshnode processes on this machine that find each
// other by mDNS (static peers when avahi-daemon is not running), trains a small character-level
// transformer across them on additions the program writes itself, plots the loss, answers
// held-out sums through pipelined inference, and stops the nodes.
//
//   mesh-demo [--nodes 3] [--steps 600] [--digits 2] [--device cpu] [--out demo-out] (--help: all options)
//   mesh-demo --serve [--model PATH]   no training: serve a model over the HTTP API until Ctrl-C
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <stdexcept>
#include <thread>

#include "apps/addition_model.hpp"
#include "apps/app_settings.hpp"
#include "apps/demo_llm.hpp"
#include "apps/local_mesh.hpp"
#include "apps/progress_bar.hpp"
#include "apps/svg_plot.hpp"
#include "client/trainer.hpp"
#include "graph/nn.hpp"
#include "graph/safetensors.hpp"

using namespace mesh;

namespace {

int fail(const std::string& what) {
  std::fprintf(stderr, "\nmesh-demo: %s\n", what.c_str());
  return 1;
}

bool avahi_running() { return std::system("avahi-daemon --check >/dev/null 2>&1") == 0; }

std::atomic<bool> interrupted{false};
extern "C" void on_interrupt(int) { interrupted = true; }

/// Output of a shell command (standard output only), or an error.
expected<std::string> capture(const std::string& command) {
  FILE* p = ::popen(command.c_str(), "r");
  if (!p) return make_error(error_code::io_error, "cannot run " + command);
  std::string out;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  if (status != 0) return make_error(error_code::io_error, "`" + command + "` failed (status " + std::to_string(status) + ")");
  return out;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

/// The serving step: the first node loads `model` (or the demo's random chat model, written into
/// `out`), then the demo asks its HTTP API with curl, the very line it prints for the user.
/// With `keep`, the nodes go on serving until Ctrl-C (or `seconds`, when > 0).
int serve(client& c, const std::string& out, std::string model, const char* step, bool keep, int seconds) {
  if (model.empty()) {
    model = std::filesystem::absolute(std::filesystem::path(out) / "chat-model").string();
    if (auto ok = demo::write_random_chat_model(model); !ok) return fail(ok.error().message);
    std::printf("%s serving: wrote a 4-layer Llama-architecture model with random weights to %s\n", step, model.c_str());
    std::printf("   (its text is noise: `--model PATH` serves a real GGUF file or Hugging Face directory)\n");
  } else {
    model = std::filesystem::absolute(model).string();
    std::printf("%s serving %s\n", step, model.c_str());
  }
  msg::models_request q;
  q.action = models_action::load;
  q.target = model;
  auto r = c.models(q, std::chrono::minutes(30));
  if (!r) return fail("the node could not load " + model + ": " + r.error().message);
  if (r->api_url.empty()) return fail("the first node has no HTTP API");
  std::string id;
  for (const auto& m : r->models)
    if (m.path == model) id = m.id;
  std::printf("   loaded as \"%s\" on node %s\n", id.c_str(), c.node().short_string().c_str());
  const std::string body = nlohmann::json{{"model", id},
                                          {"messages", {{{"role", "user"}, {"content", "Hello, mesh!"}}}},
                                          {"max_tokens", 24}}
                               .dump();
  const std::string line = "curl -s " + r->api_url + "/v1/chat/completions -H 'Content-Type: application/json' -d " + shell_quote(body);
  auto answer = capture(line);
  if (!answer) return fail("the HTTP API did not answer: " + answer.error().message);
  const auto j = nlohmann::json::parse(*answer, nullptr, false);
  if (j.is_discarded() || !j.contains("choices")) return fail("the HTTP API answered: " + *answer);
  std::printf("   dashboard: %s/   metrics: %s/metrics\n   try it:\n   %s\n", r->api_url.c_str(), r->api_url.c_str(), line.c_str());
  std::printf("   it answered (%lld tokens): %s\n", static_cast<long long>(j["usage"].value("completion_tokens", 0)),
              j["choices"][0]["message"]["content"].dump().c_str());
  if (!keep) return 0;
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  std::printf("   serving%s; Ctrl-C stops the nodes\n",
              seconds > 0 ? (" for " + std::to_string(seconds) + " s").c_str() : "");
  std::fflush(stdout);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (!interrupted && (seconds <= 0 || std::chrono::steady_clock::now() < until))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  return 0;
}

}  // namespace

int run_demo(int argc, char** argv) {
  CLI::App cli{"mesh-demo: train a small transformer across local meshnode processes"};
  int nodes = 3, steps = 600, digits = 2, layers = 1;
  int64_t channels = 32;
  uint32_t micro_batches = 3;
  int64_t batch = 64;
  double lr = 1e-2;
  std::string device = "cpu", out = "demo-out", method = "dp";
  bool mdns = true, serve_only = false;
  std::string serve_model;
  int serve_seconds = 0;
  cli.add_flag("--serve", serve_only, "no training: load a model on the mesh and serve it over the HTTP API until Ctrl-C");
  cli.add_option("--model", serve_model, "the checkpoint to serve (default: a small random-weight model the demo writes)");
  cli.add_option("--serve-seconds", serve_seconds, "with --serve: stop after this many seconds (0: at Ctrl-C)")->check(CLI::Range(0, 86400));
  cli.add_option("--nodes", nodes, "meshnode processes to start")->check(CLI::Range(1, 16));
  cli.add_option("--steps", steps, "training steps")->check(CLI::Range(1, 1000000));
  cli.add_option("--digits", digits, "digits of each operand")->check(CLI::Range(1, 6));
  cli.add_option("--layers", layers, "transformer blocks")->check(CLI::Range(1, 12));
  cli.add_option("--channels", channels, "transformer width")->check(CLI::Range(8, 1024));
  cli.add_option("--micro-batches", micro_batches, "micro-batches per step")->check(CLI::Range(1, 256));
  cli.add_option("--batch", batch, "lines per micro-batch")->check(CLI::Range(1, 4096));
  cli.add_option("--lr", lr, "Adam learning rate")->check(CLI::Range(1e-6, 1.0));
  cli.add_option("--method", method, "dp (data parallel) or diloco")->check(CLI::IsMember({"dp", "diloco"}));
  cli.add_option("--device", device, "device of every node: cpu, auto, or a Vulkan device name");
  cli.add_option("--out", out, "folder for the nodes' state, the loss plot and the checkpoint");
  cli.add_flag("!--no-mdns", mdns, "use static peers instead of mDNS");
  CLI11_PARSE(cli, argc, argv);

  const auto t_start = std::chrono::steady_clock::now();
  std::filesystem::create_directories(out);
  if (mdns && !avahi_running()) {
    std::printf("avahi-daemon is not running: the nodes use static peers instead of mDNS.\n");
    mdns = false;
  }

  // 1. The nodes.
  const std::string binary = app::meshnode_beside(argv[0]);
  std::printf("1. starting %d meshnode processes (%s device; peers found by %s)\n", nodes, device.c_str(),
              mdns ? "mDNS" : "static --peer");
  std::vector<std::unique_ptr<app::node_process>> procs;
  std::string first, token;
  client_options member;
  for (int i = 0; i < nodes; ++i) {
    // Each run starts its nodes with fresh state (identity, logs): the demo's nodes are its own,
    // and an identity left by an earlier run (perhaps copied with other permissions) is not reused.
    const auto dir = std::filesystem::path(out) / ("node" + std::to_string(i + 1));
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
    // The first node creates a new mesh (its fresh state directory holds no token); the others
    // join it with the token it keeps, as `meshctl invite` would print it. The demo's nodes thus
    // form their own mesh, apart from any other meshnode on the LAN.
    std::vector<std::string> args = {"--port", "0", "--device", device, "--mdns",
                                     mdns ? "on" : "off", "--log-level", "info"};
    // The first node serves the HTTP API (127.0.0.1:8080, or a free port when that is taken).
    if (i > 0) args.insert(args.end(), {"--api-bind", "off", "--join", token});
    if (!mdns && i > 0) args.insert(args.end(), {"--peer", first});
    procs.push_back(std::make_unique<app::node_process>(binary, dir, args));
    if (i == 0) {
      auto ep = procs[0]->endpoint();
      if (!ep) return fail(ep.error().message);
      first = *ep;
      auto local = options_for_local_node(dir);
      if (!local || local->mesh_secret.empty()) return fail("the first node kept no mesh token in " + dir.string());
      member = *local;
      token = transport::encode_join_token({member.mesh_id, member.mesh_secret});
    }
  }
  for (auto& p : procs)
    if (auto ep = p->endpoint(); !ep) return fail(ep.error().message);
  auto c = client::connect(first, member);
  if (!c) return fail("cannot connect to the first node: " + c.error().message);
  // Wait until the first node sees every other one as healthy.
  size_t healthy = 0;
  for (int i = 0; i < 300 && healthy + 1 < static_cast<size_t>(nodes); ++i) {
    auto st = (*c)->status();
    healthy = 0;
    if (st)
      for (const auto& p : st->peers) healthy += p.health == mesh::peer_health::healthy;
    if (healthy + 1 < static_cast<size_t>(nodes)) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (healthy + 1 < static_cast<size_t>(nodes))
    return fail("only " + std::to_string(healthy + 1) + " of " + std::to_string(nodes) + " nodes found each other in 30 s; logs in " + out);
  const double found_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  std::printf("   %d nodes form a mesh after %.1f s\n", nodes, found_s);

  if (serve_only) {
    const int rc = serve(**c, out, serve_model, "2.", true, serve_seconds);
    if (rc != 0) return rc;
    c->reset();
    for (auto& p : procs) p->stop();
    std::printf("3. stopped the nodes. Logs: %s/node*/node.log\n", out.c_str());
    return 0;
  }

  // 2. The data and the model.
  demo::addition_task task;
  task.digits = digits;
  task.layers = layers;
  task.channels = channels;
  task.batch = batch;
  std::vector<std::string> train_lines, test_lines;
  demo::make_corpus(task, 1, 0.1, train_lines, test_lines);
  const graph model = demo::make_training_model(task);
  const tensor_map params = nn::init_parameters(model, 7);
  int64_t n_params = 0;
  for (const auto& [name, t] : params) n_params += t.size();
  std::printf("2. corpus: %zu lines like \"%s\" (%zu held out); model: %d-layer transformer, %lld parameters\n",
              train_lines.size(), train_lines[0].c_str(), test_lines.size(), layers, static_cast<long long>(n_params));

  // 3. Training across the mesh.
  train_options o;
  o.steps = static_cast<uint64_t>(steps);
  o.micro_batches = micro_batches;
  o.method = method == "diloco" ? train_method::diloco : train_method::data_parallel;
  o.inner_steps = 10;
  o.optimizer = optim::adam_options{.lr = lr};
  std::printf("3. training (%s, %u x %lld lines per step):\n", method == "dp" ? "data parallel" : "DiLoCo", micro_batches,
              static_cast<long long>(task.batch));
  std::vector<std::pair<double, double>> curve;
  trainer t(**c, model, params, demo::make_dataset(task, train_lines), o);
  auto result = t.fit([&](const train_progress_info& p) {
    curve.emplace_back(static_cast<double>(p.step), p.loss);
    std::printf("\r   [%s] step %4llu/%llu  loss %.3f  %6.0f samples/s  peers %u ", app::progress_bar(static_cast<double>(p.step) / p.steps).c_str(),
                static_cast<unsigned long long>(p.step), static_cast<unsigned long long>(p.steps), p.loss, p.samples_per_s, p.peers);
    std::fflush(stdout);
  });
  std::printf("\n");
  if (!result) return fail("training failed: " + result.error().message);
  std::printf("   %llu steps in %.1f s on %zu nodes; all-reduce sent %.1f MB\n", static_cast<unsigned long long>(result->step),
              result->seconds, result->workers.size(), static_cast<double>(result->bytes_sent) / 1e6);
  const std::string plot = (std::filesystem::path(out) / "loss.svg").string();
  if (app::write_line_plot_svg(plot, curve, "meshnode demo: training loss (answer characters)", "step", "cross-entropy"))
    std::printf("   loss plot: %s\n", plot.c_str());
  const std::string ckpt = (std::filesystem::path(out) / "model.safetensors").string();
  if (auto ok = save_safetensors(ckpt, {result->state, {{"step", std::to_string(result->step)}}}); ok)
    std::printf("   checkpoint: %s\n", ckpt.c_str());

  // 4. Held-out sums through a pipelined inference session: up to 4 calls of 64 lines, fewer
  // and smaller where the corpus holds fewer (--digits 1 holds out 10 lines).
  if (test_lines.empty()) return fail("the corpus holds no held-out line to answer");
  const int64_t rows = std::min<int64_t>(64, static_cast<int64_t>(test_lines.size()));
  const int64_t calls = std::min<int64_t>(4, static_cast<int64_t>(test_lines.size()) / rows);
  auto session = (*c)->open_inference(demo::make_inference_model(task, rows), parameters_only(result->state));
  if (!session) return fail("cannot open the inference session: " + session.error().message);
  std::printf("4. answering %lld held-out sums through a pipeline over %zu node(s):\n", static_cast<long long>(calls * rows),
              (*session)->workers().size());
  std::vector<std::string> completed;
  for (int64_t k = 0; k < calls; ++k) {
    std::vector<std::string> prompts(test_lines.begin() + k * rows, test_lines.begin() + (k + 1) * rows);
    std::string error;
    auto lines = demo::complete(task, prompts, [&](const tensor& x) {
      auto r = (*session)->infer({{"x", x}}).get();
      if (!r) {
        error = r.error().message;
        return tensor{};
      }
      return r->outputs.at("logits");
    });
    if (!error.empty()) return fail("inference failed: " + error);
    completed.insert(completed.end(), lines.begin(), lines.end());
  }
  for (size_t i = 0; i < 8 && i < completed.size(); ++i)
    std::printf("   %s  %s\n", completed[i].c_str(), demo::score({completed[i]}) > 0 ? "right" : "wrong");
  const double share = demo::score(completed);
  std::printf("   score: %.1f%% of %zu held-out sums right\n", 100 * share, completed.size());

  // 5. Serving: the OpenAI-compatible API of the first node, asked with curl.
  session->reset();
  if (const int rc = serve(**c, out, serve_model, "5.", false, 0); rc != 0) return rc;

  // 6. Done.
  c->reset();
  for (auto& p : procs) p->stop();
  std::printf("6. stopped the nodes; %.0f s in all. Logs: %s/node*/node.log\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count(), out.c_str());
  return 0;
}

int main(int argc, char** argv) {
  // Caught here so that the stack unwinds: the node processes' destructors stop them (an
  // exception escaping main() may terminate without unwinding).
  try {
    return run_demo(argc, argv);
  } catch (const std::exception& e) {
    return fail(std::string("unexpected error: ") + e.what());
  } catch (...) {
    return fail("unexpected error");
  }
}
