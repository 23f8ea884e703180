// The API end to end: a real server on 127.0.0.1 (port 0) over local_backend with a tiny model,
// called by the curl program; the text must equal what models::generate gives in process with
// the same seed and options. Then the errors, the queue, the timeout and a client that leaves.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <thread>

#include "serving_fixture.hpp"

using namespace mesh;
using namespace mesh::serving;
using namespace mesh::serving::test;
using json = nlohmann::json;

namespace {

const std::vector<models::chat_message> conversation = {{"system", "you are terse"}, {"user", "hello there"}};

std::string chat_body(const std::string& extra) {
  return R"({"model": "tiny", "messages": [{"role": "system", "content": "you are terse"},
            {"role": "user", "content": "hello there"}], "max_tokens": 12, "seed": 7, "temperature": 0.9,
            "top_k": 50, "top_p": 0.95)" + extra + "}";
}

models::generate_options same_options() {
  models::generate_options o;
  o.max_tokens = 12;
  o.sampling = {.temperature = 0.9f, .top_k = 50, .top_p = 0.95f, .seed = 7};
  return o;
}

/// Waits until `pred` holds (polled), at most `limit`.
template <class F>
bool eventually(F pred, std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

}  // namespace

TEST_CASE("curl: chat and text completions, streamed and not, equal models::generate", "[serving][server]") {
  served_model served;
  reference_model ref(served.path);
  const auto expected_chat = ref.chat(conversation, same_options());
  REQUIRE(expected_chat.text.size() > 0);

  // Not streamed.
  auto r = curl(served.dir.path(), served.url("/v1/chat/completions"), chat_body(""));
  REQUIRE(r.status == 200);
  const auto c = json::parse(r.body);
  CHECK(c.at("object") == "chat.completion");
  CHECK(c.at("model") == "tiny");
  CHECK(c.at("choices")[0].at("message").at("content") == expected_chat.text);
  CHECK(c.at("choices")[0].at("finish_reason") ==
        (expected_chat.reason == models::stop_reason::max_tokens ? "length" : "stop"));
  CHECK(c.at("usage").at("prompt_tokens") == expected_chat.prompt_tokens);
  CHECK(c.at("usage").at("completion_tokens") == static_cast<int64_t>(expected_chat.tokens.size()));

  // Streamed (-N: no buffering), with the usage chunk.
  auto s = curl(served.dir.path(), served.url("/v1/chat/completions"),
                chat_body(R"(, "stream": true, "stream_options": {"include_usage": true})"), "-N");
  REQUIRE(s.status == 200);
  const auto events = parse_sse(s.body);
  CHECK(events.done);
  REQUIRE(events.events.size() >= 4);  // role, at least one piece, finish, usage
  CHECK(events.events.front().at("choices")[0].at("delta").at("role") == "assistant");
  std::string streamed;
  for (size_t i = 1; i + 2 < events.events.size(); ++i) {
    const auto& e = events.events[i];
    CHECK(e.at("object") == "chat.completion.chunk");
    CHECK(e.at("id") == events.events.front().at("id"));
    CHECK(e.at("choices")[0].at("finish_reason").is_null());
    streamed += e.at("choices")[0].at("delta").at("content").get<std::string>();
  }
  CHECK(streamed == expected_chat.text);
  const auto& finish = events.events[events.events.size() - 2];
  CHECK(finish.at("choices")[0].at("finish_reason") == c.at("choices")[0].at("finish_reason"));
  const auto& usage = events.events.back();
  CHECK(usage.at("choices").empty());
  CHECK(usage.at("usage") == c.at("usage"));

  // Text completions, greedy, with a stop string taken from the middle of the unstopped text.
  models::generate_options greedy;
  greedy.max_tokens = 10;
  greedy.sampling.temperature = 0;
  const auto plain = ref.complete("Once upon a time", greedy);
  auto t = curl(served.dir.path(), served.url("/v1/completions"),
                R"({"model": "tiny", "prompt": "Once upon a time", "max_tokens": 10, "temperature": 0})");
  REQUIRE(t.status == 200);
  const auto tj = json::parse(t.body);
  CHECK(tj.at("object") == "text_completion");
  CHECK(tj.at("choices")[0].at("text") == plain.text);
  CHECK(tj.at("usage").at("prompt_tokens") == plain.prompt_tokens);

  REQUIRE(plain.text.size() > 4);
  // Two whole UTF-8 characters from the middle (the model's text is arbitrary Unicode).
  auto boundary = [&](size_t i) {
    while (i < plain.text.size() && (static_cast<unsigned char>(plain.text[i]) & 0xC0) == 0x80) ++i;
    return i;
  };
  const size_t from = boundary(plain.text.size() / 2), to = boundary(boundary(from + 1) + 1);
  REQUIRE(to > from);
  const std::string stop = plain.text.substr(from, to - from);
  auto st = curl(served.dir.path(), served.url("/v1/completions"),
                 json{{"model", "tiny"}, {"prompt", "Once upon a time"}, {"max_tokens", 10}, {"temperature", 0},
                      {"stop", stop}, {"stream", true}}.dump(), "-N");
  REQUIRE(st.status == 200);
  const auto text_events = parse_sse(st.body);
  CHECK(text_events.done);
  std::string text;
  for (const auto& e : text_events.events) text += e.at("choices")[0].at("text").get<std::string>();
  CHECK(text == plain.text.substr(0, plain.text.find(stop)));
  CHECK(text_events.events.back().at("choices")[0].at("finish_reason") == "stop");

  // The model list.
  auto m = curl(served.dir.path(), served.url("/v1/models"), "");
  REQUIRE(m.status == 200);
  const auto mj = json::parse(m.body);
  REQUIRE(mj.at("data").size() == 1);
  CHECK(mj.at("data")[0].at("id") == "tiny");
  CHECK(curl(served.dir.path(), served.url("/v1/models/tiny"), "").status == 200);
}

