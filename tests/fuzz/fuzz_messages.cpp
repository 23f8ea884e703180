// libFuzzer target for node messages: decode_message never crashes and bounds memory by the input;
// whatever decodes is then handed to a job engine and a training engine as if a peer sent it, and
// a generate request or a stage message to the checks a node runs before it touches a model
// (the checks of graphs, training specs, all-reduce pieces and host all-reduce marks run on
// hostile values). The training engine first gets a valid setup from that peer, so that steps
// (with their dataset shards), pieces (also in shared regions) and resumes reach a live run. The chunks of a checkpoint file fetched between
// nodes (blob_get, blob_chunk) go to their checks and to a fetch's assembly.
#include <cstdint>
#include <vector>

#include "actors/blob_chunks.hpp"
#include "actors/generate_request_check.hpp"
#include "actors/host_reduce.hpp"
#include "actors/stage_request_check.hpp"
#include "actors/job_engine.hpp"
#include "wire/messages.hpp"
#include "actors/train_engine.hpp"
#include "graph/builder.hpp"
#include "wire/wire_graph.hpp"

namespace {
/// The fuzzer's two nodes: the peer that sends, and this node.
mesh::node_id named(const char* name) {
  mesh::node_id id;
  for (size_t i = 0; name[i] && i < id.key.size(); ++i) id.key[i] = static_cast<uint8_t>(name[i]);
  return id;
}
const mesh::node_id peer = named("peer-aaaa"), self = named("self-bbbb");

/// A tiny, valid training setup (run 1 coordinated by peer-aaaa): y = x * w, loss its sum; SGD.
mesh::msg::train_setup tiny_setup() {
  mesh::builder g;
  auto x = g.input("x", mesh::dtype::f32, {2, 1});
  auto w = g.parameter("w", mesh::dtype::f32, {1, 1});
  g.output("loss", sum_all(x * w));
  g.output("grad.w", sum(x, {0}, true));
  mesh::builder a;
  auto gw = a.input("grad.w", mesh::dtype::f32, {1, 1});
  auto scale = a.input("scale", mesh::dtype::f32, {});
  auto aw = a.parameter("w", mesh::dtype::f32, {1, 1});
  a.update(aw, aw - gw * scale);
  mesh::msg::train_spec spec;
  spec.steps = 10;
  spec.micro_batches = 2;
  spec.micro_batch = 2;
  spec.dataset_rows = 8;
  spec.grad = mesh::graph_payload(mesh::wire_graph{*g.finish(), {}});
  spec.apply = mesh::graph_payload(mesh::wire_graph{*a.finish(), {}});
  spec.state = {{"w", mesh::tensor::zeros(mesh::dtype::f32, {1, 1})}};
  spec.dataset = {{"x", mesh::tensor::zeros(mesh::dtype::f32, {0, 1})}};  // rows come as shards
  return {1, spec, named("client-c"), 1, {}};
}

/// Valid messages whose edits reach deep into the decoders and engines: a training step with a
/// dataset shard, a data-parallel job of a small graph (its strategy byte and graph are then
/// mutated), a generate request with every sampling option and stop strings, a stage step, a
/// checkpoint chunk, a takeover setup (its grant then reaches the signature check), and a stage
/// open offering a directory's files.
const std::vector<uint8_t>& seed_bytes(int which) {
  static const std::vector<uint8_t> step = [] {
    mesh::msg::train_step s{1, 2, 1, {peer, self}, {5, 7}, 0, false, false,
                            {{1, {{"x", mesh::tensor::zeros(mesh::dtype::f32, {4, 1})}}}}};
    return *mesh::msg::encode_message(s);
  }();
  static const std::vector<uint8_t> job = [] {
    mesh::builder b;
    auto x = b.input("x", mesh::dtype::f32, {4, 3});
    auto w = b.parameter("w", mesh::dtype::f32, {3, 2});
    b.output("y", relu(matmul(x, w) + 1.0));
    mesh::wire_graph wg{*b.finish(), {{"x", mesh::tensor::zeros(mesh::dtype::f32, {4, 3})}, {"w", mesh::tensor::zeros(mesh::dtype::f32, {3, 2})}}};
    mesh::msg::submit_job s{1, mesh::graph_payload(std::move(wg)), mesh::strategy::data_parallel};
    return *mesh::msg::encode_message(s);
  }();
  static const std::vector<uint8_t> generate = [] {
    mesh::msg::generate_request r{7, "/m/tiny.gguf", "Once upon", true, "", {0.8f, 40, 0.95f, 0.05f, 1.1f, 3}, {"\n", "END"}, 32, ""};
    return *mesh::msg::encode_message(r);
  }();
  static const std::vector<uint8_t> stage = [] {
    mesh::msg::stage_step s{3, 1, 0, 2, mesh::tensor::from_floats({2, 4}, std::vector<float>(8, 0.5f)), {{1, 5}, {0, 9}}};
    return *mesh::msg::encode_message(s);
  }();
  static const std::vector<uint8_t> chunk = [] {
    std::vector<uint8_t> bytes(64, 7);
    mesh::msg::blob_chunk c{5, true, mesh::error_code::internal, "", 0, mesh::blobs::hash_bytes(bytes), bytes};
    return *mesh::msg::encode_message(c);
  }();
  static const std::vector<uint8_t> takeover = [] {
    auto s = tiny_setup();
    s.train = 2;
    s.takeover = {3, peer, {}};
    return *mesh::msg::encode_message(s);
  }();
  static const std::vector<uint8_t> open = [] {
    mesh::msg::stage_open o{9, 2, "/models/hf", 0, 3, 64, 2, false,
                            {{"config.json", {1, 2, 3}, 700, {}, {}},
                             {"model.safetensors", {4, 5, 6}, 1 << 20, {7, 8}, {{0, 100}, {4096, 8192}}}}};
    return *mesh::msg::encode_message(o);
  }();
  return which == 0 ? step : which == 1 ? job : which == 2 ? generate : which == 3 ? stage : which == 4 ? chunk : which == 5 ? takeover : open;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  if (size > 0 && data[0] >= 0xf9) {  // edits of a valid message, to reach deep into the decoder
    bytes = seed_bytes(0xff - data[0]);
    for (size_t i = 1; i + 1 < size; i += 2) bytes[data[i] % bytes.size()] ^= data[i + 1];
  }
  // Graphs inside are validated here, against small limits, as a node's bridge does.
  mesh::graph_limits limits;
  limits.max_total_bytes = int64_t{16} << 20;
  limits.max_elements = int64_t{1} << 20;
  auto m = mesh::msg::decode_message(bytes.data(), bytes.size(), mesh::msg::default_decode_budget, &limits);
  if (!m) return 0;
  if (auto* r = std::get_if<mesh::msg::generate_request>(&*m)) {
    auto checked = mesh::generation::check_request(*r);
    // What passes is within the limits the node relies on.
    if (checked && (checked->max_tokens < 1 || r->model.empty() || r->prompt.empty() || !(checked->sampling.temperature >= 0)))
      __builtin_trap();
    if (checked) (void)mesh::generation::fit_context(static_cast<int64_t>(r->prompt.size()), checked->max_tokens, 64, r->model);
    return 0;
  }
  // A split model's stage messages: the checks a stage host runs before it touches a file or the
  // device; what passes is what local_stage::forward may be given.
  if (auto* o = std::get_if<mesh::msg::stage_open>(&*m)) {
    auto r = mesh::generation::check_open(*o);
    if (r && (r->size() < 1 || o->path.empty() || o->context == 0 || o->slots == 0)) __builtin_trap();
    // Offered files that pass are plain names a view directory can hold, their ranges within them.
    if (r)
      for (const auto& f : o->files) {
        if (f.name.find('/') != std::string::npos || f.name == ".." || (f.name.empty() && o->files.size() > 1)) __builtin_trap();
        for (const auto& range : f.ranges)
          if (range.length == 0 || range.offset + range.length > f.size || range.offset + range.length < range.offset) __builtin_trap();
      }
    return 0;
  }
  if (auto* st = std::get_if<mesh::msg::stage_step>(&*m)) {
    for (const bool tokens : {true, false}) {
      auto in = mesh::generation::check_step(*st, tokens, 4, 64, 4);
      if (in && (tokens ? in->tokens.empty() || !in->hidden.empty() : in->hidden.empty() || in->hidden.size() % 4 != 0))
        __builtin_trap();
      if (in && !in->rows.empty()) {  // a batch: one row per input row, each slot once and held
        const size_t n = tokens ? in->tokens.size() : in->hidden.size() / 4;
        if (in->rows.size() != n) __builtin_trap();
        unsigned seen = 0;
        for (const auto& r : in->rows) {
          if (r.slot < 0 || r.slot >= 4 || r.position < 0 || r.position >= 64 || (seen & (1u << r.slot))) __builtin_trap();
          seen |= 1u << r.slot;
        }
      }
    }
    return 0;
  }
  // A host all-reduce mark on a live round of rank 1 of 3 (two buckets, regions of its own): the
  // mark's values as the round takes them; every mark's order is checked, nothing read past a
  // region. What it accepts is a mark a member following the protocol could send.
  if (auto* h = std::get_if<mesh::msg::host_reduce_mark>(&*m)) {
    mesh::host_reduce r(1, 3, {9, 4});
    std::vector<std::vector<float>> regions(3, std::vector<float>(r.region_floats(), 1.0f));
    for (int k = 0; k < 3; ++k) r.set_region(k, regions[static_cast<size_t>(k)].data());
    r.set_own_region(regions[1].data());
    const int bucket = static_cast<int>(h->round % 4) - 1, from = static_cast<int>(h->pid % 5) - 1, phase = static_cast<int>(h->phase);
    if (h->fd & 1) (void)r.posted(0);
    auto e = r.on_mark(from, bucket, phase);
    if (e && (from < 0 || from > 2 || from == 1 || bucket < 0 || bucket > 1 || phase < 0 || phase > 1)) __builtin_trap();
    if (e && phase == 1) __builtin_trap();  // a summed mark before that rank's post
  }
  // A checkpoint file's chunks: what the serving node answers and what a fetch accepts.
  if (auto* g = std::get_if<mesh::msg::blob_get>(&*m)) {
    const uint64_t file_size = uint64_t{1} << 33;
    if (mesh::blobs::check_get(*g, file_size) &&
        (g->length == 0 || g->length > mesh::blobs::max_chunk_bytes || g->offset + g->length > file_size))
      __builtin_trap();
    return 0;
  }
  if (auto* c = std::get_if<mesh::msg::blob_chunk>(&*m)) {
    if (!mesh::blobs::check_chunk(*c) || !c->ok) return 0;
    if (c->bytes.empty() || c->bytes.size() > mesh::blobs::max_chunk_bytes) __builtin_trap();
    mesh::blobs::assembly a(c->digest, 64);
    // Accepted only at offset 0, within the 64 bytes, with its digest; then whole only when
    // the content hashes to the announced digest (here the chunk's own).
    if (a.accept(c->offset, c->bytes, c->digest)) {
      if (c->offset != 0 || c->bytes.size() > 64 || mesh::blobs::hash_bytes(c->bytes) != c->digest) __builtin_trap();
      if (a.complete() && !a.finish()) __builtin_trap();
    }
    return 0;
  }
  mesh::job_engine jobs(self, {"self-bbbb", 1e-6, 1e3, 1e3, int64_t{1} << 30});
  mesh::train_engine train(self);
  // Offers and pieces in shared memory name files by pid and descriptor: the real checks run on
  // hostile locators (shared_region::open maps nothing they do not pass).
  train.set_shared_memory(mesh::train_engine::host_shared_memory());
  train.peer_up(peer);
  static const mesh::msg::train_setup setup = tiny_setup();
  (void)train.on_message(peer, setup, {});
  if (train.running() != 1) __builtin_trap();  // the setup must be accepted, or nothing below is live
  jobs.peer_up(peer, {"peer-aaaa", 2e-6, 1e3, 1e3, int64_t{1} << 30});  // plans span two devices
  (void)jobs.on_message(peer, *m, {});
  (void)train.on_message(peer, *m, {});
  (void)jobs.take_ready();
  (void)train.take_ready();  // device work is not run: the fuzzer checks the decoders and engines
  return 0;
}
