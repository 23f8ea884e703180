#include "models/text_shard.hpp"

#include <fmt/format.h>

#include <random>

namespace mesh::models {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// The order a block's `n` rows are drawn in: Fisher-Yates driven by std::mt19937_64, whose output
/// the standard fixes bit for bit (std::shuffle's use of it is not), so every node agrees.
std::vector<int64_t> block_order(int64_t n, uint64_t seed, uint32_t shard, uint64_t epoch, uint64_t block) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  std::mt19937_64 rng(splitmix64(seed ^ splitmix64(shard + 1)) ^ splitmix64(epoch * 0x100000001b3ull + block));
  for (int64_t i = n - 1; i > 0; --i) std::swap(order[static_cast<size_t>(i)], order[rng() % static_cast<uint64_t>(i + 1)]);
  return order;
}

}  // namespace

byte_span shard_bytes(uint64_t size, uint32_t shards, uint32_t shard) {
  const auto at = [&](uint32_t j) {
    return static_cast<uint64_t>(static_cast<unsigned __int128>(size) * j / shards);
  };
  return {at(shard), at(shard + 1)};
}

text_shard::text_shard(byte_source source, const tokenizer& tok, const chat_template* chat, text_shard_options options)
    : source_(std::move(source)), tok_(&tok), chat_(chat), options_(std::move(options)),
      bytes_(shard_bytes(options_.size, options_.shards, options_.shard)) {}

expected<text_shard> text_shard::open(byte_source source, const tokenizer& tok, const chat_template* chat,
                                      text_shard_options o) {
  const auto bad = [&](const std::string& what) {
    return make_error(error_code::invalid_argument, fmt::format("data shard of {}: {}", o.name, what));
  };
  if (o.shards < 1 || o.shard >= o.shards) return bad(fmt::format("shard {} of {} does not exist", o.shard, o.shards));
  if (o.sequence < 1) return bad(fmt::format("a row needs at least 1 token, not {}", o.sequence));
  if (o.batch < 1) return bad(fmt::format("a micro-batch needs at least 1 row, not {}", o.batch));
  if (o.shuffle_rows < 1) return bad(fmt::format("a shuffle window of {} rows", o.shuffle_rows));
  o.shuffle_rows = (std::max(o.shuffle_rows, o.batch) + o.batch - 1) / o.batch * o.batch;
  return text_shard(std::move(source), tok, chat, std::move(o));
}

expected<void> text_shard::restart(uint64_t epoch) {
  reader_.reset();
  auto reader = text_record_reader::open_range(source_, options_.name, options_.format, bytes_.begin, bytes_.end);
  if (!reader) return forward_error(reader);
  reader_.emplace(std::move(*reader));
  auto packer = row_packer::create({.sequence = options_.sequence});
  if (!packer) return forward_error(packer);
  packer_.emplace(std::move(*packer));
  pass_epoch_ = epoch;
  pass_block_ = 0;
  pass_rows_ = 0;
  pass_done_ = false;
  return {};
}

expected<std::optional<text_shard::block>> text_shard::read_block() {
  if (pass_done_) return std::nullopt;
  block b;
  b.rows.sequence = options_.sequence;
  while (b.rows.rows() < options_.shuffle_rows) {
    if (auto row = packer_->pop()) {
      b.rows.append(*row);
      continue;
    }
    auto record = reader_->next();
    if (!record) return forward_error(record);
    if (!*record) {
      pass_done_ = true;
      break;
    }
    auto example = tokenize_record(**record, *tok_, chat_);
    if (!example) return forward_error(example);
    packer_->push(*example);
  }
  pass_rows_ += b.rows.rows();
  if (pass_done_) {
    if (rows_ && *rows_ != pass_rows_) {
      return make_error(error_code::invalid_argument,
                        fmt::format("{} changed while it was read: shard {} gave {} rows, then {}", options_.name,
                                    options_.shard, *rows_, pass_rows_));
    }
    rows_ = pass_rows_;
  }
  if (b.rows.rows() == 0) return std::nullopt;
  b.order = block_order(b.rows.rows(), options_.seed, options_.shard, pass_epoch_, pass_block_);
  ++pass_block_;
  return std::optional<block>(std::move(b));
}

