// The pipeline (models/pipeline.hpp): 2 and 3 stage sessions, each on its own executor as on its
// own node, driven through links that copy the rows as a network would, generate exactly the text
// of the whole-model session (greedy and seeded) and the chain's logits bit for bit; a link that
// fails gives an error naming the stage and its node; bad stage layouts are refused.
#include <catch2/catch.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpu/executor.hpp"
#include "model_writer.hpp"
#include "models/checkpoint_tokenizer.hpp"
#include "models/generate.hpp"
#include "models/pipeline.hpp"
#include "models/session.hpp"

using namespace mesh;
using namespace mesh::models;
using namespace mesh::models::test;

namespace {

/// A link over a simulated network: the rows are copied into a message buffer and back, so no
/// stage reads the driver's memory; it counts the bytes and can be cut (a node that died).
class copying_link final : public stage_link {
 public:
  copying_link(std::unique_ptr<stage_link> far, std::shared_ptr<bool> cut) : far_(std::move(far)), cut_(std::move(cut)) {}
  expected<std::vector<float>> forward(int64_t start, std::span<const int32_t> tokens, std::span<const float> hidden) override {
    if (*cut_) return make_error(error_code::unavailable, "the connection closed");
    const std::vector<int32_t> sent_tokens(tokens.begin(), tokens.end());
    const std::vector<float> sent_hidden(hidden.begin(), hidden.end());
    auto r = far_->forward(start, sent_tokens, sent_hidden);
    if (!r) return r;
    return std::vector<float>(r->begin(), r->end());
  }

 private:
  std::unique_ptr<stage_link> far_;
  std::shared_ptr<bool> cut_;
};

struct split_model {
  std::vector<std::unique_ptr<gpu::executor>> executors;
  std::unique_ptr<pipeline> p;
  std::vector<std::shared_ptr<bool>> cuts;
};

session_options small_batches(layer_range layers) {
  session_options o;
  o.min_batch = 8;
  o.max_batch = 16;
  o.layers = layers;
  return o;
}

/// The model cut before each layer in `cuts`, one CPU executor per stage, over copying links.
split_model split(const checkpoint& ckpt, const model_config& config, const std::vector<int64_t>& cuts) {
  split_model m;
  std::vector<pipeline_stage> stages;
  int64_t context = 0;
  for (size_t i = 0; i <= cuts.size(); ++i) {
    const layer_range r{i == 0 ? 0 : cuts[i - 1], i == cuts.size() ? config.n_layers : cuts[i]};
    m.executors.push_back(gpu::make_cpu_executor(1));
    auto s = session::create(*m.executors.back(), ckpt, small_batches(r));
    INFO((s ? std::string() : s.error().message));
    REQUIRE(s);
    context = s->context();
    m.cuts.push_back(std::make_shared<bool>(false));
    stages.push_back({"node-" + std::to_string(i), r, std::make_unique<copying_link>(local_stage::make(std::move(*s)), m.cuts.back())});
  }
  auto p = pipeline::create(config, context, std::move(stages));
  INFO((p ? std::string() : p.error().message));
  REQUIRE(p);
  m.p = std::move(*p);
  return m;
}

model_spec four_layers() {
  model_spec s;
  s.layers = 4;
  return s;
}

std::vector<int32_t> prompt_of(size_t n) {
  std::vector<int32_t> p;
  for (size_t i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((i * 53 + 7) % 300));
  return p;
}

}  // namespace

TEST_CASE("a pipeline of 2 or 3 stages generates the whole model's text, greedy and seeded", "[models][pipeline]") {
  temp_dir dir;
  write_gguf_model(dir / "m.gguf", four_layers(), tensor_type::q8_0);
  auto ckpt = checkpoint::open(dir / "m.gguf");
  REQUIRE(ckpt);
  auto cpu = gpu::make_cpu_executor(1);
  auto whole = session::create(*cpu, *ckpt, small_batches({}));
  REQUIRE(whole);
  auto vocab = load_tokenizer(*ckpt, whole->config());
  REQUIRE(vocab);
  auto tok = tokenizer::create(vocab->vocab);
  REQUIRE(tok);
  const auto prompt = prompt_of(29);  // two prefill chunks of 16 rows

  for (const auto& cuts : {std::vector<int64_t>{2}, std::vector<int64_t>{1, 3}}) {
    auto m = split(*ckpt, whole->config(), cuts);
    for (const uint64_t seed : {uint64_t{0}, uint64_t{7}}) {
      generate_options o;
      o.max_tokens = 12;
      o.stop_at_eos = false;
      if (seed) {
        o.sampling.temperature = 0.9f;
        o.sampling.top_k = 40;
        o.sampling.seed = seed;
      }
      // Twice each: the second generation starts over at position 0 on every stage.
      for (int round = 0; round < 2; ++round) {
        whole->reset();
        m.p->reset();
        auto a = generate(*whole, *tok, prompt, o);
        auto b = generate(*m.p, *tok, prompt, o);
        INFO("cuts " << cuts.size() << ", seed " << seed << ", round " << round);
        REQUIRE(a);
        INFO((b ? std::string() : b.error().message));
        REQUIRE(b);
        CHECK(b->tokens == a->tokens);
        CHECK(b->text == a->text);
        CHECK(m.p->position() == whole->position());
      }
    }
  }
}

