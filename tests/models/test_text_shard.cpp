// A data file cut into byte ranges, as training workers read it (text_record_reader::open_range,
// models/text_shard.hpp): every record lands in exactly one range whatever the cut, a shard's
// epochs visit each of its rows once, any draw can be asked for first, and a shard's reader reads
// only around its own bytes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "models/text_shard.hpp"
#include "models/utf8.hpp"
#include "test_tokenizer_support.hpp"

using namespace mesh;
using namespace mesh::models;

namespace {

/// A byte source over a string that records which bytes were read.
struct string_source {
  std::string bytes;
  std::vector<std::pair<uint64_t, uint64_t>> reads;  ///< [offset, offset + n)
  byte_source source() {
    return [this](uint64_t offset, std::span<char> into) -> expected<size_t> {
      if (offset >= bytes.size()) return size_t{0};
      const size_t n = std::min<size_t>(into.size(), bytes.size() - offset);
      std::copy_n(bytes.data() + offset, n, into.data());
      reads.emplace_back(offset, offset + n);
      return n;
    };
  }
};

/// A random file of records: text documents (lines, blank lines of spaces and tabs, CRLF) or JSONL
/// lines, sometimes after a byte order mark.
std::string random_file(std::mt19937& rng, data_format format) {
  std::string out;
  if (rng() % 4 == 0) out += "\xEF\xBB\xBF";
  const int records = 1 + static_cast<int>(rng() % 30);
  const auto word = [&] { return std::string(1 + rng() % 6, static_cast<char>('a' + rng() % 26)); };
  const auto eol = [&] { return rng() % 5 == 0 ? std::string("\r\n") : std::string("\n"); };
  for (int r = 0; r < records; ++r) {
    if (format == data_format::jsonl) {
      out += "{\"text\": \"" + word() + " " + word() + "\"}" + eol();
      if (rng() % 4 == 0) out += (rng() % 2 ? "  " : "") + eol();  // a blank line
    } else {
      const int lines = 1 + static_cast<int>(rng() % 3);
      for (int l = 0; l < lines; ++l) out += word() + " " + word() + eol();
      const int blanks = 1 + static_cast<int>(rng() % 2);
      for (int b = 0; b < blanks; ++b) out += (rng() % 3 == 0 ? " \t" : "") + eol();
    }
  }
  if (rng() % 3 == 0 && !out.empty()) out.pop_back();  // no newline at the end
  return out;
}

struct seen {
  std::string text;
  uint64_t offset;
  bool operator==(const seen&) const = default;
};

std::vector<seen> records_of(text_record_reader& r) {
  std::vector<seen> out;
  for (;;) {
    auto x = r.next();
    REQUIRE(x);
    if (!*x) return out;
    out.push_back({std::get<std::string>(x->value().content), x->value().offset});
  }
}

}  // namespace

TEST_CASE("a file cut at any byte offsets hands every record to exactly one range", "[text_dataset][shard]") {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const auto format = trial % 2 ? data_format::jsonl : data_format::text;
    string_source file{random_file(rng, format), {}};
    auto whole = text_record_reader::open_range(file.source(), "f", format, 0, UINT64_MAX);
    REQUIRE(whole);
    std::vector<seen> all;
    if (format == data_format::jsonl) {
      for (;;) {  // JSONL records: their text
        auto x = whole->next();
        REQUIRE(x);
        if (!*x) break;
        all.push_back({std::get<std::string>(x->value().content), x->value().offset});
      }
    } else {
      all = records_of(*whole);
    }
    // Cuts: S equal shards, and random offsets.
    std::vector<uint64_t> cuts{0};
    const uint32_t shards = 1 + trial % 7;
    if (trial % 3 == 0) {
      for (uint32_t j = 1; j < shards; ++j) cuts.push_back(shard_bytes(file.bytes.size(), shards, j).begin);
    } else {
      for (uint32_t j = 1; j < shards; ++j) cuts.push_back(rng() % (file.bytes.size() + 1));
      std::sort(cuts.begin(), cuts.end());
    }
    cuts.push_back(file.bytes.size());
    std::vector<seen> joined;
    for (size_t j = 0; j + 1 < cuts.size(); ++j) {
      auto part = text_record_reader::open_range(file.source(), "f", format, cuts[j], cuts[j + 1]);
      REQUIRE(part);
      for (auto& s : records_of(*part)) {
        CHECK(s.offset >= cuts[j]);
        CHECK(s.offset < cuts[j + 1]);
        joined.push_back(std::move(s));
      }
    }
    INFO("trial " << trial << ", cuts at " << Catch::Detail::stringify(cuts) << " of:\n" << file.bytes);
    REQUIRE(joined.size() == all.size());
    for (size_t i = 0; i < all.size(); ++i) {
      CHECK(joined[i].text == all[i].text);
      CHECK(joined[i].offset == all[i].offset);
    }
  }
}

