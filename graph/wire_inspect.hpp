#pragma once
/// CAF `inspect` overloads for the graph IR types: the one description of their wire form, used by
/// WireGraph and by every actor message that carries graphs or tensors.
///
/// Only CAF's tiny meta header is included, so this header stays cheap; the serializers live in
/// wire.cpp / caf_codec.cpp. Enums travel as their underlying integer; decoders re-check ranges
/// (validate() for graphs, tensor::check() for tensors).
#include <caf/meta/type_name.hpp>

#include "graph/graph.hpp"
#include "graph/tensor.hpp"

namespace mesh {

template <class F>
typename F::result_type inspect(F& f, attributes& x) {
  return f(caf::meta::type_name("attributes"), x.name, x.axes, x.starts, x.stops, x.axis, x.cmp, x.keep_dims, x.values);
}

template <class F>
typename F::result_type inspect(F& f, node& x) {
  return f(caf::meta::type_name("node"), x.op, x.type, x.dims, x.inputs, x.attrs);
}

template <class F>
typename F::result_type inspect(F& f, output& x) {
  return f(caf::meta::type_name("output"), x.name, x.id);
}

template <class F>
typename F::result_type inspect(F& f, update& x) {
  return f(caf::meta::type_name("update"), x.target, x.value);
}

template <class F>
typename F::result_type inspect(F& f, graph& x) {
  return f(caf::meta::type_name("graph"), x.nodes, x.outputs, x.updates);
}

template <class F>
typename F::result_type inspect(F& f, tensor& x) {
  return f(caf::meta::type_name("tensor"), x.type, x.dims, x.bytes);
}

template <class F>
typename F::result_type inspect(F& f, named_tensor& x) {
  return f(caf::meta::type_name("named_tensor"), x.name, x.value);
}

}  // namespace mesh
