#include "models/pre_tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>

#include <utility>

namespace mesh::models {

const char* const gpt2_pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

// The regexes as the models' tokenizer.json files carry them (Llama 3's and Qwen2's differ only in
// how many digits make a number).
const char* const llama3_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const qwen2_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const single_digits_pattern = R"(\p{N})";

struct known_pre {
  const char* name;
  std::vector<std::string> patterns;
};

const std::vector<known_pre>& known() {
  static const std::vector<known_pre> k = {
      {"gpt2", {gpt2_pattern}},
      {"llama-bpe", {llama3_pattern}},
      {"qwen2", {qwen2_pattern}},
      // SmolLM: HF Digits(individual_digits) before ByteLevel.
      {"smollm", {single_digits_pattern, gpt2_pattern}},
      {"starcoder", {single_digits_pattern, gpt2_pattern}},
  };
  return k;
}

}  // namespace

expected<std::vector<std::string>> pre_tokenizer_patterns(std::string_view gguf_name) {
  std::string names;
  for (const auto& k : known()) {
    if (gguf_name == k.name) return k.patterns;
    names += names.empty() ? "" : ", ";
    names += k.name;
  }
  return make_error(error_code::unsupported,
                    fmt::format("pre-tokenizer \"{}\" is not supported (known: {}; a tokenizer.json with the Split "
                                "regex works for any other)",
                                gguf_name, names));
}

std::string pre_tokenizer_name(const std::vector<std::string>& patterns) {
  for (const auto& k : known()) {
    if (k.patterns == patterns) return k.name;
  }
  return "";
}

struct pre_tokenizer::impl {
  struct compiled {
    pcre2_code* code = nullptr;
    bool jit = false;
  };
  std::vector<compiled> codes;
  pcre2_match_context* context = nullptr;

  ~impl() {
    for (auto& c : codes) pcre2_code_free(c.code);
    if (context) pcre2_match_context_free(context);
  }

  // Splits `text` with pattern `level` and hands each piece to the next level (or to `word`).
  expected<void> run(size_t level, std::string_view text, pcre2_match_data* md,
                     const std::function<void(std::string_view)>& word) const {
    if (level == codes.size()) {
      if (!text.empty()) word(text);
      return {};
    }
    const auto& c = codes[level];
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t start = 0, gap = 0;
    while (start <= text.size()) {
      const int rc = c.jit ? pcre2_jit_match(c.code, subject, text.size(), start, 0, md, context)
                           : pcre2_match(c.code, subject, text.size(), start, 0, md, context);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR buf[256];
        pcre2_get_error_message(rc, buf, sizeof buf);
        return make_error(error_code::limit_exceeded,
                          fmt::format("pre-tokenizer: the regex gave up on the text: {}", reinterpret_cast<char*>(buf)));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t b = ov[0], e = ov[1];
      if (b > gap) {
        if (auto r = run(level + 1, text.substr(gap, b - gap), md, word); !r) return r;
      }
      if (e > b) {
        if (auto r = run(level + 1, text.substr(b, e - b), md, word); !r) return r;
      }
      gap = e;
      if (e == b) {
        // An empty match: step over one character (one byte of invalid UTF-8).
        if (e >= text.size()) break;
        start = e + 1;
        while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) ++start;
      } else {
        start = e;
      }
    }
    if (gap < text.size()) return run(level + 1, text.substr(gap), md, word);
    return {};
  }
};

pre_tokenizer::pre_tokenizer(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
pre_tokenizer::pre_tokenizer(pre_tokenizer&&) noexcept = default;
pre_tokenizer& pre_tokenizer::operator=(pre_tokenizer&&) noexcept = default;
pre_tokenizer::~pre_tokenizer() = default;

expected<pre_tokenizer> pre_tokenizer::create(const std::vector<std::string>& patterns) {
  auto p = std::make_unique<impl>();
  for (const auto& pattern : patterns) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    // MATCH_INVALID_UTF: arbitrary bytes are a valid subject; invalid sequences simply never match.
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &offset, nullptr);
    if (!code) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(err, buf, sizeof buf);
      return make_error(error_code::invalid_argument,
                        fmt::format("pre-tokenizer: the regex does not compile at offset {}: {}", offset,
                                    reinterpret_cast<char*>(buf)));
    }
    const bool jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    p->codes.push_back({code, jit});
  }
  p->context = pcre2_match_context_create(nullptr);
  // A hostile pattern (from a tokenizer.json) must not spin or eat the heap on a long text.
  pcre2_set_match_limit(p->context, 10'000'000);
  pcre2_set_depth_limit(p->context, 100'000);
  pcre2_set_heap_limit(p->context, 64 * 1024);  // KiB
  return pre_tokenizer(std::move(p));
}

expected<void> pre_tokenizer::split(std::string_view text, const std::function<void(std::string_view)>& word) const {
  if (text.empty()) return {};
  if (impl_->codes.empty()) {
    word(text);
    return {};
  }
  struct md_free {
    void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
  };
  // One match data per level is not needed: each level reads the ovector before recursing.
  std::unique_ptr<pcre2_match_data, md_free> md(pcre2_match_data_create(1, nullptr));
  if (!md) return make_error(error_code::internal, "pre-tokenizer: out of memory for PCRE2 match data");
  return impl_->run(0, text, md.get(), word);
}

}  // namespace mesh::models