TEST_CASE("a range reader names a bad record by its byte, the whole-file reader by its line", "[text_dataset][shard]") {
  string_source file{"{\"text\": \"a\"}\n{\"text\": \"b\"}\n{\"txt\": 1}\n", {}};
  auto whole = text_record_reader::open_range(file.source(), "d.jsonl", data_format::jsonl, 0, UINT64_MAX);
  REQUIRE(whole);
  REQUIRE(whole->next());
  REQUIRE(whole->next());
  auto bad = whole->next();
  REQUIRE(!bad);
  CHECK(bad.error().message.starts_with("d.jsonl:3: a record needs"));
  auto part = text_record_reader::open_range(file.source(), "d.jsonl", data_format::jsonl, 20, UINT64_MAX);
  REQUIRE(part);
  bad = part->next();
  REQUIRE(!bad);
  CHECK(bad.error().message.starts_with("d.jsonl: byte 28: a record needs"));
  // A source that fails: its error, unchanged.
  byte_source broken = [](uint64_t, std::span<char>) -> expected<size_t> {
    return make_error(error_code::network, "node 1234: gone");
  };
  auto r = text_record_reader::open_range(broken, "d.jsonl", data_format::jsonl, 0, UINT64_MAX);
  REQUIRE(r);
  auto e = r->next();
  REQUIRE(!e);
  CHECK(e.error().code == error_code::network);
}

namespace {

/// A text file of `docs` documents, each a different line.
std::string documents(int docs) {
  std::string out;
  for (int i = 0; i < docs; ++i) out += "document number " + std::to_string(i) + " says hello.\n\n";
  return out;
}

/// The rows of `p`, each as its tokens.
std::vector<std::vector<int32_t>> rows_of(const packed_rows& p) {
  std::vector<std::vector<int32_t>> out;
  for (int64_t r = 0; r < p.rows(); ++r)
    out.emplace_back(p.tokens.begin() + r * p.sequence, p.tokens.begin() + (r + 1) * p.sequence);
  return out;
}

}  // namespace

