#pragma once
// SPIR-V helpers for the codegen tests: compile GLSL with the project's shaderc settings, count
// what a module holds, and run an external validator ($MESH_SPIRV_VAL, one that knows
// SPV_KHR_cooperative_matrix and SPV_KHR_bfloat16: dev.sh fetches Debian testing's spirv-val,
// Debian 12's knows neither).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gpu/shader_cache.hpp"

namespace mesh::gpu::test {

/// `glsl` compiled (and optimised, unless not `optimize`) as the executors compile kernels; the
/// test fails on an error.
inline std::vector<uint32_t> compile_glsl(const std::string& glsl, bool optimize = true) {
  static shader_cache optimized("", "spirv-test"), plain("", "spirv-test", false);
  auto words = (optimize ? optimized : plain).get("test", glsl);
  if (!words) FAIL(words.error().message << "\n" << glsl);
  return *words;
}

/// What a module holds, for the rewrite's checks.
struct spirv_summary {
  std::map<uint32_t, int> opcodes;
  std::multiset<uint32_t> capabilities;
  std::multiset<std::string> extensions;
  int bf16_floats = 0;                 ///< OpTypeFloat 16 BFloat16KHR
  std::multiset<uint32_t> matrix_uses;  ///< the Use constant of each OpTypeCooperativeMatrixKHR
  std::multiset<uint32_t> bf16_matrix_uses;  ///< the same, of those on bf16
  std::multiset<uint32_t> load_layouts;  ///< the MemoryLayout constant of each OpCooperativeMatrixLoadKHR
  uint32_t bound = 0;
  int count(uint32_t op) const {
    auto it = opcodes.find(op);
    return it == opcodes.end() ? 0 : it->second;
  }
};

inline spirv_summary summarize(const std::vector<uint32_t>& w) {
  spirv_summary s;
  REQUIRE(w.size() >= 5);
  s.bound = w[3];
  std::map<uint32_t, uint32_t> constants;  // OpConstant id -> value (32-bit)
  std::set<uint32_t> bf16_types;
  for (size_t i = 5; i < w.size();) {
    const uint32_t n = w[i] >> 16, op = w[i] & 0xffff;
    REQUIRE(n > 0);
    REQUIRE(i + n <= w.size());
    ++s.opcodes[op];
    if (op == 17) s.capabilities.insert(w[i + 1]);
    if (op == 10) s.extensions.insert(std::string(reinterpret_cast<const char*>(&w[i + 1])));
    if (op == 22 && n == 4 && w[i + 2] == 16 && w[i + 3] == 0) ++s.bf16_floats, bf16_types.insert(w[i + 1]);
    if (op == 43 && n == 4) constants[w[i + 2]] = w[i + 3];
    if (op == 4456 && n == 7) {
      const uint32_t use = constants.count(w[i + 6]) ? constants[w[i + 6]] : 99u;
      s.matrix_uses.insert(use);
      if (bf16_types.count(w[i + 2])) s.bf16_matrix_uses.insert(use);
    }
    if (op == 4457 && n >= 5) s.load_layouts.insert(constants.count(w[i + 4]) ? constants[w[i + 4]] : 99u);
    i += n;
  }
  return s;
}

/// Runs $MESH_SPIRV_VAL on `words` (Vulkan 1.1, the executors' target); a warning that says the
/// check was skipped when it is not set.
inline void check_valid(const std::vector<uint32_t>& words, const std::string& what) {
  const char* val = std::getenv("MESH_SPIRV_VAL");
  if (!val || !*val) {
    WARN("SPIR-V validation of " << what << " skipped: MESH_SPIRV_VAL is not set (./dev.sh test fetches a validator)");
    return;
  }
  const std::string path = "/tmp/mesh-spirv-check-" + std::to_string(getpid()) + ".spv";
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(words.data()), static_cast<std::streamsize>(words.size() * 4));
  const std::string cmd = std::string(val) + " --target-env vulkan1.1 " + path + " 2>&1";
  std::string output;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) output += buf;
  const int rc = pclose(p);
  std::remove(path.c_str());
  INFO("spirv-val on " << what << ":\n" << output);
  CHECK(rc == 0);
}

}  // namespace mesh::gpu::test
