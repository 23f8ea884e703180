// Chat templates against jinja2 rendering the real templates (chat_templates.json, copied from the
// models' tokenizer_config.json): recognised from their text, then the same prompt for many
// conversations, and the same refusals.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "models/chat_template.hpp"
#include "test_tokenizer_support.hpp"

using namespace mesh::models;
using json = nlohmann::json;

namespace {

std::vector<std::vector<chat_message>> conversations() {
  return {
      {{"user", "Hello!"}},
      {{"user", "  padded question \n"}},
      {{"system", "You are terse."}, {"user", "What is 2+2?"}},
      {{"system", "  Be kind.\n"}, {"user", "Hi"}, {"assistant", " Hello! How can I help?  "}, {"user", "Tell me a joke."}},
      {{"user", "first"}, {"assistant", "second"}, {"user", "third"}, {"assistant", "fourth"}},
      {{"user", "Unicode: héllo 東京 🚀\nnew line"}, {"assistant", "Sure — ‘quoted’"}, {"user", "\u3000wide space\u3000"}},
      {{"system", ""}, {"user", "empty system"}},
      {{"user", "two"}, {"user", "users"}},                   // refused by the alternating templates
      {{"assistant", "starts with the assistant"}},          // refused by the alternating templates
      {{"system", "a"}, {"system", "b"}, {"user", "c"}},     // Llama 2 refuses, ChatML renders
  };
}

}  // namespace

TEST_CASE("chat templates render as jinja2 renders the real templates", "[chat]") {
  if (auto why = test::python_missing("jinja2")) {
    WARN("skipped: " << *why);
    return;
  }
  const json templates = json::parse(test::read_file(test::text_test_dir() / "chat_templates.json"));
  struct expectation {
    std::string name;
    chat_family family;
    std::string bos, eos;
  };
  const std::vector<expectation> families = {
      {"chatml", chat_family::chatml, "<s>", "</s>"},
      {"qwen2", chat_family::chatml, "", "<|im_end|>"},
      {"qwen2.5", chat_family::chatml, "", "<|im_end|>"},
      {"llama3", chat_family::llama3, "<|begin_of_text|>", "<|eot_id|>"},
      {"llama3.1", chat_family::llama31, "<|begin_of_text|>", "<|eot_id|>"},
      {"llama2", chat_family::llama2, "<s>", "</s>"},
      {"mistral", chat_family::mistral, "<s>", "</s>"},
      {"gemma", chat_family::gemma, "<bos>", "<eos>"},
  };
  json cases = json::array();
  std::vector<std::tuple<size_t, size_t, bool>> index;  // family, conversation, add_generation_prompt
  const auto convs = conversations();
  for (size_t f = 0; f < families.size(); ++f) {
    for (size_t c = 0; c < convs.size(); ++c) {
      for (bool gen : {false, true}) {
        json msgs = json::array();
        for (const auto& m : convs[c]) msgs.push_back({{"role", m.role}, {"content", m.content}});
        cases.push_back({{"template", families[f].name}, {"messages", msgs}, {"add_generation_prompt", gen},
                         {"bos_token", families[f].bos}, {"eos_token", families[f].eos}});
        index.emplace_back(f, c, gen);
      }
    }
  }
  test::scratch_dir dir;
  test::write_file(dir.path / "cases.json", cases.dump());
  auto err = test::run_python("ref_chat.py", {(test::text_test_dir() / "chat_templates.json").string(),
                                              (dir.path / "cases.json").string(), (dir.path / "out.json").string()});
  REQUIRE_FALSE(err);
  const json ref = json::parse(test::read_file(dir.path / "out.json"));
  REQUIRE(ref.size() == index.size());
  size_t rendered = 0, refused = 0;
  for (size_t i = 0; i < index.size(); ++i) {
    const auto [f, c, gen] = index[i];
    const auto& e = families[f];
    INFO(e.name << ", conversation " << c << ", add_generation_prompt " << gen);
    auto t = detect_chat_template(templates[e.name]["chat_template"].get<std::string>(), {e.bos, e.eos});
    REQUIRE(t);
    CHECK(t->family == e.family);
    auto text = t->render(convs[c], gen);
    if (ref[i]["ok"].get<bool>()) {
      REQUIRE(text);
      CHECK(*text == ref[i]["text"].get<std::string>());
      ++rendered;
      // The family by name renders the same as the one recognised from the text.
      auto by_name = chat_template_by_name(e.name, {e.bos, e.eos});
      REQUIRE(by_name);
      CHECK(*by_name->render(convs[c], gen) == *text);
    } else {
      REQUIRE_FALSE(text);
      CHECK_THAT(text.error().message, Catch::Contains(ref[i]["error"].get<std::string>()));
      ++refused;
    }
  }
  CHECK(rendered > 80);
  CHECK(refused > 10);
}

TEST_CASE("chat templates: an unknown template says how to name a family", "[chat]") {
  auto t = detect_chat_template("{% for m in messages %}### {{ m.role }}: {{ m.content }}{% endfor %}");
  REQUIRE_FALSE(t);
  CHECK_THAT(t.error().message, Catch::Contains("--chat-template"));
  for (auto name : chat_template_names()) {
    CHECK_THAT(t.error().message, Catch::Contains(std::string(name)));
    CHECK(chat_template_by_name(name));
  }
  auto n = chat_template_by_name("vicuna");
  REQUIRE_FALSE(n);
  CHECK_THAT(n.error().message, Catch::Contains("chatml"));
  auto empty = chat_template_by_name("chatml")->render({}, true);
  CHECK_FALSE(empty);
}
