// Every node message round-trips; hostile bytes give errors (this runs under ASan in CI).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "graph/builder.hpp"
#include "test_ids.hpp"
#include "wire/messages.hpp"

using namespace mesh;
using namespace mesh::msg;

namespace {
/// A small valid graph (with a tensor when `with_tensor`), as a message carries it.
graph_payload small_graph(bool with_tensor = true) {
  builder b;
  auto x = b.input("x", dtype::f32, {2, 2});
  auto w = b.parameter("w", dtype::f32, {2, 2});
  b.output("y", matmul(x, w));
  wire_graph g{*b.finish(), {}};
  if (with_tensor) g.tensors["w"] = tensor::from_values(dtype::f32, {2, 2}, {1, 2, 3, 4});
  return graph_payload(std::move(g));
}

/// 64 bytes of a signature's shape (the codec carries them as they are; test_takeover_grant.cpp
/// checks real ones).
signature grant_signature() {
  signature s{};
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<uint8_t>(i * 7 + 1);
  return s;
}

/// A data file as a training run names it: every field of the vocabulary set.
train_text_data text_data() {
  train_text_data d;
  d.path = "/data/chats.jsonl";
  d.file = {"", {}, 123456, {}, {}};
  d.file.id[0] = 9;
  d.format = 1;
  d.sequence = 512;
  d.shuffle_rows = 64;
  d.vocab.model = 1;
  d.vocab.tokens = {"<unk>", "<s>", "\xe2\x96\x81" "a"};
  d.vocab.scores = {0, 0, -1.5f};
  d.vocab.token_types = {2, 3, 1};
  d.vocab.merge_left = {"a"};
  d.vocab.merge_right = {"b"};
  d.vocab.pre_tokenizer = "llama-bpe";
  d.vocab.pre_tokenizer_patterns = {"\\s+"};
  d.vocab.ignore_merges = true;
  d.vocab.add_space_prefix = false;
  d.vocab.bos_id = 1;
  d.vocab.unk_id = 0;
  d.vocab.add_bos = true;
  d.chat_template = "{{ messages }}";
  return d;
}

std::vector<message> samples() {
  const tensor t = tensor::from_values(dtype::f16, {2, 2}, {1, 2, 3, 4});
  return {hello{7, "llvmpipe", device_kind::cpu, 12.5, 3.25, 1 << 30, false},
          heartbeat{7, 42, 3, uint64_t{9} << 30},
          submit_job{9, small_graph(), strategy::automatic},
          job_result{9, false, "no capacity", {{"y", t}}, 2, {test::named("ab"), test::named("cd")}, strategy::data_parallel, 5'000'000'123, error_code::limit_exceeded},
          run_stage{1, 2, 3, test::named("coord"), small_graph(), {{"cut.4", test::named("node-a")}}, {{"cut.7", test::named("node-b"), 4}}, 17, {{"x", t}}},
          activation{test::named("coord"), 1, 2, 3, {"cut.4", t}},
          stage_done{1, 2, 3, false, "out of memory", {}, error_code::device},
          status_request{5},
          status_reply{5, test::named("me"), "dev", 1.5, uint64_t{16} << 30, uint64_t{5} << 30, 10, {{test::named("p"), peer_health::suspect, "1.2.3.4:5", "gpu", 2, 1, uint64_t{80} << 30, uint64_t{61} << 30, 0.25, 17, true, 3, "version_mismatch: ..."}}, {{9, test::named("c"), job_state::done, 3, 1, 0.5, job_kind::training, 4, 30}}},
          open_session{3, graph_payload::from_bytes("nope", 4)},
          msg::infer{3, 4, {{"x", t}}},
          close_session{3},
          peer_exchange{{'M', 'P', 'X', 1, 0, 0}},
          open_training{4, train_spec{train_method::diloco, 2, 30, 6, 16, 5, wire_format::bf16, 99, small_graph(false), small_graph(false), small_graph(false), small_graph(false), {{"w", t}}, {{"x", t}}, 0, 10, {text_data()}}},
          train_setup{5, train_spec{train_method::data_parallel, 0, 10, 1, 1, 1, wire_format::f32, 1, small_graph(false), small_graph(false), {}, {}, {}, {}}, test::named("client-c"), 4, {3, test::named("node-d"), grant_signature()}},
          train_step{5, 3, 2, {test::named("node-a"), test::named("node-b")}, {9, 12}, 3, true, false, {{2, {{"x", t}}}}},
          train_step{5, 4, 1, {test::named("node-a"), test::named("node-b")}, {9, 12}, 4, false, false, {}, true},
          allreduce_piece{5, test::named("node-a"), 77, 2, 1, {1, 2, 3, 4}},
          train_reduced{5, 3, 2, false, "step failed", 0.75, 4096, error_code::device},
          train_state{5, 4, {{"w", t}}},
          train_progress{4, 4, 30, 0.5, 1234.5, 3, 8192},
          job_progress{9, 2, 3, 5, test::named("node-b")},
          train_resume{4, test::named("node-a"), {{"x", t}}, {2, test::named("node-b"), grant_signature()}},
          train_checkpoint{4, 20, {{"w", t}}},
          cancel_stages{9, 2}, stage_accepted{9, 1, 2}, route_open{9, 1, 0, 2},
          train_ready{4, 7, 1}, train_ready{4, 7, 2, false, 0, true}, ring_go{4, 7, 1},
          generate_request{11, "/models/tiny.gguf", "Once upon a time", true, "chatml", {0.8f, 40, 0.95f, 0.05f, 1.1f, 1234567890123ull}, {"\n\n", "END"}, 64, "/adapters/tiny-lora"},
          generate_piece{11, "d\xc3\xa9j\xc3\xa0", 3},
          generate_done{11, true, finish_reason::context, 5, 59, 0.25, 0.125, 1.5, error_code::internal, ""},
          generate_done{12, false, finish_reason::length, 0, 0, 0, 0, 0, error_code::not_found, "cannot open /m/x.gguf: No such file or directory"},
          generate_cancel{11},
          models_request{3, models_action::load, "/models/tiny.gguf", "chatml", 2048, 3},
          models_request{4, models_action::list, "", "", 0, 0},
          models_request{5, models_action::replan, "tiny", "", 0, 3},
          models_reply{3, true, error_code::internal, "", {{"tiny", "/models/tiny.gguf", 2048, 22, true, false, {{test::named("node-a"), 0, 22}}}, {"/m/x.gguf", "/m/x.gguf", 64, 1, false, true, {}}}, "http://127.0.0.1:8080"},
          models_reply{5, true, error_code::internal, "", {{"big", "/m/big.gguf", 512, 6, false, false, {{test::named("node-a"), 0, 2}, {test::named("node-b"), 2, 5}, {test::named("node-c"), 5, 6}}}}, ""},
          models_reply{4, false, error_code::not_found, "no model 'x' is loaded", {}, ""},
          stage_open{21, 3, "/models/big.gguf", 2, 5, 4096, 1, true, {}},
          stage_open{24, 4, "/models/big", 0, 2, 512, 16, false,
                     {{"config.json", {1, 2, 3, 250, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255}, 712},
                      {"model-00001-of-00002.safetensors", {9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, 5000000000ull}}},
          stage_step{22, 3, 2, 17, tensor::from_floats({2, 3}, {0.5f, -1.0f, 2.0f, 0.0f, 1e-30f, -7.25f}), {}},
          stage_step{25, 3, 0, 0, tensor::from_floats({2, 3}, {0.5f, -1.0f, 2.0f, 0.0f, 1e-30f, -7.25f}), {{3, 40}, {0, 7}}},
          stage_step{23, 4, 0, 0, tensor::from_ints({3}, {1, 299, 7}), {}},
          stage_close{3},
          stage_reply{22, true, error_code::internal, "", tensor::from_floats({4}, {1.0f, 2.0f, 3.0f, 4.0f})},
          stage_reply{21, false, error_code::not_found, "node 1a2b3c4d has no file /models/big.gguf", tensor::zeros(dtype::f32, {0})},
          blob_get{31, {9, 8, 7}, uint64_t{3} << 32, 1u << 20},
          blob_chunk{31, true, error_code::internal, "", uint64_t{3} << 32, {4, 5, 6}, {0, 1, 2, 255, 128}},
          blob_chunk{32, false, error_code::not_found, "node 1a2b3c4d: offers no blob 0909", 0, {}, {}},
          shared_region_offer{5, test::named("node-a"), 4242, 17, (uint64_t{1} << 32) + 64,
                              {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 255}},
          shared_region_answer{5, test::named("node-a"), 4242, 17, true, ""},
          shared_region_answer{5, test::named("node-a"), 4242, 17, false, "no shared region at /proc/4242/fd/17 on this host"},
          allreduce_piece_shared{5, test::named("node-a"), 77, 2, 1, 4242, 17, (uint64_t{1} << 32) + 64, std::vector<uint8_t>(16, 9),
                                 uint64_t{5} << 30, 4096},
          host_reduce_mark{5, test::named("node-a"), 77 * 256 + 3, 1, 4242, 17, (uint64_t{1} << 32) + 64, std::vector<uint8_t>(16, 9)}};
}
}  // namespace

TEST_CASE("a shared region offer, piece or host all-reduce mark whose nonce is not 16 bytes is refused, naming it", "[wire][messages]") {
  for (size_t n : {0, 15, 17}) {
    for (const message& m : {message(shared_region_offer{5, test::named("node-a"), 1, 2, 4096, std::vector<uint8_t>(n, 7)}),
                             message(allreduce_piece_shared{5, test::named("node-a"), 1, 0, 0, 1, 2, 4096, std::vector<uint8_t>(n, 7), 0, 8}),
                             message(host_reduce_mark{5, test::named("node-a"), 1, 0, 1, 2, 4096, std::vector<uint8_t>(n, 7)})}) {
      auto bytes = encode_message(m);
      REQUIRE(bytes);
      auto r = decode_message(bytes->data(), bytes->size());
      REQUIRE_FALSE(r);
      CHECK(r.error().code == error_code::decode_error);
      CHECK(r.error().message.find(std::string(kind_name(m)) + ": a nonce of " + std::to_string(n) + " bytes, not 16") != std::string::npos);
    }
  }
}

TEST_CASE("non-finite and subnormal floating-point values round-trip bit for bit", "[wire][messages]") {
  // A diverged training reports an infinite loss. CAF 0.17's float packing never returned for
  // infinity (the encoding thread hung; fuzz_messages found it), and it does not keep NaN or
  // subnormals; the codec writes IEEE 754 bits instead.
  const double values[] = {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                           std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::denorm_min(),
                           -0.0, 1e308, 0.1};
  for (double v : values) {
    INFO("value " << v);
    train_progress p{4, 4, 30, v, v, 3, 8192};
    auto bytes = encode_message(p);
    REQUIRE(bytes);
    auto back = decode_message(bytes->data(), bytes->size());
    REQUIRE(back);
    const auto& q = std::get<train_progress>(*back);
    CHECK(std::memcmp(&q.loss, &v, sizeof v) == 0);
    CHECK(std::memcmp(&q.samples_per_s, &v, sizeof v) == 0);
  }
  hello h{7, "dev", device_kind::cpu, std::numeric_limits<float>::infinity(), 1.0, 1, false};
  auto bytes = encode_message(h);
  REQUIRE(bytes);
  auto back = decode_message(bytes->data(), bytes->size());
  REQUIRE(back);
  CHECK(std::isinf(std::get<hello>(*back).gflops));
}

TEST_CASE("every message kind round-trips", "[wire][messages]") {
  for (const auto& m : samples()) {
    auto bytes = encode_message(m);
    REQUIRE(bytes);
    auto back = decode_message(bytes->data(), bytes->size());
    INFO(kind_name(m));
    REQUIRE(back);
    CHECK(*back == m);
  }
}

TEST_CASE("truncated, extended, mutated and unknown messages are errors", "[wire][messages]") {
  std::mt19937_64 rng(1);
  for (const auto& m : samples()) {
    auto bytes = *encode_message(m);
    for (size_t n = 0; n < bytes.size(); ++n) CHECK_FALSE(decode_message(bytes.data(), n));
    auto longer = bytes;
    longer.push_back(0);
    CHECK_FALSE(decode_message(longer.data(), longer.size()));
    for (int i = 0; i < 300; ++i) {
      auto copy = bytes;
      copy[rng() % copy.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
      (void)decode_message(copy.data(), copy.size());  // any result, but no crash or huge allocation
    }
  }
  const uint8_t unknown[] = {protocol_version & 0xff, protocol_version >> 8, 200};
  auto r = decode_message(unknown, sizeof unknown);
  REQUIRE_FALSE(r);
  CHECK(r.error().message.find("unknown message kind") != std::string::npos);
  // A tensor whose byte count does not match its shape is refused after parsing.
  activation bad{test::named("c"), 1, 1, 0, {"x", tensor::from_values(dtype::f32, {3}, {1, 2, 3})}};
  bad.value.value.bytes.pop_back();
  auto bytes = *encode_message(bad);
  auto rb = decode_message(bytes.data(), bytes.size());
  REQUIRE_FALSE(rb);
  CHECK(rb.error().message.find("activation: tensor \"x\"") != std::string::npos);
}

TEST_CASE("a message of another protocol version is refused with both versions named", "[wire][messages]") {
  auto bytes = *encode_message(heartbeat{1, 2, 3, 0});
  bytes[0] = static_cast<uint8_t>(protocol_version + 1);
  auto r = decode_message(bytes.data(), bytes.size());
  REQUIRE_FALSE(r);
  CHECK(r.error().code == error_code::version_mismatch);
  CHECK(r.error().message.find(std::to_string(protocol_version + 1)) != std::string::npos);
  CHECK(r.error().message.find("this node speaks version " + std::to_string(protocol_version)) != std::string::npos);
}

TEST_CASE("an enum value out of range is refused by the decoder", "[wire][messages]") {
  // peer_status.health is the second field of the first peer: find it by encoding both states.
  peer_status p;
  p.node = test::named("p");
  p.health = peer_health::healthy;
  status_reply a{1, test::named("n"), "d", 0, 0, 0, 0, {p}, {}};
  auto bytes = *encode_message(a);
  status_reply b = a;
  b.peers[0].health = peer_health::dead;
  auto other = *encode_message(b);
  REQUIRE(bytes.size() == other.size());
  size_t at = 0;
  while (at < bytes.size() && bytes[at] == other[at]) ++at;
  REQUIRE(at < bytes.size());
  bytes[at] = 77;
  auto r = decode_message(bytes.data(), bytes.size());
  REQUIRE_FALSE(r);
  CHECK(r.error().code == error_code::decode_error);
  CHECK(r.error().message.find("status_reply: enum value 77 out of range") != std::string::npos);
  // A finish reason past the last one (the last byte before the done message's error fields).
  generate_done d{1, true, finish_reason::eos, 1, 2, 0, 0, 0, error_code::internal, ""};
  auto done = *encode_message(d);
  generate_done e = d;
  e.finish = finish_reason::cancelled;
  auto other_done = *encode_message(e);
  size_t diff = 0;
  while (diff < done.size() && done[diff] == other_done[diff]) ++diff;
  REQUIRE(diff < done.size());
  done[diff] = static_cast<uint8_t>(enum_limit(finish_reason{}));
  auto rd = decode_message(done.data(), done.size());
  REQUIRE_FALSE(rd);
  CHECK(rd.error().message.find("generate_done: enum value 5 out of range") != std::string::npos);
  // A strategy of another build's numbering never reaches a job engine.
  auto job = *encode_message(submit_job{1, {}, strategy::pipeline});
  job.back() = 9;
  CHECK_FALSE(decode_message(job.data(), job.size()));
}

TEST_CASE("decoding is bounded by a multiple of the message size and by the receiver's budget", "[wire][messages]") {
  // Many empty stop strings: 4 bytes each on the wire, 32 bytes each (a std::string) in memory.
  generate_request r;
  r.stop.assign(200000, "");
  auto bytes = *encode_message(r);
  // Within the fixed multiple of its size: decodes.
  REQUIRE(decode_message(bytes.data(), bytes.size()));
  // Past the receiver's budget: refused, as limit_exceeded, naming the budget.
  auto small = decode_message(bytes.data(), bytes.size(), 1 << 20);
  REQUIRE_FALSE(small);
  CHECK(small.error().code == error_code::limit_exceeded);
  CHECK(small.error().message.find("budget of 1048576 bytes") != std::string::npos);
}

TEST_CASE("a graph inside a message is validated against the receiver's limits as it is decoded", "[wire][messages]") {
  // The message still decodes: the engine answers the sender with the graph's error instead of
  // the message vanishing into the refusal log.
  const submit_job job{7, small_graph(), strategy::pipeline};
  auto bytes = encode_message(job);
  REQUIRE(bytes);
  auto fine = decode_message(bytes->data(), bytes->size());
  REQUIRE(fine);
  const auto& ok = std::get<submit_job>(*fine).graph;
  REQUIRE(ok.value);
  CHECK(ok.value->g.find_output("y") >= 0);
  graph_limits tight;
  tight.max_nodes = 2;
  auto refused = decode_message(bytes->data(), bytes->size(), default_decode_budget, &tight);
  REQUIRE(refused);
  const auto& p = std::get<submit_job>(*refused).graph;
  CHECK_FALSE(p.value);
  REQUIRE(p.problem);
  CHECK(p.problem->code == error_code::limit_exceeded);
  auto why = p.get("the graph");
  REQUIRE_FALSE(why);
  CHECK(why.error().message.find("the graph was rejected") == 0);
  // Encoded again (as a node relaying it would), the refused graph keeps its bytes.
  auto again = encode_message(*refused);
  REQUIRE(again);
  CHECK(*again == *bytes);
}
