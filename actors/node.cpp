// The actor system of a node: a supervisor with two children, the node core (transport bridge,
// membership, health, job engine, status) and the executor (the device). The pure logic lives in
// job_engine and health_monitor; these actors only move messages between them, the endpoint and
// the device.
#include "actors/node.hpp"

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <unistd.h>

#include "actors/health.hpp"
#include "discovery/backend.hpp"
#include "discovery/peer_exchange.hpp"
#include "transport/mesh_id.hpp"
#include "actors/job_engine.hpp"
#include "actors/messages.hpp"
#include "actors/restart_budget.hpp"
#include "actors/train_engine.hpp"
#include "gpu/executor.hpp"
#include "graph/builder.hpp"
#include "transport/endpoint.hpp"

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<mesh::stage_task>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<mesh::expected<mesh::tensor_map>>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<mesh::msg::message>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<mesh::train_task>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<mesh::expected<mesh::train_work_result>>)

namespace mesh {
namespace {

using tick_atom = caf::atom_constant<caf::atom("tick")>;
using beat_atom = caf::atom_constant<caf::atom("beat")>;
using inbound_atom = caf::atom_constant<caf::atom("inbound")>;
using up_atom = caf::atom_constant<caf::atom("up")>;
using down_atom = caf::atom_constant<caf::atom("down")>;
using run_atom = caf::atom_constant<caf::atom("run")>;
using done_atom = caf::atom_constant<caf::atom("done")>;
using crash_atom = caf::atom_constant<caf::atom("crash")>;
using executor_atom = caf::atom_constant<caf::atom("executor")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;

mono_time now_mono() { return std::chrono::steady_clock::now().time_since_epoch(); }

/// "host:port" for dialing, with IPv6 literals in brackets.
std::string host_port(const std::string& address, uint16_t port) {
  return address.find(':') != std::string::npos ? "[" + address + "]:" + std::to_string(port)
                                                : address + ":" + std::to_string(port);
}

/// The device this node offers, made once at start (the executor actor re-creates it on restart).
expected<std::unique_ptr<gpu::executor>> make_device(const std::string& choice) {
  if (choice == "cpu") return gpu::make_cpu_executor();
  gpu::vulkan_options o;
  if (choice != "auto" && choice != "vulkan") o.device = choice;
  auto v = gpu::make_vulkan_executor(o);
  if (v || choice != "auto") return v;
  spdlog::warn("no Vulkan device ({}); using the CPU executor", v.error().message);
  return gpu::make_cpu_executor();
}

/// A short micro-benchmark: matmul GFLOP/s and elementwise GB/s, best of a few runs, so plans
/// use this device's real speed.
void measure(gpu::executor& ex, msg::hello& h) {
  const auto best_seconds = [&](const graph& g, const tensor_map& in) {
    auto p = ex.load(g);
    if (!p) return -1.0;
    double best = 1e9;
    for (int i = 0; i < 4; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      if (!ex.run(*p, in)) return -1.0;
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  const int64_t n = 128, m = 1 << 18;
  builder b;
  auto a = b.input("a", dtype::f32, {n, n});
  b.output("c", matmul(a, a));
  const double mm = best_seconds(*b.finish(), {{"a", tensor::zeros(dtype::f32, {n, n})}});
  builder e;
  auto x = e.input("x", dtype::f32, {m});
  e.output("y", x + x * 2.0);
  const double ew = best_seconds(*e.finish(), {{"x", tensor::zeros(dtype::f32, {m})}});
  h.gflops = mm > 0 ? 2.0 * n * n * n / mm / 1e9 : 0.001;
  h.mem_gbps = ew > 0 ? 8.0 * m / ew / 1e9 : 0.001;
}

// ---- executor actor: owns the device, runs one stage at a time ----

struct executor_state {
  std::unique_ptr<gpu::executor> device;
  std::set<std::string> resident;  ///< inference-session parameter sets already on the device
};

/// The device measured at start, handed to the first executor so the node opens it once; a
/// restarted executor opens a fresh one (the slot is empty by then).
using device_slot = std::shared_ptr<std::unique_ptr<gpu::executor>>;

caf::behavior executor_actor(caf::stateful_actor<executor_state>* self, std::string choice, caf::actor core,
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
        auto& ex = *self->state.device;
        auto result = std::make_shared<expected<tensor_map>>([&]() -> expected<tensor_map> {
          auto p = ex.load(*t->g);
          if (!p) return tl::unexpected(p.error());
          // A session's parameters are uploaded once and stay resident; one-shot jobs bring theirs.
          if (t->resident_key.empty() || !self->state.resident.count(t->resident_key)) {
            if (auto ok = ex.set_parameters(t->params); !ok) return tl::unexpected(ok.error());
            if (!t->resident_key.empty()) self->state.resident.insert(t->resident_key);
          }
          return ex.run(*p, t->inputs);
        }());
        self->send(core, done_atom::value, t, result);
      },
      [=](run_atom, std::shared_ptr<train_task> t) {
        auto result = std::make_shared<expected<train_work_result>>(t->work(*self->state.device));
        self->send(core, done_atom::value, t, result);
      },
      [=](crash_atom) {
        spdlog::error("executor: simulated device loss");
        self->quit(caf::make_error(caf::sec::runtime_error, "simulated device loss"));
      },
  };
}

// ---- node core: transport bridge, membership, health, jobs, status ----

struct peer_entry {
  bool hello_seen = false;
  msg::hello info;
  uint32_t running_stages = 0;
};

struct core_state {
  transport::endpoint* ep = nullptr;
  std::string self_id;
  std::unique_ptr<job_engine> engine;
  std::unique_ptr<train_engine> trainer;
  std::unique_ptr<health_monitor> health;
  msg::hello own;
  std::map<std::string, peer_entry> peers;
  caf::actor executor;
  std::map<const stage_task*, std::shared_ptr<stage_task>> in_flight;
  std::map<const train_task*, std::shared_ptr<train_task>> train_in_flight;
  uint64_t beat_seq = 0;
  int restarts = 0;
  mono_time started{};
};

using core_actor_t = caf::stateful_actor<core_state>;

void send_to(core_actor_t* self, const std::string& to, const msg::message& m);

void dispatch(core_actor_t* self, std::vector<outbound> out) {
  for (auto& o : out) send_to(self, o.to, o.m);
}

void run_ready(core_actor_t* self) {
  for (auto& t : self->state.engine->take_ready()) {
    auto task = std::make_shared<stage_task>(std::move(t));
    self->state.in_flight[task.get()] = task;
    self->send(self->state.executor, run_atom::value, task);
  }
  for (auto& t : self->state.trainer->take_ready()) {
    auto task = std::make_shared<train_task>(std::move(t));
    self->state.train_in_flight[task.get()] = task;
    self->send(self->state.executor, run_atom::value, task);
  }
}

void handle(core_actor_t* self, const std::string& from, const msg::message& m) {
  auto& st = self->state;
  if (auto* h = std::get_if<msg::hello>(&m)) {
    auto& p = st.peers[from];
    p.hello_seen = true;
    p.info = *h;
    if (!h->is_client) {
      st.health->add_peer(from, h->incarnation, now_mono());
      st.engine->peer_up(from, {from, h->gflops, h->mem_gbps, 1.0, static_cast<int64_t>(h->memory_bytes)});
      st.trainer->peer_up(from);
      spdlog::info("peer {} joined: {} ({:.1f} GFLOP/s)", from.substr(0, 8), h->device_name, h->gflops);
      // Peer exchange: tell the newcomer where the other members are.
      std::vector<discovery::peer_info> members;
      for (const auto& [id, p] : st.peers) {
        if (id == from || !p.hello_seen || p.info.is_client) continue;
        auto nid = transport::node_id::parse(id);
        auto stats = nid ? st.ep->stats(*nid) : std::nullopt;
        if (!stats) continue;
        const auto colon = stats->remote_address.rfind(':');
        if (colon == std::string::npos) continue;
        std::string host = stats->remote_address.substr(0, colon);
        if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
        discovery::peer_info info;
        info.node_id = id;
        info.addresses = {host};
        info.port = static_cast<uint16_t>(std::atoi(stats->remote_address.c_str() + colon + 1));
        members.push_back(std::move(info));
      }
      if (!members.empty()) send_to(self, from, msg::peer_exchange{discovery::encode_pex(members)});
    }
    return;
  }
  if (auto* px = std::get_if<msg::peer_exchange>(&m)) {
    auto entries = discovery::decode_pex(px->pex);
    if (!entries) {
      spdlog::warn("bad peer exchange from {}: {}", from.substr(0, 8), entries.error().message);
      return;
    }
    for (const auto& e : *entries) {
      if (e.node_id == st.self_id || st.peers.count(e.node_id)) continue;
      auto nid = transport::node_id::parse(e.node_id);
      if (!nid) continue;
      std::vector<std::string> addrs;
      for (const auto& a : e.addresses) addrs.push_back(host_port(a, e.port));
      spdlog::info("peer exchange: {} told us of {}", from.substr(0, 8), e.node_id.substr(0, 8));
      st.ep->dial(*nid, addrs);
    }
    return;
  }
  if (auto* hb = std::get_if<msg::heartbeat>(&m)) {
    st.peers[from].running_stages = hb->running_stages;
    for (auto& tr : st.health->on_heartbeat(from, hb->incarnation, now_mono()))
      spdlog::info("peer {}: {} -> {}", tr.peer.substr(0, 8), to_string(tr.from), to_string(tr.to));
    return;
  }
  if (auto* rq = std::get_if<msg::status_request>(&m)) {
    msg::status_reply r;
    r.id = rq->id;
    r.node = st.self_id;
    r.device = st.own.device_name + " (" + st.own.device_kind + ")";
    r.gflops = st.own.gflops;
    r.uptime_s = std::chrono::duration<double>(now_mono() - st.started).count();
    for (const auto& [id, p] : st.peers) {
      if (!p.hello_seen || p.info.is_client) continue;
      msg::peer_status ps;
      ps.node = id;
      ps.health = to_string(st.health->state(id));
      ps.device = p.info.device_name;
      ps.gflops = p.info.gflops;
      ps.running_stages = p.running_stages;
      if (auto nid = transport::node_id::parse(id))
        if (auto s = st.ep->stats(*nid)) {
          ps.address = s->remote_address;
          ps.rtt_ms = std::chrono::duration<double, std::milli>(s->smoothed_rtt).count();
        }
      r.peers.push_back(ps);
    }
    r.jobs = st.engine->jobs();
    for (auto& j : st.trainer->jobs()) r.jobs.push_back(std::move(j));
    send_to(self, from, r);
    return;
  }
  dispatch(self, st.engine->on_message(from, m));
  dispatch(self, st.trainer->on_message(from, m));
  run_ready(self);
}

void send_to(core_actor_t* self, const std::string& to, const msg::message& m) {
  auto& st = self->state;
  if (to == st.self_id) {  // our own stages and results: through the mailbox, like any message
    self->send(self, inbound_atom::value, st.self_id, std::make_shared<msg::message>(m));
    return;
  }
  auto id = transport::node_id::parse(to);
  auto bytes = msg::encode_message(m);
  if (!id || !bytes) return;
  // Heartbeats as datagrams; large payloads (tensors, fragments) on their own bulk streams so they
  // never delay small messages; everything else, in order, on the control stream.
  constexpr size_t bulk_threshold = 64 << 10;
  const auto ch = std::holds_alternative<msg::heartbeat>(m) ? transport::channel::heartbeat
                  : bytes->size() > bulk_threshold          ? transport::channel::bulk
                                                            : transport::channel::control;
  if (auto ok = st.ep->send(*id, ch, std::move(*bytes)); !ok)
    spdlog::warn("send {} to {}: {}", msg::kind_name(m), to.substr(0, 8), ok.error().message);
}

void peer_gone(core_actor_t* self, const std::string& id, const std::string& why) {
  auto& st = self->state;
  auto it = st.peers.find(id);
  if (it == st.peers.end()) return;
  const bool worker = it->second.hello_seen && !it->second.info.is_client;
  st.peers.erase(it);
  st.health->remove_peer(id);
  if (worker) spdlog::warn("peer {} is gone ({}); re-planning its work", id.substr(0, 8), why);
  dispatch(self, st.engine->peer_dead(id));
  dispatch(self, st.trainer->peer_dead(id));
  run_ready(self);
}

caf::behavior core_actor(core_actor_t* self, transport::endpoint* ep, msg::hello own, node_config cfg) {
  auto& st = self->state;
  st.ep = ep;
  st.self_id = ep->id().to_string();
  st.own = own;
  st.started = now_mono();
  health_config hc;
  hc.heartbeat_interval = cfg.heartbeat;
  hc.dead_after = cfg.dead_after;
  hc.min_suspect_silence = 3 * cfg.heartbeat;
  st.health = std::make_unique<health_monitor>(hc);
  st.engine = std::make_unique<job_engine>(st.self_id, device_profile{st.self_id, own.gflops, own.mem_gbps, 1.0,
                                                                      static_cast<int64_t>(own.memory_bytes)},
                                           cfg.limits);
  st.trainer = std::make_unique<train_engine>(st.self_id, cfg.limits);
  self->send(self, tick_atom::value);
  self->send(self, beat_atom::value);
  return {
      [=](executor_atom, caf::actor ex, int restarts) {
        auto& s = self->state;
        s.executor = ex;
        s.restarts = restarts;
        // Work the old executor had in hand is handed to the new one, not lost.
        for (auto& [key, task] : s.in_flight) self->send(ex, run_atom::value, task);
        // Training state lived on the lost device: this node leaves its runs, and the
        // coordinators set it up again from the current state.
        if (restarts > 0) {
          s.trainer->executor_restarted();
          auto lost = std::move(s.train_in_flight);
          s.train_in_flight.clear();
          for (auto& [key, task] : lost)
            dispatch(self, s.trainer->on_executed(*task, make_error(error_code::device, "the device was lost during the step")));
        }
      },
      [=](inbound_atom, std::string from, std::shared_ptr<msg::message> m) { handle(self, from, *m); },
      [=](inbound_atom, std::string from, std::vector<uint8_t> bytes) {
        auto m = msg::decode_message(bytes.data(), bytes.size());
        if (!m) {
          spdlog::warn("dropped a message from {}: {}", from.substr(0, 8), m.error().message);
          return;
        }
        handle(self, from, *m);
      },
      [=](up_atom, std::string id) { send_to(self, id, self->state.own); },
      [=](down_atom, std::string id, std::string why) { peer_gone(self, id, why); },
      [=](done_atom, std::shared_ptr<stage_task> t, std::shared_ptr<expected<tensor_map>> r) {
        auto& s = self->state;
        if (!s.in_flight.erase(t.get())) return;  // already handed to a restarted executor
        dispatch(self, s.engine->on_executed(*t, *r));
        run_ready(self);
      },
      [=](done_atom, std::shared_ptr<train_task> t, std::shared_ptr<expected<train_work_result>> r) {
        auto& s = self->state;
        if (!s.train_in_flight.erase(t.get())) return;  // given up when the executor restarted
        dispatch(self, s.trainer->on_executed(*t, std::move(*r)));
        run_ready(self);
      },
      [=](tick_atom) {
        auto& s = self->state;
        for (auto& tr : s.health->tick(now_mono())) {
          spdlog::info("peer {}: {} -> {}", tr.peer.substr(0, 8), to_string(tr.from), to_string(tr.to));
          if (tr.to == peer_health::dead) {
            if (auto id = transport::node_id::parse(tr.peer)) s.ep->disconnect(*id);
            peer_gone(self, tr.peer, "no heartbeats");
          }
        }
        self->delayed_send(self, std::chrono::milliseconds(50), tick_atom::value);
      },
      [=](beat_atom) {
        auto& s = self->state;
        msg::heartbeat hb{s.own.incarnation, ++s.beat_seq, static_cast<uint32_t>(s.engine->running_stages())};
        for (const auto& [id, p] : s.peers)
          if (p.hello_seen && !p.info.is_client) send_to(self, id, hb);
        self->delayed_send(self, cfg.heartbeat, beat_atom::value);
      },
      [=](stop_atom) { self->quit(); },
  };
}

// ---- supervisor: starts the children, restarts the executor within a budget ----

struct supervisor_state {
  caf::actor core, executor;
  std::unique_ptr<restart_budget> budget;
  int restarts = 0;
};

caf::behavior supervisor_actor(caf::stateful_actor<supervisor_state>* self, transport::endpoint* ep, msg::hello own,
                               node_config cfg, std::shared_ptr<std::mutex> core_mutex, std::shared_ptr<caf::actor> core_slot,
                               std::shared_ptr<std::vector<std::function<void(const caf::actor&)>>> early,
                               device_slot first_device) {
  auto& st = self->state;
  st.budget = std::make_unique<restart_budget>(cfg.max_restarts, cfg.restart_window);
  st.core = self->spawn<caf::monitored>(core_actor, ep, own, cfg);
  {
    std::lock_guard<std::mutex> lock(*core_mutex);
    *core_slot = st.core;
    for (auto& replay : *early) replay(st.core);
    early->clear();
  }
  const auto start_executor = [=] {
    auto& s = self->state;
    s.executor = self->spawn<caf::monitored + caf::detached>(executor_actor, cfg.device, s.core, first_device);
    self->send(s.core, executor_atom::value, s.executor, s.restarts);
  };
  start_executor();
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& s = self->state;
    if (dm.source == s.executor) {
      if (!s.budget->allow(now_mono())) {
        spdlog::critical("executor crashed {} times within {} s: stopping the node", cfg.max_restarts,
                         std::chrono::duration_cast<std::chrono::seconds>(cfg.restart_window).count());
        self->send_exit(s.core, caf::exit_reason::user_shutdown);
        self->quit(caf::make_error(caf::sec::runtime_error, "restart budget exhausted"));
        return;
      }
      ++s.restarts;
      spdlog::warn("executor stopped ({}); restart {} of {}", caf::to_string(dm.reason), s.restarts, cfg.max_restarts);
      start_executor();
    } else if (dm.source == s.core) {
      if (dm.reason)
        spdlog::critical("node core stopped: {}", caf::to_string(dm.reason));
      self->send_exit(s.executor, caf::exit_reason::user_shutdown);
      self->quit(dm.reason);
    }
  });
  return {
      [=](crash_atom) { self->send(self->state.executor, crash_atom::value); },
      [=](stop_atom) { self->send(self->state.core, stop_atom::value); },
  };
}

}  // namespace

