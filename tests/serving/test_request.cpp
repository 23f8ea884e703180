// Request bodies into typed requests: what is accepted and how it maps, and a table of bodies
// that must be refused with a 400 naming the parameter.
#include <catch2/catch.hpp>

#include <string>

#include <nlohmann/json.hpp>

#include "serving/request.hpp"

using namespace mesh::serving;

TEST_CASE("a chat body maps to the generation request", "[serving][request]") {
  const std::string body = R"({
    "model": "tiny", "stream": true, "stream_options": {"include_usage": true},
    "messages": [
      {"role": "developer", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}], "name": "ann"},
      {"role": "assistant", "content": "hi", "tool_calls": null},
      {"role": "user", "content": "again"}],
    "max_completion_tokens": 7, "max_tokens": 99, "temperature": 0.5, "top_p": 0.9, "top_k": 40,
    "min_p": 0.05, "repetition_penalty": 1.1, "seed": 42, "stop": ["\n\n", "END"], "n": 1,
    "frequency_penalty": 0, "presence_penalty": 0.0, "logprobs": false, "user": "u-1", "logit_bias": {},
    "tool_choice": "none", "response_format": {"type": "text"}})";
  auto r = parse_chat_request(body, 5);
  REQUIRE(r);
  const auto& g = r->generation;
  CHECK(g.chat);
  CHECK(g.model == "tiny");
  REQUIRE(g.messages.size() == 4);
  CHECK(g.messages[0].role == "system");  // "developer" is OpenAI's newer name for it
  CHECK(g.messages[1].content == "hello");
  CHECK(g.messages[3].role == "user");
  CHECK(g.max_tokens == 7);  // max_completion_tokens wins over the deprecated max_tokens
  CHECK(g.sampling.temperature == 0.5f);
  CHECK(g.sampling.top_p == 0.9f);
  CHECK(g.sampling.top_k == 40);
  CHECK(g.sampling.min_p == 0.05f);
  CHECK(g.sampling.repetition_penalty == 1.1f);
  CHECK(g.sampling.seed == 42);
  CHECK(g.stop == std::vector<std::string>{"\n\n", "END"});
  CHECK(r->stream);
  CHECK(r->include_usage);
}

TEST_CASE("defaults: temperature 1, the given seed, no limit, no stream", "[serving][request]") {
  auto r = parse_chat_request(R"({"model": "m", "messages": [{"role": "user", "content": "x"}]})", 1234);
  REQUIRE(r);
  CHECK(r->generation.sampling.temperature == 1.0f);
  CHECK(r->generation.sampling.seed == 1234);
  CHECK_FALSE(r->generation.max_tokens);
  CHECK_FALSE(r->stream);
  CHECK_FALSE(r->include_usage);

  auto c = parse_completion_request(R"({"model": "m", "prompt": ["once"], "stop": "x", "max_tokens": 3, "echo": false,
                                        "top_k": -1, "best_of": 1, "suffix": null, "ignore_eos": true})", 0);
  REQUIRE(c);
  CHECK_FALSE(c->generation.chat);
  CHECK(c->generation.prompt == "once");
  CHECK(c->generation.stop == std::vector<std::string>{"x"});
  CHECK(c->generation.max_tokens == 3);
  CHECK(c->generation.sampling.top_k == 0);  // vLLM's -1 means off
  CHECK(c->generation.ignore_eos);
  CHECK_FALSE(r->generation.ignore_eos);
}

TEST_CASE("logprobs: chat takes a boolean and top_logprobs, completions a count", "[serving][request]") {
  const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
  auto none = parse_chat_request(R"({"model": "m", )" + msgs + "}", 1);
  REQUIRE(none);
  CHECK(none->generation.logprobs == -1);
  auto off = parse_chat_request(R"({"model": "m", "logprobs": false, "top_logprobs": 0, )" + msgs + "}", 1);
  REQUIRE(off);
  CHECK(off->generation.logprobs == -1);
  auto chosen = parse_chat_request(R"({"model": "m", "logprobs": true, )" + msgs + "}", 1);
  REQUIRE(chosen);
  CHECK(chosen->generation.logprobs == 0);
  auto top = parse_chat_request(R"({"model": "m", "top_logprobs": 20, "logprobs": true, )" + msgs + "}", 1);
  REQUIRE(top);
  CHECK(top->generation.logprobs == 20);
  auto text = parse_completion_request(R"({"model": "m", "prompt": "x", "logprobs": 5})", 1);
  REQUIRE(text);
  CHECK(text->generation.logprobs == 5);
  auto text_off = parse_completion_request(R"({"model": "m", "prompt": "x", "logprobs": null})", 1);
  REQUIRE(text_off);
  CHECK(text_off->generation.logprobs == -1);
}

