#pragma once
/// op_kind::attention on host memory, in double: the reference evaluator and the CPU executor
/// both run it (the Vulkan kernel, glsl_attention.cpp, is checked against them).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace mesh {

/// The sizes of one attention node: q [batch..., l, h, d], k and v [batch..., t, kv, d].
struct attention_shape {
  int64_t batch = 1, l = 0, h = 0, d = 0, t = 0, kv = 1, window = 0;
};

/// out [batch, l, h, d] = attention of q against k, v (row-major, as the op's operands); pos
/// [batch, l]. `Q`, `K`, `V`, `P`: anything indexable that yields numbers. Only heads
/// [head_begin, head_end) are written (all by default): callers may split the heads over threads.
template <class Q, class K, class V, class P, class Out>
void attention_rows(const attention_shape& s, const Q& q, const K& k, const V& v, const P& pos, Out& out, int64_t head_begin = 0,
                    int64_t head_end = -1) {
  const int64_t group = s.h / s.kv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  std::vector<double> w(static_cast<size_t>(s.t)), acc(static_cast<size_t>(s.d));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < s.l; ++i) {
      const auto p = static_cast<int64_t>(pos[static_cast<size_t>(b * s.l + i)]);
      // Keys [first, last) are visible: s <= p, and within the window.
      const int64_t last = std::min(s.t, p + 1), first = s.window > 0 ? std::max<int64_t>(0, p - s.window + 1) : 0;
      for (int64_t j = head_begin; j < (head_end < 0 ? s.h : head_end); ++j) {
        const int64_t qo = ((b * s.l + i) * s.h + j) * s.d, kvh = j / group;
        double top = -INFINITY;
        for (int64_t t = first; t < last; ++t) {
          const int64_t ko = ((b * s.t + t) * s.kv + kvh) * s.d;
          double dot = 0;
          for (int64_t e = 0; e < s.d; ++e) dot += static_cast<double>(q[static_cast<size_t>(qo + e)]) * static_cast<double>(k[static_cast<size_t>(ko + e)]);
          w[static_cast<size_t>(t)] = dot * scale;
          top = std::max(top, dot * scale);
        }
        double sum = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t t = first; t < last; ++t) {
          const double e = std::exp(w[static_cast<size_t>(t)] - top);
          sum += e;
          const int64_t vo = ((b * s.t + t) * s.kv + kvh) * s.d;
          for (int64_t x = 0; x < s.d; ++x) acc[static_cast<size_t>(x)] += e * static_cast<double>(v[static_cast<size_t>(vo + x)]);
        }
        for (int64_t x = 0; x < s.d; ++x) out[static_cast<size_t>(qo + x)] = sum > 0 ? acc[static_cast<size_t>(x)] / sum : 0.0;
      }
    }
}

/// The sizes of attention node operands q and k (dims as the op takes them) and its window.
inline attention_shape attention_shape_of(const std::vector<int64_t>& q, const std::vector<int64_t>& k, int64_t window) {
  attention_shape s;
  const size_t r = q.size();
  for (size_t i = 0; i + 3 < r; ++i) s.batch *= q[i];
  s.l = q[r - 3];
  s.h = q[r - 2];
  s.d = q[r - 1];
  s.t = k[r - 3];
  s.kv = k[r - 2];
  s.window = window;
  return s;
}

}  // namespace mesh