TEST_CASE("a shard's epochs each visit every row once, in a seeded order any draw reaches alike", "[text_dataset][shard]") {
  const auto tok = models::test::byte_tokenizer(false);
  string_source file{documents(200), {}};
  text_shard_options o;
  o.name = "docs.txt";
  o.size = file.bytes.size();
  o.shards = 3;
  o.shard = 1;
  o.sequence = 16;
  o.batch = 3;
  o.seed = 9;
  o.shuffle_rows = 10;  // rounded up to 12: blocks of 4 draws
  // The shard's rows in file order: its byte range's records packed.
  const auto span = shard_bytes(o.size, o.shards, o.shard);
  auto reader = text_record_reader::open_range(file.source(), "docs.txt", data_format::text, span.begin, span.end);
  REQUIRE(reader);
  auto packer = row_packer::create({.sequence = o.sequence});
  REQUIRE(packer);
  packed_rows expected_rows{.sequence = o.sequence, .tokens = {}, .targets = {}, .mask = {}};
  for (;;) {
    auto r = reader->next();
    REQUIRE(r);
    if (!*r) break;
    auto e = tokenize_record(**r, tok, nullptr);
    REQUIRE(e);
    packer->push(*e);
    while (auto row = packer->pop()) expected_rows.append(*row);
  }
  const auto all = rows_of(expected_rows);
  const uint64_t per_epoch = all.size() / 3;
  REQUIRE(per_epoch >= 8);

  auto shard = text_shard::open(file.source(), tok, nullptr, o);
  REQUIRE(shard);
  std::vector<std::vector<std::vector<int32_t>>> draws;  // by draw index
  std::multiset<std::vector<int32_t>> epoch0, epoch1;
  for (uint64_t d = 0; d < 2 * per_epoch; ++d) {
    auto rows = shard->draw(d);
    REQUIRE(rows);
    REQUIRE(rows->rows() == 3);
    draws.push_back(rows_of(*rows));
    for (auto& r : draws.back()) (d < per_epoch ? epoch0 : epoch1).insert(r);
  }
  REQUIRE(shard->per_epoch() == per_epoch);
  // Each epoch: per_epoch * 3 of the shard's rows, none twice (rows with equal tokens count as
  // often as the shard has them; its tail of fewer than 3 rows is skipped).
  std::multiset<std::vector<int32_t>> shard_rows(all.begin(), all.end());
  for (const auto* e : {&epoch0, &epoch1}) {
    CHECK(e->size() == per_epoch * 3);
    for (const auto& r : *e) CHECK(e->count(r) <= shard_rows.count(r));
  }
  // Shuffled within blocks, and differently in the next epoch.
  CHECK(draws[0] != std::vector<std::vector<int32_t>>(all.begin(), all.begin() + 3));
  CHECK(draws[0] != draws[per_epoch]);
  // A fresh shard asked for draws in another order (an epoch on, then back) gives the same rows.
  auto other = text_shard::open(file.source(), tok, nullptr, o);
  REQUIRE(other);
  for (uint64_t d : {per_epoch + 5, uint64_t{2}, uint64_t{7}, uint64_t{7}, per_epoch + 1}) {
    auto rows = other->draw(d);
    REQUIRE(rows);
    CHECK(rows_of(*rows) == draws[d]);
  }
}

TEST_CASE("a shard's reader reads only around its own bytes, and a shard too small is named", "[text_dataset][shard]") {
  const auto tok = models::test::byte_tokenizer(false);
  string_source file{documents(40000), {}};  // about 1.3 MB
  text_shard_options o;
  o.name = "big.txt";
  o.size = file.bytes.size();
  o.shards = 8;
  o.shard = 5;
  o.sequence = 32;
  o.batch = 2;
  auto shard = text_shard::open(file.source(), tok, nullptr, o);
  REQUIRE(shard);
  REQUIRE(shard->draw(0));
  REQUIRE(shard->draw(1));
  const auto span = shard_bytes(o.size, o.shards, o.shard);
  uint64_t read = 0;
  for (const auto& [from, to] : file.reads) {
    CHECK(from + 4096 >= span.begin);  // at most a line back, to see where a document starts
    CHECK(to <= span.end);
    read += to - from;
  }
  INFO("read " << read << " bytes of a shard of " << span.end - span.begin);
  CHECK(read < (span.end - span.begin) / 2);  // one shuffle block's records, not the shard

  string_source tiny{"just a few words.\n", {}};
  o.size = tiny.bytes.size();
  o.shards = 1;
  o.shard = 0;
  auto small = text_shard::open(tiny.source(), tok, nullptr, o);
  REQUIRE(small);
  auto none = small->draw(0);
  REQUIRE(!none);
  CHECK(none.error().message.find("shard 0 of 1 of big.txt") != std::string::npos);
  CHECK(none.error().message.find("fewer than a micro-batch of 2") != std::string::npos);
}
