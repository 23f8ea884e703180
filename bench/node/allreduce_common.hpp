#pragma once
// bench_allreduce's pieces shared by its two sides (bench_allreduce.cpp: the coordinating process;
// allreduce_rank.cpp: a rank process): the data pattern, clocks, hex, arguments.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include "wire/messages.hpp"
#include "actors/ring_allreduce.hpp"
#include "transport/endpoint.hpp"

namespace mesh::bench_allreduce {

using namespace mesh;
using clk = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------------

/// The value rank `rank` contributes at element `i` in round `round`: integers in [-15, 15], so
/// sums over up to 17 ranks stay exact in bf16 (8 significant bits) as well as f32.
inline float pattern(uint64_t i, int rank, uint64_t round) {
  return static_cast<float>(static_cast<int64_t>((7 * i + 13 * static_cast<uint64_t>(rank) + 5 * round) % 31) - 15);
}

/// Nanoseconds on CLOCK_MONOTONIC (libstdc++'s steady_clock), comparable between processes.
inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(clk::now().time_since_epoch()).count();
}

/// CPU time (user + system, all threads) of this process so far, in nanoseconds: the
/// load-independent cost of a round on a machine shared with other work.
inline int64_t cpu_ns() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return (static_cast<int64_t>(ru.ru_utime.tv_sec) + ru.ru_stime.tv_sec) * 1000000000 +
         (static_cast<int64_t>(ru.ru_utime.tv_usec) + ru.ru_stime.tv_usec) * 1000;
}

inline std::string to_hex(const uint8_t* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += digits[p[i] >> 4];
    s += digits[p[i] & 15];
  }
  return s;
}

inline std::optional<std::vector<uint8_t>> from_hex(const std::string& s) {
  if (s.size() % 2) return std::nullopt;
  std::vector<uint8_t> out;
  for (size_t i = 0; i < s.size(); i += 2) {
    auto v = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    const int hi = v(s[i]), lo = v(s[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out.push_back(static_cast<uint8_t>(hi * 16 + lo));
  }
  return out;
}

inline std::vector<std::string> split(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

/// Command-line flags: "--name value" or "--name" (a switch).
struct args {
  std::vector<std::string> v;
  std::optional<std::string> get(const std::string& name) const {
    for (size_t i = 0; i + 1 < v.size(); ++i)
      if (v[i] == name) return v[i + 1];
    return std::nullopt;
  }
  bool has(const std::string& name) const { return std::find(v.begin(), v.end(), name) != v.end(); }
  long num(const std::string& name, long fallback) const {
    auto s = get(name);
    return s ? std::atol(s->c_str()) : fallback;
  }
  double real(const std::string& name, double fallback) const {
    auto s = get(name);
    return s ? std::atof(s->c_str()) : fallback;
  }
};

inline std::optional<wire_format> parse_format(const std::string& s) {
  if (s == "f32") return wire_format::f32;
  if (s == "bf16") return wire_format::bf16;
  if (s == "f16") return wire_format::f16;
  return std::nullopt;
}

/// A rank process's main (bench_allreduce --rank R ...): allreduce_rank.cpp.
int rank_main(const args& a);

}  // namespace mesh::bench_allreduce
