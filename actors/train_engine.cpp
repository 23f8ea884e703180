// The training engine's shared parts: checking a client's spec (check_train_spec,
// dataset_rows), renaming a run's parameters, the engine's construction, the end of a worker
// run (retire, end_run) and on_message, which routes each message to its side:
// train_coordinator.cpp (drive the steps), train_worker.cpp (compute them),
// train_collective.cpp (the ring all-reduce of a step) and train_failover.cpp (a new
// coordinator for an orphaned run). Their state is in train_engine_state.hpp.
#include "actors/train_engine.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include <algorithm>

#include "actors/train_buckets.hpp"
#include "actors/train_engine_state.hpp"
#include "gpu/executor.hpp"
#include "wire/wire_graph.hpp"

namespace mesh {
using namespace train_detail;
namespace {

/// The outputs of `g` whose names start with `prefix`, in output order, with their sizes.
void outputs_with_prefix(const graph& g, const std::string& prefix, std::vector<std::string>& names,
                         std::vector<int64_t>& sizes, std::vector<shape>& dims) {
  for (const auto& o : g.outputs) {
    if (!starts_with(o.name, prefix)) continue;
    names.push_back(o.name);
    dims.push_back(g[o.id].dims);
    sizes.push_back(element_count(g[o.id].dims));
  }
}

/// Checks that `g` has an f32 input named `name` of shape `dims`.
expected<void> has_input(const graph& g, const std::string& what, const std::string& name, const shape& dims) {
  const node_index id = g.find_leaf(name);
  if (id < 0 || g[id].op != op_kind::input)
    return make_error(error_code::invalid_argument, "the " + what + " graph has no input \"" + name + "\"");
  if (g[id].type != dtype::f32 || g[id].dims != dims)
    return make_error(error_code::shape_mismatch, "the " + what + " graph's input \"" + name + "\" must be f32 " + to_string(dims));
  return {};
}

/// The graph a spec carries, decoded and validated with its message (wire/graph_payload.hpp).
expected<std::shared_ptr<const graph>> graph_of(const graph_payload& p, const std::string& what) {
  auto w = p.get(("the " + what + " graph").c_str());
  if (!w) return tl::unexpected(w.error());
  return std::shared_ptr<const graph>(*w, &(*w)->g);
}

/// The parameters of `g` that `state` must provide.
expected<void> covers_parameters(const graph& g, const std::string& what, const tensor_map& state) {
  tensor_map mine;
  for (const auto& n : g.nodes) {
    if (n.op != op_kind::parameter) continue;
    auto it = state.find(n.attrs.name);
    if (it == state.end()) return make_error(error_code::invalid_argument, "the state has no value for parameter \"" + n.attrs.name + "\" of the " + what + " graph");
    mine[n.attrs.name] = it->second;
  }
  if (auto ok = check_bindings(g, mine, true); !ok) return make_error(ok.error().code, "the " + what + " graph: " + ok.error().message);
  return {};
}

}  // namespace

namespace train_detail {

graph_payload rename_parameters(const graph_payload& p, const std::string& from, const std::string& to) {
  if (!p.value) return p;  // absent (or refused: the spec check reports it)
  wire_graph w = *p.value;
  for (auto& n : w.g.nodes)
    if (n.op == op_kind::parameter && starts_with(n.attrs.name, from)) n.attrs.name = to + n.attrs.name.substr(from.size());
  return graph_payload(std::move(w));
}

bool timing_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("MESH_TRAIN_TIMING");
    return v && std::string(v) == "1";
  }();
  return on;
}

void timing(const std::string& what) {
  if (!timing_enabled()) return;
  const auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
  std::fprintf(stderr, "train timing: %.1f %s\n", ms, what.c_str());
}

std::string bucket_line(uint64_t step, int b, const char* what) {
  return "step " + std::to_string(step) + " worker: bucket " + std::to_string(b) + " " + what;
}

}  // namespace train_detail

expected<train_work_result> finish_copies(expected<train_work_result> r) {
  if (!r || !r->copied) return r;
  auto copied = std::exchange(r->copied, nullptr);
  if (auto ok = copied(); !ok) return tl::unexpected(ok.error());
  return r;
}

