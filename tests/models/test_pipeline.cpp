// The pipeline (models/pipeline.hpp): 2 and 3 stage sessions, each on its own executor as on its
// own node, driven through links that copy the rows as a network would, generate exactly the text
// of the whole-model session (greedy and seeded) and the chain's logits bit for bit; a link that
// fails gives an error naming the stage and its node; bad stage layouts are refused.
#include <catch2/catch.hpp>

#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
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
  expected<std::vector<float>> forward(int64_t slot, int64_t start, std::span<const int32_t> tokens,
                                       std::span<const float> hidden) override {
    return over_the_wire(tokens, hidden, [&](auto t, auto h) { return far_->forward(slot, start, t, h); });
  }
  expected<std::vector<float>> forward(std::span<const batch_row> rows, std::span<const int32_t> tokens,
                                       std::span<const float> hidden) override {
    const std::vector<batch_row> sent_rows(rows.begin(), rows.end());
    return over_the_wire(tokens, hidden, [&](auto t, auto h) { return far_->forward(sent_rows, t, h); });
  }

 private:
  template <class Call>
  expected<std::vector<float>> over_the_wire(std::span<const int32_t> tokens, std::span<const float> hidden, Call call) {
    if (*cut_) return make_error(error_code::unavailable, "the connection closed");
    const std::vector<int32_t> sent_tokens(tokens.begin(), tokens.end());
    const std::vector<float> sent_hidden(hidden.begin(), hidden.end());
    auto r = call(std::span<const int32_t>(sent_tokens), std::span<const float>(sent_hidden));
    if (!r) return r;
    return std::vector<float>(r->begin(), r->end());
  }
  std::unique_ptr<stage_link> far_;
  std::shared_ptr<bool> cut_;
};

struct split_model {
  std::vector<std::unique_ptr<gpu::executor>> executors;
  std::unique_ptr<pipeline> p;
  std::vector<std::shared_ptr<bool>> cuts;
};

session_options small_batches(layer_range layers, int64_t slots = 1) {
  session_options o;
  o.min_batch = 8;
  o.max_batch = 16;
  o.layers = layers;
  o.slots = slots;
  return o;
}

