#include "graph/staged_plan.hpp"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <map>
#include <set>

#include "graph/cost.hpp"
#include "graph/quant.hpp"
#include "graph/validate.hpp"

namespace mesh {
namespace {

bool is_leaf(const node& n) { return family_of(n.op) == op_family::leaf; }

error mixing(node_index id, const node& n, const std::string& why) {
  return {error_code::unsupported, "data parallel: node %" + std::to_string(id) + " (" + std::string(to_string(n.op)) +
                                       ") " + why + "; run this graph as a pipeline"};
}

/// Which nodes of `g` hold batch rows on axis 0 (row i computed from row i of the inputs only).
/// The first node that would mix rows is an error.
expected<std::vector<bool>> batched_nodes(const graph& g, int64_t batch) {
  std::vector<bool> batched(g.nodes.size(), false);
  for (node_index id = 0; id < g.size(); ++id) {
    const node& n = g[id];
    if (n.op == op_kind::input) {
      batched[static_cast<size_t>(id)] = true;  // the planner checked that every input has `batch` rows
      continue;
    }
    std::vector<bool> in;
    for (auto i : n.inputs) in.push_back(batched[static_cast<size_t>(i)]);
    const bool any = std::find(in.begin(), in.end(), true) != in.end();
    if (!any) continue;  // does not depend on the inputs: every replica computes it whole
    switch (family_of(n.op)) {
      case op_family::leaf: break;
      case op_family::unary:
      case op_family::binary:
      case op_family::ternary: break;  // one shape for all operands: free ones are cut to the rows
      case op_family::matmul:
        if (n.dims.size() == 2 && in[1])
          return tl::unexpected(mixing(id, n, "contracts the batch axis (its right operand has batch rows)"));
        break;
      case op_family::reduce:
        if (std::find(n.attrs.axes.begin(), n.attrs.axes.end(), 0) != n.attrs.axes.end())
          return tl::unexpected(mixing(id, n, "reduces over the batch axis 0"));
        break;
      case op_family::movement: {
        const node& src = g[n.inputs[0]];
        if (n.op == op_kind::broadcast && (src.dims.size() != n.dims.size() || src.dims[0] != n.dims[0]))
          return tl::unexpected(mixing(id, n, "moves the batch axis away from axis 0"));
        if (n.op == op_kind::reshape && (n.dims.empty() || n.dims[0] != batch))
          return tl::unexpected(mixing(id, n, "reshapes across batch rows"));
        if (n.op == op_kind::permute && n.attrs.axes[0] != 0)
          return tl::unexpected(mixing(id, n, "permutes the batch axis away from axis 0"));
        if (n.op == op_kind::slice && (n.attrs.starts[0] != 0 || n.attrs.stops[0] != batch))
          return tl::unexpected(mixing(id, n, "slices the batch axis"));
        if (n.op == op_kind::concat && n.attrs.axis == 0)
          return tl::unexpected(mixing(id, n, "concatenates along the batch axis"));
        break;
      }
      case op_family::gather:
        if (n.op == op_kind::scatter_add) return tl::unexpected(mixing(id, n, "adds rows together"));
        if (in[0]) return tl::unexpected(mixing(id, n, "gathers from a table with batch rows"));
        break;
      case op_family::linear:
        if (in[1]) return tl::unexpected(mixing(id, n, "contracts the batch axis (its weight has batch rows)"));
        if (n.dims.size() < 2) return tl::unexpected(mixing(id, n, "contracts the batch axis (x has rank 1)"));
        break;
      case op_family::kv_write: return tl::unexpected(mixing(id, n, "writes batch rows into a cache held whole"));
      case op_family::attention:
        // Row-local only with leading batch dims that every operand has.
        if (n.dims.size() < 4 || std::find(in.begin(), in.end(), false) != in.end())
          return tl::unexpected(mixing(id, n, "attends across the batch axis"));
        break;
    }
    batched[static_cast<size_t>(id)] = true;
  }
  return batched;
}

/// True when a batched node of this op takes a not-batched operand with the same axis 0, which a
/// replica must cut to its rows (elementwise operands, batched matmul operands, concat parts).
bool operand_needs_rows(const node& n) {
  const auto f = family_of(n.op);
  return f == op_family::binary || f == op_family::ternary || n.op == op_kind::concat ||
         (f == op_family::matmul && n.dims.size() > 2);
}

/// The staged graph as it is being built: nodes, the stage of each (-1 for leaves) and the
/// device of each stage.
struct stage_builder {
  graph out;
  std::vector<int> stage_of;
  std::vector<int> stage_device;
  std::vector<tensor_piece> pieces;

