#include "models/text_dataset.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <utility>

#include "models/json_depth.hpp"

namespace mesh::models {

namespace {

using json = nlohmann::json;

/// Records are {"text": ...} or {"messages": [{...}]}; other keys may nest, but not without bound.
constexpr size_t max_json_depth = 64;

std::string where(std::string_view source, int64_t line) {
  return source.empty() ? fmt::format("line {}", line) : fmt::format("{}:{}", source, line);
}

tl::unexpected<error> bad_record(std::string_view source, int64_t line, std::string_view what) {
  return make_error(error_code::invalid_argument, fmt::format("{}: {}", where(source, line), what));
}

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
    return bad_record(r.source, r.line, fmt::format("the text is {} bytes, more than the limit of {}", text.size(),
                                                    tokenizer::max_text_bytes));
  }
  auto ids = tok.encode(text, {.add_special = true, .parse_special = false});
  if (!ids) return bad_record(r.source, r.line, ids.error().message);
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
  if (!full) return bad_record(r.source, r.line, full.error().message);
  if (full->size() > tokenizer::max_text_bytes) {
    return bad_record(r.source, r.line, fmt::format("the conversation renders to {} bytes, more than the limit of {}",
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
    if (!prompt) return bad_record(r.source, r.line, prompt.error().message);
    auto turn = chat->render(all.first(i + 1), false);
    if (!turn) return bad_record(r.source, r.line, turn.error().message);
    if (prompt->size() < done || !turn->starts_with(*prompt) || !full->starts_with(*turn)) return not_turn_by_turn(i);
    const std::string_view text(*full);
    if (auto e = append_segment(out, text.substr(done, prompt->size() - done), false, tok); !e)
      return bad_record(r.source, r.line, e.error().message);
    if (auto e = append_segment(out, text.substr(prompt->size(), turn->size() - prompt->size()), true, tok); !e)
      return bad_record(r.source, r.line, e.error().message);
    done = turn->size();
  }
  if (auto e = append_segment(out, std::string_view(*full).substr(done), false, tok); !e)
    return bad_record(r.source, r.line, e.error().message);
  return out;
}

}  // namespace

data_format data_format_of(const std::filesystem::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".jsonl" || ext == ".json" ? data_format::jsonl : data_format::text;
}

expected<text_record> parse_jsonl_record(std::string_view line, int64_t line_number, std::string_view source) {
  auto bad = [&](std::string_view what) { return bad_record(source, line_number, what); };
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
    text_record r{.source = std::string(source), .line = line_number, .content = {}};
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

text_record_reader::text_record_reader(std::ifstream in, std::string source, data_format format, size_t max_record_bytes)
    : in_(std::move(in)), source_(std::move(source)), format_(format), max_record_bytes_(max_record_bytes) {}

expected<text_record_reader> text_record_reader::open(const std::filesystem::path& path, data_format format,
                                                      size_t max_record_bytes) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return make_error(error_code::io_error, fmt::format("{}: is a directory, not a data file", path.string()));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return make_error(error_code::io_error, fmt::format("cannot open {}: {}", path.string(), std::strerror(errno)));
  }
  return text_record_reader(std::move(in), path.string(), format, max_record_bytes);
}

tl::unexpected<error> text_record_reader::fail(int64_t line, std::string what) {
  failed_ = error{error_code::invalid_argument, fmt::format("{}: {}", where(source_, line), what)};
  return tl::unexpected<error>(*failed_);
}

text_record_reader::line_status text_record_reader::read_line() {
  line_.clear();
  std::streambuf* in = in_.rdbuf();
  bool any = false;
  for (int c = in->sbumpc(); c != std::char_traits<char>::eof(); c = in->sbumpc()) {
    any = true;
    if (c == '\n') break;
    if (line_.size() == max_record_bytes_) {
      ++line_number_;
      return line_status::too_long;
    }
    line_.push_back(static_cast<char>(c));
  }
  if (!any) return line_status::end;
  ++line_number_;
  if (!line_.empty() && line_.back() == '\r') line_.pop_back();
  if (line_number_ == 1 && line_.starts_with("\xEF\xBB\xBF")) line_.erase(0, 3);
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
      case line_status::too_long:
        return fail(line_number_, fmt::format("the line is longer than {} bytes", max_record_bytes_));
      case line_status::line: break;
    }
    if (is_blank(line_)) continue;
    auto r = parse_jsonl_record(line_, line_number_, source_);
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
  for (;;) {
    const line_status s = read_line();
    if (s == line_status::too_long) {
      return fail(line_number_, fmt::format("the line is longer than {} bytes", max_record_bytes_));
    }
    if (s == line_status::end || is_blank(line_)) {
      if (first > 0) {
        return std::optional<text_record>(text_record{.source = source_, .line = first, .content = std::move(doc)});
      }
      if (s == line_status::end) return std::nullopt;
      continue;
    }
    if (first == 0) {
      first = line_number_;
    } else {
      if (doc.size() + 1 + line_.size() > max_record_bytes_) {
        return fail(first, fmt::format("the document starting here is longer than {} bytes", max_record_bytes_));
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
