// The Vulkan runtime: validation layers, kernel cache across processes, memory limits, device
// choice, timings.
#include "harness.hpp"

#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <thread>

#include "graph/nn.hpp"
#include "gpu/memory_probe.hpp"
#include "gpu/plan.hpp"

using namespace mesh;
using namespace mesh::gpu;
using namespace mesh::gpu::test;

namespace {

/// A representative set of graphs: fused elementwise, matmul with epilogue, softmax, layer norm,
/// gather/scatter, f16, concat/permute, parameter updates.
std::vector<std::pair<graph, tensor_map>> representative_graphs() {
  std::vector<std::pair<graph, tensor_map>> out;
  builder b;
  auto x = b.input("x", dtype::f32, {6, 40});
  auto h = b.input("h", dtype::f16, {6, 40});
  auto idx = b.input("idx", dtype::i32, {4});
  auto w = b.parameter("rep.w", dtype::f32, {40, 24});
  auto g = b.parameter("rep.g", dtype::f32, {40});
  auto be = b.parameter("rep.b", dtype::f32, {40});
  b.output("mlp", relu(matmul(x, w) + 0.5));
  b.output("softmax", nn::softmax(x));
  b.output("ln", nn::layer_norm(x, g, be));
  b.output("gather", gather(x, idx));
  b.output("scatter", scatter_add(idx, gather(x, idx), {6, 40}));
  b.output("half", cast(h, dtype::f32) + sum(cast(h, dtype::f32), {1}, true));
  b.output("move", concat({transpose(x), transpose(x)}, 1));
  auto tall = b.input("tall", dtype::f32, {4099, 5});
  b.output("loss", mean_all((tall - 0.25) * (tall - 0.25)));  // split reductions: two passes and a
  b.output("cols", sum(tall, {0}));                           // scratch buffer between them
  b.update(w, w * 0.5);
  out.emplace_back(finish(b), tensor_map{{"x", random_tensor(dtype::f32, {6, 40}, 1)},
                                         {"h", random_tensor(dtype::f16, {6, 40}, 2)},
                                         {"idx", tensor::from_ints({4}, {0, 5, 3, 9})},
                                         {"tall", random_tensor(dtype::f32, {4099, 5}, 3)}});
  return out;
}

}  // namespace

TEST_CASE("runtime: validation layers report zero errors over representative graphs") {
  vulkan();  // keeps the driver loaded for the whole process (see harness.hpp)
  vulkan_options o;
  o.validation = true;
  o.cache_dir = "-";
  o.split_reductions = 1;  // representative_graphs() has split reductions
  o.fuse_rows = 1;         // ... and rows kernels
  auto ex = make_vulkan_executor(o);
  if (!ex && ex.error().code == error_code::unsupported) FAIL("validation layers are missing: " << ex.error().message);
  REQUIRE(ex);
  for (auto& [g, inputs] : representative_graphs()) {
    tensor_map params = nn::init_parameters(g, 3);
    check_on(**ex, g, inputs, params, 4e-3);
    auto id = (*ex)->load(g);
    REQUIRE(id);
    REQUIRE((*ex)->run(*id, inputs));
  }
  CHECK((*ex)->stats().validation_errors == 0);
}

TEST_CASE("runtime: the second process's half of the compile-cache test", "[.][cache_child]") {
  // Run by the test below in a process of its own (this binary, started by posix_spawn): loads
  // the first representative graph with the disk cache in MESH_TEST_KERNEL_CACHE and exits with
  // the shaders it compiled + 100 if it read any from disk.
  const char* dir = std::getenv("MESH_TEST_KERNEL_CACHE");
  if (!dir) _exit(202);
  vulkan_options o;
  o.cache_dir = dir;
  auto ex = make_vulkan_executor(o);
  if (!ex) _exit(200);
  auto graphs = representative_graphs();
  auto id = (*ex)->load(graphs[0].first);
  if (!id) _exit(201);
  const auto s = (*ex)->stats();
  ex->reset();  // persists the pipeline cache
  _exit(static_cast<int>(std::min<uint64_t>(s.shader_compiles, 99)) + (s.cache_disk_hits > 0 ? 100 : 0));
}

