// The CPU back end: node-by-node typed loops (float for f32/f16/bf16 with rounding after each op,
// int32 for i32), split across a persistent thread pool for large tensors. Used where no Vulkan
// device exists. matmul and linear go to the blocked GEMM and the linear kernels (cpu_gemm.hpp,
// cpu_linear.hpp: AVX2+FMA where the CPU has it; q8_0, q4_0, q4_k and q6_k products on x rounded
// to 8 bits, a decode step's in integers, unless cpu_options or MESH_CPU_LINEAR=f32 say f32);
// quantized leaves stay as their blocks, which linear decodes by the row; kv_write takes over its
// cache's working copy and writes back only the slice.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <thread>

#include "graph/attention_rows.hpp"
#include "graph/quant.hpp"
#include "graph/validate.hpp"
#include "gpu/cpu_gemm.hpp"
#include "gpu/cpu_linear.hpp"
#include "gpu/cpu_thread_pool.hpp"
#include "gpu/executor.hpp"
#include "gpu/resident_parameters.hpp"

namespace mesh::gpu {
namespace {

struct value {
  std::vector<float> f;    // float dtypes
  std::vector<int32_t> i;  // i32
  const tensor* raw = nullptr;  // a quantized or half-precision leaf where it is (read by linear, cast, gather)
};

/// max and min as the reference evaluator defines them: a NaN operand gives NaN (std::max would
/// return whichever operand the comparison happens to keep). Shared by the f32 fast path and the
/// generic double path.
template <class T>
T nan_max(T x, T y) {
  return x != x || y != y ? static_cast<T>(NAN) : (x > y ? x : y);
}
template <class T>
T nan_min(T x, T y) {
  return x != x || y != y ? static_cast<T>(NAN) : (x < y ? x : y);
}

class cpu_executor final : public executor {
 public:
  explicit cpu_executor(const cpu_options& o)
      : threads_(o.threads ? o.threads : std::max(1u, std::thread::hardware_concurrency())),
        pool_(std::make_unique<thread_pool>(threads_)),
        linear_x_(o.int8_linear < 0 ? default_linear_x() : (o.int8_linear ? linear_x::int8 : linear_x::f32)) {
    info_.name = "cpu (" + std::to_string(threads_) + " threads)";
    info_.kind = "cpu";
    info_.fp16 = info_.bf16_storage = true;
  }

  const device_info& info() const override { return info_; }
  kernel_stats stats() const override { return {}; }

  expected<program_id> load(const graph& g) override {
    if (auto ok = validate(g); !ok) return tl::unexpected(ok.error());
    for (const auto& n : g.nodes)
      if (n.op == op_kind::parameter) {
        auto it = params_.find(n.attrs.name);
        if (it == params_.end()) params_[n.attrs.name] = tensor::zeros(n.type, n.dims);
        else if (it->second.type != n.type || it->second.dims != n.dims)
          return make_error(error_code::shape_mismatch, "parameter \"" + n.attrs.name + "\" has another dtype or shape here");
      }
    programs_.push_back(g);
    row_casts_.push_back(row_casts(g));
    in_place_.push_back(in_place_leaves(g));
    values_.emplace_back();
    loaded_.push_back(true);
    return static_cast<program_id>(programs_.size() - 1);
  }

  expected<void> set_parameters(const tensor_map& params) override {
    for (const auto& [name, t] : params) {
      if (auto ok = t.check(); !ok) return ok;
      auto it = params_.find(name);
      if (it != params_.end() && (it->second.type != t.type || it->second.dims != t.dims))
        return make_error(error_code::shape_mismatch, "parameter \"" + name + "\" has another dtype or shape here");
    }
    for (const auto& [name, t] : params) params_[name] = t;
    return {};
  }

  expected<void> set_parameter_view(const std::string& name, const tensor_view& view) override {
    if (auto ok = view.check(); !ok) return make_error(ok.error().code, "parameter \"" + name + "\": " + ok.error().message);
    auto it = params_.find(name);
    if (it != params_.end() && (it->second.type != view.type || it->second.dims != view.dims))
      return make_error(error_code::shape_mismatch, "parameter \"" + name + "\" has another dtype or shape here");
    tensor& t = params_[name];  // this back end's device memory is host memory: one copy, here
    t.type = view.type;
    t.dims = view.dims;
    t.bytes.assign(view.bytes.begin(), view.bytes.end());
    return {};
  }

  expected<tensor_map> get_parameters(const std::vector<std::string>& names) override {
    tensor_map out;
    for (const auto& n : names) {
      auto it = params_.find(n);
      if (it == params_.end()) return make_error(error_code::not_found, "no parameter \"" + n + "\"");
      out[n] = it->second;
    }
    return out;
  }

