// The Vulkan executor: programs are compiled once into pre-recorded command buffers (one submit
// per run); tensors are sub-allocated from a few large memory blocks (memory_pool, vk_memory.hpp).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>

#include "graph/quant.hpp"
#include "graph/validate.hpp"
#include "gpu/executor.hpp"
#include "gpu/glsl.hpp"
#include "gpu/plan.hpp"
#include "gpu/resident_parameters.hpp"
#include "gpu/shader_cache.hpp"
#include "gpu/vk_copy_lane.hpp"
#include "gpu/vk_device.hpp"
#include "gpu/vk_memory.hpp"
#include "gpu/vk_transfer.hpp"

namespace mesh::gpu {
namespace {

/// Bytes of a node's value (a quantized tensor's blocks: rows x row_bytes).
uint64_t bytes_of(const node& n) { return static_cast<uint64_t>(std::max<int64_t>(byte_size(n.type, n.dims), 0)); }
/// Bytes of its buffer: whole 32-bit words, as kernels bind a quantized tensor as `uint v[]`
/// (18- and 34-byte blocks leave rows of any byte count).
uint64_t buffer_bytes(const node& n) { return (bytes_of(n) + 3) & ~uint64_t{3}; }

/// Whether reductions may run in two passes: vulkan_options::split_reductions; by default on GPUs
/// only (on lavapipe a 1M-element mean took twice as long split: its workgroups are run by a few
/// CPU threads, and each extra one costs).
split_options split_options_for(const vk_device& d, const vulkan_options& vo) {
  split_options o;
  const int want = vo.split_reductions;
  o.enabled = want < 0 ? d.props.deviceType != VK_PHYSICAL_DEVICE_TYPE_CPU : want == 1;
  if (d.props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU) o.must_split_above = 32768;  // llvmpipe's loop limit
  return o;
}

/// The shortest rows whose kernels are fused into one (kernel_kind::rows), 0 for none:
/// vulkan_options::fuse_rows. By default rows of 32 or more on GPUs (a rows kernel gives each row
/// a workgroup of at least 64 threads: shorter rows would leave most of them idle, where the
/// unfused kernels give each row a thread); on CPU devices rows of 256 or more (on lavapipe a
/// fused softmax over 1,024-element rows was faster, a layer norm over 64-element rows slower:
/// its workgroups are run by a few CPU threads, and each barrier costs). 1: every length (tests).
int64_t fuse_rows_from(const vk_device& d, const vulkan_options& vo) {
  const int want = vo.fuse_rows;
  if (want == 0) return 0;
  if (want == 1) return 2;
  return d.props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ? 256 : 32;
}

using allocation = memory_pool::allocation;

struct compiled_kernel {
  kernel_source src;
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  VkPipeline pipeline = VK_NULL_HANDLE;
  VkDescriptorSet set = VK_NULL_HANDLE;
};

struct program {
  graph g;
  plan p;
  std::vector<std::optional<allocation>> owned;  // per node: buffers this program owns
  std::vector<allocation> views;                 // per node: where its value lives (owned or a parameter)
  /// Per update: where its value is copied first when it reads a buffer another update writes
  /// (a swap of two parameters; keeping the previous weights): all updates see the run's values.
  std::vector<std::optional<allocation>> update_stash;
  /// The memory of the plan's scratch buffers (vulkan_executor::scratch_arena_), shared with other programs.
  std::shared_ptr<const allocation> scratch_arena;
  std::vector<compiled_kernel> kernels;
  VkDescriptorPool pool = VK_NULL_HANDLE;
  std::optional<allocation> staging;
  std::map<std::string, uint64_t> input_offsets, output_offsets;  // in staging
  VkCommandBuffer cmd = VK_NULL_HANDLE;
  VkQueryPool queries = VK_NULL_HANDLE;
  std::vector<kernel_timing> timings;
  std::vector<int> timed;  // index into kernels for each timestamp pair
  /// The parameters it reads, and those it writes (updates, kv_write's caches): what a copy
  /// beside the kernels must be done with before it runs (vk_copy_lane::settle).
  std::set<std::string> param_reads, param_writes;
};

class vulkan_executor final : public executor {
 public:
  vulkan_executor(std::unique_ptr<vk_device> d, const vulkan_options& o)
      : d_(std::move(d)),
        cache_(o.cache_dir == "-" ? "" : (o.cache_dir.empty() ? default_cache_dir() : o.cache_dir), d_->key()),
        device_pool_(*d_, d_->device_memory_type, o.map_device_memory && d_->device_memory_type == d_->host_memory_type, o.block_bytes,
                     &budget_used_, o.memory_limit),
        host_pool_(*d_, d_->host_memory_type, true, std::min<uint64_t>(o.block_bytes, 64ull << 20), &host_used_, 0),
        split_(split_options_for(*d_, o)),
        fuse_rows_from_(fuse_rows_from(*d_, o)),
        timestamps_(d_->timestamps && o.kernel_timestamps) {
    cache_.warm_up();
  }

