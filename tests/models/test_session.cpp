// The session and generation on the CPU executor: errors that name the file and the tensor, the
// context limit, prefill in several batches equal to one, stop strings, seeds, callbacks.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpu/executor.hpp"
#include "model_writer.hpp"
#include "models/checkpoint_tokenizer.hpp"
#include "models/generate.hpp"
#include "models/session.hpp"

using namespace mesh;
using namespace mesh::models;
using namespace mesh::models::test;

namespace {

model_spec tiny() {
  model_spec s;
  s.layers = 1;
  s.context = 64;
  return s;
}

// The tiny model (Q8_0 GGUF) ready to generate: a session on a one-thread CPU executor, its
// tokenizer, and "hello there" encoded.
struct generating_tiny {
  temp_dir dir;
  std::unique_ptr<gpu::executor> cpu = gpu::make_cpu_executor(1);
  std::optional<checkpoint> ckpt;
  std::optional<session> s;
  std::optional<tokenizer> tok;
  std::optional<std::vector<int32_t>> prompt;

  generating_tiny() {
    write_gguf_model(dir / "m.gguf", tiny(), tensor_type::q8_0);
    auto c = checkpoint::open(dir / "m.gguf");
    REQUIRE(c);
    ckpt.emplace(std::move(*c));
    auto made = session::create(*cpu, *ckpt);
    REQUIRE(made);
    s.emplace(std::move(*made));
    auto vocab = load_tokenizer(*ckpt, s->config());
    REQUIRE(vocab);
    auto t = tokenizer::create(vocab->vocab);
    REQUIRE(t);
    tok.emplace(std::move(*t));
    auto ids = tok->encode("hello there");
    REQUIRE(ids);
    prompt.emplace(std::move(*ids));
  }
};

}  // namespace

TEST_CASE("a missing or misshapen tensor is an error naming the file and the tensor", "[models][session]") {
  temp_dir dir;
  model_spec s = tiny();
  write_hf_model(dir / "hf", s, "F32");
  // config.json claims a wider MLP than the tensors have.
  std::string config = hf_config_json(s);
  config.replace(config.find("\"intermediate_size\": 128"), 24, "\"intermediate_size\": 96");
  write_file(dir / "hf" / "config.json", config);
  auto ckpt = checkpoint::open(dir / "hf");
  REQUIRE(ckpt);
  auto cpu = gpu::make_cpu_executor(1);
  auto sess = session::create(*cpu, *ckpt);
  REQUIRE_FALSE(sess);
  CHECK(sess.error().code == error_code::shape_mismatch);
  CHECK(sess.error().message.find("model.layers.0.mlp.gate_proj.weight") != std::string::npos);
  CHECK(sess.error().message.find("[128, 64]") != std::string::npos);

  gguf_writer w;  // a GGUF llama with no tensors at all
  w.add_string("general.architecture", "llama");
  for (const char* k : {"embedding_length", "block_count", "feed_forward_length", "context_length"})
    w.add_u32(std::string("llama.") + k, 64);
  w.add_u32("llama.attention.head_count", 4);
  w.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.add_u32("llama.vocab_size", 300);
  write_file(dir / "empty.gguf", w.build());
  auto empty = checkpoint::open(dir / "empty.gguf");
  REQUIRE(empty);
  auto none = session::create(*cpu, *empty);
  REQUIRE_FALSE(none);
  CHECK(none.error().code == error_code::not_found);
  CHECK(none.error().message.find("empty.gguf") != std::string::npos);
  CHECK(none.error().message.find("token_embd.weight") != std::string::npos);
}

TEST_CASE("the context is a limit: prompts and generation past it are errors", "[models][session]") {
  temp_dir dir;
  write_gguf_model(dir / "m.gguf", tiny(), tensor_type::f32);
  auto ckpt = checkpoint::open(dir / "m.gguf");
  REQUIRE(ckpt);
  auto cpu = gpu::make_cpu_executor(1);
  session_options wide;
  wide.context = 65;
  auto big = session::create(*cpu, *ckpt, wide);
  REQUIRE_FALSE(big);
  CHECK(big.error().message.find("a context of 65 positions was asked for, but the model was trained for 64") !=
        std::string::npos);
  auto s = session::create(*cpu, *ckpt);
  REQUIRE(s);
  CHECK(s->context() == 64);
  const std::vector<int32_t> long_prompt(65, 5);
  auto r = s->prefill(long_prompt);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == error_code::limit_exceeded);
  CHECK(s->position() == 0);
  const std::vector<int32_t> bad = {300};
  CHECK_FALSE(s->prefill(bad));
  auto tok = load_tokenizer(*ckpt, s->config());
  REQUIRE(tok);
  auto t = tokenizer::create(tok->vocab);
  REQUIRE(t);
  const std::vector<int32_t> prompt(10, 5);
  generate_options o;
  o.max_tokens = 55;
  auto g = generate(*s, *t, prompt, o);
  REQUIRE_FALSE(g);
  CHECK(g.error().message ==
        "generate: 10 prompt tokens after 0 plus up to 55 generated would pass the context of 64 positions");
}

