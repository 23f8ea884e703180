#pragma once
/// meshctl train and meshctl runs: fine-tuning a checkpoint across the mesh from the command line.
///
///   meshctl train --model DIR|FILE.gguf --data FILE --out DIR [--lora-rank R] [--steps N] ...
///
/// meshctl reads the checkpoint and the data where it runs (tokenized with the checkpoint's
/// tokenizer and chat template, packed into rows), builds the fine-tuning graph (models/finetune.hpp)
/// and trains it through the node it talks to, over every worker of the mesh (client/trainer.hpp),
/// showing a progress line (step, loss, tokens/s, peers). The result goes to --out: a LoRA adapter
/// in PEFT's layout (rank > 0) or a Hugging Face directory (full fine-tuning), the loss curve as
/// loss.svg and losses.csv, and run.json describing the run; --checkpoint-every K adds the state
/// every K steps before the last under checkpoint-<step>/ in the same layout (the last step's
/// state is the result itself).
///
///   meshctl runs
///
/// lists the runs started from this state directory (their --out directories are recorded in
/// <state dir>/runs.txt): status, step, last loss and checkpoints, read from each run.json.
#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace mesh {
class client;
}

namespace mesh::app {

struct train_args {
  std::string model, data, out;
  int64_t lora_rank = 0;
  double lora_alpha = 0;  ///< 0: twice the rank
  std::vector<std::string> lora_targets;  ///< empty: the architecture's default (models::default_lora_targets)
  uint64_t steps = 100;
  int64_t batch = 4;        ///< sequences per micro-batch
  int64_t sequence = 256;   ///< tokens per sequence
  uint32_t micro_batches = 4;  ///< per step, spread over the workers
  double lr = 0;            ///< 0: 2e-4 with LoRA, 2e-5 for full fine-tuning
  std::string method = "dp";
  uint32_t inner_steps = 20;
  std::string compression = "f32";
  std::string precision = "f32";
  uint32_t fragments = 1;      ///< DiLoCo: streaming fragments
  uint32_t overlap_steps = 0;  ///< DiLoCo: inner steps of each round overlapped with its all-reduce  ///< the products' dtype: f32, bf16 or f16 (with loss scaling)
  uint64_t checkpoint_every = 0;
  uint64_t seed = 1;
};

/// Adds `train` and `runs` to meshctl; `args` receives train's options.
CLI::App* add_train_command(CLI::App& app, train_args& args);
CLI::App* add_runs_command(CLI::App& app);

/// Reads the model and the data, trains through `c`, saves the result; meshctl's exit status (an
/// error printed with what was wrong: a file, a record's line, an option).
int train(mesh::client& c, const train_args& args, const std::string& state_dir);
int list_runs(const std::string& state_dir, bool json);

}  // namespace mesh::app