TEST_CASE("a pipeline's logits are its stages' logits, bit for bit", "[models][pipeline]") {
  temp_dir dir;
  write_gguf_model(dir / "m.gguf", four_layers(), tensor_type::f32);
  auto ckpt = checkpoint::open(dir / "m.gguf");
  REQUIRE(ckpt);
  auto config_of = gpu::make_cpu_executor(1);
  auto probe = session::create(*config_of, *ckpt, small_batches({}));
  REQUIRE(probe);
  auto m = split(*ckpt, probe->config(), {1, 3});
  // The same cut, run by hand without the pipeline.
  std::vector<std::unique_ptr<gpu::executor>> ex;
  std::vector<session> chain;
  for (const layer_range r : {layer_range{0, 1}, layer_range{1, 3}, layer_range{3, 4}}) {
    ex.push_back(gpu::make_cpu_executor(1));
    auto s = session::create(*ex.back(), *ckpt, small_batches(r));
    REQUIRE(s);
    chain.push_back(std::move(*s));
  }
  const auto by_hand = [&](std::span<const int32_t> tokens) {
    auto h = chain[0].forward(tokens);
    REQUIRE(h);
    h = chain[1].forward(std::span<const float>(*h));
    REQUIRE(h);
    h = chain[2].forward(std::span<const float>(*h));
    REQUIRE(h);
    return *h;
  };
  const auto prompt = prompt_of(21);
  auto got = m.p->prefill(prompt);
  REQUIRE(got);
  CHECK(*got == by_hand(prompt));
  for (const int32_t t : {5, 77, 299}) {
    auto next = m.p->decode(t);
    REQUIRE(next);
    CHECK(*next == by_hand(std::span<const int32_t>(&t, 1)));
  }
  CHECK(m.p->position() == 24);
}

TEST_CASE("a pipeline whose stage fails says which stage and node, and keeps its position", "[models][pipeline]") {
  temp_dir dir;
  write_gguf_model(dir / "m.gguf", four_layers(), tensor_type::f32);
  auto ckpt = checkpoint::open(dir / "m.gguf");
  REQUIRE(ckpt);
  auto cpu = gpu::make_cpu_executor(1);
  auto probe = session::create(*cpu, *ckpt, small_batches({}));
  REQUIRE(probe);
  auto m = split(*ckpt, probe->config(), {1, 3});
  const auto prompt = prompt_of(5);
  REQUIRE(m.p->prefill(prompt));
  *m.cuts[1] = true;
  auto r = m.p->decode(3);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == error_code::unavailable);
  CHECK(r.error().message == "stage 2 of 3 (layers [1, 3) on node node-1): the connection closed");
  CHECK(m.p->position() == 5);
  // Its node back, the stage is out of step (stage 1 ran the failed step): it says so, and a new
  // sequence brings every stage back.
  *m.cuts[1] = false;
  auto stale = m.p->decode(3);
  REQUIRE_FALSE(stale);
  CHECK(stale.error().message.find("a step at position 5, but the stage stands at 6") != std::string::npos);
  m.p->reset();
  CHECK(m.p->prefill(prompt));

  // generate() passes the error on.
  *m.cuts[2] = true;
  m.p->reset();
  auto vocab = load_tokenizer(*ckpt, probe->config());
  REQUIRE(vocab);
  auto tok = tokenizer::create(vocab->vocab);
  REQUIRE(tok);
  generate_options o;
  o.max_tokens = 3;
  auto g = generate(*m.p, *tok, prompt, o);
  REQUIRE_FALSE(g);
  CHECK(g.error().message.find("layers [3, 4) on node node-2") != std::string::npos);
}

TEST_CASE("a pipeline refuses stages that do not cover the layers in order", "[models][pipeline]") {
  model_config c;
  c.n_layers = 4;
  c.vocab_size = 10;
  c.hidden_size = 8;
  struct refusing final : stage_link {
    expected<std::vector<float>> forward(int64_t, std::span<const int32_t>, std::span<const float>) override {
      return make_error(error_code::internal, "unused");
    }
  };
  const auto make = [&](std::vector<layer_range> ranges) {
    std::vector<pipeline_stage> stages;
    for (size_t i = 0; i < ranges.size(); ++i) stages.push_back({"n" + std::to_string(i), ranges[i], std::make_unique<refusing>()});
    return pipeline::create(c, 64, std::move(stages));
  };
  CHECK(make({{0, 2}, {2, 4}}));
  auto gap = make({{0, 2}, {3, 4}});
  REQUIRE_FALSE(gap);
  CHECK(gap.error().message == "pipeline: stage 2 on node n1 holds layers [3, 4), but the next layer is 2");
  auto short_of = make({{0, 2}, {2, 3}});
  REQUIRE_FALSE(short_of);
  CHECK(short_of.error().message == "pipeline: the stages end at layer 3, but the model has 4 layers");
  CHECK_FALSE(make({}));
  std::vector<pipeline_stage> no_link;
  no_link.push_back({"n0", {0, 4}, nullptr});
  CHECK_FALSE(pipeline::create(c, 64, std::move(no_link)));
}