TEST_CASE("a prompt in several batches gives the logits of one batch", "[models][session]") {
  temp_dir dir;
  write_gguf_model(dir / "m.gguf", tiny(), tensor_type::f16);
  auto ckpt = checkpoint::open(dir / "m.gguf");
  REQUIRE(ckpt);
  auto cpu = gpu::make_cpu_executor(1);
  auto one = session::create(*cpu, *ckpt);
  REQUIRE(one);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 21; ++i) prompt.push_back((i * 37) % 300);
  auto whole = one->prefill(prompt);
  REQUIRE(whole);
  one->reset();
  // 5 tokens, then 3, then the rest: three buckets, the cache carried between them.
  REQUIRE(one->prefill(std::span<const int32_t>(prompt).subspan(0, 5)));
  REQUIRE(one->prefill(std::span<const int32_t>(prompt).subspan(5, 3)));
  auto parts = one->prefill(std::span<const int32_t>(prompt).subspan(8));
  REQUIRE(parts);
  CHECK(one->position() == 21);
  double err = 0;
  for (size_t i = 0; i < whole->size(); ++i) err = std::max(err, std::abs(double((*whole)[i]) - (*parts)[i]));
  CHECK(err < 1e-4);
  const auto programs = one->stats().programs;
  one->reset();
  REQUIRE(one->prefill(std::span<const int32_t>(prompt).subspan(0, 7)));  // the 16-row bucket again
  CHECK(one->stats().programs == programs);
}

TEST_CASE("slots: a decode batch's errors name what is wrong and change nothing", "[models][session]") {
  temp_dir dir;
  write_gguf_model(dir / "m.gguf", tiny(), tensor_type::f16);
  auto ckpt = checkpoint::open(dir / "m.gguf");
  REQUIRE(ckpt);
  auto cpu = gpu::make_cpu_executor(1);
  session_options o;
  o.slots = 3;
  auto s = session::create(*cpu, *ckpt, o);
  REQUIRE(s);
  CHECK(s->slots() == 3);
  const std::vector<int32_t> prompt = {5, 6, 7};
  REQUIRE(s->prefill(0, prompt));
  REQUIRE(s->prefill(2, prompt));
  const auto refused = [&](std::vector<slot_token> batch, const std::string& says) {
    auto r = s->decode(batch);
    REQUIRE_FALSE(r);
    CHECK_THAT(r.error().message, Catch::Contains(says));
    CHECK(s->position(0) == 3);
    CHECK(s->position(1) == 0);
    CHECK(s->position(2) == 3);
  };
  refused({}, "an empty decode batch");
  refused({{3, 1}}, "slot 3 does not exist (the session holds 3)");
  refused({{0, 1}, {0, 2}}, "slot 0 named twice");
  refused({{0, 1}, {2, 100000}}, "token 100000 is outside the vocabulary");
  CHECK_THAT(s->prefill(-1, prompt).error().message, Catch::Contains("slot -1 does not exist"));
  // A sequence at its context is refused, the others in its slots go on.
  std::vector<int32_t> full(static_cast<size_t>(s->context() - 3), 9);
  REQUIRE(s->prefill(2, full));
  auto r = s->decode(std::vector<slot_token>{{0, 1}, {2, 1}});
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Catch::Contains("slot 2 is at the context of 64 positions"));
  auto ok = s->decode(std::vector<slot_token>{{0, 1}});
  REQUIRE(ok);
  CHECK(ok->size() == 1);
  CHECK(s->position(0) == 4);
  o.slots = 0;
  CHECK_THAT(session::create(*cpu, *ckpt, o).error().message, Catch::Contains("0 slots asked for"));
}

