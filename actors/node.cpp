// A node's start-up: its identity and state-directory lock, the device measured, the endpoint
// and discovery, then the actor system with the supervisor over the node's actors
// (node_shell.hpp lists them, one file each). The pure logic lives in job_engine, train_engine
// and health_monitor; the actors only move messages between them, the endpoint and the device.
#include "actors/node.hpp"

#include <caf/all.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <fcntl.h>
#include <sys/file.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string_view>
#include <thread>
#include <unistd.h>
#include <utility>

#include "actors/node_shell.hpp"
#include "discovery/backend.hpp"
#include "discovery/static_peer.hpp"
#include "transport/mesh_id.hpp"
#include "wire/messages.hpp"
#include "gpu/executor.hpp"
#include "gpu/memory_probe.hpp"
#include "models/stage_plan.hpp"
#include "graph/builder.hpp"
#include "serving/access.hpp"
#include "serving/server.hpp"
#include "transport/endpoint.hpp"
#include "transport/state_dir.hpp"

namespace mesh {

using namespace node_shell;

namespace {

/// How a client on this machine reaches a node bound to `bind`: that address, or loopback when
/// the node listens on every address.
std::string local_address_of(const std::string& bind) {
  if (bind.empty() || bind == "0.0.0.0") return "127.0.0.1";
  if (bind == "::") return "[::1]";
  if (bind.find(':') != std::string::npos && bind.front() != '[') return "[" + bind + "]";
  return bind;
}

}  // namespace

namespace node_shell {

expected<std::unique_ptr<gpu::executor>> make_device(const std::string& choice) {
  if (choice == "cpu") return gpu::make_cpu_executor();
  gpu::vulkan_options o;
  if (choice != "auto" && choice != "vulkan") o.device = choice;
  // Nothing in the node reads per-kernel GPU times, and the timestamps between kernels cost a
  // decode step 10-15% on the H100 (docs/models.md).
  o.kernel_timestamps = false;
  // MESH_MAP_DEVICE_MEMORY=off: tensors move through staging and copy commands even where device
  // memory is host-visible (lavapipe, ReBAR), as on a discrete GPU; the tests run that path so.
  if (const char* v = std::getenv("MESH_MAP_DEVICE_MEMORY"); v && std::string_view(v) == "off") o.map_device_memory = false;
  auto v = gpu::make_vulkan_executor(o);
  if (v || choice != "auto") return v;
  spdlog::warn("no Vulkan device ({}); using the CPU executor", v.error().message);
  return gpu::make_cpu_executor();
}

}  // namespace node_shell

namespace {

/// The HTTP API on `cfg.api_bind` over `models`. The default address falls back to a free port
/// when its port is taken (several nodes on one machine); an address the user chose does not.
expected<std::unique_ptr<serving::api_server>> start_api(const node_config& cfg, serving::local_backend& models,
                                                        serving::snapshot_source snapshot) {
  auto bind = serving::parse_bind_address(cfg.api_bind);
  if (!bind) return make_error(bind.error().code, "--api-bind: " + bind.error().message);
  serving::server_options o;
  o.bind = *bind;
  o.api_key = cfg.api_key;
  o.snapshot = std::move(snapshot);
  auto s = serving::api_server::start(models, o);
  if (s || cfg.api_bind_explicit) return s;
  spdlog::info("HTTP API: {} ({}); taking a free port instead", cfg.api_bind, s.error().message);
  o.bind.port = 0;
  return serving::api_server::start(models, o);
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
  std::shared_ptr<transport::state_dir_lock> lock = cfg.state_lock;
  if (!lock || lock->dir() != cfg.state_dir) {
    auto taken = transport::state_dir_lock::take(cfg.state_dir);
    if (!taken) {
      spdlog::critical("{}", taken.error().message);
      return 2;
    }
    lock = std::move(*taken);
  }
  // Measure the device before joining, so the first hello carries real speeds.
  msg::hello own;
  own.incarnation = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  device_slot first_device;
  std::shared_ptr<gpu::memory_probe> memory;
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
    memory = gpu::make_memory_probe(info);
    first_device = std::make_shared<std::unique_ptr<gpu::executor>>(std::move(*dev));
  }

