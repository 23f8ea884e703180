#include "wire/wire_graph.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <new>

#include "wire/graph_codec.hpp"

namespace mesh {
namespace {

constexpr uint32_t wire_magic = 0x4652474d;  // "MGRF" read as a little-endian u32

}  // namespace

expected<std::vector<char>> encode(const wire_graph& w) {
  std::vector<named_tensor> ts;
  ts.reserve(w.tensors.size());
  for (const auto& [name, t] : w.tensors) ts.push_back({name, t});
  std::vector<uint8_t> bytes;
  wire::writer out(bytes);
  out(wire_magic, wire_graph_version, w.g, ts);
  if (!out.fits()) return make_error(error_code::limit_exceeded, "WireGraph: a list or tensor has more than 2^32 elements");
  return std::vector<char>(bytes.begin(), bytes.end());
}

expected<wire_graph> decode_wire_graph(const char* data, size_t size, const graph_limits& limits) {
  // The graph's own bound on tensor bytes (twice: the graph's constants and the tensors), saturating.
  const auto tensor_bound = static_cast<size_t>(std::max<int64_t>(limits.max_total_bytes, 0));
  const size_t cap = tensor_bound > (SIZE_MAX - wire::decode_slack) / 2 ? SIZE_MAX : tensor_bound * 2 + wire::decode_slack;
  const auto budget = wire::decode_budget(size, cap);
  wire::reader src(reinterpret_cast<const uint8_t*>(data), size, budget);
  uint32_t magic = 0, version = 0;
  src(magic, version);
  if (!src.ok()) return make_error(error_code::decode_error, "WireGraph header: " + src.error().message);
  if (magic != wire_magic) return make_error(error_code::decode_error, "not a WireGraph (bad magic number)");
  if (version != wire_graph_version)
    return make_error(error_code::version_mismatch, "WireGraph version " + std::to_string(version) +
                                                        " received, this node speaks version " +
                                                        std::to_string(wire_graph_version) + ": upgrade the older node");
  wire_graph w;
  std::vector<named_tensor> ts;
  try {
    src(w.g, ts);
  } catch (const std::bad_alloc&) {  // within the budget, yet more than this process could get
    return make_error(error_code::limit_exceeded, "WireGraph: out of memory while decoding " + std::to_string(size) + " bytes");
  }
  if (!src.ok()) return make_error(src.error().code, "WireGraph: " + src.error().message);
  if (src.remaining() != 0)
    return make_error(error_code::decode_error, "WireGraph: " + std::to_string(src.remaining()) + " trailing bytes");
  if (auto ok = validate(w.g, limits); !ok) return tl::unexpected(ok.error());
  int64_t tensor_bytes = 0;
  for (auto& nt : ts) {
    if (auto ok = nt.value.check(); !ok)
      return make_error(ok.error().code, "WireGraph tensor \"" + nt.name + "\": " + ok.error().message);
    tensor_bytes += static_cast<int64_t>(nt.value.bytes.size());
    if (tensor_bytes > limits.max_total_bytes)
      return make_error(error_code::limit_exceeded, "WireGraph tensors exceed " + std::to_string(limits.max_total_bytes) + " bytes");
    if (!w.tensors.emplace(nt.name, std::move(nt.value)).second)
      return make_error(error_code::decode_error, "WireGraph: tensor \"" + nt.name + "\" appears twice");
  }
  return w;
}

}  // namespace mesh
