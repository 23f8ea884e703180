#include "serving/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include <fmt/format.h>

namespace mesh::serving {

expected<histogram> histogram::create(std::vector<double> bounds) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i])) return make_error(error_code::invalid_argument, "histogram bounds must be finite");
    if (i > 0 && !(bounds[i - 1] < bounds[i]))
      return make_error(error_code::invalid_argument, "histogram bounds must be strictly ascending");
  }
  histogram h;
  h.counts_.assign(bounds.size() + 1, 0);
  h.bounds_ = std::move(bounds);
  return h;
}

void histogram::observe(double value) {
  // lower_bound: the first bound >= value, so a value equal to a bound is in that bucket (le).
  // NaN compares false with everything and lands in +Inf.
  const size_t i = std::isnan(value) ? bounds_.size()
                                     : static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  ++counts_[i];
  ++count_;
  sum_ += value;
}

uint64_t histogram::cumulative(size_t i) const {
  uint64_t n = 0;
  for (size_t k = 0; k <= i && k < counts_.size(); ++k) n += counts_[k];
  return n;
}

bool valid_metric_name(std::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool valid_label_name(std::string_view name) {
  if (name.empty() || name.starts_with("__")) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (const char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

namespace {

/// HELP text escapes only backslash and newline (quotes are literal there).
std::string escape_help(std::string_view help) {
  std::string out;
  for (const char c : help) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

const char* type_name(metric_type t) {
  switch (t) {
    case metric_type::counter: return "counter";
    case metric_type::gauge: return "gauge";
    case metric_type::histogram: return "histogram";
  }
  return "untyped";
}

/// `{a="x",b="y"}` (nothing for no labels), with `extra` (e.g. le) appended last.
void write_labels(std::string& out, const metric_labels& labels, std::string_view extra_name = {},
                  std::string_view extra_value = {}) {
  if (labels.empty() && extra_name.empty()) return;
  out += '{';
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (!first) out += ',';
    first = false;
    out += fmt::format("{}=\"{}\"", k, escape_label_value(v));
  }
  if (!extra_name.empty()) {
    if (!first) out += ',';
    out += fmt::format("{}=\"{}\"", extra_name, extra_value);
  }
  out += '}';
}

}  // namespace

std::string format_metric_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Integers (counts, bytes) below 2^53 are exact as doubles: print them without exponent.
  if (value == std::floor(value) && std::fabs(value) < 9007199254740992.0)
    return fmt::format("{}", static_cast<int64_t>(value));
  return fmt::format("{}", value);  // shortest text that reads back to the same double
}

expected<std::string> prometheus_text(std::span<const metric_family> families) {
  std::string out;
  std::set<std::string, std::less<>> seen;
  for (const auto& f : families) {
    if (!valid_metric_name(f.name)) return make_error(error_code::invalid_argument, fmt::format("invalid metric name '{}'", f.name));
    if (!seen.insert(f.name).second)
      return make_error(error_code::invalid_argument, fmt::format("metric family '{}' given twice", f.name));
    for (const auto& s : f.samples)
      for (const auto& [k, v] : s.labels) {
        if (!valid_label_name(k))
          return make_error(error_code::invalid_argument, fmt::format("metric '{}': invalid label name '{}'", f.name, k));
        if (f.type == metric_type::histogram && k == "le")
          return make_error(error_code::invalid_argument, fmt::format("histogram '{}' may not have a label 'le'", f.name));
      }
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", f.name, escape_help(f.help), f.name, type_name(f.type));
    for (const auto& s : f.samples) {
      if (f.type != metric_type::histogram) {
        out += f.name;
        write_labels(out, s.labels);
        out += ' ' + format_metric_value(s.value) + '\n';
        continue;
      }
      if (!s.hist) return make_error(error_code::invalid_argument, fmt::format("histogram '{}' has a sample without data", f.name));
      const auto& bounds = s.hist->bounds();
      for (size_t i = 0; i <= bounds.size(); ++i) {
        out += f.name + "_bucket";
        write_labels(out, s.labels, "le", i < bounds.size() ? format_metric_value(bounds[i]) : "+Inf");
        out += ' ' + format_metric_value(static_cast<double>(s.hist->cumulative(i))) + '\n';
      }
      out += f.name + "_sum";
      write_labels(out, s.labels);
      out += ' ' + format_metric_value(s.hist->sum()) + '\n';
      out += f.name + "_count";
      write_labels(out, s.labels);
      out += ' ' + format_metric_value(static_cast<double>(s.hist->count())) + '\n';
    }
  }
  return out;
}

}  // namespace mesh::serving
