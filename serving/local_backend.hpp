#pragma once
/// Models loaded in this process, generating on one gpu::executor.
///
/// Each model is a checkpoint with its tokenizer, chat template and session. The executor takes
/// one caller at a time, so one worker thread runs every request, one at a time, in arrival
/// order; each model has a bounded queue (a request past it is refused with queue_full, which
/// the server answers with 429). Cancellation is checked at every token and before a queued
/// request starts.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/error.hpp"
#include "gpu/executor.hpp"
#include "serving/backend.hpp"

namespace mesh::serving {

struct local_model_options {
  std::filesystem::path path;  ///< a GGUF file or a Hugging Face directory
  /// The id clients name it by; empty: the file name without `.gguf` (the directory's name).
  std::string id;
  /// A chat template family by name ("chatml", "llama3", ...: models::chat_template_names());
  /// empty: recognised from the checkpoint's own template.
  std::string chat_template;
  int64_t context = 0;   ///< session_options::context (0: the model's, capped)
  size_t max_queued = 8; ///< requests waiting beside the one running
};

/// Counts since the backend started, for tests and metrics.
struct local_backend_stats {
  int64_t completed = 0;  ///< finished with a result
  int64_t cancelled = 0;
  int64_t failed = 0;
  int64_t completion_tokens = 0;
};

class local_backend final : public generation_backend {
 public:
  /// Loads every model on `ex` (which must outlive the backend) and starts the worker. The first
  /// model that fails to load is the error (naming its path), and nothing is served.
  static expected<std::unique_ptr<local_backend>> create(gpu::executor& ex, std::vector<local_model_options> models);

  /// Stops the worker: the request running is cancelled, queued ones fail with no_capacity.
  ~local_backend() override;

  std::vector<model_info> models() const override;
  backend_queue queue() const override;
  result<std::shared_ptr<request_handle>> start(generation_request request, generation_callbacks callbacks) override;

  local_backend_stats stats() const;

 private:
  struct model;
  struct job;
  local_backend() = default;
  void run();
  void execute(job& j);

  std::vector<std::unique_ptr<model>> models_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<job>> queue_;
  bool running_ = false;  ///< a job is executing (guarded by mutex_)
  std::atomic<bool> stopping_{false};  ///< set under mutex_ (the worker waits on it), read without
  local_backend_stats stats_;
  std::thread worker_;
};

}  // namespace mesh::serving
