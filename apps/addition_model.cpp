#include "apps/addition_model.hpp"

#include <algorithm>
#include <cstdio>

#include "graph/nn.hpp"

namespace mesh::demo {

int32_t token_of(char c) {
  for (int32_t i = 0; i < vocabulary; ++i)
    if (alphabet[i] == c) return i;
  return 0;
}

char char_of(int32_t token) { return token >= 0 && token < vocabulary ? alphabet[token] : '?'; }

std::string format_sum(const addition_task& t, int64_t a, int64_t b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%0*lld+%0*lld=%0*lld", t.digits, static_cast<long long>(a), t.digits,
                static_cast<long long>(b), t.digits + 1, static_cast<long long>(a + b));
  return buf;
}

void make_corpus(const addition_task& t, uint64_t seed, double held_out, std::vector<std::string>& train,
                 std::vector<std::string>& test) {
  int64_t top = 1;
  for (int i = 0; i < t.digits; ++i) top *= 10;
  std::vector<std::string> all;
  if (top * top <= 200000) {
    for (int64_t a = 0; a < top; ++a)
      for (int64_t b = 0; b < top; ++b) all.push_back(format_sum(t, a, b));
  } else {  // too many to list: a random sample
    std::mt19937_64 rng(seed);
    for (int i = 0; i < 200000; ++i) all.push_back(format_sum(t, static_cast<int64_t>(rng() % static_cast<uint64_t>(top)), static_cast<int64_t>(rng() % static_cast<uint64_t>(top))));
  }
  std::mt19937_64 rng(seed);
  for (size_t i = all.size() - 1; i > 0; --i) std::swap(all[i], all[rng() % (i + 1)]);
  const auto n_test = static_cast<size_t>(static_cast<double>(all.size()) * held_out);
  test.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n_test));
  train.assign(all.begin() + static_cast<std::ptrdiff_t>(n_test), all.end());
}

tensor_map make_dataset(const addition_task& t, const std::vector<std::string>& lines) {
  const int64_t n = static_cast<int64_t>(lines.size()), ctx = t.context();
  std::vector<int32_t> x(static_cast<size_t>(n * ctx)), y(static_cast<size_t>(n * ctx));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < ctx; ++i) {
      x[static_cast<size_t>(r * ctx + i)] = token_of(lines[static_cast<size_t>(r)][static_cast<size_t>(i)]);
      y[static_cast<size_t>(r * ctx + i)] = token_of(lines[static_cast<size_t>(r)][static_cast<size_t>(i + 1)]);
    }
  return {{"x", tensor::from_ints({n, ctx}, x)}, {"y", tensor::from_ints({n, ctx}, y)}};
}

namespace {
/// Token + position embeddings, the blocks, a final norm and the projection to the vocabulary.
expr logits_of(builder& b, const addition_task& t, const expr& x, int64_t rows) {
  const int64_t ctx = t.context(), c = t.channels;
  const expr tokens = b.parameter("embed.tokens", dtype::f32, {vocabulary, c});
  const expr positions = b.parameter("embed.positions", dtype::f32, {ctx, c});
  expr h = gather(tokens, x) + broadcast_to(reshape(positions, {1, ctx, c}), {rows, ctx, c});
  for (int l = 0; l < t.layers; ++l) h = nn::make_transformer_block(b, "block" + std::to_string(l), c, t.heads)(h);
  const expr gamma = b.parameter("final.gamma", dtype::f32, {c});
  const expr beta = b.parameter("final.beta", dtype::f32, {c});
  const auto head = nn::make_linear(b, "head", c, vocabulary);
  return head(nn::layer_norm(h, gamma, beta));
}
}  // namespace

graph make_training_model(const addition_task& t) {
  builder b;
  const int64_t ctx = t.context();
  const expr x = b.input("x", dtype::i32, {t.batch, ctx});
  const expr y = b.input("y", dtype::i32, {t.batch, ctx});
  const expr logp = nn::log_softmax(logits_of(b, t, x, t.batch));
  const expr picked = sum(logp * nn::one_hot(y, vocabulary), {-1});  // [batch, ctx]
  // Only the answer's characters count: they are predicted at positions answer_start - 1 ...
  std::vector<double> mask(static_cast<size_t>(ctx), 0.0);
  for (int64_t i = t.answer_start() - 1; i < ctx; ++i) mask[static_cast<size_t>(i)] = 1.0;
  const double answer_chars = static_cast<double>(ctx - (t.answer_start() - 1));
  const expr m = broadcast_to(reshape(b.constant(tensor::from_values(dtype::f32, {ctx}, mask)), {1, ctx}), {t.batch, ctx});
  b.output("loss", neg(sum_all(picked * m)) * (1.0 / (answer_chars * static_cast<double>(t.batch))));
  return *b.finish();
}

graph make_inference_model(const addition_task& t, int64_t rows) {
  builder b;
  const expr x = b.input("x", dtype::i32, {rows, t.context()});
  b.output("logits", logits_of(b, t, x, rows));
  return *b.finish();
}

double score(const std::vector<std::string>& completed) {
  if (completed.empty()) return 0;
  int right = 0;
  for (const auto& l : completed) {
    long long a = 0, b = 0, c = 0;
    if (std::sscanf(l.c_str(), "%lld+%lld=%lld", &a, &b, &c) == 3 && a + b == c) ++right;
  }
  return static_cast<double>(right) / static_cast<double>(completed.size());
}

}  // namespace mesh::demo
