#include "actors/ring_allreduce.hpp"

#include <cstring>
#include <string>
#include <utility>

#include "actors/allreduce_codec.hpp"

namespace mesh {
namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

}  // namespace

ring_allreduce::ring_allreduce(uint64_t round, int rank, int n, std::vector<float> data, int pieces, wire_format format)
    : round_(round), rank_(rank), n_(n < 1 ? 1 : n), pieces_(pieces < 1 ? 1 : pieces), format_(format),
      data_(std::move(data)), seen_(2 * static_cast<size_t>(n_) * static_cast<size_t>(pieces_), false) {
  if (n_ == 1) final_pieces_ = total_pieces();
}

ring_allreduce::ring_allreduce(uint64_t round, int rank, int n, int pieces, wire_format format)
    : ring_allreduce(round, rank, n, {}, pieces, format) {
  has_data_ = false;
}

std::pair<size_t, size_t> ring_allreduce::range(int chunk, int piece) const {
  const size_t len = data_.size();
  const size_t c0 = len * static_cast<size_t>(chunk) / static_cast<size_t>(n_);
  const size_t c1 = len * static_cast<size_t>(chunk + 1) / static_cast<size_t>(n_);
  const size_t w = c1 - c0;
  return {c0 + w * static_cast<size_t>(piece) / static_cast<size_t>(pieces_),
          c0 + w * static_cast<size_t>(piece + 1) / static_cast<size_t>(pieces_)};
}

int ring_allreduce::chunk_at(uint32_t step, bool received) const {
  // Reduce-scatter step s: rank r sends chunk r-s and receives chunk r-1-s.
  // All-gather step t (= s - (n-1)): rank r sends chunk r+1-t and receives chunk r-t.
  const int s = static_cast<int>(step);
  if (s < n_ - 1) return mod(rank_ - s - (received ? 1 : 0), n_);
  const int t = s - (n_ - 1);
  return mod(rank_ + 1 - t - (received ? 1 : 0), n_);
}

void for_each_part(const parallel_runner& run, size_t count, size_t part, const std::function<void(size_t, size_t)>& fn) {
  const size_t parts = (count + part - 1) / part;
  if (!run || parts <= 1) {
    fn(0, count);
    return;
  }
  run(static_cast<int64_t>(parts), [&](int64_t p) {
    const size_t from = static_cast<size_t>(p) * part;
    fn(from, std::min(count, from + part));
  });
}

void ring_allreduce::in_parts(size_t count, const std::function<void(size_t, size_t)>& fn) const {
  for_each_part(parallel_, count, parallel_part_values, fn);
}

allreduce_message ring_allreduce::make(uint32_t step, int chunk, int piece) {
  const size_t b = range(chunk, piece).first;
  return make(step, chunk, piece, [&](uint8_t* out, size_t from, size_t to) { encode_into(data_.data() + b + from, to - from, format_, out); });
}

allreduce_message ring_allreduce::make(uint32_t step, int chunk, int piece, const part_writer& write) {
  allreduce_message m;
  m.round = round_;
  m.step = step;
  m.piece = static_cast<uint32_t>(piece);
  const auto span = range(chunk, piece);
  const size_t count = span.second - span.first;
  const size_t bytes = encoded_bytes(count, format_);
  bytes_sent_ += bytes;
  uint8_t* out = nullptr;
  if (placer_)
    if (auto at = placer_(bytes)) {
      out = at->first;
      m.placed = true;
      m.placed_offset = at->second;
      m.placed_bytes = bytes;
    }
  if (!out) {
    m.payload.resize(bytes);
    out = m.payload.data();
  }
  in_parts(count, [&](size_t from, size_t to) { write(out + encoded_bytes(from, format_), from, to); });
  return m;
}

std::vector<allreduce_message> ring_allreduce::start() {
  std::vector<allreduce_message> out;
  if (n_ == 1) return out;
  for (int p = 0; p < pieces_; ++p) out.push_back(make(0, chunk_at(0, false), p));
  return out;
}

std::vector<allreduce_message> ring_allreduce::start(std::vector<float> data) {
  data_ = std::move(data);
  has_data_ = true;
  auto out = start();
  for (const auto& m : std::exchange(taken_, {})) {
    auto more = apply({m.round, m.step, m.piece, m.payload});
    // A piece of the wrong size (the only check that needs the data) is dropped as it would
    // have been on arrival.
    if (more) out.insert(out.end(), more->begin(), more->end());
  }
  return out;
}

expected<std::vector<allreduce_message>> ring_allreduce::on_message(const allreduce_piece_ref& m) {
  if (m.round != round_)
    return make_error(error_code::invalid_argument, "all-reduce: message of round " + std::to_string(m.round) +
                                                        " during round " + std::to_string(round_));
  const uint32_t steps = 2 * static_cast<uint32_t>(n_ - 1);
  if (m.step >= steps || m.piece >= static_cast<uint32_t>(pieces_))
    return make_error(error_code::invalid_argument, "all-reduce: step/piece out of range");
  const size_t slot = m.step * static_cast<size_t>(pieces_) + m.piece;
  if (seen_[slot]) return make_error(error_code::invalid_argument, "all-reduce: duplicate message");
  if (!has_data_) {
    seen_[slot] = true;
    taken_.push_back({m.round, m.step, m.piece, {m.payload.begin(), m.payload.end()}});
    return std::vector<allreduce_message>{};
  }
  auto out = apply(m);
  if (out) seen_[slot] = true;
  return out;
}

