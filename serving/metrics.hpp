#pragma once
/// Metrics as plain data and their Prometheus text exposition (format 0.0.4), pure: no I/O, no
/// threads. A `metric_family` is one name with its help, type and samples (each a set of label
/// values); `prometheus_text` writes families with HELP and TYPE lines, histograms as cumulative
/// `_bucket{le=...}` lines plus `_sum` and `_count`.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/error.hpp"

namespace mesh::serving {

/// Label name and value pairs, in the order they are written.
using metric_labels = std::vector<std::pair<std::string, std::string>>;

/// Observations counted into buckets by upper bound. Stores per-bucket counts; the exposition
/// makes them cumulative, as Prometheus wants.
class histogram {
 public:
  /// `bounds`: finite upper bounds, strictly ascending (the +Inf bucket is implicit). Bounds
  /// that are not ascending are an error.
  static expected<histogram> create(std::vector<double> bounds);

  /// Counts `value` into the first bucket whose bound is >= value (Prometheus's `le`), else the
  /// +Inf bucket. A NaN is counted in +Inf and makes the sum NaN, as Prometheus's client does.
  void observe(double value);

  const std::vector<double>& bounds() const { return bounds_; }
  /// Cumulative count of observations <= bounds()[i]; index bounds().size() is +Inf (= count()).
  uint64_t cumulative(size_t i) const;
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  ///< per bucket, one more than bounds_ (the +Inf bucket)
  uint64_t count_ = 0;
  double sum_ = 0;
};

enum class metric_type { counter, gauge, histogram };

struct metric_sample {
  metric_labels labels;
  double value = 0;          ///< counter, gauge
  const histogram* hist = nullptr;  ///< histogram families: must outlive the writer's call
};

struct metric_family {
  std::string name;  ///< `meshnode_...`; counters end in `_total`
  std::string help;
  metric_type type = metric_type::gauge;
  std::vector<metric_sample> samples;
};

/// Whether `name` is a valid metric name ([a-zA-Z_:][a-zA-Z0-9_:]*).
bool valid_metric_name(std::string_view name);
/// Whether `name` is a valid label name ([a-zA-Z_][a-zA-Z0-9_]*, not starting with `__`).
bool valid_label_name(std::string_view name);

/// A label value as written between quotes: `\` as `\\`, `"` as `\"`, a newline as `\n`.
std::string escape_label_value(std::string_view value);

/// A sample value: integers without a fraction, others in the shortest form that reads back
/// equal; `+Inf`, `-Inf`, `NaN` as Prometheus spells them.
std::string format_metric_value(double value);

/// The text exposition of `families`, in order, each once. An invalid metric or label name, a
/// family name used twice, a histogram family with a sample without a histogram, or a label
/// `le` on a histogram is an error (the text would be refused by a scraper).
expected<std::string> prometheus_text(std::span<const metric_family> families);

}  // namespace mesh::serving
