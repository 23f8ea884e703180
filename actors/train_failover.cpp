// Coordinator failover: a client whose coordinator died sends train_resume to a surviving
// member; that node reads the state it reached (on_resume, on the device) and opens the rest of
// the run as a run it coordinates (take_over). train_engine.hpp says why the result equals an
// uninterrupted run.
#include "actors/train_engine.hpp"

#include "actors/train_engine_state.hpp"
#include "gpu/executor.hpp"

namespace mesh {
using namespace train_detail;

std::vector<outbound> train_engine::on_resume(const node_id& client, const msg::train_resume& r) {
  // The client's word that the coordinator is gone is enough for its own run, even before this
  // node's health monitor says so: the run can no longer report to the client anyway.
  std::shared_ptr<worker_run> w;
  for (const auto& [key, run] : worker_)
    if (key.first == r.coordinator && run->client == client && run->client_train == r.train && !run->broken) w = run;
  if (!w) {
    msg::job_result no;
    no.job = r.train;
    no.code = error_code::not_found;
    no.error = "node " + self_.short_string() + " holds no state of training " + std::to_string(r.train) + " coordinated by " +
               r.coordinator.short_string() + " (it was not a member, its device was restarted, or the run ended)";
    return {{client, no}};
  }
  const auto refuse = [&](const std::string& why) {
    msg::job_result no;
    no.job = r.train;
    no.code = error_code::invalid_argument;
    no.error = why;
    return std::vector<outbound>{{client, no}};
  };
  if (w->text) {
    return refuse("training " + std::to_string(r.train) + " reads its data from " + w->text->path + " on node " + r.coordinator.short_string() +
                  ", which coordinated it and is gone: no other node offers that file. Start the run again from its last "
                  "checkpoint (--checkpoint-every) through a node that has the file");
  }
  if (r.dataset.empty()) return refuse("train_resume carries no dataset (the new coordinator hands out the shards)");
  // The grant travels on in this node's setups, where every worker checks it before it ends the
  // run's earlier generations: checked here too, so that a bad one fails the resume at once.
  if (auto ok = msg::check_takeover(r.takeover, client, r.train, self_); !ok) {
    note_refusal(client, "train_resume", "training " + std::to_string(r.train) + ": " + ok.error().message);
    return refuse("train_resume refused: " + ok.error().message);
  }
  if (r.takeover.generation <= w->generation)
    return refuse("train_resume refused: its takeover grant is of generation " + std::to_string(r.takeover.generation) + ", and node " +
                  self_.short_string() + " holds the run at generation " + std::to_string(w->generation) + " already");
  orphan(*w);
  w->resume_dataset = r.dataset;
  w->takeover = r.takeover;
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
  for (auto* g : {&spec.grad, &spec.apply, &spec.delta, &spec.outer}) *g = rename_parameters(*g, old_prefix, "");
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
  return open(w->client, msg::open_training{w->client_train, std::move(spec)}, w->takeover);
}

}  // namespace mesh
