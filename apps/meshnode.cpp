// meshnode: the daemon every machine of the mesh runs.
//
// Settings come from flags, a TOML file (--config) and MESH_* environment variables, with the
// same names: --state-dir / state_dir / MESH_STATE_DIR. A flag beats the environment, which beats
// the file, which beats the default.
#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <optional>
#include <set>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>
#include <toml++/toml.h>

#include "actors/node.hpp"
#include "app_settings.hpp"
#include "serving/access.hpp"
#include "transport/state_dir.hpp"

namespace {

std::atomic<bool> stop_requested{false};
std::atomic<bool> crash_requested{false};

extern "C" void on_stop(int) { stop_requested.store(true); }
extern "C" void on_usr1(int) { crash_requested.store(true); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"meshnode: a node of the peer-to-peer compute mesh"};
  std::string config_file, state_dir, secret_file, bind = "0.0.0.0", device = "auto", log_level = "info";
  int port = 7420, heartbeat_ms = 250, dead_after_ms = 2500;
  int64_t blob_cache_bytes = int64_t{32} << 30;
  int parallel = 4;
  double max_job_gflop = 10000;
  int64_t max_job_bytes = int64_t{16} << 30;
  std::vector<std::string> peers, models;
  std::string api_bind = "127.0.0.1:8080", api_key_file;
  bool print_id = false, open_mesh = false;
  std::string join_token;
  std::string mdns = "on", shared_memory = "on";
  app.add_option("--config", config_file, "TOML file with any of the settings below (same names, with _)")->envname("MESH_CONFIG");
  auto* o_state = app.add_option("--state-dir", state_dir, "identity and state directory")->envname("MESH_STATE_DIR");
  auto* o_secret = app.add_option("--secret-file", secret_file, "mesh secret (32 bytes or 64 hex chars) naming the mesh; by default the node "
                                  "uses the token kept in its state directory, or creates a new mesh")->envname("MESH_SECRET_FILE");
  auto* o_join = app.add_option("--join", join_token, "join the mesh of this token (`meshctl invite` on a member prints it); kept in the "
                                "state directory, so later starts need no flag")->envname("MESH_JOIN");
  auto* o_open = app.add_flag("--open", open_mesh, "an open mesh: no credential, any host that reaches this node becomes a member")->envname("MESH_OPEN");
  auto* o_bind = app.add_option("--bind", bind, "address to listen on")->envname("MESH_BIND");
  auto* o_port = app.add_option("--port", port, "UDP port (0 = any free port)")->envname("MESH_PORT");
  auto* o_peer = app.add_option("--peer", peers, "static peer NODEID@HOST:PORT (repeatable)")->envname("MESH_PEERS")->delimiter(',');
  auto* o_device = app.add_option("--device", device, "auto, cpu, vulkan, or a device name substring")->envname("MESH_DEVICE");
  auto* o_log = app.add_option("--log-level", log_level, "trace, debug, info, warn, error")->envname("MESH_LOG_LEVEL");
  auto* o_hb = app.add_option("--heartbeat-ms", heartbeat_ms, "heartbeat interval")->envname("MESH_HEARTBEAT_MS");
  auto* o_dead = app.add_option("--dead-after-ms", dead_after_ms, "silence after which a peer is dead")->envname("MESH_DEAD_AFTER_MS");
  auto* o_mdns = app.add_option("--mdns", mdns, "find peers on the LAN with mDNS: on or off")->envname("MESH_MDNS")->check(CLI::IsMember({"on", "off"}))->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  auto* o_shm = app.add_option("--shared-memory", shared_memory, "all-reduce pieces to peers on this host through shared memory "
                               "(on), or always through the network (off: e.g. nodes in network namespaces meant to see a shaped link)")
                    ->envname("MESH_SHARED_MEMORY")->check(CLI::IsMember({"on", "off"}))->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  auto* o_model = app.add_option("--model", models, "checkpoint to serve: a GGUF file or a Hugging Face directory (repeatable)")->envname("MESH_MODELS")->delimiter(',');
  auto* o_api = app.add_option("--api-bind", api_bind, "HOST:PORT of the OpenAI-compatible API, dashboard and metrics, or off (default 127.0.0.1:8080, another free port if taken)")->envname("MESH_API_BIND");
  auto* o_key = app.add_option("--api-key-file", api_key_file, "file with the bearer key the HTTP API asks for (none: no key)")->envname("MESH_API_KEY_FILE");
  auto* o_blobs = app.add_option("--blob-cache-bytes", blob_cache_bytes, "bound of the cache of checkpoint files fetched from peers "
                                 "(<state-dir>/blobs), least recently used evicted first (default 32 GiB)")->envname("MESH_BLOB_CACHE_BYTES");
  auto* o_parallel = app.add_option("--parallel", parallel, "requests each model runs at once, their decode steps batched together "
                                    "(each holds a KV cache of the model's context; default 4)")->envname("MESH_PARALLEL");
  auto* o_gflop = app.add_option("--max-job-gflop", max_job_gflop, "compute budget of one graph run a peer or client sends "
                                 "(GFLOP as the cost model counts them; default 10000)")->envname("MESH_MAX_JOB_GFLOP");
  auto* o_jbytes = app.add_option("--max-job-bytes", max_job_bytes, "memory budget of one graph run a peer or client sends "
                                  "(all its values together; default 16 GiB)")->envname("MESH_MAX_JOB_BYTES");
  app.add_flag("--print-id", print_id, "create the identity if needed, print the node id and exit");
  CLI11_PARSE(app, argc, argv);