  expected<void> init() {
    auto cpi = vk_struct<VkCommandPoolCreateInfo>(VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO);
    cpi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    cpi.queueFamilyIndex = d_->queue_family;
    if (VkResult r = vkCreateCommandPool(d_->device, &cpi, nullptr, &cmd_pool_); r != VK_SUCCESS)
      return tl::unexpected(vk_error(r, "vkCreateCommandPool"));
    imports_ = std::make_unique<vk_host_imports>(*d_);
    transfers_ = std::make_unique<vk_transfers>(*d_, host_pool_, cmd_pool_, imports_.get());
    lane_ = std::make_unique<vk_copy_lane>(*d_);
    auto fci = vk_struct<VkFenceCreateInfo>(VK_STRUCTURE_TYPE_FENCE_CREATE_INFO);
    if (VkResult r = vkCreateFence(d_->device, &fci, nullptr, &fence_); r != VK_SUCCESS)
      return tl::unexpected(vk_error(r, "vkCreateFence"));
    std::vector<char> data;
    if (!cache_.dir().empty()) {
      pipeline_cache_path_ = cache_.dir() + "/pipelines-" + std::to_string(fnv1a(d_->key())) + ".bin";
      std::ifstream f(pipeline_cache_path_, std::ios::binary);
      if (f) data.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
    auto pci = vk_struct<VkPipelineCacheCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO);
    pci.initialDataSize = data.size();
    pci.pInitialData = data.empty() ? nullptr : data.data();
    if (VkResult r = vkCreatePipelineCache(d_->device, &pci, nullptr, &pipeline_cache_); r != VK_SUCCESS) {
      pci.initialDataSize = 0;  // a corrupt cache file only costs pipeline compiles
      pci.pInitialData = nullptr;
      if (VkResult r2 = vkCreatePipelineCache(d_->device, &pci, nullptr, &pipeline_cache_); r2 != VK_SUCCESS)
        return tl::unexpected(vk_error(r2, "vkCreatePipelineCache"));
      (void)r;
    }
    return {};
  }

  ~vulkan_executor() override {
    if (!d_->device) return;
    vkDeviceWaitIdle(d_->device);
    save_pipeline_cache();
    for (auto& p : programs_) destroy(p);
    for (auto& [key, k] : pipelines_) {
      vkDestroyPipeline(d_->device, k.pipeline, nullptr);
      vkDestroyPipelineLayout(d_->device, k.layout, nullptr);
      vkDestroyDescriptorSetLayout(d_->device, k.set_layout, nullptr);
    }
    for (auto& [name, pr] : params_) device_pool_.release(pr.buffer);
    if (pipeline_cache_) vkDestroyPipelineCache(d_->device, pipeline_cache_, nullptr);
    if (fence_) vkDestroyFence(d_->device, fence_, nullptr);
    transfers_.reset();  // its command buffers come from the pool
    lane_.reset();       // holds imports while its copies are in flight
    imports_.reset();    // handles still held free nothing after this
    if (cmd_pool_) vkDestroyCommandPool(d_->device, cmd_pool_, nullptr);
  }

  const device_info& info() const override { return d_->info; }

  kernel_stats stats() const override {
    kernel_stats s;
    const auto c = cache_.counters();
    s.shader_compiles = c.compiles;
    s.cache_memory_hits = c.memory_hits;
    s.pipelines_created = pipelines_created_;
    s.cache_disk_hits = c.disk_hits;
    s.compile_ms = c.compile_ms;
    s.kernels_made = kernels_made_;
    s.kernel_making_ms = kernel_making_ms_;
    s.validation_errors = d_->validation_errors.load();
    s.validation_warnings = d_->validation_warnings.load();
    s.device_bytes = device_pool_.used_bytes();
    s.imported_copy_bytes = (transfers_ ? transfers_->imported_bytes() : 0) + async_bytes_;
    s.async_copies = lane_ ? lane_->copies() : 0;
    s.async_copy_waits = lane_ ? lane_->waits() : 0;
    s.runs = runs_;
    s.run_ms = run_ms_;
    s.submit_ms = submit_ms_;
    if (last_run_ >= 0) s.kernels = programs_[static_cast<size_t>(last_run_)]->timings;
    return s;
  }

  expected<program_id> load(const graph& g) override {
    if (lost_) return lost_error();
    if (auto ok = validate(g); !ok) return tl::unexpected(ok.error());
    auto prog = std::make_unique<program>();
    const uint64_t created = pipelines_created_;
    auto ok = build(*prog, g);
    if (!ok) {
      destroy(prog);
      if (ok.error().message.find("DEVICE_LOST") != std::string::npos) lost_ = true;
      return tl::unexpected(ok.error());
    }
    if (pipelines_created_ != created) save_pipeline_cache();  // the disk copy is current otherwise
    programs_.push_back(std::move(prog));
    return static_cast<program_id>(programs_.size() - 1);
  }

  expected<void> set_parameters(const tensor_map& params) override {
    if (lost_) return lost_error();
    for (const auto& [name, t] : params) {
      if (auto ok = t.check(); !ok) return ok;
      if (auto it = params_.find(name); it != params_.end() && (it->second.type != t.type || it->second.dims != t.dims))
        return make_error(error_code::shape_mismatch, "parameter \"" + name + "\" is " + mesh::to_string(it->second.type) +
                                                          mesh::to_string(it->second.dims) + " on the device, got " +
                                                          mesh::to_string(t.type) + mesh::to_string(t.dims));
    }
    std::set<std::string> names;
    for (const auto& [name, t] : params) names.insert(name);
    if (auto ok = settle({}, names); !ok) return ok;
    for (const auto& [name, t] : params) {
      auto pr = parameter(name, t.type, t.dims);
      if (!pr) return tl::unexpected(pr.error());
      if (auto ok = noting_loss(transfers_->upload((*pr)->buffer, t.bytes)); !ok) return ok;
    }
    return {};
  }

  expected<void> set_parameter_view(const std::string& name, const tensor_view& v) override {
    if (lost_) return lost_error();
    if (auto ok = v.check(); !ok) return make_error(ok.error().code, "parameter \"" + name + "\": " + ok.error().message);
    if (auto it = params_.find(name); it != params_.end() && (it->second.type != v.type || it->second.dims != v.dims))
      return make_error(error_code::shape_mismatch, "parameter \"" + name + "\" is " + mesh::to_string(it->second.type) +
                                                        mesh::to_string(it->second.dims) + " on the device, got " +
                                                        mesh::to_string(v.type) + mesh::to_string(v.dims));
    if (auto ok = settle({}, {name}); !ok) return ok;
    auto pr = parameter(name, v.type, v.dims);
    if (!pr) return tl::unexpected(pr.error());
    return noting_loss(transfers_->upload((*pr)->buffer, v.bytes));
  }

