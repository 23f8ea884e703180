// The actor system of a node: a supervisor over the bridge (endpoint events in), membership,
// health, jobs, status and the executor (the device). The pure logic lives in job_engine,
// train_engine and health_monitor; these actors only move messages between them, the endpoint
// and the device.
#include "actors/node.hpp"

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include <fcntl.h>
#include <sys/file.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <unistd.h>
#include <utility>

#include "actors/health.hpp"
#include "actors/refusal_log.hpp"
#include "actors/held_messages.hpp"
#include "discovery/backend.hpp"
#include "discovery/peer_exchange.hpp"
#include "discovery/static_peer.hpp"
#include "transport/mesh_id.hpp"
#include "actors/job_engine.hpp"
#include "wire/messages.hpp"
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

// Types that travel between the node's actors inside this process (never on the wire).
namespace mesh::node_types {

/// What every actor of the node needs to know about it; fixed for the node's lifetime.
struct node_context {
  transport::endpoint* ep = nullptr;
  std::string self_id;
  msg::hello own;
  node_config cfg;
  mono_time started{};
  std::shared_ptr<refusal_log> refusals = std::make_shared<refusal_log>();
};
using context_ptr = std::shared_ptr<const node_context>;

struct node_actors {
  caf::actor bridge, membership, health, jobs, status;
};
using actors_ptr = std::shared_ptr<const node_actors>;

using member_map = std::map<std::string, msg::hello>;  ///< peers that said hello, clients included
using members_ptr = std::shared_ptr<const member_map>;

struct peer_vitals {
  peer_health health = peer_health::unknown;
  uint32_t running_stages = 0;
};
using vitals_map = std::map<std::string, peer_vitals>;
using vitals_ptr = std::shared_ptr<const vitals_map>;

}  // namespace mesh::node_types

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(mesh::node_types::actors_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(mesh::node_types::members_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(mesh::node_types::vitals_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<const std::vector<mesh::msg::job_status>>)

namespace mesh {
namespace {

using namespace node_types;

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
using wire_atom = caf::atom_constant<caf::atom("wire")>;
using add_atom = caf::atom_constant<caf::atom("add")>;
using remove_atom = caf::atom_constant<caf::atom("remove")>;
using load_atom = caf::atom_constant<caf::atom("load")>;
using view_atom = caf::atom_constant<caf::atom("view")>;
using greet_atom = caf::atom_constant<caf::atom("greet")>;
using forget_atom = caf::atom_constant<caf::atom("forget")>;

mono_time now_mono() { return std::chrono::steady_clock::now().time_since_epoch(); }

/// "host:port" for dialing, with IPv6 literals in brackets.
std::string host_port(const std::string& address, uint16_t port) {
  return address.find(':') != std::string::npos ? "[" + address + "]:" + std::to_string(port)
                                                : address + ":" + std::to_string(port);
}

/// The announced addresses (mDNS, peer exchange) as "host:port", those the endpoint's socket can
/// reach only: mDNS also reports a peer's IPv6 addresses to an IPv4-only node, and each dial of
/// one was a failure and a warning on every start.
std::vector<std::string> reachable(const transport::endpoint& ep, const std::vector<std::string>& addresses, uint16_t port) {
  std::vector<std::string> out;
  for (const auto& a : addresses)
    if (auto hp = host_port(a, port); ep.can_reach(hp)) out.push_back(std::move(hp));
  return out;
}

/// How a client on this machine reaches a node bound to `bind`: that address, or loopback when
/// the node listens on every address.
std::string local_address_of(const std::string& bind) {
  if (bind.empty() || bind == "0.0.0.0") return "127.0.0.1";
  if (bind == "::") return "[::1]";
  if (bind.find(':') != std::string::npos && bind.front() != '[') return "[" + bind + "]";
  return bind;
}

/// An exclusive lock on `<state dir>/lock` for as long as the node runs (flock: released by the
/// kernel when the process ends, even by SIGKILL, so a crashed node never blocks its restart).
class state_dir_lock {
 public:
  static expected<state_dir_lock> take(const std::filesystem::path& dir) {
    const auto path = dir / "lock";
    state_dir_lock l;
    l.fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (l.fd_ < 0) return make_error(error_code::io_error, "cannot open " + path.string() + ": " + std::strerror(errno));
    if (::flock(l.fd_, LOCK_EX | LOCK_NB) != 0) {
      std::ifstream f(path);
      std::string pid;
      std::getline(f, pid);
      return make_error(error_code::invalid_argument, "another meshnode" + (pid.empty() ? std::string() : " (pid " + pid + ")") +
                                                          " is running with state dir " + dir.string() +
                                                          "; give this one its own --state-dir");
    }
    const std::string pid = std::to_string(::getpid()) + "\n";
    if (::ftruncate(l.fd_, 0) == 0 && ::write(l.fd_, pid.data(), pid.size()) < 0) {
      // the pid is only for the message above; the lock holds without it
    }
    return l;
  }
  state_dir_lock(state_dir_lock&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  state_dir_lock& operator=(state_dir_lock&&) = delete;
  ~state_dir_lock() {
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  state_dir_lock() = default;
  int fd_ = -1;
};

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

/// The device measured at start, handed to the first executor so the node opens it once; a
/// restarted executor opens a fresh one (the slot is empty by then).
using device_slot = std::shared_ptr<std::unique_ptr<gpu::executor>>;

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
        self->send(jobs, done_atom::value, t, result);
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
        self->send(jobs, done_atom::value, t, result);
      },
      [=](crash_atom) {
        spdlog::error("executor: simulated device loss");
        self->quit(caf::make_error(caf::sec::runtime_error, "simulated device loss"));
      },
  };
}

// ---- the node's long-lived actors ----
//
// bridge      endpoint events in: decodes every message and routes it to the actor that owns it
// membership  who is in the mesh (hellos), peer exchange; tells health and jobs who came and went
// health      heartbeats in and out, phi-accrual; a Dead peer is disconnected and reported
// jobs        the job coordinators and workers (job_engine) and training (train_engine); runs
//             stages on the executor
// status      answers status requests from the views of membership, health and jobs
//
// They refer to each other, so the supervisor spawns them all and then sends each the handles.

/// Sends `m` to a peer (not to this node). The endpoint is thread-safe: any actor may send.
/// False when the peer is not connected (nothing was sent); other failures are logged.
bool try_send_peer(const node_context& ctx, const std::string& to, const msg::message& m) {
  auto id = transport::node_id::parse(to);
  auto bytes = msg::encode_message(m);
  if (!id || !bytes) return true;  // nothing that could ever be sent
  if (!ctx.ep->connected(*id)) return false;
  // Heartbeats as datagrams (they wait for nothing); large payloads (tensors, fragments) on bulk
  // streams of their own, small ones on the control stream. The peer's application sees both in
  // the order sent: a small message sent after a large one waits for it.
  const auto ch = std::holds_alternative<msg::heartbeat>(m) ? transport::channel::heartbeat
                  : bytes->size() > msg::max_control_message ? transport::channel::bulk
                                                             : transport::channel::control;
  if (auto ok = ctx.ep->send(*id, ch, std::move(*bytes)); !ok)
    spdlog::warn("send {} to {}: {}", msg::kind_name(m), to.substr(0, 8), ok.error().message);
  return true;
}

void send_peer(const node_context& ctx, const std::string& to, const msg::message& m) {
  if (!try_send_peer(ctx, to, m)) spdlog::warn("send {} to {}: the peer is not connected", msg::kind_name(m), to.substr(0, 8));
}

using message_ptr = std::shared_ptr<msg::message>;

// ---- bridge ----

struct bridge_state {
  node_actors a;
};

caf::behavior bridge_actor(caf::stateful_actor<bridge_state>* self, context_ptr ctx) {
  return {
      [=](wire_atom, actors_ptr a) { self->state.a = *a; },
      [=](up_atom, std::string id) {
        send_peer(*ctx, id, ctx->own);  // our hello comes first
        self->send(self->state.a.membership, greet_atom::value, id, 1);  // and is repeated if theirs does not come
      },
      [=](down_atom, std::string id, std::string why, bool orderly) {
        self->send(self->state.a.membership, down_atom::value, id, why, orderly);
      },
      [=](inbound_atom, std::string from, std::vector<uint8_t>& bytes) {
        auto m = msg::decode_message(bytes.data(), bytes.size(), ctx->cfg.decode_budget);
        // The decoded message owns copies of everything: the buffer goes back to the endpoint,
        // which receives the next large message into it (no fresh pages for the kernel to zero).
        ctx->ep->recycle(std::move(bytes));
        if (!m) {
          // Another protocol version, past the budget, malformed: refused, logged and counted
          // (meshctl peers shows the count and the last reason); the connection stays.
          spdlog::warn("refused a message from {}: {}", from.substr(0, 8), m.error().to_string());
          ctx->refusals->record(from, m.error().to_string());
          return;
        }
        const auto& a = self->state.a;
        const caf::actor& owner = std::holds_alternative<msg::hello>(*m) || std::holds_alternative<msg::peer_exchange>(*m) ? a.membership
                                  : std::holds_alternative<msg::heartbeat>(*m)                                             ? a.health
                                  : std::holds_alternative<msg::status_request>(*m)                                        ? a.status
                                                                                                                           : a.jobs;
        self->send(owner, inbound_atom::value, from, std::make_shared<msg::message>(std::move(*m)));
      },
  };
}

// ---- membership ----


struct membership_state {
  node_actors a;
  member_map peers;
};

/// Tells the newcomer `to` where the other members are (peer exchange).
void send_peer_exchange(const node_context& ctx, const member_map& peers, const std::string& to) {
  std::vector<discovery::peer_info> members;
  for (const auto& [id, hello] : peers) {
    if (id == to || hello.is_client) continue;
    auto nid = transport::node_id::parse(id);
    auto stats = nid ? ctx.ep->stats(*nid) : std::nullopt;
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
  if (!members.empty()) send_peer(ctx, to, msg::peer_exchange{discovery::encode_pex(members)});
}

caf::behavior membership_actor(caf::stateful_actor<membership_state>* self, context_ptr ctx) {
  return {
      [=](wire_atom, actors_ptr a) { self->state.a = *a; },
      [=](inbound_atom, std::string from, message_ptr m) {
        auto& st = self->state;
        if (auto* h = std::get_if<msg::hello>(m.get())) {
          if (h->answer_me) send_peer(*ctx, from, ctx->own);
          auto known = st.peers.find(from);
          if (known != st.peers.end() && known->second.incarnation == h->incarnation) return;  // a repeat
          st.peers[from] = *h;
          if (h->is_client) return;
          self->send(st.a.health, add_atom::value, from, h->incarnation);
          self->send(st.a.jobs, up_atom::value, from, m);
          spdlog::info("peer {} joined: {} ({:.1f} GFLOP/s)", from.substr(0, 8), h->device_name, h->gflops);
          send_peer_exchange(*ctx, st.peers, from);
        } else if (auto* px = std::get_if<msg::peer_exchange>(m.get())) {
          // Only members (workers that said hello) tell us where others are: a client, or a
          // connection that has not introduced itself, cannot make this node dial addresses of
          // its choosing. The endpoint bounds the dials under way as well.
          auto sender = st.peers.find(from);
          if (sender == st.peers.end() || sender->second.is_client) {
            spdlog::warn("ignored a peer exchange from {}: not a member of this mesh", from.substr(0, 8));
            return;
          }
          auto entries = discovery::decode_pex(px->pex);
          if (!entries) {
            spdlog::warn("bad peer exchange from {}: {}", from.substr(0, 8), entries.error().message);
            return;
          }
          for (const auto& e : *entries) {
            if (e.node_id == ctx->self_id || st.peers.count(e.node_id)) continue;
            auto nid = transport::node_id::parse(e.node_id);
            if (!nid) continue;
            auto addrs = reachable(*ctx->ep, e.addresses, e.port);
            if (addrs.empty()) continue;  // only addresses of a family our socket cannot use
            spdlog::info("peer exchange: {} told us of {}", from.substr(0, 8), e.node_id.substr(0, 8));
            ctx->ep->dial(*nid, addrs);
          }
        }
      },
      // A peer came up `tries` seconds ago and its hello has not arrived: ask for it, once a
      // second, for as long as the connection lasts (at most 30 times).
      [=](greet_atom, std::string id, int tries) {
        if (self->state.peers.count(id) || tries > 30) return;
        auto nid = transport::node_id::parse(id);
        if (!nid || !ctx->ep->connected(*nid)) return;  // gone: its next connection starts over
        if (tries > 1) {
          msg::hello again = ctx->own;
          again.answer_me = true;
          send_peer(*ctx, id, again);
          spdlog::info("no hello from {} yet: asked again", id.substr(0, 8));
        }
        self->delayed_send(self, std::chrono::seconds(1), greet_atom::value, id, tries + 1);
      },
      // The connection closed, or health declared the peer Dead.
      [=](down_atom, std::string id, std::string why, bool orderly) {
        auto& st = self->state;
        auto it = st.peers.find(id);
        if (it == st.peers.end()) return;
        const bool worker = !it->second.is_client;
        st.peers.erase(it);
        if (worker) {
          // A peer that was stopped (or closed the connection on purpose) is no surprise; one
          // that failed is. The transport tells them apart by the close code.
          if (orderly)
            spdlog::info("peer {} left ({})", id.substr(0, 8), why);
          else
            spdlog::warn("peer {} is gone ({}); re-planning its work", id.substr(0, 8), why);
          self->send(st.a.health, remove_atom::value, id);
        }
        self->send(st.a.jobs, down_atom::value, id, why);
      },
      [=](view_atom) { return std::make_shared<const member_map>(self->state.peers); },
  };
}

// ---- health ----


struct health_state {
  node_actors a;
  std::unique_ptr<health_monitor> monitor;
  std::map<std::string, uint32_t> load;  ///< running stages each peer reported
  uint32_t own_load = 0;
  uint64_t beat_seq = 0;
};

void log_transition(const health_transition& tr) {
  spdlog::info("peer {}: {} -> {}", tr.peer.substr(0, 8), to_string(tr.from), to_string(tr.to));
}

caf::behavior health_actor(caf::stateful_actor<health_state>* self, context_ptr ctx) {
  health_config hc;
  hc.heartbeat_interval = ctx->cfg.heartbeat;
  hc.dead_after = ctx->cfg.dead_after;
  hc.min_suspect_silence = 3 * ctx->cfg.heartbeat;
  self->state.monitor = std::make_unique<health_monitor>(hc);
  self->send(self, tick_atom::value);
  self->send(self, beat_atom::value);
  return {
      [=](wire_atom, actors_ptr a) { self->state.a = *a; },
      [=](add_atom, std::string id, uint64_t incarnation) { self->state.monitor->add_peer(id, incarnation, now_mono()); },
      [=](remove_atom, std::string id) {
        self->state.monitor->remove_peer(id);
        self->state.load.erase(id);
      },
      [=](load_atom, uint32_t running) { self->state.own_load = running; },
      [=](inbound_atom, std::string from, message_ptr m) {
        auto* hb = std::get_if<msg::heartbeat>(m.get());
        if (!hb) return;
        self->state.load[from] = hb->running_stages;
        for (auto& tr : self->state.monitor->on_heartbeat(from, hb->incarnation, now_mono())) log_transition(tr);
      },
      [=](tick_atom) {
        auto& st = self->state;
        for (auto& tr : st.monitor->tick(now_mono())) {
          log_transition(tr);
          if (tr.to != peer_health::dead) continue;
          if (auto id = transport::node_id::parse(tr.peer)) ctx->ep->disconnect(*id);
          self->send(st.a.membership, down_atom::value, tr.peer, std::string("no heartbeats"), false);
        }
        self->delayed_send(self, std::chrono::milliseconds(50), tick_atom::value);
      },
      [=](beat_atom) {
        auto& st = self->state;
        const msg::heartbeat hb{ctx->own.incarnation, ++st.beat_seq, st.own_load};
        for (const auto& id : st.monitor->peers())
          if (st.monitor->state(id) != peer_health::dead) send_peer(*ctx, id, hb);
        self->delayed_send(self, ctx->cfg.heartbeat, beat_atom::value);
      },
      [=](view_atom) {
        auto& st = self->state;
        auto v = std::make_shared<vitals_map>();
        for (const auto& id : st.monitor->peers()) (*v)[id] = {st.monitor->state(id), st.load.count(id) ? st.load.at(id) : 0};
        return vitals_ptr(std::move(v));
      },
  };
}

// ---- jobs: coordinators and workers of one-shot jobs, sessions and training ----

struct jobs_state {
  node_actors a;
  std::unique_ptr<job_engine> engine;
  std::unique_ptr<train_engine> trainer;
  caf::actor executor;
  std::map<const stage_task*, std::shared_ptr<stage_task>> in_flight;
  std::map<const train_task*, std::shared_ptr<train_task>> train_in_flight;
  uint32_t reported_load = 0;
  /// Messages to peers this node is not connected to (yet, or again): held, in order, until the
  /// peer's hello or until it is connected again, dropped when it is reported down or after
  /// held_ttl. A node joining a training ring learns of its neighbours by peer exchange and may
  /// finish its first step before it has dialed them; a node restarted after a crash is back in a
  /// ring (its coordinator saw its hello) before its neighbours have seen it. What is produced for
  /// a peer after its down was handled (a result for a client that left, a stage_done for a dead
  /// coordinator) has nobody to flush it: the age limit frees it, so it cannot fill the store.
  held_messages held{4096, size_t{256} << 20, std::chrono::seconds(30)};  // all-reduce pieces are MiBs
};

using jobs_actor_t = caf::stateful_actor<jobs_state>;

void send_to(jobs_actor_t* self, const node_context& ctx, const std::string& to, const msg::message& m) {
  auto& st = self->state;
  if (to == ctx.self_id) {  // our own stages and results: through the mailbox, like any message
    self->send(self, inbound_atom::value, ctx.self_id, std::make_shared<msg::message>(m));
    return;
  }
  const auto send = [&](const msg::message& x) { return try_send_peer(ctx, to, x); };
  if (st.held.holds(to)) {
    // Connected again without a hello (a client reconnecting): what waits goes first, in order.
    auto id = transport::node_id::parse(to);
    if (id && ctx.ep->connected(*id) && st.held.flush(to, send) && send(m)) return;
  } else if (send(m)) {
    return;
  }
  auto bytes = msg::encode_message(m);  // only for its size: this path is rare
  const size_t size = bytes ? bytes->size() : 0;
  if (!st.held.hold(to, m, size, std::chrono::steady_clock::now()))
    spdlog::warn("send {} to {}: not connected, and {} messages ({} MiB) already wait for peers; dropped",
                 msg::kind_name(m), to.substr(0, 8), st.held.count(), st.held.bytes() >> 20);
}

void dispatch(jobs_actor_t* self, const node_context& ctx, std::vector<outbound> out) {
  for (auto& o : out) send_to(self, ctx, o.to, o.m);
}

/// Hands ready stages to the executor and tells health our load (heartbeats carry it).
void run_ready(jobs_actor_t* self) {
  auto& st = self->state;
  for (auto& t : st.engine->take_ready()) {
    auto task = std::make_shared<stage_task>(std::move(t));
    st.in_flight[task.get()] = task;
    self->send(st.executor, run_atom::value, task);
  }
  // Session fragments the engine let go: after the stages sent above (the mailbox keeps order).
  for (auto& key : st.engine->take_forgotten()) self->send(st.executor, forget_atom::value, key);
  for (auto& t : st.trainer->take_ready()) {
    auto task = std::make_shared<train_task>(std::move(t));
    st.train_in_flight[task.get()] = task;
    self->send(st.executor, run_atom::value, task);
  }
  const auto load = static_cast<uint32_t>(st.engine->running_stages());
  if (load != st.reported_load && st.a.health) self->send(st.a.health, load_atom::value, load);
  st.reported_load = load;
}

caf::behavior jobs_actor(jobs_actor_t* self, context_ptr ctx) {
  auto& st = self->state;
  const auto& own = ctx->own;
  // Job ids start from this start's time in ms (shifted: a session's id is shifted 16 bits more in
  // its fragments' cache keys), so that a restarted node's jobs never reuse ids its peers knew.
  const auto ms = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  st.engine = std::make_unique<job_engine>(ctx->self_id, device_profile{ctx->self_id, own.gflops, own.mem_gbps, 1.0,
                                                                        static_cast<int64_t>(own.memory_bytes)},
                                           ctx->cfg.limits, (ms & ((uint64_t{1} << 40) - 1)) << 8);
  st.trainer = std::make_unique<train_engine>(ctx->self_id, ctx->cfg.limits);
  self->send(self, tick_atom::value);
  return {
      [=](wire_atom, actors_ptr a) { self->state.a = *a; },
      [=](tick_atom) {  // time-driven decisions: a lost client's grace time, held messages' age
        const auto now = std::chrono::steady_clock::now();
        if (const size_t n = self->state.held.expire(now))
          spdlog::info("dropped {} messages that waited over {} s for peers that did not connect", n,
                       std::chrono::duration_cast<std::chrono::seconds>(self->state.held.ttl()).count());
        dispatch(self, *ctx, self->state.trainer->tick(now));
        self->delayed_send(self, std::chrono::seconds(1), tick_atom::value);
      },
      [=](executor_atom, caf::actor ex, int restarts) {
        auto& s = self->state;
        s.executor = ex;
        // Work the old executor had in hand is handed to the new one, not lost.
        for (auto& [key, task] : s.in_flight) self->send(ex, run_atom::value, task);
        // Training state lived on the lost device: this node leaves its runs, and the
        // coordinators set it up again from the current state.
        if (restarts > 0) {
          s.trainer->executor_restarted();
          auto lost = std::move(s.train_in_flight);
          s.train_in_flight.clear();
          for (auto& [key, task] : lost)
            dispatch(self, *ctx, s.trainer->on_executed(*task, make_error(error_code::device, "the device was lost during the step"), std::chrono::steady_clock::now()));
        }
      },
      [=](inbound_atom, std::string from, message_ptr m) {
        dispatch(self, *ctx, self->state.engine->on_message(from, *m, std::chrono::steady_clock::now()));
        dispatch(self, *ctx, self->state.trainer->on_message(from, *m, std::chrono::steady_clock::now()));
        run_ready(self);
      },
      [=](up_atom, std::string id, message_ptr m) {
        self->state.held.flush(id, [&](const msg::message& x) { return try_send_peer(*ctx, id, x); });
        const auto& h = std::get<msg::hello>(*m);
        self->state.engine->peer_up(id, {id, h.gflops, h.mem_gbps, 1.0, static_cast<int64_t>(h.memory_bytes)});
        self->state.trainer->peer_up(id);
      },
      [=](down_atom, std::string id, std::string) {
        self->state.held.take(id);  // it will not come back for them
        dispatch(self, *ctx, self->state.engine->peer_dead(id, std::chrono::steady_clock::now()));
        dispatch(self, *ctx, self->state.trainer->peer_dead(id, std::chrono::steady_clock::now()));
        run_ready(self);
      },
      [=](done_atom, std::shared_ptr<stage_task> t, std::shared_ptr<expected<tensor_map>> r) {
        if (!self->state.in_flight.erase(t.get())) return;  // already handed to a restarted executor
        dispatch(self, *ctx, self->state.engine->on_executed(*t, *r, std::chrono::steady_clock::now()));
        run_ready(self);
      },
      [=](done_atom, std::shared_ptr<train_task> t, std::shared_ptr<expected<train_work_result>> r) {
        if (!self->state.train_in_flight.erase(t.get())) return;  // given up when the executor restarted
        dispatch(self, *ctx, self->state.trainer->on_executed(*t, std::move(*r), std::chrono::steady_clock::now()));
        run_ready(self);
      },
      [=](view_atom) {
        const auto now = std::chrono::steady_clock::now();
        auto jobs = self->state.engine->jobs(now);
        for (auto& j : self->state.trainer->jobs(now)) jobs.push_back(std::move(j));
        return std::make_shared<const std::vector<msg::job_status>>(std::move(jobs));
      },
      [=](stop_atom) { self->quit(); },
  };
}

// ---- status: a snapshot of the node for meshctl and clients ----

struct status_state {
  node_actors a;
};

msg::status_reply make_status(const node_context& ctx, uint64_t id, const member_map& members, const vitals_map& vitals,
                              const std::vector<msg::job_status>& jobs) {
  msg::status_reply r;
  r.id = id;
  r.node = ctx.self_id;
  r.device = ctx.own.device_name + " (" + to_string(ctx.own.device) + ")";
  r.gflops = ctx.own.gflops;
  r.uptime_s = std::chrono::duration<double>(now_mono() - ctx.started).count();
  for (const auto& [peer, hello] : members) {
    if (hello.is_client) continue;
    msg::peer_status ps;
    ps.node = peer;
    auto v = vitals.find(peer);
    ps.health = v != vitals.end() ? v->second.health : peer_health::unknown;
    ps.running_stages = v != vitals.end() ? v->second.running_stages : 0;
    ps.device = hello.device_name;
    ps.gflops = hello.gflops;
    if (auto nid = transport::node_id::parse(peer))
      if (auto s = ctx.ep->stats(*nid)) {
        ps.address = s->remote_address;
        ps.rtt_ms = std::chrono::duration<double, std::milli>(s->smoothed_rtt).count();
        ps.packets_lost = s->packets_lost;
        ps.relayed = s->relayed;
      }
    const auto refused = ctx.refusals->of(peer);
    ps.refused = refused.count;
    ps.last_refusal = refused.last;
    r.peers.push_back(ps);
  }
  r.jobs = jobs;
  return r;
}

caf::behavior status_actor(caf::stateful_actor<status_state>* self, context_ptr ctx) {
  return {
      [=](wire_atom, actors_ptr a) { self->state.a = *a; },
      [=](inbound_atom, std::string from, message_ptr m) {
        auto* rq = std::get_if<msg::status_request>(m.get());
        if (!rq) return;
        const uint64_t id = rq->id;
        const auto& a = self->state.a;
        const auto failed = [from](caf::error& e) { spdlog::warn("status for {}: {}", from.substr(0, 8), caf::to_string(e)); };
        constexpr auto timeout = std::chrono::seconds(2);
        self->request(a.membership, timeout, view_atom::value).then([=](members_ptr members) {
          self->request(self->state.a.health, timeout, view_atom::value).then([=](vitals_ptr vitals) {
            self->request(self->state.a.jobs, timeout, view_atom::value).then([=](std::shared_ptr<const std::vector<msg::job_status>> jobs) {
              send_peer(*ctx, from, make_status(*ctx, id, *members, *vitals, *jobs));
            }, failed);
          }, failed);
        }, failed);
      },
  };
}

// ---- supervisor: starts the children; restarts the executor and the status actor within a
// budget; a crash of an actor that holds the node's state (bridge, membership, health, jobs)
// stops the node with a non-zero exit, for its own supervisor (systemd) to restart it whole ----

struct supervisor_state {
  node_actors a;
  caf::actor executor;
  std::unique_ptr<restart_budget> budget;
  int restarts = 0;
};

caf::behavior supervisor_actor(caf::stateful_actor<supervisor_state>* self, context_ptr ctx, std::shared_ptr<std::mutex> bridge_mutex,
                               std::shared_ptr<caf::actor> bridge_slot,
                               std::shared_ptr<std::vector<std::function<void(const caf::actor&)>>> early,
                               device_slot first_device) {
  auto& st = self->state;
  const auto& cfg = ctx->cfg;
  st.budget = std::make_unique<restart_budget>(cfg.max_restarts, cfg.restart_window);
  st.a.bridge = self->spawn<caf::monitored>(bridge_actor, ctx);
  st.a.membership = self->spawn<caf::monitored>(membership_actor, ctx);
  st.a.health = self->spawn<caf::monitored>(health_actor, ctx);
  st.a.jobs = self->spawn<caf::monitored>(jobs_actor, ctx);
  st.a.status = self->spawn<caf::monitored>(status_actor, ctx);
  const auto wire_all = [=] {
    auto handles = std::make_shared<const node_actors>(self->state.a);
    for (const auto& child : {handles->bridge, handles->membership, handles->health, handles->jobs, handles->status})
      self->send(child, wire_atom::value, handles);
  };
  wire_all();
  {
    // Endpoint events go to the bridge from now on; those that came early are replayed first.
    std::lock_guard<std::mutex> lock(*bridge_mutex);
    *bridge_slot = st.a.bridge;
    for (auto& replay : *early) replay(st.a.bridge);
    early->clear();
  }
  const auto start_executor = [=] {
    auto& s = self->state;
    s.executor = self->spawn<caf::monitored + caf::detached>(executor_actor, cfg.device, s.a.jobs, first_device);
    self->send(s.a.jobs, executor_atom::value, s.executor, s.restarts);
  };
  start_executor();
  const auto stop_all = [=](const caf::error& reason) {
    auto& s = self->state;
    for (const auto& child : {s.a.bridge, s.a.membership, s.a.health, s.a.jobs, s.a.status, s.executor})
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
        s.a.status = self->spawn<caf::monitored>(status_actor, ctx);
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

expected<std::pair<std::string, std::string>> parse_peer(const std::string& text) {
  auto p = discovery::parse_static_peer(text);
  if (!p) return tl::unexpected(p.error());
  if (p->node_id.empty())
    return make_error(error_code::invalid_argument, "peer \"" + text + "\" must be NODEID@HOST:PORT (meshnode --print-id shows a node's id)");
  return std::make_pair(p->node_id, text.substr(text.find('@') + 1));
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
  // One node per state directory: two would share one identity (peers would see one node id at
  // two addresses) and overwrite each other's endpoint file. The lock goes with the process,
  // however it ends.
  auto lock = state_dir_lock::take(cfg.state_dir);
  if (!lock) {
    spdlog::critical("{}", lock.error().message);
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
    own.device = device_kind_from(info.kind);
    own.memory_bytes = info.memory_bytes;
    if (own.memory_bytes == 0)  // the CPU executor uses host memory
      own.memory_bytes = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
    measure(**dev, own);
    first_device = std::make_shared<std::unique_ptr<gpu::executor>>(std::move(*dev));
  }

  // The endpoint's callbacks run on its I/O thread: they only post to the bridge actor.
  // Events that arrive before the bridge exists (a peer may dial as soon as the port is bound)
  // wait in `early` and are replayed when the supervisor installs the bridge.
  auto bridge_mutex = std::make_shared<std::mutex>();
  auto bridge_slot = std::make_shared<caf::actor>();
  auto early = std::make_shared<std::vector<std::function<void(const caf::actor&)>>>();
  // Arguments are moved into the message: an inbound bulk message is not copied on the I/O thread.
  const auto post = [bridge_mutex, bridge_slot, early](auto... xs) {
    std::lock_guard<std::mutex> lock(*bridge_mutex);
    if (*bridge_slot) caf::anon_send(*bridge_slot, std::move(xs)...);
    else early->push_back([... xs = std::move(xs)](const caf::actor& bridge) { caf::anon_send(bridge, xs...); });
  };
  transport::handlers h;
  h.on_peer_up = [post](const transport::node_id& id, const transport::peer_info&) { post(up_atom::value, id.to_string()); };
  h.on_peer_down = [post](const transport::node_id& id, const transport::peer_down& why) {
    post(down_atom::value, id.to_string(), why.reason, why.orderly);
  };
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
  // Where meshctl on this machine finds the node: the bound address, or loopback for a wildcard.
  const auto endpoint_file = cfg.state_dir / "endpoint";
  {
    std::ofstream f(endpoint_file);
    f << self_id << "@" << local_address_of(cfg.bind) << ":" << (*ep)->port() << "\n";
  }
  spdlog::info("meshnode {} on port {}: {} ({}), {:.2f} GFLOP/s, {:.2f} GB/s", self_id.substr(0, 8), (*ep)->port(),
               own.device_name, to_string(own.device), own.gflops, own.mem_gbps);

  // mDNS and the configured peers say where peers may be; only heartbeats say whether they are
  // alive. Both backends call this on their own threads; dial() only posts to the I/O thread.
  transport::endpoint* epp = ep->get();
  const auto on_discovery = [epp](const char* source, discovery::event e) {
    using k = discovery::event;
    switch (e.k) {
      case k::peer_found:
      case k::peer_updated: {
        auto id = transport::node_id::parse(e.peer.node_id);
        if (!id) return;
        auto addrs = reachable(*epp, e.peer.addresses, e.peer.port);
        if (addrs.empty()) {
          spdlog::debug("{}: {} has no address this node can reach yet", source, id->short_string());
          return;
        }
        spdlog::debug("{}: found {} at {}", source, id->short_string(), addrs.front());
        epp->dial(*id, addrs);
        break;
      }
      case k::foreign_peer: spdlog::info("{}: {} belongs to another mesh; not dialing it", source, e.peer.node_id.substr(0, 8)); break;
      case k::peer_rejected: spdlog::warn("{}: ignored an announcement: {}", source, e.detail); break;
      case k::backend_down: spdlog::warn("mDNS unavailable ({}); retrying. Peers given with --peer still work", e.detail); break;
      case k::backend_up: spdlog::info("{}: {}", source, e.detail.empty() ? "announcing and browsing" : e.detail); break;
      default: break;
    }
  };
  const discovery::announcement ann{self_id, transport::mesh_id_of(cfg.mesh_secret), msg::protocol_version, (*ep)->port(),
                                    own.device_name.substr(0, 60)};
  std::unique_ptr<discovery::backend> mdns, statics;
  if (cfg.mdns) {
    mdns = discovery::make_avahi_backend();
    auto started = mdns->start(ann, [on_discovery](discovery::event e) { on_discovery("mDNS", std::move(e)); });
    if (!started) spdlog::warn("mDNS: {}", started.error().message);
  }
  // --peer: dialed at once and again on a back-off for as long as the node runs, so a peer that
  // starts later or restarts is reached without restarting this node.
  if (!cfg.peers.empty()) {
    auto made = discovery::make_static_backend(cfg.peers);
    if (!made) {
      spdlog::critical("--peer: {}", made.error().message);
      (*ep)->stop();
      return 2;
    }
    statics = std::move(*made);
    auto started = statics->start(ann, [on_discovery](discovery::event e) { on_discovery("--peer", std::move(e)); });
    if (!started) spdlog::warn("--peer: {}", started.error().message);
  }

  caf::actor_system_config sys_cfg;
  // The work-sharing scheduler: idle workers block on a condition variable instead of polling.
  // With CAF's default work-stealing scheduler an idle node used 25% of a core (its workers spin
  // and sleep in short loops between the 50 ms ticks). Heavy work runs in the detached executor,
  // so two workers are enough.
  sys_cfg.set("scheduler.policy", caf::atom("sharing"));
  sys_cfg.set("scheduler.max-threads", size_t{2});
  caf::actor_system sys{sys_cfg};
  auto ctx = std::make_shared<node_context>();
  ctx->ep = ep->get();
  ctx->self_id = self_id;
  ctx->own = own;
  ctx->cfg = cfg;
  ctx->started = now_mono();
  auto sup = sys.spawn(supervisor_actor, context_ptr(ctx), bridge_mutex, bridge_slot, early, first_device);

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
    std::lock_guard<std::mutex> lock(*bridge_mutex);
    *bridge_slot = caf::actor{};
  }
  if (statics) statics->stop();
  if (mdns) mdns->stop();  // withdraw the announcement first, so peers see us leave
  (*ep)->stop();
  std::error_code removed;
  std::filesystem::remove(endpoint_file, removed);  // meshctl then says no node runs here
  return code;
}

}  // namespace mesh