TEST_CASE("bodies that are refused with a 400 naming the parameter", "[serving][request]") {
  struct row {
    bool chat;
    std::string body;
    std::string param;
    std::string says;  // part of the message
  };
  const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
  const std::string chat = R"("model": "m", )" + msgs;
  const std::string comp = R"("model": "m", "prompt": "x")";
  const std::vector<row> rows = {
      {true, "", "", "not valid JSON"},
      {true, "[1]", "", "must be a JSON object"},
      {true, "{\"model\": \"m\"", "", "not valid JSON"},
      {true, "{" + msgs + "}", "model", "'model' is required"},
      {true, R"({"model": 3, )" + msgs + "}", "model", "must be a string"},
      {true, R"({"model": ""})", "model", "must not be empty"},
      {true, R"({"model": "m"})", "messages", "'messages' is required"},
      {true, R"({"model": "m", "messages": []})", "messages", "at least one"},
      {true, R"({"model": "m", "messages": [{"role": "tool", "content": "x"}]})", "messages[0].role", "not supported"},
      {true, R"({"model": "m", "messages": [{"content": "x"}]})", "messages[0].role", "must be a string"},
      {true, R"({"model": "m", "messages": [{"role": "user"}]})", "messages[0].content", "required"},
      {true, R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
       "messages[0].content[0].type", "only 'text'"},
      {true, R"({"model": "m", "messages": [{"role": "user", "content": "x", "tool_calls": [{}]}]})",
       "messages[0].tool_calls", "not supported"},
      {true, R"({"model": "m", "messages": [{"role": "user", "content": "x", "colour": 1}]})", "messages[0].colour",
       "unrecognized"},
      {true, "{" + chat + R"(, "n": 2})", "n", "must be 1"},
      {true, "{" + chat + R"(, "temperature": 2.5})", "temperature", "between 0 and 2"},
      {true, "{" + chat + R"(, "temperature": "hot"})", "temperature", "must be a number"},
      {true, "{" + chat + R"(, "top_p": 0})", "top_p", "greater than 0"},
      {true, "{" + chat + R"(, "top_p": 1.5})", "top_p", "between 0 and 1"},
      {true, "{" + chat + R"(, "top_k": -2})", "top_k", "positive"},
      {true, "{" + chat + R"(, "min_p": -0.1})", "min_p", "between"},
      {true, "{" + chat + R"(, "max_tokens": 0})", "max_tokens", "at least 1"},
      {true, "{" + chat + R"(, "max_tokens": 1.5})", "max_tokens", "must be an integer"},
      {true, "{" + chat + R"(, "max_completion_tokens": -3})", "max_completion_tokens", "at least 1"},
      {true, "{" + chat + R"(, "seed": "x"})", "seed", "must be an integer"},
      {true, "{" + chat + R"(, "seed": 18446744073709551615})", "seed", "too large"},
      {true, "{" + chat + R"(, "stop": ["a", "b", "c", "d", "e"]})", "stop", "more than the 4"},
      {true, "{" + chat + R"(, "stop": [""]})", "stop", "must not be empty"},
      {true, "{" + chat + R"(, "stop": 3})", "stop", "a string or an array"},
      {true, "{" + chat + R"(, "stream": "yes"})", "stream", "must be a boolean"},
      {true, "{" + chat + R"(, "stream_options": {"include_usage": true}})", "stream_options", "only allowed"},
      {true, "{" + chat + R"(, "stream": true, "stream_options": {"include_usage": 1}})", "stream_options.include_usage",
       "boolean"},
      {true, "{" + chat + R"(, "logprobs": 1})", "logprobs", "must be a boolean"},
      {true, "{" + chat + R"(, "top_logprobs": 3})", "top_logprobs", "needs 'logprobs': true"},
      {true, "{" + chat + R"(, "logprobs": true, "top_logprobs": 21})", "top_logprobs", "between 0 and 20"},
      {true, "{" + chat + R"(, "logprobs": true, "top_logprobs": 1.5})", "top_logprobs", "must be an integer"},
      {true, "{" + chat + R"(, "frequency_penalty": 0.5})", "frequency_penalty", "not supported"},
      {true, "{" + chat + R"(, "presence_penalty": -1})", "presence_penalty", "not supported"},
      {true, "{" + chat + R"(, "logit_bias": {"50256": -100}})", "logit_bias", "not supported"},
      {true, "{" + chat + R"(, "tools": [{"type": "function"}]})", "tools", "not supported"},
      {true, "{" + chat + R"(, "response_format": {"type": "json_object"}})", "response_format", "not supported"},
      {true, "{" + chat + R"(, "echo": true})", "echo", "unrecognized"},
      {true, "{" + chat + R"(, "frobnicate": 1})", "frobnicate", "unrecognized request argument"},
      {true, "{" + chat + R"(, "repetition_penalty": 0})", "repetition_penalty", "greater than 0"},
      {true, "{" + chat + R"(, "ignore_eos": 1})", "ignore_eos", "must be a boolean"},
      {false, R"({"model": "m"})", "prompt", "'prompt' is required"},
      {false, R"({"model": "m", "prompt": ["a", "b"]})", "prompt", "several prompts"},
      {false, R"({"model": "m", "prompt": [1, 2, 3]})", "prompt", "token arrays are not supported"},
      {false, "{" + comp + R"(, "echo": true})", "echo", "not supported"},
      {false, "{" + comp + R"(, "logprobs": 6})", "logprobs", "between 0 and 5"},
      {false, "{" + comp + R"(, "logprobs": true})", "logprobs", "must be an integer"},
      {false, "{" + comp + R"(, "top_logprobs": 2})", "top_logprobs", "'logprobs': N"},
      {false, "{" + comp + R"(, "best_of": 3})", "best_of", "must be 1"},
      {false, "{" + comp + R"(, "suffix": "end"})", "suffix", "not supported"},
      {false, "{" + comp + R"(, "messages": []})", "messages", "unrecognized"},
  };
  for (const auto& r : rows) {
    CAPTURE(r.body);
    auto parsed = r.chat ? parse_chat_request(r.body, 0) : parse_completion_request(r.body, 0);
    REQUIRE_FALSE(parsed);
    CHECK(parsed.error().kind == failure_kind::invalid_request);
    CHECK(parsed.error().param == r.param);
    CHECK_THAT(parsed.error().message, Catch::Contains(r.says));
  }
}