  expected<tensor_map> get_parameters(const std::vector<std::string>& names) override {
    if (lost_) return lost_error();
    if (auto ok = settle({names.begin(), names.end()}, {}); !ok) return tl::unexpected(ok.error());
    tensor_map out;
    for (const auto& name : names) {
      auto it = params_.find(name);
      if (it == params_.end()) return make_error(error_code::not_found, "no parameter \"" + name + "\" on the device");
      tensor t = tensor::zeros(it->second.type, it->second.dims);
      if (auto ok = noting_loss(transfers_->download(it->second.buffer, t.bytes)); !ok) return tl::unexpected(ok.error());
      out[name] = std::move(t);
    }
    return out;
  }

  expected<void> read_parameters(const std::vector<std::string>& names, std::span<uint8_t> out) override {
    if (lost_) return lost_error();
    return transfer(names, out.data(), out.size(), false, "read_parameters");
  }

  expected<void> write_parameters(const std::vector<std::string>& names, std::span<const uint8_t> bytes) override {
    if (lost_) return lost_error();
    return transfer(names, const_cast<uint8_t*>(bytes.data()), bytes.size(), true, "write_parameters");
  }

  expected<void> write_parameters_from(const std::vector<std::string>& names, const std::vector<std::span<const uint8_t>>& pieces) override {
    if (lost_) return lost_error();
    std::vector<std::span<uint8_t>> host;  // only read from: move() copies to the device
    size_t size = 0;
    for (auto p : pieces) {
      host.emplace_back(const_cast<uint8_t*>(p.data()), p.size());
      size += p.size();
    }
    return transfer(names, host, size, true, "write_parameters");
  }

  expected<pending_copy> read_parameters_async(const std::vector<std::string>& names, std::span<uint8_t> out) override {
    if (lost_) return lost_error();
    const std::span<uint8_t> whole = out;
    return transfer_async(names, std::span<const std::span<uint8_t>>(&whole, 1), out.size(), false, "read_parameters");
  }

  expected<pending_copy> write_parameters_from_async(const std::vector<std::string>& names,
                                                     const std::vector<std::span<const uint8_t>>& pieces) override {
    if (lost_) return lost_error();
    std::vector<std::span<uint8_t>> host;  // only read from: the copies go to the device
    size_t size = 0;
    for (auto p : pieces) {
      host.emplace_back(const_cast<uint8_t*>(p.data()), p.size());
      size += p.size();
    }
    return transfer_async(names, host, size, true, "write_parameters");
  }

  expected<std::shared_ptr<void>> import_host_memory(std::span<const uint8_t> bytes) override {
    if (lost_) return lost_error();
    return imports_->import(bytes);
  }

  void unload(program_id id) override {
    if (id >= programs_.size() || !programs_[id]) return;
    // Runs wait for their fence, so nothing of this program is still executing.
    destroy(programs_[id]);
    if (last_run_ == static_cast<int>(id)) last_run_ = -1;
    if (scratch_arena_.use_count() == 1) {  // no program uses it any more: the largest one still used is the current one
      scratch_arena_.reset();
      for (const auto& p : programs_)
        if (p && p->scratch_arena && (!scratch_arena_ || p->scratch_arena->range.size > scratch_arena_->range.size))
          scratch_arena_ = p->scratch_arena;
    }
  }

  size_t drop_parameters(const std::string& prefix) override {
    (void)settle_all();  // no copy may still use a buffer that goes back to the pool (an error: the device is lost)
    std::set<std::string> used;  // a loaded program's descriptor sets point at its parameters
    for (const auto& p : programs_)
      if (p) add_parameter_names(p->g, used);
    return drop_unused(params_, prefix, used, [&](const param& pr) { device_pool_.release(pr.buffer); });
  }

  expected<tensor_map> run(program_id id, const tensor_map& inputs) override { return run_repeated(id, inputs, 1); }

