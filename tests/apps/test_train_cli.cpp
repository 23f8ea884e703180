// meshctl train against real meshnode processes: a small random Llama checkpoint (GGUF F16 with
// its vocabulary) fine-tuned with LoRA on a text file the test writes, over 3 nodes. The loss
// falls, the adapter is saved in PEFT's layout with its checkpoints, `meshctl runs` lists the run,
// and `meshctl generate --adapter` serves it; a full fine-tune of the same file saves as a Hugging
// Face directory that `meshctl generate` serves; a GPT-2 file trains LoRA on c_attn and is served
// with its adapter; bad input is a clear error.
#include <catch2/catch.hpp>

#include <array>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "graph/safetensors.hpp"
#include "model_writer.hpp"
#include "models/checkpoint_tokenizer.hpp"
#include "models/peft.hpp"
#include "meshctl_runner.hpp"
#include "node_harness.hpp"
#include "reference_generation.hpp"

using namespace mesh;
using mesh::test::meshctl;

namespace {

/// Documents a tiny model can learn: the same few sentences, over and over.
void write_corpus(const std::filesystem::path& path) {
  std::ofstream f(path);
  const char* lines[] = {"the cat sat on the mat.", "the dog sat on the log.", "a cat and a dog sat."};
  for (int i = 0; i < 60; ++i) f << lines[i % 3] << "\n\n";
}

/// The losses of a run's losses.csv ("step,loss" rows after a header).
std::vector<double> read_losses(const std::filesystem::path& out) {
  std::ifstream csv(out / "losses.csv");
  std::vector<double> losses;
  std::string line;
  std::getline(csv, line);
  while (std::getline(csv, line)) losses.push_back(std::stod(line.substr(line.find(',') + 1)));
  return losses;
}

}  // namespace

