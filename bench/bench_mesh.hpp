#pragma once
/// The meshnode processes a training benchmark runs on (bench/node/bench_scaling.cpp,
/// bench/train/bench_finetune.cpp): n nodes on this host in an open mesh of their own (the
/// benchmarks measure training, not admission, and their client needs no token), node i on
/// device_of(i), the others told of the first; and a client of the first once it sees the others
/// healthy (30 s at most). A placement puts the nodes elsewhere than loopback (network namespaces:
/// bench/train/bench_shaped.cpp).
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "apps/local_mesh.hpp"
#include "client/client.hpp"

namespace mesh::bench {

struct local_training_mesh {
  std::vector<std::unique_ptr<app::node_process>> nodes;  ///< node i's state directory: <dir>/<prefix><i>
  std::unique_ptr<client> first;                          ///< connected to node 0
};

/// Where the nodes of a mesh run; by default all on loopback.
struct node_placement {
  /// Called on this thread before node i starts, and with i = n before the client connects: what
  /// it changes for the thread (setns into a network namespace) the node or the client inherits.
  std::function<void(int)> enter;
  /// Node i's --bind address (its endpoint then names it); empty: the default (loopback endpoint).
  std::function<std::string(int)> bind;
  /// false: the nodes never take all-reduce pieces through shared memory (--shared-memory off),
  /// so that nodes of this host in network namespaces exchange them over the links between them.
  bool shared_memory = true;
};

inline expected<local_training_mesh> start_training_mesh(const std::string& meshnode, const std::filesystem::path& dir,
                                                         const std::string& prefix, int n,
                                                         const std::function<std::string(int)>& device_of,
                                                         const node_placement& where = {}) {
  local_training_mesh m;
  std::string first;
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> args = {"--port", "0", "--device", device_of(i), "--mdns", "off", "--log-level", "info", "--open"};
    if (where.bind) args.insert(args.end(), {"--bind", where.bind(i)});
    if (!where.shared_memory) args.insert(args.end(), {"--shared-memory", "off"});
    if (i > 0) args.insert(args.end(), {"--peer", first});
    if (where.enter) where.enter(i);
    m.nodes.push_back(std::make_unique<app::node_process>(meshnode, dir / (prefix + std::to_string(i)), args));
    auto ep = m.nodes.back()->endpoint(std::chrono::seconds(120));
    if (!ep) return tl::unexpected(ep.error());
    if (i == 0) first = *ep;
  }
  if (where.enter) where.enter(n);
  auto c = client::connect(first);
  if (!c) return tl::unexpected(c.error());
  m.first = std::move(*c);
  for (int i = 0; i < 300; ++i) {
    auto st = m.first->status();
    size_t healthy = 0;
    if (st)
      for (const auto& p : st->peers) healthy += p.health == mesh::peer_health::healthy;
    if (healthy + 1 >= static_cast<size_t>(n)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return m;
}

/// With MESH_BENCH_KEEP=DIR in the environment: copies each node's log under `dir` (node.log of
/// every state directory; with MESH_TRAIN_TIMING=1 where each node's steps' time goes) into DIR
/// as <node>.log, before the caller removes `dir`.
inline void keep_node_logs(const std::filesystem::path& dir) {
  const char* keep = std::getenv("MESH_BENCH_KEEP");
  if (!keep || !*keep) return;
  std::error_code ec;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec))
    if (e.path().filename() == "node.log")
      std::filesystem::copy_file(e.path(), std::filesystem::path(keep) / (e.path().parent_path().filename().string() + ".log"),
                                 std::filesystem::copy_options::overwrite_existing, ec);
}

}  // namespace mesh::bench