  expected<tensor_map> run_repeated(program_id id, const tensor_map& inputs, int64_t times) override {
    if (lost_) return lost_error();
    if (auto ok = check_repeated_runs(times); !ok) return tl::unexpected(ok.error());
    if (id >= programs_.size() || !programs_[id]) return make_error(error_code::not_found, "no program " + std::to_string(id));
    program& pr = *programs_[id];
    const auto t0 = std::chrono::steady_clock::now();
    if (auto ok = check_bindings(pr.g, inputs, false); !ok) return tl::unexpected(ok.error());
    if (auto ok = settle(pr.param_reads, pr.param_writes); !ok) return tl::unexpected(ok.error());
    for (const auto& [name, off] : pr.input_offsets) {
      const auto& b = inputs.at(name).bytes;
      if (!b.empty()) std::memcpy(pr.staging->mapped + off, b.data(), b.size());
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (auto ok = submit(pr.cmd, static_cast<uint32_t>(times)); !ok) return tl::unexpected(ok.error());
    submit_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
    if (pr.queries) read_timings(pr);
    last_run_ = static_cast<int>(id);
    tensor_map out;
    for (const auto& o : pr.g.outputs) {
      const node& n = pr.g[o.id];
      // Copied straight from staging (no zero fill first: a decode step's logits are 513 KB).
      tensor t;
      t.type = n.type;
      t.dims = n.dims;
      const uint8_t* from = pr.staging->mapped + pr.output_offsets.at(o.name);
      t.bytes.assign(from, from + bytes_of(n));
      out[o.name] = std::move(t);
    }
    runs_ += static_cast<uint64_t>(times);
    run_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return out;
  }

 private:
  struct param {
    dtype type;
    shape dims;
    allocation buffer;
  };

  tl::unexpected<error> lost_error() const { return make_error(error_code::device, "the Vulkan device was lost earlier: create a new executor"); }

  expected<param*> parameter(const std::string& name, dtype t, const shape& dims) {
    if (auto it = params_.find(name); it != params_.end()) return &it->second;
    auto a = device_pool_.allocate(buffer_bytes(node{op_kind::parameter, t, dims, {}, {}}));
    if (!a) return tl::unexpected(a.error());
    auto& pr = params_[name];
    pr = param{t, dims, *a};
    auto ok = one_shot([&](VkCommandBuffer cmd) { vkCmdFillBuffer(cmd, a->buffer, a->range.offset, a->range.size, 0); });
    if (!ok) return tl::unexpected(ok.error());
    return &pr;
  }

  template <class F>
  expected<void> one_shot(F record) {
    auto ai = vk_struct<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
    ai.commandPool = cmd_pool_;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    VkCommandBuffer cmd;
    if (VkResult r = vkAllocateCommandBuffers(d_->device, &ai, &cmd); r != VK_SUCCESS)
      return tl::unexpected(vk_error(r, "vkAllocateCommandBuffers"));
    auto bi = vk_struct<VkCommandBufferBeginInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    vkBeginCommandBuffer(cmd, &bi);
    record(cmd);
    after_transfer_barrier(cmd);
    vkEndCommandBuffer(cmd);
    auto ok = submit(cmd);
    vkFreeCommandBuffers(d_->device, cmd_pool_, 1, &cmd);
    return ok;
  }

  /// Submits `cmd` `times` times in one submission (a program's command buffer is recorded for
  /// simultaneous use: see record()) and waits for it.
  expected<void> submit(VkCommandBuffer cmd, uint32_t times = 1) {
    const std::vector<VkCommandBuffer> cmds(times, cmd);
    auto si = vk_struct<VkSubmitInfo>(VK_STRUCTURE_TYPE_SUBMIT_INFO);
    si.commandBufferCount = times;
    si.pCommandBuffers = cmds.data();
    VkResult r = vkQueueSubmit(d_->queue, 1, &si, fence_);
    if (r == VK_SUCCESS) {
      r = vkWaitForFences(d_->device, 1, &fence_, VK_TRUE, 120ull * 1000 * 1000 * 1000);
      if (r == VK_TIMEOUT) {
        lost_ = true;
        return make_error(error_code::timeout, "a GPU submission did not finish in 120 s: the device is considered lost");
      }
      vkResetFences(d_->device, 1, &fence_);
    }
    if (r == VK_ERROR_DEVICE_LOST) lost_ = true;
    if (r != VK_SUCCESS) return tl::unexpected(vk_error(r, "vkQueueSubmit/vkWaitForFences"));
    return {};
  }

  /// Moves the parameters `names` between the device and `host` (their bytes end to end, `size`
  /// in all; read from `host` when `to_device`, else written): vk_transfers::move.
  expected<void> transfer(const std::vector<std::string>& names, uint8_t* host, size_t size, bool to_device, const char* what) {
    const std::span<uint8_t> whole(host, size);
    return transfer(names, std::span<const std::span<uint8_t>>(&whole, 1), size, to_device, what);
  }
  /// The same from or into `host` in pieces.
  expected<void> transfer(const std::vector<std::string>& names, std::span<const std::span<uint8_t>> host, size_t size, bool to_device,
                          const char* what) {
    auto list = settled_buffers(names, size, to_device, what);
    if (!list) return tl::unexpected(list.error());
    return noting_loss(transfers_->move(*list, host, to_device));
  }

  /// transfer() as a copy beside the kernels where every piece of `host` lies in an import;
  /// otherwise transfer() itself, done before this returns.
  expected<pending_copy> transfer_async(const std::vector<std::string>& names, std::span<const std::span<uint8_t>> host, size_t size,
                                        bool to_device, const char* what) {
    auto places = imported_places(*imports_, host);
    if (!places) {
      if (auto ok = transfer(names, host, size, to_device, what); !ok) return tl::unexpected(ok.error());
      return pending_copy{};
    }
    auto list = settled_buffers(names, size, to_device, what);
    if (!list) return tl::unexpected(list.error());
    std::vector<std::shared_ptr<void>> keep;
    for (auto& p : *places) keep.push_back(std::move(p.keep));
    uint64_t moved = 0;
    auto copy = lane_->submit([&](VkCommandBuffer cmd) { moved = record_imported_copies(cmd, *list, host, *places, to_device); }, names,
                              to_device, std::move(keep));
    if (copy) async_bytes_ += moved;
    else (void)noting_lane_loss(tl::unexpected(copy.error()));
    return copy;
  }

  /// The buffers of the parameters `names` and their byte counts, checked to hold `size` bytes, once
  /// the copies beside the kernels that moving them (to the device when `to_device`) races with end.
  expected<std::vector<std::pair<const allocation*, uint64_t>>> settled_buffers(const std::vector<std::string>& names, size_t size,
                                                                                bool to_device, const char* what) {
    auto list = parameter_buffers(names, size, what, [&](const std::string& name) -> std::optional<std::pair<const allocation*, uint64_t>> {
      auto it = params_.find(name);
      if (it == params_.end()) return std::nullopt;
      return std::pair{&it->second.buffer, static_cast<uint64_t>(std::max<int64_t>(byte_size(it->second.type, it->second.dims), 0))};
    });
    if (!list) return list;
    const std::set<std::string> touched(names.begin(), names.end());
    if (auto ok = to_device ? settle({}, touched) : settle(touched, {}); !ok) return tl::unexpected(ok.error());
    return list;
  }

  /// Waits for the copies beside the kernels that work reading `reads` and writing `writes`
  /// would race with (vk_copy_lane::settle); one that failed for the device makes it lost.
  expected<void> settle(const std::set<std::string>& reads, const std::set<std::string>& writes) { return noting_lane_loss(lane_->settle(reads, writes)); }
  expected<void> settle_all() { return noting_lane_loss(lane_->settle_all()); }
  expected<void> noting_lane_loss(expected<void> r) {
    if (!r && (r.error().code == error_code::device || r.error().code == error_code::timeout)) lost_ = true;
    return r;
  }

  /// A result of transfers_, after which the executor knows whether the device was lost.
  template <class R>
  R noting_loss(R r) {
    if (transfers_->lost()) lost_ = true;
    return r;
  }

  /// An update whose value already lives in its target's buffer: a parameter kept as it is, or a
  /// kv_write (its buffer is the cache's): nothing to copy.
  static bool in_place(const program& pr, const update& up) {
    const auto &v = pr.views[up.value], &t = pr.views[up.target];
    return up.value == up.target || (v.buffer == t.buffer && v.range.offset == t.range.offset);
  }

  expected<void> build(program& pr, const graph& g) {
    pr.g = g;
    add_parameter_names(g, pr.param_reads);
    for (const auto& up : g.updates) pr.param_writes.insert(g[up.target].attrs.name);
    for (const auto& x : g.nodes)
      if (x.op == op_kind::kv_write) pr.param_writes.insert(g[x.inputs[0]].attrs.name);
    pr.p = lower(g, split_, fuse_rows_from_);
    predecode_linears(g, pr.p, d_->caps);
    split_linears(g, pr.p, d_->caps);
    const auto n = static_cast<size_t>(g.size());
    // Views past the graph's nodes are the plan's scratch buffers (scratch_id).
    pr.owned.resize(n + pr.p.scratch.size());
    pr.views.resize(n + pr.p.scratch.size());
    const uint64_t max_range = d_->props.limits.maxStorageBufferRange;
    // Buffers: parameters are shared by name; everything else materialised belongs to the program.
    for (node_index id = 0; id < g.size(); ++id) {
      if (!pr.p.materialised[id]) continue;
      const node& x = g[id];
      if (bytes_of(x) > max_range)
        return make_error(error_code::limit_exceeded, "node %" + std::to_string(id) + " needs " + std::to_string(bytes_of(x)) +
                                                          " bytes, over this device's storage buffer range of " +
                                                          std::to_string(max_range));
      if (x.op == op_kind::kv_write) {  // writes its cache in place: the parameter's buffer (validate())
        pr.views[id] = pr.views[x.inputs[0]];
        continue;
      }
      if (x.op == op_kind::parameter) {
        if (auto it = params_.find(x.attrs.name); it != params_.end() && (it->second.type != x.type || it->second.dims != x.dims))
          return make_error(error_code::shape_mismatch, "parameter \"" + x.attrs.name + "\" is " + mesh::to_string(it->second.type) +
                                                            mesh::to_string(it->second.dims) + " on the device, the graph wants " +
                                                            mesh::to_string(x.type) + mesh::to_string(x.dims));
        auto prm = parameter(x.attrs.name, x.type, x.dims);
        if (!prm) return tl::unexpected(prm.error());
        pr.views[id] = (*prm)->buffer;
        continue;
      }
      auto a = device_pool_.allocate(buffer_bytes(x));
      if (!a) return tl::unexpected(a.error());
      pr.owned[id] = *a;
      pr.views[id] = *a;
      if (x.op == op_kind::constant) {
        tensor t = tensor::from_values(x.type, x.dims, x.attrs.values);
        if (auto ok = noting_loss(transfers_->upload(*a, t.bytes)); !ok) return ok;
      }
    }
    // Scratch buffers (split partials, decoded weights) hold values only within one run, and
    // runs never overlap (each waits for its fence; one caller at a time): every program lays
    // its scratch buffers out in one arena that all programs share, as large as the largest
    // program's. A program needing more makes a larger one; earlier programs keep theirs.
    std::vector<uint64_t> scratch_at;
    uint64_t scratch_bytes = 0;
    for (const auto& sb : pr.p.scratch) {
      scratch_at.push_back(scratch_bytes);
      scratch_bytes = (scratch_bytes + static_cast<uint64_t>(sb.elements) * size_of(sb.type) + 255) & ~uint64_t{255};
    }
    if (scratch_bytes > 0) {
      if (!scratch_arena_ || scratch_arena_->range.size < scratch_bytes) {
        auto a = device_pool_.allocate(scratch_bytes);
        if (!a) return tl::unexpected(a.error());
        scratch_arena_ = std::shared_ptr<const allocation>(new allocation(*a), [this](const allocation* x) {
          device_pool_.release(*x);
          delete x;
        });
      }
      pr.scratch_arena = scratch_arena_;
      for (size_t i = 0; i < pr.p.scratch.size(); ++i) {
        allocation v = *scratch_arena_;
        v.range.offset += scratch_at[i];
        v.range.size = static_cast<uint64_t>(pr.p.scratch[i].elements) * size_of(pr.p.scratch[i].type);
        if (v.mapped) v.mapped += scratch_at[i];
        pr.views[n + i] = v;
      }
    }
    // An update whose value lives in a buffer range that an update writes is staged first.
    pr.update_stash.resize(g.updates.size());
    const auto overlaps = [](const allocation& a, const allocation& b) {
      return a.buffer == b.buffer && a.range.offset < b.range.offset + b.range.size && b.range.offset < a.range.offset + a.range.size;
    };
    for (size_t u = 0; u < g.updates.size(); ++u) {
      const auto& up = g.updates[u];
      if (in_place(pr, up) || !bytes_of(g[up.value])) continue;
      bool hazard = false;
      for (const auto& other : g.updates)
        if (!in_place(pr, other) && overlaps(pr.views[up.value], pr.views[other.target])) hazard = true;
      if (!hazard) continue;
      auto a = device_pool_.allocate(bytes_of(g[up.value]));
      if (!a) return tl::unexpected(a.error());
      pr.update_stash[u] = *a;
    }
    // Staging: inputs then outputs.
    uint64_t staging = 0;
    auto align = [](uint64_t v) { return (v + 255) & ~uint64_t{255}; };
    for (const auto& x : g.nodes)
      if (x.op == op_kind::input) {
        pr.input_offsets[x.attrs.name] = staging;
        staging = align(staging + bytes_of(x));
      }
    for (const auto& o : g.outputs) {
      pr.output_offsets[o.name] = staging;
      staging = align(staging + bytes_of(g[o.id]));
    }
    auto st = host_pool_.allocate(std::max<uint64_t>(staging, 4));
    if (!st) return tl::unexpected(st.error());
    pr.staging = *st;

    // Kernels.
    uint32_t total_bindings = 0;
    for (const auto& k : pr.p.kernels) {
      const auto t0 = std::chrono::steady_clock::now();
      auto src = emit(g, pr.p, k, d_->caps);
      if (!src) return tl::unexpected(src.error());
      compiled_kernel ck;
      ck.src = std::move(*src);
      total_bindings += static_cast<uint32_t>(ck.src.bindings.size());
      pr.kernels.push_back(std::move(ck));
      if (auto ok = make_pipeline(pr.kernels.back()); !ok) return ok;
      ++kernels_made_;
      kernel_making_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
    if (!pr.kernels.empty()) {
      VkDescriptorPoolSize ps{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, total_bindings};
      auto dpi = vk_struct<VkDescriptorPoolCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO);
      dpi.maxSets = static_cast<uint32_t>(pr.kernels.size());
      dpi.poolSizeCount = 1;
      dpi.pPoolSizes = &ps;
      if (VkResult r = vkCreateDescriptorPool(d_->device, &dpi, nullptr, &pr.pool); r != VK_SUCCESS)
        return tl::unexpected(vk_error(r, "vkCreateDescriptorPool"));
    }
    for (auto& ck : pr.kernels) {
      auto ai = vk_struct<VkDescriptorSetAllocateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO);
      ai.descriptorPool = pr.pool;
      ai.descriptorSetCount = 1;
      ai.pSetLayouts = &ck.set_layout;
      if (VkResult r = vkAllocateDescriptorSets(d_->device, &ai, &ck.set); r != VK_SUCCESS)
        return tl::unexpected(vk_error(r, "vkAllocateDescriptorSets"));
      std::vector<VkDescriptorBufferInfo> infos;
      for (auto id : ck.src.bindings) {
        const auto& v = pr.views[id];
        infos.push_back({v.buffer, v.range.offset, v.range.size});
      }
      std::vector<VkWriteDescriptorSet> writes;
      for (uint32_t b = 0; b < infos.size(); ++b) {
        auto w = vk_struct<VkWriteDescriptorSet>(VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET);
        w.dstSet = ck.set;
        w.dstBinding = b;
        w.descriptorCount = 1;
        w.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        w.pBufferInfo = &infos[b];
        writes.push_back(w);
      }
      vkUpdateDescriptorSets(d_->device, static_cast<uint32_t>(writes.size()), writes.data(), 0, nullptr);
    }
    return record(pr);
  }

