#include "models/sampler.hpp"

#include <algorithm>
#include <limits>
#include <cmath>
#include <numeric>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>

namespace mesh::models {

expected<sampler> sampler::create(const sampling_options& o) {
  if (!std::isfinite(o.temperature))
    return make_error(error_code::invalid_argument, fmt::format("sampling: temperature {} is not finite", o.temperature));
  if (!(o.top_p > 0.0f && o.top_p <= 1.0f))
    return make_error(error_code::invalid_argument, fmt::format("sampling: top_p {} is outside (0, 1]", o.top_p));
  if (!(o.min_p >= 0.0f && o.min_p <= 1.0f))
    return make_error(error_code::invalid_argument, fmt::format("sampling: min_p {} is outside [0, 1]", o.min_p));
  if (!(o.repetition_penalty > 0.0f) || !std::isfinite(o.repetition_penalty))
    return make_error(error_code::invalid_argument,
                      fmt::format("sampling: repetition_penalty {} must be a positive number", o.repetition_penalty));
  if (o.top_k < 0) return make_error(error_code::invalid_argument, fmt::format("sampling: top_k {} is negative", o.top_k));
  return sampler(o);
}

token_logprob token_log_probabilities(std::span<const float> logits, int32_t chosen, int32_t top) {
  token_logprob out;
  out.id = chosen;
  if (logits.empty()) return out;
  // log p_i = x_i - (max + log sum_j exp(x_j - max)): stable for any logit range.
  const double peak = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (const float v : logits) sum += std::exp(static_cast<double>(v) - peak);
  const double log_z = peak + std::log(sum);
  const auto n = static_cast<int32_t>(logits.size());
  const auto lp = [&](int32_t id) { return static_cast<double>(logits[static_cast<size_t>(id)]) - log_z; };
  if (chosen >= 0 && chosen < n) out.logprob = lp(chosen);
  const int32_t k = std::clamp(top, 0, std::min(max_top_logprobs, n));
  if (k == 0) return out;
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
    const float xa = logits[static_cast<size_t>(a)], xb = logits[static_cast<size_t>(b)];
    return xa != xb ? xa > xb : a < b;
  });
  for (int32_t i = 0; i < k; ++i) out.top.emplace_back(ids[static_cast<size_t>(i)], lp(ids[static_cast<size_t>(i)]));
  return out;
}

int32_t first_argmax(std::span<const float> logits) {
  // Eight independent running maxima (no loop-carried compare chain); x > m keeps m for NaN.
  constexpr size_t lanes = 8;
  float m[lanes];
  std::fill(std::begin(m), std::end(m), -std::numeric_limits<float>::infinity());
  const size_t n = logits.size(), whole = n - n % lanes;
  for (size_t i = 0; i < whole; i += lanes)
    for (size_t j = 0; j < lanes; ++j) m[j] = logits[i + j] > m[j] ? logits[i + j] : m[j];
  for (size_t i = whole; i < n; ++i) m[0] = logits[i] > m[0] ? logits[i] : m[0];
  const float top = *std::max_element(std::begin(m), std::end(m));
  for (size_t i = 0; i < n; ++i)
    if (logits[i] == top) return static_cast<int32_t>(i);
  return 0;  // every logit NaN
}

double sampler::uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

int32_t sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  const auto n = static_cast<int32_t>(logits.size());
  const bool greedy = options_.temperature <= 0.0f || n == 1;
  if (greedy && options_.repetition_penalty == 1.0f) return first_argmax(logits);  // no copy of the logits
  std::vector<float> x(logits.begin(), logits.end());
  if (options_.repetition_penalty != 1.0f) {
    std::unordered_set<int32_t> seen(history.begin(), history.end());
    for (const int32_t t : seen) {
      if (t < 0 || t >= n) continue;
      x[static_cast<size_t>(t)] = x[static_cast<size_t>(t)] > 0 ? x[static_cast<size_t>(t)] / options_.repetition_penalty
                                                                 : x[static_cast<size_t>(t)] * options_.repetition_penalty;
    }
  }
  if (greedy) return first_argmax(x);

  // Candidates sorted by logit, highest first (ties by id, so the order is deterministic).
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  auto by_logit = [&](int32_t a, int32_t b) {
    const float xa = x[static_cast<size_t>(a)], xb = x[static_cast<size_t>(b)];
    return xa != xb ? xa > xb : a < b;
  };
  size_t keep = ids.size();
  if (options_.top_k > 0 && static_cast<size_t>(options_.top_k) < keep) {
    keep = static_cast<size_t>(options_.top_k);
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(keep), ids.end(), by_logit);
  } else {
    std::sort(ids.begin(), ids.end(), by_logit);
  }
  ids.resize(keep);
  // Probabilities of the kept candidates at the temperature, in double.
  const double t = options_.temperature, top = x[static_cast<size_t>(ids[0])];
  std::vector<double> p(keep);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += p[i] = std::exp((x[static_cast<size_t>(ids[i])] - top) / t);
  for (auto& v : p) v /= total;
  if (options_.top_p < 1.0f) {
    double sum = 0;
    size_t k = 0;
    while (k < keep && sum < options_.top_p) sum += p[k++];
    keep = std::max<size_t>(k, 1);
  }
  if (options_.min_p > 0.0f) {
    const double floor = options_.min_p * p[0];
    size_t k = 1;
    while (k < keep && p[k] >= floor) ++k;
    keep = k;
  }
  double mass = 0;
  for (size_t i = 0; i < keep; ++i) mass += p[i];
  const double r = uniform() * mass;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (r < acc) return ids[i];
  }
  return ids[keep - 1];
}

}  // namespace mesh::models
