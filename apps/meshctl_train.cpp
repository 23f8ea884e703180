#include "apps/meshctl_train.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/progress_bar.hpp"
#include "apps/svg_plot.hpp"
#include "client/client.hpp"
#include "client/trainer.hpp"
#include "graph/safetensors.hpp"
#include "models/checkpoint_tokenizer.hpp"
#include "models/finetune.hpp"
#include "models/hf_export.hpp"
#include "models/peft.hpp"
#include "models/text_dataset.hpp"
#include "actors/train_text.hpp"

namespace mesh::app {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::string now_text() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  return buf;
}

/// run.json: what the run is and how far it got; rewritten as it goes (a temporary file renamed
/// over it, so `meshctl runs` never reads half a file).
struct run_record {
  fs::path dir;
  json j;
  void save() const {
    const auto tmp = dir / "run.json.tmp";
    {
      std::ofstream f(tmp, std::ios::trunc);
      f << j.dump(2) << "\n";
    }
    std::error_code ec;
    fs::rename(tmp, dir / "run.json", ec);
  }
};

/// Saves the trained state in the run's layout: the adapter, or the whole model.
expected<void> save_result(const fs::path& dir, const models::finetune_model& m, const tensor_map& state,
                           const models::checkpoint& base, const std::string& model_path) {
  if (m.lora.rank > 0) return models::save_lora_adapter(dir, m, state, model_path);
  return models::save_full_model(dir, m, state, base);
}

int fail(const std::string& why) {
  std::cerr << "meshctl train: " << why << "\n";
  return 1;
}

}  // namespace

