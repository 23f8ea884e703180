// libFuzzer target for the Hugging Face side of the checkpoint readers: the safetensors view
// (models/safetensors_view.hpp), the shard index and config.json (models/model_config.hpp). The
// first input byte picks the decoder. What decodes is consistent: every tensor's span lies inside
// the input and holds exactly shape x dtype bytes; shard names stay beside the index; configs stay
// within their bounds.
#include <string_view>

#include "models/model_config.hpp"
#include "models/safetensors_view.hpp"
#include "tests/fuzz/fuzz_check.hpp"

namespace {

using mesh::fuzz::check;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mesh::models;
  if (size == 0) return 0;
  const uint8_t which = data[0] % 3;
  const std::span<const uint8_t> input(data + 1, size - 1);
  const std::string_view text(reinterpret_cast<const char*>(input.data()), input.size());
  if (which == 0) {
    auto v = safetensors_view::parse(input, "fuzz.safetensors");
    if (!v) return 0;
    check(v->data_offset() >= 8 && v->data_offset() <= input.size());
    for (const auto& t : v->tensors()) {
      check(t.data.empty() || (t.data.data() >= input.data() + v->data_offset() && t.data.data() + t.data.size() <= input.data() + input.size()));
      uint64_t n = static_cast<uint64_t>(*row_bytes(t.type, 1));
      for (const int64_t d : t.shape) {
        check(d >= 0);
        n *= static_cast<uint64_t>(d);  // bounded: the span checked above is at most the input
      }
      check(n == t.data.size());
      check(v->find(t.name) == &t);
    }
  } else if (which == 1) {
    auto index = parse_safetensors_index(text, "fuzz.index.json");
    if (!index) return 0;
    for (const auto& [name, shard] : index->weight_map) {
      check(!shard.empty() && shard.find('/') == std::string::npos && shard != "..");
      (void)name;
    }
  } else {
    auto c = parse_hf_config(text, "fuzz.config.json");
    if (!c) return 0;
    check(c->n_layers > 0 && c->n_heads > 0 && c->n_kv_heads > 0 && c->n_heads % c->n_kv_heads == 0);
    check(c->head_dim > 0 && c->vocab_size > 0 && c->max_context > 0);
    (void)tensor_names(*c, c->n_layers - 1);
  }
  return 0;
}
