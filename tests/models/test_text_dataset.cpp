// Training data from files: records read from plain text and JSONL, tokenized with loss flags
// (chat: exactly the assistant turns), packed into overlapping rows, errors naming file and line.
// The vocabularies are made here: byte-level tokens whose id is the byte, so expected ids are the
// text's bytes; and a small SentencePiece one with byte fallback.
#include <catch2/catch.hpp>

#include <cstdio>

#include "models/text_dataset.hpp"
#include "models/utf8.hpp"
#include "test_tokenizer_support.hpp"

using namespace mesh::models;

namespace {

using test::bos;
using test::byte_tokenizer;
using test::endoftext;
using test::im_end;
using test::im_start;

/// <unk> <s> </s>, byte fallback pieces, and a few merges of "a", "b" and "▁".
tokenizer spm_tokenizer() {
  vocabulary v;
  v.model = vocabulary::kind::sentencepiece;
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.token_types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    v.tokens.push_back(buf);
    v.token_types.push_back(static_cast<int32_t>(token_type::byte));
  }
  for (const char* p : {"▁", "a", "b", "▁a", "ab", "▁ab"}) {
    v.tokens.push_back(p);
    v.token_types.push_back(1);
  }
  v.scores.assign(v.tokens.size(), 0.0f);
  for (size_t i = 259; i < v.tokens.size(); ++i) v.scores[i] = -static_cast<float>(i);
  v.unk_id = 0;
  v.bos_id = 1;
  v.eos_id = 2;
  v.add_bos = true;
  return *tokenizer::create(v);
}

std::vector<int32_t> bytes_of(std::string_view s) {
  std::vector<int32_t> out;
  for (char c : s) out.push_back(static_cast<unsigned char>(c));
  return out;
}

std::vector<int32_t> join(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

std::vector<text_record> read_all(const std::filesystem::path& p, data_format f) {
  auto reader = text_record_reader::open(p, f);
  REQUIRE(reader);
  std::vector<text_record> out;
  for (;;) {
    auto r = reader->next();
    REQUIRE(r);
    if (!*r) return out;
    out.push_back(std::move(**r));
  }
}

const std::string& text_of(const text_record& r) { return std::get<std::string>(r.content); }

/// The texts of the runs of tokens that carry loss, from the tokens' pieces.
std::vector<std::string> loss_runs(const tokenized_example& e, const tokenizer& tok) {
  std::vector<std::string> runs;
  bool in = false;
  for (size_t i = 0; i < e.ids.size(); ++i) {
    if (e.loss[i] && !in) runs.emplace_back();
    if (e.loss[i]) runs.back() += tok.piece(e.ids[i]);
    in = e.loss[i] != 0;
  }
  return runs;
}

std::string chatml_line() {
  return R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},)"
         R"( {"role": "assistant", "content": "Hello there"}, {"role": "user", "content": "Thanks"},)"
         R"( {"role": "assistant", "content": "Bye"}]})";
}

}  // namespace

TEST_CASE("text documents split on blank lines and keep their inner newlines", "[text_dataset]") {
  CHECK(data_format_of("a/b.jsonl") == data_format::jsonl);
  CHECK(data_format_of("b.JSON") == data_format::jsonl);
  CHECK(data_format_of("b.txt") == data_format::text);
  CHECK(data_format_of("jsonl") == data_format::text);

  test::scratch_dir dir;
  const auto path = dir.path / "corpus.txt";
  test::write_file(path, "\xEF\xBB\xBFone\ntwo  \r\n\n\n \t\nthree\r\n\nfour\n  five\n");
  const auto records = read_all(path, data_format::text);
  REQUIRE(records.size() == 3);
  CHECK(text_of(records[0]) == "one\ntwo  ");
  CHECK(records[0].line == 1);
  CHECK(text_of(records[1]) == "three");
  CHECK(records[1].line == 6);
  CHECK(text_of(records[2]) == "four\n  five");
  CHECK(records[2].line == 8);
  CHECK(records[2].source == path.string());

  test::write_file(path, "\n\n   \n");
  CHECK(read_all(path, data_format::text).empty());
  test::write_file(path, "");
  CHECK(read_all(path, data_format::text).empty());
  test::write_file(path, "last line without newline");
  const auto last = read_all(path, data_format::text);
  REQUIRE(last.size() == 1);
  CHECK(text_of(last[0]) == "last line without newline");
}