expected<const text_shard::block*> text_shard::block_of(uint64_t epoch, uint64_t index) {
  const std::pair key{epoch, index};
  if (auto it = recent_.find(key); it != recent_.end()) return &it->second;
  if (!reader_ || pass_epoch_ != epoch || pass_block_ > index) {
    if (auto ok = restart(epoch); !ok) return forward_error(ok);
  }
  while (pass_block_ <= index) {
    const uint64_t at = pass_block_;
    auto b = read_block();
    if (!b) {
      reader_.reset();  // a pass that failed is not continued
      return forward_error(b);
    }
    if (!*b) return nullptr;
    if (at < index) continue;  // skipped over: only the one asked for is kept
    // Two blocks: a step's draws from one shard, and a redone step's, fall in the last two.
    while (recent_.size() >= 2) recent_.erase(recent_.begin());
    return &recent_.emplace(key, std::move(**b)).first->second;
  }
  return nullptr;
}

expected<packed_rows> text_shard::draw(uint64_t index) {
  const int64_t b = options_.batch, k = options_.shuffle_rows;
  const auto too_few = [&] {
    return make_error(error_code::invalid_argument,
                      fmt::format("shard {} of {} of {} (bytes {} to {}) gives {} rows of {} tokens, fewer than a "
                                  "micro-batch of {}: give more data, or fewer micro-batches per step",
                                  options_.shard, options_.shards, options_.name, bytes_.begin, bytes_.end, rows_.value_or(0),
                                  options_.sequence, b));
  };
  uint64_t epoch = 0, d = index;
  if (rows_) {
    const auto per = static_cast<uint64_t>(*rows_ / b);
    if (per == 0) return too_few();
    epoch = index / per;
    d = index % per;
  }
  auto at = static_cast<int64_t>(d) * b;
  auto got = block_of(epoch, static_cast<uint64_t>(at / k));
  if (!got) return forward_error(got);
  const block* blk = *got;
  if ((!blk || blk->rows.rows() < at % k + b) && rows_) {
    // The first pass ended before this draw: now that R is known, the draw is in a later epoch.
    const auto per = static_cast<uint64_t>(*rows_ / b);
    if (per == 0) return too_few();
    epoch = index / per;
    at = static_cast<int64_t>(index % per) * b;
    got = block_of(epoch, static_cast<uint64_t>(at / k));
    if (!got) return forward_error(got);
    blk = *got;
  }
  if (!blk || blk->rows.rows() < at % k + b) {
    return make_error(error_code::internal, fmt::format("{}: shard {} has no draw {}", options_.name, options_.shard, index));
  }
  packed_rows out;
  out.sequence = options_.sequence;
  const auto t = static_cast<size_t>(options_.sequence);
  for (int64_t i = 0; i < b; ++i) {
    const auto r = static_cast<size_t>(blk->order[static_cast<size_t>(at % k + i)]);
    out.tokens.insert(out.tokens.end(), blk->rows.tokens.begin() + static_cast<ptrdiff_t>(r * t),
                      blk->rows.tokens.begin() + static_cast<ptrdiff_t>((r + 1) * t));
    out.targets.insert(out.targets.end(), blk->rows.targets.begin() + static_cast<ptrdiff_t>(r * t),
                       blk->rows.targets.begin() + static_cast<ptrdiff_t>((r + 1) * t));
    out.mask.insert(out.mask.end(), blk->rows.mask.begin() + static_cast<ptrdiff_t>(r * t),
                    blk->rows.mask.begin() + static_cast<ptrdiff_t>((r + 1) * t));
  }
  return out;
}

}  // namespace mesh::models
