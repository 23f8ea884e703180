#include "actors/train_engine.hpp"

#include <algorithm>
#include <cstring>

#include "gpu/executor.hpp"
#include "graph/builder.hpp"
#include "wire/wire_graph.hpp"

namespace mesh {
namespace {

constexpr size_t max_parked_pieces = 4096;  // pieces that arrived before their round started
constexpr size_t max_early_runs = 64;       // runs with early pieces waiting, runs refused
constexpr int ring_pieces = 4;              // pieces per chunk: pipelining within a round
constexpr int max_failures = 3;             // of one worker in one run, before it is left out
constexpr size_t max_orphans = 4;           // runs kept after their coordinator died, for a takeover

uint64_t round_id(uint64_t step, uint32_t attempt) { return (step << 16) | (attempt & 0xffffu); }

/// Parameters of run `id` coordinated by `coordinator` carry this prefix on every device, so that
/// runs sharing a device never mix state. Workers derive it too (to undo it for a takeover).
std::string run_prefix(const std::string& coordinator, uint64_t id) {
  return "tr." + coordinator.substr(0, 8) + "." + std::to_string(id) + ".";
}

/// The prefix of the same run's gradient accumulators on a worker's device (accumulating()).
std::string accumulator_prefix(const std::string& coordinator, uint64_t id) {
  return "acc." + coordinator.substr(0, 8) + "." + std::to_string(id) + ".";
}

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

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
  const node_id id = g.find_leaf(name);
  if (id < 0 || g[id].op != op_kind::input)
    return make_error(error_code::invalid_argument, "the " + what + " graph has no input \"" + name + "\"");
  if (g[id].type != dtype::f32 || g[id].dims != dims)
    return make_error(error_code::shape_mismatch, "the " + what + " graph's input \"" + name + "\" must be f32 " + to_string(dims));
  return {};
}

expected<std::shared_ptr<const graph>> decode_graph(const std::vector<char>& wire, const std::string& what,
                                                    const graph_limits& limits) {
  auto w = decode_wire_graph(wire.data(), wire.size(), limits);
  if (!w) return make_error(w.error().code, "the " + what + " graph was rejected: " + w.error().message);
  return std::make_shared<const graph>(std::move(w->g));
}

tensor_map to_map(const std::vector<named_tensor>& ts) {
  tensor_map m;
  for (const auto& t : ts) m[t.name] = t.value;
  return m;
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

/// Splits a flat buffer into f32 tensors of the given shapes, named `names`.
tensor_map unflatten(const std::vector<float>& buf, const std::vector<std::string>& names, const std::vector<shape>& dims) {
  tensor_map out;
  size_t at = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const auto n = static_cast<size_t>(element_count(dims[i]));
    tensor t;
    t.type = dtype::f32;
    t.dims = dims[i];
    t.bytes.resize(n * 4);
    std::memcpy(t.bytes.data(), buf.data() + at, n * 4);
    out[names[i]] = std::move(t);
    at += n;
  }
  return out;
}

/// Adds the f32 tensors `names` of `outs` to `buf` (laid out in that order).
expected<void> accumulate(std::vector<float>& buf, const tensor_map& outs, const std::vector<std::string>& names) {
  size_t at = 0;
  for (const auto& name : names) {
    auto it = outs.find(name);
    if (it == outs.end() || it->second.type != dtype::f32) return make_error(error_code::internal, "the device returned no f32 \"" + name + "\"");
    const auto* v = reinterpret_cast<const float*>(it->second.bytes.data());
    const size_t n = it->second.bytes.size() / 4;
    if (at + n > buf.size()) return make_error(error_code::internal, "gradient sizes changed");
    for (size_t i = 0; i < n; ++i) buf[at + i] += v[i];
    at += n;
  }
  return {};
}

tensor f32_scalar(double v) { return tensor::scalar(v, dtype::f32); }

/// `spec` without its tensors (dataset and state): what a worker keeps to reopen the run.
msg::train_spec spec_shell(const msg::train_spec& spec) {
  msg::train_spec out;
  out.method = spec.method;
  out.start_step = spec.start_step;
  out.steps = spec.steps;
  out.micro_batches = spec.micro_batches;
  out.micro_batch = spec.micro_batch;
  out.inner_steps = spec.inner_steps;
  out.compression = spec.compression;
  out.seed = spec.seed;
  out.grad_wire = spec.grad_wire;
  out.apply_wire = spec.apply_wire;
  out.delta_wire = spec.delta_wire;
  out.outer_wire = spec.outer_wire;
  return out;
}

/// The graph `wire` with every parameter named `from` + x renamed to `to` + x.
expected<std::vector<char>> rename_parameters(const std::vector<char>& wire, const std::string& from, const std::string& to,
                                              const graph_limits& limits) {
  auto w = decode_wire_graph(wire.data(), wire.size(), limits);
  if (!w) return tl::unexpected(w.error());
  for (auto& n : w->g.nodes)
    if (n.op == op_kind::parameter && starts_with(n.attrs.name, from)) n.attrs.name = to + n.attrs.name.substr(from.size());
  return encode(wire_graph{std::move(w->g), {}});
}

/// The gradient graph as two programs that keep the gradients on the device: `first` stores each
/// gradient into a resident accumulator "<prefix><grad name>", `more` adds to it; both return only
/// the loss. A step's gradients then leave the device once, not once per micro-batch.
expected<std::pair<graph, graph>> accumulating(const graph& grad, const std::vector<std::string>& grads,
                                               const std::string& prefix) {
  std::pair<graph, graph> out;
  for (int more = 0; more < 2; ++more) {
    builder b(grad);
    for (const auto& name : grads) {
      const expr g = b.at(grad.find_output(name));
      const shape dims = g.dims();
      const expr acc = b.parameter(prefix + name, dtype::f32, dims);
      b.update(acc, more ? acc + g : g);
    }
    auto done = b.finish();
    if (!done) return tl::unexpected(done.error());
    done->outputs = {{"loss", grad.find_output("loss")}};
    (more ? out.second : out.first) = std::move(*done);
  }
  return out;
}

}  // namespace

