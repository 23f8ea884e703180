#include "transport/ordered_inbox.hpp"

#include <string>

namespace mesh::transport {

expected<void> ordered_inbox::hold(uint64_t bytes) {
  if (held() >= max_held)
    return make_error(error_code::limit_exceeded, "peer has " + std::to_string(held()) +
                                                      " messages waiting for an earlier one (at most " + std::to_string(max_held) + ")");
  if (bytes > budget_ - held_bytes_)
    return make_error(error_code::limit_exceeded, "peer ran past its receive budget: " + std::to_string(held_bytes_ + bytes) +
                                                      " bytes of messages would wait for an earlier one (budget " +
                                                      std::to_string(budget_) + ")");
  held_bytes_ += bytes;
  return {};
}

expected<void> ordered_inbox::on_control(std::vector<uint8_t> bytes, std::vector<message>& out) {
  if (queue_.empty()) {  // nothing sent earlier is missing: the common case costs no copy
    out.push_back({false, std::move(bytes)});
    return {};
  }
  if (auto ok = hold(bytes.size()); !ok) return ok;
  queue_.push_back({false, 0, std::move(bytes)});
  return {};
}

expected<void> ordered_inbox::on_bulk_marker(std::vector<message>& out) {
  if (auto ok = hold(0); !ok) return ok;
  queue_.push_back({true, markers_++, {}});
  flush(out);
  return {};
}

expected<void> ordered_inbox::on_bulk(uint64_t ordinal, std::vector<uint8_t> bytes, std::vector<message>& out) {
  if (ordinal < delivered_bulk_ || early_bulk_.count(ordinal))
    return make_error(error_code::decode_error, "bulk message " + std::to_string(ordinal) + " arrived twice");
  if (!queue_.empty() && queue_.front().bulk && queue_.front().ordinal == ordinal) {
    // Its turn now: handed over at once, never counted as waiting.
    queue_.pop_front();
    out.push_back({true, std::move(bytes)});
    ++delivered_bulk_;
    flush(out);
    return {};
  }
  if (auto ok = hold(bytes.size()); !ok) return ok;
  early_bulk_.emplace(ordinal, std::move(bytes));
  flush(out);
  return {};
}

void ordered_inbox::flush(std::vector<message>& out) {
  while (!queue_.empty()) {
    slot& s = queue_.front();
    if (s.bulk) {
      auto it = early_bulk_.find(s.ordinal);
      if (it == early_bulk_.end()) return;  // its turn, not here yet: everything after it waits
      held_bytes_ -= it->second.size();
      out.push_back({true, std::move(it->second)});
      early_bulk_.erase(it);
      ++delivered_bulk_;
    } else {
      held_bytes_ -= s.bytes.size();
      out.push_back({false, std::move(s.bytes)});
    }
    queue_.pop_front();
  }
}

}  // namespace mesh::transport
