// meshctl: shows and steers the mesh as a node sees it.
//
//   meshctl peers | status | jobs | top      readable tables (top refreshes every second)
//   meshctl invite                           the join token of the local node's mesh (meshnode --join TOKEN)
//   meshctl --json peers                     the same as JSON, for scripts
//   meshctl generate MODEL "prompt" [...]    text from a checkpoint on the node, streamed (--adapter DIR: with a LoRA)
//   meshctl models [load PATH [--split N] | unload ID | replan ID --split N]
//                                            the models the node serves (HTTP API, generate)
//   meshctl train --model M --data F --out D fine-tune a checkpoint across the mesh (apps/meshctl_train.hpp)
//   meshctl runs                             the training runs started here, their checkpoints
// The node is --node NODEID@HOST:PORT, or the local node's <state-dir>/endpoint file; the mesh
// credential is --secret-file, or the token the local node keeps in <state-dir>/mesh.token.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <filesystem>
#include <iostream>
#include <thread>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "app_settings.hpp"
#include "apps/meshctl_train.hpp"
#include "client/client.hpp"
#include "transport/join_token.hpp"

namespace {

nlohmann::json to_json(const mesh::msg::status_reply& s) {
  nlohmann::json j{{"node", s.node.to_string()}, {"device", s.device}, {"gflops", s.gflops}, {"memory_bytes", s.memory_bytes},
                   {"free_memory_bytes", s.free_memory_bytes}, {"uptime_s", s.uptime_s}};
  j["peers"] = nlohmann::json::array();
  for (const auto& p : s.peers)
    j["peers"].push_back({{"node", p.node.to_string()}, {"health", to_string(p.health)}, {"address", p.address}, {"device", p.device},
                          {"gflops", p.gflops}, {"memory_bytes", p.memory_bytes}, {"free_memory_bytes", p.free_memory_bytes},
                          {"running_stages", p.running_stages}, {"rtt_ms", p.rtt_ms},
                          {"packets_lost", p.packets_lost}, {"relayed", p.relayed}, {"refused", p.refused},
                          {"last_refusal", p.last_refusal}});
  j["jobs"] = nlohmann::json::array();
  for (const auto& x : s.jobs)
    j["jobs"].push_back({{"job", x.job}, {"client", x.client.to_string()}, {"state", to_string(x.state)}, {"stages", x.stages},
                         {"attempts", x.attempts}, {"seconds", x.seconds}, {"kind", to_string(x.kind)},
                         {"step", x.step}, {"steps", x.steps}});
  return j;
}

void print_peers(const mesh::msg::status_reply& s) {
  // Memory as "free/size" in GB (powers of 1000): a split model's layers go where it is free.
  const auto memory = [](uint64_t free, uint64_t size) { return fmt::format("{:.1f}/{:.1f}", static_cast<double>(free) / 1e9, static_cast<double>(size) / 1e9); };
  std::printf("%-10s %-8s %-22s %-24s %9s %13s %7s %8s %6s %-6s %7s\n", "NODE", "HEALTH", "ADDRESS", "DEVICE", "GFLOP/S", "FREE/MEM GB",
              "STAGES", "RTT ms", "LOST", "PATH", "REFUSED");
  std::printf("%-10s %-8s %-22s %-24s %9.2f %13s %7s %8s %6s %-6s %7s\n", (s.node.short_string() + "*").c_str(), "self", "-",
              s.device.substr(0, 24).c_str(), s.gflops, memory(s.free_memory_bytes, s.memory_bytes).c_str(), "-", "-", "-", "-", "-");
  for (const auto& p : s.peers)
    std::printf("%-10s %-8s %-22s %-24s %9.2f %13s %7u %8.3f %6llu %-6s %7llu\n", p.node.short_string().c_str(), to_string(p.health),
                p.address.c_str(), p.device.substr(0, 24).c_str(), p.gflops, memory(p.free_memory_bytes, p.memory_bytes).c_str(),
                p.running_stages, p.rtt_ms, static_cast<unsigned long long>(p.packets_lost), p.relayed ? "relay" : "direct",
                static_cast<unsigned long long>(p.refused));
  // Why messages were refused: another protocol version, past the decode budget, malformed.
  for (const auto& p : s.peers)
    if (p.refused) std::printf("%s refused %llu message(s); last: %s\n", p.node.short_string().c_str(),
                               static_cast<unsigned long long>(p.refused), p.last_refusal.c_str());
}

void print_jobs(const mesh::msg::status_reply& s) {
  std::printf("%-6s %-10s %-16s %-8s %7s %9s %9s\n", "JOB", "CLIENT", "KIND", "STATE", "STAGES", "ATTEMPTS", "SECONDS");
  for (const auto& j : s.jobs) {
    // A running training shows its progress in place of the state.
    const std::string state = j.kind == mesh::job_kind::training && j.state == mesh::job_state::running
                                  ? std::to_string(j.step) + "/" + std::to_string(j.steps)
                                  : to_string(j.state);
    std::printf("%-6llu %-10s %-16s %-8s %7u %9u %9.3f\n", static_cast<unsigned long long>(j.job), j.client.short_string().c_str(),
                to_string(j.kind), state.c_str(), j.stages, j.attempts, j.seconds);
  }
}

void print_status(const mesh::msg::status_reply& s) {
  int healthy = 0, suspect = 0, dead = 0, running = 0;
  for (const auto& p : s.peers) (p.health == mesh::peer_health::healthy ? healthy : p.health == mesh::peer_health::suspect ? suspect : dead)++;
  for (const auto& j : s.jobs) running += j.state == mesh::job_state::running;
  std::printf("node     %s\ndevice   %s, %.2f GFLOP/s\nuptime   %.0f s\npeers    %d healthy, %d suspect, %d dead\njobs     %d running, %zu known\n",
              s.node.to_string().c_str(), s.device.c_str(), s.gflops, s.uptime_s, healthy, suspect, dead, running, s.jobs.size());
}

void print_models(const mesh::msg::models_reply& r, const std::string& node) {
  std::printf("%-24s %6s %8s %-5s %s\n", "MODEL", "LAYERS", "CONTEXT", "CHAT", "PATH");
  for (const auto& m : r.models)
    std::printf("%-24s %6u %8u %-5s %s%s\n", m.id.substr(0, 24).c_str(), m.layers, m.context, m.chat ? "yes" : "no", m.path.c_str(),
                m.on_demand ? " (loaded for a request)" : "");
  // Where each model's layers run: one stage on this node, or a split model's stages in order.
  for (const auto& m : r.models) {
    std::string where;
    for (const auto& s : m.stages)
      where += (where.empty() ? "" : ", ") + std::string("layers ") + std::to_string(s.first_layer) + "-" +
               std::to_string(s.end_layer ? s.end_layer - 1 : 0) + " on " + s.node.short_string() +
               (s.node.short_string() == node ? " (this node)" : "");
    if (m.stages.empty()) where = "layers 0-" + std::to_string(m.layers ? m.layers - 1 : 0) + " on " + node;
    std::printf("%s: %s\n", m.id.substr(0, 24).c_str(), where.c_str());
  }
  std::printf("HTTP API: %s\n", r.api_url.empty() ? "off" : (r.api_url + "/v1 (dashboard " + r.api_url + "/)").c_str());
}

nlohmann::json to_json(const mesh::msg::models_reply& r) {
  nlohmann::json j{{"api_url", r.api_url}, {"models", nlohmann::json::array()}};
  for (const auto& m : r.models) {
    auto stages = nlohmann::json::array();
    for (const auto& s : m.stages)
      stages.push_back({{"node", s.node.to_string()}, {"first_layer", s.first_layer}, {"end_layer", s.end_layer}});
    j["models"].push_back({{"id", m.id}, {"path", m.path}, {"layers", m.layers}, {"context", m.context}, {"chat", m.chat},
                           {"on_demand", m.on_demand}, {"stages", stages}});
  }
  return j;
}

std::atomic<bool> interrupted{false};

/// meshctl generate: the text to standard output as it comes, the statistics to standard error.
int generate(mesh::client& c, const std::string& model, const std::string& prompt, const mesh::generation_options& o) {
  // The first Ctrl-C withdraws the request at the next piece, so the node stops generating for
  // nobody; a second one (no piece came meanwhile, e.g. during a long load) ends meshctl at once.
  struct sigaction sa {};
  sa.sa_handler = [](int) { interrupted = true; };
  sa.sa_flags = SA_RESETHAND;
  sigaction(SIGINT, &sa, nullptr);
  auto r = c.generate(model, prompt, o, [](std::string_view piece, uint32_t) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return !interrupted.load();
  });
  if (!r) {
    std::fflush(stdout);
    std::cerr << "meshctl: " << r.error().message << "\n";  // the node's messages name the command
    return 1;
  }
  // The text is exactly what the model generated; a terminal gets a line break after it.
  if (isatty(STDOUT_FILENO) && !r->text.empty() && r->text.back() != '\n') std::printf("\n");
  std::fflush(stdout);
  const auto rate = [](double n, double s) { return s > 0 ? n / s : 0.0; };
  std::fprintf(stderr, "prompt: %u tokens in %.3f s, %.1f tokens/s\n", r->prompt_tokens, r->prompt_seconds,
               rate(r->prompt_tokens, r->prompt_seconds));
  std::fprintf(stderr, "generated: %u tokens in %.3f s, %.1f tokens/s (finish: %s)\n", r->tokens, r->generate_seconds,
               rate(r->tokens, r->generate_seconds), to_string(r->finish));
  if (r->first_piece_seconds >= 0)
    std::fprintf(stderr, "time to first token: %.3f s", r->first_piece_seconds);
  else
    std::fprintf(stderr, "time to first token: - (no text)");
  if (r->load_seconds > 0) std::fprintf(stderr, " (model loaded in %.3f s)", r->load_seconds);
  std::fprintf(stderr, "\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"meshctl: show and steer the mesh"};
  std::string node, state_dir = mesh::app::default_state_dir(), secret_file, command;
  bool json = false;
  int count = 0;
  app.add_option("command", command, "peers, status, jobs, top, or invite (print the join token of the local node's mesh)")
      ->check(CLI::IsMember({"peers", "status", "jobs", "top", "invite"}));
  std::string model, prompt;
  mesh::generation_options gen;
  int64_t max_tokens = gen.max_tokens;
  auto* gen_cmd = app.add_subcommand("generate", "generate text from a checkpoint on the node, streamed to standard output "
                                                 "(statistics to standard error)");
  gen_cmd->fallthrough();
  gen_cmd->add_option("model", model, "checkpoint path on the node: a GGUF file or a Hugging Face directory")->required();
  gen_cmd->add_option("prompt", prompt, "the prompt text")->required();
  gen_cmd->add_option("--max-tokens", max_tokens, "most tokens to generate (capped by the context left after the prompt)")
      ->capture_default_str();
  gen_cmd->add_option("--temperature", gen.sampling.temperature, "0: greedy")->capture_default_str();
  gen_cmd->add_option("--top-k", gen.sampling.top_k, "keep the k most likely tokens (0: off)")->capture_default_str();
  gen_cmd->add_option("--top-p", gen.sampling.top_p, "keep the most likely tokens up to this probability (1: off)")->capture_default_str();
  gen_cmd->add_option("--min-p", gen.sampling.min_p, "drop tokens below this fraction of the most likely (0: off)")->capture_default_str();
  gen_cmd->add_option("--repeat-penalty", gen.sampling.repeat_penalty, "penalty for tokens already seen (1: off)")->capture_default_str();
  gen_cmd->add_option("--seed", gen.sampling.seed, "sampling seed: the same seed gives the same text")->capture_default_str();
  gen_cmd->add_option("--stop", gen.stop, "end before this text (repeatable)")->allow_extra_args(false);
  gen_cmd->add_flag("--chat", gen.chat, "render the prompt as one user message with the checkpoint's chat template");
  gen_cmd->add_option("--chat-template", gen.chat_template,
                      "with --chat: this template family instead of the checkpoint's (chatml, qwen2.5, llama3, llama3.1, llama2, "
                      "mistral, gemma)");
  gen_cmd->add_option("--adapter", gen.adapter,
                      "a LoRA adapter directory in PEFT's layout (adapter_config.json, adapter_model.safetensors), merged "
                      "into the checkpoint when the node loads it (a relative path is made absolute here)");
  mesh::app::train_args train_args;
  auto* train_cmd = mesh::app::add_train_command(app, train_args);
  auto* runs_cmd = mesh::app::add_runs_command(app);
  std::vector<std::string> models_args;
  mesh::msg::models_request models_req;
  auto* models_cmd = app.add_subcommand("models", "the models the node serves: list (no arguments), load PATH, unload ID, replan ID");
  models_cmd->fallthrough();
  models_cmd->add_option("action", models_args, "load PATH | unload ID | replan ID")->expected(0, 2);
  models_cmd->add_option("--chat-template", models_req.chat_template, "load: a chat template family instead of the checkpoint's");
  models_cmd->add_option("--context", models_req.context, "load: positions per request (0: the model's, at most 4096)");
  models_cmd->add_option("--split", models_req.split,
                         "load: split the model's layers over N nodes (this one and N-1 healthy peers, each reading its "
                         "own copy of PATH); replan: plan the split model again over N nodes while it serves");
  app.add_option("--node", node, "NODEID@HOST:PORT of the node to ask")->envname("MESH_NODE");
  app.add_option("--state-dir", state_dir, "a local node's state directory (its endpoint file)")->envname("MESH_STATE_DIR");
  app.add_option("--secret-file", secret_file, "mesh secret file")->envname("MESH_SECRET_FILE");
  app.add_flag("--json", json, "print JSON");
  app.add_option("--count", count, "top: stop after this many refreshes (0 = until interrupted)");
  CLI11_PARSE(app, argc, argv);
  const bool generating = gen_cmd->parsed(), modelling = models_cmd->parsed(), training = train_cmd->parsed();
  if (runs_cmd->parsed()) return mesh::app::list_runs(state_dir, json);
  if (!generating && !modelling && !training && command.empty()) {
    std::cerr << "meshctl: say what to do: peers, status, jobs, top, invite, generate, models, train or runs (--help lists them)\n";
    return 2;
  }
  if (modelling) {
    const bool ok = models_args.empty() || (models_args.size() == 2 && (models_args[0] == "load" || models_args[0] == "unload" ||
                                                                         models_args[0] == "replan"));
    if (!ok || (!models_args.empty() && models_args[0] == "replan" && models_req.split < 1)) {
      std::cerr << "meshctl models: say `meshctl models`, `meshctl models load PATH [--split N]`, `meshctl models unload ID` or "
                   "`meshctl models replan ID --split N`\n";
      return 2;
    }
    if (!models_args.empty()) {
      models_req.action = models_args[0] == "load"     ? mesh::models_action::load
                          : models_args[0] == "unload" ? mesh::models_action::unload
                                                       : mesh::models_action::replan;
      models_req.target = models_args[1];
    }
  }
  if (generating && (max_tokens < 0 || max_tokens > UINT32_MAX)) {
    std::cerr << "meshctl generate: --max-tokens " << max_tokens << " is out of range\n";
    return 2;
  }
  gen.max_tokens = static_cast<uint32_t>(max_tokens);
  if (!gen.adapter.empty()) gen.adapter = std::filesystem::absolute(gen.adapter).lexically_normal().string();

  // The credential: the secret file, else the token the local node keeps beside its endpoint.
  mesh::client_options opts;
  if (!secret_file.empty()) {
    auto secret = mesh::app::read_secret(secret_file);
    if (!secret) {
      std::cerr << "meshctl: " << secret.error().message << "\n";
      return 2;
    }
    auto credential = mesh::transport::credential_from_secret(std::move(*secret));
    opts.mesh_secret = credential.secret;
    opts.mesh_id = credential.mesh_id;
  } else {
    auto local = mesh::options_for_local_node(state_dir);
    if (!local) {
      std::cerr << "meshctl: " << local.error().message << "\n";
      return 2;
    }
    opts = std::move(*local);
  }
  if (command == "invite") {
    // Needs no running node: the token is the credential itself. Only the token goes to
    // standard output, so that `meshnode --join "$(meshctl invite)"` works.
    if (opts.mesh_secret.empty()) {
      std::cerr << "meshctl: no mesh credential in " << state_dir
                << " (start meshnode there first: it creates a mesh; a node started --open needs no token)\n";
      return 2;
    }
    std::cout << mesh::transport::encode_join_token({opts.mesh_id, opts.mesh_secret}) << "\n";
    std::cerr << "join another machine with: meshnode --join TOKEN (the token is the mesh secret: pass it privately)\n";
    return 0;
  }
  if (node.empty()) {
    std::ifstream f(state_dir + "/endpoint");
    if (!std::getline(f, node)) {
      std::cerr << "meshctl: no --node given and no running node found in " << state_dir << " (start meshnode first)\n";
      return 2;
    }
  }
  auto c = mesh::client::connect(node, opts);
  if (!c) {
    std::cerr << "meshctl: " << c.error().message << "\n";
    return 1;
  }
  if (generating) return generate(**c, model, prompt, gen);
  if (training) return mesh::app::train(**c, train_args, state_dir);
  if (modelling) {
    // A load answers once the model is on the node's device: minutes for a large checkpoint.
    const auto wait = models_req.action == mesh::models_action::load || models_req.action == mesh::models_action::replan
                          ? std::chrono::minutes(30)
                          : std::chrono::minutes(1);
    auto r = (*c)->models(models_req, std::chrono::duration_cast<std::chrono::milliseconds>(wait));
    if (!r) {
      std::cerr << "meshctl models: " << r.error().message << "\n";
      return 1;
    }
    if (json) std::cout << to_json(*r).dump(2) << "\n";
    else print_models(*r, (*c)->node().short_string());
    return 0;
  }
  for (int round = 0;; ++round) {
    auto s = (*c)->status();
    if (!s) {
      std::cerr << "meshctl: " << s.error().message << "\n";
      return 1;
    }
    if (json) {
      auto j = to_json(*s);
      std::cout << (command == "peers" ? j["peers"] : command == "jobs" ? j["jobs"] : j).dump(2) << "\n";
    } else if (command == "peers") {
      print_peers(*s);
    } else if (command == "jobs") {
      print_jobs(*s);
    } else if (command == "status") {
      print_status(*s);
    } else {
      std::printf("\033[2J\033[H");
      print_status(*s);
      std::printf("\n");
      print_peers(*s);
      std::printf("\n");
      print_jobs(*s);
      std::fflush(stdout);
    }
    if (command != "top" || (count > 0 && round + 1 >= count)) return 0;
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}