TEST_CASE("curl: errors carry OpenAI's shape and status", "[serving][server]") {
  server_options o;
  o.api_key = "sk-test-key";
  o.max_body_bytes = 64 << 10;
  served_model served(o);
  const std::string key = "-H 'Authorization: Bearer sk-test-key'";
  auto error_of = [](const http_reply& r) {
    const auto j = json::parse(r.body);
    REQUIRE(j.contains("error"));
    return j.at("error");
  };

  auto no_key = curl(served.dir.path(), served.url("/v1/chat/completions"), chat_body(""));
  CHECK(no_key.status == 401);
  CHECK(error_of(no_key).at("code") == "invalid_api_key");
  auto wrong = curl(served.dir.path(), served.url("/v1/models"), "", "-H 'Authorization: Bearer sk-test-kez'");
  CHECK(wrong.status == 401);
  CHECK(error_of(wrong).at("message") == "Incorrect API key provided");

  auto unknown = curl(served.dir.path(), served.url("/v1/chat/completions"),
                      R"({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]})", key);
  CHECK(unknown.status == 404);
  CHECK(error_of(unknown).at("code") == "model_not_found");
  CHECK(error_of(unknown).at("param") == "model");
  CHECK_THAT(error_of(unknown).at("message").get<std::string>(), Catch::Contains("loaded: tiny"));
  CHECK(curl(served.dir.path(), served.url("/v1/models/gpt-9"), "", key).status == 404);

  auto bad = curl(served.dir.path(), served.url("/v1/chat/completions"), chat_body(R"(, "n": 3)"), key);
  CHECK(bad.status == 400);
  CHECK(error_of(bad).at("type") == "invalid_request_error");
  CHECK(error_of(bad).at("param") == "n");

  const std::string huge = R"({"model": "tiny", "prompt": ")" + std::string(100 << 10, 'a') + "\"}";
  auto large = curl(served.dir.path(), served.url("/v1/completions"), huge, key);
  CHECK(large.status == 413);
  CHECK_THAT(error_of(large).at("message").get<std::string>(), Catch::Contains("larger than 65536 bytes"));

  // A prompt plus max_tokens past the context (256) is too long, before anything runs.
  auto over = curl(served.dir.path(), served.url("/v1/completions"), R"({"model": "tiny", "prompt": "hi", "max_tokens": 300})", key);
  CHECK(over.status == 413);
  CHECK(error_of(over).at("code") == "context_length_exceeded");
  CHECK(error_of(over).at("param") == "max_tokens");

  auto route = curl(served.dir.path(), served.url("/v1/embeddings"), R"({})", key);
  CHECK(route.status == 404);
  CHECK_THAT(error_of(route).at("message").get<std::string>(), Catch::Contains("/v1/embeddings"));

  // And with the key, the same server answers.
  CHECK(curl(served.dir.path(), served.url("/v1/models"), "", key).status == 200);
}