  if (!config_file.empty()) {
    // The file fills only what neither a flag nor the environment set.
    toml::table t;
    try {
      t = toml::parse_file(config_file);
    } catch (const toml::parse_error& e) {
      std::cerr << "meshnode: " << config_file << ": " << e.description() << "\n";
      return 2;
    }
    // Every key must be one of the settings and of its type: a misspelt key or `port = "0"`
    // silently ignored would run the node with settings the user did not ask for.
    std::string bad;
    const auto complain = [&](const std::string& key, const char* want) {
      if (bad.empty()) bad = "'" + key + "' must be " + want;
    };
    const auto fill = [&](CLI::Option* o, const char* key, auto& value) {
      using T = std::decay_t<decltype(value)>;
      const auto node = t[key];
      if (!node) return;
      // A number setting takes an integer too (TOML writes 10000, not 10000.0).
      auto v = [&] {
        if constexpr (std::is_same_v<T, double>) return node.template value<double>();
        else return node.template value_exact<std::conditional_t<std::is_same_v<T, int>, int64_t, T>>();
      }();
      if (!v) return complain(key, std::is_same_v<T, double> ? "a number" : std::is_integral_v<T> ? "an integer" : "a string");
      if constexpr (std::is_same_v<T, int>) {
        if (*v < std::numeric_limits<int>::min() || *v > std::numeric_limits<int>::max()) return complain(key, "a smaller integer");
      }
      if (o->count() == 0) value = static_cast<T>(*v);
    };
    fill(o_state, "state_dir", state_dir);
    fill(o_secret, "secret_file", secret_file);
    fill(o_join, "join", join_token);
    if (auto m = t["open"]) {
      if (auto b = m.value_exact<bool>()) {
        if (o_open->count() == 0) open_mesh = *b;
      } else {
        complain("open", "true or false");
      }
    }
    fill(o_bind, "bind", bind);
    fill(o_port, "port", port);
    fill(o_device, "device", device);
    fill(o_log, "log_level", log_level);
    fill(o_hb, "heartbeat_ms", heartbeat_ms);
    fill(o_dead, "dead_after_ms", dead_after_ms);
    fill(o_blobs, "blob_cache_bytes", blob_cache_bytes);
    fill(o_parallel, "parallel", parallel);
    fill(o_gflop, "max_job_gflop", max_job_gflop);
    fill(o_jbytes, "max_job_bytes", max_job_bytes);
    fill(o_api, "api_bind", api_bind);
    fill(o_key, "api_key_file", api_key_file);
    const auto fill_switch = [&](CLI::Option* o, const char* key, std::string& value) {
      auto m = t[key];  // true/false, or "on"/"off" as on the command line
      if (!m) return;
      std::optional<std::string> v;
      if (auto b = m.value_exact<bool>()) v = *b ? "on" : "off";
      else if (auto str = m.value_exact<std::string>(); str && (*str == "on" || *str == "off")) v = *str;
      if (!v) complain(key, "true, false, \"on\" or \"off\"");
      else if (o->count() == 0) value = *v;
    };
    fill_switch(o_mdns, "mdns", mdns);
    fill_switch(o_shm, "shared_memory", shared_memory);
    const auto fill_list = [&](CLI::Option* o, const char* key, std::vector<std::string>& value, const char* example) {
      auto node = t[key];
      if (!node) return;
      std::vector<std::string> listed;
      auto* arr = node.as_array();
      if (arr)
        for (auto& p : *arr) {
          if (auto str = p.value_exact<std::string>()) listed.push_back(*str);
          else arr = nullptr;
        }
      if (!arr) complain(key, example);
      else if (o->count() == 0) value = std::move(listed);
    };
    fill_list(o_peer, "peers", peers, "an array of strings, e.g. peers = [\"NODEID@HOST:PORT\"]");
    fill_list(o_model, "models", models, "an array of strings, e.g. models = [\"/models/qwen2.5-0.5b-q4_k_m.gguf\"]");
    const std::vector<std::string> known = {"state_dir", "secret_file", "join", "open", "bind", "port", "device", "log_level", "heartbeat_ms",
                                            "dead_after_ms", "mdns", "peers", "models", "api_bind", "api_key_file", "blob_cache_bytes",
                                            "parallel", "max_job_gflop", "max_job_bytes", "shared_memory"};
    for (const auto& [key, value] : t)
      if (std::find(known.begin(), known.end(), std::string(key.str())) == known.end() && bad.empty()) {
        bad = "unknown setting '" + std::string(key.str()) + "' (known:";
        for (size_t i = 0; i < known.size(); ++i) bad += (i ? ", " : " ") + known[i];
        bad += ")";
      }
    if (!bad.empty()) {
      std::cerr << "meshnode: " << config_file << ": " << bad << "\n";
      return 2;
    }
  }