TEST_CASE("text records get BOS where the vocabulary asks, EOS after each, loss on every token", "[text_dataset]") {
  const text_record r{.source = "f.txt", .line = 3, .content = std::string("ab\ncd")};
  const tokenizer with_bos = byte_tokenizer(true);
  auto e = tokenize_record(r, with_bos, nullptr);
  REQUIRE(e);
  CHECK(e->ids == join({{bos}, bytes_of("ab\ncd"), {endoftext}}));
  CHECK(e->loss == std::vector<uint8_t>(7, 1));

  const tokenizer without_bos = byte_tokenizer(false);
  e = tokenize_record(r, without_bos, nullptr);
  REQUIRE(e);
  CHECK(e->ids == join({bytes_of("ab\ncd"), {endoftext}}));
  CHECK(e->loss == std::vector<uint8_t>(6, 1));

  // Control-token text inside a text record stays text: it cannot forge a turn or an EOS.
  e = tokenize_record({.source = "", .line = 1, .content = std::string("x<|im_end|>")}, without_bos, nullptr);
  REQUIRE(e);
  CHECK(e->ids == join({bytes_of("x<|im_end|>"), {endoftext}}));

  // SentencePiece: BOS from add_bos, the EOS appended, the dummy prefix on the text.
  const tokenizer spm = spm_tokenizer();
  e = tokenize_record({.source = "", .line = 1, .content = std::string("ab")}, spm, nullptr);
  REQUIRE(e);
  CHECK(e->ids == std::vector<int32_t>{1, *spm.find("▁ab"), 2});
}

TEST_CASE("rows overlap by one token, targets are the next tokens, the tail is dropped", "[text_dataset]") {
  // A stream of 23 tokens 100..122 in three examples; loss on the even ones.
  std::vector<tokenized_example> examples(3);
  for (int32_t i = 0; i < 23; ++i) {
    auto& e = examples[i < 4 ? 0 : i < 15 ? 1 : 2];
    e.ids.push_back(100 + i);
    e.loss.push_back(i % 2 == 0);
  }
  auto packer = row_packer::create({.sequence = 5});
  REQUIRE(packer);
  std::vector<packed_row> rows;
  for (const auto& e : examples) {
    packer->push(e);
    while (auto row = packer->pop()) rows.push_back(*row);
  }
  // Row r covers stream positions [5r, 5r + 5]: 4 rows reach position 20; 21 and 22 fill no row.
  REQUIRE(rows.size() == 4);
  CHECK(packer->pending() == 3);  // positions 20 (the last row's last target), 21, 22
  for (size_t r = 0; r < rows.size(); ++r) {
    INFO("row " << r);
    std::vector<int32_t> tokens, targets;
    std::vector<float> mask;
    for (int32_t i = 0; i < 5; ++i) {
      const int32_t at = static_cast<int32_t>(r) * 5 + i;
      tokens.push_back(100 + at);
      targets.push_back(101 + at);
      mask.push_back((at + 1) % 2 == 0 ? 1.0f : 0.0f);
    }
    CHECK(rows[r].tokens == tokens);
    CHECK(rows[r].targets == targets);
    CHECK(rows[r].mask == mask);
    for (size_t i = 0; i + 1 < 5; ++i) CHECK(rows[r].targets[i] == rows[r].tokens[i + 1]);
    if (r > 0) CHECK(rows[r].tokens.front() == rows[r - 1].targets.back());
  }
  CHECK_FALSE(row_packer::create({.sequence = 0}));
  CHECK(row_packer::create({.sequence = -3}).error().code == mesh::error_code::invalid_argument);

  // One long example gives every row it holds at once.
  auto one = row_packer::create({.sequence = 2});
  REQUIRE(one);
  tokenized_example e;
  for (int32_t i = 0; i < 7; ++i) {
    e.ids.push_back(i);
    e.loss.push_back(1);
  }
  one->push(e);
  int popped = 0;
  while (one->pop()) ++popped;
  CHECK(popped == 3);
  CHECK(one->pending() == 1);
}