TEST_CASE("runtime: a second process loading the same graph compiles nothing") {
  const std::string dir = "/tmp/mesh-gpu-kcache-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  // Each child is a fresh process started by posix_spawn, not fork: a forked copy of a process
  // holding a Vulkan device cannot make its own on NVIDIA's driver, and the fork leaves the
  // parent's pages copy-on-write, so the parent's next write to a mapped staging buffer moves it
  // away from the pages the GPU copies from (seen on an H200: read_parameters then returned
  // stale bytes in this process).
  auto child = [&]() -> int {
    std::vector<std::string> env{"MESH_TEST_KERNEL_CACHE=" + dir};
    for (char** e = environ; *e; ++e) env.emplace_back(*e);
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string exe = "/proc/self/exe", filter = "[cache_child]";
    char* argv[] = {exe.data(), filter.data(), nullptr};
    pid_t pid = -1;
    if (posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, envp.data()) != 0) return -1;
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  const int first = child();
  INFO("exit codes encode compiles + 100 * (disk hits > 0)");
  CHECK(first > 0);
  CHECK(first < 100);  // all compiled, nothing from disk
  const int second = child();
  CHECK(second == 100);  // zero compiles, served from disk
  CHECK(std::filesystem::exists(dir));
  bool pipeline_cache = false;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    pipeline_cache = pipeline_cache || e.path().filename().string().rfind("pipelines-", 0) == 0;
  CHECK(pipeline_cache);
  std::filesystem::remove_all(dir);
}

TEST_CASE("runtime: in one process the second load of a graph compiles nothing and shares the pipelines") {
  auto& ex = vulkan();
  builder b;
  auto x = b.input("x", dtype::f32, {33});
  b.output("y", exp(x) * x - 3.0);
  const graph g = finish(b);
  auto first = ex.load(g);
  REQUIRE(first);
  const auto before = ex.stats();
  auto second = ex.load(g);
  REQUIRE(second);
  CHECK(ex.stats().shader_compiles == before.shader_compiles);
  CHECK(ex.stats().pipelines_created == before.pipelines_created);  // the pipelines are shared
  // Both programs run, each on its own buffers: the same kernels give the same bits.
  const tensor a = random_tensor(dtype::f32, {33}, 1), c = random_tensor(dtype::f32, {33}, 2);
  auto ra = ex.run(*first, {{"x", a}});
  auto rc = ex.run(*second, {{"x", c}});
  auto ra2 = ex.run(*second, {{"x", a}});
  REQUIRE(ra);
  REQUIRE(rc);
  REQUIRE(ra2);
  CHECK(ra->at("y") == ra2->at("y"));
  CHECK_FALSE(rc->at("y") == ra->at("y"));
  const auto want = evaluate(g, {{"x", a}}, {})->outputs.at("y").to_doubles();
  const auto got = ra->at("y").to_doubles();
  for (size_t i = 0; i < want.size(); ++i) CHECK(std::abs(got[i] - want[i]) <= 1e-5 * (1 + std::abs(want[i])));
}

TEST_CASE("runtime: running out of device memory is an error value and the executor survives") {
  vulkan();
  vulkan_options o;
  o.cache_dir = "-";
  o.memory_limit = 1 << 20;
  o.block_bytes = 256 << 10;
  auto ex = make_vulkan_executor(o);
  REQUIRE(ex);
  builder big;
  auto x = big.input("x", dtype::f32, {1 << 20});
  big.output("y", x * 2.0);
  auto id = (*ex)->load(finish(big));
  REQUIRE_FALSE(id);
  CHECK(id.error().code == error_code::device);
  CHECK(id.error().message.find("out of device memory") != std::string::npos);
  auto p = (*ex)->set_parameters({{"huge", tensor::zeros(dtype::f32, {1 << 19})}});
  CHECK_FALSE(p);
  builder small;
  auto s = small.input("x", dtype::f32, {100});
  small.output("y", s * 2.0);
  check_on(**ex, finish(small), {{"x", random_tensor(dtype::f32, {100}, 4)}}, {});
}

TEST_CASE("runtime: device choice by name or kind, with a clear error when nothing matches") {
  vulkan();
  vulkan_options o;
  o.cache_dir = "-";
  o.device = "no-such-device";
  auto none = make_vulkan_executor(o);
  REQUIRE_FALSE(none);
  CHECK(none.error().code == error_code::not_found);
  CHECK(none.error().message.find("no-such-device") != std::string::npos);
  o.device = vulkan().info().kind;
  auto same = make_vulkan_executor(o);
  REQUIRE(same);
  CHECK((*same)->info().name == vulkan().info().name);
  CHECK((*same)->info().subgroup_size > 0);
  CHECK((*same)->info().shared_memory_bytes >= 16384);
}

TEST_CASE("runtime: per-kernel timings from timestamp queries") {
  auto& ex = vulkan();
  builder b;
  auto x = b.input("x", dtype::f32, {64, 64});
  auto w = b.parameter("tw", dtype::f32, {64, 64});
  b.output("y", nn::softmax(matmul(x, w)));
  const graph g = finish(b);
  auto id = ex.load(g);
  REQUIRE(id);
  REQUIRE(ex.run(*id, {{"x", random_tensor(dtype::f32, {64, 64}, 5)}}));
  REQUIRE(ex.run(*id, {{"x", random_tensor(dtype::f32, {64, 64}, 6)}}));
  const auto s = ex.stats();
  REQUIRE(s.kernels.size() == gpu::lower(g).kernels.size());
  for (const auto& k : s.kernels) {
    CHECK(k.runs == 2);
    CHECK(k.total_ms >= 0);
  }
  CHECK(s.kernels[0].flops > 0);  // the matmul comes first
}