  expected<void> read_parameters(const std::vector<std::string>& names, std::span<uint8_t> out) override {
    auto list = parameters_of(names, out.size(), "read_parameters");
    if (!list) return tl::unexpected(list.error());
    size_t at = 0;
    for (const tensor* t : *list) {
      if (!t->bytes.empty()) std::memcpy(out.data() + at, t->bytes.data(), t->bytes.size());
      at += t->bytes.size();
    }
    return {};
  }

  expected<void> write_parameters(const std::vector<std::string>& names, std::span<const uint8_t> bytes) override {
    auto list = parameters_of(names, bytes.size(), "write_parameters");
    if (!list) return tl::unexpected(list.error());
    size_t at = 0;
    for (tensor* t : *list) {
      if (!t->bytes.empty()) std::memcpy(t->bytes.data(), bytes.data() + at, t->bytes.size());
      at += t->bytes.size();
    }
    return {};
  }

  void unload(program_id id) override {
    if (id >= programs_.size() || !loaded_[id]) return;
    programs_[id] = graph{};
    row_casts_[id].clear();
    in_place_[id].clear();
    values_[id] = {};
    loaded_[id] = false;
  }

  size_t drop_parameters(const std::string& prefix) override {
    std::set<std::string> used;
    for (size_t i = 0; i < programs_.size(); ++i)
      if (loaded_[i]) add_parameter_names(programs_[i], used);
    return drop_unused(params_, prefix, used, [](const tensor&) {});
  }

  expected<tensor_map> run_repeated(program_id id, const tensor_map& inputs, int64_t times) override {
    if (auto ok = check_repeated_runs(times); !ok) return tl::unexpected(ok.error());
    for (int64_t i = 1; i < times; ++i)
      if (auto r = run(id, inputs); !r) return r;
    return run(id, inputs);
  }

  expected<tensor_map> run(program_id id, const tensor_map& inputs) override {
    if (id >= programs_.size() || !loaded_[id]) return make_error(error_code::not_found, "no program " + std::to_string(id));
    const graph& g = programs_[id];
    if (auto ok = check_bindings(g, inputs, false); !ok) return tl::unexpected(ok.error());
    // Node values from the last run: their buffers are reused (resized in place), so that a step
    // does not allocate, fault in and free its intermediate tensors every time.
    std::vector<value>& v = values_[id];
    v.resize(static_cast<size_t>(g.size()));
    for (node_index n = 0; n < g.size(); ++n) compute(g, n, v, inputs, row_casts_[id], in_place_[id]);
    tensor_map out;
    for (const auto& o : g.outputs) out[o.name] = to_tensor(g[o.id], v[o.id]);
    for (const auto& u : g.updates) {
      if (g[u.value].op == op_kind::kv_write) write_slice(g, u.value, v, params_[g[u.target].attrs.name]);
      else params_[g[u.target].attrs.name] = to_tensor(g[u.value], v[u.value]);
    }
    return out;
  }

 private:
  /// The parameters `names`, checked to hold `size` bytes together (read/write_parameters).
  expected<std::vector<tensor*>> parameters_of(const std::vector<std::string>& names, size_t size, const char* what) {
    std::vector<tensor*> out;
    size_t total = 0;
    for (const auto& n : names) {
      auto it = params_.find(n);
      if (it == params_.end()) return make_error(error_code::not_found, std::string(what) + ": no parameter \"" + n + "\"");
      out.push_back(&it->second);
      total += it->second.bytes.size();
    }
    if (total != size)
      return make_error(error_code::invalid_argument, std::string(what) + ": the parameters hold " + std::to_string(total) +
                                                          " bytes, the buffer " + std::to_string(size));
    return out;
  }

  template <class F>
  void parallel(int64_t n, F f) const {
    const int64_t chunk = 16384;
    if (threads_ <= 1 || n < 2 * chunk) {
      f(int64_t{0}, n);
      return;
    }
    const int64_t parts = std::min<int64_t>(threads_, (n + chunk - 1) / chunk);
    pool_->run(parts, [&](int64_t p) { f(n * p / parts, n * (p + 1) / parts); });
  }

  /// `t`'s values into `v` (its buffers reused).
  static void load_tensor(const tensor& t, value& v) {
    const int64_t n = t.size();
    if (t.type == dtype::i32) {
      v.i.resize(static_cast<size_t>(n));
      if (n) std::memcpy(v.i.data(), t.bytes.data(), static_cast<size_t>(n) * 4);
    } else if (t.type == dtype::f32) {
      v.f.resize(static_cast<size_t>(n));
      if (n) std::memcpy(v.f.data(), t.bytes.data(), static_cast<size_t>(n) * 4);
    } else {
      v.f.resize(static_cast<size_t>(n));
      for (int64_t k = 0; k < n; ++k) v.f[k] = static_cast<float>(t.at(k));
    }
  }

