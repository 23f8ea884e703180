// mesh-bench-shaped: data parallel against DiLoCo (f32, int8 and fp4 outer gradients) on 3
// meshnode processes over shaped links (issue 25): wall time to a target held-out loss, the final
// held-out loss, and the bytes each node sends.
//
//   mesh-bench-shaped [--nodes 3] [--rate 1] [--delay-ms 10] [--methods dp,diloco,diloco-int8,diloco-fp4,...]
//                     [--steps 200] [--inner-steps 20] [--lr 3e-3] [--outer-lr 0.7] [--outer-momentum 0.9]
//                     [--hidden 256] [--layers 4] [--heads 4] [--kv-heads 2] [--ffn 768] [--vocab 256]
//                     [--batch 4] [--sequence 64] [--micro 1] [--eval-rows 48] [--eval-every H]
//                     [--lora-rank 0] [--seed 1] [--loopback] [--keep] [--meshnode PATH]
//
// Links (root, iproute2, tc tbf, iptables NFQUEUE): a hub namespace with a bridge and one
// namespace per node (bench/netns_topology.hpp), each node's veth shaped to --rate Gbit/s both
// ways by tbf. This kernel has no sch_netem, so the delay is an iptables NFQUEUE rule on each
// node's egress (OUTPUT -o eth0) whose verdicts a thread of this program holds for --delay-ms
// before accepting the packet (tests/common/kernel_delay_line.hpp): every packet from one node to
// another spends --delay-ms one way, a round trip 2 x --delay-ms (measured at the start with a
// TCP connect to a closed port). The packets never leave the kernel. --loopback runs the nodes on
// loopback instead (no root; for trying settings). --keep leaves the nodes' logs in the temporary
// folder (they stay there after a failure anyway).
//
// The model: a random Llama-family checkpoint of the given shape written as a Hugging Face
// directory (random_llama.hpp), its training graph from models::build_finetune_model, trained in
// full (every tensor; --lora-rank R trains LoRA adapters instead) with Adam on a synthetic corpus
// whose loss floor is known: each row is a walk of a fixed random first-order Markov chain over
// the vocabulary, every token having 4 successors with probabilities 0.5, 0.25, 0.15 and 0.1 (the
// floor is their entropy, 1.208 nats; a model that has learnt nothing starts at ln(vocab)). The
// columns tokens/targets/mask go straight to mesh::trainer. The training rows are one epoch's
// worth (steps x global batch), the held-out rows (--eval-rows) are walks of the same chain
// drawn apart from them.
//
// Methods (--methods): dp or diloco, then any of -bf16 -int8 -fp4 (the all-reduce format), and for
// DiLoCo -pN (N streaming fragments), -oN (N inner steps of each round overlapped with its
// all-reduce) and -mP (overlap_mix = P / 100, default 25): "diloco-fp4-p4-o1-m25".
//
// Every method runs the same steps per node (DiLoCo counts inner steps), the same global batch
// (--micro micro-batches of --batch rows per node per step), the same data order (--seed) and the
// same starting weights, one after the other on the same 3 nodes. The client is in the first
// node's namespace (its traffic to the coordinating node 0 does not cross a shaped link).
//
// Held-out loss: every --eval-every steps (default H, so DiLoCo's synchronised model after each
// outer step) the run sends the client a checkpoint (train_options::checkpoint_every); after the
// run each checkpoint and the final state are evaluated on the held-out rows with
// mesh::evaluate_loss. A point's time is the wall time from fit() to the progress report of its
// step (set-up and compiling included; each checkpoint pauses the run while the coordinator's
// worker reads its state back, equally often in every method). Target = data parallel's final held-out loss x 1.02; time to target = the first point at
// or below it. All-reduce bytes are train_result::bytes_sent (the encoded payloads of the ring
// all-reduce's pieces, all workers together) / nodes; link bytes are what each node's eth0 sent
// during fit() (all traffic: the state sent to the workers at set-up, data shards, heartbeats,
// QUIC and IP headers), averaged over the nodes. Build Release to measure; never a timed test.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_mesh.hpp"
#include "bench/netns_topology.hpp"
#include "bench/train/random_llama.hpp"
#include "client/trainer.hpp"
#include "models/checkpoint.hpp"
#include "models/finetune.hpp"
#include "models/model_config.hpp"

