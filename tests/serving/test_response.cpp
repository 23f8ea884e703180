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
  const response_meta chat{"chatcmpl-1", 1700000000, "tiny", true};
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

  const response_meta text{"cmpl-2", 5, "tiny", false};
  const auto t = json::parse(completion_json(text, sample_result(finish_reason::length)));
  CHECK(t.at("object") == "text_completion");
  CHECK(t.at("choices")[0].at("text") == "Hello, \"world\"\n\xC3\xA9");
  CHECK(t.at("choices")[0].at("finish_reason") == "length");
  CHECK(t.at("usage").at("total_tokens") == 16);
}

TEST_CASE("streamed chunks: role first, pieces, finish_reason, usage, [DONE]", "[serving][response]") {
  const response_meta meta{"chatcmpl-9", 7, "tiny", true};
  for (bool usage : {false, true}) {
    CAPTURE(usage);
    const auto first = event_json(sse_event(first_chunk_json(meta, usage)));
    CHECK(first.at("object") == "chat.completion.chunk");
    CHECK(first.at("id") == "chatcmpl-9");
    CHECK(first.at("choices")[0].at("delta") == json{{"role", "assistant"}, {"content", ""}});
    CHECK(first.at("choices")[0].at("finish_reason").is_null());
    CHECK(first.contains("usage") == usage);
    if (usage) CHECK(first.at("usage").is_null());

    const auto piece = event_json(sse_event(piece_chunk_json(meta, "a\nb", usage)));
    CHECK(piece.at("choices")[0].at("delta") == json{{"content", "a\nb"}});

    const auto last = event_json(sse_event(finish_chunk_json(meta, finish_reason::length, usage)));
    CHECK(last.at("choices")[0].at("delta") == json::object());
    CHECK(last.at("choices")[0].at("finish_reason") == "length");
  }
  const auto u = event_json(sse_event(usage_chunk_json(meta, sample_result(finish_reason::stop))));
  CHECK(u.at("choices") == json::array());
  CHECK(u.at("usage").at("completion_tokens") == 5);
  CHECK(sse_done() == "data: [DONE]\n\n");

  const response_meta text{"cmpl-3", 7, "tiny", false};
  const auto tp = event_json(sse_event(piece_chunk_json(text, "xy", false)));
  CHECK(tp.at("object") == "text_completion");
  CHECK(tp.at("choices")[0].at("text") == "xy");
  const auto tl = event_json(sse_event(finish_chunk_json(text, finish_reason::stop, false)));
  CHECK(tl.at("choices")[0].at("text") == "");
  CHECK(tl.at("choices")[0].at("finish_reason") == "stop");
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