TEST_CASE("JSONL text records, blank lines skipped, other keys ignored", "[text_dataset]") {
  test::scratch_dir dir;
  const auto path = dir.path / "data.jsonl";
  test::write_file(path, "{\"text\": \"hi\\nthere\"}\n\n  \n{\"id\": 7, \"text\": \"yo\", \"meta\": {\"a\": [1]}}\r\n");
  const auto records = read_all(path, data_format::jsonl);
  REQUIRE(records.size() == 2);
  CHECK(text_of(records[0]) == "hi\nthere");
  CHECK(records[0].line == 1);
  CHECK(text_of(records[1]) == "yo");
  CHECK(records[1].line == 4);

  const tokenizer tok = byte_tokenizer(false);
  auto rows = pack_file(path, tok, nullptr, {.sequence = 4});
  REQUIRE(rows);
  // Stream: h i \n t h e r e EOS y o EOS (12 tokens): rows [0,4] and [4,8]; the rest is the tail.
  const auto stream = join({bytes_of("hi\nthere"), {endoftext}, bytes_of("yo"), {endoftext}});
  REQUIRE(rows->rows() == 2);
  CHECK(rows->tokens == std::vector<int32_t>(stream.begin(), stream.begin() + 8));
  CHECK(rows->targets == std::vector<int32_t>(stream.begin() + 1, stream.begin() + 9));
  CHECK(rows->mask == std::vector<float>(8, 1.0f));
}

TEST_CASE("JSONL chat: the loss covers exactly the assistant turns and their end of turn", "[text_dataset]") {
  const tokenizer tok = byte_tokenizer(false);
  auto chatml = chat_template_by_name("chatml");
  REQUIRE(chatml);
  auto record = parse_jsonl_record(chatml_line(), 5, "chat.jsonl");
  REQUIRE(record);
  CHECK(record->line == 5);
  const auto& messages = std::get<std::vector<chat_message>>(record->content);
  REQUIRE(messages.size() == 5);
  CHECK(messages[2].role == "assistant");
  CHECK(messages[2].content == "Hello there");

  auto e = tokenize_record(*record, tok, &*chatml);
  REQUIRE(e);
  REQUIRE(e->loss.size() == e->ids.size());
  // Segment by segment gives the ids of the whole rendered text, and no EOS is added.
  const auto full = chatml->render(messages, false);
  REQUIRE(full);
  CHECK(e->ids == *tok.encode(*full, {.add_special = false, .parse_special = true}));
  CHECK(e->ids.front() == im_start);
  CHECK(loss_runs(*e, tok) == std::vector<std::string>{"Hello there<|im_end|>\n", "Bye<|im_end|>\n"});

  // Qwen2's default system turn carries no loss either; a conversation ending on the user has none.
  auto qwen = chat_template_by_name("qwen2");
  REQUIRE(qwen);
  auto q = tokenize_record({.source = "", .line = 1,
                            .content = std::vector<chat_message>{{"user", "Q"}, {"assistant", "A"}, {"user", "more?"}}},
                           tok, &*qwen);
  REQUIRE(q);
  CHECK(loss_runs(*q, tok) == std::vector<std::string>{"A<|im_end|>\n"});
  CHECK(tok.decode(q->ids, {.skip_special = false})->starts_with("<|im_start|>system\nYou are a helpful assistant."));

  // Through packing: the mask marks targets inside the assistant turns.
  test::scratch_dir dir;
  const auto path = dir.path / "chat.jsonl";
  test::write_file(path, chatml_line() + "\n");
  const auto t = static_cast<int64_t>(e->ids.size() - 1);
  auto rows = pack_file(path, tok, &*chatml, {.sequence = t});
  REQUIRE(rows);
  REQUIRE(rows->rows() == 1);
  for (int64_t i = 0; i < t; ++i) CHECK(rows->mask[i] == (e->loss[i + 1] ? 1.0f : 0.0f));
}