using namespace mesh;
namespace fs = std::filesystem;

namespace {

struct settings {
  int nodes = 3;
  double rate_gbit = 1;
  int delay_ms = 10;
  std::vector<std::string> methods = {"dp", "diloco", "diloco-int8", "diloco-fp4"};
  int steps = 200, inner_steps = 20, eval_every = 0;  ///< eval_every 0: = inner_steps
  double lr = 3e-3, outer_lr = 0.7, outer_momentum = 0.9;
  bench::llama_shape shape{256, 4, 4, 2, 768, 256, 2048};
  int64_t batch = 4, sequence = 64, micro = 1, eval_rows = 48, lora_rank = 0;
  uint64_t seed = 1;
  bool loopback = false, keep = false;  ///< keep: leave the nodes' logs (and the checkpoint) in the temporary folder
  std::string meshnode;
};

// ---------------------------------------------------------------------------------------------
// The corpus: walks of a fixed random Markov chain
// ---------------------------------------------------------------------------------------------

constexpr double successor_p[] = {0.5, 0.25, 0.15, 0.1};
constexpr int successors = 4;

struct markov_chain {
  int64_t vocab = 0;
  std::vector<std::array<int32_t, successors>> next;  ///< per token, its successors

  markov_chain(int64_t v, uint32_t seed) : vocab(v), next(static_cast<size_t>(v)) {
    std::mt19937 rng(seed);
    std::vector<int32_t> all(static_cast<size_t>(v));
    for (int32_t i = 0; i < v; ++i) all[static_cast<size_t>(i)] = i;
    for (auto& row : next) {
      for (int k = 0; k < successors; ++k) {  // a partial Fisher-Yates: k distinct successors
        std::uniform_int_distribution<size_t> pick(static_cast<size_t>(k), all.size() - 1);
        std::swap(all[static_cast<size_t>(k)], all[pick(rng)]);
        row[static_cast<size_t>(k)] = all[static_cast<size_t>(k)];
      }
    }
  }
  /// The entropy of a step: the loss of a model that knows the chain.
  static double floor() {
    double h = 0;
    for (double p : successor_p) h -= p * std::log(p);
    return h;
  }
  /// `rows` walks of sequence + 1 tokens as the columns tokens, targets (the next token) and mask;
  /// `own_loss` receives the mean loss of the chain itself on them.
  tensor_map walks(int64_t rows, int64_t sequence, uint32_t seed, double* own_loss = nullptr) const {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> start(0, static_cast<int32_t>(vocab - 1));
    std::discrete_distribution<int> which(std::begin(successor_p), std::end(successor_p));
    std::vector<int32_t> tokens(static_cast<size_t>(rows * sequence)), targets(tokens.size());
    double nll = 0;
    for (int64_t r = 0; r < rows; ++r) {
      int32_t t = start(rng);
      for (int64_t i = 0; i < sequence; ++i) {
        const int k = which(rng);
        nll -= std::log(successor_p[k]);
        const int32_t n = next[static_cast<size_t>(t)][static_cast<size_t>(k)];
        tokens[static_cast<size_t>(r * sequence + i)] = t;
        targets[static_cast<size_t>(r * sequence + i)] = n;
        t = n;
      }
    }
    if (own_loss) *own_loss = nll / static_cast<double>(tokens.size());
    return {{"tokens", tensor::from_ints({rows, sequence}, tokens)},
            {"targets", tensor::from_ints({rows, sequence}, targets)},
            {"mask", tensor::from_floats({rows, sequence}, std::vector<float>(tokens.size(), 1.0f))}};
  }
};

// ---------------------------------------------------------------------------------------------
// Namespaces and the delay
// ---------------------------------------------------------------------------------------------

/// Moves the calling thread into network namespace `path` (/run/netns/NAME, /proc/...); what it
/// starts afterwards (threads, child processes, sockets) lives there.
bool enter_netns(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::setns(fd, CLONE_NEWNET) == 0;
  ::close(fd);
  return ok;
}

/// The smallest of 5 round trips from namespace `ns` to `addr`: a TCP connect to a closed port
/// (SYN out, RST back); nullopt if none came back refused.
std::optional<double> round_trip_ms(const std::string& ns, const std::string& addr) {
  std::optional<double> best;
  std::thread([&] {
    if (!enter_netns("/run/netns/" + ns)) return;
    for (int i = 0; i < 5; ++i) {
      const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(9);
      ::inet_pton(AF_INET, addr.c_str(), &a.sin_addr);
      const auto t0 = std::chrono::steady_clock::now();
      const int r = ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
      const int err = errno;
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      ::close(s);
      if (r != 0 && err == ECONNREFUSED) best = best ? std::min(*best, ms) : ms;
    }
  }).join();
  return best;
}

// ---------------------------------------------------------------------------------------------
// One training run
// ---------------------------------------------------------------------------------------------

struct method_spec {
  std::string name;
  train_method method = train_method::data_parallel;
  wire_format wire = wire_format::f32;
  uint32_t fragments = 1;      ///< DiLoCo: streaming fragments (-pN)
  uint32_t overlap_steps = 0;  ///< DiLoCo: inner steps overlapped with each round's all-reduce (-oN)
  double overlap_mix = 0.25;   ///< DiLoCo with overlap: train_options::overlap_mix (-mP: P percent)
};

/// "dp" or "diloco", then any of -bf16 -int8 -fp4 (the all-reduce format), and for DiLoCo -pN
/// (N fragments), -oN (N inner steps of each round overlapped) and -mP (overlap_mix = P / 100):
/// "diloco-fp4-p4-o2-m50".
std::optional<method_spec> parse_method(const std::string& m) {
  std::vector<std::string> parts;
  std::stringstream ss(m);
  for (std::string p; std::getline(ss, p, '-');) parts.push_back(p);
  if (parts.empty() || (parts[0] != "dp" && parts[0] != "diloco")) return std::nullopt;
  method_spec out{m, parts[0] == "dp" ? train_method::data_parallel : train_method::diloco};
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& p = parts[i];
    const bool numbered = p.size() > 1 && std::all_of(p.begin() + 1, p.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (p == "bf16") out.wire = wire_format::bf16;
    else if (p == "int8") out.wire = wire_format::int8;
    else if (p == "fp4") out.wire = wire_format::fp4;
    else if (numbered && p[0] == 'p' && out.method == train_method::diloco) out.fragments = static_cast<uint32_t>(std::stoul(p.substr(1)));
    else if (numbered && p[0] == 'o' && out.method == train_method::diloco) out.overlap_steps = static_cast<uint32_t>(std::stoul(p.substr(1)));
    else if (numbered && p[0] == 'm' && out.method == train_method::diloco) out.overlap_mix = std::min(100.0, std::stod(p.substr(1))) / 100;
    else return std::nullopt;
  }
  return out;
}

struct eval_point {
  uint64_t step = 0;
  double seconds = 0;       ///< from fit() to the progress report of the step
  double heldout = 0;       ///< held-out loss of the model at that step
  uint64_t allreduce = 0;   ///< all-reduce bytes so far, all workers together
};

struct run_result {
  method_spec m;
  std::vector<eval_point> curve;  ///< checkpoints, then the final state
  double wall = 0;                ///< fit() in all, the result's transfer included
  uint64_t allreduce = 0;         ///< train_result::bytes_sent
  double link_bytes = 0;          ///< eth0 tx per node during fit(), mean
  uint64_t drops = 0;             ///< tbf drops during fit()
  uint64_t queue_drops = 0;       ///< delay-line queue drops during fit()
  uint64_t packets_lost = 0;      ///< QUIC packets node 0 declared lost to its peers during fit()
  double last_train_loss = 0;
  double final_loss() const { return curve.back().heldout; }
};

struct bench_context {
  const settings& s;
  client& c;
  const models::finetune_model& train_model;  ///< micro-batch of `batch` rows
  const graph& eval_graph;                     ///< the same model over all held-out rows at once
  const tensor_map& train_data;
  const tensor_map& heldout;
  const std::optional<bench::netns_topology>& topo;
};

expected<run_result> run_method(const bench_context& x, const method_spec& m) {
  const settings& s = x.s;
  train_options o;
  o.method = m.method;
  o.compression = m.wire;
  o.fragments = m.fragments;
  o.overlap_steps = m.overlap_steps;
  o.overlap_mix = m.overlap_mix;
  o.steps = static_cast<uint64_t>(s.steps);
  o.inner_steps = static_cast<uint32_t>(s.inner_steps);
  o.outer_lr = s.outer_lr;
  o.outer_momentum = s.outer_momentum;
  o.micro_batches = static_cast<uint32_t>(s.micro * s.nodes);
  o.seed = s.seed;
  o.optimizer = optim::adam_options{.lr = s.lr};
  o.trainable = x.train_model.trainable;
  o.checkpoint_every = static_cast<uint64_t>(s.eval_every);
  std::mutex mu;
  std::vector<std::pair<uint64_t, tensor_map>> checkpoints;
  std::map<uint64_t, std::pair<double, uint64_t>> reported;  // step -> (seconds, all-reduce bytes so far)
  o.on_checkpoint = [&](uint64_t step, const tensor_map& state) {
    auto p = parameters_only(state);
    std::lock_guard l(mu);
    checkpoints.emplace_back(step, std::move(p));
  };
  std::vector<uint64_t> tx0;
  const auto lost_by_node0 = [&] {
    uint64_t n = 0;
    if (auto st = x.c.status())
      for (const auto& p : st->peers) n += p.packets_lost;
    return n;
  };
  const uint64_t lost0 = lost_by_node0();
  uint64_t drops0 = 0, queue0 = 0;
  if (x.topo) {
    for (const auto& ns : x.topo->ranks) tx0.push_back(bench::tx_bytes(ns)), queue0 += bench::delay_queue_drops(ns);
    drops0 = bench::tbf_drops(x.topo->hub, x.topo->ranks);
  }
  uint64_t bytes_so_far = 0;
  double last_loss = 0;
  auto r = trainer(x.c, x.train_model.g, x.train_model.state, x.train_data, o).fit([&](const train_progress_info& p) {
    bytes_so_far += p.bytes_sent;
    last_loss = p.loss;
    {
      std::lock_guard l(mu);
      reported[p.step] = {p.seconds, bytes_so_far};
    }
    if (m.method == train_method::diloco || p.step % 10 == 0 || p.step == 1 || p.step == p.steps)
      std::fprintf(stderr, "  %-12s step %4llu  train loss %.4f  %6.1f s  all-reduce %.2f MB  peers %u\n", m.name.c_str(),
                   static_cast<unsigned long long>(p.step), p.loss, p.seconds, static_cast<double>(bytes_so_far) / 1e6, p.peers);
  });
  if (!r) return tl::unexpected(r.error());
  run_result out;
  out.m = m;
  out.wall = r->seconds;
  out.allreduce = r->bytes_sent;
  out.last_train_loss = last_loss;
  out.packets_lost = lost_by_node0() - lost0;
  if (x.topo) {
    double sum = 0;
    for (size_t i = 0; i < x.topo->ranks.size(); ++i) sum += static_cast<double>(bench::tx_bytes(x.topo->ranks[i]) - tx0[i]);
    out.link_bytes = sum / static_cast<double>(x.topo->ranks.size());
    out.drops = bench::tbf_drops(x.topo->hub, x.topo->ranks) - drops0;
    for (const auto& ns : x.topo->ranks) out.queue_drops += bench::delay_queue_drops(ns);
    out.queue_drops -= queue0;
  }
  // Nothing runs on the client's threads any more (fit returned): the maps are ours.
  checkpoints.emplace_back(r->step, parameters_only(r->state));
  std::sort(checkpoints.begin(), checkpoints.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [step, params] : checkpoints) {
    auto loss = evaluate_loss(x.c, x.eval_graph, params, x.heldout);
    if (!loss) return tl::unexpected(loss.error());
    eval_point e;
    e.step = step;
    e.heldout = *loss;
    if (auto it = reported.find(step); it != reported.end()) {
      e.seconds = it->second.first;
      e.allreduce = it->second.second;
    }
    out.curve.push_back(e);
    std::fprintf(stderr, "  %-12s step %4llu  held-out loss %.4f  at %6.1f s\n", m.name.c_str(), static_cast<unsigned long long>(step),
                 e.heldout, e.seconds);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Options and the report
// ---------------------------------------------------------------------------------------------

std::vector<std::string> list(const std::string& v) {
  std::vector<std::string> out;
  std::stringstream ss(v);
  for (std::string x; std::getline(ss, x, ',');)
    if (!x.empty()) out.push_back(x);
  return out;
}

void usage() {
  std::printf(
      "mesh-bench-shaped [--nodes 3] [--rate 1] [--delay-ms 10] [--methods dp,diloco,diloco-int8,diloco-fp4]\n"
      "                  [--steps 200] [--inner-steps 20] [--lr 3e-3] [--outer-lr 0.7] [--outer-momentum 0.9]\n"
      "                  [--hidden 256] [--layers 4] [--heads 4] [--kv-heads 2] [--ffn 768] [--vocab 256]\n"
      "                  [--batch 4] [--sequence 64] [--micro 1] [--eval-rows 48] [--eval-every H]\n"
      "                  [--lora-rank 0] [--seed 1] [--loopback] [--keep] [--meshnode PATH]\n"
      "Data parallel against DiLoCo (f32, int8, fp4 outer gradients) on meshnode processes in network namespaces,\n"
      "each link shaped to --rate Gbit/s (tbf) with --delay-ms each way (NFQUEUE): time to data parallel's\n"
      "held-out loss x 1.02, final held-out loss, bytes sent per node. Needs root unless --loopback.\n"
      "Methods: dp or diloco, then any of -bf16 -int8 -fp4 (all-reduce format) and for DiLoCo -pN (N streaming\n"
      "fragments), -oN (N inner steps of each round overlapped with its all-reduce) and -mP (overlap_mix P/100):\n"
      "dp, dp-int8, diloco-fp4, diloco-fp4-p4-o2-m50 (dp first: it sets the target).\n");
}

std::string fmt_seconds(std::optional<double> s) {
  if (!s) return "not reached";
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", *s);
  return b;
}

int report(const settings& s, const std::vector<run_result>& runs, double floor_loss) {
  const run_result* dp = nullptr;
  for (const auto& r : runs)
    if (r.m.name == "dp") dp = &r;
  const double target = dp ? dp->final_loss() * 1.02 : 0;
  std::printf("\nHeld-out loss (the chain's own loss on these rows: %.4f) by step, and the wall time of each point (s):\n", floor_loss);
  for (const auto& r : runs) {
    std::printf("  %-12s", r.m.name.c_str());
    for (const auto& e : r.curve) std::printf(" %llu:%.3f@%.0f", static_cast<unsigned long long>(e.step), e.heldout, e.seconds);
    std::printf("\n");
  }
  if (dp) std::printf("\nTarget: data parallel's final held-out loss %.4f x 1.02 = %.4f\n", dp->final_loss(), target);
  std::printf("\n| method | wire | H | final held-out loss | vs DP | time to target s | run wall s | all-reduce MB/node | "
              "all-reduce MB/node to target | DP / this (all-reduce bytes) | link MB/node | drops tbf/delay | lost (node 0) |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  std::optional<double> dp_bytes_to_target;
  std::vector<std::optional<double>> to_target_bytes;
  for (const auto& r : runs) {
    std::optional<double> t, b;
    if (dp)
      for (const auto& e : r.curve)
        if (e.heldout <= target) {
          t = e.seconds;
          b = static_cast<double>(e.allreduce) / s.nodes;
          break;
        }
    const double per_node = static_cast<double>(r.allreduce) / s.nodes;
    const double vs = dp ? r.final_loss() / dp->final_loss() - 1 : 0;
    char ratio[32] = "-";
    if (dp && r.allreduce > 0) std::snprintf(ratio, sizeof ratio, "%.1fx", static_cast<double>(dp->allreduce) / static_cast<double>(r.allreduce));
    char to_target[32] = "-";
    if (b) std::snprintf(to_target, sizeof to_target, "%.2f", *b / 1e6);
    std::printf("| %s | %s | %s | %.4f | %+.2f%% | %s | %.1f | %.2f | %s | %s | %.1f | %llu/%llu | %llu |\n", r.m.name.c_str(), to_string(r.m.wire),
                r.m.method == train_method::diloco ? std::to_string(s.inner_steps).c_str() : "1", r.final_loss(), 100 * vs,
                fmt_seconds(t).c_str(), r.wall, per_node / 1e6, to_target, ratio, r.link_bytes / 1e6,
                static_cast<unsigned long long>(r.drops), static_cast<unsigned long long>(r.queue_drops), static_cast<unsigned long long>(r.packets_lost));
  }
  // The goal: DiLoCo with 4-bit outer gradients within 2% of DP's loss, >= 100x fewer bytes.
  for (const auto& r : runs)
    if (dp && r.m.name == "diloco-fp4") {
      const bool loss_ok = r.final_loss() <= target;
      const double ratio = r.allreduce ? static_cast<double>(dp->allreduce) / static_cast<double>(r.allreduce) : 0;
      std::printf("\nGoal (DiLoCo fp4 within 2%% of DP's held-out loss with >= 100x fewer all-reduce bytes): loss %.4f vs %.4f "
                  "(%+.2f%%): %s; bytes %.1fx fewer: %s\n",
                  r.final_loss(), dp->final_loss(), 100 * (r.final_loss() / dp->final_loss() - 1), loss_ok ? "met" : "NOT met", ratio,
                  ratio >= 100 ? "met" : "NOT met");
    }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  settings s;
  s.meshnode = app::meshnode_beside(argv[0]);
  if (!fs::exists(s.meshnode))  // in the build tree: build/bench/train -> build/apps
    s.meshnode = (fs::path(s.meshnode).parent_path() / "../../apps/meshnode").lexically_normal().string();
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") return usage(), 0;
    if (k == "--loopback" || k == "--keep") {
      (k == "--keep" ? s.keep : s.loopback) = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "mesh-bench-shaped: %s needs a value\n", k.c_str());
      return 2;
    }
    const std::string v = argv[++i];
    const auto num = [&] { return std::atoll(v.c_str()); };
    if (k == "--nodes") s.nodes = static_cast<int>(num());
    else if (k == "--rate") s.rate_gbit = std::atof(v.c_str());
    else if (k == "--delay-ms") s.delay_ms = static_cast<int>(num());
    else if (k == "--methods") s.methods = list(v);
    else if (k == "--steps") s.steps = static_cast<int>(num());
    else if (k == "--inner-steps") s.inner_steps = static_cast<int>(num());
    else if (k == "--eval-every") s.eval_every = static_cast<int>(num());
    else if (k == "--lr") s.lr = std::atof(v.c_str());
    else if (k == "--outer-lr") s.outer_lr = std::atof(v.c_str());
    else if (k == "--outer-momentum") s.outer_momentum = std::atof(v.c_str());
    else if (k == "--hidden") s.shape.hidden = num();
    else if (k == "--layers") s.shape.layers = num();
    else if (k == "--heads") s.shape.heads = num();
    else if (k == "--kv-heads") s.shape.kv_heads = num();
    else if (k == "--ffn") s.shape.ffn = num();
    else if (k == "--vocab") s.shape.vocab = num();
    else if (k == "--batch") s.batch = num();
    else if (k == "--sequence") s.sequence = num();
    else if (k == "--micro") s.micro = num();
    else if (k == "--eval-rows") s.eval_rows = num();
    else if (k == "--lora-rank") s.lora_rank = num();
    else if (k == "--seed") s.seed = static_cast<uint64_t>(num());
    else if (k == "--meshnode") s.meshnode = v;
    else {
      std::fprintf(stderr, "mesh-bench-shaped: unknown option %s (--help)\n", k.c_str());
      return 2;
    }
  }
  if (s.eval_every <= 0) s.eval_every = s.inner_steps;
  std::vector<method_spec> methods;
  for (const auto& m : s.methods) {
    auto p = parse_method(m);
    if (!p) return std::fprintf(stderr, "mesh-bench-shaped: unknown method %s (--help)\n", m.c_str()), 2;
    methods.push_back(*p);
  }
  if (s.nodes < 2 || s.nodes > 16 || s.steps < 2 || s.inner_steps < 1 || s.rate_gbit <= 0 || s.delay_ms < 0 || s.batch < 1 ||
      s.sequence < 2 || s.micro < 1 || s.eval_rows < 1 || methods.empty())
    return std::fprintf(stderr, "mesh-bench-shaped: need 2 <= --nodes <= 16, --steps >= 2, --inner-steps >= 1, --rate > 0, ...\n"), 2;
  if (!methods.empty() && methods.front().name != "dp")
    std::fprintf(stderr, "mesh-bench-shaped: dp does not run first: no target loss, no ratios\n");

  // The model, the corpus.
  char tmpl[] = "/tmp/bench-shaped-XXXXXX";
  const fs::path dir = ::mkdtemp(tmpl);
  s.shape.context = std::max<int64_t>(s.sequence, 2048);
  if (auto ok = bench::write_random_llama(dir / "model", s.shape); !ok)
    return std::fprintf(stderr, "writing the checkpoint: %s\n", ok.error().message.c_str()), 1;
  auto ckpt = models::checkpoint::open(dir / "model");
  if (!ckpt) return std::fprintf(stderr, "%s\n", ckpt.error().message.c_str()), 1;
  auto config = models::read_model_config(*ckpt);
  if (!config) return std::fprintf(stderr, "%s\n", config.error().message.c_str()), 1;
  models::finetune_options fo;
  fo.batch = s.batch;
  fo.sequence = s.sequence;
  fo.lora.rank = s.lora_rank;
  fo.lora.alpha = 2.0 * static_cast<double>(s.lora_rank);
  auto model = models::build_finetune_model(*config, *ckpt, fo);
  if (!model) return std::fprintf(stderr, "%s\n", model.error().message.c_str()), 1;
  fo.batch = s.eval_rows;
  auto eval_model = models::build_finetune_model(*config, *ckpt, fo);
  if (!eval_model) return std::fprintf(stderr, "%s\n", eval_model.error().message.c_str()), 1;
  const markov_chain chain(s.shape.vocab, 7);
  const int64_t global_rows = s.batch * s.micro * s.nodes;
  const tensor_map train_data = chain.walks(global_rows * s.steps, s.sequence, static_cast<uint32_t>(s.seed) * 2 + 11);
  double heldout_floor = 0;
  const tensor_map heldout = chain.walks(s.eval_rows, s.sequence, static_cast<uint32_t>(s.seed) * 2 + 12, &heldout_floor);
  int64_t params = 0, trained = 0;
  for (const auto& [name, t] : model->state) params += t.size();
  for (const auto& name : model->trainable) trained += model->state.at(name).size();
  std::printf("Llama shape: hidden %lld, %lld layers, %lld heads (%lld kv), ffn %lld, vocab %lld: %.2f M parameters, %.2f M trained (%s), "
              "Adam lr %g\n",
              static_cast<long long>(s.shape.hidden), static_cast<long long>(s.shape.layers), static_cast<long long>(s.shape.heads),
              static_cast<long long>(s.shape.kv_heads), static_cast<long long>(s.shape.ffn), static_cast<long long>(s.shape.vocab),
              static_cast<double>(params) / 1e6, static_cast<double>(trained) / 1e6,
              s.lora_rank > 0 ? ("LoRA rank " + std::to_string(s.lora_rank)).c_str() : "full", s.lr);
  std::printf("corpus: walks of a random Markov chain (4 successors a token), loss floor %.4f, start ~ln(%lld) = %.3f; %lld training "
              "rows (one epoch), %lld held-out rows (their floor %.4f), %lld tokens each\n",
              markov_chain::floor(), static_cast<long long>(s.shape.vocab), std::log(static_cast<double>(s.shape.vocab)),
              static_cast<long long>(global_rows * s.steps), static_cast<long long>(s.eval_rows), heldout_floor,
              static_cast<long long>(s.sequence));
  std::printf("%d nodes (cpu), %d steps of %lld rows (%lld per node), DiLoCo H = %d (outer Nesterov lr %g, momentum %g), "
              "held-out loss every %d steps\n",
              s.nodes, s.steps, static_cast<long long>(global_rows), static_cast<long long>(s.batch * s.micro), s.inner_steps, s.outer_lr,
              s.outer_momentum, s.eval_every);

  // The links.
  std::optional<bench::netns_topology> topo;
  int status = 0;
  {
    bench::install_signal_cleanup("mesh-bench-shaped");
    if (!s.loopback) {
      topo = bench::netns_topology::create(s.nodes, s.rate_gbit, "mnsh");
      if (!topo) {
        std::fprintf(stderr, "mesh-bench-shaped: network namespace set-up failed (needs root, iproute2, tc tbf)\n");
        return 1;
      }
      if (s.delay_ms > 0)
        if (auto why = topo->add_delay(std::chrono::milliseconds(s.delay_ms)); !why.empty()) {
          std::fprintf(stderr, "mesh-bench-shaped: %s\n", why.c_str());
          status = 1;
        }
      if (status == 0) {
        auto rtt = round_trip_ms(topo->ranks[0], topo->addresses[1]);
        std::printf("links: tbf %g Gbit/s each way per node, %s; round trip node 0 -> node 1: %s ms (TCP connect to a closed port)\n",
                    s.rate_gbit,
                    s.delay_ms > 0 ? ("NFQUEUE delay " + std::to_string(s.delay_ms) + " ms on each node's egress").c_str() : "no delay",
                    rtt ? std::to_string(*rtt).c_str() : "?");
        if (!rtt) status = 1;
      }
    } else {
      std::printf("links: loopback (no shaping, no delay)\n");
    }
  }
  std::fflush(stdout);

  std::vector<run_result> runs;
  if (status == 0) {
    const std::string root_ns = "/proc/" + std::to_string(::getpid()) + "/task/" + std::to_string(::gettid()) + "/ns/net";
    const int root_fd = ::open(root_ns.c_str(), O_RDONLY | O_CLOEXEC);
    bench::node_placement where;
    where.shared_memory = false;  // the pieces must cross the shaped links
    if (topo) {
      where.enter = [&](int i) {
        if (!enter_netns("/run/netns/" + topo->ranks[static_cast<size_t>(i < s.nodes ? i : 0)]))
          std::fprintf(stderr, "mesh-bench-shaped: cannot enter %s\n", topo->ranks[static_cast<size_t>(i < s.nodes ? i : 0)].c_str());
      };
      where.bind = [&](int i) { return topo->addresses[static_cast<size_t>(i)]; };
    }
    auto mesh = bench::start_training_mesh(s.meshnode, dir, "node", s.nodes, [](int) { return std::string("cpu"); }, where);
    if (!mesh) {
      std::fprintf(stderr, "mesh-bench-shaped: starting the nodes: %s (logs in %s)\n", mesh.error().message.c_str(), dir.c_str());
      status = 1;
    } else {
      const bench_context x{s, *mesh->first, *model, eval_model->g, train_data, heldout, topo};
      for (const auto& m : methods) {
        std::fprintf(stderr, "mesh-bench-shaped: %s ...\n", m.name.c_str());
        auto r = run_method(x, m);
        if (!r) {
          std::fprintf(stderr, "mesh-bench-shaped: %s: %s (node logs in %s)\n", m.name.c_str(), r.error().message.c_str(), dir.c_str());
          status = 1;
          break;
        }
        runs.push_back(std::move(*r));
      }
      mesh->first.reset();
      mesh->nodes.clear();
    }
    if (root_fd >= 0) {
      ::setns(root_fd, CLONE_NEWNET);
      ::close(root_fd);
    }
  }
  if (topo) topo->delay_lines.clear();
  bench::cleanup().kill_children();
  bench::cleanup().remove_namespaces();
  if (!runs.empty()) report(s, runs, heldout_floor);
  if (status == 0 && !s.keep) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  } else {
    std::fprintf(stderr, "mesh-bench-shaped: the nodes' logs are in %s\n", dir.c_str());
  }
  return status;
}
