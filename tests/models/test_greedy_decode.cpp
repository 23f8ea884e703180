// Greedy decoding on the device (session::decode_greedy: steps that pick their own next token on
// the device and run back to back) against the one-step loop (decode, then first_argmax of the
// logits on the host), on the CPU executor and on Vulkan (lavapipe in CI); rewind; generate()'s
// greedy chunks against a model without them; errors that change nothing.
#include <catch2/catch.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpu/executor.hpp"
#include "model_writer.hpp"
#include "models/checkpoint_tokenizer.hpp"
#include "models/generate.hpp"
#include "models/sampler.hpp"
#include "models/session.hpp"

using namespace mesh;
using namespace mesh::models;
using namespace mesh::models::test;

namespace {

std::vector<int32_t> prompt_of(size_t n) {
  std::vector<int32_t> p;
  for (size_t i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((i * 53 + 7) % 300));
  return p;
}

session make_session(gpu::executor& ex, const checkpoint& ckpt, const std::string& prefix, int64_t slots = 1) {
  session_options o;
  o.prefix = prefix;
  o.slots = slots;
  o.context = 64;
  auto s = session::create(ex, ckpt, o);
  INFO((s ? std::string() : s.error().message));
  REQUIRE(s);
  return std::move(*s);
}

// The one-step loop's tokens after `prompt`: t0 = argmax of the prompt's logits, then `steps`
// more, each the argmax after decoding the one before.
std::vector<int32_t> host_loop(session& s, const std::vector<int32_t>& prompt, int64_t steps) {
  auto logits = s.prefill(prompt);
  REQUIRE(logits);
  std::vector<int32_t> tokens{first_argmax(*logits)};
  for (int64_t i = 0; i < steps; ++i) {
    auto l = s.decode(tokens.back());
    REQUIRE(l);
    tokens.push_back(first_argmax(*l));
  }
  return tokens;
}

void check_against_host_loop(gpu::executor& ex, const std::filesystem::path& model) {
  auto ckpt = checkpoint::open(model);
  REQUIRE(ckpt);
  session loop = make_session(ex, *ckpt, "loop.");
  session dev = make_session(ex, *ckpt, "dev.");
  REQUIRE(dev.greedy_chunk() > 0);
  const auto prompt = prompt_of(9);
  const std::vector<int32_t> want = host_loop(loop, prompt, 30);

  auto logits = dev.prefill(prompt);
  REQUIRE(logits);
  std::vector<int32_t> got{first_argmax(*logits)};
  for (const int64_t n : {7, 16, 1, 6}) {  // chunks of several sizes, 30 steps in all
    auto picked = dev.decode_greedy(0, got.back(), n);
    INFO((picked ? std::string() : picked.error().message));
    REQUIRE(picked);
    REQUIRE(static_cast<int64_t>(picked->size()) == n);
    got.insert(got.end(), picked->begin(), picked->end());
  }
  CHECK(got == want);
  CHECK(dev.position() == loop.position());
  CHECK(dev.stats().decode_tokens == 30);

  // Back to just after t9 (fed at position 9 + 9): the next five are the loop's again, the cache
  // rows past the rewind written anew.
  REQUIRE(dev.rewind(0, 9 + 10));
  CHECK(dev.position() == 19);
  auto again = dev.decode_greedy(0, want[10], 5);
  REQUIRE(again);
  CHECK(*again == std::vector<int32_t>(want.begin() + 11, want.begin() + 16));
}

// The final norm's weight (f32) made NaN: every logit is NaN, no step has a maximum. The
// chunk's first step reports it, and the sequence stays where it was.
void check_nan_error(gpu::executor& ex, const checkpoint& ckpt) {
  session s = make_session(ex, ckpt, "nan.");
  REQUIRE(s.prefill(prompt_of(4)));
  auto norm = ex.get_parameters({"nan.w.output_norm.weight"});
  REQUIRE(norm);
  const tensor& w = norm->at("nan.w.output_norm.weight");
  REQUIRE(w.type == dtype::f32);
  const std::vector<double> nans(static_cast<size_t>(element_count(w.dims)), std::nan(""));
  REQUIRE(ex.set_parameters({{"nan.w.output_norm.weight", tensor::from_values(w.type, w.dims, nans)}}));
  auto r = s.decode_greedy(0, 1, 5);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == error_code::invalid_argument);
  CHECK(r.error().message.find("after position 4 have no largest value") != std::string::npos);
  CHECK(s.position() == 4);
}

