#include "gpu/shader_cache.hpp"

#include <shaderc/shaderc.h>
#include <sodium.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace mesh::gpu {

uint64_t fnv1a(std::string_view s, uint64_t h) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string default_cache_dir() {
  if (const char* d = std::getenv("MESH_KERNEL_CACHE"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/meshnode/kernels";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/meshnode/kernels";
  return "";
}

namespace {

shaderc_compiler_t as_compiler(void* p) { return static_cast<shaderc_compiler_t>(p); }

std::string hex(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

/// Reads an entry written by get(): the content digest, then SPIR-V. False unless the digest is
/// `want` (another kernel whose 64-bit key collides, a torn or planted file) and the SPIR-V
/// looks whole.
bool read_entry(const std::string& path, const shader_digest& want, std::vector<uint32_t>& words) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (bytes.size() < want.size() + 20 || (bytes.size() - want.size()) % 4 != 0) return false;
  if (sodium_memcmp(bytes.data(), want.data(), want.size()) != 0) return false;
  words.resize((bytes.size() - want.size()) / 4);
  std::memcpy(words.data(), bytes.data() + want.size(), bytes.size() - want.size());
  return words[0] == 0x07230203u;
}

}  // namespace

shader_cache::shader_cache(std::string dir, std::string device_key, bool optimize)
    : dir_(std::move(dir)), device_key_(std::move(device_key)), optimize_(optimize), compiler_(shaderc_compiler_initialize()) {
  if (sodium_init() < 0) dir_.clear();  // no digests: no disk entries (memory entries still match on content)
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) dir_.clear();  // an unwritable cache directory only costs compiles
  }
}

shader_cache::~shader_cache() {
  if (warm_.joinable()) warm_.join();
  shaderc_compiler_release(as_compiler(compiler_));
}

void shader_cache::warm_up() {
  if (warm_.joinable()) return;
  warm_ = std::thread([this] {
    std::lock_guard lock(mutex_);
    const char* src = "#version 450\nlayout(local_size_x = 1) in;\nvoid main() {}\n";
    auto* r = shaderc_compile_into_spv(as_compiler(compiler_), src, std::strlen(src), shaderc_compute_shader,
                                       "warm_up", "main", nullptr);
    shaderc_result_release(r);
  });
}

shader_digest shader_cache::digest(const std::string& glsl) const {
  // Everything the key hashes, with lengths, so that no two inputs run together.
  shader_digest d{};
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, d.size());
  const auto add = [&](std::string_view part) {
    const uint64_t n = part.size();
    crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(&n), sizeof n);
    crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(part.data()), part.size());
  };
  add(device_key_);
  add(optimize_ ? "O" : "O0");
  add(glsl);
  crypto_generichash_final(&st, d.data(), d.size());
  return d;
}

expected<std::vector<uint32_t>> shader_cache::get(const std::string& name, const std::string& glsl) {
  std::lock_guard lock(mutex_);
  // The 64-bit key only finds the slot (and names the file); a hit counts only when the
  // content digest matches too, so a colliding kernel is never handed another's SPIR-V.
  const uint64_t key = fnv1a(glsl, fnv1a(optimize_ ? "O" : "O0", fnv1a(device_key_)));
  const shader_digest want = digest(glsl);
  if (auto it = memory_.find(key); it != memory_.end() && it->second.digest == want) {
    ++counters_.memory_hits;
    return it->second.words;
  }
  const std::string path = dir_.empty() ? "" : dir_ + "/" + hex(key) + ".spv";
  std::vector<uint32_t> words;
  if (!path.empty() && read_entry(path, want, words)) {
    ++counters_.disk_hits;
    memory_[key] = {want, words};
    return words;
  }
  auto compiled = compile_locked(name, glsl);
  if (!compiled) return compiled;
  memory_[key] = {want, *compiled};
  if (!path.empty()) {
    const std::string tmp = path + ".tmp" + std::to_string(reinterpret_cast<uintptr_t>(this));
    std::ofstream f(tmp, std::ios::binary);
    f.write(reinterpret_cast<const char*>(want.data()), static_cast<std::streamsize>(want.size()));
    f.write(reinterpret_cast<const char*>(compiled->data()), static_cast<std::streamsize>(compiled->size() * 4));
    f.close();
    std::error_code ec;
    if (f) std::filesystem::rename(tmp, path, ec);
    else std::filesystem::remove(tmp, ec);
  }
  return compiled;
}

expected<std::vector<uint32_t>> shader_cache::compile_locked(const std::string& name, const std::string& glsl) {
  const auto t0 = std::chrono::steady_clock::now();
  shaderc_compile_options_t opts = shaderc_compile_options_initialize();
  shaderc_compile_options_set_target_env(opts, shaderc_target_env_vulkan, shaderc_env_version_vulkan_1_1);
  shaderc_compile_options_set_optimization_level(
      opts, optimize_ ? shaderc_optimization_level_performance : shaderc_optimization_level_zero);
  shaderc_compilation_result_t r = shaderc_compile_into_spv(as_compiler(compiler_), glsl.data(), glsl.size(),
                                                             shaderc_compute_shader, name.c_str(), "main", opts);
  shaderc_compile_options_release(opts);
  expected<std::vector<uint32_t>> out;
  if (shaderc_result_get_compilation_status(r) != shaderc_compilation_status_success) {
    out = make_error(error_code::internal, "shaderc failed on kernel " + name + ": " + shaderc_result_get_error_message(r));
  } else {
    const size_t bytes = shaderc_result_get_length(r);
    std::vector<uint32_t> words(bytes / 4);
    std::memcpy(words.data(), shaderc_result_get_bytes(r), bytes);
    out = std::move(words);
  }
  shaderc_result_release(r);
  ++counters_.compiles;
  counters_.compile_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

compile_counters shader_cache::counters() const {
  std::lock_guard lock(mutex_);
  return counters_;
}

}  // namespace mesh::gpu