TEST_CASE("SentencePiece chat: segments continue the text without a second dummy prefix", "[text_dataset]") {
  const tokenizer spm = spm_tokenizer();
  auto llama2 = chat_template_by_name("llama2", {"<s>", "</s>"});
  REQUIRE(llama2);
  const std::vector<chat_message> m = {{"user", "hi"}, {"assistant", "ab"}, {"user", "b"}, {"assistant", "a"}};
  auto e = tokenize_record({.source = "", .line = 1, .content = m}, spm, &*llama2);
  REQUIRE(e);
  const auto full = llama2->render(m, false);
  REQUIRE(full);
  CHECK(*full == "<s>[INST] hi [/INST] ab </s><s>[INST] b [/INST] a </s>");
  CHECK(e->ids == *spm.encode(*full, {.add_special = false, .parse_special = true}));
  CHECK(loss_runs(*e, spm) == std::vector<std::string>{" ab </s>", " a </s>"});
}

TEST_CASE("bad records stop the read with the file, the line and what is wrong", "[text_dataset]") {
  test::scratch_dir dir;
  const tokenizer tok = byte_tokenizer(false);
  auto chatml = chat_template_by_name("chatml");
  auto mistral = chat_template_by_name("mistral");
  REQUIRE(chatml);
  REQUIRE(mistral);
  const std::string good = "{\"text\": \"fine\"}\n\n";  // the bad record is on line 3
  struct bad_case {
    std::string line;
    const chat_template* chat;
    std::string message;  // after "FILE:3: "
  };
  std::vector<bad_case> cases = {
      {"{\"text\": \"a\"", &*chatml, "not valid JSON: "},
      {"[\"text\"]", &*chatml, "a record must be a JSON object, not array"},
      {"{\"content\": \"x\"}", &*chatml, "a record needs \"text\" (a string) or \"messages\""},
      {"{\"text\": \"x\", \"messages\": []}", &*chatml, "a record has both \"text\" and \"messages\""},
      {"{\"text\": 5}", &*chatml, "\"text\" must be a string, not number"},
      {"{\"messages\": {\"role\": \"user\"}}", &*chatml, "\"messages\" must be a list, not object"},
      {"{\"messages\": []}", &*chatml, "\"messages\" is empty"},
      {"{\"messages\": [{\"role\": \"user\"}]}", &*chatml, "message 1 needs a string \"role\" and a string \"content\""},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": 1, \"content\": \"b\"}]}", &*chatml,
       "message 2 needs a string \"role\" and a string \"content\""},
      {"{\"messages\": [\"hi\"]}", &*chatml, "message 1 needs a string \"role\" and a string \"content\""},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}, "
       "{\"role\": \"user\", \"content\": \"c\"}, {\"role\": \"narrator\", \"content\": \"d\"}]}",
       &*mistral, "chat template mistral: Only user and assistant roles are supported!"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": \"b\"}]}", &*mistral,
       "chat template mistral: Conversation roles must alternate user/assistant/user/assistant/..."},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}", nullptr,
       "a chat record (\"messages\") needs a chat template: the model has none, name one (known: chatml, qwen2,"},
      {"{\"messages\": [{\"role\": \"assistant\", \"content\": \"a\"}]}", &*chatml,
       "the conversation opens with an assistant turn"},
      {std::string(100, '[') + std::string(100, ']'), &*chatml, "JSON nested deeper than 64 levels"},
  };
  std::string many = "{\"messages\": [";
  for (size_t i = 0; i <= max_record_messages; ++i) {
    many += std::string(i ? ", " : "") + "{\"role\": \"user\", \"content\": \"\"}";
  }
  cases.push_back({many + "]}", &*chatml, "1025 messages, more than the limit of 1024"});
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    INFO("case " << i << ": " << c.line);
    const auto path = dir.path / ("bad" + std::to_string(i) + ".jsonl");
    test::write_file(path, good + c.line + "\n{\"text\": \"never read\"}\n");
    auto rows = pack_file(path, tok, c.chat, {.sequence = 2});
    REQUIRE_FALSE(rows);
    CHECK(rows.error().code == mesh::error_code::invalid_argument);
    const std::string prefix = path.string() + ":3: " + c.message;
    CHECK(rows.error().message.substr(0, prefix.size()) == prefix);
  }

  // The reader stops at the bad line and keeps returning its error.
  const auto path = dir.path / "bad0.jsonl";
  auto reader = text_record_reader::open(path, data_format::jsonl);
  REQUIRE(reader);
  REQUIRE(reader->next());
  auto second = reader->next();
  REQUIRE_FALSE(second);
  auto third = reader->next();
  REQUIRE_FALSE(third);
  CHECK(third.error().message == second.error().message);

  // Records longer than the limit: a JSONL line, a text document (named by its first line), a
  // text for the tokenizer.
  test::write_file(dir.path / "long.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"0123456789\"}\n");
  reader = text_record_reader::open(dir.path / "long.jsonl", data_format::jsonl, 16);
  REQUIRE(reader);
  REQUIRE(reader->next());
  auto long_line = reader->next();
  REQUIRE_FALSE(long_line);
  CHECK(long_line.error().message == (dir.path / "long.jsonl").string() + ":2: the line is longer than 16 bytes");
  test::write_file(dir.path / "long.txt", "short\n\n0123456\n789\n0123\n");
  reader = text_record_reader::open(dir.path / "long.txt", data_format::text, 12);
  REQUIRE(reader);
  REQUIRE(reader->next());
  auto long_doc = reader->next();
  REQUIRE_FALSE(long_doc);
  CHECK(long_doc.error().message ==
        (dir.path / "long.txt").string() + ":3: the document starting here is longer than 12 bytes");
  const text_record huge{.source = "big.jsonl", .line = 9, .content = std::string(tokenizer::max_text_bytes + 1, 'x')};
  auto too_long = tokenize_record(huge, tok, nullptr);
  REQUIRE_FALSE(too_long);
  CHECK(too_long.error().message ==
        "big.jsonl:9: the text is 268435457 bytes, more than the limit of 268435456");

  // Files that cannot be read, and files too short for one row.
  auto missing = pack_file(dir.path / "missing.txt", tok, nullptr, {});
  REQUIRE_FALSE(missing);
  CHECK(missing.error().code == mesh::error_code::io_error);
  CHECK(missing.error().message.find("missing.txt") != std::string::npos);
  test::write_file(dir.path / "short.txt", "abc");
  auto short_file = pack_file(dir.path / "short.txt", tok, nullptr, {.sequence = 4});
  REQUIRE_FALSE(short_file);
  CHECK(short_file.error().message == (dir.path / "short.txt").string() + ": 4 tokens fill no row of 4 + 1 tokens");
  CHECK_FALSE(pack_file(dir.path / "short.txt", tok, nullptr, {.sequence = 0}));
}

