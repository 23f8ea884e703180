// meshctl generate against a real meshnode process: the streamed text equals models::generate in
// this process on the same checkpoint with the same options (greedy and seeded), the statistics go
// to standard error, errors come back as clear messages with a non-zero exit, and the node keeps
// running. Also the client API's generate() and its withdrawal.
#include <catch2/catch.hpp>

#include <array>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <string>

#include "gpu/executor.hpp"
#include "model_writer.hpp"
#include "reference_generation.hpp"
#include "models/checkpoint_tokenizer.hpp"
#include "models/finetune.hpp"
#include "models/generate.hpp"
#include "models/peft.hpp"
#include "models/session.hpp"
#include "meshctl_runner.hpp"
#include "node_harness.hpp"

using namespace mesh;
using mesh::test::meshctl;

TEST_CASE("meshctl generate streams the node's text, reports statistics and clear errors", "[apps][generate]") {
  test::temp_dir tmp;
  models::test::model_spec spec;
  spec.layers = 1;
  spec.context = 64;
  const auto model = tmp.path / "tiny.gguf";
  models::test::write_gguf_model(model, spec, models::tensor_type::q8_0);
  test::node_process node(tmp.path / "node");
  const auto endpoint = node.endpoint();
  const auto state = tmp.path / "node";

  // Greedy.
  models::generate_options o;
  o.max_tokens = 12;
  const auto greedy_ref = models::test::reference_generation(model, "hello there", o);
  auto greedy = meshctl(state, "generate " + model.string() + " 'hello there' --max-tokens 12");
  INFO(greedy.err);
  REQUIRE(greedy.status == 0);
  CHECK(greedy.out == greedy_ref.text);
  CHECK(greedy.err.find("prompt: " + std::to_string(greedy_ref.prompt_tokens) + " tokens in ") != std::string::npos);
  CHECK(greedy.err.find("generated: " + std::to_string(greedy_ref.tokens.size()) + " tokens in ") != std::string::npos);
  CHECK(greedy.err.find("tokens/s") != std::string::npos);
  CHECK(greedy.err.find("time to first token: ") != std::string::npos);

  // Seeded sampling with every option and a stop string.
  o.sampling = {.temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .repetition_penalty = 1.1f, .seed = 9};
  o.stop = {"zz"};
  o.max_tokens = 16;
  const auto sampled_ref = models::test::reference_generation(model, "hello there", o);
  auto sampled = meshctl(state, "generate " + model.string() +
                                    " 'hello there' --max-tokens 16 --temperature 0.9 --top-k 40 --top-p 0.95 --min-p 0.05 "
                                    "--repeat-penalty 1.1 --seed 9 --stop zz");
  INFO(sampled.err);
  REQUIRE(sampled.status == 0);
  CHECK(sampled.out == sampled_ref.text);
  CHECK(sampled.err.find("generated: " + std::to_string(sampled_ref.tokens.size()) + " tokens") != std::string::npos);

  // Errors: a clear message on standard error, a non-zero exit, nothing on standard output.
  const auto missing = meshctl(state, "generate " + (tmp.path / "nope.gguf").string() + " hi");
  CHECK(missing.status != 0);
  CHECK(missing.out.empty());
  CHECK(missing.err.find("meshctl: cannot open " + (tmp.path / "nope.gguf").string()) != std::string::npos);
  const auto cold = meshctl(state, "generate " + model.string() + " hi --temperature -1");
  CHECK(cold.status != 0);
  CHECK(cold.err.find("meshctl: generate: temperature -1 is not a finite number >= 0") != std::string::npos);
  const auto none = meshctl(state, "generate " + model.string() + " hi --max-tokens 0");
  CHECK(none.status != 0);
  CHECK(none.err.find("max_tokens is 0") != std::string::npos);
  const auto chat = meshctl(state, "generate " + model.string() + " hi --chat");
  CHECK(chat.status != 0);
  CHECK(chat.err.find("has no chat template") != std::string::npos);

  // The client API: pieces with token counts, and a callback that withdraws the request.
  auto c = client::connect(endpoint, test::member_options());
  REQUIRE(c);
  generation_options go;
  go.max_tokens = 12;
  std::string streamed;
  uint32_t last_tokens = 0;
  auto out = (*c)->generate(model.string(), "hello there", go, [&](std::string_view piece, uint32_t tokens) {
    streamed += piece;
    last_tokens = tokens;
    return true;
  });
  REQUIRE(out);
  CHECK(out->text == greedy_ref.text);
  CHECK(streamed == greedy_ref.text);
  CHECK(last_tokens <= out->tokens);
  CHECK(out->load_seconds == 0);  // loaded by the first meshctl run
  go.max_tokens = 40;
  go.sampling.temperature = 1.0f;
  auto cut = (*c)->generate(model.string(), "hello there", go, [](std::string_view, uint32_t) { return false; });
  REQUIRE(cut);
  if (cut->finish != finish_reason::eos) {
    CHECK(cut->finish == finish_reason::cancelled);
    CHECK(cut->tokens < 40);
  }

  // A LoRA adapter in PEFT's layout, merged when the node loads the checkpoint with it: the text
  // is what the merged checkpoint generates here, and not the base's.
  {
    auto ckpt = models::checkpoint::open(model);
    REQUIRE(ckpt);
    auto config = models::read_model_config(*ckpt);
    REQUIRE(config);
    models::finetune_options fo;
    fo.lora.rank = 4;
    fo.lora.alpha = 16;
    fo.sequence = 16;  // the graph is only built for its adapters' names and shapes
    auto ft = models::build_finetune_model(*config, *ckpt, fo);
    REQUIRE(ft);
    tensor_map state = ft->state;
    std::mt19937 rng(3);
    std::normal_distribution<double> nd(0, 0.2);
    for (const auto& name : ft->trainable)
      if (name.find(".lora_B.") != std::string::npos) {
        std::vector<float> v(static_cast<size_t>(state[name].size()));
        for (auto& x : v) x = static_cast<float>(nd(rng));
        state[name] = tensor::from_floats(state[name].dims, v);
      }
    REQUIRE(models::save_lora_adapter(tmp.path / "adapter", *ft, state, model.string()));
  }
  o = {};
  o.max_tokens = 12;
  const auto adapted_ref = models::test::reference_generation(model, "hello there", o, tmp.path / "adapter");
  CHECK(adapted_ref.text != greedy_ref.text);
  auto adapted = meshctl(state, "generate " + model.string() + " 'hello there' --max-tokens 12 --adapter " + (tmp.path / "adapter").string());
  INFO(adapted.err);
  REQUIRE(adapted.status == 0);
  CHECK(adapted.out == adapted_ref.text);
  // The plain checkpoint is still served as it was.
  auto plain = meshctl(state, "generate " + model.string() + " 'hello there' --max-tokens 12");
  REQUIRE(plain.status == 0);
  CHECK(plain.out == greedy_ref.text);
  const auto no_adapter = meshctl(state, "generate " + model.string() + " hi --adapter " + (tmp.path / "nowhere").string());
  CHECK(no_adapter.status != 0);
  CHECK(no_adapter.err.find((tmp.path / "nowhere" / "adapter_config.json").string()) != std::string::npos);

  // The node is still there and answering.
  CHECK(node.running());
  const auto status = meshctl(state, "status");
  CHECK(status.status == 0);
}
