#pragma once
/// A line plot as a self-contained SVG file (any browser shows it): the demo's loss curve.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace mesh::app {

/// Writes `points` (x, y) as a polyline with labelled axes. Returns false if the file cannot be written.
inline bool write_line_plot_svg(const std::string& path, const std::vector<std::pair<double, double>>& points,
                                const std::string& title, const std::string& x_label, const std::string& y_label) {
  const double w = 720, h = 420, left = 70, right = 20, top = 40, bottom = 50;
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (!points.empty()) {
    x0 = x1 = points[0].first;
    y1 = points[0].second;
    for (const auto& [x, y] : points) {
      x0 = std::min(x0, x);
      x1 = std::max(x1, x);
      y1 = std::max(y1, y);
    }
    if (x1 == x0) x1 = x0 + 1;
    if (y1 <= y0) y1 = y0 + 1;
  }
  const auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * (w - left - right); };
  const auto py = [&](double y) { return h - bottom - (y - y0) / (y1 - y0) * (h - top - bottom); };
  std::string s;
  char buf[256];
  std::snprintf(buf, sizeof buf, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" font-size=\"12\">\n", w, h);
  s += buf;
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  std::snprintf(buf, sizeof buf, "<text x=\"%.0f\" y=\"24\" font-size=\"16\">%s</text>\n", left, title.c_str());
  s += buf;
  for (int i = 0; i <= 5; ++i) {  // grid and tick labels
    const double yv = y0 + (y1 - y0) * i / 5, xv = x0 + (x1 - x0) * i / 5;
    std::snprintf(buf, sizeof buf, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", left, py(yv), w - right, py(yv));
    s += buf;
    std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.2f</text>\n", left - 6, py(yv) + 4, yv);
    s += buf;
    std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.0f</text>\n", px(xv), h - bottom + 18, xv);
    s += buf;
  }
  std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", (left + w - right) / 2, h - 10, x_label.c_str());
  s += buf;
  std::snprintf(buf, sizeof buf, "<text x=\"16\" y=\"%.1f\" transform=\"rotate(-90 16 %.1f)\" text-anchor=\"middle\">%s</text>\n", (top + h - bottom) / 2, (top + h - bottom) / 2, y_label.c_str());
  s += buf;
  s += "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"";
  for (const auto& [x, y] : points) {
    std::snprintf(buf, sizeof buf, "%.1f,%.1f ", px(x), py(y));
    s += buf;
  }
  s += "\"/>\n</svg>\n";
  std::ofstream f(path);
  f << s;
  return static_cast<bool>(f);
}

}  // namespace mesh::app
