#include "models/layer_range.hpp"

#include <fmt/format.h>

namespace mesh::models {

std::string to_string(const layer_range& r) {
  return fmt::format("[{}, {}){}", r.first, r.end, r.head ? "" : " without the head");
}

expected<layer_range> resolve_layers(const layer_range& r, int64_t n_layers) {
  layer_range out = r;
  if (out.end == 0) out.end = n_layers;
  if (out.first == n_layers && out.end == n_layers && out.head && n_layers > 0) return out;  // the head alone
  const char* why = out.first < 0           ? "the first layer is negative"
                    : out.first >= n_layers ? "it starts past the last layer"
                    : out.end > n_layers    ? "it runs past the last layer"
                    : out.first >= out.end  ? "it holds no layer"
                                            : nullptr;
  if (why)
    return make_error(error_code::invalid_argument,
                      fmt::format("layers {} of a model with {} layers: {}", to_string(out), n_layers, why));
  return out;
}


int64_t model_costs::stage_bytes(const layer_range& r) const {
  int64_t total = 0;
  for (int64_t l = r.first; l < r.end; ++l) total += layer_bytes[static_cast<size_t>(l)] + kv_bytes_per_layer;
  if (r.takes_tokens()) total += first_bytes;
  if (r.returns_logits(layers())) total += last_bytes;
  if (r.whole(layers())) total -= shared_bytes;
  return total;
}

}  // namespace mesh::models
