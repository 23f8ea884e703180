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

namespace {

/// Mixed-precision training as client/trainer.cpp builds it: `grad`, a two-layer network whose
/// products run in `low` (f16 or bf16) over f32 parameters, its loss multiplied by the state's
/// loss scale before the backward pass; `apply`, the Adam step on those gradients, unscaled and
/// gated by optim::unscale_gradients.
struct mixed_step {
  graph grad, apply;
};

mixed_step mixed_precision_step(dtype low) {
  mixed_step out;
  const shape d1 = {12, 8}, d2 = {12, 4};
  {
    builder b;
    auto x = b.input("x", dtype::f32, {16, 8});
    auto target = b.input("y", dtype::f32, {16, 4});
    auto w1 = b.parameter("mp.w1", dtype::f32, d1);
    auto w2 = b.parameter("mp.w2", dtype::f32, d2);
    const auto lo = [&](const expr& e) { return cast(e, low); };
    auto h = relu(cast(linear(lo(x), lo(w1)), dtype::f32));
    auto loss = nn::mse(cast(matmul(lo(h), lo(w2)), dtype::f32), target);
    auto grads = gradients(loss * b.parameter(optim::loss_scale_name, dtype::f32, {}), {w1, w2});
    b.output("loss", loss);
    b.output("grad.mp.w1", grads[0]);
    b.output("grad.mp.w2", grads[1]);
    out.grad = finish(b);
  }
  builder b;
  std::vector<expr> params = {b.parameter("mp.w1", dtype::f32, d1), b.parameter("mp.w2", dtype::f32, d2)};
  std::vector<expr> grads = {b.input("grad.mp.w1", dtype::f32, d1), b.input("grad.mp.w2", dtype::f32, d2)};
  const expr take = optim::unscale_gradients(b, grads, {.initial = 1, .growth_interval = 3});
  optim::adam(b, params, grads, {.lr = 0.02}, take);
  out.apply = finish(b);
  return out;
}

}  // namespace

TEST_CASE("training: mixed-precision products and the loss-scaled Adam step run on Vulkan as on the CPU") {
  const tensor_map inputs{{"x", random_tensor(dtype::f32, {16, 8}, 5)}, {"y", random_tensor(dtype::f32, {16, 4}, 6)}};
  for (dtype low : {dtype::f16, dtype::bf16}) {
    const mixed_step step = mixed_precision_step(low);
    // f16: a scale that overflows the gradients (f16's range ends at 65,504), and one that does
    // not: the first step is skipped on every back end, the second taken. bf16 has f32's range.
    for (const double scale : low == dtype::f16 ? std::vector<double>{0x1p40, 512.0} : std::vector<double>{512.0}) {
      INFO(to_string(low) << " products, loss scale " << scale);
      tensor_map init = nn::init_parameters(step.grad, 11);
      init[optim::loss_scale_name] = tensor::from_floats({}, {static_cast<float>(scale)});
      for (const auto& n : step.apply.nodes)
        if (n.op == op_kind::parameter && !init.count(n.attrs.name)) init[n.attrs.name] = tensor::zeros(n.type, n.dims);
      const bool overflows = scale > 1e6;
      const reference ref_grad = reference_run(step.grad, inputs, init);
      tensor_map grads = ref_grad.outputs;
      grads.erase("loss");
      const reference ref_apply = reference_run(step.apply, grads, init);
      for (auto* ex : {&vulkan(), &cpu()}) {
        INFO(ex->info().name);
        // The gradients (scaled: inf where they overflowed), then the step on the reference's.
        const tensor_map out = run_on(*ex, step.grad, inputs, init);
        for (const auto& [name, want] : grads) {
          INFO(name);
          double worst = 0, largest = 0;
          const auto a = out.at(name).to_doubles(), w = want.to_doubles();
          for (size_t i = 0; i < a.size(); ++i) {
            if (overflows) continue;
            worst = std::max(worst, std::abs(a[i] - w[i]));
            largest = std::max(largest, std::abs(w[i]));
          }
          CHECK(worst <= tolerance_for(low) * std::max(largest, 1e-30));
          bool finite = true;
          for (double v : a) finite = finite && std::isfinite(v);
          CHECK(finite == !overflows);
        }
        check_on(*ex, step.apply, grads, init, ref_apply);
        auto state = ex->get_parameters({"mp.w1", "opt.adam.t", optim::loss_scale_name, optim::loss_scale_good_name});
        REQUIRE(state);
        CHECK(state->at("opt.adam.t").at(0) == (overflows ? 0 : 1));
        CHECK(state->at(optim::loss_scale_name).at(0) == (overflows ? scale / 2 : scale));
        CHECK(state->at(optim::loss_scale_good_name).at(0) == (overflows ? 0 : 1));
        CHECK((state->at("mp.w1").bytes == init.at("mp.w1").bytes) == overflows);
      }
    }
  }
}
