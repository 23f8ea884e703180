#pragma once
/// A meshnode: the actor system of one node. CAF stays behind this header (node.cpp, node_shell.hpp
/// and the actors' files).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "graph/validate.hpp"

namespace mesh {

namespace transport {
class state_dir_lock;
}

struct node_config {
  std::filesystem::path state_dir;     ///< identity (node.key) and the endpoint file live here
  /// The lock on state_dir when the caller took it already (meshnode does, before it writes the
  /// mesh token there); none: run_node takes it.
  std::shared_ptr<transport::state_dir_lock> state_lock;
  std::vector<uint8_t> mesh_secret;    ///< empty = the open LAN mesh
  std::string mesh_id;                 ///< published in mDNS; empty = mesh_id_of(mesh_secret)
  std::string bind = "0.0.0.0";
  uint16_t port = 0;                   ///< 0 = any free port (written to <state_dir>/endpoint)
  std::vector<std::string> peers;      ///< static peers, "nodeid@host:port"
  bool mdns = true;                    ///< announce and browse with mDNS (avahi-daemon)
  /// All-reduce pieces to ring neighbours on this host through shared memory
  /// (train_engine::set_shared_memory); off: always through the transport.
  bool shared_memory = true;
  std::string device = "auto";         ///< auto | cpu | vulkan | a device name substring
  std::string log_level = "info";
  std::chrono::milliseconds heartbeat{250};
  std::chrono::milliseconds dead_after{2500};
  int max_restarts = 5;                           ///< of the executor, within restart_window
  std::chrono::milliseconds restart_window{30000};
  graph_limits limits;
  /// The most memory decoding one message from a peer may allocate (decoding is also bounded by
  /// a fixed multiple of the message's size, wire/codec.hpp); the transport's per-peer receive
  /// budget has the same default.
  size_t decode_budget = size_t{4} << 30;

  /// Checkpoints (GGUF files, Hugging Face directories) loaded at start, served under their file
  /// names (docs/serving.md).
  std::vector<std::string> models;
  /// Where the OpenAI-compatible HTTP API, the dashboard and /metrics listen, HOST:PORT; "off":
  /// nowhere. The default (loopback, 8080) moves to a free port when 8080 is taken; an address
  /// given explicitly (api_bind_explicit) must be free or the node does not start.
  std::string api_bind = "127.0.0.1:8080";
  bool api_bind_explicit = false;
  std::string api_key;  ///< bearer key the API asks for (--api-key-file); empty: none
  /// Bound of the blob cache, <state_dir>/blobs: checkpoint files fetched from peers for the
  /// stages this node holds (docs/serving.md); least recently used evicted past it.
  uint64_t blob_cache_bytes = uint64_t{32} << 30;
  /// Requests each served model runs at once (local_backend_options::parallel).
  int64_t parallel = 4;
};

/// Runs a node until `stop` becomes true (SIGINT/SIGTERM in meshnode) or its supervisor gives up.
/// Returns the process exit code: 0 after a clean stop, non-zero when the node could not start or
/// its children crashed more often than the restart budget allows. `crash_executor`, when set
/// to true, makes the executor crash (a simulated device loss, used by tests via SIGUSR1).
int run_node(const node_config& config, std::atomic<bool>& stop, std::atomic<bool>& crash_executor);

/// The node id (hex) of the identity in `state_dir`, creating the identity if needed.
expected<std::string> node_identity_string(const std::filesystem::path& state_dir);

/// "id@host:port" -> (id, "host:port"), or an error naming the expected form.
expected<std::pair<std::string, std::string>> parse_peer(const std::string& text);

}  // namespace mesh
