// Response objects and server-sent event chunks: the fields OpenAI clients read.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "serving/response.hpp"

using namespace mesh::serving;
using json = nlohmann::json;

namespace {

generation_result sample_result(finish_reason reason) {
  generation_result r;
  r.reason = reason;
  r.text = "Hello, \"world\"\n\xC3\xA9";
  r.prompt_tokens = 11;
  r.completion_tokens = 5;
  return r;
}

json event_json(const std::string& event) {
  REQUIRE(event.rfind("data: ", 0) == 0);
  REQUIRE(event.size() > 8);
  REQUIRE(event.substr(event.size() - 2) == "\n\n");
  const std::string payload = event.substr(6, event.size() - 8);
  CHECK(payload.find('\n') == std::string::npos);  // one line per event
  return json::parse(payload);
}

}  // namespace

TEST_CASE("non-streamed chat and text completions", "[serving][response]") {
  const response_meta chat{"chatcmpl-1", 1700000000, "tiny", true, false};
  const auto c = json::parse(completion_json(chat, sample_result(finish_reason::stop)));
  CHECK(c.at("id") == "chatcmpl-1");
  CHECK(c.at("object") == "chat.completion");
  CHECK(c.at("created") == 1700000000);
  CHECK(c.at("model") == "tiny");
  REQUIRE(c.at("choices").size() == 1);
  const auto& choice = c.at("choices")[0];
  CHECK(choice.at("index") == 0);
  CHECK(choice.at("message").at("role") == "assistant");
  CHECK(choice.at("message").at("content") == "Hello, \"world\"\n\xC3\xA9");
  CHECK(choice.at("finish_reason") == "stop");
  CHECK(choice.at("logprobs").is_null());
  CHECK(c.at("usage") == json{{"prompt_tokens", 11}, {"completion_tokens", 5}, {"total_tokens", 16}});

  const response_meta text{"cmpl-2", 5, "tiny", false, false};
  const auto t = json::parse(completion_json(text, sample_result(finish_reason::length)));
  CHECK(t.at("object") == "text_completion");
  CHECK(t.at("choices")[0].at("text") == "Hello, \"world\"\n\xC3\xA9");
  CHECK(t.at("choices")[0].at("finish_reason") == "length");
  CHECK(t.at("usage").at("total_tokens") == 16);
}

TEST_CASE("streamed chunks: role first, pieces, finish_reason, usage, [DONE]", "[serving][response]") {
  const response_meta meta{"chatcmpl-9", 7, "tiny", true, false};
  for (bool usage : {false, true}) {
    CAPTURE(usage);
    const auto first = event_json(sse_event(first_chunk_json(meta, usage)));
    CHECK(first.at("object") == "chat.completion.chunk");
    CHECK(first.at("id") == "chatcmpl-9");
    CHECK(first.at("choices")[0].at("delta") == json{{"role", "assistant"}, {"content", ""}});
    CHECK(first.at("choices")[0].at("finish_reason").is_null());
    CHECK(first.contains("usage") == usage);
    if (usage) CHECK(first.at("usage").is_null());

    const auto piece = event_json(sse_event(piece_chunk_json(meta, "a\nb", {}, usage)));
    CHECK(piece.at("choices")[0].at("delta") == json{{"content", "a\nb"}});

    const auto last = event_json(sse_event(finish_chunk_json(meta, finish_reason::length, usage)));
    CHECK(last.at("choices")[0].at("delta") == json::object());
    CHECK(last.at("choices")[0].at("finish_reason") == "length");
  }
  const auto u = event_json(sse_event(usage_chunk_json(meta, sample_result(finish_reason::stop))));
  CHECK(u.at("choices") == json::array());
  CHECK(u.at("usage").at("completion_tokens") == 5);
  CHECK(sse_done() == "data: [DONE]\n\n");

  const response_meta text{"cmpl-3", 7, "tiny", false, false};
  const auto tp = event_json(sse_event(piece_chunk_json(text, "xy", {}, false)));
  CHECK(tp.at("object") == "text_completion");
  CHECK(tp.at("choices")[0].at("text") == "xy");
  const auto tl = event_json(sse_event(finish_chunk_json(text, finish_reason::stop, false)));
  CHECK(tl.at("choices")[0].at("text") == "");
  CHECK(tl.at("choices")[0].at("finish_reason") == "stop");
}

