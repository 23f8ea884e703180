#include "models/text_dataset.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <memory>
#include <nlohmann/json.hpp>
#include <unistd.h>
#include <utility>

#include "models/json_depth.hpp"

namespace mesh::models {

namespace {

using json = nlohmann::json;

/// Records are {"text": ...} or {"messages": [{...}]}; other keys may nest, but not without bound.
constexpr size_t max_json_depth = 64;

/// "data.jsonl:7", or "data.jsonl: byte 1048611" where the line number is not known (a range read).
std::string where(std::string_view source, int64_t line, uint64_t offset = 0) {
  const std::string at = line > 0 ? fmt::format("line {}", line) : fmt::format("byte {}", offset);
  if (source.empty()) return at;
  return line > 0 ? fmt::format("{}:{}", source, line) : fmt::format("{}: {}", source, at);
}

tl::unexpected<error> bad_record(std::string_view source, int64_t line, std::string_view what, uint64_t offset = 0) {
  return make_error(error_code::invalid_argument, fmt::format("{}: {}", where(source, line, offset), what));
}

/// A record's place in messages.
tl::unexpected<error> bad_record(const text_record& r, std::string_view what) { return bad_record(r.source, r.line, what, r.offset); }

/// nlohmann's message without its "[json.exception...] " tag, capped: it quotes what it last read,
/// which may be a long string.
std::string parse_message(const json::exception& e) {
  std::string_view m = e.what();
  const size_t tag_end = m.find("] ");
  if (m.starts_with('[') && tag_end != std::string_view::npos) m.remove_prefix(tag_end + 2);
  if (m.size() > 200) return std::string(m.substr(0, 200)) + "...";
  return std::string(m);
}

bool is_blank(std::string_view line) {
  return std::all_of(line.begin(), line.end(), [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; });
}

/// Appends `text` encoded as one segment of a longer text, with `loss` on every token.
expected<void> append_segment(tokenized_example& out, std::string_view text, bool loss, const tokenizer& tok) {
  if (text.empty()) return {};
  // A segment after text (not after a special token) continues that text: no SentencePiece prefix.
  const bool after_special = out.ids.empty() || tok.is_control(out.ids.back()) ||
                             tok.vocab().type_of(out.ids.back()) == token_type::user_defined;
  auto ids = tok.encode(text, {.add_special = false, .parse_special = true, .space_prefix = after_special});
  if (!ids) return forward_error(ids);
  out.ids.insert(out.ids.end(), ids->begin(), ids->end());
  out.loss.resize(out.ids.size(), loss ? 1 : 0);
  return {};
}

expected<tokenized_example> tokenize_text(const text_record& r, const std::string& text, const tokenizer& tok) {
  if (text.size() > tokenizer::max_text_bytes) {
    return bad_record(r, fmt::format("the text is {} bytes, more than the limit of {}", text.size(),
                                                    tokenizer::max_text_bytes));
  }
  auto ids = tok.encode(text, {.add_special = true, .parse_special = false});
  if (!ids) return bad_record(r, ids.error().message);
  const vocabulary& v = tok.vocab();
  if (v.eos_id && !v.add_eos) ids->push_back(*v.eos_id);
  tokenized_example out;
  out.loss.assign(ids->size(), 1);
  out.ids = std::move(*ids);
  return out;
}

expected<tokenized_example> tokenize_chat(const text_record& r, const std::vector<chat_message>& m,
                                          const tokenizer& tok, const chat_template* chat) {
  if (!chat) {
    std::string names;
    for (auto n : chat_template_names()) names += (names.empty() ? "" : ", ") + std::string(n);
    return bad_record(r.source, r.line,
                      fmt::format("a chat record (\"messages\") needs a chat template: the model has none, name one "
                                  "(known: {})",
                                  names));
  }
  if (m.size() > max_record_messages) {
    return bad_record(r.source, r.line,
                      fmt::format("{} messages, more than the limit of {}", m.size(), max_record_messages));
  }
  const std::span<const chat_message> all(m);
  auto full = chat->render(all, false);
  if (!full) return bad_record(r, full.error().message);
  if (full->size() > tokenizer::max_text_bytes) {
    return bad_record(r, fmt::format("the conversation renders to {} bytes, more than the limit of {}",
                                                    full->size(), tokenizer::max_text_bytes));
  }
  auto not_turn_by_turn = [&](size_t i) {
    return bad_record(r.source, r.line,
                      fmt::format("chat template {} does not render this conversation turn by turn (message {}), so "
                                  "its assistant turns cannot be told apart",
                                  to_string(chat->family), i + 1));
  };
  tokenized_example out;
  size_t done = 0;  // bytes of *full tokenized so far
  for (size_t i = 0; i < m.size(); ++i) {
    if (m[i].role != "assistant") continue;
    if (i == 0) {
      return bad_record(r.source, r.line,
                        "the conversation opens with an assistant turn: there is nothing it answers; start with a "
                        "system or user turn");
    }
    // The turn's text is what render(up to it) adds to the prompt render(before it) asks for.
    auto prompt = chat->render(all.first(i), true);
    if (!prompt) return bad_record(r, prompt.error().message);
    auto turn = chat->render(all.first(i + 1), false);
    if (!turn) return bad_record(r, turn.error().message);
    if (prompt->size() < done || !turn->starts_with(*prompt) || !full->starts_with(*turn)) return not_turn_by_turn(i);
    const std::string_view text(*full);
    if (auto e = append_segment(out, text.substr(done, prompt->size() - done), false, tok); !e)
      return bad_record(r, e.error().message);
    if (auto e = append_segment(out, text.substr(prompt->size(), turn->size() - prompt->size()), true, tok); !e)
      return bad_record(r, e.error().message);
    done = turn->size();
  }
  if (auto e = append_segment(out, std::string_view(*full).substr(done), false, tok); !e)
    return bad_record(r, e.error().message);
  return out;
}

}  // namespace

data_format data_format_of(const std::filesystem::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".jsonl" || ext == ".json" ? data_format::jsonl : data_format::text;
}

expected<text_record> parse_jsonl_record(std::string_view line, int64_t line_number, std::string_view source, uint64_t offset) {
  auto bad = [&](std::string_view what) { return bad_record(source, line_number, what, offset); };
  if (json_too_deep(line, max_json_depth)) return bad(fmt::format("JSON nested deeper than {} levels", max_json_depth));
  // nlohmann reports syntax and type errors by throwing; they are caught here so none leaves.
  try {
    const json j = json::parse(line);
    if (!j.is_object()) return bad(fmt::format("a record must be a JSON object, not {}", j.type_name()));
    const auto text = j.find("text");
    const auto messages = j.find("messages");
    if ((text == j.end()) == (messages == j.end())) {
      return bad(text == j.end() ? "a record needs \"text\" (a string) or \"messages\" (a list of {\"role\", \"content\"})"
                                 : "a record has both \"text\" and \"messages\"; give one");
    }
    text_record r{.source = std::string(source), .line = line_number, .offset = offset, .content = {}};
    if (text != j.end()) {
      if (!text->is_string()) return bad(fmt::format("\"text\" must be a string, not {}", text->type_name()));
      r.content = text->get<std::string>();
      return r;
    }
    if (!messages->is_array()) return bad(fmt::format("\"messages\" must be a list, not {}", messages->type_name()));
    if (messages->empty()) return bad("\"messages\" is empty");
    std::vector<chat_message> out;
    out.reserve(messages->size());
    for (size_t i = 0; i < messages->size(); ++i) {
      const json& m = (*messages)[i];
      const auto role = m.is_object() ? m.find("role") : m.end();
      const auto content = m.is_object() ? m.find("content") : m.end();
      if (!m.is_object() || role == m.end() || content == m.end() || !role->is_string() || !content->is_string()) {
        return bad(fmt::format("message {} needs a string \"role\" and a string \"content\"", i + 1));
      }
      out.push_back({role->get<std::string>(), content->get<std::string>()});
    }
    r.content = std::move(out);
    return r;
  } catch (const json::exception& e) {
    return bad(fmt::format("not valid JSON: {}", parse_message(e)));
  }
}

expected<byte_source> file_source(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return make_error(error_code::io_error, fmt::format("{}: is a directory, not a data file", path.string()));
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error(error_code::io_error, fmt::format("cannot open {}: {}", path.string(), std::strerror(errno)));
  auto owned = std::shared_ptr<int>(new int(fd), [](int* p) {
    ::close(*p);
    delete p;
  });
  return byte_source([owned, name = path.string()](uint64_t offset, std::span<char> into) -> expected<size_t> {
    size_t done = 0;
    while (done < into.size()) {
      const ssize_t n = ::pread(*owned, into.data() + done, into.size() - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return make_error(error_code::io_error, fmt::format("cannot read {}: {}", name, std::strerror(errno)));
      if (n == 0) break;
      done += static_cast<size_t>(n);
    }
    return done;
  });
}

text_record_reader::text_record_reader(byte_source in, std::string source, data_format format, size_t max_record_bytes,
                                       uint64_t begin, uint64_t end)
    : in_(std::move(in)), source_(std::move(source)), format_(format), max_record_bytes_(max_record_bytes), end_(end),
      count_lines_(begin == 0), buf_pos_(begin) {}

expected<text_record_reader> text_record_reader::open(const std::filesystem::path& path, data_format format,
                                                      size_t max_record_bytes) {
  auto in = file_source(path);
  if (!in) return forward_error(in);
  return text_record_reader(std::move(*in), path.string(), format, max_record_bytes, 0, UINT64_MAX);
}

expected<text_record_reader> text_record_reader::open_range(byte_source source, std::string name, data_format format,
                                                            uint64_t begin, uint64_t end, size_t max_record_bytes) {
  text_record_reader r(std::move(source), std::move(name), format, max_record_bytes, begin, end);
  if (begin > 0) {
    if (auto ok = r.seek_record(begin); !ok) return forward_error(ok);
  }
  return r;
}

std::string text_record_reader::where(int64_t line, uint64_t offset) const {
  return models::where(source_, count_lines_ ? line : 0, offset);
}

tl::unexpected<error> text_record_reader::fail(int64_t line, uint64_t offset, std::string what) {
  failed_ = error{error_code::invalid_argument, fmt::format("{}: {}", where(line, offset), what)};
  return tl::unexpected<error>(*failed_);
}

int text_record_reader::get() {
  if (at_ == buf_.size()) {
    if (failed_) return -1;
    buf_pos_ += buf_.size();
    buf_.resize(size_t{64} << 10);
    auto n = in_(buf_pos_, std::span<char>(buf_));
    if (!n) {
      failed_ = n.error();
      buf_.clear();
      return -1;
    }
    buf_.resize(*n);
    at_ = 0;
    if (buf_.empty()) return -1;
  }
  return static_cast<unsigned char>(buf_[at_++]);
}

expected<void> text_record_reader::seek_record(uint64_t begin) {
  // The previous byte: the first line starting at or after `begin` follows its first '\n'.
  buf_pos_ = begin - 1;
  for (int c = get(); c != '\n'; c = get())
    if (c < 0) return failed_ ? tl::unexpected<error>(*failed_) : expected<void>{};
  if (format_ == data_format::jsonl) return {};
  // A document starts at a non-blank line after a blank one: the line before this one decides
  // whether a non-blank line here starts a document or continues one. Read it backwards from its
  // end, as far as its last non-blank byte or its start.
  const uint64_t here = buf_pos_ + at_;  // after the '\n' that ends the previous line
  uint64_t p = here - 1;                 // that '\n'
  bool previous_blank = true;
  const auto starts_with_bom = [&] {
    char bom[3];
    auto n = in_(0, std::span<char>(bom, 3));
    return n && *n == 3 && std::memcmp(bom, "\xEF\xBB\xBF", 3) == 0;
  };
  char block[4096];
  while (p > 0 && previous_blank) {
    const uint64_t from = p >= sizeof block ? p - sizeof block : 0;
    auto n = in_(from, std::span<char>(block, static_cast<size_t>(p - from)));
    if (!n) return tl::unexpected<error>(n.error());
    if (*n != p - from) return make_error(error_code::io_error, fmt::format("{}: the file shrank while read", source_));
    for (uint64_t i = p; i > from; --i) {
      const char c = block[i - 1 - from];
      if (c == '\n') {
        p = 0;
        break;
      }
      // (A byte order mark at the file's start is no text: the reader drops it from line 1.)
      if (!std::isspace(static_cast<unsigned char>(c)) && !(i - 1 < 3 && starts_with_bom())) {
        previous_blank = false;
        break;
      }
    }
    if (p != 0) p = from;
  }
  skip_document_ = !previous_blank;
  return {};
}

text_record_reader::line_status text_record_reader::read_line() {
  line_.clear();
  line_start_ = buf_pos_ + at_;
  bool any = false;
  for (int c = get(); c >= 0; c = get()) {
    any = true;
    if (c == '\n') break;
    if (line_.size() == max_record_bytes_) {
      ++line_number_;
      return line_status::too_long;
    }
    line_.push_back(static_cast<char>(c));
  }
  if (failed_) return line_status::failed;
  if (!any) return line_status::end;
  ++line_number_;
  if (!line_.empty() && line_.back() == '\r') line_.pop_back();
  if (line_start_ == 0 && line_.starts_with("\xEF\xBB\xBF")) line_.erase(0, 3);
  return line_status::line;
}

expected<std::optional<text_record>> text_record_reader::next() {
  if (failed_) return tl::unexpected<error>(*failed_);
  return format_ == data_format::jsonl ? next_jsonl() : next_document();
}

expected<std::optional<text_record>> text_record_reader::next_jsonl() {
  for (;;) {
    switch (read_line()) {
      case line_status::end: return std::nullopt;
      case line_status::failed: return tl::unexpected<error>(*failed_);
      case line_status::too_long:
        return fail(line_number_, line_start_, fmt::format("the line is longer than {} bytes", max_record_bytes_));
      case line_status::line: break;
    }
    if (is_blank(line_)) continue;
    if (line_start_ >= end_) return std::nullopt;  // the next range's
    auto r = parse_jsonl_record(line_, count_lines_ ? line_number_ : 0, source_, line_start_);
    if (!r) {
      failed_ = r.error();
      return forward_error(r);
    }
    return std::optional<text_record>(std::move(*r));
  }
}

expected<std::optional<text_record>> text_record_reader::next_document() {
  std::string doc;
  int64_t first = 0;
  uint64_t first_offset = 0;
  for (;;) {
    const line_status s = read_line();
    if (s == line_status::failed) return tl::unexpected<error>(*failed_);
    if (s == line_status::too_long) {
      return fail(line_number_, line_start_, fmt::format("the line is longer than {} bytes", max_record_bytes_));
    }
    const bool blank = s == line_status::end || is_blank(line_);
    if (skip_document_) {  // the rest of a document that started before this range
      skip_document_ = !blank;
      if (s == line_status::end) return std::nullopt;
      continue;
    }
    if (blank) {
      if (first > 0) {
        return std::optional<text_record>(text_record{
            .source = source_, .line = count_lines_ ? first : 0, .offset = first_offset, .content = std::move(doc)});
      }
      if (s == line_status::end) return std::nullopt;
      continue;
    }
    if (first == 0) {
      if (line_start_ >= end_) return std::nullopt;  // the next range's
      first = line_number_;
      first_offset = line_start_;
    } else {
      if (doc.size() + 1 + line_.size() > max_record_bytes_) {
        return fail(first, first_offset, fmt::format("the document starting here is longer than {} bytes", max_record_bytes_));
      }
      doc.push_back('\n');
    }
    doc += line_;
  }
}

expected<tokenized_example> tokenize_record(const text_record& record, const tokenizer& tok, const chat_template* chat) {
  if (const auto* text = std::get_if<std::string>(&record.content)) return tokenize_text(record, *text, tok);
  return tokenize_chat(record, std::get<std::vector<chat_message>>(record.content), tok, chat);
}

expected<row_packer> row_packer::create(const packing_options& options) {
  if (options.sequence < 1) {
    return make_error(error_code::invalid_argument,
                      fmt::format("packing: a row needs at least 1 token, not {}", options.sequence));
  }
  return row_packer(options.sequence);
}

void row_packer::push(const tokenized_example& example) {
  // Drop what earlier rows consumed before growing, so the buffer holds one row plus one example.
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<ptrdiff_t>(start_));
  loss_.erase(loss_.begin(), loss_.begin() + static_cast<ptrdiff_t>(start_));
  start_ = 0;
  ids_.insert(ids_.end(), example.ids.begin(), example.ids.end());
  loss_.insert(loss_.end(), example.loss.begin(), example.loss.end());
}

std::optional<packed_row> row_packer::pop() {
  const auto t = static_cast<size_t>(sequence_);
  if (ids_.size() - start_ < t + 1) return std::nullopt;
  packed_row row;
  const auto at = ids_.begin() + static_cast<ptrdiff_t>(start_);
  row.tokens.assign(at, at + static_cast<ptrdiff_t>(t));
  row.targets.assign(at + 1, at + 1 + static_cast<ptrdiff_t>(t));
  row.mask.resize(t);
  for (size_t i = 0; i < t; ++i) row.mask[i] = loss_[start_ + 1 + i] ? 1.0f : 0.0f;
  start_ += t;
  return row;
}

void packed_rows::append(const packed_row& row) {
  tokens.insert(tokens.end(), row.tokens.begin(), row.tokens.end());
  targets.insert(targets.end(), row.targets.begin(), row.targets.end());
  mask.insert(mask.end(), row.mask.begin(), row.mask.end());
}

expected<packed_rows> pack_file(const std::filesystem::path& path, const tokenizer& tok, const chat_template* chat,
                                const packing_options& options, int64_t max_rows) {
  auto packer = row_packer::create(options);
  if (!packer) return forward_error(packer);
  auto reader = text_record_reader::open(path, data_format_of(path));
  if (!reader) return forward_error(reader);
  packed_rows out{.sequence = options.sequence, .tokens = {}, .targets = {}, .mask = {}};
  auto full = [&] { return max_rows >= 0 && out.rows() >= max_rows; };
  while (!full()) {
    auto record = reader->next();
    if (!record) return forward_error(record);
    if (!*record) break;
    auto example = tokenize_record(**record, tok, chat);
    if (!example) return forward_error(example);
    packer->push(*example);
    while (!full()) {
      auto row = packer->pop();
      if (!row) break;
      out.append(*row);
    }
  }
  if (out.rows() == 0 && max_rows != 0) {
    return make_error(error_code::invalid_argument,
                      fmt::format("{}: {} tokens fill no row of {} + 1 tokens", path.string(), packer->pending(),
                                  options.sequence));
  }
  return out;
}

tensor_map to_columns(const packed_rows& rows) {
  const shape dims = {rows.rows(), rows.sequence};
  return {{"tokens", tensor::from_ints(dims, rows.tokens)},
          {"targets", tensor::from_ints(dims, rows.targets)},
          {"mask", tensor::from_floats(dims, rows.mask)}};
}

}  // namespace mesh::models
