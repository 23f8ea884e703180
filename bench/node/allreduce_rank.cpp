// bench_allreduce's rank process (--rank R): one endpoint, one ring member; see bench_allreduce.cpp
// for what is measured and how.
#include "allreduce_common.hpp"

namespace mesh::bench_allreduce {
namespace {
// ---------------------------------------------------------------------------------------------
// Rank process (--rank): one endpoint, one ring member
// ---------------------------------------------------------------------------------------------

/// What the rank's main thread waits on: the endpoint's callbacks and the coordinator's
/// commands, in arrival order (the node's core actor mailbox, without CAF).
struct rank_event {
  enum class kind { message, up, down, command, eof } k;
  node_id from;
  std::vector<uint8_t> bytes;
  std::string text;  ///< command line, or the reason a peer went down
};

class mailbox {
 public:
  void push(rank_event e) {
    {
      std::lock_guard l(mu_);
      q_.push_back(std::move(e));
    }
    cv_.notify_one();
  }
  rank_event pop() {
    std::unique_lock l(mu_);
    cv_.wait(l, [&] { return !q_.empty(); });
    rank_event e = std::move(q_.front());
    q_.pop_front();
    return e;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<rank_event> q_;
};

/// Writes one line to the coordinator (stdout is its pipe).
void report(const std::string& line) {
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

[[noreturn]] void rank_fail(const std::string& why) {
  report("error " + why);
  std::fflush(nullptr);
  std::_Exit(1);
}

}  // namespace

/// One ring member. Protocol on stdin/stdout (one line each):
///   -> "port P"                        after the endpoint started
///   <- "ring PRED_ID SUCC_ID SUCC_ADDR" -> "ready" once both neighbours are admitted
///   <- "prep K"                        -> "prepped" (input of round K built, untimed)
///   <- "go"                            -> "done K START_NS END_NS BYTES_SENT CPU_NS IDLE_EMPTY_NS IDLE_CWND_NS IDLE_HELD_NS"
///   <- "check"                         -> "checked ok" | "checked bad ..." (untimed)
///   <- "quit"
int rank_main(const args& a) {
  const int rank = static_cast<int>(a.num("--rank", -1)), n = static_cast<int>(a.num("--ranks", 3));
  const int pieces = static_cast<int>(a.num("--pieces", 4));
  const bool inject_error = a.has("--inject-error");
  const size_t elems = static_cast<size_t>(a.real("--mib", 64) * (1 << 20) / 4);
  auto seed = from_hex(a.get("--seed").value_or(""));
  auto secret = from_hex(a.get("--secret").value_or(""));
  auto format = parse_format(a.get("--format").value_or("f32"));
  if (rank < 0 || rank >= n || !seed || seed->size() != 32 || !secret || !format) rank_fail("bad arguments");
  std::array<uint8_t, 32> seed_bytes{};
  std::copy(seed->begin(), seed->end(), seed_bytes.begin());

  mailbox box;
  transport::handlers h;
  // All on the I/O thread: hand off only, like node.cpp's handlers.
  h.on_peer_up = [&box](const node_id& id, const transport::peer_info&) {
    box.push({rank_event::kind::up, id, {}, {}});
  };
  h.on_peer_down = [&box](const node_id& id, const transport::peer_down& why) {
    box.push({rank_event::kind::down, id, {}, why.reason});
  };
  h.on_message = [&box](const node_id& id, transport::channel, std::vector<uint8_t> bytes) {
    box.push({rank_event::kind::message, id, std::move(bytes), {}});
  };
  h.on_connect_failed = [](const std::optional<node_id>&, const std::string& addr, const std::string& why) {
    rank_fail("connection to " + addr + " failed: " + why);
  };
  transport::endpoint_config cfg;  // the node's settings (actors/node.cpp), but for the address
  cfg.id = transport::identity::from_seed(seed_bytes);
  cfg.mesh_secret = *secret;
  cfg.bind = a.get("--bind").value_or("127.0.0.1");
  cfg.protocol_version = msg::protocol_version;
  // MESH_BULK_ORDER=shortest_first|round_robin compares the transport's other bulk schedulings
  // with its default, oldest_first (A/B runs).
  if (const char* order = std::getenv("MESH_BULK_ORDER")) {
    if (std::string(order) == "round_robin") cfg.bulk_scheduling = transport::endpoint_config::bulk_order::round_robin;
    if (std::string(order) == "shortest_first") cfg.bulk_scheduling = transport::endpoint_config::bulk_order::shortest_first;
  }
  // MESH_CC=cubic|bbr|bbr2 compares congestion controllers (A/B runs).
  if (const char* cc = std::getenv("MESH_CC")) {
    const std::string c = cc;
    using cong = transport::endpoint_config::congestion;
    cfg.congestion_control = c == "bbr" ? cong::bbr : c == "bbr2" ? cong::bbr2 : cong::cubic;
  }
  // MESH_BULK_FLOOR=BYTES sets endpoint_config::bulk_in_flight_floor (0: bulk in flight not held).
  if (const char* floor = std::getenv("MESH_BULK_FLOOR")) cfg.bulk_in_flight_floor = std::strtoull(floor, nullptr, 10);
  auto started = transport::endpoint::start(cfg, h);
  if (!started) rank_fail("endpoint: " + started.error().message);
  auto ep = std::move(*started);
  report("port " + std::to_string(ep->port()));

  std::thread stdin_reader([&box] {
    char buf[512];
    while (std::fgets(buf, sizeof buf, stdin)) box.push({rank_event::kind::command, {}, {}, buf});
    box.push({rank_event::kind::eof, {}, {}, {}});
  });
  stdin_reader.detach();  // ends with the process; the coordinator owns our stdin

  std::optional<node_id> pred, succ;
  std::set<node_id> up;

  // Link idle time during a round, sampled every 2 ms from the connection to the successor
  // (an interval in which under 8 KB went out is idle), split by why: nothing queued to send
  // ("empty": waiting for a piece to arrive, or done), queued but the congestion window full
  // ("cwnd"), queued with room in the window ("held": the transport's bulk in-flight hold, pacing, flow control, the I/O thread).
  struct idle_split {
    std::atomic<int64_t> empty_ns{0}, cwnd_ns{0}, held_ns{0};
  } idle;
  std::atomic<bool> sampling{false};
  std::atomic<const node_id*> watched{nullptr};
  std::thread sampler([&] {
    uint64_t last_sent = 0;
    int64_t last_t = now_ns();
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      const node_id* w = watched.load();
      const int64_t t = now_ns();
      auto st = w ? ep->stats(*w) : std::nullopt;
      if (!st) continue;
      if (sampling.load() && st->bytes_sent - last_sent < 8192) {
        auto& bucket = st->unsent_bytes == 0 ? idle.empty_ns : st->bytes_in_flight + 1452 >= st->cwnd ? idle.cwnd_ns : idle.held_ns;
        bucket += t - last_t;
      }
      last_sent = st->bytes_sent;
      last_t = t;
    }
  });
  sampler.detach();  // ends with the process
  bool ready_sent = false;
  std::unique_ptr<ring_allreduce> round;
  bool running = false;  // "go" seen for `round`
  uint64_t round_index = 0;
  int64_t t_start = 0, cpu_start = 0;
  std::vector<msg::allreduce_piece> parked;  // pieces of `round` that came before our "go"
  const mesh::node_id coordinator_id = cfg.id.id();