TEST_CASE("logprobs in OpenAI's chat and text-completion shapes, streamed and not", "[serving][response]") {
  // "\xC3" alone: the first byte of a two-byte character, as a byte-level token may be.
  const std::vector<token_logprobs> lp = {{{"Hi", -0.25}, {{"Hi", -0.25}, {"Yo", -1.5}}, 0},
                                          {{"\xC3", -2.0}, {{"\xC3", -2.0}, {"!", -2.5}}, 2}};
  generation_result r = sample_result(finish_reason::stop);
  r.logprobs = lp;
  const response_meta chat{"chatcmpl-1", 5, "tiny", true, true};
  const auto c = json::parse(completion_json(chat, r)).at("choices")[0].at("logprobs");
  CHECK(c.at("refusal").is_null());
  REQUIRE(c.at("content").size() == 2);
  CHECK(c.at("content")[0] == json{{"token", "Hi"}, {"logprob", -0.25}, {"bytes", {72, 105}},
                                   {"top_logprobs", {{{"token", "Hi"}, {"logprob", -0.25}, {"bytes", {72, 105}}},
                                                     {{"token", "Yo"}, {"logprob", -1.5}, {"bytes", {89, 111}}}}}});
  CHECK(c.at("content")[1].at("token") == "\xEF\xBF\xBD");  // U+FFFD in "token", the real byte in "bytes"
  CHECK(c.at("content")[1].at("bytes") == json{0xC3});
  const auto piece = event_json(sse_event(piece_chunk_json(chat, "Hi", std::span(lp).first(1), false)));
  CHECK(piece.at("choices")[0].at("logprobs").at("content").size() == 1);
  CHECK(piece.at("choices")[0].at("logprobs").at("content")[0].at("logprob") == -0.25);

  const response_meta text{"cmpl-1", 5, "tiny", false, true};
  const auto t = json::parse(completion_json(text, r)).at("choices")[0].at("logprobs");
  CHECK(t.at("tokens") == json{"Hi", "\xEF\xBF\xBD"});
  CHECK(t.at("token_logprobs") == json{-0.25, -2.0});
  CHECK(t.at("top_logprobs")[0] == json{{"Hi", -0.25}, {"Yo", -1.5}});
  CHECK(t.at("text_offset") == json{0, 2});
  const auto tp = event_json(sse_event(piece_chunk_json(text, "", std::span(lp).last(1), false)));
  CHECK(tp.at("choices")[0].at("logprobs").at("token_logprobs") == json{-2.0});

  // Not asked for: null, as before.
  const response_meta plain{"chatcmpl-2", 5, "tiny", true, false};
  CHECK(json::parse(completion_json(plain, r)).at("choices")[0].at("logprobs").is_null());
}

TEST_CASE("the model list and ids", "[serving][response]") {
  const std::vector<model_info> models = {{"tiny", 256, 100, true, "", 0, false, {}}, {"other", 64, 200, false, "", 0, false, {}}};
  const auto l = json::parse(models_json(models));
  CHECK(l.at("object") == "list");
  REQUIRE(l.at("data").size() == 2);
  CHECK(l.at("data")[1] == json{{"id", "other"}, {"object", "model"}, {"created", 200}, {"owned_by", "meshnode"}});
  CHECK(json::parse(model_json(models[0])).at("id") == "tiny");
  const auto a = make_response_id(true), b = make_response_id(true);
  CHECK(a.rfind("chatcmpl-", 0) == 0);
  CHECK(a.size() == 9 + 24);
  CHECK(a != b);
  CHECK(make_response_id(false).rfind("cmpl-", 0) == 0);
}