TEST_CASE("deep nesting is refused before it is parsed, and brackets in strings do not count", "[serving][request]") {
  CHECK(json_depth(R"({"a": [[1], {"b": "[[[[{{{{"}]})") == 3);
  CHECK(json_depth(R"("\"[[[")") == 0);
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  auto r = parse_chat_request(deep, 0);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Catch::Contains("nests deeper than 32"));
  // A body that nests as much as a real request needs is fine.
  auto ok = parse_chat_request(R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]})", 0);
  CHECK(ok);
}

TEST_CASE("error bodies have OpenAI's shape and the right status", "[serving][request]") {
  struct row {
    failure_kind kind;
    int status;
    const char* type;
    const char* code;
  };
  for (const row& r : std::vector<row>{{failure_kind::invalid_request, 400, "invalid_request_error", nullptr},
                                       {failure_kind::unauthorized, 401, "invalid_request_error", "invalid_api_key"},
                                       {failure_kind::model_not_found, 404, "invalid_request_error", "model_not_found"},
                                       {failure_kind::too_long, 413, "invalid_request_error", "context_length_exceeded"},
                                       {failure_kind::queue_full, 429, "rate_limit_error", "queue_full"},
                                       {failure_kind::no_capacity, 503, "server_error", "no_capacity"},
                                       {failure_kind::timeout, 504, "server_error", "timeout"},
                                       {failure_kind::internal, 500, "server_error", "internal_error"}}) {
    CAPTURE(to_string(r.kind));
    CHECK(http_status(r.kind) == r.status);
    const auto j = nlohmann::json::parse(error_body({r.kind, "what went wrong \xff", r.status == 400 ? "top_p" : ""}));
    REQUIRE(j.size() == 1);
    const auto& e = j.at("error");
    CHECK(e.size() == 4);
    CHECK(e.at("message") == "what went wrong \xEF\xBF\xBD");  // invalid UTF-8 replaced, never thrown
    CHECK(e.at("type") == r.type);
    if (r.code) CHECK(e.at("code") == r.code);
    else CHECK(e.at("code").is_null());
    if (r.status == 400) CHECK(e.at("param") == "top_p");
    else CHECK(e.at("param").is_null());
  }
}