TEST_CASE("local_backend: a full queue refuses, cancelled requests end as cancelled", "[serving][backend]") {
  // One request at a time, so that the second waits; the running one outlasts the checks.
  served_model served({}, /*max_queued=*/1, long_spec(), /*parallel=*/1);
  auto& backend = *served.backend;
  struct seen {
    std::promise<generation_outcome> done;
    std::atomic<int> pieces{0};
  };
  auto start = [&](seen& s, int64_t max_tokens) {
    generation_request r;
    r.model = "tiny";
    r.prompt = "Once upon a time";
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    return backend.start(r, {[&s](std::string_view, std::span<const token_logprobs>) { ++s.pieces; },
                             [&s](generation_outcome o) { s.done.set_value(std::move(o)); }, {}});
  };
  seen running, queued, extra;
  auto a = start(running, 3000);
  REQUIRE(a);
  REQUIRE(eventually([&] { return running.pieces.load() > 0; }));  // running, not waiting
  auto b = start(queued, 5);
  REQUIRE(b);
  auto c = start(extra, 5);
  REQUIRE_FALSE(c);
  CHECK(c.error().kind == failure_kind::queue_full);
  CHECK(http_status(c.error().kind) == 429);

  (*b)->cancel();  // cancelled while waiting: it never runs
  (*a)->cancel();
  auto ra = running.done.get_future().get();
  REQUIRE_FALSE(ra);
  CHECK(ra.error().kind == failure_kind::cancelled);
  CHECK(running.pieces.load() < 3000);
  auto rb = queued.done.get_future().get();
  REQUIRE_FALSE(rb);
  CHECK(rb.error().kind == failure_kind::cancelled);
  CHECK(queued.pieces.load() == 0);
  CHECK(backend.stats().cancelled == 2);

  // A chat needs a template: a model loaded without one refuses chats with a 400 that says how.
  auto no_template = local_backend::create(cpu_backend_options(), {{served.path, "plain", "", 0, 1, {}, 0, 0, {}}});
  REQUIRE(no_template);
  generation_request chat;
  chat.model = "plain";
  chat.chat = true;
  chat.messages = {{"user", "x"}};
  auto refused = (*no_template)->start(chat, {});
  REQUIRE_FALSE(refused);
  CHECK(refused.error().kind == failure_kind::invalid_request);
  CHECK_THAT(refused.error().message, Catch::Contains("no chat template"));
  auto typo = local_backend::create(cpu_backend_options(), {{served.path, "t", "chatmlx", 0, 1, {}, 0, 0, {}}});
  REQUIRE_FALSE(typo);
  CHECK_THAT(typo.error().message, Catch::Contains("chatmlx"));
}

TEST_CASE("local_backend: requests running together share decode steps and give the text each gives alone",
          "[serving][backend]") {
  served_model served({}, 8, long_spec());  // the backend's default: 4 requests at once
  auto& backend = *served.backend;
  struct seen {
    std::promise<generation_outcome> done;
    std::atomic<int> pieces{0};
  };
  auto start = [&](seen& s, const std::string& prompt, int64_t max_tokens, uint64_t seed) {
    generation_request r;
    r.model = "tiny";
    r.prompt = prompt;
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.sampling = {.temperature = 0.9f, .top_k = 50, .top_p = 0.95f, .seed = seed};
    return backend.start(r, {[&s](std::string_view, std::span<const token_logprobs>) { ++s.pieces; },
                             [&s](generation_outcome o) { s.done.set_value(std::move(o)); }, {}});
  };
  // A long request runs; two more join it while it does.
  seen running, b, c;
  auto a = start(running, "Once upon a time", 3000, 1);
  REQUIRE(a);
  REQUIRE(eventually([&] { return running.pieces.load() > 0; }));
  REQUIRE(start(b, "hello there", 24, 7));
  REQUIRE(start(c, "a b c d e f g h", 40, 8));
  auto rb = b.done.get_future().get();
  auto rc = c.done.get_future().get();
  REQUIRE(rb);
  REQUIRE(rc);
  CHECK(running.pieces.load() > 0);
  const auto stats = backend.stats();
  CHECK(stats.widest_step >= 2);  // steps served several requests
  CHECK(stats.decoded_tokens > stats.decode_steps);
  (*a)->cancel();
  CHECK_FALSE(running.done.get_future().get());

  // Each text is what models::generate gives for that request alone, with the same seed.
  reference_model ref(served.path);
  models::generate_options o;
  o.stop_at_eos = false;
  o.sampling = {.temperature = 0.9f, .top_k = 50, .top_p = 0.95f, .seed = 7};
  o.max_tokens = 24;
  CHECK(rb->text == ref.complete("hello there", o).text);
  o.sampling.seed = 8;
  o.max_tokens = 40;
  CHECK(rc->text == ref.complete("a b c d e f g h", o).text);
  CHECK(rc->completion_tokens == 40);
}

