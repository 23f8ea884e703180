#include "models/sequence_model.hpp"

#include <fmt/format.h>

#include "models/sampler.hpp"

namespace mesh::models {

expected<std::vector<int32_t>> sequence_model::decode_greedy(int64_t slot, int32_t token, int64_t count) {
  if (count < 1) return make_error(error_code::invalid_argument, fmt::format("decode_greedy: {} tokens asked for", count));
  if (slot < 0 || slot >= slots())
    return make_error(error_code::invalid_argument, fmt::format("decode_greedy: slot {} does not exist", slot));
  if (position(slot) + count > context())
    return make_error(error_code::limit_exceeded,
                      fmt::format("decode_greedy: {} more tokens after {} would pass the context of {} positions", count,
                                  position(slot), context()));
  std::vector<int32_t> picked;
  picked.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const slot_token step{slot, i == 0 ? token : picked.back()};
    auto logits = decode(std::span(&step, 1));
    if (!logits) return forward_error(logits);
    picked.push_back(first_argmax(logits->front()));
  }
  return picked;
}

expected<void> sequence_model::rewind(int64_t, int64_t) {
  return make_error(error_code::unsupported, "this model cannot drop positions it has filled");
}

}  // namespace mesh::models