TEST_CASE("decode steps over the whole context give the bucketed steps' logits with fewer programs", "[models][session]") {
  temp_dir dir;
  model_spec spec = tiny();
  spec.layers = 2;
  spec.context = 256;
  write_gguf_model(dir / "m.gguf", spec, tensor_type::q8_0);
  auto ckpt = checkpoint::open(dir / "m.gguf");
  REQUIRE(ckpt);
  std::vector<std::unique_ptr<gpu::executor>> ex;
  std::vector<session> sessions;
  for (const auto mode : {session_options::toggle::off, session_options::toggle::on}) {
    session_options o;
    o.slots = 2;
    o.whole_context_decode = mode;
    ex.push_back(gpu::make_cpu_executor(1));
    auto s = session::create(*ex.back(), *ckpt, o);
    REQUIRE(s);
    sessions.push_back(std::move(*s));
  }
  auto& bucketed = sessions[0];
  auto& whole = sessions[1];
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6};
  for (const int64_t slot : {0, 1}) {
    auto a = bucketed.prefill(slot, prompt);
    auto b = whole.prefill(slot, prompt);
    REQUIRE(a);
    REQUIRE(b);
    CHECK(*a == *b);
  }
  // 150 steps cross the buckets of 64 and 128 positions, with one sequence or both.
  for (int32_t t = 0; t < 150; ++t) {
    const std::vector<slot_token> batch = t % 3 ? std::vector<slot_token>{{0, t % 97}, {1, (t * 7) % 97}}
                                                : std::vector<slot_token>{{1, (t * 7) % 97}};
    auto a = bucketed.decode(batch);
    auto b = whole.decode(batch);
    REQUIRE(a);
    REQUIRE(b);
    REQUIRE(a->size() == b->size());
    for (size_t i = 0; i < a->size(); ++i) CHECK((*a)[i] == (*b)[i]);
  }
  CHECK(whole.position(1) == bucketed.position(1));
  // The prompt's program and one per batch size (a row per sequence: 1 and 2 rows), where the
  // bucketed session loads both again for 64, 128 and 256 positions.
  CHECK(whole.stats().programs == 3);
  CHECK(bucketed.stats().programs == 7);

  // Prepared at creation: the decode programs of every batch size, none loaded later.
  for (const int64_t slots : {1, 3, 4}) {
    session_options o;
    o.slots = slots;
    o.whole_context_decode = session_options::toggle::on;
    o.prepare_decode = true;
    ex.push_back(gpu::make_cpu_executor(1));
    auto s = session::create(*ex.back(), *ckpt, o);
    REQUIRE(s);
    // 1 row; 1, 2, 3 rows; 1, 2, 4 rows; and decode_greedy's step.
    const int64_t prepared = (slots == 1 ? 1 : 3) + 1;
    CHECK(s->stats().programs == prepared);
    for (int64_t slot = 0; slot < slots; ++slot) REQUIRE(s->prefill(slot, std::vector<int32_t>{1, 2, 3}));
    const int64_t after_prompts = s->stats().programs;  // the prompts' program is not a decode step's
    std::vector<slot_token> batch;
    for (int64_t slot = 0; slot < slots; ++slot) {
      batch.push_back({slot, 7});
      REQUIRE(s->decode(batch));
    }
    REQUIRE(s->decode_greedy(0, 5, 3));
    CHECK(s->stats().programs == after_prompts);
  }
  // A session of the head alone for a pipeline of 5 sequences: head()'s programs for 1, 2, 4 and
  // 8 rows (what 1 to 5 rows round to), none loaded later.
  {
    session_options o;
    o.layers = layer_range::head_of(spec.layers);
    o.slots = 5;
    o.whole_context_decode = session_options::toggle::on;
    o.prepare_decode = true;
    ex.push_back(gpu::make_cpu_executor(1));
    auto h = session::create(*ex.back(), *ckpt, o);
    REQUIRE(h);
    const int64_t prepared = h->stats().programs;
    CHECK(prepared == 4);
    for (int64_t rows = 1; rows <= 5; ++rows)
      REQUIRE(h->head(std::vector<float>(static_cast<size_t>(rows * spec.hidden), 0.5f)));
    CHECK(h->stats().programs == prepared);
  }
}

