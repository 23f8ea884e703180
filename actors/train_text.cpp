#include "actors/train_text.hpp"

#include <fmt/format.h>

namespace mesh {

namespace {

int32_t id_or_none(const std::optional<int32_t>& id) { return id ? *id : -1; }
std::optional<int32_t> none_or_id(int32_t id) { return id >= 0 ? std::optional<int32_t>(id) : std::nullopt; }

/// Data errors fail the run (every worker would meet them): they travel as decode_error.
error as_data_error(error e) {
  if (e.code == error_code::invalid_argument || e.code == error_code::limit_exceeded) e.code = error_code::decode_error;
  return e;
}

}  // namespace

msg::wire_vocabulary to_wire(const models::vocabulary& v) {
  msg::wire_vocabulary w;
  w.model = static_cast<uint8_t>(v.model);
  w.tokens = v.tokens;
  w.scores = v.scores;
  w.token_types = v.token_types;
  for (const auto& [left, right] : v.merges) {
    w.merge_left.push_back(left);
    w.merge_right.push_back(right);
  }
  w.pre_tokenizer = v.pre_tokenizer;
  w.pre_tokenizer_patterns = v.pre_tokenizer_patterns;
  w.ignore_merges = v.ignore_merges;
  w.add_space_prefix = v.add_space_prefix;
  w.bos_id = id_or_none(v.bos_id);
  w.eos_id = id_or_none(v.eos_id);
  w.unk_id = id_or_none(v.unk_id);
  w.pad_id = id_or_none(v.pad_id);
  w.add_bos = v.add_bos;
  w.add_eos = v.add_eos;
  return w;
}

expected<models::vocabulary> from_wire(const msg::wire_vocabulary& w) {
  if (w.model > static_cast<uint8_t>(models::vocabulary::kind::sentencepiece))
    return make_error(error_code::invalid_argument, fmt::format("vocabulary: unknown tokenizer model {}", w.model));
  if (w.merge_left.size() != w.merge_right.size())
    return make_error(error_code::invalid_argument, fmt::format("vocabulary: {} merge left sides but {} right sides",
                                                                w.merge_left.size(), w.merge_right.size()));
  models::vocabulary v;
  v.model = static_cast<models::vocabulary::kind>(w.model);
  v.tokens = w.tokens;
  v.scores = w.scores;
  v.token_types = w.token_types;
  v.merges.reserve(w.merge_left.size());
  for (size_t i = 0; i < w.merge_left.size(); ++i) v.merges.emplace_back(w.merge_left[i], w.merge_right[i]);
  v.pre_tokenizer = w.pre_tokenizer;
  v.pre_tokenizer_patterns = w.pre_tokenizer_patterns;
  v.ignore_merges = w.ignore_merges;
  v.add_space_prefix = w.add_space_prefix;
  v.bos_id = none_or_id(w.bos_id);
  v.eos_id = none_or_id(w.eos_id);
  v.unk_id = none_or_id(w.unk_id);
  v.pad_id = none_or_id(w.pad_id);
  v.add_bos = w.add_bos;
  v.add_eos = w.add_eos;
  if (auto ok = v.validate(); !ok) return forward_error(ok);
  return v;
}

msg::train_text_data make_text_data(std::string path, models::data_format format, uint32_t sequence,
                                    const models::vocabulary& vocab, const std::optional<std::string>& chat_template) {
  msg::train_text_data t;
  t.path = std::move(path);
  t.format = static_cast<uint8_t>(format);
  t.sequence = sequence;
  t.vocab = to_wire(vocab);
  t.chat_template = chat_template.value_or("");
  return t;
}

tensor_map text_columns(const msg::train_text_data& text) {
  const shape dims = {0, static_cast<int64_t>(text.sequence)};
  return {{"tokens", tensor::zeros(dtype::i32, dims)}, {"targets", tensor::zeros(dtype::i32, dims)}, {"mask", tensor::zeros(dtype::f32, dims)}};
}

expected<void> check_text_data(const msg::train_text_data& text) {
  const auto bad = [](const std::string& what) { return make_error(error_code::invalid_argument, "training data: " + what); };
  if (text.format > static_cast<uint8_t>(models::data_format::jsonl)) return bad(fmt::format("unknown format {}", text.format));
  if (text.sequence < 1) return bad("a row needs at least 1 token");
  if (text.shuffle_rows < 1) return bad("a shuffle window of 0 rows");
  if (text.file.size == 0) return bad(fmt::format("{} is empty", text.path));
  return {};
}

expected<std::unique_ptr<text_data_reader>> text_data_reader::create(const msg::train_text_data& text, models::byte_source bytes,
                                                                     int64_t micro_batch, uint32_t shards, uint64_t seed) {
  if (auto ok = check_text_data(text); !ok) return tl::unexpected(as_data_error(ok.error()));
  auto vocab = from_wire(text.vocab);
  if (!vocab) return tl::unexpected(as_data_error(vocab.error()));
  auto tok = models::tokenizer::create(std::move(*vocab));
  if (!tok) return tl::unexpected(as_data_error(tok.error()));
  std::optional<models::chat_template> chat;
  if (!text.chat_template.empty()) {
    // A template that is not recognised leaves chat records without one: they fail by name.
    if (auto t = models::detect_chat_template(text.chat_template, models::chat_tokens_of(*tok))) chat = std::move(*t);
  }
  std::unique_ptr<text_data_reader> r(new text_data_reader(std::move(*tok), std::move(chat)));
  r->bytes_ = std::move(bytes);
  r->options_.name = text.path;
  r->options_.format = static_cast<models::data_format>(text.format);
  r->options_.size = text.file.size;
  r->options_.shards = shards;
  r->options_.sequence = text.sequence;
  r->options_.batch = micro_batch;
  r->options_.seed = seed;
  r->options_.shuffle_rows = text.shuffle_rows;
  return r;
}

expected<tensor_map> text_data_reader::micro_batch(uint32_t shard, uint64_t draw) {
  auto it = shards_.find(shard);
  if (it == shards_.end()) {
    auto o = options_;
    o.shard = shard;
    auto s = models::text_shard::open(bytes_, tok_, chat_ ? &*chat_ : nullptr, std::move(o));
    if (!s) return tl::unexpected(as_data_error(s.error()));
    it = shards_.emplace(shard, std::move(*s)).first;
  }
  auto rows = it->second.draw(draw);
  if (!rows) return tl::unexpected(as_data_error(rows.error()));
  return models::to_columns(*rows);
}

}  // namespace mesh