expected<std::pair<std::string, std::string>> parse_peer(const std::string& text) {
  const auto at = text.find('@');
  if (at == std::string::npos || at == 0 || at + 1 >= text.size())
    return make_error(error_code::invalid_argument, "peer \"" + text + "\" must be NODEID@HOST:PORT");
  auto id = transport::node_id::parse(text.substr(0, at));
  if (!id) return make_error(error_code::invalid_argument, "peer \"" + text + "\": " + id.error().message);
  return std::make_pair(id->to_string(), text.substr(at + 1));
}

expected<std::string> node_identity_string(const std::filesystem::path& state_dir) {
  auto ident = transport::identity::load_or_create(state_dir);
  if (!ident) return tl::unexpected(ident.error());
  return ident->id().to_string();
}

int run_node(const node_config& cfg, std::atomic<bool>& stop, std::atomic<bool>& crash_executor) {
  auto ident = transport::identity::load_or_create(cfg.state_dir);
  if (!ident) {
    spdlog::critical("identity: {}", ident.error().message);
    return 2;
  }
  // Measure the device before joining, so the first hello carries real speeds.
  msg::hello own;
  own.incarnation = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  device_slot first_device;
  {
    auto dev = make_device(cfg.device);
    if (!dev) {
      spdlog::critical("device: {}", dev.error().message);
      return 2;
    }
    const auto& info = (*dev)->info();
    own.device_name = info.name;
    own.device_kind = info.kind;
    own.memory_bytes = info.memory_bytes;
    if (own.memory_bytes == 0)  // the CPU executor uses host memory
      own.memory_bytes = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
    measure(**dev, own);
    first_device = std::make_shared<std::unique_ptr<gpu::executor>>(std::move(*dev));
  }

  // The endpoint's callbacks run on its I/O thread: they only post to the node core.
  // Events that arrive before the node core exists (a peer may dial as soon as the port is bound)
  // wait in `early` and are replayed when the supervisor installs the core.
  auto core_mutex = std::make_shared<std::mutex>();
  auto core_slot = std::make_shared<caf::actor>();
  auto early = std::make_shared<std::vector<std::function<void(const caf::actor&)>>>();
  const auto post = [core_mutex, core_slot, early](auto... xs) {
    std::lock_guard<std::mutex> lock(*core_mutex);
    if (*core_slot) caf::anon_send(*core_slot, xs...);
    else early->push_back([xs...](const caf::actor& core) { caf::anon_send(core, xs...); });
  };
  transport::handlers h;
  h.on_peer_up = [post](const transport::node_id& id, const transport::peer_info&) { post(up_atom::value, id.to_string()); };
  h.on_peer_down = [post](const transport::node_id& id, const std::string& why) { post(down_atom::value, id.to_string(), why); };
  h.on_message = [post](const transport::node_id& id, transport::channel, std::vector<uint8_t> bytes) {
    post(inbound_atom::value, id.to_string(), std::move(bytes));
  };
  h.on_connect_failed = [](const std::optional<transport::node_id>& id, const std::string& addr, const std::string& why) {
    spdlog::warn("connection {} {} refused: {}", id ? id->short_string() : "?", addr, why);
  };
  h.on_log = [](const std::string& line) { spdlog::debug("transport: {}", line); };
  transport::endpoint_config ec;
  ec.id = *ident;
  ec.mesh_secret = cfg.mesh_secret;
  ec.bind = cfg.bind;
  ec.port = cfg.port;
  ec.protocol_version = msg::protocol_version;
  auto ep = transport::endpoint::start(ec, h);
  if (!ep) {
    spdlog::critical("transport: {}", ep.error().message);
    return 2;
  }
  const std::string self_id = (*ep)->id().to_string();
  {
    std::ofstream f(cfg.state_dir / "endpoint");
    f << self_id << "@127.0.0.1:" << (*ep)->port() << "\n";
  }
  spdlog::info("meshnode {} on port {}: {} ({}), {:.2f} GFLOP/s, {:.2f} GB/s", self_id.substr(0, 8), (*ep)->port(),
               own.device_name, own.device_kind, own.gflops, own.mem_gbps);

  // mDNS says where peers may be; only heartbeats say whether they are alive.
  std::unique_ptr<discovery::backend> mdns;
  if (cfg.mdns) {
    mdns = discovery::make_avahi_backend();
    discovery::announcement ann{self_id, transport::mesh_id_of(cfg.mesh_secret), msg::protocol_version, (*ep)->port(),
                                own.device_name.substr(0, 60)};
    transport::endpoint* epp = ep->get();
    auto started = mdns->start(ann, [epp](discovery::event e) {
      using k = discovery::event;
      switch (e.k) {
        case k::peer_found:
        case k::peer_updated: {
          auto id = transport::node_id::parse(e.peer.node_id);
          if (!id) return;
          std::vector<std::string> addrs;
          for (const auto& a : e.peer.addresses) addrs.push_back(host_port(a, e.peer.port));
          spdlog::debug("mDNS: found {} at {}", id->short_string(), addrs.empty() ? "?" : addrs.front());
          epp->dial(*id, addrs);
          break;
        }
        case k::foreign_peer: spdlog::info("mDNS: {} belongs to another mesh; not dialing it", e.peer.node_id.substr(0, 8)); break;
        case k::peer_rejected: spdlog::warn("mDNS: ignored an announcement: {}", e.detail); break;
        case k::backend_down: spdlog::warn("mDNS unavailable ({}); retrying. Peers given with --peer still work", e.detail); break;
        case k::backend_up: spdlog::info("mDNS: announcing and browsing"); break;
        default: break;
      }
    });
    if (!started) spdlog::warn("mDNS: {}", started.error().message);
  }

  caf::actor_system_config sys_cfg;
  // The work-sharing scheduler: idle workers block on a condition variable instead of polling.
  // With CAF's default work-stealing scheduler an idle node used 25% of a core (its workers spin
  // and sleep in short loops between the 50 ms ticks). Heavy work runs in the detached executor,
  // so two workers are enough.
  sys_cfg.set("scheduler.policy", caf::atom("sharing"));
  sys_cfg.set("scheduler.max-threads", size_t{2});
  caf::actor_system sys{sys_cfg};
  auto sup = sys.spawn(supervisor_actor, ep->get(), own, cfg, core_mutex, core_slot, early, first_device);
  for (const auto& p : cfg.peers) {
    auto parsed = parse_peer(p);
    if (!parsed) {
      spdlog::error("{}", parsed.error().message);
      continue;
    }
    (*ep)->dial(*transport::node_id::parse(parsed->first), {parsed->second});
  }

  int code = 0;
  caf::scoped_actor waiter{sys};
  waiter->monitor(sup);
  for (bool running = true; running;) {
    if (stop.load()) {
      spdlog::info("stopping: closing connections");
      waiter->send(sup, stop_atom::value);
      stop.store(false);
    }
    if (crash_executor.exchange(false)) waiter->send(sup, crash_atom::value);
    waiter->receive(
        [&](caf::down_msg& dm) {
          running = false;
          if (dm.reason) code = 3;
        },
        caf::after(std::chrono::milliseconds(100)) >> [] {});
  }
  {
    std::lock_guard<std::mutex> lock(*core_mutex);
    *core_slot = caf::actor{};
  }
  if (mdns) mdns->stop();  // withdraw the announcement first, so peers see us leave
  (*ep)->stop();
  return code;
}

}  // namespace mesh