TEST_CASE("generate: greedy text, stop strings, seeds and the callback", "[models][session]") {
  generating_tiny m;
  auto& s = m.s;
  auto& tok = m.tok;
  auto& prompt = m.prompt;

  generate_options o;
  o.max_tokens = 20;
  o.stop_at_eos = false;
  std::string streamed;
  auto g = generate(*s, *tok, *prompt, o, [&](std::string_view piece) {
    streamed += piece;
    return true;
  });
  REQUIRE(g);
  CHECK(g->reason == stop_reason::max_tokens);
  CHECK(g->tokens.size() == 20);
  CHECK(streamed == g->text);
  auto decoded = tok->decode(g->tokens);
  REQUIRE(decoded);
  CHECK(g->text == utf8::sanitize(*decoded));  // the stream never splits or emits broken UTF-8

  // A stop string from the middle of that text: what comes before it, and nothing of it.
  REQUIRE(g->text.size() > 6);
  const std::string stop = g->text.substr(g->text.size() / 2, 3);
  s->reset();
  o.stop = {stop};
  auto stopped = generate(*s, *tok, *prompt, o);
  REQUIRE(stopped);
  CHECK(stopped->reason == stop_reason::stop_string);
  CHECK(stopped->text == g->text.substr(0, g->text.find(stop)));

  // Sampling: the same seed, the same tokens.
  o.stop.clear();
  o.sampling = {.temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .repetition_penalty = 1.1f, .seed = 9};
  s->reset();
  auto a = generate(*s, *tok, *prompt, o);
  s->reset();
  auto b = generate(*s, *tok, *prompt, o);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->tokens == b->tokens);

  // The callback ends generation.
  s->reset();
  int calls = 0;
  auto cut = generate(*s, *tok, *prompt, o, [&](std::string_view) { return ++calls < 2; });
  REQUIRE(cut);
  CHECK(cut->reason == stop_reason::callback);

  // on_token sees every token, counted from 1, and ends generation too.
  s->reset();
  std::vector<int64_t> counts;
  o.on_token = [&](int64_t n) {
    counts.push_back(n);
    return n < 5;
  };
  auto counted = generate(*s, *tok, *prompt, o);
  REQUIRE(counted);
  CHECK(counted->reason == stop_reason::callback);
  CHECK(counted->tokens.size() == 5);
  CHECK(counts == std::vector<int64_t>{1, 2, 3, 4, 5});
}