  static tensor to_tensor(const node& n, const value& v) {
    tensor t = tensor::zeros(n.type, n.dims);
    const auto count = static_cast<size_t>(t.size());
    if (n.type == dtype::i32) {
      if (count) std::memcpy(t.bytes.data(), v.i.data(), count * 4);
    } else if (n.type == dtype::f32) {
      if (count) std::memcpy(t.bytes.data(), v.f.data(), count * 4);
    } else {
      for (size_t k = 0; k < count; ++k) t.set(static_cast<int64_t>(k), v.f[k]);
    }
    return t;
  }

  static float round16(dtype t, float x) {
    if (t == dtype::f16) return half_to_float(float_to_half(x));
    if (t == dtype::bf16) return bf16_to_float(float_to_bf16(x));
    return x;
  }

  static int32_t to_i32(double x) { return static_cast<int32_t>(round_to(dtype::i32, x)); }

  /// `by_row`: the program's casts that gathers decode by the row (row_casts()); `in_place`: its
  /// half-precision parameters read where they are (in_place_leaves()).
  void compute(const graph& g, node_index id, std::vector<value>& v, const tensor_map& inputs, const std::vector<bool>& by_row,
               const std::vector<bool>& in_place) {
    const node& n = g[id];
    const int64_t count = element_count(n.dims);
    value& out = v[id];
    const bool is_int = n.type == dtype::i32;
    if (n.op == op_kind::input || n.op == op_kind::parameter) {
      const tensor& t = n.op == op_kind::input ? inputs.at(n.attrs.name) : params_.at(n.attrs.name);
      const bool half = t.type == dtype::f16 || t.type == dtype::bf16;
      if (is_quantized(t.type) || (half && in_place[static_cast<size_t>(id)])) out.raw = &t;  // decoded by its reader, a row at a time
      else load_tensor(t, out);
      return;
    }
    if (n.op == op_kind::linear) {
      linear(g, n, v, out);
      return;
    }
    if (n.op == op_kind::kv_write) {
      // The cache parameter has no other reader (validate()): its working copy becomes the
      // result, and only the slice is written.
      std::swap(out, v[n.inputs[0]]);  // the cache's value takes this node's old buffer for the next run
      for_each_slice_element(g, n, v, [&](int64_t dst, int64_t src) {
        if (is_int) out.i[static_cast<size_t>(dst)] = v[n.inputs[1]].i[static_cast<size_t>(src)];
        else out.f[static_cast<size_t>(dst)] = v[n.inputs[1]].f[static_cast<size_t>(src)];
      });
      return;
    }
    if (n.op == op_kind::cast && v[n.inputs[0]].raw && by_row[static_cast<size_t>(id)]) {  // only gathers read it: by the row
      out.raw = v[n.inputs[0]].raw;
      return;
    }
    if (n.op == op_kind::cast && v[n.inputs[0]].raw) {  // a quantized or half-precision operand: decoded whole
      out.f = dequantized(*v[n.inputs[0]].raw);
      for (auto& x : out.f) x = round16(n.type, x);
      return;
    }
    if (n.op == op_kind::constant) {
      const auto c = static_cast<size_t>(count);
      std::vector<double> vals = n.attrs.values.size() == 1 ? std::vector<double>(c, n.attrs.values[0]) : n.attrs.values;
      load_tensor(tensor::from_values(n.type, n.dims, vals), out);
      return;
    }
    if (is_int) out.i.resize(static_cast<size_t>(count));
    else out.f.resize(static_cast<size_t>(count));
    // Element k of input j as double (generic paths) and typed pointers (fast paths).
    auto in_at = [&](size_t j, int64_t k) -> double {
      const value& x = v[n.inputs[j]];
      // Both arms as double: `cond ? int32 : float` would be a float and round i32 values past 2^24.
      return g[n.inputs[j]].type == dtype::i32 ? static_cast<double>(x.i[static_cast<size_t>(k)])
                                               : static_cast<double>(x.f[static_cast<size_t>(k)]);
    };
    // i32 arithmetic wraps; other i32 results (casts, an empty max) saturate (ops.hpp).
    auto store = [&](int64_t k, double x) {
      if (is_int) out.i[static_cast<size_t>(k)] = wraps_i32(n.op) ? static_cast<int32_t>(wrap_i32_exact(x)) : to_i32(x);
      else out.f[static_cast<size_t>(k)] = round16(n.type, static_cast<float>(x));
    };
    switch (family_of(n.op)) {
      case op_family::unary: {
        const bool fin = g[n.inputs[0]].type != dtype::i32;
        if (fin && !is_int) {
          const float* a = v[n.inputs[0]].f.data();
          float* o = out.f.data();
          const dtype t = n.type;
          auto map = [&](auto f) {
            parallel(count, [&](int64_t b, int64_t e) {
              for (int64_t k = b; k < e; ++k) o[k] = f(a[k]);
              if (t != dtype::f32)
                for (int64_t k = b; k < e; ++k) o[k] = round16(t, o[k]);
            });
          };
          switch (n.op) {
            case op_kind::neg: map([](float x) { return -x; }); return;
            case op_kind::abs: map([](float x) { return std::abs(x); }); return;
            case op_kind::exp: map([](float x) { return std::exp(x); }); return;
            case op_kind::log: map([](float x) { return std::log(x); }); return;
            case op_kind::sqrt: map([](float x) { return std::sqrt(x); }); return;
            case op_kind::rsqrt: map([](float x) { return 1.0f / std::sqrt(x); }); return;
            case op_kind::tanh: map([](float x) { return std::tanh(x); }); return;
            case op_kind::sin: map([](float x) { return std::sin(x); }); return;
            case op_kind::cos: map([](float x) { return std::cos(x); }); return;
            case op_kind::relu: map([](float x) { return x > 0 ? x : 0.0f; }); return;
            case op_kind::sigmoid: map([](float x) { return 1.0f / (1.0f + std::exp(-x)); }); return;
            case op_kind::cast: map([](float x) { return x; }); return;
            default: break;
          }
        }
        parallel(count, [&](int64_t b, int64_t e) {
          for (int64_t k = b; k < e; ++k) {
            const double x = in_at(0, k);
            double r = x;
            switch (n.op) {
              case op_kind::neg: r = -x; break;
              case op_kind::abs: r = std::abs(x); break;
              case op_kind::exp: r = std::exp(x); break;
              case op_kind::log: r = std::log(x); break;
              case op_kind::sqrt: r = std::sqrt(x); break;
              case op_kind::rsqrt: r = 1.0 / std::sqrt(x); break;
              case op_kind::tanh: r = std::tanh(x); break;
              case op_kind::sin: r = std::sin(x); break;
              case op_kind::cos: r = std::cos(x); break;
              case op_kind::relu: r = x > 0 ? x : 0.0; break;
              case op_kind::sigmoid: r = 1.0 / (1.0 + std::exp(-x)); break;
              default: break;
            }
            store(k, r);
          }
        });
        return;
      }
      case op_family::binary: {
        const bool int_operands = g[n.inputs[0]].type == dtype::i32;
        if (!int_operands && !is_int && n.op != op_kind::pow) {
          const float* a = v[n.inputs[0]].f.data();
          const float* c = v[n.inputs[1]].f.data();
          float* o = out.f.data();
          const dtype t = n.type;
          auto map = [&](auto f) {
            parallel(count, [&](int64_t b, int64_t e) {
              for (int64_t k = b; k < e; ++k) o[k] = f(a[k], c[k]);
              if (t != dtype::f32)
                for (int64_t k = b; k < e; ++k) o[k] = round16(t, o[k]);
            });
          };
          switch (n.op) {
            case op_kind::add: map([](float x, float y) { return x + y; }); return;
            case op_kind::sub: map([](float x, float y) { return x - y; }); return;
            case op_kind::mul: map([](float x, float y) { return x * y; }); return;
            case op_kind::div: map([](float x, float y) { return x / y; }); return;
            case op_kind::max: map([](float x, float y) { return nan_max(x, y); }); return;
            case op_kind::min: map([](float x, float y) { return nan_min(x, y); }); return;
            default: break;
          }
        }
        parallel(count, [&](int64_t b, int64_t e) {
          for (int64_t k = b; k < e; ++k) {
            const double x = in_at(0, k), y = in_at(1, k);
            double r = 0;
            switch (n.op) {
              case op_kind::add: r = x + y; break;
              case op_kind::sub: r = x - y; break;
              case op_kind::mul:  // an i32 product can pass 2^53: exact in int64, then wrapped
                r = int_operands ? wrap_i32(static_cast<int64_t>(x) * static_cast<int64_t>(y)) : x * y;
                break;
              case op_kind::div: r = int_operands ? (y == 0 ? 0.0 : std::trunc(x / y)) : x / y; break;
              case op_kind::pow: r = std::pow(x, y); break;
              case op_kind::max: r = nan_max(x, y); break;
              case op_kind::min: r = nan_min(x, y); break;
              case op_kind::compare:
                switch (n.attrs.cmp) {
                  case compare_kind::eq: r = x == y; break;
                  case compare_kind::ne: r = x != y; break;
                  case compare_kind::lt: r = x < y; break;
                  case compare_kind::le: r = x <= y; break;
                  case compare_kind::gt: r = x > y; break;
                  case compare_kind::ge: r = x >= y; break;
                }
                break;
              default: break;
            }
            store(k, r);
          }
        });
        return;
      }
      case op_family::ternary:
        parallel(count, [&](int64_t b, int64_t e) {
          const int32_t* c = v[n.inputs[0]].i.data();
          for (int64_t k = b; k < e; ++k) {
            if (is_int) out.i[k] = v[n.inputs[c[k] != 0 ? 1 : 2]].i[k];
            else out.f[k] = v[n.inputs[c[k] != 0 ? 1 : 2]].f[k];
          }
        });
        return;
      case op_family::matmul: {
        const shape& ad = g[n.inputs[0]].dims;
        const size_t r = ad.size();
        const int64_t m = ad[r - 2], kd = ad[r - 1], nn = n.dims[r - 1];
        const int64_t rows = m * nn != 0 ? count / nn : 0;
        if (is_int) {
          parallel(rows, [&](int64_t b, int64_t e) {
            for (int64_t row = b; row < e; ++row) {
              const int64_t bt = row / m;
              for (int64_t j = 0; j < nn; ++j) {
                double acc = 0;
                for (int64_t p = 0; p < kd; ++p) acc += in_at(0, row * kd + p) * in_at(1, (bt * kd + p) * nn + j);
                out.i[row * nn + j] = to_i32(acc);
              }
            }
          });
          return;
        }
        // Batch bt of A ([m, kd]) times batch bt of B ([kd, nn]), in f32; f16/bf16 results rounded after.
        gemm_args mm;
        mm.m = m, mm.n = nn, mm.k = kd;
        mm.batch = m != 0 ? rows / m : 0;
        mm.a = v[n.inputs[0]].f.data(), mm.a_row = kd, mm.a_batch = m * kd;
        mm.b = v[n.inputs[1]].f.data(), mm.b_row = nn, mm.b_batch = kd * nn;
        mm.c = out.f.data(), mm.c_row = nn, mm.c_batch = m * nn;
        gemm_f32(mm, isa_, pool_.get());
        if (n.type != dtype::f32) round_all(n.type, out.f);
        return;
      }
      case op_family::reduce: {
        const shape& xd = g[n.inputs[0]].dims;
        const auto xs = strides_of(xd);
        shape kd, rd;
        std::vector<int64_t> ks, rs;
        for (size_t a = 0; a < xd.size(); ++a) {
          const bool red = std::count(n.attrs.axes.begin(), n.attrs.axes.end(), static_cast<int64_t>(a)) > 0;
          (red ? rd : kd).push_back(xd[a]);
          (red ? rs : ks).push_back(xs[a]);
        }
        const int64_t rcount = element_count(rd);
        const bool is_max = n.op == op_kind::reduce_max;
        auto offset = [](int64_t i, const shape& d, const std::vector<int64_t>& s) {
          int64_t off = 0;
          for (int k = static_cast<int>(d.size()) - 1; k >= 0; --k) {
            off += (i % d[k]) * s[k];
            i /= d[k];
          }
          return off;
        };
        std::vector<int64_t> roff(static_cast<size_t>(rcount));
        for (int64_t r = 0; r < rcount; ++r) roff[r] = offset(r, rd, rs);
        if (is_int && !is_max) {
          // i32 sums wrap modulo 2^32 (uint32 arithmetic), exactly as the kernels' int adds: a
          // double accumulator is exact only to 2^53, which 2^23 copies of INT_MAX pass.
          const int32_t* a = v[n.inputs[0]].i.data();
          parallel(count, [&](int64_t b, int64_t e) {
            for (int64_t o = b; o < e; ++o) {
              const int64_t base = offset(o, kd, ks);
              uint32_t acc = 0;
              for (int64_t r = 0; r < rcount; ++r) acc += static_cast<uint32_t>(a[base + roff[r]]);
              out.i[static_cast<size_t>(o)] = static_cast<int32_t>(acc);
            }
          });
          return;
        }
        parallel(count, [&](int64_t b, int64_t e) {
          for (int64_t o = b; o < e; ++o) {
            const int64_t base = offset(o, kd, ks);
            double acc = is_max ? -std::numeric_limits<double>::infinity() : 0.0;
            for (int64_t r = 0; r < rcount; ++r) {
              const double x = in_at(0, base + roff[r]);
              if (is_max) acc = std::isnan(x) || x > acc ? x : acc;
              else acc += x;
            }
            store(o, acc);
          }
        });
        return;
      }
      case op_family::movement: {
        if (n.op == op_kind::reshape) {
          out = v[n.inputs[0]];
          return;
        }
        // Source index of each output element.
        const auto os = strides_of(n.dims);
        const movement_index moved(n, g[n.inputs[0]].dims);  // broadcast, permute, slice
        auto source = [&](int64_t k, size_t& part) -> int64_t {
          part = 0;
          switch (n.op) {
            case op_kind::broadcast:
            case op_kind::permute:
            case op_kind::slice: return moved(k);
            case op_kind::concat: {
              const auto ax = static_cast<size_t>(n.attrs.axis);
              int64_t c = k / os[ax] % n.dims[ax];
              while (c >= g[n.inputs[part]].dims[ax]) c -= g[n.inputs[part++]].dims[ax];
              const shape& pd = g[n.inputs[part]].dims;
              const int64_t inner = os[ax];
              const int64_t outer = k / (os[ax] * n.dims[ax]);
              return (outer * pd[ax] + c) * inner + k % inner;
            }
            default: return 0;
          }
        };
        if (n.op != op_kind::concat) {
          // Along the last axis the source index is affine (slice: step 1 from its start; permute:
          // the permuted axis's stride; broadcast: 0 or 1), so it is computed twice per run of
          // that axis, not for every element (a decode step slices its whole KV cache).
          const int64_t len = n.dims.empty() ? 1 : n.dims.back();
          auto copy = [&](auto* dst, const auto* src) {
            parallel(count, [&](int64_t b, int64_t e) {
              for (int64_t k = b; k < e;) {
                const int64_t j = k % len, row = k - j, run = std::min(e - k, len - j);
                const int64_t base = moved(row), step = len > 1 ? moved(row + 1) - base : 0;
                if (step == 1) std::copy(src + base + j, src + base + j + run, dst + k);
                else
                  for (int64_t t = 0; t < run; ++t) dst[k + t] = src[base + (j + t) * step];
                k += run;
              }
            });
          };
          if (is_int) copy(out.i.data(), v[n.inputs[0]].i.data());
          else copy(out.f.data(), v[n.inputs[0]].f.data());
          return;
        }
        parallel(count, [&](int64_t b, int64_t e) {
          for (int64_t k = b; k < e; ++k) {
            size_t part = 0;
            const int64_t s = source(k, part);
            if (is_int) out.i[k] = v[n.inputs[part]].i[s];
            else out.f[k] = v[n.inputs[part]].f[s];
          }
        });
        return;
      }
      case op_family::gather: {
        if (n.op == op_kind::gather) {
          const shape& td = g[n.inputs[0]].dims;
          // Elements per table row from the trailing dims (not count / rows: a table of 0 rows still
          // has rows of that size, and every pick reads zeros).
          const int64_t rows = td[0], row = element_count(shape(td.begin() + 1, td.end()));
          const auto& idx = v[n.inputs[1]].i;
          if (const tensor* t = v[n.inputs[0]].raw) {  // a quantized table: only the picked rows decoded
            const dtype as = g[n.inputs[0]].type;
            const int64_t rb = *row_bytes(t->type, row);
            parallel(static_cast<int64_t>(idx.size()), [&](int64_t b, int64_t e) {
              for (int64_t p = b; p < e; ++p) {
                float* dst = out.f.data() + p * row;
                const int64_t r = idx[static_cast<size_t>(p)];
                if (r < 0 || r >= rows) {
                  std::fill(dst, dst + row, 0.0f);
                  continue;
                }
                (void)dequantize_row(t->type, {t->bytes.data() + r * rb, static_cast<size_t>(rb)}, {dst, static_cast<size_t>(row)});
                for (int64_t c = 0; c < row; ++c) dst[c] = round16(as, dst[c]);
              }
            });
            return;
          }
          parallel(count, [&](int64_t b, int64_t e) {
            for (int64_t k = b; k < e; ++k) {
              const int64_t r = idx[k / std::max<int64_t>(row, 1)];
              const bool ok = r >= 0 && r < rows;
              const int64_t s = r * row + k % std::max<int64_t>(row, 1);
              if (is_int) out.i[k] = ok ? v[n.inputs[0]].i[s] : 0;
              else out.f[k] = ok ? v[n.inputs[0]].f[s] : 0.0f;
            }
          });
        } else {
          const int64_t rows = n.dims[0], row = rows ? count / rows : 0;
          const auto& idx = v[n.inputs[0]].i;
          if (is_int) {  // wraps modulo 2^32, as the i32 reduce_sum above
            std::vector<uint32_t> acc(static_cast<size_t>(count), 0);
            const auto& src = v[n.inputs[1]].i;
            for (size_t p = 0; p < idx.size(); ++p) {
              if (idx[p] < 0 || idx[p] >= rows) continue;
              for (int64_t c = 0; c < row; ++c)
                acc[static_cast<size_t>(idx[p] * row + c)] += static_cast<uint32_t>(src[p * static_cast<size_t>(row) + static_cast<size_t>(c)]);
            }
            for (int64_t k = 0; k < count; ++k) out.i[static_cast<size_t>(k)] = static_cast<int32_t>(acc[static_cast<size_t>(k)]);
            return;
          }
          std::vector<double> acc(static_cast<size_t>(count), 0.0);
          for (size_t p = 0; p < idx.size(); ++p) {
            if (idx[p] < 0 || idx[p] >= rows) continue;
            for (int64_t c = 0; c < row; ++c) acc[idx[p] * row + c] += in_at(1, static_cast<int64_t>(p) * row + c);
          }
          for (int64_t k = 0; k < count; ++k) store(k, acc[k]);
        }
        return;
      }
      case op_family::attention: {
        // Heads split over the threads (a decode step has one query row: heads are its parallelism).
        std::vector<double> res(static_cast<size_t>(count));
        const attention_shape as = attention_shape_of(g[n.inputs[0]].dims, g[n.inputs[1]].dims, n.attrs.axis);
        const int64_t work = as.batch * as.l * as.h * as.t * as.d;
        const int64_t parts = work >= (1 << 14) ? std::min<int64_t>(threads_, as.h) : 1;
        pool_->run(parts, [&](int64_t p) {
          attention_rows(as, v[n.inputs[0]].f, v[n.inputs[1]].f, v[n.inputs[2]].f, v[n.inputs[3]].i, res, as.h * p / parts, as.h * (p + 1) / parts);
        });
        for (int64_t k = 0; k < count; ++k) store(k, res[static_cast<size_t>(k)]);
        return;
      }
      case op_family::leaf:
      case op_family::linear:    // above
      case op_family::kv_write: return;
    }
  }