TEST_CASE("runtime: unloading programs and dropping parameters gives their memory back, on both back ends") {
  // A node loads a program for every stage it runs: memory must come back, or it only grows.
  builder b;
  auto x = b.input("x", dtype::f32, {64, 32});
  auto w = b.parameter("job.7.w", dtype::f32, {32, 48});
  b.output("y", relu(matmul(x, w)));
  b.update(w, w * 0.5);
  const graph g = finish(b);
  const tensor_map in{{"x", random_tensor(dtype::f32, {64, 32}, 5)}};
  const tensor_map params{{"job.7.w", random_tensor(dtype::f32, {32, 48}, 6)}};
  for (executor* ex : {&vulkan(), &cpu()}) {
    INFO(ex->info().name);
    const uint64_t before = ex->stats().device_bytes;
    for (int round = 0; round < 20; ++round) {
      REQUIRE(ex->set_parameters(params));
      auto id = ex->load(g);
      REQUIRE(id);
      REQUIRE(ex->run(*id, in));
      CHECK(ex->drop_parameters("job.7.") == 0);  // still used by the loaded program
      ex->unload(*id);
      CHECK_FALSE(ex->run(*id, in));  // gone, and the id is not reused
      ex->unload(*id);                // twice: ignored
      CHECK(ex->drop_parameters("job.7.") == 1);
      CHECK_FALSE(ex->get_parameters({"job.7.w"}));
    }
    CHECK(ex->stats().device_bytes == before);
    CHECK(ex->drop_parameters("job.7.") == 0);
  }
}

TEST_CASE("runtime: programs share one scratch arena, a larger program makes a larger one, and the last unload frees it") {
  // Split reductions' partials live in scratch buffers only within a run: every program lays
  // them out in the executor's one arena. Programs a and b (b's partials fit a's) run
  // interleaved and stay right; c needs more: a new arena, while a and b keep the old one, which
  // is the executor's again once c is gone.
  vulkan();
  vulkan_options o;
  o.validation = true;
  o.cache_dir = "-";
  o.split_reductions = 1;
  auto made = make_vulkan_executor(o);
  REQUIRE(made);
  executor& ex = **made;
  const auto program_of = [](int64_t rows) {
    builder b;
    auto x = b.input("x", dtype::f32, {rows, 3});
    b.output("cols", sum(x, {0}));                         // columns: 3 outputs over `rows`
    b.output("loss", mean_all((x - 0.25) * (x - 0.25)));  // rows: one output over everything
    return finish(b);
  };
  const graph ga = program_of(40000), gb = program_of(9000), gc = program_of(400000);
  const tensor_map ia{{"x", random_tensor(dtype::f32, {40000, 3}, 11)}}, ib{{"x", random_tensor(dtype::f32, {9000, 3}, 12)}},
      ic{{"x", random_tensor(dtype::f32, {400000, 3}, 13)}};
  const uint64_t before = ex.stats().device_bytes;
  auto a = ex.load(ga);
  REQUIRE(a);
  const uint64_t with_a = ex.stats().device_bytes;
  CHECK(with_a > before);
  auto b = ex.load(gb);
  REQUIRE(b);
  const uint64_t with_b = ex.stats().device_bytes;
  // b's own buffers (its input and outputs) but no scratch of its own
  CHECK(with_b - with_a <= static_cast<uint64_t>(9000 * 3 * 4 + 4096));
  const reference ra = reference_run(ga, ia, {}), rb = reference_run(gb, ib, {}), rc = reference_run(gc, ic, {});
  const auto check = [&](program_id id, const tensor_map& in, const reference& want) {
    auto out = ex.run(id, in);
    REQUIRE(out);
    for (const auto& [name, w] : want.outputs) {
      INFO("output " << name);
      CHECK(normalised_error(out->at(name), w) <= 1e-4);
    }
  };
  for (int round = 0; round < 2; ++round) {
    check(*a, ia, ra);
    check(*b, ib, rb);
  }
  auto c = ex.load(gc);
  REQUIRE(c);
  check(*c, ic, rc);
  check(*a, ia, ra);  // still on the first arena
  check(*b, ib, rb);
  ex.unload(*c);  // c's arena goes with it (no other program uses it); a and b keep theirs
  CHECK(ex.stats().device_bytes == with_b);
  check(*a, ia, ra);
  auto d = ex.load(ga);  // on a and b's arena again
  REQUIRE(d);
  CHECK(ex.stats().device_bytes - with_b <= static_cast<uint64_t>(40000 * 3 * 4 + 4096));
  check(*d, ia, ra);
  ex.unload(*d);
  ex.unload(*a);
  ex.unload(*b);
  CHECK(ex.stats().device_bytes == before);
  CHECK(ex.stats().validation_errors == 0);
}

