// Every node message round-trips; hostile bytes give errors (this runs under ASan in CI).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "actors/messages.hpp"

using namespace mesh;
using namespace mesh::msg;

namespace {
std::vector<message> samples() {
  const tensor t = tensor::from_values(dtype::f16, {2, 2}, {1, 2, 3, 4});
  return {hello{7, "llvmpipe", "cpu", 12.5, 3.25, 1 << 30, false},
          heartbeat{7, 42, 3},
          submit_job{9, {'a', 'b', 'c'}, 3},
          job_result{9, true, "", {{"y", t}}, 2, {"ab", "cd"}, 1, 5'000'000'123},
          run_stage{1, 2, 3, "coord", {'w'}, {"cut.4"}, {{"cut.7", "node-b", 4}}, 17, {{"x", t}}},
          activation{"coord", 1, 2, 3, {"cut.4", t}},
          stage_done{1, 2, 3, false, "out of memory", {}},
          status_request{5},
          status_reply{5, "me", "dev", 1.5, 10, {{"p", "healthy", "1.2.3.4:5", "gpu", 2, 1, 0.25, 17, true}}, {{9, "c", "done", 3, 1, 0.5, "data_parallel"}}},
          open_session{3, {'g'}},
          infer{3, 4, {{"x", t}}},
          close_session{3},
          peer_exchange{{'M', 'P', 'X', 1, 0, 0}},
          open_training{4, train_spec{1, 2, 30, 6, 16, 5, 1, 99, {'g'}, {'a'}, {'d'}, {'o'}, {{"w", t}}, {{"x", t}}, 0, 10}},
          train_setup{5, train_spec{0, 0, 10, 1, 1, 1, 0, 1, {'g'}, {'a'}, {}, {}, {}, {}}, "client-c", 4},
          train_step{5, 3, 2, {"node-a", "node-b"}, {9, 12}, 3, true, false, {{2, {{"x", t}}}}},
          allreduce_piece{5, "node-a", 77, 2, 1, {1, 2, 3, 4}},
          train_reduced{5, 3, 2, true, "", 0.75, 4096},
          train_state{5, 4, {{"w", t}}},
          train_progress{4, 4, 30, 0.5, 1234.5, 3, 8192},
          job_progress{9, 2, 3, 5, "node-b"},
          train_resume{4, "node-a", {{"x", t}}},
          train_checkpoint{4, 20, {{"w", t}}},
          cancel_stages{9, 2}};
}
}  // namespace

TEST_CASE("non-finite and subnormal floating-point values round-trip bit for bit", "[actors][messages]") {
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
  hello h{7, "dev", "cpu", std::numeric_limits<float>::infinity(), 1.0, 1, false};
  auto bytes = encode_message(h);
  REQUIRE(bytes);
  auto back = decode_message(bytes->data(), bytes->size());
  REQUIRE(back);
  CHECK(std::isinf(std::get<hello>(*back).gflops));
}

TEST_CASE("every message kind round-trips", "[actors][messages]") {
  for (const auto& m : samples()) {
    auto bytes = encode_message(m);
    REQUIRE(bytes);
    auto back = decode_message(bytes->data(), bytes->size());
    INFO(kind_name(m));
    REQUIRE(back);
    CHECK(*back == m);
  }
}

TEST_CASE("truncated, extended, mutated and unknown messages are errors", "[actors][messages]") {
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
  const uint8_t unknown[] = {200, 0, 0};
  auto r = decode_message(unknown, sizeof unknown);
  REQUIRE_FALSE(r);
  CHECK(r.error().message.find("unknown message kind") != std::string::npos);
  // A tensor whose byte count does not match its shape is refused after parsing.
  activation bad{"c", 1, 1, 0, {"x", tensor::from_values(dtype::f32, {3}, {1, 2, 3})}};
  bad.value.value.bytes.pop_back();
  auto bytes = *encode_message(bad);
  auto rb = decode_message(bytes.data(), bytes.size());
  REQUIRE_FALSE(rb);
  CHECK(rb.error().message.find("activation: tensor \"x\"") != std::string::npos);
}