  // MESH_ALLREDUCE_TRACE=PREFIX: each rank appends "ms since go, event, step, piece" lines of
  // every round to PREFIX.<rank> (to see where a slow round's links stood idle).
  FILE* trace = nullptr;
  if (const char* prefix = std::getenv("MESH_ALLREDUCE_TRACE"))
    trace = std::fopen((std::string(prefix) + "." + std::to_string(rank)).c_str(), "w");
  auto trace_event = [&](const char* what, uint32_t step, uint32_t piece) {
    if (trace) std::fprintf(trace, "%.2f %s %u %u\n", static_cast<double>(now_ns() - t_start) / 1e6, what, step, piece);
  };
  // Sends the state machine's output to the successor exactly as jobs_actor.cpp's send_to does: the
  // encoded node message on its own bulk stream when over 64 KiB, else on the control stream.
  auto forward = [&](std::vector<allreduce_message> ms) {
    for (auto& m : ms) {
      trace_event("send", m.step, m.piece);
      msg::allreduce_piece p;
      p.train = 1;
      p.coordinator = coordinator_id;
      p.round = m.round;
      p.ring_step = m.step;
      p.piece = m.piece;
      p.payload = std::move(m.payload);
      auto bytes = msg::encode_message(p);
      if (!bytes) rank_fail("encode: " + bytes.error().message);
      const auto ch = bytes->size() > msg::max_control_message ? transport::channel::bulk : transport::channel::control;
      if (auto ok = ep->send(*succ, ch, std::move(*bytes)); !ok) rank_fail("send: " + ok.error().message);
    }
  };
  auto finish_if_done = [&] {
    if (!round || !running || !round->done()) return;
    const int64_t t_end = now_ns();
    running = false;
    sampling = false;
    if (trace) {
      if (auto st = succ ? ep->stats(*succ) : std::nullopt)
        std::fprintf(trace, "stats cwnd %llu srtt_us %.0f min_rtt_us %.0f lost %llu\n",
                     static_cast<unsigned long long>(st->cwnd), st->smoothed_rtt.count() / 1e3, st->min_rtt.count() / 1e3,
                     static_cast<unsigned long long>(st->packets_lost));
      std::fprintf(trace, "%.2f done\n", static_cast<double>(t_end - t_start) / 1e6);
      std::fflush(trace);
    }
    report("done " + std::to_string(round_index) + " " + std::to_string(t_start) + " " + std::to_string(t_end) + " " +
           std::to_string(round->bytes_sent()) + " " + std::to_string(cpu_ns() - cpu_start) + " " +
           std::to_string(idle.empty_ns.load()) + " " + std::to_string(idle.cwnd_ns.load()) + " " +
           std::to_string(idle.held_ns.load()));
  };
  auto accept = [&](const msg::allreduce_piece& p) {
    auto out = round->on_message(allreduce_piece_ref{p.round, p.ring_step, p.piece, p.payload});
    if (!out) rank_fail("all-reduce: " + out.error().message);
    forward(std::move(*out));
    finish_if_done();
  };

