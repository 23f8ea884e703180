// The generation worker on a tiny checkpoint and the CPU executor: what it streams equals an
// in-process models::generate with the same options, errors come back as failed messages naming
// the problem, a model loads once, and withdrawn requests stop.
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "actors/generation_worker.hpp"
#include "model_writer.hpp"
#include "reference_generation.hpp"
#include "models/checkpoint_tokenizer.hpp"
#include "models/generate.hpp"
#include "models/session.hpp"
#include "test_ids.hpp"

using namespace mesh;
using namespace mesh::models::test;

namespace {

/// What the worker sent, per request, until its generate_done.
class collector {
 public:
  void operator()(const node_id&, const msg::message& m) {
    std::lock_guard<std::mutex> lock(m_);
    if (auto* p = std::get_if<msg::generate_piece>(&m)) pieces_[p->request].push_back(*p);
    if (auto* d = std::get_if<msg::generate_done>(&m)) done_[d->request] = *d;
    cv_.notify_all();
  }
  /// The final message of `request` (waits up to a minute).
  msg::generate_done wait(uint64_t request) {
    std::unique_lock<std::mutex> lock(m_);
    const bool came = cv_.wait_for(lock, std::chrono::minutes(1), [&] { return done_.count(request) > 0; });
    REQUIRE(came);
    return done_[request];
  }
  std::string text(uint64_t request) {
    std::lock_guard<std::mutex> lock(m_);
    std::string t;
    for (const auto& p : pieces_[request]) t += p.text;
    return t;
  }
  std::vector<msg::generate_piece> pieces(uint64_t request) {
    std::lock_guard<std::mutex> lock(m_);
    return pieces_[request];
  }
  bool has_done(uint64_t request) {
    std::lock_guard<std::mutex> lock(m_);
    return done_.count(request) > 0;
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::map<uint64_t, std::vector<msg::generate_piece>> pieces_;
  std::map<uint64_t, msg::generate_done> done_;
};

model_spec tiny() {
  model_spec s;
  s.layers = 1;
  s.context = 64;
  return s;
}


/// The node's model host over CPU executors (counting them), with the worker over it.
std::unique_ptr<serving::local_backend> make_host(int* executors_made, size_t max_path_queued = 8) {
  serving::local_backend_options o;
  o.make_executor = [executors_made]() -> expected<std::unique_ptr<gpu::executor>> {
    if (executors_made) ++*executors_made;
    return gpu::make_cpu_executor(1);
  };
  o.max_path_queued = max_path_queued;
  auto h = serving::local_backend::create(std::move(o));
  REQUIRE(h);
  return std::move(*h);
}

struct fixture {
  temp_dir dir;
  std::filesystem::path model = dir / "m.gguf";
  collector got;
  int executors_made = 0;
  std::unique_ptr<serving::local_backend> host = make_host(&executors_made);
  generation::worker w{*host, [this](const node_id& to, const msg::message& m) { got(to, m); }};
  fixture() { write_gguf_model(model, tiny(), models::tensor_type::q8_0); }
  msg::generate_request request(uint64_t id, uint32_t max_tokens = 12) {
    msg::generate_request r;
    r.request = id;
    r.model = model.string();
    r.prompt = "hello there";
    r.max_tokens = max_tokens;
    return r;
  }
};

const node_id client_a = test::named("client-a");

}  // namespace

TEST_CASE("the worker streams what models::generate makes, greedy and seeded, loading the model once", "[actors][generation]") {
  fixture f;
  auto greedy = f.request(1);
  f.w.submit(client_a, greedy);
  auto d = f.got.wait(1);
  REQUIRE(d.ok);
  models::generate_options o;
  o.max_tokens = 12;
  auto ref = reference_generation(f.model, "hello there", o);
  CHECK(f.got.text(1) == ref.text);
  CHECK(d.tokens == ref.tokens.size());
  CHECK(d.prompt_tokens == ref.prompt_tokens);
  CHECK(d.finish == (ref.reason == models::stop_reason::eos ? finish_reason::eos : finish_reason::length));
  CHECK(d.load_seconds > 0);
  // Pieces count tokens that never decrease and end at most at the total.
  uint32_t last = 0;
  for (const auto& p : f.got.pieces(1)) {
    CHECK(p.tokens >= last);
    CHECK(p.tokens <= d.tokens);
    last = p.tokens;
  }

  auto seeded = f.request(2);
  seeded.sampling = {0.9f, 40, 0.95f, 0.05f, 1.1f, 9};
  seeded.stop = {"zz"};
  f.w.submit(client_a, seeded);
  auto d2 = f.got.wait(2);
  REQUIRE(d2.ok);
  o.sampling = {.temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .repetition_penalty = 1.1f, .seed = 9};
  o.stop = {"zz"};
  auto ref2 = reference_generation(f.model, "hello there", o);
  CHECK(f.got.text(2) == ref2.text);
  CHECK(d2.tokens == ref2.tokens.size());
  CHECK(d2.load_seconds == 0);  // the model stayed loaded
  CHECK(f.executors_made == 1);
}

TEST_CASE("the worker answers bad requests with what was wrong and keeps serving", "[actors][generation]") {
  fixture f;
  auto missing = f.request(1);
  missing.model = (f.dir / "nope.gguf").string();
  f.w.submit(client_a, missing);
  auto d = f.got.wait(1);
  CHECK_FALSE(d.ok);
  CHECK(d.code == error_code::not_found);
  CHECK(d.error.find("cannot open " + missing.model) != std::string::npos);

  write_file(f.dir / "junk.gguf", "this is no checkpoint at all");
  auto junk = f.request(2);
  junk.model = (f.dir / "junk.gguf").string();
  f.w.submit(client_a, junk);
  CHECK_FALSE(f.got.wait(2).ok);

  auto zero = f.request(3, 0);
  f.w.submit(client_a, zero);
  CHECK(f.got.wait(3).error == "generate: max_tokens is 0; ask for at least 1 token");

  auto chat = f.request(4);
  chat.chat = true;
  f.w.submit(client_a, chat);
  auto c = f.got.wait(4);
  CHECK_FALSE(c.ok);
  CHECK(c.error.find("has no chat template; name one with --chat-template NAME") != std::string::npos);

  auto huge = f.request(5);
  huge.prompt = std::string(200, 'q');  // 200 byte tokens: more than the 64 positions
  f.w.submit(client_a, huge);
  auto h = f.got.wait(5);
  CHECK(h.code == error_code::limit_exceeded);
  CHECK(h.error.find("has a context of 64 positions") != std::string::npos);

  // More asked for than the context has left: generated up to the context, finish `context`.
  auto capped = f.request(6, 1000);
  f.w.submit(client_a, capped);
  auto cp = f.got.wait(6);
  REQUIRE(cp.ok);
  if (cp.finish != finish_reason::eos) {
    CHECK(cp.finish == finish_reason::context);
    CHECK(cp.prompt_tokens + cp.tokens == 64);
  }

  // A template named by the request renders the prompt as a user turn.
  auto chat_named = f.request(7, 2);
  chat_named.chat = true;
  chat_named.chat_template = "chatml";
  f.w.submit(client_a, chat_named);
  auto cn = f.got.wait(7);
  REQUIRE(cn.ok);
  CHECK(cn.prompt_tokens > cp.prompt_tokens);
  auto unknown = f.request(8, 2);
  unknown.chat = true;
  unknown.chat_template = "vicuna";
  f.w.submit(client_a, unknown);
  CHECK(f.got.wait(8).error.find("chat template \"vicuna\" is not known") != std::string::npos);
}

TEST_CASE("withdrawn requests and a client that left stop their generation", "[actors][generation]") {
  fixture f;
  // A long generation, then two waiting behind it.
  auto first = f.request(1, 50);
  first.sampling.temperature = 1.0f;  // sampled: EOS is unlikely to end it early
  f.w.submit(client_a, first);
  f.w.submit(client_a, f.request(2, 50));
  f.w.submit(client_a, f.request(2, 50));  // the same id again
  auto dup = f.got.wait(2);
  CHECK(dup.error == "generate: request 2 is already running or waiting");
  f.w.cancel(client_a, 2);  // waiting: answered at once
  // Wait until the first has produced a token, then withdraw it at once: the tiny model makes
  // its 50 tokens within tens of milliseconds, so the wait polls every millisecond.
  for (int i = 0; i < 30000 && f.got.pieces(1).empty() && !f.got.has_done(1); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  f.w.cancel(client_a, 1);
  auto d1 = f.got.wait(1);
  REQUIRE(d1.ok);
  if (d1.finish != finish_reason::eos) {
    CHECK(d1.finish == finish_reason::cancelled);
    CHECK(d1.tokens < 50);
  }
  CHECK(f.got.wait(2).finish == finish_reason::cancelled);

  // A client that left: its running request stops and nothing more is sent to it.
  f.w.submit(client_a, f.request(3, 50));
  f.w.submit(client_a, f.request(4, 50));
  f.w.client_gone(client_a);
  for (int i = 0; i < 200 && f.w.pending() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(f.w.pending() == 0);
  CHECK_FALSE(f.got.has_done(4));
}

TEST_CASE("a full queue is refused with a message that says the node is busy", "[actors][generation]") {
  temp_dir dir;
  write_gguf_model(dir / "m.gguf", tiny(), models::tensor_type::q8_0);
  collector got;
  // The first request's first piece holds the host's thread until the gate opens, so that the
  // first request is still running (not finished in the meantime) when the others come.
  std::mutex gate_m;
  std::condition_variable gate_cv;
  bool gate_open = false;
  auto host = make_host(nullptr, 1);
  generation::worker w(*host, [&](const node_id& to, const msg::message& m) {
    got(to, m);
    if (auto* p = std::get_if<msg::generate_piece>(&m); p && p->request == 1) {
      std::unique_lock<std::mutex> lock(gate_m);
      gate_cv.wait(lock, [&] { return gate_open; });
    }
  });
  const auto open_gate = [&] {
    std::lock_guard<std::mutex> lock(gate_m);
    gate_open = true;
    gate_cv.notify_all();
  };
  struct gate_guard {  // a failed check must not leave the host's thread held
    std::function<void()> open;
    ~gate_guard() { open(); }
  } guard{open_gate};
  msg::generate_request r;
  r.model = (dir / "m.gguf").string();
  r.prompt = "hi";
  r.max_tokens = 60;
  // The first runs (a piece came), the second waits, the third is refused.
  r.request = 1;
  r.sampling.temperature = 1.0f;  // sampled: EOS is unlikely to end it early
  w.submit(client_a, r);
  for (int i = 0; i < 600 && got.pieces(1).empty() && !got.has_done(1); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE_FALSE(got.has_done(1));
  for (uint64_t id = 2; id <= 3; ++id) {
    r.request = id;
    w.submit(client_a, r);
  }
  auto third = got.wait(3);
  open_gate();
  CHECK_FALSE(third.ok);
  CHECK(third.code == error_code::limit_exceeded);
  CHECK(third.error.find("has 1 requests waiting, its limit: retry later") != std::string::npos);
  w.cancel(client_a, 1);
  w.cancel(client_a, 2);
  CHECK(got.wait(1).ok);
  CHECK(got.wait(2).ok);
}