namespace {

/// A Vulkan executor that moves every transfer through staging buffers and copy commands, as on
/// a discrete GPU, even where device memory is host-visible (lavapipe).
std::unique_ptr<executor> staged_vulkan() {
  vulkan_options staged;
  staged.cache_dir = "-";
  staged.map_device_memory = false;
  auto ex = make_vulkan_executor(staged);
  REQUIRE(ex);
  return std::move(*ex);
}

}  // namespace

TEST_CASE("runtime: read_parameters and write_parameters move many parameters end to end, on both back ends") {
  // A training step's gradients leave the device this way, and its reduced sum comes back.
  // "big" is larger than both staging halves (16 MiB each) together, so a transfer takes three
  // submissions, the first half is refilled while the second is in flight, and a parameter is
  // split between them (an empty parameter after it); the staged executor copies on 3 threads
  // (MESH_COPY_THREADS). Writes also come from pieces (executor::write_parameters_from).
  const std::vector<std::string> names = {"rw.a", "rw.big", "rw.none", "rw.h", "rw.i"};
  const tensor_map params{{"rw.a", random_tensor(dtype::f32, {3, 5}, 1)},
                          {"rw.none", tensor::zeros(dtype::f32, {0})},
                          {"rw.big", random_tensor(dtype::f32, {10'500'001}, 2)},
                          {"rw.h", random_tensor(dtype::f16, {7}, 3)},
                          {"rw.i", tensor::from_ints({3}, {4, -5, 6})}};
  size_t total = 0;
  for (const auto& n : names) total += params.at(n).bytes.size();
  ::setenv("MESH_COPY_THREADS", "3", 1);
  const auto through_staging = staged_vulkan();
  ::unsetenv("MESH_COPY_THREADS");
  for (executor* ex : {&vulkan(), through_staging.get(), &cpu()}) {
    INFO(ex->info().name << (ex == through_staging.get() ? " (through staging)" : ""));
    REQUIRE(ex->set_parameters(params));
    std::vector<uint8_t> out(total, 0xee);
    REQUIRE(ex->read_parameters(names, out));
    size_t at = 0;
    for (const auto& n : names) {
      const auto& b = params.at(n).bytes;
      CHECK(std::equal(b.begin(), b.end(), out.begin() + static_cast<ptrdiff_t>(at)));
      at += b.size();
    }
    // Written back changed, read as tensors: each parameter got its own bytes.
    for (auto& v : out) v = static_cast<uint8_t>(v ^ 0x5a);
    REQUIRE(ex->write_parameters(names, out));
    auto got = ex->get_parameters(names);
    REQUIRE(got);
    at = 0;
    for (const auto& n : names) {
      const auto& b = got->at(n).bytes;
      CHECK(std::equal(b.begin(), b.end(), out.begin() + static_cast<ptrdiff_t>(at)));
      at += b.size();
    }
    // The same from pieces (a reduced sum whose shares lie in several processes' regions):
    // cut at odd places, one piece empty, one across a staging half's end and a parameter's.
    for (auto& v : out) v = static_cast<uint8_t>(v + 17);
    const size_t cuts[] = {0, 7, 7, 20'000'003, total - 5, total};
    std::vector<std::span<const uint8_t>> pieces;
    for (size_t k = 0; k + 1 < std::size(cuts); ++k) pieces.emplace_back(out.data() + cuts[k], cuts[k + 1] - cuts[k]);
    REQUIRE(ex->write_parameters_from(names, pieces));
    std::vector<uint8_t> back(total, 0);
    REQUIRE(ex->read_parameters(names, back));
    CHECK(back == out);
    // A buffer of another size, or an unknown name: an error that says which, nothing written.
    std::vector<uint8_t> short_by_one(total - 1);
    auto wrong = ex->read_parameters(names, short_by_one);
    REQUIRE_FALSE(wrong);
    CHECK(wrong.error().code == error_code::invalid_argument);
    CHECK_THAT(wrong.error().message, Catch::Contains(std::to_string(total)));
    const std::vector<uint8_t> other(60, 0x11);
    auto unknown = ex->write_parameters({"rw.a", "rw.nothing"}, other);
    REQUIRE_FALSE(unknown);
    CHECK(unknown.error().code == error_code::not_found);
    CHECK_THAT(unknown.error().message, Catch::Contains("rw.nothing"));
    auto still = ex->get_parameters({"rw.a"});
    REQUIRE(still);
    CHECK(std::equal(still->at("rw.a").bytes.begin(), still->at("rw.a").bytes.end(), out.begin()));
    REQUIRE(ex->read_parameters({}, std::span<uint8_t>{}));
    CHECK(ex->drop_parameters("rw.") == 5);
    CHECK(ex->stats().validation_errors == 0);
  }
}

