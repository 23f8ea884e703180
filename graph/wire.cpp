#include "graph/wire.hpp"

#include "graph/caf_codec.hpp"
#include "graph/wire_inspect.hpp"

namespace mesh {
namespace {

constexpr uint32_t wire_magic = 0x4652474d;  // "MGRF" as a little-endian u32 (CAF writes it big-endian)

}  // namespace

expected<std::vector<char>> encode(const wire_graph& w) {
  uint32_t magic = wire_magic, version = wire_graph_version;
  graph g = w.g;
  std::vector<named_tensor> ts;
  for (const auto& [name, t] : w.tensors) ts.push_back({name, t});
  return caf_encode(magic, version, g, ts);
}

expected<wire_graph> decode_wire_graph(const char* data, size_t size, const graph_limits& limits) {
  bounded_deserializer src(data, size);
  uint32_t magic = 0, version = 0;
  if (auto ok = caf_decode(src, size, "WireGraph header", magic, version); !ok) return tl::unexpected(ok.error());
  if (magic != wire_magic) return make_error(error_code::decode_error, "not a WireGraph (bad magic number)");
  if (version != wire_graph_version)
    return make_error(error_code::version_mismatch, "WireGraph version " + std::to_string(version) +
                                                        " received, this node speaks version " +
                                                        std::to_string(wire_graph_version) + ": upgrade the older node");
  wire_graph w;
  std::vector<named_tensor> ts;
  if (auto ok = caf_decode(src, size, "WireGraph", w.g, ts); !ok) return tl::unexpected(ok.error());
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
