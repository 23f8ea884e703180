#include "models/stream_decoder.hpp"

#include <fmt/format.h>

#include "models/utf8.hpp"

namespace mesh::models {

stream_decoder::stream_decoder(const tokenizer& tok, decode_options options) : tok_(&tok), options_(options) {}

expected<std::string> stream_decoder::push(int32_t id) {
  const vocabulary& v = tok_->vocab();
  if (id < 0 || id >= v.size()) {
    return make_error(error_code::invalid_argument,
                      fmt::format("stream decoder: token id {} is out of range (the vocabulary has {} tokens)", id, v.size()));
  }
  std::string_view piece = tok_->piece(id);
  if (tok_->is_control(id)) {
    if (!(v.bos_id && id == *v.bos_id)) first_text_ = false;
    if (options_.skip_special) return std::string();
  } else {
    // The same rule as tokenizer::decode: the dummy-prefix space of the first piece goes.
    if (first_text_ && tok_->strips_leading_space() && !piece.empty() && piece[0] == ' ' &&
        v.type_of(id) != token_type::user_defined) {
      piece.remove_prefix(1);
    }
    first_text_ = false;
  }
  pending_.append(piece);
  const size_t whole = utf8::complete_prefix(pending_);
  std::string out = utf8::sanitize(std::string_view(pending_).substr(0, whole));
  pending_.erase(0, whole);
  return out;
}

std::string stream_decoder::finish() {
  std::string out = utf8::sanitize(pending_);
  pending_.clear();
  first_text_ = true;
  return out;
}

}  // namespace mesh::models
