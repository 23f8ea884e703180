#include "gpu/cpu_thread_pool.hpp"

namespace mesh::gpu {
namespace {

/// True on a thread while it runs a part: a run() from there does its parts itself (the workers
/// are busy with the outer run, and waiting for them would deadlock).
thread_local bool inside_part = false;

/// One spin-wait step: the pause hint lets the sibling hyper-thread run and saves power.
inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/// Spin steps (a few microseconds) before a thread sleeps: an executor's ops follow each other
/// closely, and a condition-variable wake-up costs tens of microseconds, as much as a small op.
constexpr int spin_steps = 1 << 12;

}  // namespace

thread_pool::thread_pool(unsigned threads) {
  for (unsigned i = 1; i < threads; ++i) workers_.emplace_back([this, i] { work(i); });
}

thread_pool::~thread_pool() {
  {
    std::lock_guard lock(m_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void thread_pool::take_parts() {
  const bool outer = inside_part;
  inside_part = true;
  for (int64_t p = next_.fetch_add(1, std::memory_order_relaxed); p < parts_; p = next_.fetch_add(1, std::memory_order_relaxed)) fn_(ctx_, p);
  inside_part = outer;
}

void thread_pool::run_erased(int64_t parts, part_fn fn, void* ctx) {
  if (parts <= 0) return;
  std::unique_lock busy(busy_, std::try_to_lock);
  if (parts == 1 || workers_.empty() || inside_part || !busy.owns_lock()) {
    for (int64_t p = 0; p < parts; ++p) fn(ctx, p);
    return;
  }
  fn_ = fn;
  ctx_ = ctx;
  parts_ = parts;
  next_.store(0, std::memory_order_relaxed);
  unfinished_.store(static_cast<unsigned>(workers_.size()), std::memory_order_relaxed);
  {
    std::lock_guard lock(m_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  take_parts();
  // Every worker must have left the job before run() returns: `ctx` lives on the caller's stack.
  for (int s = 0; s < spin_steps && unfinished_.load(std::memory_order_acquire) != 0; ++s) relax();
  if (unfinished_.load(std::memory_order_acquire) != 0) {
    std::unique_lock lock(m_);
    done_.wait(lock, [&] { return unfinished_.load(std::memory_order_acquire) == 0; });
  }
}

void thread_pool::work(unsigned) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t now = generation_.load(std::memory_order_acquire);
    for (int s = 0; s < spin_steps && now == seen; ++s) {
      relax();
      now = generation_.load(std::memory_order_acquire);
    }
    if (now == seen) {
      std::unique_lock lock(m_);
      wake_.wait(lock, [&] { return stop_ || generation_.load(std::memory_order_acquire) != seen; });
      if (stop_) return;
      now = generation_.load(std::memory_order_acquire);
    }
    seen = now;
    take_parts();
    if (unfinished_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard lock(m_);  // the caller checks its predicate under m_: no lost wake-up
      done_.notify_one();
    }
  }
}

}  // namespace mesh::gpu
