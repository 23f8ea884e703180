#pragma once
/// Training data from files: plain text and JSONL records, tokenized with the model's tokenizer
/// (and chat template), packed into fixed-length rows of next-token targets with a loss mask.
///
/// The pieces stream: a text_record_reader hands out one record at a time, tokenize_record turns it
/// into ids with per-token loss flags, a row_packer cuts complete rows off the stream, so memory
/// stays at one row plus one record whatever the file's size. pack_file does all of it for a file.
///
/// Records:
/// - plain text: documents separated by one or more blank lines (empty or only whitespace); a
///   document keeps its inner newlines. Every token of a document carries loss.
/// - JSONL (one object per non-empty line): `{"text": "..."}`, every token carries loss, or
///   `{"messages": [{"role": "...", "content": "..."}, ...]}`, rendered with the chat template;
///   only the assistant turns carry loss (their content and the template's end-of-turn text),
///   never the system or user turns nor the headers the template writes.
///
/// A bad record stops the read: the error names the file, the line and what is wrong. Skipping it
/// would hide data loss; fix the file instead.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "base/error.hpp"
#include "graph/evaluate.hpp"
#include "models/chat_template.hpp"
#include "models/tokenizer.hpp"

namespace mesh::models {

enum class data_format { text, jsonl };

/// ".jsonl" and ".json" (any case) are JSONL; anything else is plain text.
data_format data_format_of(const std::filesystem::path& path);

/// A conversation has at most this many messages: each assistant turn renders the conversation up
/// to it again, so the work grows with the square of the count.
inline constexpr size_t max_record_messages = 1024;

/// Random access to a data file's bytes: reads at most `into.size()` bytes at `offset` and says
/// how many it read (fewer only at the end of the file, 0 past it). A local file (file_source),
/// or on a training worker a file of another node whose chunks are fetched as they are read.
using byte_source = std::function<expected<size_t>(uint64_t offset, std::span<char> into)>;

/// The bytes of a local file, read with pread (the descriptor lives as long as the source).
/// Errors: io_error naming the file (cannot open, a directory).
expected<byte_source> file_source(const std::filesystem::path& path);

/// One record of a file, before tokenization.
struct text_record {
  std::string source;  ///< the file, for messages ("" for none)
  int64_t line = 0;    ///< 1-based line where the record starts; 0 when not known (a shard's read)
  uint64_t offset = 0; ///< byte of the file where the record starts
  /// A text (a document, or a JSONL "text") or a conversation (JSONL "messages").
  std::variant<std::string, std::vector<chat_message>> content;
};

/// Parses one JSONL line (not blank) into a record; `line_number`, `offset` and `source` go into
/// the record and into errors ("data.jsonl:7: ...", or "data.jsonl: byte 1048611: ..." when
/// line_number is 0: not known). Invalid JSON, a line that is not an object, neither
/// "text" nor "messages" (or both), "text" not a string, "messages" not a non-empty list of
/// objects with a string "role" and "content" are invalid_argument errors. Other keys are ignored.
expected<text_record> parse_jsonl_record(std::string_view line, int64_t line_number = 1, std::string_view source = {},
                                         uint64_t offset = 0);

/// Reads a file record by record, line by line (never the whole file at once). A UTF-8 byte order
/// mark at the start and a '\r' before each '\n' are dropped.
///
/// A reader may also read one byte range of a file: the records that *start* in [begin, end), each
/// read to its end even past `end`. Cutting a file at any offsets this way hands every record to
/// exactly one range (a JSONL record starts at its line's first byte, a document at its first
/// non-blank line's), which is how training workers split a file into shards without reading the
/// rest of it. Such a reader does not know line numbers: its records and errors name byte offsets.
class text_record_reader {
 public:
  /// Opens `path` (an io_error when it cannot be read). A JSONL line or a text document longer than
  /// `max_record_bytes` is an error when reached.
  static expected<text_record_reader> open(const std::filesystem::path& path, data_format format,
                                           size_t max_record_bytes = tokenizer::max_text_bytes);
  /// Reads the records of `source` (named `name` in messages) that start in [begin, end). Errors of
  /// the source (a fetch that failed) are the reader's errors, unchanged.
  static expected<text_record_reader> open_range(byte_source source, std::string name, data_format format, uint64_t begin,
                                                 uint64_t end, size_t max_record_bytes = tokenizer::max_text_bytes);

  /// The next record, or nothing at the end of the file (or range). After an error every call
  /// returns it.
  expected<std::optional<text_record>> next();

 private:
  enum class line_status { line, end, too_long, failed };

  text_record_reader(byte_source in, std::string source, data_format format, size_t max_record_bytes, uint64_t begin,
                     uint64_t end);
  /// The next byte, or -1 at the end (or on a source error: failed_ is set).
  int get();
  /// Reads the next line into line_ (at most max_record_bytes_ bytes), counting it; line_start_ is
  /// where it starts.
  line_status read_line();
  /// A range reader starting inside the file: moves to the first record starting at or after begin.
  expected<void> seek_record(uint64_t begin);
  expected<std::optional<text_record>> next_document();
  expected<std::optional<text_record>> next_jsonl();
  tl::unexpected<error> fail(int64_t line, uint64_t offset, std::string what);
  std::string where(int64_t line, uint64_t offset) const;