// The test model (Q8_0 GGUF) and a one-thread CPU executor.
struct tiny_q8 {
  temp_dir dir;
  std::optional<checkpoint> ckpt;
  std::unique_ptr<gpu::executor> cpu = gpu::make_cpu_executor(1);
  tiny_q8() {
    write_gguf_model(dir / "m.gguf", model_spec{}, tensor_type::q8_0);
    auto c = checkpoint::open(dir / "m.gguf");
    REQUIRE(c);
    ckpt.emplace(std::move(*c));
  }
};

}  // namespace

TEST_CASE("decode_greedy picks the one-step loop's tokens on the CPU executor", "[models][greedy]") {
  temp_dir dir;
  model_spec spec;
  write_gguf_model(dir / "m.gguf", spec, tensor_type::q8_0);
  auto cpu = gpu::make_cpu_executor(1);
  check_against_host_loop(*cpu, dir / "m.gguf");
}

TEST_CASE("decode_greedy picks the one-step loop's tokens on Vulkan (lavapipe in CI)", "[models][greedy][gpu]") {
  // One Vulkan executor for the process, never destroyed (see test_reference_llm.cpp).
  gpu::vulkan_options options;
  options.cache_dir = "-";
  static auto* vk = new expected<std::unique_ptr<gpu::executor>>(gpu::make_vulkan_executor(options));
  if (!*vk) {
    WARN("no Vulkan device: " << vk->error().message);
    return;
  }
  temp_dir dir;
  model_spec spec;
  write_gguf_model(dir / "q8.gguf", spec, tensor_type::q8_0);
  write_hf_model(dir / "hf", spec, "F16");
  check_against_host_loop(***vk, dir / "q8.gguf");
  check_against_host_loop(***vk, dir / "hf");
  auto q8 = checkpoint::open(dir / "q8.gguf");
  REQUIRE(q8);
  check_nan_error(***vk, *q8);
}

TEST_CASE("decode_greedy errors change nothing", "[models][greedy]") {
  const tiny_q8 t;
  gpu::executor* cpu = t.cpu.get();
  const checkpoint* ckpt = &*t.ckpt;
  session s = make_session(*cpu, *ckpt, "");
  REQUIRE(s.prefill(prompt_of(9)));
  for (const int64_t n : {int64_t{0}, int64_t{-3}, gpu::executor::max_repeated_runs + 1}) {
    auto r = s.decode_greedy(0, 1, n);
    REQUIRE_FALSE(r);
    CHECK(r.error().code == error_code::invalid_argument);
  }
  auto past = s.decode_greedy(0, 1, 64 - 9 + 1);
  REQUIRE_FALSE(past);
  CHECK(past.error().code == error_code::limit_exceeded);
  CHECK(past.error().message.find("context of 64") != std::string::npos);
  auto bad = s.decode_greedy(0, 300, 2);
  REQUIRE_FALSE(bad);
  CHECK(bad.error().message.find("token 300") != std::string::npos);
  CHECK(s.position() == 9);
  CHECK_FALSE(s.rewind(0, 10));  // ahead of where it stands
  CHECK_FALSE(s.rewind(0, -1));
  CHECK_FALSE(s.rewind(1, 0));  // no such slot
  CHECK_FALSE(s.decode_greedy(1, 1, 2));
  CHECK(s.position() == 9);
  // It fits exactly: 55 more.
  auto all = s.decode_greedy(0, 1, 64 - 9);
  REQUIRE(all);
  CHECK(s.position() == 64);
}