expected<std::vector<allreduce_message>> ring_allreduce::apply(const allreduce_piece_ref& m) {
  const uint32_t steps = 2 * static_cast<uint32_t>(n_ - 1);
  const int chunk = chunk_at(m.step, true);
  const int piece = static_cast<int>(m.piece);
  const auto span = range(chunk, piece);
  const size_t b = span.first, e = span.second;
  if (m.payload.size() != encoded_bytes(e - b, format_))
    return make_error(error_code::invalid_argument, "all-reduce: payload of " + std::to_string(m.payload.size()) +
                                                        " bytes, expected " + std::to_string(encoded_bytes(e - b, format_)));
  std::vector<allreduce_message> out;
  const uint32_t last_rs = static_cast<uint32_t>(n_ - 2);
  const uint8_t* in = m.payload.data();
  const auto in_at = [&](size_t from) { return in + encoded_bytes(from, format_); };
  float* xs = data_.data() + b;
  // Each pass reads the piece once and writes what it forwards as it goes (a separate add and
  // copy move a third more bytes through host memory): the sum forwarded by reduce-scatter's middle steps
  // is not kept (all-gather overwrites that chunk here), all-gather forwards the bytes it got.
  // add(from, to, put): put(i, the received value i + xs[i]) for i in [from, to).
  const auto add = [&](size_t from, size_t to, auto&& put) {
    if (format_ == wire_format::f32) {  // added straight from the payload: f32 on the wire is the values' bytes
      for (size_t i = from; i < to; ++i) {
        float v;
        std::memcpy(&v, in + i * sizeof(float), sizeof(float));
        put(i, v + xs[i]);
      }
      return;
    }
    decode(in_at(from), to - from, format_, received_.data() + from);
    for (size_t i = from; i < to; ++i) put(i, received_[i] + xs[i]);
  };
  if (format_ != wire_format::f32) received_.resize(e - b);
  if (m.step < last_rs) {
    out.push_back(make(m.step + 1, chunk, piece, [&](uint8_t* to_send, size_t from, size_t to) {
      if (format_ == wire_format::f32) {
        add(from, to, [&](size_t i, float v) { std::memcpy(to_send + (i - from) * sizeof(float), &v, sizeof(float)); });
        return;
      }
      add(from, to, [&](size_t i, float v) { received_[i] = v; });
      encode_into(received_.data() + from, to - from, format_, to_send);
    }));
  } else if (m.step == last_rs) {
    // This piece of chunk `chunk` is now fully reduced here: fixed to its wire value (what every
    // other rank will decode, bit for bit) and started around the ring.
    out.push_back(make(m.step + 1, chunk, piece, [&](uint8_t* to_send, size_t from, size_t to) {
      add(from, to, [&](size_t i, float v) { xs[i] = v; });
      encode_into(xs + from, to - from, format_, to_send);
      if (format_ != wire_format::f32) decode(to_send, to - from, format_, xs + from);  // what the others decode
    }));
    ++final_pieces_;
  } else if (m.step + 1 < steps) {
    out.push_back(make(m.step + 1, chunk, piece, [&](uint8_t* to_send, size_t from, size_t to) {
      decode(in_at(from), to - from, format_, xs + from);
      if (const size_t n = encoded_bytes(to - from, format_)) std::memcpy(to_send, in_at(from), n);
    }));
    ++final_pieces_;
  } else {
    in_parts(e - b, [&](size_t from, size_t to) { decode(in_at(from), to - from, format_, xs + from); });
    ++final_pieces_;
  }
  return out;
}

bucketed_allreduce::bucketed_allreduce(uint64_t base, int rank, int n, int buckets, int pieces, wire_format format)
    : base_(base), started_(static_cast<size_t>(buckets), false) {
  rounds_.reserve(static_cast<size_t>(buckets));
  for (int b = 0; b < buckets; ++b) rounds_.emplace_back(base + static_cast<uint64_t>(b), rank, n, pieces, format);
}

std::vector<allreduce_message> bucketed_allreduce::start(int bucket, std::vector<float> data) {
  started_[static_cast<size_t>(bucket)] = true;
  return rounds_[static_cast<size_t>(bucket)].start(std::move(data));
}

expected<std::vector<allreduce_message>> bucketed_allreduce::on_message(const allreduce_piece_ref& m) {
  if (!owns(m.round)) return make_error(error_code::invalid_argument, "a piece of round " + std::to_string(m.round) + ", not of this step");
  return rounds_[static_cast<size_t>(m.round - base_)].on_message(m);
}

bool bucketed_allreduce::done() const {
  return std::all_of(rounds_.begin(), rounds_.end(), [](const ring_allreduce& r) { return r.done(); });
}

std::vector<float> bucketed_allreduce::result() const {
  std::vector<float> out;
  for (const auto& r : rounds_) out.insert(out.end(), r.result().begin(), r.result().end());
  return out;
}

std::vector<std::vector<float>> bucketed_allreduce::take_results() {
  std::vector<std::vector<float>> out;
  for (auto& r : rounds_) out.push_back(r.take_result());
  return out;
}

uint32_t bucketed_allreduce::taken() const {
  uint32_t n = 0;
  for (const auto& r : rounds_) n += r.taken();
  return n;
}

uint64_t bucketed_allreduce::bytes_sent() const {
  uint64_t n = 0;
  for (const auto& r : rounds_) n += r.bytes_sent();
  return n;
}

}  // namespace mesh