expected<train_graphs> check_train_spec(const msg::train_spec& spec, const graph_limits& limits, bool with_rows) {
  const auto bad = [](const std::string& why) { return make_error(error_code::invalid_argument, why); };
  if (spec.steps <= spec.start_step) return bad("nothing to train: steps (" + std::to_string(spec.steps) + ") must exceed the start step (" + std::to_string(spec.start_step) + ")");
  if (spec.micro_batches < 1 || spec.micro_batches > 4096) return bad("micro_batches must be in 1..4096");
  if (spec.micro_batch < 1) return bad("micro_batch must be at least 1");
  if (spec.inner_steps < 1 || spec.inner_steps > 100000) return bad("inner_steps must be in 1..100000");
  train_graphs t;
  auto g = decode_graph(spec.grad_wire, "gradient", limits);
  if (!g) return tl::unexpected(g.error());
  t.grad = *g;
  auto a = decode_graph(spec.apply_wire, "optimizer", limits);
  if (!a) return tl::unexpected(a.error());
  t.apply = *a;
  if (!t.grad->updates.empty()) return bad("the gradient graph must not update parameters (the optimizer graph does)");
  bool has_loss = false;
  for (const auto& o : t.grad->outputs)
    if (o.name == "loss") has_loss = (*t.grad)[o.id].type == dtype::f32 && (*t.grad)[o.id].dims.empty();
  if (!has_loss) return bad("the gradient graph needs an output \"loss\" (f32 scalar)");
  outputs_with_prefix(*t.grad, "grad.", t.grads, t.grad_sizes, t.grad_dims);
  if (t.grads.empty()) return bad("the gradient graph has no \"grad.<parameter>\" outputs");
  for (size_t i = 0; i < t.grads.size(); ++i)
    if (auto ok = has_input(*t.apply, "optimizer", t.grads[i], t.grad_dims[i]); !ok) return tl::unexpected(ok.error());
  if (auto ok = has_input(*t.apply, "optimizer", "scale", {}); !ok) return tl::unexpected(ok.error());
  if (t.apply->updates.empty()) return bad("the optimizer graph updates nothing");

  const tensor_map state = to_map(spec.state);
  if (auto ok = covers_parameters(*t.grad, "gradient", state); !ok) return tl::unexpected(ok.error());
  if (auto ok = covers_parameters(*t.apply, "optimizer", state); !ok) return tl::unexpected(ok.error());

  if (spec.method == train_method::diloco) {
    auto d = decode_graph(spec.delta_wire, "DiLoCo delta", limits);
    if (!d) return tl::unexpected(d.error());
    auto o = decode_graph(spec.outer_wire, "DiLoCo outer", limits);
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

/// Gives each of the k micro-batch slots of a step to a member, balanced (every member k/n,
/// rounded), moving as few slots as possible: a member keeps its slots, and with them the
/// dataset shards it already holds, across membership changes; a dead member's slots go to
/// those with the fewest, a newcomer takes from those with the most.
namespace {
void assign_slots(std::map<uint32_t, std::string>& owner, const std::vector<std::string>& members, uint32_t k) {
  if (members.empty()) return;
  std::map<std::string, std::vector<uint32_t>> held;
  for (const auto& m : members) held[m];
  std::vector<uint32_t> free;
  for (uint32_t j = 0; j < k; ++j) {
    auto it = owner.find(j);
    if (it != owner.end() && held.count(it->second)) held[it->second].push_back(j);
    else free.push_back(j);
  }
  // Members in ring order, so that ties go the same way on every run.
  const auto fewest = [&] {
    const std::string* best = &members.front();
    for (const auto& m : members)
      if (held[m].size() < held[*best].size()) best = &m;
    return *best;
  };
  const auto most = [&] {
    const std::string* best = &members.front();
    for (const auto& m : members)
      if (held[m].size() > held[*best].size()) best = &m;
    return *best;
  };
  for (uint32_t j : free) held[fewest()].push_back(j);
  for (;;) {
    const std::string lo = fewest(), hi = most();
    if (held[hi].size() <= held[lo].size() + 1) break;
    held[lo].push_back(held[hi].back());
    held[hi].pop_back();
  }
  owner.clear();
  for (const auto& [m, slots] : held)
    for (uint32_t j : slots) owner[j] = m;
}
}  // namespace

// ---- the two sides' state ----

struct train_engine::coord_run {
  std::string client;
  uint64_t client_train = 0;
  msg::train_spec spec;  ///< renamed; `state` is refreshed when newcomers are set up; no dataset rows
  tensor_map data;       ///< the whole dataset: the coordinator hands out its shards
  shard_plan plan;
  std::vector<int64_t> permutation;  ///< shard_permutation of the dataset's rows
  std::map<std::string, std::set<uint32_t>> shards_sent;  ///< per member (of its current setup)
  std::map<uint32_t, std::string> slot_owner;  ///< micro-batch slot j of every step -> member
  std::vector<std::string> members;
  std::set<std::string> newcomers;
  bool checkpoint_due = false;  ///< the state being fetched goes to the client too
  std::map<std::string, int> failures;
  enum class phase { stepping, syncing, finishing } ph = phase::stepping;
  uint64_t step = 0;
  uint32_t attempt = 0;
  uint64_t commit = 0;
  std::vector<std::string> ring;
  std::set<std::string> waiting;
  double loss = 0;
  uint64_t bytes = 0;
  std::string prefix;
  job_state state = job_state::running;
  clock::time_point started{}, last_step{};
  std::optional<std::chrono::steady_clock::time_point> client_lost_at;  ///< its connection went down
  double seconds = 0;
};

struct train_engine::worker_run {
  std::string coordinator;
  uint64_t train = 0;
  std::string client;          ///< who opened the run: the only one that may resume it
  uint64_t client_train = 0;
  msg::train_spec shell;       ///< the setup's spec without dataset and state (for a takeover)
  bool orphaned = false;       ///< the coordinator died; kept for a train_resume
  train_method method = train_method::data_parallel;
  uint64_t steps = 0;
  uint32_t micro_batches = 1, inner_steps = 1;
  wire_format format = wire_format::f32;
  train_graphs graphs;
  uint64_t seed = 0;
  int64_t micro_batch = 1;
  shard_plan plan;
  /// The dataset shards received so far (immutable once here: device work shares them).
  std::map<uint32_t, std::shared_ptr<const tensor_map>> shards;
  std::vector<named_tensor> resume_dataset;  ///< from train_resume, for the takeover
  std::vector<std::string> state_names, local_names;  ///< all state; DiLoCo: the local part

  /// Touched only by the device work, which runs one task at a time on the executor.
  struct device_side {
    bool loaded = false;
    tensor_map initial;  ///< uploaded with the first task
    gpu::program_id apply = 0, delta = 0, outer = 0;
    gpu::program_id acc_first = 0, acc_more = 0;  ///< see accumulating()
    std::vector<gpu::program_id> programs;         ///< all of the above that were loaded
    std::vector<std::string> acc_names;
    std::map<uint32_t, data_order> orders;  ///< each shard's epoch order
    uint64_t snapshot_step = ~0ull;  ///< DiLoCo: local state at the start of this step
    tensor_map snapshot;
  };
  std::shared_ptr<device_side> dev = std::make_shared<device_side>();

  uint64_t applied = 0;  ///< steps before this one are applied
  struct held_result {
    uint64_t end = 0;  ///< the step the state reaches when this result is applied
    std::vector<float> sum;
    uint32_t participants = 1;
  };
  std::optional<held_result> held;
  uint64_t step = 0;
  uint32_t attempt = 0;
  uint64_t step_end = 0;
  uint32_t participants = 1;
  std::vector<std::string> ring;
  int rank = -1;
  std::unique_ptr<ring_allreduce> round;
  std::vector<std::pair<std::string, allreduce_message>> parked;  ///< (from, piece) for a round not started yet
  bool broken = false;
  bool device_lost = false;  ///< the executor was restarted: nothing of this run is on the device
  bool stopping = false;
};

train_engine::train_engine(std::string self, graph_limits limits) : self_(std::move(self)), limits_(limits) {}
train_engine::~train_engine() = default;

void train_engine::peer_up(const std::string& id) {
  peers_.insert(id);
  for (auto& [rid, c] : coordinated_)
    if (std::find(c->members.begin(), c->members.end(), id) == c->members.end()) c->newcomers.insert(id);
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

void train_engine::executor_restarted() {
  for (auto& [k, w] : worker_) w->broken = w->device_lost = true;
}

std::vector<outbound> train_engine::on_message(const std::string& from, const msg::message& m, clock::time_point now) {
  now_ = now;
  if (auto* o = std::get_if<msg::open_training>(&m)) return open(from, *o);
  if (auto* s = std::get_if<msg::train_setup>(&m)) return on_setup(from, *s);
  if (auto* s = std::get_if<msg::train_step>(&m)) return on_step(from, *s);
  if (auto* p = std::get_if<msg::allreduce_piece>(&m)) return on_piece(from, *p);
  if (auto* r = std::get_if<msg::train_reduced>(&m)) return on_reduced(from, *r);
  if (auto* s = std::get_if<msg::train_state>(&m)) return on_state(from, *s);
  if (auto* r = std::get_if<msg::train_resume>(&m)) return on_resume(from, *r);
  return {};
}

// ---- coordinator ----

std::vector<outbound> train_engine::open(const std::string& client, const msg::open_training& o) {
  const auto refuse = [&](error_code code, const std::string& why) {
    msg::job_result r;
    r.job = o.train;
    r.code = code;
    r.error = why;
    return std::vector<outbound>{{client, r}};
  };
  for (const auto& [id, c] : coordinated_)
    if (c->client == client && c->client_train == o.train && c->state == job_state::running) return refuse(error_code::invalid_argument, "training " + std::to_string(o.train) + " is already running");
  if (auto ok = check_train_spec(o.spec, limits_); !ok) return refuse(ok.error().code, "training refused: " + ok.error().message);

  const uint64_t id = next_id_++;
  auto c = std::make_unique<coord_run>();
  c->client = client;
  c->client_train = o.train;
  c->spec = o.spec;
  c->step = o.spec.start_step;
  c->commit = o.spec.start_step;
  c->started = c->last_step = now_;
  // Parameters get names unique to this run, so that runs sharing a device do not mix state.
  c->prefix = run_prefix(self_, id);
  for (auto* wire : {&c->spec.grad_wire, &c->spec.apply_wire, &c->spec.delta_wire, &c->spec.outer_wire}) {
    if (wire->empty()) continue;
    auto bytes = rename_parameters(*wire, "", c->prefix, limits_);
    if (!bytes) return refuse(bytes.error().code, bytes.error().message);
    *wire = std::move(*bytes);
  }
  for (auto& t : c->spec.state) t.name = c->prefix + t.name;
  // The dataset stays here; setups carry its columns with no rows, steps carry the shards.
  c->data = to_map(c->spec.dataset);
  c->spec.dataset_rows = static_cast<uint64_t>(c->data.begin()->second.dims[0]);
  c->plan = shard_plan::make(static_cast<int64_t>(c->spec.dataset_rows), c->spec.micro_batch, c->spec.micro_batches);
  c->permutation = shard_permutation(static_cast<int64_t>(c->spec.dataset_rows), c->spec.seed);
  for (auto& column : c->spec.dataset) {
    column.value.dims[0] = 0;
    column.value.bytes.clear();
  }

  std::vector<outbound> out;
  c->members.push_back(self_);
  for (const auto& p : peers_) c->members.push_back(p);
  std::sort(c->members.begin(), c->members.end());
  for (const auto& m : c->members) out.push_back({m, msg::train_setup{id, c->spec, client, o.train}});
  auto& run = *c;
  coordinated_[id] = std::move(c);
  auto more = issue_step(id, run);
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

std::vector<outbound> train_engine::issue_step(uint64_t id, coord_run& c) {
  const auto& s = c.spec;
  const size_t k = s.micro_batches;
  c.ph = coord_run::phase::stepping;
  // Every member is in the ring, also one with no micro-batch this step (more workers than
  // micro-batches): it adds zeros, and it holds the result it must commit like the others.
  c.ring = c.members;
  ++c.attempt;
  c.waiting = {c.ring.begin(), c.ring.end()};
  c.loss = 0;
  c.bytes = 0;
  const uint64_t inner = s.method == train_method::diloco ? std::min<uint64_t>(s.inner_steps, s.steps - c.step) : 1;
  std::vector<outbound> out;
  assign_slots(c.slot_owner, c.ring, static_cast<uint32_t>(k));
  for (size_t r = 0; r < c.ring.size(); ++r) {
    msg::train_step m;
    m.train = id;
    m.step = c.step;
    m.attempt = c.attempt;
    m.ring = c.ring;
    m.commit = c.commit;
    // The member's micro-batch slots (assign_slots): a dead member's are spread over the
    // survivors when the step is redone.
    for (uint64_t h = 0; h < inner; ++h)
      for (const auto& [j, owner] : c.slot_owner)
        if (owner == c.ring[r]) m.micro.push_back((c.step + h) * k + j);
    // The shards these micro-batches draw from that this member has not been sent yet: a dead
    // member's shards move to the survivors with its micro-batches.
    auto& sent = c.shards_sent[c.ring[r]];
    for (const uint64_t micro : m.micro) {
      const uint32_t shard = c.plan.shard_of(micro);
      if (!sent.insert(shard).second) continue;
      auto rows = take_rows(c.data, shard_rows(c.permutation, c.plan.shards, shard));
      msg::train_shard sh{shard, {}};
      for (auto& [name, t] : *rows) sh.columns.push_back({name, std::move(t)});
      m.shards.push_back(std::move(sh));
    }
    out.push_back({c.ring[r], std::move(m)});
  }
  return out;
}

std::vector<outbound> train_engine::fail_run(uint64_t id, coord_run& c, error_code code, const std::string& why) {
  std::vector<outbound> out;
  msg::job_result r;
  r.job = c.client_train;
  r.code = code;
  r.error = why;
  out.push_back({c.client, r});
  for (const auto& m : c.members) {
    msg::train_step stop;
    stop.train = id;
    stop.stop = true;
    out.push_back({m, stop});
  }
  c.state = job_state::failed;
  c.seconds = std::chrono::duration<double>(now_ - c.started).count();
  c.members.clear();
  c.spec = {};
  c.data.clear();
  c.permutation.clear();
  return out;
}

std::vector<outbound> train_engine::on_reduced(const std::string& from, const msg::train_reduced& r) {
  auto it = coordinated_.find(r.train);
  if (it == coordinated_.end()) return {};
  coord_run& c = *it->second;
  // Our own worker could not apply the commit and report the state (final, checkpoint or
  // newcomer sync): the state that step was to report is gone.
  if (c.state == job_state::running && !r.ok && from == self_ && r.step == c.step && r.attempt == c.attempt &&
      (c.ph == coord_run::phase::finishing || c.ph == coord_run::phase::syncing))
    return fail_run(r.train, c, r.code, "the coordinating node could not report the training state: " + r.error);
  if (c.state != job_state::running || c.ph != coord_run::phase::stepping || r.step != c.step || r.attempt != c.attempt || !c.waiting.count(from))
    return {};  // stale (an earlier attempt) or not ours
  if (!r.ok) {
    // The worker lost its state (device restart) or failed the step: redo the step without it,
    // and set it up again at the next boundary unless it keeps failing.
    c.members.erase(std::find(c.members.begin(), c.members.end(), from));
    c.shards_sent.erase(from);  // its run is gone there
    if (++c.failures[from] < max_failures && peers_.count(from)) c.newcomers.insert(from);
    if (from == self_) return fail_run(r.train, c, r.code, "the coordinating node failed a step: " + r.error);
    return issue_step(r.train, c);
  }
  c.waiting.erase(from);
  c.loss = r.loss;
  c.bytes += r.bytes_sent;
  if (!c.waiting.empty()) return {};
  return advance(r.train, c);
}

std::vector<outbound> train_engine::advance(uint64_t id, coord_run& c) {
  const auto& s = c.spec;
  const uint64_t inner = s.method == train_method::diloco ? std::min<uint64_t>(s.inner_steps, s.steps - c.step) : 1;
  c.step += inner;
  c.commit = c.step;
  const double dt = std::chrono::duration<double>(now_ - c.last_step).count();
  c.last_step = now_;
  std::vector<outbound> out;
  msg::train_progress p;
  p.train = c.client_train;
  p.step = c.step;
  p.steps = s.steps;
  p.loss = c.loss;
  p.samples_per_s = dt > 0 ? static_cast<double>(inner * s.micro_batches * s.micro_batch) / dt : 0;
  p.peers = static_cast<uint32_t>(c.ring.size());
  p.bytes_sent = c.bytes;
  out.push_back({c.client, p});
  for (auto it = c.newcomers.begin(); it != c.newcomers.end();)  // gone since they were noticed
    it = peers_.count(*it) ? std::next(it) : c.newcomers.erase(it);
  // A checkpoint is due when this step crossed a multiple of checkpoint_every (DiLoCo's outer
  // steps advance by several inner steps at once); the final step's state is the result.
  const uint64_t every = s.checkpoint_every;
  c.checkpoint_due = every > 0 && c.step < s.steps && c.step / every != (c.step - inner) / every;
  if (c.step >= s.steps || !c.newcomers.empty() || c.checkpoint_due) {
    // Our own worker applies the commit and reports the state: the final result, or what the
    // newcomers start from, or a checkpoint for the client.
    c.ph = c.step >= s.steps ? coord_run::phase::finishing : coord_run::phase::syncing;
    msg::train_step m;
    m.train = id;
    m.step = c.step;
    m.attempt = ++c.attempt;
    m.commit = c.commit;
    m.report_state = true;
    m.stop = c.ph == coord_run::phase::finishing;
    out.push_back({self_, m});
    if (m.stop)
      for (const auto& mem : c.members)
        if (mem != self_) {
          msg::train_step stop;
          stop.train = id;
          stop.stop = true;
          out.push_back({mem, stop});
        }
    return out;
  }
  auto more = issue_step(id, c);
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

namespace {
/// A run's state as its client names it (the coordinator prefixes every name with the run's id).
std::vector<named_tensor> client_names(const std::string& prefix, const std::vector<named_tensor>& state) {
  std::vector<named_tensor> out;
  out.reserve(state.size());
  for (const auto& t : state) out.push_back({starts_with(t.name, prefix) ? t.name.substr(prefix.size()) : t.name, t.value});
  return out;
}
}  // namespace

std::vector<outbound> train_engine::on_state(const std::string& from, const msg::train_state& s) {
  auto it = coordinated_.find(s.train);
  if (it == coordinated_.end() || from != self_) return {};
  coord_run& c = *it->second;
  if (c.state != job_state::running || s.step != c.step) return {};
  std::vector<outbound> out;
  if (c.ph == coord_run::phase::finishing) {
    msg::job_result r;
    r.job = c.client_train;
    r.ok = true;
    r.attempts = c.attempt;
    r.outputs = client_names(c.prefix, s.state);
    r.step = s.step;
    r.workers = c.members;
    out.push_back({c.client, std::move(r)});
    c.state = job_state::done;
    c.seconds = std::chrono::duration<double>(now_ - c.started).count();
    c.spec = {};
    c.data.clear();
    c.permutation.clear();
    return out;
  }
  if (c.ph != coord_run::phase::syncing) return {};
  if (c.checkpoint_due) {
    out.push_back({c.client, msg::train_checkpoint{c.client_train, s.step, client_names(c.prefix, s.state)}});
    c.checkpoint_due = false;
  }
  c.spec.state = s.state;
  c.spec.start_step = c.step;
  for (const auto& n : c.newcomers) {
    if (!peers_.count(n)) continue;
    out.push_back({n, msg::train_setup{s.train, c.spec, c.client, c.client_train}});
    c.members.push_back(n);
    c.shards_sent.erase(n);
  }
  c.newcomers.clear();
  std::sort(c.members.begin(), c.members.end());
  auto more = issue_step(s.train, c);
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

std::vector<outbound> train_engine::peer_dead(const std::string& id, clock::time_point now) {
  now_ = now;
  peers_.erase(id);
  std::vector<outbound> out;
  // Worker side: runs coordinated by the dead node become orphans, kept (a few) for their client
  // to resume elsewhere; an orphan whose client died too cannot be resumed. A run whose client
  // died but whose coordinator lives goes on: the coordinator keeps training through the
  // client's grace time (the client may only be cut off from it) and stops its workers when it
  // ends the run. Erasing it here stalled the ring, the coordinator's own worker included.
  for (auto it = worker_.begin(); it != worker_.end();) {
    worker_run& w = *it->second;
    if (w.client == id && w.orphaned) {
      it = end_run(it);
      continue;
    }
    if (it->first.first == id) {
      if (w.broken || w.client.empty()) {
        it = end_run(it);
        continue;
      }
      orphan(w);
    }
    ++it;
  }
  size_t orphans = 0;
  for (auto it = worker_.begin(); it != worker_.end();)  // the bound: the first ones found go
    it = it->second->orphaned && ++orphans > max_orphans ? end_run(it) : std::next(it);
  for (auto it = early_pieces_.begin(); it != early_pieces_.end();)
    it = it->first.first == id ? early_pieces_.erase(it) : std::next(it);
  // Coordinator side.
  for (auto& [rid, cp] : coordinated_) {
    coord_run& c = *cp;
    if (c.state != job_state::running) continue;
    c.newcomers.erase(id);
    if (c.client == id) {
      // Lost, or only cut off from us: it may be resuming the run elsewhere (it then reaches us
      // as that node's setup). The run goes on meanwhile; tick() ends it after the grace time.
      c.client_lost_at = now_;
      continue;
    }
    auto m = std::find(c.members.begin(), c.members.end(), id);
    if (m == c.members.end()) continue;
    c.members.erase(m);
    c.shards_sent.erase(id);
    // A step the dead node took part in is redone; nothing of it was applied anywhere.
    if (c.ph == coord_run::phase::stepping && std::find(c.ring.begin(), c.ring.end(), id) != c.ring.end()) {
      auto more = issue_step(rid, c);
      out.insert(out.end(), more.begin(), more.end());
    }
  }
  return out;
}

std::vector<outbound> train_engine::tick(clock::time_point now) {
  now_ = now;
  std::vector<outbound> out;
  for (auto& [rid, c] : coordinated_) {
    if (c->state != job_state::running || !c->client_lost_at || now - *c->client_lost_at < client_grace) continue;
    auto more = fail_run(rid, *c, error_code::network, "the client went away");
    out.insert(out.end(), more.begin() + 1, more.end());  // nobody to tell the error to
  }
  return out;
}

std::vector<msg::job_status> train_engine::jobs(clock::time_point now) const {
  std::vector<msg::job_status> out;
  for (const auto& [id, c] : coordinated_) {
    msg::job_status s;
    s.job = c->client_train;
    s.client = c->client;
    s.state = c->state;
    s.step = c->step;
    s.steps = c->spec.steps;
    s.stages = static_cast<uint32_t>(c->members.size());
    s.attempts = c->attempt;
    s.kind = job_kind::training;
    s.seconds = c->state == job_state::running ? std::chrono::duration<double>(now - c->started).count() : c->seconds;
    out.push_back(s);
  }
  return out;
}

// ---- worker ----

namespace {

/// This node's answer to a step it cannot take part in.
msg::train_reduced refusal(const msg::train_step& s, const error& why) {
  msg::train_reduced r;
  r.train = s.train;
  r.step = s.step;
  r.attempt = s.attempt;
  r.code = why.code;
  r.error = why.message;
  return r;
}

}  // namespace

std::vector<outbound> train_engine::on_setup(const std::string& from, const msg::train_setup& s) {
  const worker_key key{from, s.train};
  auto graphs = check_train_spec(s.spec, limits_, false);
  if (!graphs) {
    // The coordinator waits for this node's part of a step, not for the setup: the refusal
    // answers each step of the run still to come.
    const error why{graphs.error().code, "setup refused: " + graphs.error().message};
    if (refused_.size() >= max_early_runs) refused_.erase(refused_.begin());
    refused_[key] = why;
    early_pieces_.erase(key);
    return {};
  }
  refused_.erase(key);
  auto w = std::make_shared<worker_run>();
  w->coordinator = from;
  w->train = s.train;
  w->client = s.client;
  w->client_train = s.client_train;
  w->shell = spec_shell(s.spec);
  // The run resumed under a new coordinator: what this node kept of it before is stale now,
  // and if this node was coordinating it (the client was only cut off from us), ours stops.
  std::vector<outbound> out;
  if (!s.client.empty()) {
    for (auto it = worker_.begin(); it != worker_.end();)
      it = it->first != key && it->second->client == s.client && it->second->client_train == s.client_train ? end_run(it)
                                                                                                          : std::next(it);
    if (from != self_)
      for (auto& [rid, c] : coordinated_)
        if (c->state == job_state::running && c->client == s.client && c->client_train == s.client_train) {
          auto more = fail_run(rid, *c, error_code::internal, "");
          out.insert(out.end(), more.begin() + 1, more.end());  // the client is with the new coordinator
          c->state = job_state::moved;  // to the node `from`
        }
  }
  w->method = s.spec.method;
  w->steps = s.spec.steps;
  w->micro_batches = s.spec.micro_batches;
  w->inner_steps = s.spec.inner_steps;
  w->format = s.spec.compression;
  w->graphs = std::move(*graphs);
  w->seed = s.spec.seed;
  w->micro_batch = s.spec.micro_batch;
  w->plan = shard_plan::make(static_cast<int64_t>(s.spec.dataset_rows), s.spec.micro_batch, s.spec.micro_batches);
  w->applied = s.spec.start_step;
  w->dev->initial = to_map(s.spec.state);
  for (const auto& [name, t] : w->dev->initial) w->state_names.push_back(name);
  // DiLoCo's local state: whatever the inner step (gradient + optimizer graphs) touches.
  std::set<std::string> local;
  for (const auto* g : {w->graphs.grad.get(), w->graphs.apply.get()})
    for (const auto& n : g->nodes)
      if (n.op == op_kind::parameter) local.insert(n.attrs.name);
  w->local_names.assign(local.begin(), local.end());
  if (auto early = early_pieces_.find(key); early != early_pieces_.end()) {
    w->parked = std::move(early->second);
    early_pieces_.erase(early);
  }
  if (auto old = worker_.find(key); old != worker_.end()) end_run(old);  // set up again: the old one's names are ours now
  worker_[key] = w;
  return out;
}

void train_engine::orphan(worker_run& w) {
  w.orphaned = true;  // no round, ring or parked piece of it will go on
  w.round.reset();
  w.ring.clear();
  w.parked.clear();
}

std::vector<outbound> train_engine::on_step(const std::string& from, const msg::train_step& s) {
  const worker_key key{from, s.train};
  auto it = worker_.find(key);
  if (it == worker_.end()) {
    // The setup comes before the steps (the transport keeps the coordinator's order): no run
    // here means the setup was refused, or the run ended (or was never set up on this node).
    if (s.stop && !s.report_state) {
      early_pieces_.erase(key);
      refused_.erase(key);
      return {};
    }
    if (auto no = refused_.find(key); no != refused_.end()) return {{from, refusal(s, no->second)}};
    if (!s.ring.empty() || s.report_state)
      return {{from, refusal(s, error{error_code::not_found, "no training run " + std::to_string(s.train) + " of this coordinator is set up on node " + self_.substr(0, 8)})}};
    return {};
  }
  auto w = it->second;
  if (w->orphaned) return {};  // its client is taking it elsewhere
  const auto refuse = [&](error_code code, const std::string& why) {
    std::vector<outbound> out;
    // A ring member's coordinator waits for its reduction; a report-state step (the coordinator's
    // own worker, no ring) is waited for too: without an answer the run would hang.
    if (!s.ring.empty() || s.report_state) {
      msg::train_reduced r;
      r.train = s.train;
      r.step = s.step;
      r.attempt = s.attempt;
      r.code = code;
      r.error = why;
      out.push_back({from, r});
    }
    if (auto gone = worker_.find(key); gone != worker_.end()) end_run(gone);  // set up again by the coordinator if it wants us back
    return out;
  };
  if (s.stop && !s.report_state) {
    end_run(it);
    early_pieces_.erase(key);
    return {};
  }
  if (w->broken) return refuse(error_code::device, "this node's device was restarted and lost the training state");
  for (const auto& sh : s.shards) {
    if (sh.index >= w->plan.shards) return refuse(error_code::invalid_argument, "dataset shard " + std::to_string(sh.index) + " does not exist");
    auto columns = std::make_shared<tensor_map>(to_map(sh.columns));
    auto rows = dataset_rows(*w->graphs.grad, static_cast<uint32_t>(w->micro_batch), *columns);
    if (!rows) return refuse(rows.error().code, "dataset shard " + std::to_string(sh.index) + ": " + rows.error().message);
    if (*rows < w->micro_batch) return refuse(error_code::invalid_argument, "dataset shard " + std::to_string(sh.index) + " has fewer rows than one micro-batch");
    w->shards[sh.index] = std::move(columns);
  }
  // The coordinator's steps come in the order it sent them, each with the shards this node has
  // not been sent yet: a micro-batch of a shard never sent is the coordinator's error.
  for (const uint64_t micro : s.micro)
    if (!w->shards.count(w->plan.shard_of(micro)))
      return refuse(error_code::invalid_argument, "step " + std::to_string(s.step) + " needs dataset shard " +
                                                      std::to_string(w->plan.shard_of(micro)) + ", which this node was never sent");
  // Whatever round was in progress belongs to an earlier attempt.
  w->round.reset();
  w->step = s.step;
  w->attempt = s.attempt;
  w->ring = s.ring;
  w->rank = static_cast<int>(std::find(s.ring.begin(), s.ring.end(), self_) - s.ring.begin());
  if (w->rank >= static_cast<int>(s.ring.size())) w->rank = -1;
  w->stopping = s.stop;
  const uint64_t inner = w->method == train_method::diloco ? std::min<uint64_t>(w->inner_steps, w->steps - std::min(s.step, w->steps)) : 1;
  w->step_end = s.step + inner;
  // DiLoCo averages the deltas of the members that trained (a member with no micro-batch adds 0).
  w->participants = static_cast<uint32_t>(std::max<size_t>(1, std::min<size_t>(s.ring.size(), w->micro_batches)));
  std::erase_if(w->parked, [&](const auto& p) { return p.second.round < round_id(s.step, s.attempt); });

  std::optional<worker_run::held_result> commit;
  if (s.commit > w->applied) {
    if (!w->held || w->held->end != s.commit)
      return refuse(error_code::not_found, "cannot commit step " + std::to_string(s.commit - 1) + ": its result is not held here");
    commit = std::move(w->held);
    w->applied = s.commit;
  }
  w->held.reset();
  if (w->rank < 0 && !s.ring.empty()) return refuse(error_code::invalid_argument, "this node is not in the ring it was sent");

  train_task t;
  t.coordinator = from;
  t.train = s.train;
  t.step = s.step;
  t.attempt = s.attempt;
  t.report_state = s.report_state;
  const bool report = s.report_state;
  const bool compute = !s.ring.empty();
  const auto micro = s.micro;
  const uint64_t step = s.step;
  const uint32_t k = w->micro_batches;
  std::map<uint32_t, std::shared_ptr<const tensor_map>> shards;  // what this step's micro-batches read
  for (const uint64_t m : micro) shards[w->plan.shard_of(m)] = w->shards.at(w->plan.shard_of(m));
  t.work = [w, commit = std::move(commit), report, compute, micro, step, inner, k, shards = std::move(shards)](gpu::executor& ex) -> expected<train_work_result> {
    auto& d = *w->dev;
    const auto& g = w->graphs;
    if (!d.loaded) {
      for (auto [graph_ptr, slot] : {std::pair{g.apply.get(), &d.apply},
                                     std::pair{g.delta.get(), &d.delta}, std::pair{g.outer.get(), &d.outer}}) {
        if (!graph_ptr) continue;
        auto p = ex.load(*graph_ptr);
        if (!p) return tl::unexpected(p.error());
        *slot = *p;
        d.programs.push_back(*p);
      }
      const std::string prefix = accumulator_prefix(w->coordinator, w->train);
      auto acc = accumulating(*g.grad, g.grads, prefix);
      if (!acc) return tl::unexpected(acc.error());
      auto first = ex.load(acc->first);
      if (!first) return tl::unexpected(first.error());
      d.programs.push_back(*first);
      auto more = ex.load(acc->second);
      if (!more) return tl::unexpected(more.error());
      d.programs.push_back(*more);
      d.acc_first = *first;
      d.acc_more = *more;
      for (const auto& name : g.grads) d.acc_names.push_back(prefix + name);
      if (auto ok = ex.set_parameters(d.initial); !ok) return tl::unexpected(ok.error());
      d.initial.clear();
      d.loaded = true;
    }
    if (commit) {
      // Data parallel: the optimizer step on the mean gradient. DiLoCo: the outer step on the
      // mean delta (which also resets the local parameters to the new outer ones).
      const bool dp = w->method == train_method::data_parallel;
      tensor_map in = dp ? unflatten(commit->sum, g.grads, g.grad_dims) : unflatten(commit->sum, g.deltas, g.delta_dims);
      in["scale"] = f32_scalar(dp ? 1.0 / k : 1.0 / commit->participants);
      if (auto ok = ex.run(dp ? d.apply : d.outer, in); !ok) return tl::unexpected(ok.error());
    }
    train_work_result r;
    if (report) {
      auto st = ex.get_parameters(w->state_names);
      if (!st) return tl::unexpected(st.error());
      r.state = std::move(*st);
    }
    if (!compute) return r;

    size_t grad_total = 0;
    for (auto n : g.grad_sizes) grad_total += static_cast<size_t>(n);
    double loss_sum = 0;
    // The gradients summed over `batch` micro-batches.
    const auto gradients = [&](const uint64_t* first, size_t count, std::vector<float>& sum) -> expected<void> {
      sum.assign(grad_total, 0.0f);
      for (size_t i = 0; i < count; ++i) {
        const uint32_t shard = w->plan.shard_of(first[i]);
        const tensor_map& columns = *shards.at(shard);
        auto order = d.orders.try_emplace(shard, columns.begin()->second.dims[0], w->micro_batch, shard_seed(w->seed, shard)).first;
        auto in = take_rows(columns, order->second.rows(w->plan.draw_of(first[i])));
        if (!in) return tl::unexpected(in.error());
        auto out = ex.run(i == 0 ? d.acc_first : d.acc_more, *in);
        if (!out) return tl::unexpected(out.error());
        loss_sum += out->at("loss").at(0);
      }
      if (count == 0) return {};
      auto acc = ex.get_parameters(d.acc_names);
      if (!acc) return tl::unexpected(acc.error());
      tensor_map by_grad;
      for (size_t i = 0; i < g.grads.size(); ++i) by_grad[g.grads[i]] = std::move(acc->at(d.acc_names[i]));
      return accumulate(sum, by_grad, g.grads);
    };
    if (w->method == train_method::data_parallel) {
      if (auto ok = gradients(micro.data(), micro.size(), r.buffer); !ok) return tl::unexpected(ok.error());
    } else {
      // DiLoCo: a redone step starts again from the local state it started from the first time.
      if (d.snapshot_step == step) {
        if (auto ok = ex.set_parameters(d.snapshot); !ok) return tl::unexpected(ok.error());
      } else {
        auto snap = ex.get_parameters(w->local_names);
        if (!snap) return tl::unexpected(snap.error());
        d.snapshot = std::move(*snap);
        d.snapshot_step = step;
      }
      const size_t per = micro.size() / inner;
      std::vector<float> sum;
      for (uint64_t h = 0; h < inner && per > 0; ++h) {
        if (auto ok = gradients(micro.data() + h * per, per, sum); !ok) return tl::unexpected(ok.error());
        tensor_map in = unflatten(sum, g.grads, g.grad_dims);
        in["scale"] = f32_scalar(1.0 / static_cast<double>(per));
        if (auto ok = ex.run(d.apply, in); !ok) return tl::unexpected(ok.error());
      }
      auto deltas = ex.run(d.delta, {});
      if (!deltas) return tl::unexpected(deltas.error());
      size_t delta_total = 0;
      for (auto n : g.delta_sizes) delta_total += static_cast<size_t>(n);
      r.buffer.assign(delta_total, 0.0f);
      if (auto ok = accumulate(r.buffer, *deltas, g.deltas); !ok) return tl::unexpected(ok.error());
    }
    r.buffer.push_back(static_cast<float>(loss_sum));
    return r;
  };
  ready_.push_back(std::move(t));
  return {};
}

std::vector<train_task> train_engine::take_ready() {
  std::vector<train_task> out = std::move(ready_);
  ready_.clear();
  return out;
}

std::vector<outbound> train_engine::on_executed(const train_task& t, expected<train_work_result> r, clock::time_point now) {
  now_ = now;
  if (t.cleanup) return {};
  if (t.takeover) return take_over(t, std::move(r));
  std::vector<outbound> out;
  const worker_key key{t.coordinator, t.train};
  if (r && !r->state.empty()) {
    msg::train_state st{t.train, t.step, {}};
    for (auto& [name, value] : r->state) st.state.push_back({name, std::move(value)});
    out.push_back({t.coordinator, std::move(st)});
  }
  auto it = worker_.find(key);
  if (it == worker_.end()) return out;
  auto w = it->second;
  if (t.step != w->step || t.attempt != w->attempt) return out;  // superseded by a newer attempt
  if (r && w->broken) r = make_error(error_code::device, "the device was restarted during the step");
  if (!r) {
    w->broken = true;
    if (!w->ring.empty() || t.report_state) {
      msg::train_reduced red;
      red.train = t.train;
      red.step = t.step;
      red.attempt = t.attempt;
      red.code = r.error().code;
      red.error = r.error().to_string();
      out.push_back({t.coordinator, red});
    }
    end_run(it);
    return out;
  }
  if (w->stopping) {
    end_run(it);
    return out;
  }
  if (w->ring.empty()) return out;
  w->round = std::make_unique<ring_allreduce>(round_id(t.step, t.attempt), w->rank, static_cast<int>(w->ring.size()),
                                              std::move(r->buffer), ring_pieces, w->format);
  auto more = forward(*w, w->round->start());
  out.insert(out.end(), more.begin(), more.end());
  // Pieces from the predecessor that came while we were computing.
  auto parked = std::move(w->parked);
  w->parked.clear();
  const uint64_t current = round_id(t.step, t.attempt);
  for (const auto& [from, p] : parked) {
    if (!w->round) break;  // done
    if (p.round > current) w->parked.emplace_back(from, p);
    else if (p.round == current) {
      auto more2 = accept_piece(*w, from, p);
      out.insert(out.end(), more2.begin(), more2.end());
    }
  }
  if (w->round && w->round->done()) {
    auto done = round_done(*w);
    out.insert(out.end(), done.begin(), done.end());
  }
  return out;
}

std::vector<outbound> train_engine::forward(worker_run& w, std::vector<allreduce_message> ms) {
  std::vector<outbound> out;
  const std::string& next = w.ring[static_cast<size_t>(w.rank + 1) % w.ring.size()];
  for (auto& m : ms) {
    msg::allreduce_piece p;
    p.train = w.train;
    p.coordinator = w.coordinator;
    p.round = m.round;
    p.ring_step = m.step;
    p.piece = m.piece;
    p.payload = std::move(m.payload);
    out.push_back({next, std::move(p)});
  }
  return out;
}

std::vector<outbound> train_engine::on_piece(const std::string& from, const msg::allreduce_piece& p) {
  const worker_key key{p.coordinator, p.train};
  allreduce_message m{p.round, p.ring_step, p.piece, p.payload};
  auto it = worker_.find(key);
  if (it == worker_.end()) {
    // The predecessor may be faster than our setup or step message (they come from the
    // coordinator, over another connection): keep the piece for later.
    if (!peers_.count(p.coordinator) && p.coordinator != self_) return {};
    if (early_pieces_.size() >= max_early_runs && !early_pieces_.count(key)) return {};
    auto& q = early_pieces_[key];
    if (q.size() < max_parked_pieces) q.emplace_back(from, std::move(m));
    return {};
  }
  worker_run& w = *it->second;
  if (w.orphaned) return {};
  const uint64_t current = round_id(w.step, w.attempt);
  if (p.round < current) return {};  // a stale round
  if (p.round > current || !w.round) {
    if (w.parked.size() < max_parked_pieces) w.parked.emplace_back(from, std::move(m));
    return {};
  }
  return accept_piece(w, from, m);
}

std::vector<outbound> train_engine::accept_piece(worker_run& w, const std::string& from, const allreduce_message& m) {
  if (w.rank < 0 || w.ring.empty()) return {};
  const std::string& prev = w.ring[static_cast<size_t>(w.rank + static_cast<int>(w.ring.size()) - 1) % w.ring.size()];
  if (from != prev) return {};  // only our predecessor in the ring may send us pieces
  auto fwd = w.round->on_message(m);
  if (!fwd) return {};  // a duplicate or malformed piece: ring_allreduce says why; dropping it is safe
  auto out = forward(w, std::move(*fwd));
  if (w.round->done()) {
    auto done = round_done(w);
    out.insert(out.end(), done.begin(), done.end());
  }
  return out;
}

std::vector<outbound> train_engine::round_done(worker_run& w) {
  worker_run::held_result h;
  h.end = w.step_end;
  h.sum = w.round->result();
  h.participants = w.participants;
  const float loss_sum = h.sum.back();
  h.sum.pop_back();
  msg::train_reduced r;
  r.train = w.train;
  r.step = w.step;
  r.attempt = w.attempt;
  r.ok = true;
  r.loss = static_cast<double>(loss_sum) / static_cast<double>(w.micro_batches * (w.step_end - w.step));
  r.bytes_sent = w.round->bytes_sent();
  w.held = std::move(h);
  w.round.reset();
  return {{w.coordinator, r}};
}

}  // namespace mesh

namespace mesh {

// ---- coordinator failover ----

std::vector<outbound> train_engine::on_resume(const std::string& client, const msg::train_resume& r) {
  // The client's word that the coordinator is gone is enough for its own run, even before this
  // node's health monitor says so: the run can no longer report to the client anyway.
  std::shared_ptr<worker_run> w;
  for (const auto& [key, run] : worker_)
    if (key.first == r.coordinator && run->client == client && run->client_train == r.train && !run->broken) w = run;
  if (!w) {
    msg::job_result no;
    no.job = r.train;
    no.code = error_code::not_found;
    no.error = "node " + self_.substr(0, 8) + " holds no state of training " + std::to_string(r.train) + " coordinated by " +
               r.coordinator.substr(0, 8) + " (it was not a member, its device was restarted, or the run ended)";
    return {{client, no}};
  }
  if (r.dataset.empty()) {
    msg::job_result no;
    no.job = r.train;
    no.code = error_code::invalid_argument;
    no.error = "train_resume carries no dataset (the new coordinator hands out the shards)";
    return {{client, no}};
  }
  orphan(*w);
  w->resume_dataset = r.dataset;
  train_task t;
  t.coordinator = w->coordinator;
  t.train = w->train;
  t.step = w->applied;
  t.takeover = true;
  const uint64_t applied = w->applied;
  t.work = [w, applied](gpu::executor& ex) -> expected<train_work_result> {
    auto& d = *w->dev;
    train_work_result out;
    if (!d.loaded) {  // never ran a step: the state it was set up with
      out.state = d.initial;
      return out;
    }
    // DiLoCo: inner steps of the unfinished outer step changed the local parameters; its
    // snapshot is the state after the last applied step.
    if (w->method == train_method::diloco && d.snapshot_step == applied)
      if (auto ok = ex.set_parameters(d.snapshot); !ok) return tl::unexpected(ok.error());
    auto st = ex.get_parameters(w->state_names);
    if (!st) return tl::unexpected(st.error());
    out.state = std::move(*st);
    return out;
  };
  ready_.push_back(std::move(t));
  return {};
}

std::vector<outbound> train_engine::take_over(const train_task& t, expected<train_work_result> r) {
  auto it = worker_.find({t.coordinator, t.train});
  if (it == worker_.end()) return {};  // resumed already, or its client went away meanwhile
  auto w = it->second;
  end_run(it);
  const auto fail = [&](const std::string& why) {
    msg::job_result no;
    no.job = w->client_train;
    no.code = error_code::device;
    no.error = "cannot take over training " + std::to_string(w->client_train) + ": " + why;
    return std::vector<outbound>{{w->client, no}};
  };
  if (!r) return fail("reading this node's training state failed: " + r.error().to_string());
  // The client's spec again: names without the old run's prefix, this node's state, its data.
  const std::string old_prefix = run_prefix(w->coordinator, w->train);
  msg::train_spec spec = w->shell;
  for (auto* wire : {&spec.grad_wire, &spec.apply_wire, &spec.delta_wire, &spec.outer_wire}) {
    if (wire->empty()) continue;
    auto bytes = rename_parameters(*wire, old_prefix, "", limits_);
    if (!bytes) return fail(bytes.error().message);
    *wire = std::move(*bytes);
  }
  for (auto& [name, value] : r->state)
    spec.state.push_back({starts_with(name, old_prefix) ? name.substr(old_prefix.size()) : name, std::move(value)});
  spec.dataset = std::move(w->resume_dataset);
  spec.start_step = t.step;
  if (spec.start_step >= spec.steps) {
    // Every step was applied here; only the result was not delivered.
    msg::job_result done;
    done.job = w->client_train;
    done.ok = true;
    done.outputs = std::move(spec.state);
    done.step = spec.start_step;
    done.workers = {self_};
    return {{w->client, std::move(done)}};
  }
  return open(w->client, msg::open_training{w->client_train, std::move(spec)});
}

}  // namespace mesh