  expected<void> make_pipeline(compiled_kernel& ck) {
    // The same kernel source in another program (or the same graph loaded again): share its
    // pipeline. Creating one costs ~0.1-0.2 ms even when the VkPipelineCache has it.
    if (auto it = pipelines_.find(ck.src.glsl); it != pipelines_.end()) {
      ck.set_layout = it->second.set_layout;
      ck.layout = it->second.layout;
      ck.pipeline = it->second.pipeline;
      return {};
    }
    auto made = create_pipeline(ck);
    if (!made) return made;
    pipelines_.emplace(ck.src.glsl, shared_pipeline{ck.set_layout, ck.layout, ck.pipeline});
    ++pipelines_created_;
    return {};
  }

  expected<void> create_pipeline(compiled_kernel& ck) {
    // MESH_GLSL_DUMP=DIR writes each kernel's source to DIR/<name>.comp (for reading and profiling
    // a kernel outside the executor); a write that fails is ignored.
    if (const char* dump = std::getenv("MESH_GLSL_DUMP"); dump && *dump) std::ofstream(std::string(dump) + "/" + ck.src.name + ".comp") << ck.src.glsl;
    auto spirv = kernel_spirv(cache_, ck.src);
    if (!spirv) return tl::unexpected(spirv.error());
    const validation_context naming(ck.src.name);
    std::vector<VkDescriptorSetLayoutBinding> binds;
    for (uint32_t b = 0; b < ck.src.bindings.size(); ++b)
      binds.push_back({b, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr});
    auto dli = vk_struct<VkDescriptorSetLayoutCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO);
    dli.bindingCount = static_cast<uint32_t>(binds.size());
    dli.pBindings = binds.data();
    if (VkResult r = vkCreateDescriptorSetLayout(d_->device, &dli, nullptr, &ck.set_layout); r != VK_SUCCESS)
      return tl::unexpected(vk_error(r, "vkCreateDescriptorSetLayout"));
    auto pli = vk_struct<VkPipelineLayoutCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO);
    pli.setLayoutCount = 1;
    pli.pSetLayouts = &ck.set_layout;
    if (VkResult r = vkCreatePipelineLayout(d_->device, &pli, nullptr, &ck.layout); r != VK_SUCCESS)
      return tl::unexpected(vk_error(r, "vkCreatePipelineLayout"));
    auto smi = vk_struct<VkShaderModuleCreateInfo>(VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO);
    smi.codeSize = spirv->size() * 4;
    smi.pCode = spirv->data();
    VkShaderModule module;
    if (VkResult r = vkCreateShaderModule(d_->device, &smi, nullptr, &module); r != VK_SUCCESS)
      return tl::unexpected(vk_error(r, "vkCreateShaderModule"));
    auto cpi = vk_struct<VkComputePipelineCreateInfo>(VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO);
    cpi.stage = vk_struct<VkPipelineShaderStageCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO);
    cpi.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    cpi.stage.module = module;
    cpi.stage.pName = "main";
    // Kernels on cooperative matrices run in full subgroups (their workgroups are whole subgroups):
    // KHR matrices in SPIR-V before 1.6 need it, and the validation layer asks it for NV ones.
    if (d_->full_subgroups && ck.src.glsl.find("GL_NV_cooperative_matrix") != std::string::npos)
      cpi.stage.flags |= VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT_EXT;
    cpi.layout = ck.layout;
    if (d_->pipeline_stats) cpi.flags |= VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
    VkResult r = vkCreateComputePipelines(d_->device, pipeline_cache_, 1, &cpi, nullptr, &ck.pipeline);
    vkDestroyShaderModule(d_->device, module, nullptr);
    if (r != VK_SUCCESS) {
      ck.pipeline = VK_NULL_HANDLE;
      return tl::unexpected(vk_error(r, "vkCreateComputePipelines(" + ck.src.name + ")"));
    }
    if (d_->pipeline_stats) d_->print_pipeline_stats(ck.pipeline, ck.src.name);
    return {};
  }

  expected<void> record(program& pr) {
    const graph& g = pr.g;
    auto ai = vk_struct<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
    ai.commandPool = cmd_pool_;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    if (VkResult r = vkAllocateCommandBuffers(d_->device, &ai, &pr.cmd); r != VK_SUCCESS) {
      pr.cmd = VK_NULL_HANDLE;
      return tl::unexpected(vk_error(r, "vkAllocateCommandBuffers"));
    }
    for (size_t i = 0; i < pr.kernels.size(); ++i)
      if (element_count(g[pr.p.kernels[i].root].dims) > 0) pr.timed.push_back(static_cast<int>(i));
    if (timestamps_ && !pr.timed.empty()) {
      auto qi = vk_struct<VkQueryPoolCreateInfo>(VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO);
      qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
      qi.queryCount = static_cast<uint32_t>(pr.timed.size() + 1);
      if (VkResult r = vkCreateQueryPool(d_->device, &qi, nullptr, &pr.queries); r != VK_SUCCESS) pr.queries = VK_NULL_HANDLE;
    }
    auto bi = vk_struct<VkCommandBufferBeginInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
    // run_repeated lists the command buffer several times in one submission. Each copy's last
    // barrier orders its updates before the next copy's commands (a barrier's scopes reach
    // across command buffers in submission order).
    bi.flags = VK_COMMAND_BUFFER_USAGE_SIMULTANEOUS_USE_BIT;
    VkCommandBuffer cmd = pr.cmd;
    vkBeginCommandBuffer(cmd, &bi);
    if (pr.queries) vkCmdResetQueryPool(cmd, pr.queries, 0, static_cast<uint32_t>(pr.timed.size() + 1));
    for (const auto& x : g.nodes) {
      if (x.op != op_kind::input || bytes_of(x) == 0) continue;
      const auto& dst = pr.views[g.find_leaf(x.attrs.name)];
      VkBufferCopy c{pr.staging->range.offset + pr.input_offsets.at(x.attrs.name), dst.range.offset, bytes_of(x)};
      vkCmdCopyBuffer(cmd, pr.staging->buffer, dst.buffer, 1, &c);
    }
    memory_barrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_HOST_BIT,
                   VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_HOST_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                   VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
    if (pr.queries) vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, pr.queries, 0);
    // Since the last barrier: buffers written (a kernel reading or writing one waits: read after
    // write, write after write) and buffers read (a kernel writing one waits: write after read,
    // as when the decoded-weight scratch buffer that one product read is decoded into for the next).
    std::vector<bool> dirty(pr.views.size(), false), read(pr.views.size(), false);  // graph nodes and scratch buffers
    uint32_t query = 1;
    for (const auto ki : pr.timed) {
      const auto& ck = pr.kernels[static_cast<size_t>(ki)];
      bool hazard = false;
      for (size_t b = 0; b < ck.src.bindings.size(); ++b) {
        const auto id = ck.src.bindings[b];
        hazard = hazard || dirty[id] || (b < ck.src.writes && read[id]);
      }
      if (hazard) {
        memory_barrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                       VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
        std::fill(dirty.begin(), dirty.end(), false);
        std::fill(read.begin(), read.end(), false);
      }
      for (size_t b = ck.src.writes; b < ck.src.bindings.size(); ++b) read[ck.src.bindings[b]] = true;
      vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, ck.pipeline);
      vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, ck.layout, 0, 1, &ck.set, 0, nullptr);
      vkCmdDispatch(cmd, ck.src.groups[0], ck.src.groups[1], ck.src.groups[2]);
      for (size_t w = 0; w < ck.src.writes; ++w) dirty[ck.src.bindings[w]] = true;
      if (pr.queries) vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pr.queries, query++);
    }
    memory_barrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                   VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_READ_BIT);
    for (const auto& o : g.outputs) {
      const uint64_t size = bytes_of(g[o.id]);
      if (!size) continue;
      const auto& src = pr.views[o.id];
      VkBufferCopy c{src.range.offset, pr.staging->range.offset + pr.output_offsets.at(o.name), size};
      vkCmdCopyBuffer(cmd, src.buffer, pr.staging->buffer, 1, &c);
    }
    // Updates read this run's values and write parameters that outputs may have just read.
    memory_barrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_READ_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
                   VK_ACCESS_TRANSFER_WRITE_BIT);
    bool stashed = false;
    for (size_t u = 0; u < g.updates.size(); ++u) {
      if (!pr.update_stash[u]) continue;
      const auto& src = pr.views[g.updates[u].value];
      const auto& stash = *pr.update_stash[u];
      VkBufferCopy c{src.range.offset, stash.range.offset, bytes_of(g[g.updates[u].value])};
      vkCmdCopyBuffer(cmd, src.buffer, stash.buffer, 1, &c);
      stashed = true;
    }
    if (stashed)
      memory_barrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
                     VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT);
    for (size_t u = 0; u < g.updates.size(); ++u) {
      const auto& up = g.updates[u];
      const uint64_t size = bytes_of(g[up.value]);
      if (!size || in_place(pr, up)) continue;
      const auto& src = pr.update_stash[u] ? *pr.update_stash[u] : pr.views[up.value];
      const auto& dst = pr.views[up.target];
      VkBufferCopy c{src.range.offset, dst.range.offset, size};
      vkCmdCopyBuffer(cmd, src.buffer, dst.buffer, 1, &c);
    }
    after_transfer_barrier(cmd);
    if (VkResult r = vkEndCommandBuffer(cmd); r != VK_SUCCESS) return tl::unexpected(vk_error(r, "vkEndCommandBuffer"));
    for (auto ki : pr.timed) {
      const auto& src = pr.kernels[static_cast<size_t>(ki)].src;
      kernel_timing t;
      t.name = src.name;
      t.bytes = src.bytes;
      t.flops = src.flops;
      pr.timings.push_back(t);
    }
    return {};
  }

  void read_timings(program& pr) {
    std::vector<uint64_t> ts(pr.timed.size() + 1);
    if (vkGetQueryPoolResults(d_->device, pr.queries, 0, static_cast<uint32_t>(ts.size()), ts.size() * 8, ts.data(), 8,
                              VK_QUERY_RESULT_64_BIT) != VK_SUCCESS)
      return;
    const double period_ms = d_->props.limits.timestampPeriod * 1e-6;
    for (size_t i = 0; i < pr.timings.size(); ++i) {
      const double ms = static_cast<double>(ts[i + 1] - ts[i]) * period_ms;
      pr.timings[i].last_ms = ms;
      pr.timings[i].total_ms += ms;
      ++pr.timings[i].runs;
    }
  }

  void destroy(std::unique_ptr<program>& p) {
    if (!p) return;
    VkDevice dev = d_->device;
    for (auto& k : p->kernels) {
      if (pipelines_.count(k.src.glsl)) continue;  // shared: destroyed with the executor
      if (k.pipeline) vkDestroyPipeline(dev, k.pipeline, nullptr);
      if (k.layout) vkDestroyPipelineLayout(dev, k.layout, nullptr);
      if (k.set_layout) vkDestroyDescriptorSetLayout(dev, k.set_layout, nullptr);
    }
    if (p->pool) vkDestroyDescriptorPool(dev, p->pool, nullptr);
    if (p->cmd) vkFreeCommandBuffers(dev, cmd_pool_, 1, &p->cmd);
    if (p->queries) vkDestroyQueryPool(dev, p->queries, nullptr);
    for (auto& o : p->owned)
      if (o) device_pool_.release(*o);
    for (auto& o : p->update_stash)
      if (o) device_pool_.release(*o);
    if (p->staging) host_pool_.release(*p->staging);
    p.reset();
  }

  void save_pipeline_cache() {
    if (pipeline_cache_path_.empty() || !pipeline_cache_) return;
    size_t size = 0;
    if (vkGetPipelineCacheData(d_->device, pipeline_cache_, &size, nullptr) != VK_SUCCESS || size == 0) return;
    std::vector<char> data(size);
    if (vkGetPipelineCacheData(d_->device, pipeline_cache_, &size, data.data()) != VK_SUCCESS) return;
    const std::string tmp = pipeline_cache_path_ + ".tmp" + std::to_string(reinterpret_cast<uintptr_t>(this));
    std::ofstream f(tmp, std::ios::binary);
    f.write(data.data(), static_cast<std::streamsize>(size));
    f.close();
    std::error_code ec;
    if (f) std::filesystem::rename(tmp, pipeline_cache_path_, ec);
    else std::filesystem::remove(tmp, ec);
  }

  std::unique_ptr<vk_device> d_;
  shader_cache cache_;
  /// Pipelines by kernel source (the source fixes the bindings too), shared by every program.
  struct shared_pipeline {
    VkDescriptorSetLayout set_layout;
    VkPipelineLayout layout;
    VkPipeline pipeline;
  };
  std::unordered_map<std::string, shared_pipeline> pipelines_;
  uint64_t pipelines_created_ = 0;
  uint64_t kernels_made_ = 0;     ///< kernel_stats::kernels_made
  double kernel_making_ms_ = 0;   ///< kernel_stats::kernel_making_ms
  uint64_t runs_ = 0;             ///< kernel_stats::runs
  double run_ms_ = 0, submit_ms_ = 0;  ///< kernel_stats::run_ms, submit_ms
  uint64_t budget_used_ = 0, host_used_ = 0;
  memory_pool device_pool_, host_pool_;
  /// The largest scratch arena made so far (program::scratch_arena); released through device_pool_.
  std::shared_ptr<const allocation> scratch_arena_;
  split_options split_;  ///< when reductions run in two passes (read at creation, like the caps)
  int64_t fuse_rows_from_;  ///< kernels over rows this long or longer are fused (read at creation)
  bool timestamps_;  ///< GPU timestamps around kernels: the device has them and the options want them
  VkCommandPool cmd_pool_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  /// Parameters' bytes to and from host memory (made by init(), with the command pool).
  std::unique_ptr<vk_transfers> transfers_;
  std::unique_ptr<vk_host_imports> imports_;  ///< import_host_memory's (made by init())
  std::unique_ptr<vk_copy_lane> lane_;        ///< the copies beside the kernels (made by init())
  uint64_t async_bytes_ = 0;                  ///< bytes those moved (kernel_stats::imported_copy_bytes)
  VkPipelineCache pipeline_cache_ = VK_NULL_HANDLE;
  std::string pipeline_cache_path_;
  std::map<std::string, param> params_;
  std::vector<std::unique_ptr<program>> programs_;
  int last_run_ = -1;
  bool lost_ = false;
};

}  // namespace

expected<std::unique_ptr<executor>> make_vulkan_executor(const vulkan_options& options) {
  auto d = vk_device::create(options);
  if (!d) return tl::unexpected(d.error());
  auto ex = std::make_unique<vulkan_executor>(std::move(*d), options);
  if (auto ok = ex->init(); !ok) return tl::unexpected(ok.error());
  return std::unique_ptr<executor>(std::move(ex));
}

}  // namespace mesh::gpu