  byte_source in_;
  std::string source_;
  data_format format_ = data_format::text;
  size_t max_record_bytes_ = 0;
  uint64_t end_ = UINT64_MAX;   ///< records starting here or later are another range's
  bool count_lines_ = true;     ///< false for a range starting inside the file
  bool skip_document_ = false;  ///< started inside a document: its rest belongs to the previous range
  int64_t line_number_ = 0;
  uint64_t buf_pos_ = 0;        ///< file offset of buf_[0]
  uint64_t line_start_ = 0;     ///< file offset of line_'s first byte
  std::vector<char> buf_;
  size_t at_ = 0;
  std::string line_;
  std::optional<error> failed_;
};

/// A record's token ids and, per id, whether the model is trained to predict it.
struct tokenized_example {
  std::vector<int32_t> ids;
  std::vector<uint8_t> loss;  ///< 1 where the id carries loss
};

/// Tokenizes a record.
/// - text: encoded with add_special (BOS where the vocabulary asks for it) and without
///   parse_special (text cannot forge control tokens), then the vocabulary's EOS when it has one
///   (unless add_eos put it there already); every token carries loss.
/// - chat: rendered with `chat` and encoded with parse_special and without add_special (the
///   template writes BOS itself; control-token text inside a message becomes that token, as when
///   serving), segment by segment: the text before an assistant turn's content (with the header
///   of render(messages before it, add_generation_prompt)) carries no loss, the turn's content
///   and end-of-turn text (up to render(messages up to it)) carry loss. No EOS is added: the
///   template ends the turns, and the next record's BOS or header follows.
/// Errors (invalid_argument, naming the record's file and line): a chat record without a template
/// (`chat` null), a conversation the template refuses (its message), one opening with an
/// assistant turn (nothing to answer) or of more than max_record_messages messages, a text (or
/// rendered conversation) longer than tokenizer::max_text_bytes.
expected<tokenized_example> tokenize_record(const text_record& record, const tokenizer& tok, const chat_template* chat);

struct packing_options {
  int64_t sequence = 128;  ///< tokens per row (>= 1)
};

/// One row: `sequence` input tokens, the token after each, and 1.0f where that target carries loss.
struct packed_row {
  std::vector<int32_t> tokens, targets;
  std::vector<float> mask;
};

/// Concatenates examples, in the order pushed, into one token stream and cuts it into rows of
/// sequence + 1 tokens that overlap by one: row r covers stream positions [r*T, r*T + T]; its
/// tokens are the first T, its targets the last T. Attention in a row may cross from one
/// document into the next (no per-document masking: the usual packing trade-off); the EOS between
/// text documents, or the next conversation's BOS or header, marks the boundary.
class row_packer {
 public:
  /// A packer of rows of options.sequence tokens; a sequence below 1 is invalid_argument.
  static expected<row_packer> create(const packing_options& options);

  /// Appends an example to the stream.
  void push(const tokenized_example& example);
  /// The next complete row, or nothing until more examples come. Pop every row after each push to
  /// keep memory at one row plus one example.
  std::optional<packed_row> pop();
  /// Tokens from the next row's start on: at the end of the data, the tail that fills no row.
  int64_t pending() const { return static_cast<int64_t>(ids_.size() - start_); }

 private:
  explicit row_packer(int64_t sequence) : sequence_(sequence) {}
  int64_t sequence_ = 0;
  std::vector<int32_t> ids_;
  std::vector<uint8_t> loss_;
  size_t start_ = 0;  ///< where the next row starts in ids_
};

/// Rows laid end to end: row r is [r*sequence, (r+1)*sequence) of each vector.
struct packed_rows {
  int64_t sequence = 0;
  std::vector<int32_t> tokens, targets;
  std::vector<float> mask;

  int64_t rows() const { return sequence > 0 ? static_cast<int64_t>(tokens.size()) / sequence : 0; }
  /// Adds a row of `sequence` tokens.
  void append(const packed_row& row);
};

/// Reads `path` (format by data_format_of), tokenizes and packs it; with max_rows >= 0 it stops
/// reading once it has that many rows. The tail that fills no row is dropped; a file (or the
/// part read) that fills none is an invalid_argument error saying how many tokens it held.
expected<packed_rows> pack_file(const std::filesystem::path& path, const tokenizer& tok, const chat_template* chat,
                                const packing_options& options, int64_t max_rows = -1);

/// Dataset columns: "tokens" i32 [rows, T], "targets" i32 [rows, T], "mask" f32 [rows, T].
tensor_map to_columns(const packed_rows& rows);

}  // namespace mesh::models
