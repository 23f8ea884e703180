// Gradient graphs of the composites, and training with Adam, on Vulkan and CPU against the
// reference evaluator.
#include "harness.hpp"

#include "graph/autodiff.hpp"
#include "graph/nn.hpp"
#include "graph/optim.hpp"

using namespace mesh;
using namespace mesh::gpu::test;

namespace {

/// Outputs the loss and d loss / d p for every parameter of the graph built so far.
void output_gradients(builder& b, const expr& loss) {
  std::vector<expr> params;
  const graph& g = b.peek();
  for (node_index id = 0; id < g.size(); ++id)
    if (g[id].op == op_kind::parameter) params.push_back(b.at(id));
  auto grads = gradients(loss, params);
  b.output("loss", loss);
  for (size_t i = 0; i < params.size(); ++i) b.output("d." + b.peek()[params[i].id()].attrs.name, grads[i]);
}

}  // namespace

TEST_CASE("training: gradients of mlp, softmax cross-entropy and layer norm match the reference") {
  builder b;
  auto x = b.input("x", dtype::f32, {5, 6});
  auto labels = b.input("labels", dtype::i32, {5});
  auto net = nn::make_mlp(b, "g1.mlp", {6, 7, 3});
  auto gamma = b.parameter("g1.ln.gamma", dtype::f32, {6});
  auto beta = b.parameter("g1.ln.beta", dtype::f32, {6});
  output_gradients(b, nn::cross_entropy(net(nn::layer_norm(x, gamma, beta)), labels));
  const graph g = finish(b);
  check(g, {{"x", random_tensor(dtype::f32, {5, 6}, 1)}, {"labels", tensor::from_ints({5}, {0, 2, 1, 1, 0})}},
        nn::init_parameters(g, 7), 1e-4);
}

TEST_CASE("training: gradients of attention and a transformer block match the reference") {
  builder b;
  auto x = b.input("x", dtype::f32, {2, 3, 8});
  auto block = nn::make_transformer_block(b, "g2.blk", 8, 2);
  auto y = block(x);
  output_gradients(b, nn::mse(y, x.owner()->fill(0.25, dtype::f32, {2, 3, 8})));
  const graph g = finish(b);
  check(g, {{"x", random_tensor(dtype::f32, {2, 3, 8}, 2)}}, nn::init_parameters(g, 8), 1e-4);
}

TEST_CASE("training: an MLP trained with Adam follows the reference loss curve") {
  builder b;
  auto x = b.input("x", dtype::f32, {16, 4});
  auto target = b.input("y", dtype::f32, {16, 2});
  auto net = nn::make_mlp(b, "t.mlp", {4, 16, 2});
  auto loss = nn::mse(net(x), target);
  std::vector<expr> params;
  for (const auto& l : net.layers) {
    params.push_back(l.w);
    params.push_back(l.b);
  }
  optim::adam(b, params, gradients(loss, params), {.lr = 0.02});
  b.output("loss", loss);
  const graph g = finish(b);
  const tensor_map inputs{{"x", random_tensor(dtype::f32, {16, 4}, 3)}, {"y", random_tensor(dtype::f32, {16, 2}, 4)}};
  const tensor_map init = nn::init_parameters(g, 9);
  for (auto* ex : {&vulkan(), &cpu()}) {
    INFO(ex->info().name);
    tensor_map ref_params = init;
    REQUIRE(ex->set_parameters(init));
    auto id = ex->load(g);
    REQUIRE(id);
    double first = 0, last = 0;
    for (int step = 0; step < 30; ++step) {
      auto out = ex->run(*id, inputs);
      REQUIRE(out);
      auto ref = evaluate(g, inputs, ref_params);
      REQUIRE(ref);
      ref_params = std::move(ref->params);
      const double got = out->at("loss").at(0), want = ref->outputs.at("loss").at(0);
      INFO("step " << step);
      CHECK(std::abs(got - want) <= 1e-3 * std::max(1.0, std::abs(want)));
      if (step == 0) first = want;
      last = want;
    }
    CHECK(last < first * 0.8);  // it did learn
  }
}