TEST_CASE("generate: each token's logprobs go out with the piece its text starts in, and a stop string cuts them",
          "[models][session]") {
  generating_tiny m;
  auto& s = m.s;
  auto& tok = m.tok;
  auto& prompt = m.prompt;
  const auto code_points = [](std::string_view t) {
    return static_cast<int64_t>(std::count_if(t.begin(), t.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
  };

  generate_options o;
  o.max_tokens = 40;
  o.stop_at_eos = false;
  o.logprobs = 3;
  std::vector<token_logprob> waiting, streamed;
  int64_t emitted = 0;  // code points before the current piece
  o.on_logprobs = [&](std::vector<token_logprob> t) { waiting = std::move(t); };
  auto g = generate(*s, *tok, *prompt, o, [&](std::string_view piece) {
    for (const auto& e : waiting) {
      CHECK(e.text_offset >= emitted);
      CHECK(e.text_offset <= emitted + code_points(piece));
    }
    streamed.insert(streamed.end(), waiting.begin(), waiting.end());
    waiting.clear();
    emitted += code_points(piece);
    return true;
  });
  REQUIRE(g);
  CHECK(waiting.empty());
  // Ended by max_tokens: one entry per token, in order, all of them streamed.
  REQUIRE(g->logprobs.size() == g->tokens.size());
  REQUIRE(streamed.size() == g->logprobs.size());
  for (size_t i = 0; i < g->tokens.size(); ++i) {
    INFO("token " << i);
    const auto& e = g->logprobs[i];
    CHECK(e.id == g->tokens[i]);
    CHECK(streamed[i].id == e.id);
    CHECK(e.logprob <= 0);
    REQUIRE(e.top.size() == 3);
    CHECK(e.top[0].first == e.id);  // greedy: the chosen token is the likeliest
    CHECK(e.top[0].second == e.logprob);
    CHECK(e.top[1].second <= e.top[0].second);
    CHECK(e.top[2].second <= e.top[1].second);
  }

  // A stop string: the tokens whose text starts before it keep their entries; the text after it
  // is never generated.
  const std::string stop = g->text.substr(g->text.size() / 2, 3);
  s->reset();
  o.stop = {stop};
  o.on_logprobs = {};
  auto stopped = generate(*s, *tok, *prompt, o);
  REQUIRE(stopped);
  REQUIRE(stopped->reason == stop_reason::stop_string);
  CHECK(stopped->logprobs.size() <= stopped->tokens.size());
  CHECK_FALSE(stopped->logprobs.empty());
  for (const auto& e : stopped->logprobs) CHECK(e.text_offset <= code_points(stopped->text));
  for (size_t i = 0; i < stopped->logprobs.size(); ++i) CHECK(stopped->logprobs[i].id == g->tokens[i]);

  s->reset();
  o.logprobs = max_top_logprobs + 1;
  auto refused = generate(*s, *tok, *prompt, o);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().message.find("at most 20") != std::string::npos);
}

TEST_CASE("weights reach the device as the checkpoint stores them: quantized blocks, f16, no f32 copy",
          "[models][session]") {
  temp_dir dir;
  model_spec spec = tiny();
  spec.hidden = spec.ffn = 256;  // K-quant rows are 256 elements
  spec.heads = 8;
  spec.head_dim = 32;
  for (const tensor_type type : {tensor_type::q4_k, tensor_type::q8_0, tensor_type::f16}) {
    CAPTURE(to_string(type));
    write_gguf_model(dir / "m.gguf", spec, type);
    auto ckpt = checkpoint::open(dir / "m.gguf");
    REQUIRE(ckpt);
    auto cpu = gpu::make_cpu_executor(1);
    auto s = session::create(*cpu, *ckpt);
    REQUIRE(s);
    const models::tensor_view* o = ckpt->find("blk.0.attn_output.weight");
    REQUIRE(o);
    REQUIRE(o->type == type);
    auto on_device = cpu->get_parameters({"w.blk.0.attn_output.weight"});
    REQUIRE(on_device);
    const tensor& t = on_device->at("w.blk.0.attn_output.weight");
    CHECK(t.type == to_dtype(type));
    CHECK(t.bytes == std::vector<uint8_t>(o->data.begin(), o->data.end()));
    // q, k and v are one weight, their blocks stacked in that order (one product in a step); so
    // are gate and up.
    for (const auto& [fused, parts] :
         {std::pair{std::string("w.blk.0.attn_q.weight+blk.0.attn_k.weight+blk.0.attn_v.weight"),
                    std::vector<std::string>{"blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"}},
          std::pair{std::string("w.blk.0.ffn_gate.weight+blk.0.ffn_up.weight"),
                    std::vector<std::string>{"blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"}}}) {
      CAPTURE(fused);
      std::vector<uint8_t> want;
      for (const auto& name : parts) {
        const models::tensor_view* v = ckpt->find(name);
        REQUIRE(v);
        want.insert(want.end(), v->data.begin(), v->data.end());
      }
      auto stack = cpu->get_parameters({fused});
      REQUIRE(stack);
      CHECK(stack->at(fused).type == to_dtype(type));
      CHECK(stack->at(fused).bytes == want);
    }
    // Norm weights are vectors the checkpoint stores as F32: they stay f32.
    auto norm = cpu->get_parameters({"w.blk.0.attn_norm.weight"});
    REQUIRE(norm);
    CHECK(norm->at("w.blk.0.attn_norm.weight").type == dtype::f32);
    auto fused = s->prefill(std::vector<int32_t>{1, 2, 3});
    REQUIRE(fused);
    // The same model with every projection its own weight computes the same logits.
    auto cpu_apart = gpu::make_cpu_executor(1);
    session_options apart;
    apart.fuse_projections = false;
    auto s_apart = session::create(*cpu_apart, *ckpt, apart);
    REQUIRE(s_apart);
    REQUIRE(cpu_apart->get_parameters({"w.blk.0.attn_q.weight", "w.blk.0.ffn_up.weight"}));
    auto separate = s_apart->prefill(std::vector<int32_t>{1, 2, 3});
    REQUIRE(separate);
    REQUIRE(separate->size() == fused->size());
    for (size_t i = 0; i < fused->size(); ++i) CHECK(std::abs((*fused)[i] - (*separate)[i]) <= 1e-5f * std::max(1.0f, std::abs((*separate)[i])));
  }
}