expected<train_graphs> check_train_spec(const msg::train_spec& spec, bool with_rows) {
  const auto bad = [](const std::string& why) { return make_error(error_code::invalid_argument, why); };
  if (spec.steps <= spec.start_step) return bad("nothing to train: steps (" + std::to_string(spec.steps) + ") must exceed the start step (" + std::to_string(spec.start_step) + ")");
  if (spec.micro_batches < 1 || spec.micro_batches > 4096) return bad("micro_batches must be in 1..4096");
  if (spec.micro_batch < 1) return bad("micro_batch must be at least 1");
  if (spec.inner_steps < 1 || spec.inner_steps > 100000) return bad("inner_steps must be in 1..100000");
  if (spec.overlap_steps > 0 && spec.method != train_method::diloco) return bad("overlap_steps is for DiLoCo runs");
  train_graphs t;
  auto g = graph_of(spec.grad, "gradient");
  if (!g) return tl::unexpected(g.error());
  t.grad = *g;
  auto a = graph_of(spec.apply, "optimizer");
  if (!a) return tl::unexpected(a.error());
  t.apply = *a;
  if (!t.grad->updates.empty()) return bad("the gradient graph must not update parameters (the optimizer graph does)");
  bool has_loss = false;
  for (const auto& o : t.grad->outputs)
    if (o.name == "loss") has_loss = (*t.grad)[o.id].type == dtype::f32 && (*t.grad)[o.id].dims.empty();
  if (!has_loss) return bad("the gradient graph needs an output \"loss\" (f32 scalar)");
  outputs_with_prefix(*t.grad, "grad.", t.grads, t.grad_sizes, t.grad_dims);
  if (t.grads.empty()) return bad("the gradient graph has no \"grad.<parameter>\" outputs");
  t.bucket_ends = order_into_buckets(*t.grad, t.grads, t.grad_sizes, t.grad_dims,
                                     spec.method == train_method::data_parallel ? spec.bucket_bytes : 0, bucketed_allreduce::max_buckets);
  for (size_t i = 0; i < t.grads.size(); ++i)
    if (auto ok = has_input(*t.apply, "optimizer", t.grads[i], t.grad_dims[i]); !ok) return tl::unexpected(ok.error());
  if (auto ok = has_input(*t.apply, "optimizer", "scale", {}); !ok) return tl::unexpected(ok.error());
  if (t.apply->updates.empty()) return bad("the optimizer graph updates nothing");

  const tensor_map state = to_map(spec.state);
  if (auto ok = covers_parameters(*t.grad, "gradient", state); !ok) return tl::unexpected(ok.error());
  if (auto ok = covers_parameters(*t.apply, "optimizer", state); !ok) return tl::unexpected(ok.error());

  if (spec.method == train_method::diloco) {
    auto d = graph_of(spec.delta, "DiLoCo delta");
    if (!d) return tl::unexpected(d.error());
    auto o = graph_of(spec.outer, "DiLoCo outer");
    if (!o) return tl::unexpected(o.error());
    t.delta = *d;
    t.outer = *o;
    outputs_with_prefix(*t.delta, "delta.", t.deltas, t.delta_sizes, t.delta_dims);
    if (t.deltas.empty()) return bad("the DiLoCo delta graph has no \"delta.<parameter>\" outputs");
    if (!t.delta->updates.empty()) return bad("the DiLoCo delta graph must not update parameters");
    for (size_t i = 0; i < t.deltas.size(); ++i)
      if (auto ok = has_input(*t.outer, "DiLoCo outer", t.deltas[i], t.delta_dims[i]); !ok) return tl::unexpected(ok.error());
    if (auto ok = has_input(*t.outer, "DiLoCo outer", "scale", {}); !ok) return tl::unexpected(ok.error());
    if (auto ok = covers_parameters(*t.delta, "DiLoCo delta", state); !ok) return tl::unexpected(ok.error());
    if (auto ok = covers_parameters(*t.outer, "DiLoCo outer", state); !ok) return tl::unexpected(ok.error());
    if (spec.overlap_steps >= spec.inner_steps)
      return bad("overlap_steps (" + std::to_string(spec.overlap_steps) + ") must be fewer than the inner steps of a round (" +
                 std::to_string(spec.inner_steps) + ")");
    if (spec.fragments < 1 || spec.fragments > t.deltas.size())
      return bad("fragments must be in 1.." + std::to_string(t.deltas.size()) + " (the parameters DiLoCo averages)");
    int64_t total = 0;
    for (auto n : t.delta_sizes) total += n;
    int64_t so_far = 0;
    for (size_t i = 0; i < t.deltas.size(); ++i) {
      so_far += t.delta_sizes[i];
      const size_t left = t.deltas.size() - i - 1, open = spec.fragments - t.fragment_ends.size();
      // Close a fragment at its share of the elements, keeping one parameter for each one after.
      if (open > 1 && (left + 1 == open || so_far * static_cast<int64_t>(spec.fragments) >= total * static_cast<int64_t>(t.fragment_ends.size() + 1)))
        t.fragment_ends.push_back(i + 1);
    }
    t.fragment_ends.push_back(t.deltas.size());
  }

  if (!spec.text.empty()) {
    // The workers read the data from a file: the graph takes its rows' columns.
    if (spec.text.size() > 1) return bad("a run reads one data file, not " + std::to_string(spec.text.size()));
    if (!spec.dataset.empty()) return bad("a run reads a dataset or a data file, not both");
    if (auto ok = check_text_data(spec.text[0]); !ok) return tl::unexpected(ok.error());
    auto rows = dataset_rows(*t.grad, spec.micro_batch, text_columns(spec.text[0]));
    if (!rows) return tl::unexpected(rows.error());
    return t;
  }
  auto rows = dataset_rows(*t.grad, spec.micro_batch, to_map(spec.dataset));
  if (!rows) return tl::unexpected(rows.error());
  if (with_rows && *rows < static_cast<int64_t>(spec.micro_batch)) return bad("the dataset has fewer rows than one micro-batch");
  if (!with_rows && spec.dataset_rows < spec.micro_batch) return bad("the dataset has fewer rows than one micro-batch");
  return t;
}

