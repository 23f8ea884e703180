#include "graph/ops.hpp"

namespace mesh {

op_family family_of(op_kind op) {
  switch (op) {
    case op_kind::input:
    case op_kind::parameter:
    case op_kind::constant: return op_family::leaf;
    case op_kind::neg:
    case op_kind::abs:
    case op_kind::exp:
    case op_kind::log:
    case op_kind::sqrt:
    case op_kind::rsqrt:
    case op_kind::tanh:
    case op_kind::sin:
    case op_kind::cos:
    case op_kind::relu:
    case op_kind::sigmoid:
    case op_kind::cast: return op_family::unary;
    case op_kind::add:
    case op_kind::sub:
    case op_kind::mul:
    case op_kind::div:
    case op_kind::pow:
    case op_kind::max:
    case op_kind::min:
    case op_kind::compare: return op_family::binary;
    case op_kind::select: return op_family::ternary;
    case op_kind::matmul: return op_family::matmul;
    case op_kind::reduce_sum:
    case op_kind::reduce_max: return op_family::reduce;
    case op_kind::broadcast:
    case op_kind::reshape:
    case op_kind::permute:
    case op_kind::slice:
    case op_kind::concat: return op_family::movement;
    case op_kind::gather:
    case op_kind::scatter_add: return op_family::gather;
    case op_kind::linear: return op_family::linear;
    case op_kind::kv_write: return op_family::kv_write;
    case op_kind::attention: return op_family::attention;
  }
  return op_family::leaf;
}

std::string_view to_string(op_kind op) {
  static constexpr std::string_view names[op_count] = {
      "input", "parameter", "constant", "neg", "abs", "exp", "log", "sqrt", "rsqrt",
      "tanh", "sin", "cos", "relu", "sigmoid", "cast", "add", "sub", "mul",
      "div", "pow", "max", "min", "compare", "select", "matmul", "reduce_sum", "reduce_max",
      "broadcast", "reshape", "permute", "slice", "concat", "gather", "scatter_add", "linear", "kv_write", "attention"};
  auto i = static_cast<int>(op);
  return i < op_count ? names[i] : std::string_view("unknown_op");
}

std::string_view to_string(compare_kind c) {
  static constexpr std::string_view names[] = {"eq", "ne", "lt", "le", "gt", "ge"};
  auto i = static_cast<int>(c);
  return i < 6 ? names[i] : std::string_view("unknown_cmp");
}

}  // namespace mesh
