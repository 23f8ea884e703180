#pragma once
/// The demo's task: a small character-level transformer that learns addition from text the
/// program writes itself ("47+85=132", zero-padded to a fixed width), then answers new sums
/// through pipelined inference. Nothing is downloaded.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "graph/builder.hpp"
#include "graph/evaluate.hpp"

namespace mesh::demo {

struct addition_task {
  int digits = 2;          ///< of each operand
  int64_t channels = 48;   ///< transformer width
  int64_t heads = 4;
  int layers = 2;
  int64_t batch = 32;      ///< rows per micro-batch

  /// Characters per line: "a+b=c" with a, b of `digits` and c of digits + 1.
  int64_t line_length() const { return 3 * digits + 3; }
  /// Characters the model reads: all but the last.
  int64_t context() const { return line_length() - 1; }
  /// The answer's first position in the line.
  int64_t answer_start() const { return 2 * digits + 2; }
};

inline constexpr char alphabet[] = "0123456789+=";
inline constexpr int64_t vocabulary = 12;

int32_t token_of(char c);
char char_of(int32_t token);

/// "07+45=052"
std::string format_sum(const addition_task& t, int64_t a, int64_t b);

/// Every sum of two operands as lines, shuffled with `seed`, split into training and held-out
/// lines (the held-out ones are never trained on).
void make_corpus(const addition_task& t, uint64_t seed, double held_out, std::vector<std::string>& train,
                 std::vector<std::string>& test);

/// Dataset columns "x" (tokens of a line but the last) and "y" (the next character at each
/// position), both i32 [lines, context].
tensor_map make_dataset(const addition_task& t, const std::vector<std::string>& lines);

/// The training graph: inputs x, y [batch, context]; output "loss" = mean cross-entropy of the
/// answer characters only (the operands are random, nothing to learn there).
graph make_training_model(const addition_task& t);
/// The inference graph: input x [rows, context]; output "logits" [rows, context, vocabulary].
graph make_inference_model(const addition_task& t, int64_t rows);

/// Greedy decoding of the answers of `prompts` (lines whose answer part is ignored) with a
/// function that maps tokens x [rows, context] to logits. Returns the completed lines.
template <class Logits>
std::vector<std::string> complete(const addition_task& t, std::vector<std::string> lines, Logits&& logits_of);

/// Share of `completed` lines whose sum is right.
double score(const std::vector<std::string>& completed);

// ---- template ----
template <class Logits>
std::vector<std::string> complete(const addition_task& t, std::vector<std::string> lines, Logits&& logits_of) {
  const int64_t ctx = t.context(), rows = static_cast<int64_t>(lines.size());
  for (auto& l : lines)
    for (int64_t i = t.answer_start(); i < t.line_length(); ++i) l[static_cast<size_t>(i)] = '0';
  for (int64_t pos = t.answer_start(); pos < t.line_length(); ++pos) {
    std::vector<int32_t> x(static_cast<size_t>(rows * ctx));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < ctx; ++i) x[static_cast<size_t>(r * ctx + i)] = token_of(lines[static_cast<size_t>(r)][static_cast<size_t>(i)]);
    const tensor logits = logits_of(tensor::from_ints({rows, ctx}, x));
    if (logits.size() != rows * ctx * vocabulary) return {};
    const auto v = logits.to_floats();
    for (int64_t r = 0; r < rows; ++r) {
      // The prediction for position `pos` is read at position pos - 1; only digits are valid.
      const float* row = v.data() + (r * ctx + pos - 1) * vocabulary;
      int32_t best = 0;
      for (int32_t k = 1; k < 10; ++k)
        if (row[k] > row[best]) best = k;
      lines[static_cast<size_t>(r)][static_cast<size_t>(pos)] = char_of(best);
    }
  }
  return lines;
}

}  // namespace mesh::demo