TEST_CASE("decode_greedy of one slot leaves the other slots as they were", "[models][greedy]") {
  const tiny_q8 t;
  gpu::executor* cpu = t.cpu.get();
  const checkpoint* ckpt = &*t.ckpt;
  session one = make_session(*cpu, *ckpt, "one.");
  session three = make_session(*cpu, *ckpt, "three.", 3);
  const std::vector<int32_t> want = host_loop(one, prompt_of(6), 12);
  // Slot 0 and 2 hold other sequences, slot 1 this one.
  REQUIRE(three.prefill(0, prompt_of(11)));
  auto own = three.prefill(1, prompt_of(6));
  REQUIRE(own);
  REQUIRE(three.prefill(2, prompt_of(3)));
  auto picked = three.decode_greedy(1, first_argmax(*own), 12);
  REQUIRE(picked);
  CHECK(std::vector<int32_t>(want.begin() + 1, want.end()) == *picked);
  CHECK(three.position(0) == 11);
  CHECK(three.position(1) == 6 + 12);
  CHECK(three.position(2) == 3);
  // Slot 2 continues as if alone: its next tokens are a one-slot session's after the same prompt.
  session alone = make_session(*cpu, *ckpt, "alone.");
  const std::vector<int32_t> want2 = host_loop(alone, prompt_of(3), 4);
  auto next2 = three.decode_greedy(2, want2[0], 4);
  REQUIRE(next2);
  CHECK(std::vector<int32_t>(want2.begin() + 1, want2.end()) == *next2);
}

TEST_CASE("generate() in greedy chunks equals the one-step loop, also when a callback stops it mid-chunk",
          "[models][greedy]") {
  const tiny_q8 t;
  gpu::executor* cpu = t.cpu.get();
  const checkpoint* ckpt = &*t.ckpt;
  session chunked = make_session(*cpu, *ckpt, "a.");
  session stepped = make_session(*cpu, *ckpt, "b.");
  REQUIRE(chunked.greedy_chunk() == 16);
  auto vocab = load_tokenizer(*ckpt, chunked.config());
  REQUIRE(vocab);
  auto tok = tokenizer::create(vocab->vocab);
  REQUIRE(tok);
  const auto prompt = prompt_of(5);
  for (const int64_t stop_after : {int64_t{0}, int64_t{5}, int64_t{20}}) {
    generate_options greedy;
    greedy.max_tokens = 37;  // two whole chunks of 16 and a part
    greedy.stop_at_eos = false;
    if (stop_after > 0) greedy.on_token = [stop_after](int64_t n) { return n < stop_after; };
    // The same picks one step at a time: sampling at temperature 1 from the top 1 is the
    // largest logit, but not "greedy" to generate(), which then decodes step by step.
    generate_options top1 = greedy;
    top1.sampling.temperature = 1.0f;
    top1.sampling.top_k = 1;
    chunked.reset();
    stepped.reset();
    std::string text_a, text_b;
    auto a = generate(chunked, *tok, prompt, greedy, [&](std::string_view p) { return text_a += p, true; });
    auto b = generate(stepped, *tok, prompt, top1, [&](std::string_view p) { return text_b += p, true; });
    REQUIRE(a);
    REQUIRE(b);
    INFO("stop after " << stop_after);
    CHECK(a->tokens == b->tokens);
    CHECK(a->text == b->text);
    CHECK(text_a == text_b);
    CHECK(a->reason == b->reason);
    CHECK(static_cast<int64_t>(a->tokens.size()) == (stop_after > 0 ? stop_after : 37));
    // The model stands where the one-step loop leaves it: the last token picked is not fed.
    CHECK(chunked.position() == stepped.position());
    CHECK(chunked.position() == 5 + static_cast<int64_t>(a->tokens.size()) - 1);
  }
  // Only the greedy run took the device loop: its session's greedy step holds its history.
  CHECK(cpu->get_parameters({"a.greedy.history"}));
  CHECK_FALSE(cpu->get_parameters({"b.greedy.history"}));
}

TEST_CASE("decode_greedy: logits with no largest value (NaN weights) are an error naming the position", "[models][greedy]") {
  const tiny_q8 t;
  check_nan_error(*t.cpu, *t.ckpt);
}
