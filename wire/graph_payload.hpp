#pragma once
/// A graph inside a message (a job's graph, a stage's fragment, a session's model, a training
/// run's step graphs), with the tensors it carries: decoded and validated once, by the codec, as
/// the message is decoded, against the receiver's graph_limits. Engines get a checked graph
/// shared by pointer, never bytes.
///
/// A graph that fails to decode or validate does not make the whole message fail: the payload
/// keeps the error, so the engine can answer the sender with it ("your graph was refused: ...")
/// instead of the message vanishing into the refusal log. It also keeps the bytes, so a message
/// that carries it is encoded again exactly as it came.
///
/// On the wire: one byte (0 absent, 1 present), then for a present graph the WireGraph bytes as a
/// u32 count and the bytes (wire/wire_graph.hpp). The outer decoder charges the bytes to its
/// budget; decode_wire_graph bounds what the graph itself allocates by its own size.
#include <memory>
#include <optional>
#include <vector>

#include "base/error.hpp"
#include "wire/codec.hpp"
#include "wire/wire_graph.hpp"

namespace mesh {

struct graph_payload {
  /// The checked graph and tensors; null when absent or when they failed.
  std::shared_ptr<const wire_graph> value;
  /// Why the bytes that came did not decode or validate.
  std::optional<error> problem;
  /// The bytes that failed (only then), to encode the message again as it came.
  std::vector<char> failed_bytes;

  graph_payload() = default;
  /// A graph built here (not validated here: the receiver validates what it decodes).
  explicit graph_payload(wire_graph w) : value(std::make_shared<const wire_graph>(std::move(w))) {}
  explicit graph_payload(std::shared_ptr<const wire_graph> w) : value(std::move(w)) {}

  /// Decodes and validates WireGraph bytes the way a received message's payload is.
  static graph_payload from_bytes(const char* data, size_t size, const graph_limits& limits = {});

  /// Nothing was sent (e.g. a session call whose fragment the worker has cached).
  bool empty() const { return !value && !problem; }
  /// The checked graph, or the error it came with ("no graph" when absent). `what` names the
  /// payload in the error ("the job's graph").
  expected<std::shared_ptr<const wire_graph>> get(const char* what) const;

  /// Same graph and tensors (or the same failed bytes): for round-trip tests.
  bool operator==(const graph_payload& other) const;
};

void fields(wire::writer& f, graph_payload& x);
void fields(wire::reader& f, graph_payload& x);

}  // namespace mesh