/// The model cut before each layer in `cuts`, one CPU executor per stage, over copying links;
/// each stage holds `slots` sequences.
split_model split(const checkpoint& ckpt, const model_config& config, const std::vector<int64_t>& cuts, int64_t slots = 1) {
  split_model m;
  std::vector<pipeline_stage> stages;
  int64_t context = 0;
  for (size_t i = 0; i <= cuts.size(); ++i) {
    const layer_range r{i == 0 ? 0 : cuts[i - 1], i == cuts.size() ? config.n_layers : cuts[i]};
    m.executors.push_back(gpu::make_cpu_executor(1));
    auto s = session::create(*m.executors.back(), ckpt, small_batches(r, slots));
    INFO((s ? std::string() : s.error().message));
    REQUIRE(s);
    context = s->context();
    m.cuts.push_back(std::make_shared<bool>(false));
    stages.push_back({"node-" + std::to_string(i), r, std::make_unique<copying_link>(local_stage::make(std::move(*s)), m.cuts.back())});
  }
  auto p = pipeline::create(config, context, std::move(stages), slots);
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

TEST_CASE("a pipeline's batched steps give each sequence the whole model's logits, bit for bit", "[models][pipeline][batch]") {
  temp_dir dir;
  write_gguf_model(dir / "m.gguf", four_layers(), tensor_type::q8_0);
  auto ckpt = checkpoint::open(dir / "m.gguf");
  REQUIRE(ckpt);
  auto cpu = gpu::make_cpu_executor(1);
  auto whole = session::create(*cpu, *ckpt, small_batches({}, 4));
  REQUIRE(whole);
  auto m = split(*ckpt, whole->config(), {1, 3}, 4);
  CHECK(m.p->slots() == 4);
  // Three sequences of different lengths in slots 0, 2 and 3 (slot 1 idle), prefilled in turn.
  const std::vector<std::pair<int64_t, size_t>> prompts = {{0, 5}, {2, 19}, {3, 1}};
  for (const auto& [slot, n] : prompts) {
    auto prompt = prompt_of(n);
    auto a = whole->prefill(slot, prompt);
    auto b = m.p->prefill(slot, prompt);
    REQUIRE(a);
    REQUIRE(b);
    CHECK(*b == *a);
  }
  // Batches of every make-up, in orders other than the slots': the rows go back in the batch's order.
  const std::vector<std::vector<slot_token>> steps = {
      {{2, 11}, {0, 12}, {3, 13}}, {{3, 21}}, {{0, 31}, {2, 32}}, {{1, 41}, {3, 42}, {0, 43}, {2, 44}}};
  for (const auto& batch : steps) {
    if (batch.front().slot == 1) {  // slot 1 starts a sequence of its own first
      REQUIRE(whole->prefill(1, prompt_of(3)));
      REQUIRE(m.p->prefill(1, prompt_of(3)));
    }
    auto a = whole->decode(batch);
    auto b = m.p->decode(batch);
    REQUIRE(a);
    INFO((b ? std::string() : b.error().message));
    REQUIRE(b);
    REQUIRE(b->size() == batch.size());
    for (size_t i = 0; i < batch.size(); ++i) CHECK((*b)[i] == (*a)[i]);
  }
  for (int64_t slot = 0; slot < 4; ++slot) CHECK(m.p->position(slot) == whole->position(slot));
  CHECK(m.p->position(2) == 19 + 3);

  // A batch the pipeline refuses changes nothing: a slot named twice, a slot it lacks.
  const std::vector<slot_token> twice = {{0, 1}, {0, 2}};
  auto dup = m.p->decode(twice);
  REQUIRE_FALSE(dup);
  CHECK(dup.error().message == "pipeline: slot 0 named twice in one decode batch");
  const std::vector<slot_token> outside = {{4, 1}};
  CHECK_FALSE(m.p->decode(outside));
  CHECK(m.p->position(0) == whole->position(0));
  // A stage out of step in one slot says which slot (a step it missed, given by hand).
  auto stage2 = session::create(*m.executors[1], *ckpt, small_batches({1, 3}, 4));
  REQUIRE(stage2);
  local_stage fresh(std::move(*stage2));
  const std::vector<batch_row> rows = {{2, 22}};
  auto stale = fresh.forward(rows, {}, std::vector<float>(static_cast<size_t>(whole->config().hidden_size), 0.0f));
  REQUIRE_FALSE(stale);
  CHECK(stale.error().message.find("a step at position 22 of slot 2, which stands at 0 (it missed a step)") != std::string::npos);
}

namespace {

/// Counts how many stages are busy at once (each call holds its stage for `hold`).
struct busy_meter {
  std::mutex m;
  int busy = 0, most = 0;
};

class timed_link final : public stage_link {
 public:
  timed_link(std::unique_ptr<stage_link> far, std::shared_ptr<busy_meter> meter) : far_(std::move(far)), meter_(std::move(meter)) {}
  expected<std::vector<float>> forward(int64_t slot, int64_t start, std::span<const int32_t> tokens,
                                       std::span<const float> hidden) override {
    return held([&] { return far_->forward(slot, start, tokens, hidden); });
  }
  expected<std::vector<float>> forward(std::span<const batch_row> rows, std::span<const int32_t> tokens,
                                       std::span<const float> hidden) override {
    return held([&] { return far_->forward(rows, tokens, hidden); });
  }

 private:
  /// One call at a time on this stage, as a peer's stage host runs them; the meter sees it busy.
  template <class Call>
  expected<std::vector<float>> held(Call call) {
    std::lock_guard<std::mutex> one(m_);
    {
      std::lock_guard<std::mutex> lock(meter_->m);
      meter_->most = std::max(meter_->most, ++meter_->busy);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the wire and a slow device
    auto r = call();
    std::lock_guard<std::mutex> lock(meter_->m);
    --meter_->busy;
    return r;
  }
  std::mutex m_;
  std::unique_ptr<stage_link> far_;
  std::shared_ptr<busy_meter> meter_;
};

}  // namespace

TEST_CASE("micro-batches stepped at once flow through the stages as a pipeline", "[models][pipeline][batch]") {
  temp_dir dir;
  write_gguf_model(dir / "m.gguf", four_layers(), tensor_type::q8_0);
  auto ckpt = checkpoint::open(dir / "m.gguf");
  REQUIRE(ckpt);
  auto cpu = gpu::make_cpu_executor(1);
  auto whole = session::create(*cpu, *ckpt, small_batches({}, 4));
  REQUIRE(whole);
  auto meter = std::make_shared<busy_meter>();
  std::vector<std::unique_ptr<gpu::executor>> executors;
  std::vector<pipeline_stage> stages;
  for (const layer_range r : {layer_range{0, 1}, layer_range{1, 3}, layer_range{3, 4}}) {
    executors.push_back(gpu::make_cpu_executor(1));
    auto s = session::create(*executors.back(), *ckpt, small_batches(r, 4));
    REQUIRE(s);
    stages.push_back({"n" + std::to_string(r.first), r, std::make_unique<timed_link>(local_stage::make(std::move(*s)), meter)});
  }
  auto p = pipeline::create(whole->config(), whole->context(), std::move(stages), 4);
  REQUIRE(p);
  for (int64_t slot = 0; slot < 4; ++slot) {
    const auto prompt = prompt_of(static_cast<size_t>(3 + slot));
    REQUIRE(whole->prefill(slot, prompt));
    REQUIRE((*p)->prefill(slot, prompt));
  }
  // Two micro-batches (slots 0-1 and 2-3), each stepped 4 times from its own thread.
  const std::vector<std::vector<slot_token>> halves = {{{0, 5}, {1, 6}}, {{2, 7}, {3, 8}}};
  std::vector<std::vector<std::vector<float>>> got(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (size_t h = 0; h < 2; ++h)
    threads.emplace_back([&, h] {
      for (int step = 0; step < 4; ++step) {
        auto out = (*p)->decode(halves[h]);
        if (!out) return void(errors[h] = out.error().message);
        got[h].insert(got[h].end(), out->begin(), out->end());
      }
    });
  for (auto& t : threads) t.join();
  CHECK(errors[0].empty());
  CHECK(errors[1].empty());
  CHECK(meter->most >= 2);  // two stages worked at the same time
  // The same steps on the whole model, one micro-batch after the other: the same logits.
  for (size_t h = 0; h < 2; ++h) {
    std::vector<std::vector<float>> want;
    for (int step = 0; step < 4; ++step) {
      auto out = whole->decode(halves[h]);
      REQUIRE(out);
      want.insert(want.end(), out->begin(), out->end());
    }
    REQUIRE(got[h].size() == want.size());
    for (size_t i = 0; i < want.size(); ++i) CHECK(got[h][i] == want[i]);
  }
  for (int64_t slot = 0; slot < 4; ++slot) CHECK((*p)->position(slot) == whole->position(slot));
}

TEST_CASE("a pipeline whose first stage holds the head gives the whole model's logits, bit for bit", "[models][pipeline][head]") {
  temp_dir dir;
  write_gguf_model(dir / "m.gguf", four_layers(), tensor_type::q8_0);
  auto ckpt = checkpoint::open(dir / "m.gguf");
  REQUIRE(ckpt);
  auto cpu = gpu::make_cpu_executor(1);
  auto whole = session::create(*cpu, *ckpt, small_batches({}, 2));
  REQUIRE(whole);
  const auto& config = whole->config();
  std::vector<std::unique_ptr<gpu::executor>> executors;
  std::vector<pipeline_stage> stages;
  for (const layer_range r : {layer_range{0, 1}, layer_range{1, 3}, layer_range{3, 4, false}}) {
    executors.push_back(gpu::make_cpu_executor(1));
    auto s = session::create(*executors.back(), *ckpt, small_batches(r, 2));
    REQUIRE(s);
    std::optional<session> head;
    if (r.first == 0) {
      session_options ho = small_batches(layer_range::head_of(config.n_layers));
      ho.prefix = "head.";
      auto h = session::create(*executors.back(), *ckpt, ho);
      REQUIRE(h);
      // What it is for: the head alone, no layer, no cache.
      CHECK(h->kv_cache_bytes() == 0);
      CHECK(h->returns_logits());
      CHECK_FALSE(h->takes_tokens());
      head.emplace(std::move(*h));
    }
    const bool last = r.end == config.n_layers;
    if (last) CHECK_FALSE(s->returns_logits());  // hidden rows out of the last layer
    stages.push_back({"n" + std::to_string(r.first), r, local_stage::make(std::move(*s), std::move(head))});
  }
  auto p = pipeline::create(config, whole->context(), std::move(stages), 2);
  INFO((p ? std::string() : p.error().message));
  REQUIRE(p);
  for (const int64_t slot : {0, 1}) {
    const auto prompt = prompt_of(slot ? 21 : 6);  // 21: a prefill of two chunks
    auto a = whole->prefill(slot, prompt);
    auto b = (*p)->prefill(slot, prompt);
    REQUIRE(a);
    REQUIRE(b);
    CHECK(*b == *a);
  }
  for (int step = 0; step < 3; ++step) {
    const std::vector<slot_token> batch = {{1, 40 + step}, {0, 50 + step}};
    auto a = whole->decode(batch);
    auto b = (*p)->decode(batch);
    REQUIRE(a);
    REQUIRE(b);
    CHECK(*b == *a);
  }
  // A session with layers has no head() of its own; a pipeline that has the head twice, or
  // nowhere, is refused.
  CHECK_THAT(whole->head(std::vector<float>(static_cast<size_t>(config.hidden_size), 0.0f)).error().message,
             Catch::Contains("head() needs a session of the head alone"));
  const auto make = [&](bool last_applies_head, bool first_holds_head) {
    std::vector<pipeline_stage> st;
    for (const layer_range r : {layer_range{0, 2}, layer_range{2, 4, last_applies_head}}) {
      auto s = session::create(*cpu, *ckpt, small_batches(r));
      REQUIRE(s);
      std::optional<session> head;
      if (r.first == 0 && first_holds_head) {
        auto h = session::create(*cpu, *ckpt, small_batches(layer_range::head_of(config.n_layers)));
        REQUIRE(h);
        head.emplace(std::move(*h));
      }
      st.push_back({"m" + std::to_string(r.first), r, local_stage::make(std::move(*s), std::move(head))});
    }
    return pipeline::create(config, 64, std::move(st));
  };
  CHECK_THAT(make(true, true).error().message, Catch::Contains("stage 1 holds the head, and the last stage applies it too"));
  CHECK_THAT(make(false, false).error().message, Catch::Contains("the last stage applies no head, and no stage holds it"));
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
  CHECK(stale.error().message.find("a step at position 5 of slot 0, but the stage stands at 6") != std::string::npos);
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
    expected<std::vector<float>> forward(int64_t, int64_t, std::span<const int32_t>, std::span<const float>) override {
      return make_error(error_code::internal, "unused");
    }
    expected<std::vector<float>> forward(std::span<const batch_row>, std::span<const int32_t>, std::span<const float>) override {
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