  /// All of a quantized tensor's values, row by row.
  static std::vector<float> dequantized(const tensor& t) {
    const int64_t k = t.dims.back(), rows = k ? t.size() / k : 0, rb = *row_bytes(t.type, k);
    std::vector<float> out(static_cast<size_t>(t.size()));
    for (int64_t r = 0; r < rows; ++r)
      (void)dequantize_row(t.type, {t.bytes.data() + r * rb, static_cast<size_t>(rb)}, {out.data() + r * k, static_cast<size_t>(k)});
    return out;
  }

  /// Calls f(cache index, value index) for each element of kv_write `n`'s value that lands inside
  /// the cache (rows past either end, and a per-row position < 0, are dropped, as on the GPU).
  template <class F>
  static void for_each_slice_element(const graph& g, const node& n, const std::vector<value>& v, F f) {
    const shape& vd = g[n.inputs[1]].dims;
    const auto ax = static_cast<size_t>(n.attrs.axis);
    int64_t inner = 1;
    for (size_t a = ax + 1; a < vd.size(); ++a) inner *= vd[a];
    const int64_t len = vd[ax], cache_len = n.dims[ax];
    const std::vector<int32_t>& pos = v[n.inputs[2]].i;
    const bool per_row = !g[n.inputs[2]].dims.empty();  // row r goes to pos[r], else to pos[0] + r
    const int64_t outer = len != 0 && inner != 0 ? element_count(vd) / (len * inner) : 0;
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t r = 0; r < len; ++r) {
        const int64_t t = per_row ? pos[static_cast<size_t>(r)] : pos[0] + r;
        if (t < 0 || t >= cache_len) continue;
        for (int64_t c = 0; c < inner; ++c) f((o * cache_len + t) * inner + c, (o * len + r) * inner + c);
      }
  }

