#include "client/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include "graph/autodiff.hpp"
#include "graph/simplify.hpp"
#include "wire/wire_graph.hpp"

namespace mesh {
namespace {

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

expected<graph_payload> payload_of(const builder& b) {
  auto g = b.finish();
  if (!g) return tl::unexpected(g.error());
  return graph_payload(wire_graph{simplify(*g), {}});
}

struct param_info {
  std::string name;
  dtype type;
  shape dims;
};

}  // namespace

tensor_map parameters_only(const tensor_map& state) {
  tensor_map out;
  for (const auto& [name, t] : state)
    if (!starts_with(name, "opt.") && !starts_with(name, "outer.")) out[name] = t;
  return out;
}

expected<msg::train_spec> make_train_spec(const graph& model, const tensor_map& state, const tensor_map& dataset,
                                          int64_t micro_batch, const train_options& o) {
  const node_index loss = model.find_output("loss");
  if (loss < 0) return make_error(error_code::invalid_argument, "the model needs an output \"loss\"");
  std::vector<param_info> params;
  std::vector<node_index> param_ids;
  std::set<std::string> wanted(o.trainable.begin(), o.trainable.end());
  for (node_index i = 0; i < model.size(); ++i) {
    if (model[i].op != op_kind::parameter) continue;
    const std::string& name = model[i].attrs.name;
    if (!state.count(name)) return make_error(error_code::invalid_argument, "no initial value for parameter \"" + name + "\"");
    if (!o.trainable.empty() && !wanted.erase(name)) continue;  // frozen
    params.push_back({name, model[i].type, model[i].dims});
    param_ids.push_back(i);
  }
  if (!wanted.empty())
    return make_error(error_code::invalid_argument, "train_options::trainable names \"" + *wanted.begin() + "\", which is not a parameter of the model");
  if (params.empty()) return make_error(error_code::invalid_argument, "the model has no parameters to train");

  msg::train_spec spec;
  spec.method = o.method;
  spec.start_step = o.start_step;
  spec.steps = o.steps;
  spec.micro_batches = o.micro_batches;
  spec.micro_batch = static_cast<uint32_t>(micro_batch);
  spec.inner_steps = o.method == train_method::diloco ? o.inner_steps : 1;
  if (o.method == train_method::diloco && o.fragments > 1) {
    spec.fragments = o.fragments;
    spec.inner_steps = std::max<uint32_t>(1, o.inner_steps / o.fragments);  // a fragment's turn comes every this many
  }
  if (o.overlap_steps > 0) {
    if (o.method != train_method::diloco) return make_error(error_code::invalid_argument, "overlap_steps is for DiLoCo runs");
    if (o.overlap_steps >= spec.inner_steps)
      return make_error(error_code::invalid_argument, "overlap_steps (" + std::to_string(o.overlap_steps) +
                                                          ") must be fewer than the inner steps of a round (" +
                                                          std::to_string(spec.inner_steps) + ")");
    if (!(o.overlap_mix >= 0 && o.overlap_mix <= 1)) return make_error(error_code::invalid_argument, "overlap_mix must be in [0, 1]");
    spec.overlap_steps = o.overlap_steps;
  }
  spec.compression = o.compression;
  spec.seed = o.seed;
  spec.bucket_bytes = o.bucket_bytes;
  spec.checkpoint_every = o.on_checkpoint ? o.checkpoint_every : 0;

  // Gradients: the model's loss and d loss / d p for every parameter, nothing else.
  // With loss scaling the backward pass starts from loss x S (S = the state's "opt.loss_scale"):
  // the gradients come out scaled, and the optimizer step divides them by S again.
  {
    builder b(model);
    std::vector<expr> vars;
    for (auto id : param_ids) vars.push_back(b.at(id));
    const expr l = b.at(loss);
    const auto grads = gradients(o.loss_scale ? l * b.parameter(optim::loss_scale_name, dtype::f32, {}) : l, vars);
    auto g = b.finish();
    if (!g) return tl::unexpected(g.error());
    g->outputs.clear();
    g->updates.clear();
    g->outputs.push_back({"loss", loss});
    for (size_t i = 0; i < params.size(); ++i) g->outputs.push_back({"grad." + params[i].name, grads[i].id()});
    spec.grad = graph_payload(wire_graph{simplify(*g), {}});
  }
  // The optimizer step on gradients summed over micro-batches (scale makes them a mean).
  {
    builder b;
    const expr scale = b.input("scale", dtype::f32, {});
    std::vector<expr> ps, gs;
    for (const auto& p : params) {
      ps.push_back(b.parameter(p.name, p.type, p.dims));
      gs.push_back(b.input("grad." + p.name, dtype::f32, p.dims) * scale);
    }
    const expr take = o.loss_scale ? optim::unscale_gradients(b, gs, *o.loss_scale) : expr{};
    if (auto* adam = std::get_if<optim::adam_options>(&o.optimizer)) optim::adam(b, ps, gs, *adam, take);
    else optim::sgd(b, ps, gs, std::get<optim::sgd_options>(o.optimizer), take);
    auto apply = payload_of(b);
    if (!apply) return tl::unexpected(apply.error());
    spec.apply = std::move(*apply);
  }
  if (o.method == train_method::diloco) {
    // delta = outer copy - local parameters (the "pseudo-gradient" of DiLoCo).
    builder d;
    for (const auto& p : params)
      d.output("delta." + p.name, d.parameter("outer." + p.name, p.type, p.dims) - d.parameter(p.name, p.type, p.dims));
    auto delta = payload_of(d);
    if (!delta) return tl::unexpected(delta.error());
    spec.delta = std::move(*delta);
    // Outer Nesterov step on the mean delta; the local parameters restart from the result.
    builder b;
    const expr scale = b.input("scale", dtype::f32, {});
    for (const auto& p : params) {
      const expr delta = b.input("delta." + p.name, dtype::f32, p.dims) * scale;
      const expr outer = b.parameter("outer." + p.name, p.type, p.dims);
      const expr mom = b.parameter("outer.mom." + p.name, p.type, p.dims);
      const expr mom1 = mom * o.outer_momentum + delta;
      const expr next = outer - (delta + mom1 * o.outer_momentum) * o.outer_lr;
      b.update(mom, mom1);
      b.update(outer, next);
      // With overlap the local parameters moved on after the delta was taken: mixed, not reset.
      const expr local = b.parameter(p.name, p.type, p.dims);
      b.update(local, o.overlap_steps > 0 ? local * o.overlap_mix + next * (1 - o.overlap_mix) : next);
    }
    auto outer = payload_of(b);
    if (!outer) return tl::unexpected(outer.error());
    spec.outer = std::move(*outer);
  }

  // The state: the parameters, then whatever else the graphs keep (zeros unless resumed).
  tensor_map all = state;
  for (const auto& p : params) {
    auto it = state.find(p.name);
    if (it == state.end()) return make_error(error_code::invalid_argument, "no initial value for parameter \"" + p.name + "\"");
    if (o.method == train_method::diloco && !all.count("outer." + p.name)) all["outer." + p.name] = it->second;
  }
  if (o.loss_scale) {
    if (!(o.loss_scale->initial > 0) || !std::isfinite(o.loss_scale->initial) || o.loss_scale->growth_interval < 1)
      return make_error(error_code::invalid_argument, "loss scaling needs a finite initial scale > 0 and a growth interval >= 1");
    if (!all.count(optim::loss_scale_name))
      all[optim::loss_scale_name] = tensor::from_floats({}, {static_cast<float>(o.loss_scale->initial)});
  }
  for (const auto* p : {&spec.apply, &spec.delta, &spec.outer}) {
    if (!p->value) continue;
    for (const auto& n : p->value->g.nodes)
      if (n.op == op_kind::parameter && !all.count(n.attrs.name)) all[n.attrs.name] = tensor::zeros(n.type, n.dims);
  }
  for (auto& [name, t] : all) spec.state.push_back({name, std::move(t)});
  for (const auto& [name, t] : dataset) spec.dataset.push_back({name, t});
  return spec;
}

trainer::trainer(client& c, graph model, tensor_map state, tensor_map dataset, train_options options)
    : client_(c), model_(std::move(model)), state_(std::move(state)), dataset_(std::move(dataset)), options_(std::move(options)) {}

trainer::trainer(client& c, graph model, tensor_map state, msg::train_text_data text, train_options options)
    : client_(c), model_(std::move(model)), state_(std::move(state)), text_(std::move(text)), options_(std::move(options)) {}

expected<train_result> trainer::fit(const std::function<void(const train_progress_info&)>& progress) {
  int64_t micro_batch = -1;
  for (const auto& n : model_.nodes)
    if (n.op == op_kind::input && !n.dims.empty()) micro_batch = n.dims[0];
  if (micro_batch < 1) return make_error(error_code::invalid_argument, "the model has no input with a batch dimension");
  auto spec = make_train_spec(model_, state_, dataset_, micro_batch, options_);
  if (!spec) return tl::unexpected(spec.error());
  if (text_) spec->text = {*text_};
  train_result result;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<uint64_t> loss_steps;  // the step of each entry of result.losses
  // The callbacks capture this frame (result, loss_steps, t0, progress) and the trainer: `run`
  // is declared after what they capture, so that on every way out, exceptions included, its
  // destructor withdraws them (and waits for one running) before any of that is gone.
  pending_request run = client_.start_training(*spec, [&](const msg::train_progress& p) {
    // After a coordinator failover the unfinished step is redone and reported again: its new
    // loss replaces the old one (and any later, never-committed ones).
    while (!loss_steps.empty() && loss_steps.back() >= p.step) {
      loss_steps.pop_back();
      result.losses.pop_back();
    }
    loss_steps.push_back(p.step);
    result.losses.push_back(p.loss);
    result.bytes_sent += p.bytes_sent;
    if (!progress) return;
    train_progress_info info;
    info.step = p.step;
    info.steps = p.steps;
    info.loss = p.loss;
    info.samples_per_s = p.samples_per_s;
    info.peers = p.peers;
    info.bytes_sent = p.bytes_sent;
    info.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    progress(info);
  }, [&](const msg::train_checkpoint& k) {
    if (!options_.on_checkpoint) return;
    tensor_map state;
    for (const auto& t : k.state) state[t.name] = t.value;
    options_.on_checkpoint(k.step, state);
  });
  const bool in_time = run.done.wait_for(options_.timeout) == std::future_status::ready;
  // From here on no callback runs: `result` is ours alone. On a timeout the node is not told and
  // may go on with the run; what it sends about it is ignored.
  run.withdraw();
  if (!in_time) return make_error(error_code::timeout, "training did not finish in time");
  auto outcome = run.done.get();
  if (!outcome) return tl::unexpected(outcome.error());
  result.state = std::move(outcome->outputs);
  result.workers = outcome->workers;
  result.step = outcome->step;  // what the coordinator applied, not what was asked
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

expected<double> evaluate_loss(client& c, const graph& model, const tensor_map& params, const tensor_map& dataset) {
  int64_t micro_batch = -1;
  for (const auto& n : model.nodes)
    if (n.op == op_kind::input && !n.dims.empty()) micro_batch = n.dims[0];
  if (micro_batch < 1 || dataset.empty()) return make_error(error_code::invalid_argument, "nothing to evaluate");
  const int64_t rows = dataset.begin()->second.dims.at(0);
  // Only the loss is needed back.
  graph g = model;
  const node_index loss = g.find_output("loss");
  if (loss < 0) return make_error(error_code::invalid_argument, "the model needs an output \"loss\"");
  g.outputs = {{"loss", loss}};
  g.updates.clear();
  g = simplify(g);
  double total = 0;
  int64_t batches = 0;
  std::vector<std::future<expected<job_outcome>>> pending;
  for (int64_t first = 0; first + micro_batch <= rows; first += micro_batch) {
    tensor_map in;
    for (const auto& [name, col] : dataset) {
      const size_t row_bytes = col.bytes.size() / static_cast<size_t>(col.dims[0]);
      tensor t;
      t.type = col.type;
      t.dims = col.dims;
      t.dims[0] = micro_batch;
      t.bytes.assign(col.bytes.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(first) * row_bytes),
                     col.bytes.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(first + micro_batch) * row_bytes));
      in[name] = std::move(t);
    }
    pending.push_back(c.submit(g, in, params));
  }
  for (auto& f : pending) {
    auto r = f.get();
    if (!r) return tl::unexpected(r.error());
    total += r->outputs.at("loss").at(0);
    ++batches;
  }
  return batches ? total / static_cast<double>(batches) : 0.0;
}

}  // namespace mesh
