// libFuzzer target: a peer drives a connection's bulk receiving side (bulk_receiver) with any
// mix of well-formed messages, trailing junk and raw bytes, on up to 8 streams, with resets and
// the admission at any point. The peer obeys flow control as QUIC enforces it: on each stream
// it sends at most the initial window plus the credit the receiver gave back. Checked after
// every step: credit never exceeds what was received, and none comes before the admission; the
// bytes held in unfinished messages stay within the budget plus one window per open stream;
// every message handed back is exactly what was sent. At the end every well-formed message
// still open must finish once the peer keeps sending what its credit allows (no message waits
// for ever), and once every stream has ended nothing is left held, waiting or budgeted.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <vector>

#include "transport/bulk_receiver.hpp"

namespace {
using namespace mesh::transport;

struct byte_reader {
  const uint8_t* p;
  size_t n;
  bool empty() const { return n == 0; }
  uint8_t next() {
    if (!n) return 0;
    --n;
    return *p++;
  }
};

struct peer_stream {
  std::vector<uint8_t> content;   // everything the peer will send on it
  bool well_formed = false;       // content is exactly one bulk frame (see expect())
  std::vector<uint8_t> payload;   // that frame's payload
  size_t sent = 0;
  uint64_t credit = 0;
  bool done = false;              // finished, reset or failed
};

constexpr uint64_t window = 256;

/// A stream's content: a well-formed message (sometimes with junk after it) or raw input bytes.
std::vector<uint8_t> make_content(byte_reader& in, int64_t sid, const frame_limits& limits) {
  const uint8_t mode = in.next() % 6;
  if (mode >= 4) {  // raw bytes from the input: anything at all
    std::vector<uint8_t> raw(in.next() % 64);
    for (auto& b : raw) b = in.next();
    return raw;
  }
  const uint64_t high = in.next(), low = in.next();  // in this order on every compiler
  const uint64_t size = ((high << 8) | low) % (limits.bulk + 1);
  auto h = encode_frame_header(frame_kind::bulk, size, limits);
  std::vector<uint8_t> c(h->bytes.begin(), h->bytes.begin() + h->size);
  for (uint64_t i = 0; i < size; ++i) c.push_back(static_cast<uint8_t>(i * 7 + static_cast<uint64_t>(sid)));
  if (mode == 3) c.push_back(in.next());  // junk after the frame
  return c;
}

// What the receiver must make of a stream's whole content, by the frame decoder alone: exactly
// one bulk frame is a message with its payload; anything else is an error.
void expect(peer_stream& s, const frame_limits& limits) {
  auto f = decode_single_frame(s.content, limits);
  s.well_formed = f && f->kind == frame_kind::bulk;
  s.payload = s.well_formed ? f->payload : std::vector<uint8_t>{};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  byte_reader in{data, size};
  bulk_receiver::config cfg;
  cfg.limits.bulk = 2048;
  cfg.budget = (in.next() % 4 + 1) * 1024;  // below limits.bulk it is raised to it
  cfg.stream_window = window;
  const uint64_t budget = std::max<uint64_t>(cfg.budget, cfg.limits.bulk);
  bulk_receiver rx(cfg);
  std::map<int64_t, peer_stream> streams;
  int64_t next_sid = 3;  // a server's unidirectional streams: 3, 7, 11, ...
  bool admitted = false;
  uint64_t delivered = 0;  // bytes of messages handed over that the application still holds

  const auto apply_grants = [&] {
    for (const auto& [sid, credit] : rx.take_grants()) {
      if (!admitted) __builtin_trap();  // budget before the peer proved itself
      streams.at(sid).credit += credit;
    }
  };
  const auto open_streams = [&] {
    size_t n = 0;
    for (const auto& [sid, s] : streams) n += !s.done;
    return n;
  };
  const auto check = [&] {
    for (const auto& [sid, s] : streams)
      if (s.credit > s.sent) __builtin_trap();  // credit for bytes never received
    if (rx.receiving() > budget + rx.open_streams() * window) __builtin_trap();
    if (rx.budget_left() > budget) __builtin_trap();
  };
  // Sends up to `want` more bytes on `sid` (as flow control allows); false: the receiver failed.
  const auto send = [&](int64_t sid, size_t want) {
    peer_stream& s = streams.at(sid);
    if (s.done) return true;
    const uint64_t allowed = window + s.credit - s.sent;
    const size_t n = static_cast<size_t>(std::min<uint64_t>({want, allowed, s.content.size() - s.sent}));
    const bool fin = s.sent + n == s.content.size();
    if (n == 0 && !fin) return true;
    auto r = rx.on_data(sid, {s.content.data() + s.sent, n}, fin);
    s.sent += n;
    apply_grants();
    if (!r) {
      if (s.well_formed) __builtin_trap();  // a well-formed message was refused
      s.done = true;
      return false;  // the connection closes
    }
    if (r->credit && !admitted) __builtin_trap();  // credit before the peer proved itself
    s.credit += r->credit;
    if (r->message) {
      if (!s.well_formed || *r->message != s.payload) __builtin_trap();
      s.done = true;
      delivered += r->message->size();  // the application holds it until a release (op 3)
      rx.set_delivered(delivered);
    } else if (fin) {
      __builtin_trap();  // a FIN without a message must be an error
    }
    return true;
  };

  while (!in.empty()) {
    const uint8_t op = in.next();
    switch (op % 8) {
      case 0: {  // open a stream (at most 8 at once; reset or finished ones make room)
        if (open_streams() >= 8) break;
        const int64_t sid = next_sid;
        next_sid += 4;
        peer_stream& s = streams[sid];
        s.content = make_content(in, sid, cfg.limits);
        expect(s, cfg.limits);
        break;
      }
      case 1:
        admitted = true;
        rx.admit();
        apply_grants();
        break;
      case 3: {  // the application releases some of the delivered messages it holds
        delivered -= std::min<uint64_t>(delivered, static_cast<uint64_t>(in.next()) * 16);
        rx.set_delivered(delivered);
        apply_grants();
        break;
      }
      case 2: {  // reset a stream
        if (streams.empty()) break;
        auto it = std::next(streams.begin(), in.next() % streams.size());
        rx.forget(it->first);
        apply_grants();
        it->second.done = true;
        break;
      }
      default: {  // send on a stream
        if (streams.empty()) break;
        auto it = std::next(streams.begin(), in.next() % streams.size());
        if (!send(it->first, static_cast<size_t>(in.next()) * 4 + 1)) return 0;
        break;
      }
    }
    check();
  }
  // Liveness: admitted, with an application that releases what it is handed, a peer that keeps
  // sending what it may finishes every message.
  admitted = true;
  rx.admit();
  apply_grants();
  const auto release_all = [&] {
    delivered = 0;
    rx.set_delivered(0);
    apply_grants();
  };
  release_all();
  for (bool progress = true; progress;) {
    progress = false;
    for (auto& [sid, s] : streams) {
      if (s.done) continue;
      const size_t before = s.sent;
      if (!send(sid, s.content.size())) return 0;
      release_all();
      check();
      if (s.sent != before || s.done) progress = true;
    }
  }
  for (const auto& [sid, s] : streams)
    if (!s.done && s.well_formed) __builtin_trap();  // waits for ever
  // Every stream ended: nothing may be left held, waiting or budgeted (a leak on reset shows here).
  if (open_streams() == 0 &&
      (rx.open_streams() != 0 || rx.waiting() != 0 || rx.receiving() != 0 || rx.budget_left() != budget))
    __builtin_trap();
  return 0;
}