  /// The update of a kv_write: only the slice it wrote goes into the stored parameter.
  static void write_slice(const graph& g, node_index id, const std::vector<value>& v, tensor& param) {
    const node& n = g[id];
    const value& result = v[static_cast<size_t>(id)];
    for_each_slice_element(g, n, v, [&](int64_t dst, int64_t) {
      if (n.type == dtype::i32) param.set(dst, result.i[static_cast<size_t>(dst)]);
      else param.set(dst, result.f[static_cast<size_t>(dst)]);
    });
  }

  /// f16/bf16 rounding of every value (a result computed in f32), over the threads.
  void round_all(dtype t, std::vector<float>& f) const {
    parallel(static_cast<int64_t>(f.size()), [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) f[static_cast<size_t>(k)] = round16(t, f[static_cast<size_t>(k)]);
    });
  }

  /// linear: x [rows, kd] times the weight [nn, kd] transposed, the weight read in its own dtype
  /// (a quantized or half-precision leaf where it is, else floats) by cpu_linear.
  void linear(const graph& g, const node& n, const std::vector<value>& v, value& out) const {
    const node& wn = g[n.inputs[1]];
    const value& wv = v[n.inputs[1]];
    const int64_t kd = wn.dims[1], nn = wn.dims[0];
    out.f.assign(static_cast<size_t>(element_count(n.dims)), 0.0f);
    linear_args la;
    la.type = wv.raw ? wv.raw->type : dtype::f32;
    la.w = wv.raw ? wv.raw->bytes.data() : reinterpret_cast<const uint8_t*>(wv.f.data());
    la.n = nn, la.k = kd;
    la.x = v[n.inputs[0]].f.data();
    la.rows = nn ? element_count(n.dims) / nn : 0;
    la.y = out.f.data();
    la.x_mode = linear_x_;
    linear_f32(la, isa_, pool_.get());
    if (n.type != dtype::f32) round_all(n.type, out.f);
  }