  node_index add(node n, int stage) {
    out.nodes.push_back(std::move(n));
    stage_of.push_back(stage);
    return out.size() - 1;
  }
  int new_stage(int device) {
    stage_device.push_back(device);
    return static_cast<int>(stage_device.size()) - 1;
  }
  /// A node of `out` made of elements [begin, end) of `axis` of node `of`.
  node_index add_slice(node_index of, int axis, int64_t begin, int64_t end, int stage) {
    node s;
    s.op = op_kind::slice;
    s.type = out[of].type;
    s.dims = out[of].dims;
    s.attrs.starts.assign(s.dims.size(), 0);
    s.attrs.stops = s.dims;
    s.attrs.starts[static_cast<size_t>(axis)] = begin;
    s.attrs.stops[static_cast<size_t>(axis)] = end;
    s.dims[static_cast<size_t>(axis)] = end - begin;
    s.inputs = {of};
    return add(std::move(s), stage);
  }
  /// A leaf (input or parameter) cut from the job tensor `source`.
  node_index add_piece(const node& leaf, const std::string& name, int axis, int64_t begin, int64_t end) {
    node p = leaf;
    p.attrs.name = name;
    p.dims[static_cast<size_t>(axis)] = end - begin;
    pieces.push_back({name, leaf.attrs.name, axis, begin, end});
    return add(std::move(p), -1);
  }

