// mesh_example: the installed client API end to end. First y = relu(x W + b) run on a mesh and
// checked against the local reference evaluator; then an MLP trained on a generated dataset
// (two interleaved half-moons) across every worker of the mesh with mesh::trainer.
//
//   mesh_example [NODEID@HOST:PORT | mdns] [--state-dir DIR | --secret-file FILE]
// Without an address (or with "mdns") it looks for a node of the mesh on the LAN by mDNS. The
// mesh credential is the one the node on this machine keeps in its state directory (DIR, else
// $MESH_STATE_DIR, else ~/.local/state/meshnode), or the secret file the mesh was started with.
// Exit status: 0 when the mesh's result matches the reference and the MLP learned, 1 otherwise.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "client/client.hpp"
#include "client/trainer.hpp"
#include "graph/datasets.hpp"
#include "graph/nn.hpp"
#include "graph/builder.hpp"
#include "graph/evaluate.hpp"

namespace {

int fail(const std::string& what) {
  std::fprintf(stderr, "mesh_example: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string node;  // empty: find one by mDNS
  std::string state_dir;
  if (const char* env = std::getenv("MESH_STATE_DIR")) state_dir = env;
  else if (const char* home = std::getenv("HOME")) state_dir = std::string(home) + "/.local/state/meshnode";
  mesh::client_options options;
  bool secret_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--state-dir" && i + 1 < argc) {
      state_dir = argv[++i];
    } else if (arg == "--secret-file" && i + 1 < argc) {
      secret_given = true;
      // The raw 32 bytes (meshnode also accepts 64 hex digits; this example keeps it simple).
      std::ifstream f(argv[++i], std::ios::binary);
      options.mesh_secret.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    } else {
      node = arg;
    }
  }

  // The model: one dense layer. Inputs change per call; parameters are the model's state.
  mesh::builder b;
  auto x = b.input("x", mesh::dtype::f32, {4, 3});
  auto w = b.parameter("W", mesh::dtype::f32, {3, 2});
  auto bias = b.parameter("b", mesh::dtype::f32, {2});
  b.output("y", relu(matmul(x, w) + bias));
  auto g = b.finish();
  if (!g) return fail(g.error().message);

  const mesh::tensor_map inputs{
      {"x", mesh::tensor::from_floats({4, 3}, {1, 2, 3, -1, 0, 1, 0.5f, -2, 4, 3, 3, -3})}};
  const mesh::tensor_map params{{"W", mesh::tensor::from_floats({3, 2}, {0.5f, -1, 0.25f, 2, -0.75f, 0.1f})},
                                {"b", mesh::tensor::from_floats({2}, {0.1f, -0.2f})}};

  if (!secret_given && !state_dir.empty()) {
    auto local = mesh::options_for_local_node(state_dir);
    if (!local) return fail(local.error().message);
    options = std::move(*local);
  }
  auto c = mesh::client::connect(node, options);
  if (!c) return fail(c.error().message);
  std::printf("connected to node %s\n", (*c)->node().short_string().c_str());
  auto out = (*c)->run(*g, inputs, params, std::chrono::seconds(60));
  if (!out) return fail("the job failed: " + out.error().message);

  auto reference = mesh::evaluate(*g, inputs, params);
  if (!reference) return fail("reference: " + reference.error().message);
  const auto got = out->outputs.at("y").to_doubles();
  const auto want = reference->outputs.at("y").to_doubles();
  if (got.size() != want.size()) return fail("the mesh returned a tensor of another size");
  double worst = 0;
  std::printf("y =");
  for (size_t i = 0; i < got.size(); ++i) {
    std::printf(" %.4f", got[i]);
    worst = std::max(worst, std::abs(got[i] - want[i]));
  }
  std::printf("\nmax |mesh - reference| = %.3g over %zu values\n", worst, got.size());
  if (worst > 1e-5) return fail("the mesh's result differs from the reference evaluator");

  // An MLP classifier trained data-parallel over the mesh.
  mesh::builder m;
  auto points = m.input("x", mesh::dtype::f32, {16, 2});
  auto labels = m.input("labels", mesh::dtype::i32, {16});
  auto net = mesh::nn::make_mlp(m, "mlp", {2, 32, 2});
  m.output("loss", mesh::nn::cross_entropy(net(points), labels));
  auto model = m.finish();
  if (!model) return fail(model.error().message);
  auto [xs, ys] = mesh::datasets::two_moons(320, 1);
  const mesh::tensor_map data{{"x", xs}, {"labels", ys}};
  const auto start = mesh::nn::init_parameters(*model, 1);
  mesh::train_options o;
  o.steps = 60;
  o.micro_batches = 4;
  o.optimizer = mesh::optim::adam_options{.lr = 0.02};
  auto trained = mesh::trainer(**c, *model, start, data, o).fit();
  if (!trained) return fail("training failed: " + trained.error().message);
  auto before = mesh::evaluate_loss(**c, *model, start, data);
  auto after = mesh::evaluate_loss(**c, *model, mesh::parameters_only(trained->state), data);
  if (!before || !after) return fail("evaluation failed");
  std::printf("MLP on two-moons: loss %.3f -> %.3f after %llu steps on %zu worker(s)\n", *before, *after,
              static_cast<unsigned long long>(trained->step), trained->workers.size());
  if (!(*after < 0.7 * *before)) return fail("the MLP did not learn");
  std::printf("ok\n");
  return 0;
}
