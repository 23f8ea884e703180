// The executor actor: owns the device and runs one stage (or training task) at a time, for the
// jobs actor. Spawned detached (device work blocks), restarted by the supervisor within its
// budget; the first one gets the device run_node measured.
#include "actors/node_shell.hpp"

#include <spdlog/spdlog.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gpu/executor.hpp"

namespace mesh::node_shell {
namespace {

/// Hands the executor's results to the jobs actor in the order their tasks ran. A training
/// task whose device still copies when it returns (train_work_result::copied) is waited for on a
/// thread of this object's, so that the executor goes on with the next task meanwhile (the copy
/// runs beside that task's kernels); the results after it wait their turn behind it.
class ordered_delivery {
 public:
  ordered_delivery() = default;
  ordered_delivery(const ordered_delivery&) = delete;
  ordered_delivery& operator=(const ordered_delivery&) = delete;
  /// Delivers what is queued (waiting for its copies), then stops the thread.
  ~ordered_delivery() {
    {
      std::lock_guard lock(m_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  /// Runs `deliver` now, on the caller's thread, when nothing is queued and it does not wait
  /// (`waits`: it blocks until a copy is done); else queues it behind the others.
  void post(std::function<void()> deliver, bool waits) {
    std::unique_lock lock(m_);
    if (!waits && queue_.empty() && !busy_) {
      lock.unlock();
      deliver();
      return;
    }
    queue_.push_back(std::move(deliver));
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    lock.unlock();
    cv_.notify_all();
  }

 private:
  void run() {
    std::unique_lock lock(m_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything delivered
      auto next = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      next();
      lock.lock();
      busy_ = false;
    }
  }

  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool busy_ = false, stopping_ = false;
  std::thread thread_;
};

struct executor_state {
  std::unique_ptr<gpu::executor> device;
  /// After `device`: destroyed before it, so the copies it waits for end first.
  ordered_delivery delivery;
  /// Session fragments resident on the device, by stage_task::resident_key: their program (loaded
  /// once) and their parameters (uploaded once), until the jobs actor says to forget them.
  struct resident_stage {
    gpu::program_id program = 0;
    std::vector<std::string> params;
  };
  std::map<std::string, resident_stage> resident;
  uint64_t one_shots = 0;  ///< numbers the parameter names of one-shot stages
};

/// Runs a one-shot stage on `ex` and leaves nothing behind: its parameters get names of their
/// own (a client's "mlp.0.w" must not meet another job's "mlp.0.w" of another shape, nor
/// overwrite resident training or session state of the same name), and its program and
/// parameters are freed after the run.
expected<tensor_map> run_one_shot(gpu::executor& ex, const stage_task& t, uint64_t number) {
  const std::string prefix = "one." + std::to_string(number) + ".";
  graph g = *t.g;
  for (auto& n : g.nodes)
    if (n.op == op_kind::parameter) n.attrs.name = prefix + n.attrs.name;
  tensor_map params;
  for (const auto& [name, value] : t.params) params[prefix + name] = value;
  auto p = ex.load(g);
  if (!p) {
    ex.drop_parameters(prefix);
    return tl::unexpected(p.error());
  }
  auto out = [&]() -> expected<tensor_map> {
    if (auto ok = ex.set_parameters(params); !ok) return tl::unexpected(ok.error());
    return ex.run(*p, t.inputs);
  }();
  ex.unload(*p);
  ex.drop_parameters(prefix);
  return out;
}

/// Runs a session stage: its program and parameters stay on the device for the next call.
expected<tensor_map> run_resident(executor_state& st, const stage_task& t) {
  auto& ex = *st.device;
  auto it = st.resident.find(t.resident_key);
  if (it == st.resident.end()) {
    if (auto ok = ex.set_parameters(t.params); !ok) return tl::unexpected(ok.error());
    auto p = ex.load(*t.g);
    if (!p) {
      for (const auto& [name, value] : t.params) ex.drop_parameters(name);
      return tl::unexpected(p.error());
    }
    executor_state::resident_stage r{*p, {}};
    for (const auto& [name, value] : t.params) r.params.push_back(name);
    it = st.resident.emplace(t.resident_key, std::move(r)).first;
  }
  return ex.run(it->second.program, t.inputs);
}

caf::behavior executor_actor(caf::stateful_actor<executor_state>* self, std::string choice, caf::actor jobs,
                             device_slot first) {
  auto dev = first && *first ? expected<std::unique_ptr<gpu::executor>>(std::move(*first)) : make_device(choice);
  if (!dev) {
    spdlog::error("executor: {}", dev.error().message);
    self->quit(caf::make_error(caf::sec::runtime_error, dev.error().message));
    return {};
  }
  self->state.device = std::move(*dev);
  return {
      [=](run_atom, std::shared_ptr<stage_task> t) {
        auto& st = self->state;
        auto result = std::make_shared<expected<tensor_map>>(t->resident_key.empty() ? run_one_shot(*st.device, *t, ++st.one_shots)
                                                                                     : run_resident(st, *t));
        st.delivery.post([jobs, t, result] { caf::anon_send(jobs, done_atom::value, t, result); }, false);
      },
      // The jobs actor let a session fragment go: free its program and parameters.
      [=](forget_atom, std::string key) {
        auto& st = self->state;
        auto it = st.resident.find(key);
        if (it == st.resident.end()) return;
        st.device->unload(it->second.program);
        const auto params = std::move(it->second.params);
        st.resident.erase(it);
        // A parameter of this fragment that another resident fragment (an earlier epoch or
        // another stage of the same session) still loads stays: drop_parameters keeps those.
        for (const auto& name : params) st.device->drop_parameters(name);
      },
      [=](run_atom, std::shared_ptr<train_task> t) {
        auto result = std::make_shared<expected<train_work_result>>(t->work(*self->state.device));
        const bool waits = *result && (*result)->copied;
        self->state.delivery.post(
            [jobs, t, result] {
              *result = finish_copies(std::move(*result));
              caf::anon_send(jobs, done_atom::value, t, result);
            },
            waits);
      },
      [=](crash_atom) {
        spdlog::error("executor: simulated device loss");
        self->quit(caf::make_error(caf::sec::runtime_error, "simulated device loss"));
      },
  };
}

}  // namespace

caf::actor spawn_executor(caf::local_actor& parent, std::string choice, caf::actor jobs, device_slot first) {
  return parent.spawn<caf::monitored + caf::detached>(executor_actor, std::move(choice), std::move(jobs), std::move(first));
}

}  // namespace mesh::node_shell