  /// The pipeline-kind plan of the stages: nodes nothing needs are dropped, empty stages removed,
  /// transfers derived from which stage uses which value.
  expected<staged_job> finish() {
    if (auto ok = validate(out); !ok) return make_error(error_code::internal, "staged graph is invalid: " + ok.error().to_string());
    std::vector<bool> live(out.nodes.size(), false);
    for (const auto& o : out.outputs) live[static_cast<size_t>(o.id)] = true;
    for (node_index id = out.size() - 1; id >= 0; --id)
      if (live[static_cast<size_t>(id)])
        for (auto i : out[id].inputs) live[static_cast<size_t>(i)] = true;
    std::vector<std::vector<node_index>> members(stage_device.size());
    for (node_index id = 0; id < out.size(); ++id)
      if (live[static_cast<size_t>(id)] && stage_of[static_cast<size_t>(id)] >= 0)
        members[static_cast<size_t>(stage_of[static_cast<size_t>(id)])].push_back(id);
    std::vector<int> renumbered(stage_device.size(), -1);
    staged_job job;
    job.stages.kind = strategy::pipeline;
    for (size_t s = 0; s < members.size(); ++s) {
      if (members[s].empty()) continue;
      renumbered[s] = static_cast<int>(job.stages.stages.size());
      job.stages.stages.push_back({stage_device[s], std::move(members[s]), 0.0});
    }
    // An output that is a leaf itself is returned by the last stage.
    for (const auto& o : out.outputs)
      if (stage_of[static_cast<size_t>(o.id)] < 0 && !job.stages.stages.empty()) job.stages.stages.back().nodes.push_back(o.id);
    std::set<std::pair<node_index, int>> sent;
    for (const auto& st : job.stages.stages)
      for (auto id : st.nodes) {
        const int to = renumbered[static_cast<size_t>(std::max(stage_of[static_cast<size_t>(id)], 0))];
        for (auto i : out[id].inputs) {
          if (is_leaf(out[i])) continue;
          const int from = renumbered[static_cast<size_t>(stage_of[static_cast<size_t>(i)])];
          if (from != to && sent.insert({i, to}).second)
            job.stages.transfers.push_back({i, from, to, result_bytes(out[i])});
        }
      }
    job.g = std::move(out);
    job.pieces = std::move(pieces);
    return job;
  }
};

std::string rows_name(const std::string& name, int64_t begin, int64_t end) {
  return name + "[" + std::to_string(begin) + ":" + std::to_string(end) + "]";
}

expected<staged_job> stage_data_parallel(const graph& g, const plan& p) {
  auto batched = batched_nodes(g, p.batch);
  if (!batched) return tl::unexpected(batched.error());
  std::vector<batch_share> shares;
  for (const auto& s : p.shares)
    if (s.end > s.begin) shares.push_back(s);
  std::sort(shares.begin(), shares.end(), [](const auto& a, const auto& b) { return a.begin < b.begin; });
  if (shares.empty()) return make_error(error_code::invalid_argument, "data parallel: the plan has no rows");

  stage_builder b;
  std::map<node_index, node_index> shared_leaves;  // parameters and constants, one copy for all replicas
  std::vector<std::vector<node_index>> replica_outputs(g.outputs.size());
  for (size_t k = 0; k < shares.size(); ++k) {
    const auto& share = shares[k];
    const int64_t rows = share.end - share.begin;
    const int stage = b.new_stage(share.device);
    std::vector<node_index> local(g.nodes.size(), -1);
    for (node_index id = 0; id < g.size(); ++id) {
      const node& n = g[id];
      if (n.op == op_kind::input) {
        local[static_cast<size_t>(id)] = b.add_piece(n, rows_name(n.attrs.name, share.begin, share.end), 0, share.begin, share.end);
        continue;
      }
      if (is_leaf(n)) {
        auto [it, fresh] = shared_leaves.try_emplace(id, -1);
        if (fresh) it->second = b.add(n, -1);
        local[static_cast<size_t>(id)] = it->second;
        continue;
      }
      node c = n;
      const bool rows_here = (*batched)[static_cast<size_t>(id)];
      for (size_t i = 0; i < c.inputs.size(); ++i) {
        const node_index in = n.inputs[i];
        c.inputs[i] = local[static_cast<size_t>(in)];
        if (rows_here && !(*batched)[static_cast<size_t>(in)] && operand_needs_rows(n))
          c.inputs[i] = b.add_slice(c.inputs[i], 0, share.begin, share.end, stage);
      }
      if (rows_here) {
        c.dims[0] = rows;
        if (c.op == op_kind::slice) c.attrs.stops[0] = rows;
      }
      local[static_cast<size_t>(id)] = b.add(std::move(c), stage);
    }
    for (size_t o = 0; o < g.outputs.size(); ++o) replica_outputs[o].push_back(local[static_cast<size_t>(g.outputs[o].id)]);
  }
  // Batched outputs are joined on device 0 (the coordinator); the others come from the first replica.
  const int gather = b.new_stage(0);
  for (size_t o = 0; o < g.outputs.size(); ++o) {
    const auto& parts = replica_outputs[o];
    node_index result = parts.front();
    if ((*batched)[static_cast<size_t>(g.outputs[o].id)] && parts.size() > 1) {
      node cat;
      cat.op = op_kind::concat;
      cat.type = g[g.outputs[o].id].type;
      cat.dims = g[g.outputs[o].id].dims;
      cat.attrs.axis = 0;
      cat.inputs = parts;
      result = b.add(std::move(cat), gather);
    }
    b.out.outputs.push_back({g.outputs[o].name, result});
  }
  return b.finish();
}

expected<staged_job> stage_tensor_parallel(const graph& g, const plan& p) {
  std::map<node_index, const column_shard*> shard_of;
  for (const auto& sh : p.shards) shard_of[sh.param] = &sh;
  stage_builder b;
  std::map<std::pair<node_index, size_t>, node_index> column_leaves;  // (parameter, device) -> its columns
  std::vector<node_index> local(g.nodes.size(), -1);
  int main_stage = b.new_stage(0);
  for (node_index id = 0; id < g.size(); ++id) {
    const node& n = g[id];
    if (is_leaf(n)) {
      local[static_cast<size_t>(id)] = b.add(n, -1);
      continue;
    }
    const node_index w = column_sharded_parameter(g, id);
    const auto sh = shard_of.find(w);
    if (w < 0 || sh == shard_of.end()) {
      node c = n;
      for (auto& i : c.inputs) i = local[static_cast<size_t>(i)];
      local[static_cast<size_t>(id)] = b.add(std::move(c), main_stage);
      continue;
    }
    // The ranges must tile [0, cols) in order, or the joined result would not be the matmul's
    // (a plan made for another graph, or a corrupt one).
    const int64_t cols = n.dims.back();
    int64_t next = 0;
    bool tiles = true;
    for (const auto& [c0, c1] : sh->second->ranges) {
      tiles = tiles && c0 == next && c0 <= c1 && c1 <= cols;
      next = c1;
    }
    if (!tiles || next != cols)
      return make_error(error_code::invalid_argument, "tensor parallel: the plan's columns of parameter \"" + g[w].attrs.name +
                                                          "\" do not tile [0, " + std::to_string(cols) + ") in device order");
    // One matmul per device over its columns; the results are joined on the last axis.
    std::vector<node_index> parts;
    for (size_t d = 0; d < sh->second->ranges.size(); ++d) {
      const auto [c0, c1] = sh->second->ranges[d];
      if (c1 <= c0) continue;
      auto [it, fresh] = column_leaves.try_emplace({w, d}, -1);
      if (fresh) it->second = b.add_piece(g[w], g[w].attrs.name + "[:," + std::to_string(c0) + ":" + std::to_string(c1) + "]", 1, c0, c1);
      const int stage = b.new_stage(static_cast<int>(d));
      node_index rhs = it->second;
      if (g[n.inputs[1]].op == op_kind::broadcast) {
        node bc = g[n.inputs[1]];
        bc.dims.back() = c1 - c0;
        bc.inputs = {rhs};
        rhs = b.add(std::move(bc), stage);
      }
      node mm = n;
      mm.dims.back() = c1 - c0;
      mm.inputs = {local[static_cast<size_t>(n.inputs[0])], rhs};
      parts.push_back(b.add(std::move(mm), stage));
    }
    main_stage = b.new_stage(0);
    if (parts.size() == 1) {
      local[static_cast<size_t>(id)] = parts.front();
      continue;
    }
    node cat;
    cat.op = op_kind::concat;
    cat.type = n.type;
    cat.dims = n.dims;
    cat.attrs.axis = static_cast<int64_t>(n.dims.size()) - 1;
    cat.inputs = parts;
    local[static_cast<size_t>(id)] = b.add(std::move(cat), main_stage);
  }
  for (const auto& o : g.outputs) b.out.outputs.push_back({o.name, local[static_cast<size_t>(o.id)]});
  return b.finish();
}

}  // namespace

expected<staged_job> stage_plan(const graph& g, const plan& p) {
  switch (p.kind) {
    case strategy::pipeline: return staged_job{g, p, {}};
    case strategy::data_parallel:
    case strategy::tensor_parallel:
      if (!g.updates.empty())
        return make_error(error_code::unsupported, std::string(to_string(p.kind)) +
                                                       ": a one-shot job that updates parameters runs as a pipeline (train with mesh::trainer)");
      return p.kind == strategy::data_parallel ? stage_data_parallel(g, p) : stage_tensor_parallel(g, p);
    case strategy::automatic: break;
  }
  return make_error(error_code::invalid_argument, "stage_plan: the plan has no concrete strategy");
}

tensor slice_tensor(const tensor& t, int axis, int64_t begin, int64_t end) {
  tensor s;
  s.type = t.type;
  s.dims = t.dims;
  s.dims[static_cast<size_t>(axis)] = end - begin;
  // Bytes of one index of `axis`: a quantized tensor's rows are whole (it is cut across rows only).
  const shape trailing(t.dims.begin() + axis + 1, t.dims.end());
  assert(!is_quantized(t.type) || !trailing.empty());
  int64_t outer = 1, inner = byte_size(t.type, trailing);
  for (int a = 0; a < axis; ++a) outer *= t.dims[static_cast<size_t>(a)];
  const int64_t span = t.dims[static_cast<size_t>(axis)];
  const auto row = static_cast<size_t>((end - begin) * inner);
  s.bytes.resize(static_cast<size_t>(outer) * row);
  for (int64_t o = 0; o < outer; ++o)
    if (row) std::memcpy(s.bytes.data() + static_cast<size_t>(o) * row, t.bytes.data() + static_cast<size_t>((o * span + begin) * inner), row);
  return s;
}

expected<tensor_map> staged_tensors(const staged_job& s, const tensor_map& job) {
  std::map<std::string, const tensor_piece*> piece_of;
  for (const auto& p : s.pieces) piece_of[p.name] = &p;
  // Only the leaves some stage reads (a sharded parameter's whole tensor is not bound again).
  std::vector<bool> used(s.g.nodes.size(), false);
  for (const auto& st : s.stages.stages)
    for (auto id : st.nodes) {
      used[static_cast<size_t>(id)] = true;
      for (auto in : s.g[id].inputs) used[static_cast<size_t>(in)] = true;
    }
  tensor_map out;
  for (node_index id = 0; id < s.g.size(); ++id) {
    const node& n = s.g[id];
    if ((n.op != op_kind::input && n.op != op_kind::parameter) || !used[static_cast<size_t>(id)]) continue;
    auto pc = piece_of.find(n.attrs.name);
    const std::string& source = pc == piece_of.end() ? n.attrs.name : pc->second->source;
    auto t = job.find(source);
    if (t == job.end()) return make_error(error_code::invalid_argument, "no tensor bound to \"" + source + "\"");
    if (pc == piece_of.end()) {
      out[n.attrs.name] = t->second;
      continue;
    }
    const auto& piece = *pc->second;
    if (piece.axis >= static_cast<int>(t->second.dims.size()) || piece.end > t->second.dims[static_cast<size_t>(piece.axis)])
      return make_error(error_code::shape_mismatch, "tensor \"" + source + "\" is " + to_string(t->second.dims) + ", too small for its part " + piece.name);
    out[n.attrs.name] = slice_tensor(t->second, piece.axis, piece.begin, piece.end);
  }
  return out;
}

}  // namespace mesh
