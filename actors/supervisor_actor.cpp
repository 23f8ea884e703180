// The supervisor: starts the node's children; restarts the executor and the status actor within a
// budget; a crash of an actor that holds the node's state (bridge, membership, health, jobs, generator)
// stops the node with a non-zero exit, for its own supervisor (systemd) to restart it whole.
#include "actors/node_shell.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "actors/restart_budget.hpp"

namespace mesh::node_shell {
namespace {

struct supervisor_state {
  node_actors a;
  caf::actor executor;
  std::unique_ptr<restart_budget> budget;
  int restarts = 0;
};

caf::behavior supervisor_actor(caf::stateful_actor<supervisor_state>* self, context_ptr ctx, std::shared_ptr<std::mutex> bridge_mutex,
                               std::shared_ptr<inbound_slots> slots, early_events early, device_slot first_device) {
  auto& st = self->state;
  const auto& cfg = ctx->cfg;
  st.budget = std::make_unique<restart_budget>(cfg.max_restarts, cfg.restart_window);
  st.a.bridge = spawn_bridge(*self, ctx);
  st.a.membership = spawn_membership(*self, ctx);
  st.a.health = spawn_health(*self, ctx);
  st.a.jobs = spawn_jobs(*self, ctx);
  st.a.status = spawn_status(*self, ctx);
  st.a.generator = spawn_generator(*self, ctx);
  const auto wire_all = [=] {
    auto handles = std::make_shared<const node_actors>(self->state.a);
    for (const auto& child : {handles->bridge, handles->membership, handles->health, handles->jobs, handles->status, handles->generator})
      self->send(child, wire_atom::value, handles);
  };
  wire_all();
  {
    // Endpoint events go to the bridge (heartbeats to health) from now on; those that came early
    // are replayed first.
    std::lock_guard<std::mutex> lock(*bridge_mutex);
    slots->bridge = st.a.bridge;
    slots->health = st.a.health;
    for (auto& replay : *early) replay(st.a.bridge);
    early->clear();
  }
  const auto start_executor = [=] {
    auto& s = self->state;
    s.executor = spawn_executor(*self, cfg.device, s.a.jobs, first_device);
    self->send(s.a.jobs, executor_atom::value, s.executor, s.restarts);
  };
  start_executor();
  const auto stop_all = [=](const caf::error& reason) {
    auto& s = self->state;
    for (const auto& child : {s.a.bridge, s.a.membership, s.a.health, s.a.jobs, s.a.status, s.a.generator, s.executor})
      self->send_exit(child, caf::exit_reason::user_shutdown);
    self->quit(reason);
  };
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& s = self->state;
    const bool restartable = dm.source == s.executor || dm.source == s.a.status;
    if (restartable && dm.reason != caf::make_error(caf::exit_reason::user_shutdown)) {
      const char* what = dm.source == s.executor ? "executor" : "status actor";
      if (!s.budget->allow(now_mono())) {
        spdlog::critical("children crashed {} times within {} s: stopping the node", cfg.max_restarts,
                         std::chrono::duration_cast<std::chrono::seconds>(cfg.restart_window).count());
        stop_all(caf::make_error(caf::sec::runtime_error, "restart budget exhausted"));
        return;
      }
      ++s.restarts;
      spdlog::warn("{} stopped ({}); restart {} of {}", what, caf::to_string(dm.reason), s.restarts, cfg.max_restarts);
      if (dm.source == s.executor) {
        start_executor();
      } else {
        s.a.status = spawn_status(*self, ctx);
        wire_all();
      }
      return;
    }
    if (dm.source == s.a.jobs && !dm.reason) {  // a clean stop
      stop_all(caf::error{});
      return;
    }
    spdlog::critical("node actor stopped: {}", caf::to_string(dm.reason));
    stop_all(dm.reason ? dm.reason : caf::make_error(caf::sec::runtime_error, "a node actor stopped"));
  });
  return {
      [=](crash_atom) { self->send(self->state.executor, crash_atom::value); },
      [=](stop_atom) { self->send(self->state.a.jobs, stop_atom::value); },
  };
}

}  // namespace

caf::actor spawn_supervisor(caf::actor_system& sys, context_ptr ctx, std::shared_ptr<std::mutex> bridge_mutex,
                            std::shared_ptr<inbound_slots> slots, early_events early, device_slot first_device) {
  return sys.spawn(supervisor_actor, std::move(ctx), std::move(bridge_mutex), std::move(slots), std::move(early),
                   std::move(first_device));
}

}  // namespace mesh::node_shell