TEST_CASE("a large file is streamed: max_rows stops the read early", "[text_dataset]") {
  test::scratch_dir dir;
  const auto path = dir.path / "big.txt";
  {
    std::ofstream out(path, std::ios::binary);
    for (int i = 0; out.tellp() < 2'000'000; ++i) out << "document " << i << " line one\nand its second line\n\n";
    out << "{\"the last line\"}\n";
  }
  const tokenizer tok = byte_tokenizer(false);
  auto rows = pack_file(path, tok, nullptr, {.sequence = 64}, 3);
  REQUIRE(rows);
  CHECK(rows->rows() == 3);
  CHECK(rows->tokens.size() == 3 * 64);
  const std::string first = "document 0 line one\nand its second line";
  CHECK(std::vector<int32_t>(rows->tokens.begin(), rows->tokens.begin() + static_cast<int64_t>(first.size())) ==
        bytes_of(first));
  CHECK(rows->tokens[first.size()] == endoftext);

  // A bad record past the rows asked for is never read; reading everything reaches it.
  const auto jsonl = dir.path / "big.jsonl";
  {
    std::ofstream out(jsonl, std::ios::binary);
    for (int i = 0; out.tellp() < 2'000'000; ++i) out << "{\"text\": \"document " << i << "\"}\n";
    out << "not json\n";
  }
  auto early = pack_file(jsonl, tok, nullptr, {.sequence = 16}, 2);
  REQUIRE(early);
  CHECK(early->rows() == 2);
  auto zero = pack_file(jsonl, tok, nullptr, {.sequence = 16}, 0);
  REQUIRE(zero);
  CHECK(zero->rows() == 0);
  auto reader = text_record_reader::open(jsonl, data_format::jsonl);
  REQUIRE(reader);
  int64_t records = 0;
  auto record = reader->next();
  for (; record && *record; record = reader->next()) ++records;
  REQUIRE_FALSE(record);
  CHECK(records > 50'000);  // about 74,000 lines of ~27 bytes
  const std::string where = jsonl.string() + ":" + std::to_string(records + 1) + ": not valid JSON: ";
  CHECK(record.error().message.substr(0, where.size()) == where);
}

TEST_CASE("reader, tokenizer and packer streamed give pack_file's rows and columns", "[text_dataset]") {
  test::scratch_dir dir;
  const auto path = dir.path / "mixed.jsonl";
  std::string text;
  for (int i = 0; i < 20; ++i) {
    text += i % 3 == 0 ? chatml_line() : "{\"text\": \"record " + std::to_string(i) + "\"}";
    text += "\n";
  }
  test::write_file(path, text);
  const tokenizer tok = byte_tokenizer(true);
  auto chatml = chat_template_by_name("chatml");
  REQUIRE(chatml);
  const packing_options options{.sequence = 7};
  auto whole = pack_file(path, tok, &*chatml, options);
  REQUIRE(whole);

  auto reader = text_record_reader::open(path, data_format_of(path));
  REQUIRE(reader);
  auto packer = row_packer::create(options);
  REQUIRE(packer);
  packed_rows streamed{.sequence = 7, .tokens = {}, .targets = {}, .mask = {}};
  std::vector<int32_t> stream;
  std::vector<uint8_t> loss;
  for (;;) {
    auto record = reader->next();
    REQUIRE(record);
    if (!*record) break;
    auto e = tokenize_record(**record, tok, &*chatml);
    REQUIRE(e);
    stream.insert(stream.end(), e->ids.begin(), e->ids.end());
    loss.insert(loss.end(), e->loss.begin(), e->loss.end());
    packer->push(*e);
    while (auto row = packer->pop()) streamed.append(*row);
  }
  REQUIRE(whole->rows() == static_cast<int64_t>((stream.size() - 1) / 7));
  CHECK(streamed.rows() == whole->rows());
  CHECK(streamed.tokens == whole->tokens);
  CHECK(streamed.targets == whole->targets);
  CHECK(streamed.mask == whole->mask);
  // Against the stream itself: row r, column j is stream position 7r + j, the flat index.
  for (size_t i = 0; i < whole->tokens.size(); ++i) {
    REQUIRE(whole->tokens[i] == stream[i]);
    REQUIRE(whole->targets[i] == stream[i + 1]);
    REQUIRE(whole->mask[i] == (loss[i + 1] ? 1.0f : 0.0f));
  }

  const auto columns = to_columns(*whole);
  REQUIRE(columns.size() == 3);
  const mesh::shape dims = {whole->rows(), 7};
  CHECK(columns.at("tokens") == mesh::tensor::from_ints(dims, whole->tokens));
  CHECK(columns.at("targets") == mesh::tensor::from_ints(dims, whole->targets));
  CHECK(columns.at("mask") == mesh::tensor::from_floats(dims, whole->mask));
  CHECK(columns.at("tokens").type == mesh::dtype::i32);
  CHECK(columns.at("mask").type == mesh::dtype::f32);
}
