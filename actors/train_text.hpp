#pragma once
/// Training data read from a file by the workers themselves (wire: msg::train_text_data): the
/// vocabulary as it travels, and a worker's reader of the shards its micro-batches draw from
/// (models/text_shard.hpp over the bytes the shell gives it: the local file on the node that
/// offers it, chunks fetched from that node elsewhere).
#include <cstdint>
#include <map>
#include <memory>
#include <optional>

#include "base/error.hpp"
#include "graph/evaluate.hpp"
#include "models/chat_template.hpp"
#include "models/text_shard.hpp"
#include "models/tokenizer.hpp"
#include "models/vocabulary.hpp"
#include "wire/messages.hpp"

namespace mesh {

msg::wire_vocabulary to_wire(const models::vocabulary& v);
/// The vocabulary a peer sent, checked (vocabulary::validate): errors name what is wrong.
expected<models::vocabulary> from_wire(const msg::wire_vocabulary& w);

/// The client's description of a run's data: `path` on the node that will coordinate the run,
/// the file's format, the row length and the model's tokenizer (and chat template, if any).
msg::train_text_data make_text_data(std::string path, models::data_format format, uint32_t sequence,
                                    const models::vocabulary& vocab, const std::optional<std::string>& chat_template);

/// The dataset columns a run on `text` feeds its gradient graph, with no rows: "tokens" and
/// "targets" i32 [0, sequence], "mask" f32 [0, sequence].
tensor_map text_columns(const msg::train_text_data& text);

/// Checks what a worker relies on before it reads anything: a known format, a sequence of at
/// least one token, a shuffle window, a file offered (digest and size). invalid_argument naming
/// the field.
expected<void> check_text_data(const msg::train_text_data& text);

/// A worker's view of a run's data file: the tokenizer built once, one models::text_shard per
/// shard its micro-batches have drawn from. Used from one thread (the executor's).
class text_data_reader {
 public:
  /// `bytes`: the file's bytes; `micro_batch`: rows per draw; `shards`: S; `seed`: the run's.
  /// Errors: the vocabulary's (from_wire, tokenizer::create), decode_error-coded so the
  /// coordinator fails the run (every worker would fail the same way).
  static expected<std::unique_ptr<text_data_reader>> create(const msg::train_text_data& text, models::byte_source bytes,
                                                            int64_t micro_batch, uint32_t shards, uint64_t seed);

  /// Draw `draw` of shard `shard` as the gradient graph's inputs (text_columns with micro_batch
  /// rows). Errors of the data (a bad record, a shard too small) are decode_error; a fetch that
  /// failed keeps its code.
  expected<tensor_map> micro_batch(uint32_t shard, uint64_t draw);

 private:
  text_data_reader(models::tokenizer tok, std::optional<models::chat_template> chat)
      : tok_(std::move(tok)), chat_(std::move(chat)) {}
  models::tokenizer tok_;
  std::optional<models::chat_template> chat_;
  models::byte_source bytes_;
  models::text_shard_options options_;
  std::map<uint32_t, models::text_shard> shards_;
};

}  // namespace mesh