expected<int64_t> dataset_rows(const graph& grad, uint32_t micro_batch, const tensor_map& data) {
  const auto bad = [](const std::string& why) { return make_error(error_code::invalid_argument, why); };
  // One column per input of the gradient graph, each with the micro-batch's shape except for the
  // number of rows.
  int64_t rows = -1;
  for (const auto& n : grad.nodes) {
    if (n.op != op_kind::input) continue;
    auto it = data.find(n.attrs.name);
    if (it == data.end()) return bad("the dataset has no column \"" + n.attrs.name + "\" (an input of the model)");
    const tensor& c = it->second;
    if (n.dims.empty() || n.dims[0] != micro_batch)
      return bad("input \"" + n.attrs.name + "\" must have micro_batch (" + std::to_string(micro_batch) + ") rows");
    shape want = n.dims;
    if (c.dims.empty()) return bad("dataset column \"" + n.attrs.name + "\" is a scalar");
    want[0] = c.dims[0];
    if (c.type != n.type || c.dims != want)
      return bad("dataset column \"" + n.attrs.name + "\" is " + to_string(c.type) + to_string(c.dims) + ", the model reads " +
                 to_string(n.type) + to_string(want));
    if (rows >= 0 && c.dims[0] != rows) return bad("dataset columns have different numbers of rows");
    rows = c.dims[0];
  }
  if (data.size() != static_cast<size_t>(std::count_if(grad.nodes.begin(), grad.nodes.end(), [](auto& n) { return n.op == op_kind::input; })))
    return bad("the dataset has columns the model does not read");
  return std::max<int64_t>(rows, 0);
}

train_engine::train_engine(node_id self, step_deadlines deadlines) : self_(std::move(self)), deadlines_(deadlines) {}
train_engine::~train_engine() = default;

void train_engine::peer_up(const node_id& id) {
  peers_.insert(id);
  for (auto& [rid, c] : coordinated_)
    if (std::find(c->members.begin(), c->members.end(), id) == c->members.end() && !c->left_out.count(id)) c->newcomers.insert(id);
}

void train_engine::retire(const std::shared_ptr<worker_run>& w) {
  if (w->device_lost) return;  // the executor was restarted: everything of the run went with it
  train_task t;
  t.coordinator = w->coordinator;
  t.train = w->train;
  t.cleanup = true;
  const std::string tr = run_prefix(w->coordinator, w->train);
  const std::string acc = accumulator_prefix(w->coordinator, w->train);
  // Queued behind the run's own tasks, and ahead of any task of a run set up again under the
  // same names (the executor takes tasks in order), so it frees only what this run left.
  t.work = [dev = w->dev, tr, acc](gpu::executor& ex) -> expected<train_work_result> {
    for (const auto id : dev->programs) ex.unload(id);
    dev->programs.clear();
    ex.drop_parameters(tr);
    ex.drop_parameters(acc);
    return train_work_result{};
  };
  ready_.push_back(std::move(t));
}

std::map<train_engine::worker_key, std::shared_ptr<train_engine::worker_run>>::iterator train_engine::end_run(
    std::map<worker_key, std::shared_ptr<worker_run>>::iterator it) {
  retire(it->second);
  return worker_.erase(it);
}

void train_engine::note_refusal(const node_id& from, const char* kind, std::string why) {
  refused_messages_.push_back({from, kind, std::move(why)});
}

void train_engine::executor_restarted() {
  for (auto& [k, w] : worker_) w->broken = w->device_lost = true;
}

std::vector<outbound> train_engine::on_message(const node_id& from, const msg::message& m, clock::time_point now) {
  now_ = now;
  if (auto* o = std::get_if<msg::open_training>(&m)) return open(from, *o);
  if (auto* s = std::get_if<msg::train_setup>(&m)) return on_setup(from, *s);
  if (auto* s = std::get_if<msg::train_step>(&m)) return on_step(from, *s);
  if (auto* p = std::get_if<msg::allreduce_piece>(&m)) return on_piece(from, *p);
  if (auto* p = std::get_if<msg::allreduce_piece_shared>(&m)) return on_piece_shared(from, *p);
  if (auto* h = std::get_if<msg::host_reduce_mark>(&m)) return on_host_mark(from, *h);
  if (auto* o = std::get_if<msg::shared_region_offer>(&m)) return on_region_offer(from, *o);
  if (auto* a = std::get_if<msg::shared_region_answer>(&m)) {
    on_region_answer(from, *a);
    return {};
  }
  if (auto* r = std::get_if<msg::train_ready>(&m)) return on_ready(from, *r);
  if (auto* g = std::get_if<msg::ring_go>(&m)) return on_go(from, *g);
  if (auto* r = std::get_if<msg::train_reduced>(&m)) return on_reduced(from, *r);
  if (auto* s = std::get_if<msg::train_state>(&m)) return on_state(from, *s);
  if (auto* r = std::get_if<msg::train_resume>(&m)) return on_resume(from, *r);
  return {};
}

}  // namespace mesh
