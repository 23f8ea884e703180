// The worker side of training: take a run's setup, and for each step commit the held result of
// the step before, compute this node's gradients (DiLoCo: its inner steps and deltas) on the
// device, then start the step's all-reduce round (train_collective.cpp). What runs on the
// device is a train_task the shell hands to the executor.
#include "actors/train_engine.hpp"

#include <algorithm>
#include <cstring>
#include <tuple>

#include "actors/region_import.hpp"
#include "actors/train_buckets.hpp"
#include "actors/train_engine_state.hpp"
#include "gpu/executor.hpp"
#include "graph/builder.hpp"

namespace mesh {
using namespace train_detail;
namespace {

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

std::span<uint8_t> bytes_of(std::vector<float>& v) { return {reinterpret_cast<uint8_t*>(v.data()), v.size() * sizeof(float)}; }

/// A host buffer of `count` floats for a bucket's gradients: `reuse` (the buffer the bucket's
/// last commit gave back) when there is one, so its pages are not allocated and touched again;
/// room for one more value (the last bucket carries the loss sum). Its values are whatever it
/// held: the caller overwrites them.
std::vector<float> bucket_buffer(std::vector<float> reuse, size_t count) {
  reuse.reserve(count + 1);
  reuse.resize(count);
  return reuse;
}

/// The accumulators of bucket `b` of `buckets` (one bucket: all of them).
std::vector<std::string> bucket_names(const std::vector<std::string>& acc_names, const std::vector<size_t>& bucket_ends, size_t b,
                                      size_t buckets) {
  if (buckets == 1) return acc_names;
  const size_t from = b ? bucket_ends[b - 1] : 0, to = bucket_ends[b];
  return {acc_names.begin() + static_cast<ptrdiff_t>(from), acc_names.begin() + static_cast<ptrdiff_t>(to)};
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
  out.fragments = spec.fragments;
  out.overlap_steps = spec.overlap_steps;
  out.compression = spec.compression;
  out.seed = spec.seed;
  out.grad = spec.grad;
  out.apply = spec.apply;
  out.delta = spec.delta;
  out.outer = spec.outer;
  return out;
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

/// The optimizer graph reading the gradients from the resident accumulators ("<prefix>grad.<p>",
/// see accumulating()) instead of inputs: the step of a ring of one, and DiLoCo's inner steps,
/// whose gradients need not leave the device. Only "scale" stays an input.
graph resident_apply(const graph& apply, const std::string& prefix) {
  graph g = apply;
  for (auto& n : g.nodes)
    if (n.op == op_kind::input && n.attrs.name.rfind("grad.", 0) == 0) {
      n.op = op_kind::parameter;
      n.attrs.name = prefix + n.attrs.name;
    }
  return g;
}

/// Bucket `b` of the last micro-batch's gradients: runs `program`, its segment of the gradient
/// program (train_buckets.hpp), on that micro-batch's `inputs`, and reads the bucket's
/// accumulators, which then hold the sum over the step's micro-batches, into `buffer` (segment 0
/// also adds the micro-batch's loss to `loss`). `empty`: no micro-batch this step (more members
/// than micro-batches): the bucket is zeros. With `copy`, a read `into` the region may still be
/// under way when this returns (the next segment runs beside it): *copy says when it is done.
expected<std::vector<float>> run_bucket(gpu::executor& ex, gpu::program_id program, const std::vector<std::string>& reads,
                                        const tensor_map& inputs, const std::vector<std::string>& acc_names, const train_graphs& g,
                                        int b, bool empty, double& loss, std::vector<float> buffer, float* into = nullptr,
                                        gpu::pending_copy* copy = nullptr) {
  const size_t from = b ? g.bucket_ends[static_cast<size_t>(b) - 1] : 0, to = g.bucket_ends[static_cast<size_t>(b)];
  size_t total = 0;
  for (size_t i = from; i < to; ++i) total += static_cast<size_t>(g.grad_sizes[i]);
  // Into the node's shared region (host_reduce), or into a buffer of the task's result.
  std::vector<float> out = into ? std::vector<float>{} : bucket_buffer(std::move(buffer), total);
  const std::span<float> dst = into ? std::span<float>(into, total) : std::span<float>(out);
  if (empty) {
    std::fill(dst.begin(), dst.end(), 0.0f);
    return out;
  }
  tensor_map in;  // the segment's own inputs: it may read fewer than the whole program
  for (const auto& name : reads) in[name] = inputs.at(name);
  auto ran = ex.run(program, in);
  if (!ran) return tl::unexpected(ran.error());
  if (b == 0) loss += ran->at("loss").at(0);
  const auto names = bucket_names(acc_names, g.bucket_ends, static_cast<size_t>(b), g.bucket_ends.size());
  const std::span<uint8_t> bytes{reinterpret_cast<uint8_t*>(dst.data()), dst.size_bytes()};
  if (into && copy) {
    auto started = ex.read_parameters_async(names, bytes);
    if (!started) return tl::unexpected(started.error());
    *copy = std::move(*started);
  } else if (auto ok = ex.read_parameters(names, bytes); !ok) {
    return tl::unexpected(ok.error());
  }
  return out;
}

/// The end of a copy beside the kernels for train_work_result::copied, which notes `what` in the
/// timing log when it comes (`keep`: what must live until then); none for a copy made already,
/// whose end is noted at once.
std::function<expected<void>()> copy_end(gpu::pending_copy copy, std::string what, std::vector<std::shared_ptr<shared_region>> keep = {}) {
  if (!copy.wait_for_it) {
    if (train_detail::timing_enabled()) train_detail::timing(what);
    return nullptr;
  }
  return [copy = std::move(copy), what = std::move(what), keep = std::move(keep)]() -> expected<void> {
    auto done = copy.wait();
    if (done && train_detail::timing_enabled()) train_detail::timing(what);
    return done;
  };
}


/// Where a host_reduce step's buckets go: the node's region, bucket b at offsets[b] (floats),
/// its values[b] values (the last bucket's last one the loss sum). Copied into the tasks, which
/// keep the region mapped.
struct region_buckets {
  std::shared_ptr<shared_region> region;
  std::vector<size_t> offsets, values;
  float* at(int b) const { return reinterpret_cast<float*>(region->data()) + offsets[static_cast<size_t>(b)]; }
};

/// Bucket `b`'s buffer from the last commit (device_side::spare), or none.
template <class Device>
std::vector<float> spare_of(Device& d, size_t b) {
  return b < d.spare.size() ? std::move(d.spare[b]) : std::vector<float>{};
}

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

std::vector<outbound> train_engine::on_setup(const node_id& from, const msg::train_setup& s) {
  const worker_key key{from, s.train};
  const auto refuse_setup = [&](const error& why) {
    // The coordinator waits for this node's part of a step, not for the setup: the refusal
    // answers each step of the run still to come.
    if (refused_.size() >= max_refused_runs) refused_.erase(refused_.begin());
    refused_[key] = why;
    return std::vector<outbound>{};
  };
  const uint32_t generation = s.takeover.generation;
  // A takeover ends the run everywhere else, so it must be the client's word, not the sender's:
  // any member can name another member's client and run in a setup. Without the client's grant
  // for the sender, a setup may only start a run of the sender's own.
  if (generation > 0) {
    if (auto ok = msg::check_takeover(s.takeover, s.client, s.client_train, from); !ok) {
      note_refusal(from, "train_setup", "training " + std::to_string(s.train) + " (run " + std::to_string(s.client_train) + " of client " +
                                            s.client.short_string() + "): " + ok.error().message);
      return refuse_setup({ok.error().code, "setup refused: " + ok.error().message});
    }
  }
  // A coordinator that was taken over (it only lost its client, and a member took the run over
  // at a higher generation) may still set nodes up: its setups must not stop the new run.
  if (!s.client.empty()) {
    for (const auto& [k, run] : worker_)
      if (k != key && run->client == s.client && run->client_train == s.client_train && run->generation > generation)
        return refuse_setup({error_code::invalid_argument, "setup refused: node " + k.first.short_string() + " took this run over"});
    for (const auto& [rid, c] : coordinated_)
      if (c->state == job_state::running && c->client == s.client && c->client_train == s.client_train && c->takeover.generation > generation)
        return refuse_setup({error_code::invalid_argument, "setup refused: this node took this run over"});
  }
  // Each run holds its state on this node's device: one coordinator may keep only so many here.
  size_t live = 0;
  for (const auto& [k, run] : worker_) live += k.first == from && k != key && !run->orphaned && !run->finished_at;
  if (live >= max_runs_per_coordinator) {
    note_refusal(from, "train_setup", "training " + std::to_string(s.train) + ": " + std::to_string(max_runs_per_coordinator) +
                                          " runs of this coordinator already live on this node");
    return refuse_setup({error_code::limit_exceeded, "setup refused: node " + self_.short_string() + " already holds " +
                                                         std::to_string(max_runs_per_coordinator) + " runs of this coordinator"});
  }
  auto graphs = check_train_spec(s.spec, false);
  if (!graphs) return refuse_setup({graphs.error().code, "setup refused: " + graphs.error().message});
  refused_.erase(key);
  auto w = std::make_shared<worker_run>();
  w->coordinator = from;
  w->train = s.train;
  w->client = s.client;
  w->client_train = s.client_train;
  w->generation = generation;
  w->shell = spec_shell(s.spec);
  // The run resumed under a new coordinator (its grant checked above): what this node kept of
  // its earlier generations is stale now, and if this node was coordinating it (the client was
  // only cut off from us), ours stops.
  std::vector<outbound> out;
  if (generation > 0) {
    for (auto it = worker_.begin(); it != worker_.end();)
      it = it->first != key && it->second->client == s.client && it->second->client_train == s.client_train && it->second->generation < generation
               ? end_run(it)
               : std::next(it);
    if (from != self_)
      for (auto& [rid, c] : coordinated_)
        if (c->state == job_state::running && c->client == s.client && c->client_train == s.client_train && c->takeover.generation < generation) {
          auto more = fail_run(rid, *c, error_code::internal, "");
          out.insert(out.end(), more.begin() + 1, more.end());  // the client is with the new coordinator
          c->state = job_state::moved;  // to the node `from`
        }
  }
  w->method = s.spec.method;
  w->steps = s.spec.steps;
  w->micro_batches = s.spec.micro_batches;
  w->inner_steps = s.spec.inner_steps;
  w->fragments = s.spec.fragments;
  w->overlap_steps = s.spec.overlap_steps;
  w->format = s.spec.compression;
  w->graphs = std::move(*graphs);
  w->seed = s.spec.seed;
  w->micro_batch = s.spec.micro_batch;
  w->plan = plan_of(s.spec);
  if (!s.spec.text.empty()) w->text = std::make_shared<const msg::train_text_data>(s.spec.text[0]);
  w->applied = s.spec.start_step;
  w->dev->initial = to_map(s.spec.state);
  for (const auto& [name, t] : w->dev->initial) w->state_names.push_back(name);
  // DiLoCo's local state: whatever the inner step (gradient + optimizer graphs) touches.
  std::set<std::string> local;
  for (const auto* g : {w->graphs.grad.get(), w->graphs.apply.get()})
    for (const auto& n : g->nodes)
      if (n.op == op_kind::parameter) local.insert(n.attrs.name);
  w->local_names.assign(local.begin(), local.end());
  if (auto old = worker_.find(key); old != worker_.end()) end_run(old);  // set up again: the old one's names are ours now
  worker_[key] = w;
  return out;
}

void train_engine::orphan(worker_run& w) {
  w.orphaned = true;  // no round or ring of it will go on
  w.round.reset();
  w.direct.reset();
  w.contribution.clear();
  w.ring.clear();
}

std::vector<outbound> train_engine::on_step(const node_id& from, const msg::train_step& s) {
  if (train_detail::timing_enabled()) train_detail::timing("step " + std::to_string(s.step) + " worker: train_step arrives");
  const worker_key key{from, s.train};
  auto it = worker_.find(key);
  if (it == worker_.end()) {
    // The setup comes before the steps (the transport keeps the coordinator's order): no run
    // here means the setup was refused, or the run ended (or was never set up on this node).
    if (s.stop && !s.report_state) {
      refused_.erase(key);
      return {};
    }
    if (auto no = refused_.find(key); no != refused_.end()) return {{from, refusal(s, no->second)}};
    if (!s.ring.empty() || s.report_state)
      return {{from, refusal(s, error{error_code::not_found, "no training run " + std::to_string(s.train) + " of this coordinator is set up on node " + self_.short_string()})}};
    return {};
  }
  auto w = it->second;
  if (w->orphaned) return {};  // its client is taking it elsewhere
  const auto refuse = [&](error_code code, const std::string& why) {
    std::vector<outbound> out;
    // A ring member's coordinator waits for its reduction; a report-state step (the coordinator's
    // own worker, no ring) is waited for too: without an answer the run would hang.
    if (!s.ring.empty() || s.report_state) out.push_back({from, refusal(s, error{code, why})});
    if (auto gone = worker_.find(key); gone != worker_.end()) end_run(gone);  // set up again by the coordinator if it wants us back
    return out;
  };
  if (s.stop && !s.report_state) {
    // The run's end: the stop carries its last commit (advance() in train_coordinator.cpp).
    // Only the coordinator's own worker applies it and reports the result; this part is kept a
    // while, stopped, in case the coordinator dies before the client has the result.
    if (s.commit > 0 && s.commit >= w->steps && !w->broken) {
      w->finished_at = now_;
      w->round.reset();
      w->direct.reset();
      w->contribution.clear();
      w->ring.clear();
      return {};
    }
    end_run(it);
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
    if (!w->text && !w->shards.count(w->plan.shard_of(micro)))
      return refuse(error_code::invalid_argument, "step " + std::to_string(s.step) + " needs dataset shard " +
                                                      std::to_string(w->plan.shard_of(micro)) + ", which this node was never sent");
  // Whatever round was in progress belongs to an earlier attempt.
  w->round.reset();
  w->direct.reset();
  w->contribution.clear();
  w->go = false;
  w->step = s.step;
  w->attempt = s.attempt;
  w->ring = s.ring;
  w->rank = static_cast<int>(std::find(s.ring.begin(), s.ring.end(), self_) - s.ring.begin());
  if (w->rank >= static_cast<int>(s.ring.size())) w->rank = -1;
  w->stopping = s.stop;
  const uint64_t inner = w->method == train_method::diloco ? std::min<uint64_t>(w->inner_steps, w->steps - std::min(s.step, w->steps)) : 1;
  w->step_end = s.step + inner;
  // DiLoCo with overlap: the round's last `trailing` inner steps run after its delta was taken,
  // while the all-reduce travels (a round of no more inner steps than that overlaps nothing).
  const uint64_t trailing = w->method == train_method::diloco && w->overlap_steps < inner ? w->overlap_steps : 0;
  w->loss_steps = inner - trailing;
  // DiLoCo averages the deltas of the members that trained (a member with no micro-batch adds 0).
  w->participants = static_cast<uint32_t>(std::max<size_t>(1, std::min<size_t>(s.ring.size(), w->micro_batches)));
  w->fragment = w->method == train_method::diloco ? static_cast<uint32_t>((s.step / w->inner_steps) % w->fragments) : 0;

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
  // A ring of one reduces nothing: its gradients stay on the device and its commit applies them
  // there (the held sum is then empty: round_done keeps only the loss).
  const bool alone = s.ring.size() == 1;
  std::map<uint32_t, std::shared_ptr<const tensor_map>> shards;  // what this step's micro-batches read
  if (!w->text)
    for (const uint64_t m : micro) shards[w->plan.shard_of(m)] = w->shards.at(w->plan.shard_of(m));
  // Data parallel over a ring of two or more: the gradients go in buckets, one task each, so
  // each bucket's all-reduce runs while the device computes the next (train_buckets.hpp).
  const int buckets = w->method == train_method::data_parallel && !alone && compute ? static_cast<int>(w->graphs.bucket_ends.size()) : 1;
  // Every member maps every other's region (the coordinator said so): the gradients go through
  // the regions (host_reduce.hpp), each bucket read back straight into this node's.
  std::optional<region_buckets> direct;
  w->posted.clear();
  if (s.host_reduce && buckets > 1 && w->region && host_reduce_possible(*w)) {
    const std::vector<size_t> values = host_bucket_values(*w);
    auto h = std::make_unique<host_reduce>(w->rank, static_cast<int>(s.ring.size()), values, host_sum_base(*w));
    if (h->region_floats() * sizeof(float) <= w->region->data_bytes()) {
      direct = region_buckets{w->region, {}, values};
      for (int b = 0; b < buckets; ++b) direct->offsets.push_back(h->input_offset(b));
      h->set_own_region(reinterpret_cast<float*>(w->region->data()));
      w->direct_regions.assign(s.ring.size(), nullptr);
      w->direct_regions[static_cast<size_t>(w->rank)] = w->region;
      for (size_t r = 0; r < s.ring.size(); ++r)
        if (auto it = w->peer_regions.find(s.ring[r]); it != w->peer_regions.end() && it->second && static_cast<int>(r) != w->rank) {
          h->set_region(static_cast<int>(r), reinterpret_cast<const float*>(std::as_const(*it->second).data()));  // another member's: read only
          w->direct_regions[r] = it->second;
        }
      if (parallel_) h->set_parallel(parallel_);
      w->direct = std::move(h);
      w->direct_base = round_id(s.step, s.attempt) * bucketed_allreduce::max_buckets;
      if (!std::exchange(w->direct_noted, true))
        notices_.push_back(notice{false, "training " + std::to_string(s.train) + ": the " + std::to_string(s.ring.size()) +
                                             " members share this host: each step's gradients are summed through their shared memory (host all-reduce)"});
    }
  }
  // The regions a host all-reduce step uses, imported into the device once every member maps
  // every other's (region_import.hpp): from the step before the first host step on, so the
  // imports' one-time cost (pinning the pages) falls outside the host steps.
  std::vector<std::shared_ptr<shared_region>> to_import;
  if (host_import_ && buckets > 1 && (direct || host_local(*w))) {
    to_import.push_back(w->region);
    for (const auto& m : s.ring)
      if (auto it = w->peer_regions.find(m); it != w->peer_regions.end() && it->second) to_import.push_back(it->second);
  }
  // The step's device work; `tail`: only the round's trailing inner steps (DiLoCo with overlap).
  const auto make_work = [&](std::optional<worker_run::held_result> held, bool tail) {
    return [w, commit = std::move(held), report = report && !tail, compute, micro, step, inner, k, alone, shards, opener = opener_,
            buckets, fragment = w->fragment, trailing, tail, direct, to_import,
            overlap = copy_overlap_](gpu::executor& ex) mutable -> expected<train_work_result> {
      auto& d = *w->dev;
      const auto& g = w->graphs;
      const auto mark = [step](const char* what) {
        if (train_detail::timing_enabled()) train_detail::timing("step " + std::to_string(step) + " worker: " + what);
      };
      mark("device work starts");
      if (!d.loaded) {
        // The optimizer itself runs as resident_apply() on the accumulators (a data-parallel
        // commit writes the reduced gradients there).
        for (auto [graph_ptr, slot] : {std::pair{g.delta.get(), &d.delta}, std::pair{g.outer.get(), &d.outer}}) {
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
        auto resident = ex.load(resident_apply(*g.apply, prefix));
        if (!resident) return tl::unexpected(resident.error());
        d.programs.push_back(*resident);
        d.apply_resident = *resident;
        for (const auto& name : g.grads) d.acc_names.push_back(prefix + name);
        if (g.bucket_ends.size() > 1) {
          // The gradient programs cut per bucket: the accumulators each bucket's segment updates.
          std::vector<std::vector<std::string>> groups;
          for (size_t b = 0; b < g.bucket_ends.size(); ++b)
            groups.emplace_back(d.acc_names.begin() + static_cast<ptrdiff_t>(b ? g.bucket_ends[b - 1] : 0),
                                d.acc_names.begin() + static_cast<ptrdiff_t>(g.bucket_ends[b]));
          for (auto [whole, segs, reads] : {std::tuple{&acc->first, &d.seg_first, &d.seg_first_inputs},
                                            std::tuple{&acc->second, &d.seg_more, &d.seg_more_inputs}}) {
            auto cut = segment_by_updates(*whole, groups, prefix + (segs == &d.seg_first ? "f." : "m."));
            if (!cut) return tl::unexpected(cut.error());
            *reads = cut->inputs;
            for (const auto& segment : cut->segments) {
              auto p = ex.load(segment);
              if (!p) return tl::unexpected(p.error());
              d.programs.push_back(*p);
              segs->push_back(*p);
            }
            // Under the accumulators' prefix: dropped with them when the run ends.
            for (auto& [name, t] : cut->saved) d.initial[name] = std::move(t);
          }
        }
        if (g.fragment_ends.size() > 1) {
          // Streaming DiLoCo: the outer step cut to each fragment's parameters (their outer copy,
          // its momentum and the local parameter), reading only that fragment's deltas.
          const std::string run = run_prefix(w->coordinator, w->train);
          for (size_t f = 0; f < g.fragment_ends.size(); ++f) {
            std::vector<std::string> targets;
            for (size_t i = f ? g.fragment_ends[f - 1] : 0; i < g.fragment_ends[f]; ++i) {
              const std::string p = g.deltas[i].substr(std::string("delta.").size());
              for (const auto& name : {run + p, run + "outer." + p, run + "outer.mom." + p}) targets.push_back(name);
            }
            auto cut = segment_by_updates(*g.outer, {targets}, prefix + "o.");
            if (!cut) return tl::unexpected(cut.error());
            auto p = ex.load(cut->segments.at(0));
            if (!p) return tl::unexpected(p.error());
            d.programs.push_back(*p);
            d.outer_fragment.push_back(*p);
          }
        }
        if (auto ok = ex.set_parameters(d.initial); !ok) return tl::unexpected(ok.error());
        d.initial.clear();
        d.loaded = true;
      }
      if (commit) {
        // Data parallel: the optimizer step on the mean gradient. DiLoCo: the outer step on the
        // mean delta (which also resets the local parameters to the new outer ones).
        const bool dp = w->method == train_method::data_parallel;
        const bool resident = !commit->written && std::all_of(commit->sum.begin(), commit->sum.end(), [](const auto& b) { return b.empty(); });
        if (dp && resident) {
          // The gradients of a ring of one, still in the accumulators.
          if (!d.grads_resident) return make_error(error_code::internal, "a step without gradients to apply");
          if (auto ok = ex.run(d.apply_resident, {{"scale", f32_scalar(1.0 / k)}}); !ok) return tl::unexpected(ok.error());
        } else if (dp) {
          // The reduced gradients go into the accumulators, bucket by bucket (those not written
          // as their rounds ended), and the optimizer reads them there; the buffers are kept
          // for the next step's gradients.
          if (d.unwritten) return make_error(d.unwritten->code, "a bucket's reduced gradients were not written: " + d.unwritten->message);
          if (d.spare.size() < commit->sum.size()) d.spare.resize(commit->sum.size());
          for (size_t b = 0; b < commit->sum.size(); ++b) {
            if (commit->sum[b].empty()) continue;
            if (auto ok = ex.write_parameters(bucket_names(d.acc_names, g.bucket_ends, b, commit->sum.size()), bytes_of(commit->sum[b])); !ok)
              return tl::unexpected(ok.error());
            d.spare[b] = std::move(commit->sum[b]);
          }
          if (auto ok = ex.run(d.apply_resident, {{"scale", f32_scalar(1.0 / k)}}); !ok) return tl::unexpected(ok.error());
        } else if (g.fragment_ends.size() > 1) {
          // Streaming DiLoCo: the outer step of the fragment this result holds.
          const size_t f = commit->fragment, from = f ? g.fragment_ends[f - 1] : 0, to = g.fragment_ends[f];
          const std::vector<std::string> names(g.deltas.begin() + static_cast<ptrdiff_t>(from), g.deltas.begin() + static_cast<ptrdiff_t>(to));
          const std::vector<shape> dims(g.delta_dims.begin() + static_cast<ptrdiff_t>(from), g.delta_dims.begin() + static_cast<ptrdiff_t>(to));
          tensor_map in = unflatten(commit->sum.at(0), names, dims);
          in["scale"] = f32_scalar(1.0 / commit->participants);
          if (auto ok = ex.run(d.outer_fragment.at(f), in); !ok) return tl::unexpected(ok.error());
        } else {
          // DiLoCo: the outer step on the mean delta.
          tensor_map in = unflatten(commit->sum.at(0), g.deltas, g.delta_dims);
          in["scale"] = f32_scalar(1.0 / commit->participants);
          if (auto ok = ex.run(d.outer, in); !ok) return tl::unexpected(ok.error());
        }
        d.grads_resident = false;
        mark("commit applied");
      }
      train_work_result r;
      if (report) {
        auto st = ex.get_parameters(w->state_names);
        if (!st) return tl::unexpected(st.error());
        r.state = std::move(*st);
      }
      if (!compute) return r;

      // Micro-batch `index`'s rows: from a shard the coordinator sent, or read from the data file.
      const auto micro_batch_inputs = [&](uint64_t index) -> expected<tensor_map> {
        const uint32_t shard = w->plan.shard_of(index);
        if (w->text) {
          if (!d.text) {
            if (!opener) return make_error(error_code::io_error, "this node cannot read training data files");
            auto bytes = opener(w->coordinator, *w->text);
            if (!bytes) return tl::unexpected(bytes.error());
            auto reader = text_data_reader::create(*w->text, std::move(*bytes), w->micro_batch, w->plan.shards, w->seed);
            if (!reader) return tl::unexpected(reader.error());
            d.text = std::move(*reader);
          }
          return d.text->micro_batch(shard, w->plan.draw_of(index));
        }
        const tensor_map& columns = *shards.at(shard);
        auto order = d.orders.try_emplace(shard, columns.begin()->second.dims[0], w->micro_batch, shard_seed(w->seed, shard)).first;
        return take_rows(columns, order->second.rows(w->plan.draw_of(index)));
      };
      size_t grad_total = 0;
      for (auto n : g.grad_sizes) grad_total += static_cast<size_t>(n);
      double loss_sum = 0;
      // The gradients summed over `count` micro-batches, in the accumulators; with `sum`, also
      // brought to the host.
      const auto gradients = [&](const uint64_t* first, size_t count, std::vector<float>* sum) -> expected<void> {
        for (size_t i = 0; i < count; ++i) {
          auto in = micro_batch_inputs(first[i]);
          if (!in) return tl::unexpected(in.error());
          auto out = ex.run(i == 0 ? d.acc_first : d.acc_more, *in);
          if (!out) return tl::unexpected(out.error());
          loss_sum += out->at("loss").at(0);
        }
        if (!sum) return {};
        *sum = bucket_buffer(spare_of(d, 0), grad_total);
        if (count == 0) {
          std::fill(sum->begin(), sum->end(), 0.0f);
          return {};
        }
        return ex.read_parameters(d.acc_names, bytes_of(*sum));
      };
      if (w->method == train_method::data_parallel && buckets > 1) {
        // All micro-batches but the last as a whole; the last one's first segment, whose bucket
        // (the last layers' gradients) this task returns. The next tasks run the other segments.
        d.unwritten.reset();  // every accumulator is computed again
        if (auto ok = gradients(micro.data(), micro.empty() ? 0 : micro.size() - 1, nullptr); !ok) return tl::unexpected(ok.error());
        d.loss_sum = loss_sum;
        d.last_first = micro.size() <= 1;
        if (micro.empty()) {
          d.last_inputs.clear();
        } else {
          auto in = micro_batch_inputs(micro.back());
          if (!in) return tl::unexpected(in.error());
          d.last_inputs = std::move(*in);
        }
        r.note = import_regions(ex, to_import);
        gpu::pending_copy copy;
        auto b0 = run_bucket(ex, d.last_first ? d.seg_first[0] : d.seg_more[0], (d.last_first ? d.seg_first_inputs : d.seg_more_inputs)[0],
                             d.last_inputs, d.acc_names, g, 0, micro.empty(), d.loss_sum, direct ? std::vector<float>{} : spare_of(d, 0),
                             direct ? direct->at(0) : nullptr, overlap ? &copy : nullptr);
        if (!b0) return tl::unexpected(b0.error());
        r.buffer = std::move(*b0);
        if (copy.wait_for_it && !std::exchange(d.overlap_noted, true))
          r.note += std::string(r.note.empty() ? "" : "; ") + "the device reads the buckets back and writes their sums beside its kernels (its copy queue)";
        r.copied = copy_end(std::move(copy), train_detail::bucket_line(step, 0, "done"));
        return r;
      }
      if (w->method == train_method::data_parallel) {
        if (auto ok = gradients(micro.data(), micro.size(), alone ? nullptr : &r.buffer); !ok) return tl::unexpected(ok.error());
        d.grads_resident = alone && !micro.empty();
        mark(alone ? "gradients done (kept on the device)" : "gradients done (on the host)");
      } else {
        const size_t per = micro.size() / inner;
        // One local step: micro-batches [h * per, (h + 1) * per) of the round; their gradients
        // never leave the device.
        const auto inner_step = [&](uint64_t h) -> expected<void> {
          if (auto ok = gradients(micro.data() + h * per, per, nullptr); !ok) return ok;
          if (auto ok = ex.run(d.apply_resident, {{"scale", f32_scalar(1.0 / static_cast<double>(per))}}); !ok)
            return tl::unexpected(ok.error());
          return {};
        };
        if (tail) {
          // The round's last inner steps, while its delta travels (nothing for the round).
          for (uint64_t h = inner - trailing; h < inner && per > 0; ++h)
            if (auto ok = inner_step(h); !ok) return tl::unexpected(ok.error());
          mark("trailing inner steps done");
          return r;
        }
        // DiLoCo: a redone step starts again from the local state it started from the first time.
        if (d.snapshot_step == step) {
          if (auto ok = ex.set_parameters(d.snapshot); !ok) return tl::unexpected(ok.error());
        } else {
          auto snap = ex.get_parameters(w->local_names);
          if (!snap) return tl::unexpected(snap.error());
          d.snapshot = std::move(*snap);
          d.snapshot_step = step;
        }
        // The inner steps before the delta is taken: all of them without overlap.
        for (uint64_t h = 0; h < inner - trailing && per > 0; ++h)
          if (auto ok = inner_step(h); !ok) return tl::unexpected(ok.error());
        auto deltas = ex.run(d.delta, {});
        if (!deltas) return tl::unexpected(deltas.error());
        // The deltas of the fragment this step synchronises (all of them with one fragment).
        const size_t f = fragment, from = f ? g.fragment_ends[f - 1] : 0, to = g.fragment_ends[f];
        const std::vector<std::string> names(g.deltas.begin() + static_cast<ptrdiff_t>(from), g.deltas.begin() + static_cast<ptrdiff_t>(to));
        size_t delta_total = 0;
        for (size_t i = from; i < to; ++i) delta_total += static_cast<size_t>(g.delta_sizes[i]);
        r.buffer.assign(delta_total, 0.0f);
        if (auto ok = accumulate(r.buffer, *deltas, names); !ok) return tl::unexpected(ok.error());
      }
      r.buffer.push_back(static_cast<float>(loss_sum));
      return r;
    };
  };
  t.work = make_work(std::move(commit), false);
  ready_.push_back(std::move(t));
  if (trailing > 0 && compute) {
    train_task rest;
    rest.coordinator = from;
    rest.train = s.train;
    rest.step = s.step;
    rest.attempt = s.attempt;
    rest.trailing = true;
    rest.work = make_work(std::nullopt, true);
    ready_.push_back(std::move(rest));
  }
  for (int b = 1; b < buckets; ++b) {
    // Not a copy of the first task: its work holds the commit's gradient sum (the whole model's).
    train_task next;
    next.coordinator = from;
    next.train = s.train;
    next.step = s.step;
    next.attempt = s.attempt;
    next.bucket = b;
    const bool empty = micro.empty();
    // The last bucket is read before its task returns: no segment is left to run beside it.
    const bool overlap = copy_overlap_ && b + 1 < buckets;
    next.work = [w, b, buckets, empty, direct, overlap, step](gpu::executor& ex) -> expected<train_work_result> {
      auto& d = *w->dev;
      train_work_result r;
      const auto program = (d.last_first ? d.seg_first : d.seg_more)[static_cast<size_t>(b)];
      const auto& reads = (d.last_first ? d.seg_first_inputs : d.seg_more_inputs)[static_cast<size_t>(b)];
      gpu::pending_copy copy;
      auto got = run_bucket(ex, program, reads, d.last_inputs, d.acc_names, w->graphs, b, empty, d.loss_sum,
                            direct ? std::vector<float>{} : spare_of(d, static_cast<size_t>(b)), direct ? direct->at(b) : nullptr,
                            overlap ? &copy : nullptr);
      if (!got) return tl::unexpected(got.error());
      r.buffer = std::move(*got);
      if (b + 1 == buckets) {
        if (direct) direct->at(b)[direct->values[static_cast<size_t>(b)] - 1] = static_cast<float>(d.loss_sum);
        else r.buffer.push_back(static_cast<float>(d.loss_sum));
      }
      r.copied = copy_end(std::move(copy), train_detail::bucket_line(step, b, "done"));
      return r;
    };
    ready_.push_back(std::move(next));
  }
  if (!compute) return {};
  // The round exists from now on and takes the predecessor's pieces; the coordinator lets the
  // members send them once every one of them has said so (ring_go).
  w->region_used = 0;  // the pieces of earlier steps were read (train_engine_state.hpp)
  w->bucket_loss.reset();
  if (!w->direct) {
    w->round = std::make_unique<bucketed_allreduce>(round_id(s.step, s.attempt) * bucketed_allreduce::max_buckets, w->rank,
                                                    static_cast<int>(w->ring.size()), buckets, ring_pieces, w->format);
    if (shared_.create) w->round->set_placer(region_placer(*w));
    if (parallel_) w->round->set_parallel(parallel_);
  }
  std::vector<outbound> out = offer_region(*w);
  out.push_back({from, msg::train_ready{s.train, s.step, s.attempt, false, 0, host_local(*w)}});
  return out;
}

void train_engine::write_bucket(worker_run& w, int bucket) {
  auto it = worker_.find(worker_key{w.coordinator, w.train});
  if (it == worker_.end() || it->second.get() != &w) return;
  std::vector<float> sum;
  // host_reduce: the sum lies in the members' regions, a share in each, and goes to the device
  // from there (the regions stay mapped while the task holds them; no member writes them again
  // before this node's next step has posted the bucket, after this task).
  std::vector<std::span<const uint8_t>> pieces;
  std::vector<std::shared_ptr<shared_region>> mapped;
  const int buckets = w.direct ? w.direct->buckets() : w.round->buckets();
  if (w.direct) {
    auto shares = w.direct->sum_pieces(bucket);
    if (bucket + 1 == buckets) {  // it ends with the loss sum
      w.bucket_loss = w.direct->last_value(bucket);
      shares.back() = shares.back().first(shares.back().size() - 1);
    }
    for (auto sh : shares) pieces.emplace_back(reinterpret_cast<const uint8_t*>(sh.data()), sh.size_bytes());
    mapped = w.direct_regions;
  } else {
    sum = w.round->take_result(bucket);
    if (bucket + 1 == buckets && !sum.empty()) {  // it ends with the loss sum
      w.bucket_loss = sum.back();
      sum.pop_back();
    }
  }
  // Written before the next step's commit, which the executor runs after this task (it takes
  // a node's tasks in order). A step redone after this recomputes every accumulator first.
  train_task t;
  t.coordinator = w.coordinator;
  t.train = w.train;
  t.step = w.step;
  t.attempt = w.attempt;
  t.bucket = bucket;
  t.bucket_write = true;
  t.work = [w = it->second, step = w.step, bucket, buckets, sum = std::move(sum), pieces = std::move(pieces), mapped = std::move(mapped),
            import = host_import_, overlap = copy_overlap_](gpu::executor& ex) mutable -> expected<train_work_result> {
    auto& d = *w->dev;
    train_work_result r;
    if (import) r.note = import_regions(ex, mapped);  // a region mapped since the step began
    const auto names = bucket_names(d.acc_names, w->graphs.bucket_ends, static_cast<size_t>(bucket), static_cast<size_t>(buckets));
    // From the regions, beside the segments still to run (a later run that reads these
    // accumulators, the optimizer, waits for the copy: executor::write_parameters_from_async).
    gpu::pending_copy copy;
    expected<void> ok;
    if (pieces.empty()) {
      ok = ex.write_parameters(names, bytes_of(sum));
    } else if (overlap) {
      auto started = ex.write_parameters_from_async(names, pieces);
      if (started) copy = std::move(*started);
      else ok = tl::unexpected(started.error());
    } else {
      ok = ex.write_parameters_from(names, pieces);
    }
    if (!ok) {
      d.unwritten = ok.error();
      return tl::unexpected(ok.error());
    }
    if (d.spare.size() < static_cast<size_t>(buckets)) d.spare.resize(static_cast<size_t>(buckets));
    if (pieces.empty()) d.spare[static_cast<size_t>(bucket)] = std::move(sum);
    // The regions stay mapped until the copy is done: the result holds them that long.
    r.copied = copy_end(std::move(copy), train_detail::bucket_line(step, bucket, "sum written"), mapped);
    return r;
  };
  ready_.push_back(std::move(t));
}

std::vector<train_task> train_engine::take_ready() {
  std::vector<train_task> out = std::move(ready_);
  ready_.clear();
  return out;
}

std::vector<outbound> train_engine::on_executed(const train_task& t, expected<train_work_result> r, clock::time_point now) {
  if (train_detail::timing_enabled()) train_detail::timing("step " + std::to_string(t.step) + " worker: device work reported");
  now_ = now;
  if (t.cleanup) return {};
  if (t.takeover) return take_over(t, std::move(r));
  std::vector<outbound> out;
  const worker_key key{t.coordinator, t.train};
  if (r && !r->note.empty()) notices_.push_back(notice{false, "training " + std::to_string(t.train) + ": " + r->note});
  if (r && !r->state.empty()) {
    msg::train_state st{t.train, t.step, {}};
    for (auto& [name, value] : r->state) st.state.push_back({name, std::move(value)});
    out.push_back({t.coordinator, std::move(st)});
  }
  auto it = worker_.find(key);
  if (it == worker_.end()) return out;
  auto w = it->second;
  if (t.trailing) {
    // The round's last inner steps (DiLoCo with overlap): nothing for the round, which may have
    // ended already; a failure leaves the local state unknown, so the run's next step fails.
    if (!r) w->broken = true;
    return out;
  }
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
  if (t.bucket_write) return out;  // a reduced bucket went into the accumulators: nothing for the round
  if (w->direct && !w->ring.empty()) {
    // host_reduce: the bucket is in this node's region; announced once the go came.
    if (t.bucket < w->direct->buckets()) w->posted.push_back(t.bucket);
    auto more = start_direct(*w);
    out.insert(out.end(), more.begin(), more.end());
    return out;
  }
  if (w->ring.empty() || !w->round || t.bucket >= w->round->buckets() || w->round->started(t.bucket)) return out;
  w->contribution[t.bucket] = std::move(r->buffer);
  auto more = start_round(*w);
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

}  // namespace mesh
