// Any bytes as tokenizer.json (the first half) and tokenizer_config.json (the rest): an error, or a
// vocabulary that validates and whose tokenizer encodes and decodes without crashing.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "models/tokenizer.hpp"
#include "models/tokenizer_json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view all(reinterpret_cast<const char*>(data), size);
  // A separator byte splits the two files, so the fuzzer can grow either.
  const size_t sep = all.find('\x01');
  std::string_view tok_json = all.substr(0, sep);
  std::string_view config = sep == std::string_view::npos ? std::string_view() : all.substr(sep + 1);
  auto hf = mesh::models::parse_hf_tokenizer(tok_json, config);
  if (!hf) return 0;
  if (!hf->vocab.validate()) __builtin_trap();
  auto tok = mesh::models::tokenizer::create(hf->vocab);
  if (!tok) return 0;
  auto ids = tok->encode(tok_json.substr(0, 256));
  if (ids) (void)tok->decode(*ids);
  return 0;
}
