#include "models/chat_template.hpp"

#include <fmt/format.h>

#include "models/tokenizer.hpp"
#include "models/utf8.hpp"

namespace mesh::models {

namespace {

constexpr std::string_view qwen2_system = "You are a helpful assistant.";
constexpr std::string_view qwen25_system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
constexpr std::string_view alternate_message = "Conversation roles must alternate user/assistant/user/assistant/...";

/// Jinja's `trim` and Python's str.strip(): Unicode whitespace at both ends.
bool is_python_space(std::string_view s, size_t i, size_t& n) {
  n = utf8::char_length(s, i);
  const auto c = static_cast<unsigned char>(s[i]);
  if (n == 1) return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  std::string_view ch = s.substr(i, n);
  static const std::string_view spaces[] = {
      "\xC2\x85", "\xC2\xA0", "\xE1\x9A\x80", "\xE2\x80\x80", "\xE2\x80\x81", "\xE2\x80\x82", "\xE2\x80\x83",
      "\xE2\x80\x84", "\xE2\x80\x85", "\xE2\x80\x86", "\xE2\x80\x87", "\xE2\x80\x88", "\xE2\x80\x89", "\xE2\x80\x8A",
      "\xE2\x80\xA8", "\xE2\x80\xA9", "\xE2\x80\xAF", "\xE2\x81\x9F", "\xE3\x80\x80"};
  for (auto sp : spaces) {
    if (ch == sp) return true;
  }
  return false;
}

std::string strip(std::string_view s) {
  size_t b = 0, n = 0;
  while (b < s.size() && is_python_space(s, b, n)) b += n;
  // From the right: find the end of the last non-space character.
  size_t e = b, i = b;
  while (i < s.size()) {
    const bool space = is_python_space(s, i, n);
    i += n;
    if (!space) e = i;
  }
  return std::string(s.substr(b, e - b));
}

tl::unexpected<error> refused(chat_family f, std::string_view why) {
  return make_error(error_code::invalid_argument, fmt::format("chat template {}: {}", to_string(f), why));
}

/// Roles must go user, assistant, user, ... from `first` on (Llama 2, Mistral, Gemma).
expected<void> check_alternation(chat_family f, std::span<const chat_message> m) {
  for (size_t i = 0; i < m.size(); ++i) {
    if ((m[i].role == "user") != (i % 2 == 0)) return refused(f, alternate_message);
  }
  return {};
}

expected<std::string> render_chatml(const chat_template& t, std::span<const chat_message> m, bool gen) {
  std::string out;
  // Qwen2.5 writes its own system turn from messages[0]; Qwen2 writes the default before the first
  // message and the first message as any other: the same text for both.
  if (!t.default_system.empty() && m[0].role != "system") {
    out += "<|im_start|>system\n" + t.default_system + "<|im_end|>\n";
  }
  for (size_t i = 0; i < m.size(); ++i) {
    if (m[i].role == "tool") {
      if (i == 0 || m[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m[i].content + "\n</tool_response>";
      if (i + 1 == m.size() || m[i + 1].role != "tool") out += "<|im_end|>\n";
      continue;
    }
    out += "<|im_start|>" + m[i].role + "\n" + m[i].content + "<|im_end|>\n";
  }
  if (gen) out += "<|im_start|>assistant\n";
  return out;
}

std::string llama3_turn(const chat_message& m) {
  return "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + strip(m.content) + "<|eot_id|>";
}

expected<std::string> render_llama3(const chat_template& t, std::span<const chat_message> m, bool gen) {
  std::string out = t.tokens.bos;
  for (const auto& x : m) out += llama3_turn(x);
  if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

expected<std::string> render_llama31(const chat_template& t, std::span<const chat_message> m, bool gen) {
  std::string system;
  if (m[0].role == "system") {
    system = strip(m[0].content);
    m = m.subspan(1);
  }
  std::string out = t.tokens.bos + "<|start_header_id|>system<|end_header_id|>\n\n";
  out += "Cutting Knowledge Date: December 2023\nToday Date: " + t.date + "\n\n";
  out += system + "<|eot_id|>";
  for (const auto& x : m) out += llama3_turn(x);
  if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

expected<std::string> render_llama2(const chat_template& t, std::span<const chat_message> m, bool) {
  std::string system;
  bool has_system = false;
  if (m[0].role == "system") {
    system = m[0].content;
    has_system = true;
    m = m.subspan(1);
  }
  if (auto r = check_alternation(t.family, m); !r) return forward_error(r);
  std::string out;
  for (size_t i = 0; i < m.size(); ++i) {
    std::string content = i == 0 && has_system ? "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + m[i].content : m[i].content;
    if (m[i].role == "user") {
      out += t.tokens.bos + "[INST] " + strip(content) + " [/INST]";
    } else if (m[i].role == "assistant") {
      out += " " + strip(content) + " " + t.tokens.eos;
    }
  }
  return out;  // the template has no generation prompt: "[/INST]" ends the user turn
}

expected<std::string> render_mistral(const chat_template& t, std::span<const chat_message> m, bool) {
  if (auto r = check_alternation(t.family, m); !r) return forward_error(r);
  std::string out = t.tokens.bos;
  for (const auto& x : m) {
    if (x.role == "user") {
      out += "[INST] " + x.content + " [/INST]";
    } else if (x.role == "assistant") {
      out += x.content + t.tokens.eos;
    } else {
      return refused(t.family, "Only user and assistant roles are supported!");
    }
  }
  return out;
}

expected<std::string> render_gemma(const chat_template& t, std::span<const chat_message> m, bool gen) {
  if (m[0].role == "system") return refused(t.family, "System role not supported");
  if (auto r = check_alternation(t.family, m); !r) return forward_error(r);
  std::string out = t.tokens.bos;
  for (const auto& x : m) {
    const std::string role = x.role == "assistant" ? "model" : x.role;
    out += "<start_of_turn>" + role + "\n" + strip(x.content) + "<end_of_turn>\n";
  }
  if (gen) out += "<start_of_turn>model\n";
  return out;
}

/// ChatML templates that write a default system turn do it with a literal
/// '<|im_start|>system\n...<|im_end|>' string; its text is the default.
std::string find_default_system(std::string_view text) {
  constexpr std::string_view start = "<|im_start|>system";
  for (size_t at = text.find(start); at != std::string_view::npos; at = text.find(start, at + 1)) {
    size_t i = at + start.size();
    if (text.compare(i, 1, "\n") == 0) {
      i += 1;
    } else if (text.compare(i, 2, "\\n") == 0) {
      i += 2;
    } else {
      continue;
    }
    const size_t end = text.find("<|im_end|>", i);
    if (end == std::string_view::npos) break;
    std::string_view body = text.substr(i, end - i);
    if (body.empty() || body.find_first_of("'\"{}+") != std::string_view::npos) continue;
    // Undo the string literal's escapes.
    std::string out;
    for (size_t k = 0; k < body.size(); ++k) {
      if (body[k] == '\\' && k + 1 < body.size()) {
        const char c = body[++k];
        out.push_back(c == 'n' ? '\n' : c == 't' ? '\t' : c);
      } else {
        out.push_back(body[k]);
      }
    }
    return out;
  }
  return "";
}

std::string known_names() {
  std::string s;
  for (auto n : chat_template_names()) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

}  // namespace

std::string_view to_string(chat_family f) {
  switch (f) {
    case chat_family::chatml: return "chatml";
    case chat_family::llama3: return "llama3";
    case chat_family::llama31: return "llama3.1";
    case chat_family::llama2: return "llama2";
    case chat_family::mistral: return "mistral";
    case chat_family::gemma: return "gemma";
  }
  return "?";
}

const std::vector<std::string_view>& chat_template_names() {
  static const std::vector<std::string_view> names = {"chatml", "qwen2",   "qwen2.5", "llama3",
                                                      "llama3.1", "llama2", "mistral", "gemma"};
  return names;
}

expected<chat_template> chat_template_by_name(std::string_view name, chat_tokens tokens) {
  chat_template t;
  t.tokens = std::move(tokens);
  if (name == "chatml") {
    t.family = chat_family::chatml;
  } else if (name == "qwen2") {
    t.family = chat_family::chatml;
    t.default_system = qwen2_system;
  } else if (name == "qwen2.5") {
    t.family = chat_family::chatml;
    t.default_system = qwen25_system;
  } else if (name == "llama3") {
    t.family = chat_family::llama3;
  } else if (name == "llama3.1") {
    t.family = chat_family::llama31;
  } else if (name == "llama2") {
    t.family = chat_family::llama2;
  } else if (name == "mistral") {
    t.family = chat_family::mistral;
  } else if (name == "gemma") {
    t.family = chat_family::gemma;
  } else {
    return make_error(error_code::not_found,
                      fmt::format("chat template \"{}\" is not known (known: {})", name, known_names()));
  }
  return t;
}

expected<chat_template> detect_chat_template(std::string_view text, chat_tokens tokens) {
  auto has = [&](std::string_view s) { return text.find(s) != std::string_view::npos; };
  chat_template t;
  t.tokens = std::move(tokens);
  if (has("<start_of_turn>")) {
    t.family = chat_family::gemma;
  } else if (has("<|start_header_id|>")) {
    t.family = has("Cutting Knowledge Date") ? chat_family::llama31 : chat_family::llama3;
  } else if (has("<|im_start|>")) {
    t.family = chat_family::chatml;
    t.default_system = find_default_system(text);
  } else if (has("[INST]")) {
    t.family = has("<<SYS>>") ? chat_family::llama2 : chat_family::mistral;
  } else {
    return make_error(error_code::unsupported,
                      fmt::format("the checkpoint's chat template is not one of the known families; name one with "
                                  "--chat-template NAME (known: {}), e.g. --chat-template chatml",
                                  known_names()));
  }
  return t;
}

expected<std::string> chat_template::render(std::span<const chat_message> messages, bool add_generation_prompt) const {
  if (messages.empty()) return refused(family, "the conversation has no messages");
  switch (family) {
    case chat_family::chatml: return render_chatml(*this, messages, add_generation_prompt);
    case chat_family::llama3: return render_llama3(*this, messages, add_generation_prompt);
    case chat_family::llama31: return render_llama31(*this, messages, add_generation_prompt);
    case chat_family::llama2: return render_llama2(*this, messages, add_generation_prompt);
    case chat_family::mistral: return render_mistral(*this, messages, add_generation_prompt);
    case chat_family::gemma: return render_gemma(*this, messages, add_generation_prompt);
  }
  return make_error(error_code::internal, "chat template: unknown family");
}

chat_tokens chat_tokens_of(const tokenizer& t) {
  chat_tokens c;
  const auto& v = t.vocab();
  if (v.bos_id) c.bos = t.piece(*v.bos_id);
  if (v.eos_id) c.eos = t.piece(*v.eos_id);
  return c;
}

}  // namespace mesh::models
