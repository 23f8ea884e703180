#include "transport/delivery_receipt.hpp"

#include <utility>

namespace mesh::transport {

namespace {
thread_local delivery_receipt* current_receipt = nullptr;
}

delivery_receipt::delivery_receipt(std::shared_ptr<delivery_account> account, uint64_t bytes)
    : account_(std::move(account)), bytes_(bytes) {
  if (account_) account_->held += bytes_;
}

delivery_receipt::delivery_receipt(delivery_receipt&& o) noexcept
    : account_(std::move(o.account_)), bytes_(std::exchange(o.bytes_, 0)) {}

delivery_receipt& delivery_receipt::operator=(delivery_receipt&& o) noexcept {
  if (this != &o) {
    release();
    account_ = std::move(o.account_);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void delivery_receipt::release() {
  if (!account_) return;
  auto account = std::move(account_);
  account->held -= std::exchange(bytes_, 0);
  if (!account->starved.load() || !account->hub) return;
  std::lock_guard lock(account->hub->mu);
  if (account->hub->wake) account->hub->wake();
}

delivery_receipt take_delivery_receipt() {
  if (!current_receipt) return {};
  return std::move(*current_receipt);
}

namespace detail {
receipt_scope::receipt_scope(delivery_receipt& r) : previous_(current_receipt) { current_receipt = &r; }
receipt_scope::~receipt_scope() { current_receipt = previous_; }
}  // namespace detail

}  // namespace mesh::transport
