#pragma once
/// Chat templates of the common families, rendered in C++ exactly as their Jinja templates render
/// (no Jinja interpreter: the families are recognised from the template text in the checkpoint,
/// or named by the user).
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.hpp"

namespace mesh::models {

struct chat_message {
  std::string role;  ///< "system", "user", "assistant" (ChatML also renders "tool")
  std::string content;
};

enum class chat_family {
  chatml,    ///< <|im_start|>role\n...<|im_end|>\n (Qwen2 and Qwen2.5 add a default system turn)
  llama3,    ///< <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>
  llama31,   ///< Llama 3.1/3.2/3.3: llama3 with a system turn that always states the dates
  llama2,    ///< [INST] with a <<SYS>> block in the first turn
  mistral,   ///< [INST] without a system block
  gemma,     ///< <start_of_turn>user\n...<end_of_turn>\n, "model" for the assistant
};

/// "chatml", "llama3", ...
std::string_view to_string(chat_family f);

/// The texts of the special tokens a template writes (from the vocabulary: tokens[bos_id], ...).
struct chat_tokens {
  std::string bos;
  std::string eos;
};

class tokenizer;

/// The BOS and EOS pieces of `t`'s vocabulary (empty where it has none).
chat_tokens chat_tokens_of(const tokenizer& t);

/// A recognised template: the family and what of the checkpoint's template text it keeps.
struct chat_template {
  chat_family family = chat_family::chatml;
  /// chatml: the system turn the template writes when the conversation has none ("" for none).
  std::string default_system;
  /// llama31: "Today Date: ..." (the templates default to "26 Jul 2024").
  std::string date = "26 Jul 2024";
  chat_tokens tokens;

  /// The prompt text, as the family's Jinja template renders `messages` (special tokens as text:
  /// encode it with parse_special and without add_special, since BOS is in the text where the
  /// template puts it). A conversation the template refuses (roles that do not alternate, a
  /// system turn Gemma does not take) is an error with the template's own message.
  expected<std::string> render(std::span<const chat_message> messages, bool add_generation_prompt) const;
};

/// The names chat_template_by_name knows, for help texts and errors.
const std::vector<std::string_view>& chat_template_names();

/// A family by name ("chatml", "qwen2", "qwen2.5", "llama3", "llama3.1", "llama2", "mistral",
/// "gemma"); an unknown name is an error listing the known ones.
expected<chat_template> chat_template_by_name(std::string_view name, chat_tokens tokens = {});

/// Recognises the family of a checkpoint's template text (tokenizer_config.json `chat_template`
/// or GGUF `tokenizer.chat_template`); an unknown template is an error that says how to name one.
expected<chat_template> detect_chat_template(std::string_view template_text, chat_tokens tokens = {});

}  // namespace mesh::models