  unsigned threads_;
  std::unique_ptr<thread_pool> pool_;  ///< threads_ threads, the calling one included
  linear_x linear_x_;                  ///< whether linears round x to 8 bits (integer dots)
  cpu_isa isa_ = default_isa();        ///< which kernels matmul and linear use
  device_info info_;
  std::vector<graph> programs_;
  /// Per program, per node: a cast of a quantized leaf that only gathers read as their table
  /// (an embedding): it stays in its blocks, and each gather decodes the rows it picks, instead
  /// of the whole table being decoded at every run.
  std::vector<std::vector<bool>> row_casts_;
  /// Per program, per node: an f16 or bf16 parameter that only linear (as its weight) and casts
  /// read. It is read where it is, each reader decoding the rows it uses (as quantized weights
  /// are), instead of the whole tensor being widened to floats at every run: that conversion,
  /// its allocation and page faults were most of a half-precision model's decode step.
  std::vector<std::vector<bool>> in_place_;
  std::vector<bool> loaded_;  ///< false once unloaded (ids are not reused)
  /// Per program, its node values, kept between runs for their buffers (see run()).
  std::vector<std::vector<value>> values_;

  static std::vector<bool> row_casts(const graph& g) {
    std::vector<bool> only_gathers(static_cast<size_t>(g.size()), true);
    for (node_index n = 0; n < g.size(); ++n)
      for (size_t i = 0; i < g[n].inputs.size(); ++i)
        if (g[n].op != op_kind::gather || i != 0) only_gathers[static_cast<size_t>(g[n].inputs[i])] = false;
    for (const auto& o : g.outputs) only_gathers[static_cast<size_t>(o.id)] = false;
    for (const auto& u : g.updates) only_gathers[static_cast<size_t>(u.value)] = false;
    std::vector<bool> out(static_cast<size_t>(g.size()), false);
    for (node_index n = 0; n < g.size(); ++n)
      out[static_cast<size_t>(n)] = g[n].op == op_kind::cast && g[g[n].inputs[0]].op == op_kind::parameter &&
                                    (is_quantized(g[g[n].inputs[0]].type) || is_half(g[g[n].inputs[0]].type)) &&
                                    only_gathers[static_cast<size_t>(n)];
    return out;
  }