  for (;;) {
    rank_event e = box.pop();
    switch (e.k) {
      case rank_event::kind::eof: std::_Exit(1);  // the coordinator went away
      case rank_event::kind::up: up.insert(e.from); break;
      case rank_event::kind::down:
        // Between rounds a neighbour leaving is its "quit"; during one it is a failure.
        if (round && ((pred && e.from == *pred) || (succ && e.from == *succ))) rank_fail("neighbour went down: " + e.text);
        break;
      case rank_event::kind::message: {
        auto m = msg::decode_message(e.bytes.data(), e.bytes.size());
        if (!m) rank_fail("decode: " + m.error().message);
        ep->recycle(std::move(e.bytes));  // as bridge_actor.cpp does
        auto* p = std::get_if<msg::allreduce_piece>(&*m);
        if (!p) rank_fail(std::string("unexpected message ") + msg::kind_name(*m));
        if (!pred || e.from != *pred) rank_fail("a piece from a rank that is not our predecessor");
        if (!round || p->round != round->round()) rank_fail("a piece of round " + std::to_string(p->round) + " out of turn");
        trace_event("recv", p->ring_step, p->piece);
        if (!running) parked.push_back(std::move(*p));
        else accept(*p);
        break;
      }
      case rank_event::kind::command: {
        auto w = split(e.text);
        if (w.empty()) break;
        if (w[0] == "ring" && w.size() == 4) {
          auto p = node_id::parse(w[1]), s = node_id::parse(w[2]);
          if (!p || !s) rank_fail("bad ring line");
          pred = *p;
          succ = *s;
          watched = &*succ;
          // With two ranks both neighbours are the same peer: one dial is enough.
          if (!(n == 2 && rank == 1)) ep->dial(*succ, {w[3]});
        } else if (w[0] == "prep" && w.size() == 2) {
          round_index = std::stoull(w[1]);
          std::vector<float> data(elems);
          for (size_t i = 0; i < elems; ++i) data[i] = pattern(i, rank, round_index);
          if (inject_error && rank == 0) data[elems / 2] += 1;  // self-test of the check below
          // Round ids start at 1, as train_engine's do; pieces of another round are an error here.
          round = std::make_unique<ring_allreduce>(round_index + 1, rank, n, std::move(data), pieces, *format);
          running = false;
          parked.clear();
          report("prepped");
        } else if (w[0] == "go" && round) {
          t_start = now_ns();
          cpu_start = cpu_ns();
          running = true;
          idle.empty_ns = 0;
          idle.cwnd_ns = 0;
          idle.held_ns = 0;
          sampling = true;
          forward(round->start());
          auto early = std::move(parked);
          parked.clear();
          for (const auto& p : early) accept(p);
          finish_if_done();
        } else if (w[0] == "check" && round && round->done()) {
          const auto& r = round->result();
          std::string verdict = "checked ok";
          for (size_t i = 0; i < elems; ++i) {
            float expected = 0;
            for (int k = 0; k < n; ++k) expected += pattern(i, k, round_index);
            if (r[i] != expected) {
              verdict = "checked bad element " + std::to_string(i) + " is " + std::to_string(r[i]) + ", expected " +
                        std::to_string(expected);
              break;
            }
          }
          round.reset();
          report(verdict);
        } else if (w[0] == "quit") {
          ep->stop();
          std::fflush(nullptr);
          std::_Exit(0);
        } else {
          rank_fail("unknown command: " + e.text);
        }
        break;
      }
    }
    if (!ready_sent && pred && succ && up.count(*pred) && up.count(*succ)) {
      ready_sent = true;
      report("ready");
    }
  }
}

}  // namespace mesh::bench_allreduce