CLI::App* add_train_command(CLI::App& app, train_args& a) {
  auto* t = app.add_subcommand("train", "fine-tune a checkpoint across the mesh on a text or JSONL file (LoRA or full)");
  t->fallthrough();
  t->add_option("--model", a.model, "the checkpoint here: a Hugging Face directory or a GGUF file (Llama family)")->required();
  t->add_option("--data", a.data, "training data: plain text (documents separated by blank lines) or .jsonl ({\"text\"} or {\"messages\"})")
      ->required();
  t->add_option("--out", a.out, "directory for the result, its checkpoints, loss.svg and run.json")->required();
  t->add_option("--lora-rank", a.lora_rank, "LoRA rank (0: full fine-tuning)")->capture_default_str();
  t->add_option("--lora-alpha", a.lora_alpha, "LoRA alpha (0: twice the rank)")->capture_default_str();
  t->add_option("--lora-targets", a.lora_targets,
                "projections that get adapters: q_proj k_proj v_proj o_proj gate_proj up_proj down_proj (default q_proj k_proj "
                "v_proj o_proj); GPT-2: c_attn c_proj c_fc (default c_attn)");
  t->add_option("--steps", a.steps, "optimizer steps")->capture_default_str();
  t->add_option("--batch", a.batch, "sequences per micro-batch")->capture_default_str();
  t->add_option("--sequence", a.sequence, "tokens per sequence")->capture_default_str();
  t->add_option("--micro-batches", a.micro_batches, "micro-batches per step, spread over the workers")->capture_default_str();
  t->add_option("--lr", a.lr, "Adam learning rate (0: 2e-4 with LoRA, 2e-5 full)")->capture_default_str();
  t->add_option("--method", a.method, "dp (data parallel) or diloco")->check(CLI::IsMember({"dp", "diloco"}))->capture_default_str();
  t->add_option("--inner-steps", a.inner_steps, "DiLoCo: local steps between averaging")->capture_default_str();
  t->add_option("--fragments", a.fragments, "DiLoCo: parameters averaged in this many fragments, in turn (streaming DiLoCo)")
      ->check(CLI::Range(1u, 4096u))
      ->capture_default_str();
  t->add_option("--overlap-steps", a.overlap_steps, "DiLoCo: the last this many local steps of each round run while its all-reduce travels")
      ->capture_default_str();
  t->add_option("--compression", a.compression, "all-reduce format: f32, bf16, f16, int8, fp4")
      ->check(CLI::IsMember({"f32", "bf16", "f16", "int8", "fp4"}))
      ->capture_default_str();
  t->add_option("--precision", a.precision,
                "the dtype products compute in: f32, bf16, or f16 with dynamic loss scaling (master weights stay f32)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  t->add_option("--checkpoint-every", a.checkpoint_every, "save the state every K steps under checkpoint-<step>/ (0: only the result)")
      ->capture_default_str();
  t->add_option("--seed", a.seed, "data order")->capture_default_str();
  return t;
}

CLI::App* add_runs_command(CLI::App& app) {
  return app.add_subcommand("runs", "the training runs started from this state directory, their progress and checkpoints");
}

int train(mesh::client& c, const train_args& a, const std::string& state_dir) {
  // The model and the data, read here.
  auto ckpt = models::checkpoint::open(a.model);
  if (!ckpt) return fail(ckpt.error().message);
  auto config = models::read_model_config(*ckpt);
  if (!config) return fail(config.error().message);
  auto vocab = models::load_tokenizer(*ckpt, *config);
  if (!vocab) return fail(vocab.error().message);
  // Known before any step runs: a full fine-tune saves as a Hugging Face directory, whose config
  // and tokenizer a GGUF base's metadata must give exactly.
  if (a.lora_rank == 0 && ckpt->format() == models::checkpoint_format::gguf)
    if (auto ok = models::check_hf_export(*config, *vocab); !ok)
      return fail(a.model + ": its full fine-tune could not be saved as a Hugging Face directory: " + ok.error().message +
                  "; fine-tune it with LoRA (--lora-rank R)");
  // The data is read by the workers, each only its shards, with this tokenizer; the node meshctl
  // talks to offers the file to the others (a path on that node: this machine's, run locally).
  const std::string data_path = fs::absolute(a.data).lexically_normal().string();
  const auto text = make_text_data(data_path, models::data_format_of(a.data), static_cast<uint32_t>(a.sequence), vocab->vocab,
                                   vocab->chat_template);
  if (a.sequence < 1) return fail("--sequence must be at least 1");

  models::finetune_options fo;
  fo.batch = a.batch;
  fo.sequence = a.sequence;
  fo.lora.rank = a.lora_rank;
  fo.lora.alpha = a.lora_alpha > 0 ? a.lora_alpha : 2.0 * static_cast<double>(a.lora_rank);
  fo.lora.targets = a.lora_targets;
  fo.compute = a.precision == "f16" ? dtype::f16 : a.precision == "bf16" ? dtype::bf16 : dtype::f32;
  auto m = models::build_finetune_model(*config, *ckpt, fo);
  if (!m) return fail(m.error().message);
  int64_t trained = 0, total = 0;
  for (const auto& [name, t] : m->state) {
    total += t.size();
    if (std::find(m->trainable.begin(), m->trainable.end(), name) != m->trainable.end()) trained += t.size();
  }

  std::error_code ec;
  fs::create_directories(a.out, ec);
  if (ec) return fail("cannot create " + a.out + ": " + ec.message());
  const fs::path out = fs::absolute(a.out).lexically_normal();
  run_record run{out, {}};
  run.j = {{"model", fs::absolute(a.model).lexically_normal().string()},
           {"data", data_path},
           {"mode", a.lora_rank > 0 ? "lora" : "full"},
           {"lora_rank", a.lora_rank},
           {"lora_alpha", fo.lora.alpha},
           {"lora_targets", m->lora.targets},
           {"steps", a.steps},
           {"batch", a.batch},
           {"sequence", a.sequence},
           {"micro_batches", a.micro_batches},
           {"method", a.method},
           {"compression", a.compression},
           {"precision", a.precision},
           {"fragments", a.fragments},
           {"overlap_steps", a.overlap_steps},
           {"parameters", total},
           {"trained_parameters", trained},
           {"status", "running"},
           {"step", 0},
           {"started", now_text()},
           {"checkpoints", json::array()}};
  run.save();
  {  // recorded for `meshctl runs`
    fs::create_directories(state_dir, ec);
    std::ofstream list(fs::path(state_dir) / "runs.txt", std::ios::app);
    list << out.string() << "\n";
  }

  train_options o;
  o.steps = a.steps;
  o.micro_batches = a.micro_batches;
  o.method = a.method == "diloco" ? train_method::diloco : train_method::data_parallel;
  o.inner_steps = a.inner_steps;
  o.fragments = a.fragments;
  o.overlap_steps = a.overlap_steps;
  o.compression = a.compression == "bf16"   ? wire_format::bf16
                  : a.compression == "f16"  ? wire_format::f16
                  : a.compression == "int8" ? wire_format::int8
                  : a.compression == "fp4"  ? wire_format::fp4
                                            : wire_format::f32;
  o.seed = a.seed;
  o.trainable = m->trainable;
  o.optimizer = optim::adam_options{.lr = a.lr > 0 ? a.lr : (a.lora_rank > 0 ? 2e-4 : 2e-5)};
  if (fo.compute == dtype::f16) o.loss_scale = optim::loss_scaling{};
  o.checkpoint_every = a.checkpoint_every;
  if (a.checkpoint_every > 0)
    o.on_checkpoint = [&](uint64_t step, const tensor_map& state) {
      const auto dir = out / fmt::format("checkpoint-{}", step);
      if (auto ok = save_result(dir, *m, state, *ckpt, a.model); !ok) {
        std::fprintf(stderr, "\nmeshctl train: checkpoint %llu not saved: %s\n", static_cast<unsigned long long>(step),
                     ok.error().message.c_str());
        return;
      }
      run.j["checkpoints"].push_back({{"step", step}, {"path", dir.string()}});
      run.save();
    };

  std::printf("training %s on %s (rows of %lld tokens, read by the workers in %u shards); %s, %lld of %lld parameters "
              "trained; %llu steps of %u x %lld sequences\n",
              a.model.c_str(), data_path.c_str(), static_cast<long long>(a.sequence), a.micro_batches,
              a.lora_rank > 0 ? fmt::format("LoRA rank {}", a.lora_rank).c_str() : "full fine-tuning", static_cast<long long>(trained),
              static_cast<long long>(total), static_cast<unsigned long long>(a.steps), a.micro_batches, static_cast<long long>(a.batch));
  const bool tty = ::isatty(STDOUT_FILENO);
  std::vector<std::pair<double, double>> curve;
  trainer t(c, m->g, m->state, text, o);
  auto result = t.fit([&](const train_progress_info& p) {
    while (!curve.empty() && curve.back().first >= static_cast<double>(p.step)) curve.pop_back();  // a redone step
    curve.emplace_back(static_cast<double>(p.step), p.loss);
    const double tokens_per_s = p.samples_per_s * static_cast<double>(a.sequence);
    const auto line = fmt::format("[{}] step {}/{}  loss {:.4f}  {:.0f} tokens/s  peers {}", progress_bar(static_cast<double>(p.step) / p.steps, 24), p.step,
                                  p.steps, p.loss, tokens_per_s, p.peers);
    // A terminal gets one line redrawn; a log gets a line per step.
    if (tty) std::printf("\r%s ", line.c_str());
    else std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    run.j["step"] = p.step;
    run.j["loss"] = p.loss;
  });
  if (tty) std::printf("\n");
  run.j["finished"] = now_text();
  if (!result) {
    run.j["status"] = "failed";
    run.j["error"] = result.error().message;
    run.save();
    return fail(result.error().message);
  }
  // The curve, as a plot and as numbers.
  write_line_plot_svg((out / "loss.svg").string(), curve, "meshctl train: " + fs::path(a.model).filename().string(), "step",
                      "cross-entropy");
  {
    std::ofstream csv(out / "losses.csv", std::ios::trunc);
    csv << "step,loss\n";
    for (const auto& [s, l] : curve) csv << static_cast<uint64_t>(s) << "," << l << "\n";
  }
  if (auto ok = save_result(out, *m, result->state, *ckpt, a.model); !ok) {
    run.j["status"] = "failed";
    run.j["error"] = "saving: " + ok.error().message;
    run.save();
    return fail("saving the result: " + ok.error().message);
  }
  run.j["status"] = "done";
  run.j["step"] = result->step;
  run.j["seconds"] = result->seconds;
  run.j["workers"] = result->workers.size();
  run.j["allreduce_bytes"] = result->bytes_sent;
  run.save();
  std::printf("%llu steps in %.1f s on %zu nodes; loss %.4f -> %.4f; all-reduce sent %.1f MB\n",
              static_cast<unsigned long long>(result->step), result->seconds, result->workers.size(),
              curve.empty() ? 0.0 : curve.front().second, curve.empty() ? 0.0 : curve.back().second,
              static_cast<double>(result->bytes_sent) / 1e6);
  std::printf("%s: %s, loss.svg, losses.csv, run.json\n", out.string().c_str(),
              a.lora_rank > 0 ? "adapter_config.json + adapter_model.safetensors (PEFT)" : "config.json + model.safetensors");
  return 0;
}

int list_runs(const std::string& state_dir, bool as_json) {
  std::ifstream list(fs::path(state_dir) / "runs.txt");
  std::vector<std::string> dirs;
  for (std::string line; std::getline(list, line);)
    if (!line.empty() && std::find(dirs.begin(), dirs.end(), line) == dirs.end()) dirs.push_back(line);
  json all = json::array();
  for (const auto& d : dirs) {
    std::ifstream f(fs::path(d) / "run.json");
    json j = json::parse(f, nullptr, false);
    if (j.is_discarded() || !j.is_object()) j = {{"status", "missing"}};
    j["out"] = d;
    all.push_back(std::move(j));
  }
  if (as_json) {
    std::cout << all.dump(2) << "\n";
    return 0;
  }
  if (all.empty()) {
    std::printf("no training runs started from %s (meshctl train records them)\n", state_dir.c_str());
    return 0;
  }
  std::printf("%-8s %-6s %-12s %-10s %s\n", "STATUS", "MODE", "STEP", "LOSS", "OUT / CHECKPOINTS");
  for (const auto& j : all) {
    const auto str = [&](const char* k) { return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : std::string("-"); };
    const auto num = [&](const char* k) { return j.contains(k) && j[k].is_number() ? j[k].get<double>() : -1.0; };
    const std::string step = num("step") >= 0 ? fmt::format("{:.0f}/{:.0f}", num("step"), num("steps")) : "-";
    const std::string loss = num("loss") >= 0 ? fmt::format("{:.4f}", num("loss")) : "-";
    std::printf("%-8s %-6s %-12s %-10s %s\n", str("status").c_str(), str("mode").c_str(), step.c_str(), loss.c_str(), str("out").c_str());
    if (j.contains("checkpoints") && j["checkpoints"].is_array())
      for (const auto& k : j["checkpoints"])
        if (k.is_object() && k.contains("path") && k["path"].is_string())
          std::printf("%40s step %s: %s\n", "", k.contains("step") ? k["step"].dump().c_str() : "?", k["path"].get<std::string>().c_str());
    if (j.contains("error") && j["error"].is_string()) std::printf("%40s error: %s\n", "", j["error"].get<std::string>().c_str());
  }
  return 0;
}

}  // namespace mesh::app
