#pragma once
// What the mesh_text tests share: a scratch directory, files, and running the Python references
// (which may be missing: then the test warns and passes).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "models/tokenizer.hpp"
#include "models/utf8.hpp"
#include "run_command.hpp"

namespace mesh::models::test {

/// The folder of this file: ref_*.py and chat_templates.json live there.
inline std::filesystem::path text_test_dir() { return MESH_TEXT_TEST_DIR; }

struct scratch_dir {
  std::filesystem::path path;
  scratch_dir() {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() /
           ("mesh_text_" + std::to_string(::getpid()) + "_" + std::to_string(rd()));
    std::filesystem::create_directories(path);
  }
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
};

inline constexpr int32_t endoftext = 256, im_start = 257, im_end = 258, bos = 259;

/// Byte i is token i; then <|endoftext|> (EOS), <|im_start|>, <|im_end|> and <s> (BOS when asked).
inline tokenizer byte_tokenizer(bool add_bos) {
  vocabulary v;
  v.model = vocabulary::kind::byte_bpe;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(utf8::gpt2_bytes().to_text[b]);
  for (const char* s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>"}) v.tokens.push_back(s);
  v.token_types.assign(v.tokens.size(), static_cast<int32_t>(token_type::normal));
  for (int32_t id : {endoftext, im_start, im_end, bos}) v.token_types[id] = static_cast<int32_t>(token_type::control);
  v.eos_id = endoftext;
  if (add_bos) {
    v.bos_id = bos;
    v.add_bos = true;
  }
  return *tokenizer::create(v);
}

inline void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

/// The interpreter the last python_missing found the modules in.
inline std::string& chosen_python() {
  static std::string python = "python3";
  return python;
}

/// Why the reference cannot run (python3 or a module missing), or nothing when it can. The
/// `python3` on PATH comes first; Debian's own (/usr/bin/python3, where the python3-* packages
/// install) next, for a PATH whose python3 is another installation (pyenv).
inline std::optional<std::string> python_missing(const std::string& modules) {
  std::string why;
  for (const char* python : {"python3", "/usr/bin/python3"}) {
    auto r = mesh::test::run_command(std::string(python) + " -c " + quote("import " + modules));
    if (r.status == 0) {
      chosen_python() = python;
      return std::nullopt;
    }
    why += std::string("\n") + python + ": " + r.output;
  }
  return "python3 with " + modules + " is not available:" + why;
}

/// Runs `python3 script args...` with the interpreter python_missing chose; the output on failure.
inline std::optional<std::string> run_python(const std::string& script, const std::vector<std::string>& args) {
  std::string cmd = chosen_python() + " " + quote((text_test_dir() / script).string());
  for (const auto& a : args) cmd += " " + quote(a);
  auto r = mesh::test::run_command(cmd);
  if (r.status == 0) return std::nullopt;
  return r.output;
}

}  // namespace mesh::models::test
