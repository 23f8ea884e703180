// libFuzzer target for the GGUF reader (models/gguf.hpp), the first thing to touch a checkpoint a
// user points meshnode at: any bytes give an error or a view whose every tensor lies inside the
// input with exactly row_bytes(type, ne0) x rows bytes, whose metadata values all decode, and
// whose model config (when the metadata has one) is within its bounds.
#include "models/dequantize.hpp"
#include "models/gguf.hpp"
#include "models/model_config.hpp"
#include "tests/fuzz/fuzz_check.hpp"

namespace {

using mesh::fuzz::check;

bool inside(std::span<const uint8_t> part, const uint8_t* data, size_t size) {
  return part.empty() || (part.data() >= data && part.data() + part.size() <= data + size);
}

void walk(const mesh::models::gguf_value& v, const uint8_t* data, size_t size, int depth) {
  check(inside(v.encoded(), data, size));
  check(depth <= mesh::models::gguf_view::max_array_depth);
  if (v.type() == mesh::models::gguf_value_type::array) {
    const auto elements = v.elements();
    check(elements.size() == v.size());
    for (const auto& e : elements) walk(e, data, size, depth + 1);
  } else if (v.type() == mesh::models::gguf_value_type::string) {
    check(v.as_string().size() + 8 == v.encoded().size());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mesh::models;
  auto g = gguf_view::parse({data, size}, "fuzz.gguf");
  if (!g) return 0;
  check(g->version() == 2 || g->version() == 3);
  check(g->alignment() != 0 && (g->alignment() & (g->alignment() - 1)) == 0);
  for (const auto& [key, value] : g->metadata()) {
    check(g->find(key) == &value);
    walk(value, data, size, 0);
  }
  for (const auto& t : g->tensors()) {
    check(t.n_dims <= gguf_view::max_dims);
    check(inside(t.data, data, size));
    auto row = row_bytes(t.type, t.ne[0]);
    check(row.has_value());
    const auto rows = static_cast<uint64_t>(t.ne[1]) * static_cast<uint64_t>(t.ne[2]) * static_cast<uint64_t>(t.ne[3]);
    check(t.data.size() == static_cast<uint64_t>(*row) * rows);
    check(t.offset % g->alignment() == 0);
    check(g->find_tensor(t.name) == &t);
    // The first row dequantizes without reading past it.
    if (!t.data.empty() && t.ne[0] <= 4096) {
      std::vector<float> out(static_cast<size_t>(t.ne[0]));
      check(dequantize_row(t.type, t.data.first(static_cast<size_t>(*row)), out).has_value());
    }
  }
  if (auto c = parse_gguf_config(*g)) {
    check(c->n_layers > 0 && c->n_heads > 0 && c->n_kv_heads > 0 && c->n_heads % c->n_kv_heads == 0);
    (void)tensor_names(*c, c->n_layers - 1);
  }
  return 0;
}
