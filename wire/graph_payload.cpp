#include "wire/graph_payload.hpp"

#include <string>

namespace mesh {

graph_payload graph_payload::from_bytes(const char* data, size_t size, const graph_limits& limits) {
  graph_payload p;
  auto w = decode_wire_graph(data, size, limits);
  if (w) {
    p.value = std::make_shared<const wire_graph>(std::move(*w));
  } else {
    p.problem = w.error();
    p.failed_bytes.assign(data, data + size);
  }
  return p;
}

expected<std::shared_ptr<const wire_graph>> graph_payload::get(const char* what) const {
  if (value) return value;
  if (problem) return make_error(problem->code, std::string(what) + " was rejected: " + problem->to_string());
  return make_error(error_code::invalid_argument, std::string(what) + " is missing");
}

bool graph_payload::operator==(const graph_payload& other) const {
  if (bool(value) != bool(other.value) || problem.has_value() != other.problem.has_value()) return false;
  if (value && !(*value == *other.value)) return false;
  return failed_bytes == other.failed_bytes;
}

void fields(wire::writer& f, graph_payload& x) {
  if (x.value) {
    auto bytes = encode(*x.value);
    if (!bytes) {
      f.mark_too_large();
      return;
    }
    f(uint8_t{1}, *bytes);
  } else if (x.problem) {
    f(uint8_t{1}, x.failed_bytes);
  } else {
    f(uint8_t{0});
  }
}

void fields(wire::reader& f, graph_payload& x) {
  uint8_t present = 0;
  f(present);
  if (!f.ok() || present == 0) return;
  if (present != 1) return f.fail("a graph flag of value " + std::to_string(present));
  uint32_t size = 0;
  f(size);
  const uint8_t* bytes = f.view(size);
  if (!bytes || !f.spend(size)) return;
  static const graph_limits defaults{};
  x = graph_payload::from_bytes(reinterpret_cast<const char*>(bytes), size, f.limits() ? *f.limits() : defaults);
}

}  // namespace mesh
