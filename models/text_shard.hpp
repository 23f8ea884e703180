#pragma once
/// One shard of a training data file, as a training worker reads it: the records that start in the
/// shard's byte range, tokenized and packed into rows, streamed, and handed out as micro-batches in
/// an order every node computes alike (actors/train_text.hpp puts it on the mesh).
///
/// The file of `size` bytes is cut into S shards at byte offsets (shard_bytes); a record belongs to
/// the shard its first byte lies in (text_record_reader::open_range). A shard's records, in file
/// order, are packed into rows of `sequence` tokens (packing restarts at the shard's start, so a
/// shard's rows depend on its bytes only). One pass over them is an epoch of the shard: its R rows
/// are visited in blocks of K consecutive rows (K = the shuffle window, a multiple of the
/// micro-batch), each block's rows in a Fisher-Yates order driven by std::mt19937_64 seeded from
/// (seed, shard, epoch, block). Draw d of an epoch is the d-th run of `batch` rows in that order;
/// an epoch has floor(R / batch) draws, the rows past them are skipped, and the next epoch reads the
/// shard again. Memory stays at two blocks plus one record; nothing is read before it is needed.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "base/error.hpp"
#include "models/text_dataset.hpp"

namespace mesh::models {

/// [begin, end): the bytes of shard `shard` of `shards` of a file of `size` bytes.
struct byte_span {
  uint64_t begin = 0, end = 0;
};
byte_span shard_bytes(uint64_t size, uint32_t shards, uint32_t shard);

struct text_shard_options {
  std::string name;           ///< the file, in messages
  data_format format = data_format::text;
  uint64_t size = 0;          ///< bytes of the whole file
  uint32_t shards = 1;        ///< S
  uint32_t shard = 0;         ///< which one (< S)
  int64_t sequence = 128;     ///< tokens per row
  int64_t batch = 1;          ///< rows per draw (a micro-batch)
  uint64_t seed = 0;
  int64_t shuffle_rows = 1024;  ///< K, rounded up to a multiple of `batch`
};

class text_shard {
 public:
  /// `tok` and `chat` (may be null) must outlive the shard. Nothing is read yet. Errors:
  /// invalid_argument for options out of range.
  static expected<text_shard> open(byte_source source, const tokenizer& tok, const chat_template* chat,
                                   text_shard_options options);

  /// The rows of draw `index` (counted from the run's start, over epochs): `batch` rows. Draws
  /// are cheapest in increasing order; an earlier one than the last two blocks reads the shard
  /// again from its start. Errors: the reader's and tokenizer's (naming the file and the byte
  /// where the record starts), and invalid_argument when the shard fills no draw ("shard 2 of 3
  /// of data.txt (bytes ...) gives 1 row of 64 tokens, fewer than a micro-batch of 4").
  expected<packed_rows> draw(uint64_t index);

  /// Draws per epoch, once one pass over the shard has ended.
  std::optional<uint64_t> per_epoch() const {
    return rows_ ? std::optional<uint64_t>(static_cast<uint64_t>(*rows_ / options_.batch)) : std::nullopt;
  }

 private:
  /// A block of a pass: its rows in file order and the order they are drawn in.
  struct block {
    packed_rows rows;
    std::vector<int64_t> order;
  };
  text_shard(byte_source source, const tokenizer& tok, const chat_template* chat, text_shard_options options);
  /// Starts pass `epoch` from the shard's first record.
  expected<void> restart(uint64_t epoch);
  /// Reads the next block of the current pass; nothing when the pass has ended (rows_ is then known).
  expected<std::optional<block>> read_block();
  /// Block `index` of epoch `epoch`; nothing when the epoch has fewer blocks.
  expected<const block*> block_of(uint64_t epoch, uint64_t index);

  byte_source source_;
  const tokenizer* tok_ = nullptr;
  const chat_template* chat_ = nullptr;
  text_shard_options options_;
  byte_span bytes_;
  std::optional<int64_t> rows_;  ///< R, after a whole pass

  // The pass in progress.
  std::optional<text_record_reader> reader_;
  std::optional<row_packer> packer_;
  uint64_t pass_epoch_ = 0, pass_block_ = 0;  ///< the block read_block() returns next
  int64_t pass_rows_ = 0;
  bool pass_done_ = false;
  /// The last blocks read, by (epoch, block): a step redone, or shared by a step's micro-batches.
  std::map<std::pair<uint64_t, uint64_t>, block> recent_;
};

}  // namespace mesh::models