TEST_CASE("local_backend: a long prompt is read in chunks between the running requests' decode steps",
          "[serving][backend]") {
  served_model served({}, 8, long_spec(), /*parallel=*/4, /*prefill_chunk=*/16);
  auto& backend = *served.backend;
  std::atomic<int64_t> a_tokens{0};
  std::promise<generation_outcome> a_done, b_done;
  generation_request a;
  a.model = "tiny";
  a.prompt = "Once upon a time";
  a.max_tokens = 3000;
  a.ignore_eos = true;
  auto ha = backend.start(a, {{}, [&](generation_outcome o) { a_done.set_value(std::move(o)); },
                              [&](int64_t n) { a_tokens = n; }});
  REQUIRE(ha);
  REQUIRE(eventually([&] { return a_tokens.load() > 0; }));
  // B's prompt is several chunks long; A decodes a token each round while B reads one chunk.
  std::string words;
  for (int i = 0; i < 60; ++i) words += "w" + std::to_string(i) + " ";
  generation_request b;
  b.model = "tiny";
  b.prompt = words;
  b.max_tokens = 2;
  std::atomic<int64_t> a_at_first{-1};
  const int64_t a_at_start = a_tokens.load();  // A's count only grows from here
  auto hb = backend.start(b, {{}, [&](generation_outcome o) { b_done.set_value(std::move(o)); },
                              [&](int64_t n) {
                                if (n == 1) a_at_first = a_tokens.load();
                              }});
  REQUIRE(hb);
  auto rb = b_done.get_future().get();
  REQUIRE(rb);
  const int64_t chunks = (rb->prompt_tokens + 15) / 16;
  INFO("B's prompt: " << rb->prompt_tokens << " tokens, " << chunks << " chunks; A's tokens meanwhile: "
                      << a_at_first.load() - a_at_start);
  REQUIRE(chunks >= 4);
  // Each round in which B read a chunk but its last ended with A's decode step; in the round of
  // its last chunk B's first token comes before A's step.
  CHECK(a_at_first.load() - a_at_start >= chunks - 1);
  (*ha)->cancel();
  CHECK_FALSE(a_done.get_future().get());
}

TEST_CASE("a client that leaves during a stream cancels its generation, and the timeout answers 504",
          "[serving][server]") {
  server_options o;
  o.request_timeout = std::chrono::milliseconds(1500);
  o.keepalive_interval = std::chrono::milliseconds(200);
  served_model served(o, 8, long_spec());  // generations of 3000 tokens outlast the timeout

  // A raw connection: send a streamed request, read the first bytes, close.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(served.server->port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  const std::string body = R"({"model": "tiny", "prompt": "Once upon a time", "max_tokens": 3000, "ignore_eos": true, "temperature": 0, "stream": true})";
  const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body;
  REQUIRE(::send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size()));
  std::string got;
  char buf[4096];
  while (got.find("data: ") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    REQUIRE(n > 0);
    got.append(buf, static_cast<size_t>(n));
  }
  CHECK(got.rfind("HTTP/1.1 200", 0) == 0);
  ::close(fd);
  REQUIRE(eventually([&] { return served.backend->stats().cancelled == 1; }, std::chrono::seconds(10)));
  CHECK(served.backend->stats().completed == 0);

  // Not streamed, longer than the timeout: 504, and the generation is cancelled.
  auto slow = curl(served.dir.path(), served.url("/v1/completions"),
                   R"({"model": "tiny", "prompt": "Once upon a time", "max_tokens": 3000, "ignore_eos": true, "temperature": 0})");
  CHECK(slow.status == 504);
  CHECK(json::parse(slow.body).at("error").at("code") == "timeout");
  REQUIRE(eventually([&] { return served.backend->stats().cancelled == 2; }, std::chrono::seconds(10)));
}

TEST_CASE("stop is graceful: new requests get 503, a stream in flight past the grace ends with an error event",
          "[serving][server]") {
  server_options o;
  o.stop_grace = std::chrono::milliseconds(1500);
  served_model served(o, 8, long_spec());  // a generation of 3000 tokens outlasts the grace
  auto stream = std::async(std::launch::async, [&] {
    return curl(served.dir.path(), served.url("/v1/completions"),
                R"({"model": "tiny", "prompt": "Once upon a time", "max_tokens": 3000, "ignore_eos": true, "temperature": 0, "stream": true})",
                "-N");
  });
  // Let it reach the backend (a request still queued at stop() ends the same way).
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  CHECK(stream.wait_for(std::chrono::seconds(0)) == std::future_status::timeout);
  const auto t0 = std::chrono::steady_clock::now();
  auto stopping = std::async(std::launch::async, [&] { served.server->stop(); });
  // Within the grace the listener is still open, and answers new requests with 503.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto late = mesh::test::run_command("curl -sS --max-time 5 -o /dev/null -w '%{http_code}' " + served.url("/v1/models"));
  CHECK(late.output == "503");
  stopping.get();
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  auto r = stream.get();
  CHECK(r.status == 200);
  const auto events = parse_sse(r.body);
  CHECK_FALSE(events.done);
  REQUIRE_FALSE(events.events.empty());
  CHECK(events.events.back().at("error").at("code") == "no_capacity");
  CHECK(served.backend->stats().cancelled == 1);
  // Stopped: nothing listens any more.
  auto refused = mesh::test::run_command("curl -sS --max-time 5 -o /dev/null " + served.url("/v1/models"));
  CHECK(refused.status != 0);
}
