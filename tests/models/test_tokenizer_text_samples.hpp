#pragma once
// Text the tokenizer tests train on and encode: ASCII, accents, CJK, emoji, digit runs, whitespace
// runs, newlines, contractions, and (for byte-level BPE) special tokens inside the text.
#include <random>
#include <string>
#include <vector>

namespace mesh::models::test {

inline std::string training_corpus() {
  const std::vector<std::string> lines = {
      "The quick brown fox jumps over the lazy dog. It's the dog's day, isn't it? We'll see, they'd say.",
      "Tokenizers split text into words, then merge bytes into pieces by rank.",
      "Café, naïve, résumé, façade, Ångström, Straße, jalapeño, crème brûlée.",
      "東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다.",
      "Numbers: 12345, 3.14159, 2024-06-01, 1000000 and 42; phone +1 (555) 123-4567.",
      "    indented code:\n\tfor (int i = 0; i < n; ++i) { sum += a[i]; }\n\n",
      "Emoji: 😀 🚀 👍🏽 ❤️ 🇫🇷 — and dashes – “quotes” ‘single’ …",
      "Привет, мир! Γειά σου Κόσμε! مرحبا بالعالم שלום עולם",
      "I'M SHOUTING, YOU'RE LISTENING, WE'VE HEARD, HE'D KNOW, SHE'LL GO.",
      "line one\r\nline two\rline three\n\n\nfour   spaces    here     end",
  };
  std::string corpus;
  for (int rep = 0; rep < 12; ++rep) {
    for (const auto& l : lines) corpus += l + "\n";
  }
  return corpus;
}

/// Fixed edge cases plus random mixes of fragments (fixed seed).
inline std::vector<std::string> sample_texts(bool with_specials) {
  std::vector<std::string> s = {
      "",
      " ",
      "a",
      "Hello world",
      " Hello  world ",
      "It's, isn't it? We'll they'd I'm you're we've",
      "IT'S ISN'T WE'LL",
      "Café naïve Ångström",
      "東京は日本の首都です。",
      "😀🚀👍🏽 ❤️🇫🇷",
      "1234567890 3.14 007",
      "\n\n\n",
      "a\r\nb\rc\n",
      "\t\t  tabs and    spaces   ",
      "trailing   ",
      "   leading",
      "mixed123abc456",
      "don't stop",
      "ℌ𝔢𝔩𝔩𝔬 ½ Ⅻ ²³",
      "ÿ\x7f\x01 control",
      "zero\u200bwidth",
  };
  if (with_specials) {
    s.push_back("<|endoftext|>");
    s.push_back("Hi<|im_start|>user\nhello<|im_end|>\n");
    s.push_back("<|im_start|>x<|im_start|>xy<|im_end|><|im_end|>");
    s.push_back("a<tool>b <tool> c<|endoftext|>");
  }
  const std::vector<std::string> frags = {
      "the", " the", "The", " quick", "fox", "'s", "'t", "'ll", "'D", "é", "ñ", "ü", "Straße", "東京", "首都",
      "。", "😀", "👍🏽", "🇫🇷", "0", "12", "345", "67890", " ", "  ", "   ", "\n", "\n\n", "\r\n", "\t", ".",
      ",", "!?", "...", "—", "“", "(", ")", "{", "}", "Привет", "κόσμε", "a", "B", "zz", "€", "$", "%", "_",
      "-", "=",
  };
  std::mt19937 rng(1234);
  for (int i = 0; i < 300; ++i) {
    std::string t;
    const int n = 1 + static_cast<int>(rng() % 12);
    for (int k = 0; k < n; ++k) {
      t += frags[rng() % frags.size()];
      if (with_specials && rng() % 25 == 0) t += "<|im_end|>";
    }
    s.push_back(t);
  }
  return s;
}

}  // namespace mesh::models::test
