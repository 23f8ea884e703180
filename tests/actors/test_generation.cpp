// The pure parts of generation through a node: what a generate request must satisfy (each refusal
// names the field and the value), the context fit, finish reasons and the stream's accounting.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "actors/generate_request_check.hpp"
#include "actors/generation_stream.hpp"

using namespace mesh;
using namespace mesh::generation;

namespace {

msg::generate_request good() {
  msg::generate_request r;
  r.request = 3;
  r.model = "/m/tiny.gguf";
  r.prompt = "hello";
  r.max_tokens = 16;
  return r;
}

/// The error message check_request gives after `edit`, or "" when it accepts.
template <class Edit>
std::string refusal(Edit edit) {
  auto r = good();
  edit(r);
  auto o = check_request(r);
  if (o) return "";
  CHECK(o.error().code == error_code::invalid_argument);
  return o.error().message;
}

}  // namespace

TEST_CASE("a generate request maps onto generate's options", "[actors][generation]") {
  auto r = good();
  r.sampling = {0.7f, 40, 0.9f, 0.05f, 1.2f, 77};
  r.stop = {"\n\n", "END"};
  auto o = check_request(r);
  REQUIRE(o);
  CHECK(o->max_tokens == 16);
  CHECK(o->stop == r.stop);
  CHECK(o->sampling.temperature == 0.7f);
  CHECK(o->sampling.top_k == 40);
  CHECK(o->sampling.top_p == 0.9f);
  CHECK(o->sampling.min_p == 0.05f);
  CHECK(o->sampling.repetition_penalty == 1.2f);
  CHECK(o->sampling.seed == 77);
  CHECK(o->stop_at_eos);
}

TEST_CASE("bad generate requests are refused with the field and the value named", "[actors][generation]") {
  CHECK(refusal([](auto&) {}).empty());
  CHECK(refusal([](auto& r) { r.model.clear(); }).find("no model path given") != std::string::npos);
  CHECK(refusal([](auto& r) { r.model = std::string(5000, 'a'); }).find("model path is 5000 bytes long") != std::string::npos);
  CHECK(refusal([](auto& r) { r.model = std::string("a\0b", 3); }).find("NUL") != std::string::npos);
  CHECK(refusal([](auto& r) { r.prompt.clear(); }).find("the prompt is empty") != std::string::npos);
  CHECK(refusal([](auto& r) { r.max_tokens = 0; }).find("max_tokens is 0") != std::string::npos);
  CHECK(refusal([](auto& r) { r.max_tokens = 5'000'000; }).find("max_tokens 5000000 is more than the node allows") != std::string::npos);
  CHECK(refusal([](auto& r) { r.sampling.temperature = -0.5f; }).find("temperature -0.5 is not a finite number >= 0") != std::string::npos);
  CHECK(refusal([](auto& r) { r.sampling.temperature = NAN; }).find("temperature nan") != std::string::npos);
  CHECK(refusal([](auto& r) { r.sampling.temperature = INFINITY; }).find("temperature inf") != std::string::npos);
  CHECK(refusal([](auto& r) { r.sampling.top_k = -1; }).find("top_k -1 is negative") != std::string::npos);
  CHECK(refusal([](auto& r) { r.sampling.top_p = 0; }).find("top_p 0 is outside (0, 1]") != std::string::npos);
  CHECK(refusal([](auto& r) { r.sampling.top_p = 1.5f; }).find("top_p 1.5") != std::string::npos);
  CHECK(refusal([](auto& r) { r.sampling.min_p = -0.1f; }).find("min_p -0.1 is outside [0, 1]") != std::string::npos);
  CHECK(refusal([](auto& r) { r.sampling.repeat_penalty = 0; }).find("repeat_penalty 0 is not a finite number > 0") != std::string::npos);
  CHECK(refusal([](auto& r) { r.stop = {"a", ""}; }).find("stop string 2 is empty") != std::string::npos);
  CHECK(refusal([](auto& r) { r.stop.assign(17, "x"); }).find("17 stop strings; at most 16") != std::string::npos);
  CHECK(refusal([](auto& r) { r.stop = {std::string(300, 'x')}; }).find("stop string 1 is 300 bytes long") != std::string::npos);
  CHECK(refusal([](auto& r) { r.chat_template = "chatml"; }).find("without chat") != std::string::npos);
  // Neutral and greedy values pass: temperature 0, top_k 0, top_p 1, min_p 0 and 1.
  CHECK(refusal([](auto& r) { r.sampling = {0, 0, 1, 1, 1, 0}; }).empty());
}

TEST_CASE("max_tokens is capped by the context left after the prompt", "[actors][generation]") {
  auto room = fit_context(10, 100, 64, "m.gguf");
  REQUIRE(room);
  CHECK(room->max_tokens == 54);
  CHECK(room->capped);
  auto fits = fit_context(10, 54, 64, "m.gguf");
  REQUIRE(fits);
  CHECK(fits->max_tokens == 54);
  CHECK_FALSE(fits->capped);
  auto full = fit_context(64, 1, 64, "m.gguf");
  REQUIRE_FALSE(full);
  CHECK(full.error().code == error_code::limit_exceeded);
  CHECK(full.error().message == "generate: the prompt is 64 tokens, which leaves no room in the context of 64 positions of m.gguf "
                                "(shorten the prompt)");
}

TEST_CASE("finish reasons: length becomes context when the context capped the generation", "[actors][generation]") {
  using models::stop_reason;
  CHECK(finish_of(stop_reason::max_tokens, {5, false}) == finish_reason::length);
  CHECK(finish_of(stop_reason::max_tokens, {5, true}) == finish_reason::context);
  CHECK(finish_of(stop_reason::eos, {5, true}) == finish_reason::eos);
  CHECK(finish_of(stop_reason::stop_string, {5, false}) == finish_reason::stop);
  CHECK(finish_of(stop_reason::callback, {5, false}) == finish_reason::cancelled);
}

TEST_CASE("the stream counts tokens into pieces and the final message", "[actors][generation]") {
  generation_stream s(9);
  s.token(1);
  s.token(2);  // a token whose text is held back (part of a character)
  auto p = s.piece("d\xc3\xa9");
  CHECK(p == msg::generate_piece{9, "d\xc3\xa9", 2});
  s.token(1);  // never decreases
  CHECK(s.piece("x").tokens == 2);
  models::generation g;
  g.tokens = {5, 6, 7};
  g.prompt_tokens = 4;
  g.prompt_seconds = 0.5;
  g.generate_seconds = 1.5;
  g.reason = models::stop_reason::max_tokens;
  auto d = s.done(g, {3, true}, 0.25);
  CHECK(d == msg::generate_done{9, true, finish_reason::context, 4, 3, 0.25, 0.5, 1.5, error_code::internal, ""});
  auto f = failed(9, {error_code::not_found, "cannot open x"});
  CHECK_FALSE(f.ok);
  CHECK(f.code == error_code::not_found);
  CHECK(f.error == "cannot open x");
  CHECK(cancelled(4).finish == finish_reason::cancelled);
}
