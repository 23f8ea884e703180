// mesh-graph-tour: what the graph core does, end to end, in one process.
//
// Builds a small classifier with the graph DSL, differentiates it, adds an Adam step as graph
// updates, simplifies the result, ships it through the WireGraph encoding (as it will travel to a
// worker), and trains it on the CPU reference evaluator on a generated two-moons dataset.
// The mesh demo (mesh_demo.cpp) runs the same kind of work across meshnode processes.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include "graph/autodiff.hpp"
#include "graph/datasets.hpp"
#include "graph/hash.hpp"
#include "graph/nn.hpp"
#include "graph/optim.hpp"
#include "graph/simplify.hpp"
#include "graph/validate.hpp"
#include "wire/wire_graph.hpp"

using namespace mesh;

namespace {

int fail(const error& e) {
  std::fprintf(stderr, "mesh-graph-tour: %s\n", e.to_string().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 150;
  const int64_t n = 256;
  std::printf("meshnode graph core demo\n\n");

  // 1. The model, written like the math.
  builder b;
  auto x = b.input("x", dtype::f32, {n, 2});
  auto labels = b.input("labels", dtype::i32, {n});
  auto model = nn::make_mlp(b, "mlp", {2, 32, 32, 2});
  auto logits = model(x);
  auto loss = nn::cross_entropy(logits, labels);
  std::vector<expr> params;
  for (auto& l : model.layers) {
    params.push_back(l.w);
    params.push_back(l.b);
  }
  const size_t forward_nodes = b.peek().nodes.size();

  // 2. Reverse-mode gradients and an Adam step, all inside the same graph.
  auto grads = gradients(loss, params);
  optim::adam(b, params, grads, {.lr = 0.02});
  b.output("loss", loss);
  b.output("logits", logits);
  auto built = b.finish();
  if (!built) return fail(built.error());
  std::printf("1. built an MLP 2-32-32-2 with cross-entropy: %zu forward nodes\n", forward_nodes);
  std::printf("2. autodiff + Adam as graph updates: %zu nodes, %zu parameter updates\n", built->nodes.size(),
              built->updates.size());

  // 3. Simplify (constant folding, identities, CSE, dead code).
  simplify_stats st;
  graph step = simplify(*built, &st);
  if (auto ok = validate(step); !ok) return fail(ok.error());
  std::printf("3. simplified to %zu nodes (folded %d, rewritten %d, merged %d, removed %d); hash %016llx\n",
              step.nodes.size(), st.folded, st.rewritten, st.merged, st.removed,
              static_cast<unsigned long long>(structural_hash(step)));

  // 4. Ship it: encode as a WireGraph with its initial parameters, decode (= parse + validate).
  wire_graph w{step, nn::init_parameters(step, 42)};
  auto bytes = encode(w);
  if (!bytes) return fail(bytes.error());
  auto received = decode_wire_graph(bytes->data(), bytes->size());
  if (!received) return fail(received.error());
  std::printf("4. WireGraph v%u: %zu bytes with %zu parameter tensors; decoded and validated\n", wire_graph_version,
              bytes->size(), received->tensors.size());

  // 5. Train on the CPU reference evaluator.
  const auto [xs, ys] = datasets::two_moons(n, 7);
  tensor_map state = received->tensors;
  const tensor_map inputs{{"x", xs}, {"labels", ys}};
  std::printf("5. training on two-moons (%lld points) with the reference evaluator:\n", static_cast<long long>(n));
  const auto t0 = std::chrono::steady_clock::now();
  tensor_map out;
  for (int s = 0; s < steps; ++s) {
    auto r = evaluate(received->g, inputs, state);
    if (!r) return fail(r.error());
    out = std::move(r->outputs);
    state = std::move(r->params);
    if (s % 25 == 0 || s == steps - 1) std::printf("   step %4d  loss %.4f\n", s, out.at("loss").at(0));
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto lg = out.at("logits").to_doubles();
  int correct = 0;
  for (int64_t i = 0; i < n; ++i) correct += ((lg[2 * i + 1] > lg[2 * i]) ? 1 : 0) == ys.at(i);
  std::printf("   %d steps in %.2f s; training accuracy %.1f%%\n", steps, secs, 100.0 * correct / static_cast<double>(n));

  // 6. Errors are values: a shape mistake names the line that made it.
  builder bad;
  auto a = bad.input("a", dtype::f32, {4, 3});
  matmul(a, bad.parameter("w", dtype::f32, {4, 3}));
  std::printf("6. a shape error, reported as a value: %s\n", bad.finish().error().to_string().c_str());
  return correct * 10 >= n * 9 ? 0 : 2;
}