TEST_CASE("meshctl train fine-tunes a checkpoint with LoRA over 3 nodes, runs lists it, generate --adapter serves it",
          "[apps][train][finetune]") {
  test::three_nodes mesh3;
  const auto& tmp = mesh3.tmp;
  models::test::model_spec spec;
  spec.context = 64;
  const auto model = tmp.path / "tiny-f16.gguf";
  models::test::write_gguf_model(model, spec, models::tensor_type::f16);
  const auto data = tmp.path / "corpus.txt";
  write_corpus(data);
  const auto state = tmp.path / "a";
  auto c = client::connect(mesh3.ea, test::member_options());
  REQUIRE(c);
  REQUIRE(test::wait_for_peers(**c, 2));

  const auto out = tmp.path / "run1";
  auto r = meshctl(state, "train --model " + model.string() + " --data " + data.string() + " --out " + out.string() +
                              " --lora-rank 8 --steps 24 --batch 2 --sequence 16 --micro-batches 3 --lr 0.01 --checkpoint-every 12");
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("step 24/24") != std::string::npos);
  CHECK(r.out.find("peers 3") != std::string::npos);
  // The curve: it falls.
  const auto losses = read_losses(out);
  REQUIRE(losses.size() == 24);
  WARN("meshctl train, LoRA r8 on 3 nodes: loss " << losses.front() << " -> " << losses.back());
  CHECK(losses.back() < 0.7 * losses.front());
  CHECK(std::filesystem::exists(out / "loss.svg"));
  // The adapter and its checkpoints, in PEFT's layout.
  auto adapter = models::read_lora_adapter(out);
  INFO((adapter ? "" : adapter.error().message));
  REQUIRE(adapter);
  CHECK(adapter->config.rank == 8);
  CHECK(adapter->modules.size() == 4 * static_cast<size_t>(spec.layers));
  CHECK(models::read_lora_adapter(out / "checkpoint-12"));
  std::ifstream rf(out / "run.json");
  const auto run = nlohmann::json::parse(rf);
  CHECK(run["status"] == "done");
  CHECK(run["step"] == 24);
  CHECK(run["workers"] == 3);
  REQUIRE(run["checkpoints"].size() == 1);  // 12; the last step's state is the result itself
  CHECK(run["checkpoints"][0]["step"] == 12);

  auto runs = meshctl(state, "runs");
  REQUIRE(runs.status == 0);
  CHECK(runs.out.find(out.string()) != std::string::npos);
  CHECK(runs.out.find("done") != std::string::npos);
  CHECK(runs.out.find((out / "checkpoint-12").string()) != std::string::npos);

  // Served with the adapter: the text the merged checkpoint generates here.
  models::generate_options o;
  o.max_tokens = 10;
  const auto ref = models::test::reference_generation(model, "the cat", o, out);
  auto g = meshctl(state, "generate " + model.string() + " 'the cat' --max-tokens 10 --adapter " + out.string());
  INFO(g.err);
  REQUIRE(g.status == 0);
  CHECK(g.out == ref.text);

  // Mixed precision: f16 products with dynamic loss scaling (steps that overflow are skipped).
  const auto mixed_out = tmp.path / "run6";
  auto mixed = meshctl(state, "train --model " + model.string() + " --data " + data.string() + " --out " + mixed_out.string() +
                                  " --lora-rank 8 --steps 16 --batch 2 --sequence 16 --micro-batches 3 --lr 0.01 --precision f16");
  INFO(mixed.out << mixed.err);
  REQUIRE(mixed.status == 0);
  {
    const auto l = read_losses(mixed_out);
    REQUIRE(l.size() == 16);
    WARN("meshctl train --precision f16, LoRA r8 on 3 nodes: loss " << l.front() << " -> " << l.back());
    CHECK(l.back() < 0.8 * l.front());
    std::ifstream mf(mixed_out / "run.json");
    CHECK(nlohmann::json::parse(mf)["precision"] == "f16");
    CHECK(models::read_lora_adapter(mixed_out));
  }
  auto bad_precision = meshctl(state, "train --model " + model.string() + " --data " + data.string() + " --out " +
                                          (tmp.path / "run7").string() + " --lora-rank 4 --precision f8");
  CHECK(bad_precision.status != 0);
  CHECK(bad_precision.err.find("--precision") != std::string::npos);
  auto bad_overlap = meshctl(state, "train --model " + model.string() + " --data " + data.string() + " --out " +
                                        (tmp.path / "run8").string() + " --lora-rank 4 --sequence 16 --overlap-steps 2");
  CHECK(bad_overlap.status != 0);
  CHECK(bad_overlap.err.find("overlap_steps is for DiLoCo runs") != std::string::npos);

  // Bad input: named, nothing trained, the node still there.
  const auto bad_data = tmp.path / "bad.jsonl";
  std::ofstream(bad_data) << "{\"text\": \"fine\"}\n{\"txt\": \"typo\"}\n";
  auto bad = meshctl(state, "train --model " + model.string() + " --data " + bad_data.string() + " --out " + (tmp.path / "run2").string() +
                                " --lora-rank 4 --steps 2 --batch 1 --sequence 8 --micro-batches 1");
  INFO(bad.err);
  CHECK(bad.status != 0);
  // One shard: the whole file, whose lines its worker counts (a later shard names bytes).
  CHECK(bad.err.find("cannot read the training data: " + bad_data.string() + ":2: a record needs \"text\"") != std::string::npos);
  // A file the node does not have is named, and nothing runs.
  auto missing = meshctl(state, "train --model " + model.string() + " --data " + (tmp.path / "nowhere.txt").string() + " --out " +
                                    (tmp.path / "run5").string() + " --lora-rank 4 --steps 2 --batch 1 --sequence 8");
  INFO(missing.err);
  CHECK(missing.status != 0);
  CHECK(missing.err.find("nowhere.txt") != std::string::npos);
  auto bad_target = meshctl(state, "train --model " + model.string() + " --data " + data.string() + " --out " +
                                       (tmp.path / "run3").string() + " --lora-rank 4 --sequence 16 --lora-targets qkv");
  CHECK(bad_target.status != 0);
  CHECK(bad_target.err.find("unknown LoRA target \"qkv\"") != std::string::npos);
  // A full fine-tune of the GGUF file: a Hugging Face directory whose config and tokenizer are the
  // file's, served by meshctl generate as the checkpoint it is.
  const auto full_out = tmp.path / "run4";
  auto full_gguf = meshctl(state, "train --model " + model.string() + " --data " + data.string() + " --out " + full_out.string() +
                                      " --steps 3 --batch 2 --sequence 16 --micro-batches 3 --lr 0.001");
  INFO(full_gguf.out << full_gguf.err);
  REQUIRE(full_gguf.status == 0);
  CHECK(full_gguf.out.find("step 3/3") != std::string::npos);
  {
    auto base = models::checkpoint::open(model);
    REQUIRE(base);
    auto base_config = models::read_model_config(*base);
    REQUIRE(base_config);
    auto saved = models::checkpoint::open(full_out);
    REQUIRE(saved);
    CHECK(saved->format() == models::checkpoint_format::hf_directory);
    auto config = models::read_model_config(*saved);
    INFO((config ? "" : config.error().message));
    REQUIRE(config);
    CHECK(config->arch == base_config->arch);
    CHECK(config->vocab_size == base_config->vocab_size);
    CHECK(config->hidden_size == base_config->hidden_size);
    CHECK(config->n_layers == base_config->n_layers);
    CHECK(config->n_kv_heads == base_config->n_kv_heads);
    CHECK(config->norm_eps == base_config->norm_eps);
    CHECK(config->eos_token_ids == base_config->eos_token_ids);
    auto tok = models::load_tokenizer(*saved, *config);
    INFO((tok ? "" : tok.error().message));
    REQUIRE(tok);
    CHECK(tok->vocab.tokens.size() == static_cast<size_t>(spec.vocab));
    const auto ref_full = models::test::reference_generation(full_out, "the cat", o);
    auto gen = meshctl(state, "generate " + full_out.string() + " 'the cat' --max-tokens 10");
    INFO(gen.err);
    REQUIRE(gen.status == 0);
    CHECK(gen.out == ref_full.text);
  }
  // A GGUF whose config a Hugging Face directory cannot hold exactly: refused before any step.
  models::test::model_spec llama3 = spec;
  llama3.llama3_scaling = true;
  const auto llama3_model = tmp.path / "tiny-llama3.gguf";
  models::test::write_gguf_model(llama3_model, llama3, models::tensor_type::f16);
  auto refused = meshctl(state, "train --model " + llama3_model.string() + " --data " + data.string() + " --out " +
                                    (tmp.path / "run9").string() + " --steps 2 --sequence 16");
  INFO(refused.out << refused.err);
  CHECK(refused.status != 0);
  CHECK(refused.err.find("rope_freqs.weight") != std::string::npos);
  CHECK(refused.err.find("fine-tune it with LoRA") != std::string::npos);
  CHECK(refused.out.find("step") == std::string::npos);
  CHECK_FALSE(std::filesystem::exists(tmp.path / "run9" / "run.json"));

  // GPT-2 (a GGUF Q8_0 base, frozen as its blocks): LoRA on its default target, c_attn, learns
  // the corpus; the adapter is PEFT's for GPT-2 and generate --adapter serves it.
  models::test::model_spec gpt2 = spec;
  gpt2.arch = models::architecture::gpt2;
  gpt2.kv_heads = gpt2.heads;
  const auto gpt2_model = tmp.path / "tiny-gpt2-q8_0.gguf";
  models::test::write_gguf_model(gpt2_model, gpt2, models::tensor_type::q8_0);
  const auto gpt2_out = tmp.path / "run10";
  auto gpt2_run = meshctl(state, "train --model " + gpt2_model.string() + " --data " + data.string() + " --out " +
                                     gpt2_out.string() + " --lora-rank 8 --steps 16 --batch 2 --sequence 16 --micro-batches 3 --lr 0.01");
  INFO(gpt2_run.out << gpt2_run.err);
  REQUIRE(gpt2_run.status == 0);
  {
    const auto l = read_losses(gpt2_out);
    REQUIRE(l.size() == 16);
    WARN("meshctl train, GPT-2 Q8_0, LoRA r8 on c_attn, 3 nodes: loss " << l.front() << " -> " << l.back());
    CHECK(l.back() < 0.8 * l.front());
    std::ifstream rf2(gpt2_out / "run.json");
    CHECK(nlohmann::json::parse(rf2)["lora_targets"] == nlohmann::json::array({"c_attn"}));
    auto gpt2_adapter = models::read_lora_adapter(gpt2_out);
    INFO((gpt2_adapter ? "" : gpt2_adapter.error().message));
    REQUIRE(gpt2_adapter);
    CHECK(gpt2_adapter->modules.size() == static_cast<size_t>(gpt2.layers));
    CHECK(gpt2_adapter->modules.count("transformer.h.0.attn.c_attn") == 1);
    const auto ref_gpt2 = models::test::reference_generation(gpt2_model, "the cat", o, gpt2_out);
    auto gen = meshctl(state, "generate " + gpt2_model.string() + " 'the cat' --max-tokens 10 --adapter " + gpt2_out.string());
    INFO(gen.err);
    REQUIRE(gen.status == 0);
    CHECK(gen.out == ref_gpt2.text);
  }
  CHECK(mesh3.a->running());
}