  // spdlog reads any name it does not know as "off", which would hide even fatal errors.
  std::transform(log_level.begin(), log_level.end(), log_level.begin(), [](unsigned char c) { return std::tolower(c); });
  if (log_level == "warning") log_level = "warn";
  const std::set<std::string> levels = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  if (!levels.count(log_level)) {
    std::cerr << "meshnode: --log-level must be one of trace, debug, info, warn, error, critical, off (not '" << log_level
              << "')\n";
    return 2;
  }
  spdlog::set_level(spdlog::level::from_str(log_level));
  spdlog::set_pattern("%H:%M:%S.%e %^%l%$ %v");
  mesh::node_config cfg;
  cfg.state_dir = state_dir.empty() ? mesh::app::default_state_dir() : state_dir;
  if (port < 0 || port > 65535) {
    std::cerr << "meshnode: --port must be 0..65535\n";
    return 2;
  }
  if (heartbeat_ms <= 0 || int64_t{dead_after_ms} <= 2 * int64_t{heartbeat_ms}) {
    std::cerr << "meshnode: --dead-after-ms must exceed two heartbeat intervals\n";
    return 2;
  }
  if (blob_cache_bytes <= 0) {
    std::cerr << "meshnode: --blob-cache-bytes must be positive\n";
    return 2;
  }
  cfg.blob_cache_bytes = static_cast<uint64_t>(blob_cache_bytes);
  if (parallel < 1 || parallel > 256) {
    std::cerr << "meshnode: --parallel must be 1..256\n";
    return 2;
  }
  cfg.parallel = parallel;
  if (!(max_job_gflop > 0) || max_job_bytes <= 0) {
    std::cerr << "meshnode: --max-job-gflop and --max-job-bytes must be positive\n";
    return 2;
  }
  cfg.limits.max_flops = max_job_gflop * 1e9;
  cfg.limits.max_total_bytes = max_job_bytes;
  cfg.port = static_cast<uint16_t>(port);
  cfg.bind = bind;
  cfg.device = device;
  cfg.mdns = mdns == "on";
  cfg.shared_memory = shared_memory == "on";
  cfg.heartbeat = std::chrono::milliseconds(heartbeat_ms);
  cfg.dead_after = std::chrono::milliseconds(dead_after_ms);
  for (const auto& p : peers) {
    if (auto ok = mesh::parse_peer(p); !ok) {
      std::cerr << "meshnode: " << ok.error().message << "\n";
      return 2;
    }
    cfg.peers.push_back(p);
  }
  for (const auto& m : models) {
    std::error_code ec;
    if (!std::filesystem::exists(m, ec)) {
      std::cerr << "meshnode: --model " << m << ": no such file or directory\n";
      return 2;
    }
    cfg.models.push_back(m);
  }
  if (api_bind != "off") {
    if (auto b = mesh::serving::parse_bind_address(api_bind); !b) {
      std::cerr << "meshnode: --api-bind: " << b.error().message << "\n";
      return 2;
    }
  }
  // Asked for by name (flag, environment or file): that address or no start. The default moves.
  cfg.api_bind_explicit = api_bind != cfg.api_bind;
  cfg.api_bind = api_bind;
  if (!api_key_file.empty()) {
    auto key = mesh::serving::read_key_file(api_key_file);
    if (!key) {
      std::cerr << "meshnode: --api-key-file: " << key.error().message << "\n";
      return 2;
    }
    cfg.api_key = *key;
  }
  if (print_id) {
    auto id = mesh::node_identity_string(cfg.state_dir);
    if (!id) {
      std::cerr << "meshnode: " << id.error().message << "\n";
      return 2;
    }
    std::cout << *id << "\n";
    return 0;
  }
  // The state directory's lock before the credential: a --join aimed by mistake at the state
  // directory of a running node must not replace that node's mesh token.
  if (auto ok = mesh::transport::prepare_state_dir(cfg.state_dir); !ok) {
    std::cerr << "meshnode: " << ok.error().message << "\n";
    return 2;
  }
  auto lock = mesh::transport::state_dir_lock::take(cfg.state_dir);
  if (!lock) {
    std::cerr << "meshnode: " << lock.error().message << "\n";
    return 2;
  }
  cfg.state_lock = *lock;
  // Membership needs a credential unless the user chose an open mesh by name.
  auto credential = mesh::app::resolve_node_credential(cfg.state_dir.string(), open_mesh, secret_file, join_token);
  if (!credential) {
    std::cerr << "meshnode: " << credential.error().message << "\n";
    return 2;
  }
  using source = mesh::transport::credential_source;
  switch (credential->source) {
    case source::open:
      spdlog::warn("open mesh (--open): any host that reaches this node becomes a member, is sent work and data, and can "
                   "poison results");
      break;
    case source::create:
      spdlog::info("created a new mesh (id {}); its secret is in {}: `meshctl invite` prints the token other nodes join with",
                   credential->credential.mesh_id, (cfg.state_dir / mesh::transport::credential_file_name).string());
      break;
    case source::join:
      spdlog::info("mesh {} from the --join token, kept in {}: later starts need no --join", credential->credential.mesh_id,
                   (cfg.state_dir / mesh::transport::credential_file_name).string());
      break;
    case source::stored: spdlog::info("mesh {} (token in the state directory)", credential->credential.mesh_id); break;
    case source::secret_file: spdlog::info("mesh {} (secret from {})", credential->credential.mesh_id, secret_file); break;
  }
  cfg.mesh_secret = credential->credential.secret;
  cfg.mesh_id = credential->credential.mesh_id;
  std::signal(SIGINT, on_stop);
  std::signal(SIGTERM, on_stop);
  std::signal(SIGUSR1, on_usr1);  // simulated device loss: exercises the executor's restart path
  return mesh::run_node(cfg, stop_requested, crash_requested);
}
