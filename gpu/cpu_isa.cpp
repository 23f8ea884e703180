#include "gpu/cpu_isa.hpp"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace mesh::gpu {

cpu_isa supported_isa() {
#if defined(__x86_64__)
  static const bool avx2 = [] {
    // CPUID leaf 1 ECX: bit 12 FMA, bit 29 F16C (clang has no "f16c" for __builtin_cpu_supports).
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 12)) != 0 && (c & (1u << 29)) != 0;
  }();
  if (avx2) return cpu_isa::avx2;
#endif
  return cpu_isa::portable;
}

cpu_isa default_isa() {
  static const cpu_isa isa = [] {
    const char* forced = std::getenv("MESH_CPU_PORTABLE");
    return forced && *forced && std::strcmp(forced, "0") != 0 ? cpu_isa::portable : supported_isa();
  }();
  return isa;
}

const char* to_string(cpu_isa isa) { return isa == cpu_isa::avx2 ? "avx2" : "portable"; }

}  // namespace mesh::gpu