namespace {

/// Pages of shared anonymous memory (as a shared region's), unmapped when it goes.
struct mapped_pages {
  explicit mapped_pages(size_t n) : size(n) {
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    data = static_cast<uint8_t*>(p);
  }
  ~mapped_pages() { ::munmap(data, size); }
  mapped_pages(const mapped_pages&) = delete;
  mapped_pages& operator=(const mapped_pages&) = delete;
  uint8_t* data;
  size_t size;
};

}  // namespace

TEST_CASE("runtime: parameters move straight between the device and imported host memory") {
  // The host all-reduce's gradients go into a shared region and its sums come from several:
  // imported, the device copies them itself (executor::import_host_memory). Through the staged
  // executor (a discrete GPU's path on lavapipe): every byte right, the import counted, and the
  // bytes still right wherever a piece lies outside every import.
  const std::vector<std::string> names = {"imp.a", "imp.none", "imp.big", "imp.h"};
  const tensor_map params{{"imp.a", random_tensor(dtype::f32, {3, 5}, 11)},
                          {"imp.none", tensor::zeros(dtype::f32, {0})},
                          {"imp.big", random_tensor(dtype::f32, {300'001}, 12)},
                          {"imp.h", random_tensor(dtype::f16, {7}, 13)}};
  size_t total = 0;
  for (const auto& n : names) total += params.at(n).bytes.size();
  const auto ex = staged_vulkan();
  INFO(ex->info().name);
  REQUIRE(ex->set_parameters(params));
  mapped_pages own(total + 8192), peer(total + 8192);
  // Data 64 bytes into the pages, as a region's after its header: the import rounds out.
  auto imported_own = ex->import_host_memory({own.data + 64, total});
  auto imported_peer = ex->import_host_memory({peer.data + 64, total});
  REQUIRE(imported_own);
  REQUIRE(imported_peer);
  const uint64_t before = ex->stats().imported_copy_bytes;
  const std::span<uint8_t> into(own.data + 64, total);
  std::fill(into.begin(), into.end(), 0xee);
  REQUIRE(ex->read_parameters(names, into));
  CHECK(ex->stats().imported_copy_bytes == before + total);
  size_t at = 0;
  for (const auto& n : names) {
    const auto& b = params.at(n).bytes;
    CHECK(std::equal(b.begin(), b.end(), into.begin() + static_cast<ptrdiff_t>(at)));
    at += b.size();
  }
  // A sum in pieces from two imports, cut inside a parameter and at an empty piece.
  std::vector<uint8_t> want(total);
  for (size_t i = 0; i < total; ++i) want[i] = static_cast<uint8_t>(i * 131 + 7);
  const size_t cut = 40 + 600'000;
  std::copy(want.begin(), want.begin() + cut, own.data + 64);
  std::copy(want.begin() + cut, want.end(), peer.data + 64 + cut);
  const std::vector<std::span<const uint8_t>> pieces = {{own.data + 64, cut}, {peer.data + 64, 0}, {peer.data + 64 + cut, total - cut}};
  REQUIRE(ex->write_parameters_from(names, pieces));
  CHECK(ex->stats().imported_copy_bytes == before + 2 * total);
  std::vector<uint8_t> back(total);
  REQUIRE(ex->read_parameters(names, back));  // a buffer of no import: through staging
  CHECK(back == want);
  CHECK(ex->stats().imported_copy_bytes == before + 2 * total);
  // One piece outside every import: the whole write goes through staging, and is right.
  std::vector<uint8_t> tail(want.begin() + cut, want.end());
  for (auto& v : tail) v = static_cast<uint8_t>(v ^ 0x3c);
  REQUIRE(ex->write_parameters_from(names, {{own.data + 64, cut}, {tail.data(), tail.size()}}));
  CHECK(ex->stats().imported_copy_bytes == before + 2 * total);
  REQUIRE(ex->read_parameters(names, back));
  CHECK(std::equal(want.begin(), want.begin() + cut, back.begin()));
  CHECK(std::equal(tail.begin(), tail.end(), back.begin() + cut));
  // Released, the import is gone: the same bytes then move through staging.
  imported_peer->reset();
  REQUIRE(ex->read_parameters(names, {peer.data + 64, total}));
  CHECK(ex->stats().imported_copy_bytes == before + 2 * total);
  CHECK(std::equal(back.begin(), back.end(), peer.data + 64));
  // A read-only mapping (as a peer's region is): imported where the driver takes it, else
  // refused with its reason; the write is right either way.
  mapped_pages ro(total + 4096);
  std::copy(want.begin(), want.end(), ro.data);
  REQUIRE(::mprotect(ro.data, ro.size, PROT_READ) == 0);
  auto imported_ro = ex->import_host_memory({ro.data, total});
  const uint64_t ro_before = ex->stats().imported_copy_bytes;
  REQUIRE(ex->write_parameters_from(names, {{ro.data, total}}));
  CHECK(ex->stats().imported_copy_bytes == ro_before + (imported_ro ? total : 0));
  if (!imported_ro) WARN("a read-only mapping is not imported here: " << imported_ro.error().to_string());
  REQUIRE(ex->read_parameters(names, back));
  CHECK(back == want);
  CHECK(ex->stats().validation_errors == 0);
  // The shared executor: where device memory is mapped (lavapipe's default) the host copies,
  // imported or not. NVIDIA's driver (580) imports into one device of a process only (the staged
  // executor's, above): there the bytes move through staging, and are right either way.
  auto& shared = vulkan();
  REQUIRE(shared.set_parameters(params));
  mapped_pages other(total + 4096);
  auto imported_other = shared.import_host_memory({other.data, total});
  if (!imported_other) WARN("a second device of this process imports nothing here: " << imported_other.error().to_string());
  REQUIRE(shared.read_parameters(names, {other.data, total}));
  CHECK(std::equal(params.at("imp.big").bytes.begin(), params.at("imp.big").bytes.end(), other.data + 60));
}

TEST_CASE("runtime: importing host memory is refused with its reason where it cannot be, and a handle may outlive its executor") {
  mapped_pages pages(8192);
  REQUIRE(vulkan().import_host_memory({pages.data, 100}));  // and released at once
  auto on_cpu = cpu().import_host_memory({pages.data, 100});
  REQUIRE_FALSE(on_cpu);
  CHECK(on_cpu.error().code == error_code::unsupported);
  auto ex = staged_vulkan();
  auto nothing = ex->import_host_memory({pages.data, 0});
  REQUIRE_FALSE(nothing);
  CHECK(nothing.error().code == error_code::invalid_argument);
  auto held = ex->import_host_memory({pages.data + 10, 5000});
  REQUIRE(held);
  ex.reset();  // the executor goes first: the handle's release later frees nothing twice
  held->reset();
}

TEST_CASE("runtime: copies beside the kernels: later work waits for the copies it would race with, and only those") {
  // A data-parallel step reads a finished bucket's gradients back while the next segment runs
  // (read_parameters_async) and writes the sums back beside the segments still running
  // (write_parameters_from_async). Through the staged executor (a discrete GPU's path on
  // lavapipe; on NVIDIA the copies go to the copy engines' queue).
  vulkan();  // keeps the driver loaded for the whole process (see harness.hpp): `ex` goes below
  const int64_t n = 200'000;
  builder b;
  const expr acc = b.parameter("lane.acc", dtype::f32, {n});
  b.update(acc, acc * 2.0);
  auto doubling = b.finish();
  builder b2;
  const expr other2 = b2.parameter("lane.other", dtype::f32, {n});
  b2.update(other2, other2 + 1.0);
  auto unrelated = b2.finish();
  builder b3;
  b3.output("total", sum(b3.parameter("lane.acc", dtype::f32, {n}), {0}));
  auto reading = b3.finish();
  REQUIRE(doubling);
  REQUIRE(unrelated);
  REQUIRE(reading);
  auto ex = staged_vulkan();
  INFO(ex->info().name);
  std::vector<float> start(static_cast<size_t>(n));
  for (size_t i = 0; i < start.size(); ++i) start[i] = static_cast<float>(i % 1000) * 0.25f;
  REQUIRE(ex->set_parameters({{"lane.acc", tensor::from_floats({n}, start)}, {"lane.other", tensor::zeros(dtype::f32, {n})}}));
  auto p_double = ex->load(*doubling), p_other = ex->load(*unrelated), p_read = ex->load(*reading);
  REQUIRE(p_double);
  REQUIRE(p_other);
  REQUIRE(p_read);
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  mapped_pages region(bytes + 8192);
  auto imported = ex->import_host_memory({region.data + 64, bytes});
  REQUIRE(imported);
  auto* into = reinterpret_cast<float*>(region.data + 64);
  const auto stats0 = ex->stats();

  // Read back, then a program on other parameters (no wait), then one that updates lane.acc: it
  // waits for the read, which holds the values from before the update.
  auto read = ex->read_parameters_async({"lane.acc"}, {region.data + 64, bytes});
  REQUIRE(read);
  CHECK(ex->stats().async_copies == stats0.async_copies + 1);
  REQUIRE(ex->run(*p_other, {}));
  CHECK(ex->stats().async_copy_waits == stats0.async_copy_waits);
  std::thread waiter([&] { CHECK(read->wait()); });  // the executor actor waits on a thread of its own
  REQUIRE(ex->run(*p_double, {}));
  waiter.join();
  CHECK(ex->stats().async_copy_waits == stats0.async_copy_waits + 1);
  REQUIRE(read->wait());  // again: the same answer
  CHECK(std::equal(start.begin(), start.end(), into));
  CHECK(ex->stats().imported_copy_bytes == stats0.imported_copy_bytes + bytes);

  // A sum written from the region, in two pieces; a program reading lane.acc waits for it and
  // sees it, as does get_parameters after a second write.
  for (size_t i = 0; i < start.size(); ++i) into[i] = static_cast<float>(i % 7);
  const std::vector<std::span<const uint8_t>> pieces = {{region.data + 64, 4000}, {region.data + 64 + 4000, bytes - 4000}};
  auto write = ex->write_parameters_from_async({"lane.acc"}, pieces);
  REQUIRE(write);
  auto total = ex->run(*p_read, {});
  REQUIRE(total);
  CHECK(ex->stats().async_copy_waits == stats0.async_copy_waits + 2);
  double want = 0;
  for (size_t i = 0; i < start.size(); ++i) want += static_cast<double>(i % 7);
  CHECK(total->at("total").to_floats().at(0) == Approx(want).epsilon(1e-6));
  REQUIRE(write->wait());
  for (size_t i = 0; i < start.size(); ++i) into[i] = 3.0f;
  auto again = ex->write_parameters_from_async({"lane.acc"}, pieces);
  REQUIRE(again);
  auto got = ex->get_parameters({"lane.acc"});
  REQUIRE(got);
  CHECK(ex->stats().async_copy_waits == stats0.async_copy_waits + 3);
  CHECK(got->at("lane.acc").to_floats() == std::vector<float>(static_cast<size_t>(n), 3.0f));

  // Host bytes outside every import: copied before the call returns, nothing left to wait for.
  std::vector<uint8_t> plain(bytes);
  const uint64_t copies = ex->stats().async_copies;
  auto staged = ex->read_parameters_async({"lane.other"}, plain);
  REQUIRE(staged);
  CHECK_FALSE(staged->wait_for_it);
  CHECK(ex->stats().async_copies == copies);
  CHECK(reinterpret_cast<const float*>(plain.data())[5] == 1.0f);  // lane.other after one run
  // Errors name what was wrong and leave nothing in flight.
  auto unknown = ex->read_parameters_async({"lane.nothing"}, {region.data + 64, bytes});
  REQUIRE_FALSE(unknown);
  CHECK(unknown.error().code == error_code::not_found);
  CHECK_THAT(unknown.error().message, Catch::Contains("lane.nothing"));
  auto short_buffer = ex->write_parameters_from_async({"lane.acc"}, {{region.data + 64, bytes - 4}});
  REQUIRE_FALSE(short_buffer);
  CHECK(short_buffer.error().code == error_code::invalid_argument);
  CHECK(ex->stats().async_copies == copies);

  // The CPU back end copies before the call returns.
  REQUIRE(cpu().set_parameters({{"lane.cpu", tensor::from_floats({3}, {1, 2, 3})}}));
  std::vector<uint8_t> three(12);
  auto on_cpu = cpu().read_parameters_async({"lane.cpu"}, three);
  REQUIRE(on_cpu);
  CHECK_FALSE(on_cpu->wait_for_it);
  CHECK(reinterpret_cast<const float*>(three.data())[2] == 3.0f);
  CHECK(cpu().drop_parameters("lane.") == 1);

  // A copy still in flight when its executor goes: its wait, later, answers and touches nothing.
  auto last = ex->read_parameters_async({"lane.acc"}, {region.data + 64, bytes});
  REQUIRE(last);
  CHECK(ex->stats().validation_errors == 0);
  ex.reset();
  CHECK(last->wait());
  CHECK(into[17] == 3.0f);
}

TEST_CASE("runtime: run_repeated runs a program back to back, each run seeing the updates of the one before") {
  // A counter that each run reads, writes into a history at its own value (kv_write), and
  // increments: the state a greedy decode step carries from run to run. Through staging too
  // (the input and output copies of every run in the submission).
  builder b;
  const expr count = b.parameter("rep.count", dtype::i32, {1});
  const expr history = b.parameter("rep.history", dtype::f32, {8, 1});
  const expr step = b.input("step", dtype::f32, {1});
  const expr value = reshape(cast(count, dtype::f32) * step, {1, 1});
  b.update(history, kv_write(history, value, count, 0));
  b.update(count, count + 1.0);
  b.output("seen", count * 10.0);
  auto g = b.finish();
  REQUIRE(g);
  const auto through_staging = staged_vulkan();
  for (executor* ex : {&vulkan(), through_staging.get(), &cpu()}) {
    INFO(ex->info().name << (ex == through_staging.get() ? " (through staging)" : ""));
    auto id = ex->load(*g);
    REQUIRE(id);
    const tensor_map in{{"step", tensor::from_floats({1}, {0.5f})}};
    auto out = ex->run_repeated(*id, in, 5);
    REQUIRE(out);
    CHECK(out->at("seen").to_floats() == std::vector<float>{40.0f});  // the last run's: count 4
    auto state = ex->get_parameters({"rep.count", "rep.history"});
    REQUIRE(state);
    CHECK(state->at("rep.count").to_floats() == std::vector<float>{5.0f});
    CHECK(state->at("rep.history").to_floats() == std::vector<float>{0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 0.0f, 0.0f, 0.0f});
    const auto runs = ex->stats().runs;
    REQUIRE(ex->run_repeated(*id, in, 1));  // one more: as run()
    CHECK(ex->get_parameters({"rep.count"})->at("rep.count").to_floats() == std::vector<float>{6.0f});
    if (ex != &cpu()) CHECK(ex->stats().runs == runs + 1);
    for (const int64_t n : {int64_t{0}, executor::max_repeated_runs + 1}) {
      auto bad = ex->run_repeated(*id, in, n);
      REQUIRE_FALSE(bad);
      CHECK(bad.error().code == error_code::invalid_argument);
      CHECK_THAT(bad.error().message, Catch::Contains(std::to_string(n)));
    }
    CHECK(ex->get_parameters({"rep.count"})->at("rep.count").to_floats() == std::vector<float>{6.0f});
    ex->unload(*id);
    CHECK(ex->drop_parameters("rep.") == 2);
    CHECK(ex->stats().validation_errors == 0);
  }
}

TEST_CASE("runtime: MemAvailable is read from /proc/meminfo's text, and malformed text is refused") {
  CHECK(parse_mem_available("MemTotal:       24576000 kB\nMemFree:         1000 kB\nMemAvailable:   20480000 kB\n") ==
        uint64_t{20480000} * 1024);
  CHECK(parse_mem_available("MemAvailable: 7 kB") == uint64_t{7} * 1024);
  CHECK_FALSE(parse_mem_available("MemTotal: 100 kB\n"));           // no such line
  CHECK_FALSE(parse_mem_available("MemAvailable: kB\n"));           // no number
  CHECK_FALSE(parse_mem_available("MemAvailable: 12 MB\n"));        // another unit
  CHECK_FALSE(parse_mem_available("MemAvailable: 99999999999999999999 kB\n"));  // past 64 bits as bytes
  CHECK(parse_mem_available(std::string_view("MemAvailable: 1 kB", 17)) == std::nullopt);  // cut short
}

TEST_CASE("runtime: the memory probe says how much of each device is free, and the figure falls as the device fills") {
  // The CPU back end: the host's available memory.
  auto cpu = make_cpu_executor(1);
  auto host = make_memory_probe(cpu->info());
  CHECK(host->source() == memory_source::host_available);
  CHECK(host->free_bytes() > 0);
  // The Vulkan device: found again by its UUID, a new probe on each call.
  auto& ex = vulkan();
  CHECK(std::any_of(ex.info().uuid.begin(), ex.info().uuid.end(), [](uint8_t b) { return b != 0; }));
  auto probe = make_memory_probe(ex.info());
  const uint64_t before = probe->free_bytes();
  INFO(ex.info().name << ": " << to_string(probe->source()) << ", " << before << " of " << ex.info().memory_bytes << " bytes free");
  CHECK(before > 0);
  CHECK(before <= ex.info().memory_bytes);
  if (ex.info().kind == "cpu") CHECK(probe->source() == memory_source::host_available);
  if (probe->source() != memory_source::driver_budget) return;  // the host's figure moves with every process
  // The driver's budget: 512 MiB of parameters on another executor of the device show.
  vulkan_options o;
  o.cache_dir = "-";
  o.device = ex.info().name;
  auto other = make_vulkan_executor(o);
  REQUIRE(other);
  REQUIRE((*other)->set_parameters({{"filler", tensor::zeros(dtype::f32, {int64_t{128} << 20})}}));
  const uint64_t after = probe->free_bytes();
  INFO("after 512 MiB: " << after);
  CHECK(before - after >= uint64_t{480} << 20);
}
