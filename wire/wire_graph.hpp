#pragma once
/// WireGraph: the versioned serialized form of a graph plus named tensors, as it travels between
/// nodes. Decoding is parsing plus validate(): bytes from a peer are never trusted.
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "graph/evaluate.hpp"
#include "graph/graph.hpp"
#include "graph/validate.hpp"

namespace mesh {

/// Bumped on any change to the encoding of graphs or tensors.
inline constexpr uint32_t wire_graph_version = 2;

/// A graph and the tensors that go with it (inputs, parameters).
struct wire_graph {
  graph g;
  tensor_map tensors;
  bool operator==(const wire_graph&) const = default;
};

/// Bytes: magic "MGRF", version, graph, tensors (wire/codec.hpp's format, wire/graph_codec.hpp's
/// fields). Fails only when a tensor or list is too large for the format's 32-bit counts.
expected<std::vector<char>> encode(const wire_graph& w);

/// Parses and validates. Errors: version_mismatch (names both versions), decode_error (truncated,
/// malformed, trailing bytes), limit_exceeded (decoding would allocate past the codec's budget,
/// see wire/codec.hpp, or from validate()), invalid_graph / shape_mismatch from validate(),
/// invalid_argument for a tensor whose bytes do not match its dtype and shape.
expected<wire_graph> decode_wire_graph(const char* data, size_t size, const graph_limits& limits = {});

}  // namespace mesh