  // The endpoint's callbacks run on its I/O thread: they only post to the bridge actor.
  // Events that arrive before the bridge exists (a peer may dial as soon as the port is bound)
  // wait in `early` and are replayed when the supervisor installs the bridge.
  auto bridge_mutex = std::make_shared<std::mutex>();
  auto slots = std::make_shared<node_shell::inbound_slots>();
  auto early = std::make_shared<std::vector<std::function<void(const caf::actor&)>>>();
  // Arguments are moved into the message: an inbound bulk message is not copied on the I/O thread.
  const auto post = [bridge_mutex, slots, early](auto... xs) {
    std::lock_guard<std::mutex> lock(*bridge_mutex);
    if (slots->bridge) caf::anon_send(slots->bridge, std::move(xs)...);
    else early->push_back([... xs = std::move(xs)](const caf::actor& bridge) { caf::anon_send(bridge, xs...); });
  };
  transport::handlers h;
  h.on_peer_up = [post](const node_id& id, const transport::peer_info&) { post(up_atom::value, id); };
  h.on_peer_down = [post](const node_id& id, const transport::peer_down& why) {
    post(down_atom::value, id, why.reason, why.orderly);
  };
  h.on_message = [post, bridge_mutex, slots](const node_id& id, transport::channel ch, std::vector<uint8_t> bytes) {
    // The message's bytes stay charged to the peer's receive budget until the actor that owns
    // it has handled it (node_shell::message_ptr): a member that sends faster than this node
    // handles is held back by flow control instead of filling the mailboxes.
    if (ch != transport::channel::heartbeat)
      return post(inbound_atom::value, id, std::move(bytes), std::make_shared<transport::delivery_receipt>(transport::take_delivery_receipt()));
    // A heartbeat datagram (at most a QUIC packet) goes to the health actor, which runs on a
    // thread of its own: it never waits behind a large message the bridge is decoding, nor for
    // a scheduler thread. One that comes before the health actor exists is dropped (they may be lost).
    std::lock_guard<std::mutex> lock(*bridge_mutex);
    if (slots->health) caf::anon_send(slots->health, inbound_atom::value, id, std::move(bytes));
  };
  h.on_connect_failed = [](const std::optional<node_id>& id, const std::string& addr, const std::string& why) {
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
  const node_id self_id = (*ep)->id();
  // Where meshctl on this machine finds the node: the bound address, or loopback for a wildcard.
  const auto endpoint_file = cfg.state_dir / "endpoint";
  {
    std::ofstream f(endpoint_file);
    f << self_id.to_string() << "@" << local_address_of(cfg.bind) << ":" << (*ep)->port() << "\n";
  }
  spdlog::info("meshnode {} on port {}: {} ({}), {:.2f} GFLOP/s, {:.2f} GB/s", self_id.short_string(), (*ep)->port(),
               own.device_name, to_string(own.device), own.gflops, own.mem_gbps);
  spdlog::info("device memory: {} free of {} (by {})", models::format_bytes(static_cast<int64_t>(memory->free_bytes())),
               models::format_bytes(static_cast<int64_t>(own.memory_bytes)), gpu::to_string(memory->source()));

  // mDNS and the configured peers say where peers may be; only heartbeats say whether they are
  // alive. Both backends call this on their own threads; dial() only posts to the I/O thread.
  transport::endpoint* epp = ep->get();
  const auto on_discovery = [epp](const char* source, discovery::event e) {
    using k = discovery::event;
    switch (e.k) {
      case k::peer_found:
      case k::peer_updated:
      case k::peer_still_announced: {  // dialing a connected peer is a no-op
        auto id = node_id::parse(e.peer.node_id);
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
  const discovery::announcement ann{self_id.to_string(), cfg.mesh_id.empty() ? transport::mesh_id_of(cfg.mesh_secret) : cfg.mesh_id, msg::protocol_version, (*ep)->port(),
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

  // The model host: generation for meshctl and the HTTP API, each model on an executor of its
  // own. Declared before the actor system, so it outlives the actors that use it, and after the
  // endpoint, which its callbacks send through.
  serving::local_backend_options host_options;
  host_options.make_executor = [device = cfg.device] { return make_device(device); };
  host_options.parallel = cfg.parallel;
  auto host = serving::local_backend::create(std::move(host_options));
  if (!host) {
    spdlog::critical("models: {}", host.error().message);
    (*ep)->stop();
    return 2;
  }
  for (const auto& path : cfg.models) {
    serving::local_model_options o;
    o.path = path;
    spdlog::info("loading model {}", path);
    (*host)->load_async(o, [path](expected<serving::model_info> m) {
      if (m) spdlog::info("model {} loaded from {} ({} layers, context {})", m->id, path, m->layers, m->context);
      else spdlog::error("model {} not loaded: {}", path, m.error().message);
    });
  }
  // The HTTP side reads the mesh from this board, which the status actor refreshes.
  auto board = std::make_shared<mesh_board>();
  std::unique_ptr<serving::api_server> api;
  std::string api_url;
  if (cfg.api_bind != "off") {
    auto started = start_api(cfg, **host, [board] { return board->get(); });
    if (!started) {
      spdlog::critical("HTTP API: {}", started.error().message);
      (*ep)->stop();
      return 2;
    }
    api = std::move(*started);
    const auto& h = api->host();
    api_url = fmt::format("http://{}:{}", h.find(':') != std::string::npos ? "[" + h + "]" : h, api->port());
    spdlog::info("HTTP API, dashboard and metrics on {}", api_url);
  }
  const auto api_file = cfg.state_dir / "api";
  {
    std::ofstream f(api_file);
    f << api_url << "\n";
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
  ctx->models = host->get();
  ctx->board = board;
  ctx->api_url = api_url;
  ctx->memory = std::make_shared<generation::free_memory>(self_id, [memory] { return memory->free_bytes(); });
  ctx->offers = std::make_shared<blobs::blob_offers>(self_id.short_string());
  ctx->fetcher = std::make_shared<blobs::blob_fetcher>([raw = ctx.get()](const node_id& to, const msg::message& m) { return try_send_peer(*raw, to, m); });
  // Without a cache (its directory cannot be made), stages need their own copies of checkpoints,
  // and training workers can read a data file only on the node that offers it.
  if (auto b = blobs::blob_store::open(cfg.state_dir / "blobs", cfg.blob_cache_bytes)) ctx->blobs = *b;
  else spdlog::warn("no blob cache: {}; split-model stages need their own copy of the file", b.error().message);
  auto sup = spawn_supervisor(sys, context_ptr(ctx), bridge_mutex, slots, early, first_device);

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
    *slots = {};
  }
  if (api) api->stop();  // its requests end before the host goes
  if (statics) statics->stop();
  if (mdns) mdns->stop();  // withdraw the announcement first, so peers see us leave
  (*ep)->stop();
  std::error_code removed;
  std::filesystem::remove(endpoint_file, removed);  // meshctl then says no node runs here
  std::filesystem::remove(api_file, removed);
  return code;
}

}  // namespace mesh

