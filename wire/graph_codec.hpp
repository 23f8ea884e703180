#pragma once
/// The wire form of the graph IR's types (graph/graph.hpp, graph/tensor.hpp): their fields() for
/// the codec and the ranges of their enums. Decoded graphs still go through validate() and
/// decoded tensors through tensor::check(): this only says how the bytes are laid out.
#include "graph/graph.hpp"
#include "graph/planner.hpp"
#include "graph/tensor.hpp"
#include "wire/codec.hpp"

namespace mesh {

constexpr uint8_t enum_limit(dtype) { return static_cast<uint8_t>(dtype_count); }
constexpr uint8_t enum_limit(op_kind) { return static_cast<uint8_t>(op_count); }
constexpr uint8_t enum_limit(compare_kind) { return 6; }
constexpr uint8_t enum_limit(strategy) { return 4; }

template <class F>
void fields(F& f, attributes& x) {
  f(x.name, x.axes, x.starts, x.stops, x.axis, x.cmp, x.keep_dims, x.values);
}
template <class F>
void fields(F& f, node& x) {
  f(x.op, x.type, x.dims, x.inputs, x.attrs);
}
template <class F>
void fields(F& f, output& x) {
  f(x.name, x.id);
}
template <class F>
void fields(F& f, update& x) {
  f(x.target, x.value);
}
template <class F>
void fields(F& f, graph& x) {
  f(x.nodes, x.outputs, x.updates);
}
template <class F>
void fields(F& f, tensor& x) {
  f(x.type, x.dims, x.bytes);
}
template <class F>
void fields(F& f, named_tensor& x) {
  f(x.name, x.value);
}

}  // namespace mesh
