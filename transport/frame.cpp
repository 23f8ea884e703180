#include "transport/frame.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <new>
#include <string>

#include "transport/varint.hpp"

namespace mesh::transport {

namespace {
bool known_kind(uint8_t k) { return k >= 1 && k <= static_cast<uint8_t>(frame_kind::bulk_next); }

// A large payload buffer is written once, front to back, by the receive path: with 4 KiB pages
// that is a page fault (and a cgroup charge) every 4 KiB, a sixth of the receiver's CPU on
// loopback. Asking for transparent huge pages (Linux's "madvise" mode, Debian's default) makes
// it one fault per 2 MiB. Only advice: where the kernel declines, nothing changes.
void advise_huge_pages(uint8_t* data, size_t capacity) {
  constexpr uintptr_t huge = uintptr_t{2} << 20;
  if (capacity < 2 * huge) return;
  auto begin = (reinterpret_cast<uintptr_t>(data) + huge - 1) & ~(huge - 1);
  auto end = (reinterpret_cast<uintptr_t>(data) + capacity) & ~(huge - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}
}  // namespace

uint64_t frame_limits::for_kind(frame_kind k) const {
  switch (k) {
    case frame_kind::admission: return admission;
    case frame_kind::control: return control;
    case frame_kind::bulk: return bulk;
    case frame_kind::heartbeat: return heartbeat;
    case frame_kind::observed_address: return observed_address;
    case frame_kind::introduce: return introduce;
    case frame_kind::punch: return punch;
    case frame_kind::relay_send:
    case frame_kind::relay_deliver: return relay;
    case frame_kind::retire:
    case frame_kind::bulk_next: return 0;
  }
  return 0;
}

expected<frame_header> encode_frame_header(frame_kind k, uint64_t length, const frame_limits& limits) {
  if (!known_kind(static_cast<uint8_t>(k)))
    return make_error(error_code::invalid_argument, "unknown frame kind");
  if (length > limits.for_kind(k) || length > varint_max)
    return make_error(error_code::limit_exceeded,
                      "frame of " + std::to_string(length) + " bytes exceeds the limit of " +
                          std::to_string(limits.for_kind(k)) + " for its channel");
  frame_header h;
  h.bytes[0] = static_cast<uint8_t>(k);
  h.size = static_cast<uint8_t>(1 + varint_encode(length, h.bytes.data() + 1));
  return h;
}

expected<std::vector<uint8_t>> encode_frame(frame_kind k, std::span<const uint8_t> payload,
                                            const frame_limits& limits) {
  auto h = encode_frame_header(k, payload.size(), limits);
  if (!h) return tl::unexpected(h.error());
  std::vector<uint8_t> out;
  out.reserve(h->size + payload.size());
  out.insert(out.end(), h->bytes.begin(), h->bytes.begin() + h->size);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

expected<void> frame_decoder::feed(std::span<const uint8_t> bytes, std::vector<frame>& out) {
  if (failed_) return make_error(error_code::decode_error, "frame stream already failed");
  while (!bytes.empty()) {
    if (!in_payload_) {
      // Gather the header byte by byte until the varint is complete.
      header_[header_size_++] = bytes.front();
      bytes = bytes.subspan(1);
      if (header_size_ == 1) {
        if (!known_kind(header_[0])) {
          failed_ = true;
          return make_error(error_code::decode_error,
                            "unknown frame kind " + std::to_string(header_[0]));
        }
        continue;
      }
      size_t need = 1 + varint_length_from_first(header_[1]);
      if (header_size_ < need) continue;
      uint64_t length = *varint_decode({header_.data() + 1, header_size_ - 1}, nullptr);
      auto kind = static_cast<frame_kind>(header_[0]);
      if (length > limits_.for_kind(kind)) {
        failed_ = true;
        return make_error(error_code::limit_exceeded,
                          "peer sent a frame of " + std::to_string(length) + " bytes; the limit is " +
                              std::to_string(limits_.for_kind(kind)));
      }
      header_size_ = 0;
      current_ = frame{kind, {}};
      const auto reserve = static_cast<size_t>(std::min(length, reserve_rule_ ? reserve_rule_(length) : reserve_limit_));
      if (pool_ && reserve == length) current_.payload = pool_->take(reserve);
      if (current_.payload.capacity() < reserve) {
        current_.payload.reserve(reserve);
        advise_huge_pages(current_.payload.data(), current_.payload.capacity());
      }
      remaining_ = length;
      length_ = length;
      in_payload_ = true;
    }
    size_t take = static_cast<size_t>(std::min<uint64_t>(remaining_, bytes.size()));
    current_.payload.insert(current_.payload.end(), bytes.begin(), bytes.begin() + take);
    bytes = bytes.subspan(take);
    remaining_ -= take;
    if (remaining_ == 0) {
      out.push_back(std::move(current_));
      current_ = frame{};
      in_payload_ = false;
    }
  }
  return {};
}

void frame_decoder::reserve_payload(uint64_t bytes) {
  if (!in_payload_ || current_.payload.capacity() >= bytes) return;
  try {
    current_.payload.reserve(static_cast<size_t>(std::min(bytes, length_)));
  } catch (const std::bad_alloc&) {
    return;  // the buffer grows as the payload arrives instead
  }
  advise_huge_pages(current_.payload.data(), current_.payload.capacity());
}

expected<frame> decode_single_frame(std::span<const uint8_t> bytes, const frame_limits& limits) {
  frame_decoder d(limits);
  std::vector<frame> out;
  if (auto r = d.feed(bytes, out); !r) return tl::unexpected(r.error());
  if (out.size() != 1 || !d.at_boundary())
    return make_error(error_code::decode_error, "datagram does not hold exactly one frame");
  return std::move(out.front());
}

}  // namespace mesh::transport
