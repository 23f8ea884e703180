#pragma once
/// The CPU executor's worker threads: started once, reused by every op (starting a std::thread
/// costs ~20 us, as much as a whole small op), woken for each parallel loop.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace mesh::gpu {

class thread_pool {
 public:
  /// `threads` in all, the calling thread counted: threads - 1 workers are started (none for 0 or 1).
  explicit thread_pool(unsigned threads);
  ~thread_pool();
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  /// Threads that take part in a run(), the caller included.
  unsigned size() const { return static_cast<unsigned>(workers_.size()) + 1; }

  /// Calls f(part) once for each part in [0, parts), spread over the workers and the calling
  /// thread (which takes parts too), and returns when every call has returned. Parts are handed
  /// out one at a time, so uneven parts balance. Allocates nothing. A call from inside a part (or
  /// from a second thread while one runs) runs its parts on the calling thread alone.
  template <class F>
  void run(int64_t parts, F&& f) {
    using fn = std::remove_reference_t<F>;
    run_erased(parts, [](void* ctx, int64_t part) { (*static_cast<fn*>(ctx))(part); }, const_cast<void*>(static_cast<const void*>(&f)));
  }

 private:
  using part_fn = void (*)(void*, int64_t);
  void run_erased(int64_t parts, part_fn fn, void* ctx);
  void work(unsigned index);
  void take_parts();

  std::vector<std::thread> workers_;
  std::mutex busy_;  ///< held by the thread whose run() owns the workers
  std::mutex m_;
  std::condition_variable wake_, done_;
  std::atomic<uint64_t> generation_{0};  ///< bumped for each run() that uses the workers
  bool stop_ = false;
  // The current job: written before generation_ is bumped, read by workers after they see it.
  part_fn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t parts_ = 0;
  std::atomic<int64_t> next_{0};         ///< the next part to hand out
  std::atomic<unsigned> unfinished_{0};  ///< workers still inside the current job
};

}  // namespace mesh::gpu