  static bool is_half(dtype t) { return t == dtype::f16 || t == dtype::bf16; }

  static std::vector<bool> in_place_leaves(const graph& g) {
    std::vector<bool> ok(static_cast<size_t>(g.size()), true);
    for (node_index n = 0; n < g.size(); ++n)
      for (size_t i = 0; i < g[n].inputs.size(); ++i)
        if (!(g[n].op == op_kind::cast || (g[n].op == op_kind::linear && i == 1))) ok[static_cast<size_t>(g[n].inputs[i])] = false;
    for (const auto& o : g.outputs) ok[static_cast<size_t>(o.id)] = false;
    for (const auto& u : g.updates) ok[static_cast<size_t>(u.value)] = ok[static_cast<size_t>(u.target)] = false;
    for (node_index n = 0; n < g.size(); ++n) ok[static_cast<size_t>(n)] = ok[static_cast<size_t>(n)] && g[n].op == op_kind::parameter && is_half(g[n].type);
    return ok;
  }
  tensor_map params_;
};

}  // namespace

std::unique_ptr<executor> make_cpu_executor(unsigned threads) {
  cpu_options o;
  o.threads = threads;
  return std::make_unique<cpu_executor>(o);
}

std::unique_ptr<executor> make_cpu_executor(const cpu_options& options) { return std::make_unique<cpu_executor>(options); }

}  // namespace mesh::gpu
