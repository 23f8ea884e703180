#pragma once
/// Delivered messages keep holding their sender's receive budget until the application lets
/// them go, so that what a peer can make this node hold is bounded all the way to the actor
/// that handles it, not only inside the transport.
///
/// Each connection keeps an account of the bytes it delivered (handlers::on_message) that were
/// not released yet. They count against the connection's receive budget
/// (endpoint_config::bulk_receive_budget) beside its unfinished bulk messages: past the budget
/// a bulk message gets no flow-control credit beyond its stream window, and control-stream
/// credit is withheld, until releases make room. The sender is held (its send queue fills and
/// send() refuses), nothing is dropped and the connection stays.
///
/// A message is released when on_message returns, unless the handler takes its receipt
/// (take_delivery_receipt()) and keeps it while the message, or what was decoded from it,
/// waits for its actor: the receipt releases the bytes when it is destroyed (any thread).
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

namespace mesh::transport {

/// How receipts wake their endpoint's I/O thread to give credit back (cleared when it stops).
struct release_hub {
  std::mutex mu;
  std::function<void()> wake;
};

/// One connection's delivered bytes that were not released yet.
struct delivery_account {
  std::atomic<uint64_t> held{0};
  /// The connection withholds credit until some bytes are released: a release then wakes the
  /// I/O thread (otherwise releases cost no system call).
  std::atomic<bool> starved{false};
  std::shared_ptr<release_hub> hub;
};

class delivery_receipt {
 public:
  delivery_receipt() = default;
  /// Charges `bytes` to `account` until the receipt is released or destroyed.
  delivery_receipt(std::shared_ptr<delivery_account> account, uint64_t bytes);
  delivery_receipt(delivery_receipt&& o) noexcept;
  delivery_receipt& operator=(delivery_receipt&& o) noexcept;
  delivery_receipt(const delivery_receipt&) = delete;
  delivery_receipt& operator=(const delivery_receipt&) = delete;
  ~delivery_receipt() { release(); }

  /// Gives the bytes back now (idempotent).
  void release();
  uint64_t bytes() const { return account_ ? bytes_ : 0; }

 private:
  std::shared_ptr<delivery_account> account_;
  uint64_t bytes_ = 0;
};

/// Inside a handlers::on_message call (on the endpoint's I/O thread): the receipt of the message
/// being delivered, which then stays charged until the returned receipt is released. Elsewhere,
/// or taken twice, an empty receipt.
delivery_receipt take_delivery_receipt();

namespace detail {
/// Makes `r` the receipt take_delivery_receipt() hands out on this thread while it lives.
class receipt_scope {
 public:
  explicit receipt_scope(delivery_receipt& r);
  ~receipt_scope();
  receipt_scope(const receipt_scope&) = delete;
  receipt_scope& operator=(const receipt_scope&) = delete;

 private:
  delivery_receipt* previous_;
};
}  // namespace detail

}  // namespace mesh::transport
