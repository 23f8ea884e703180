#pragma once
/// Which of the CPU executor's kernel sets this CPU runs: the AVX2+FMA ones where the CPU has
/// AVX2, FMA and F16C (checked at run time: the binaries target baseline x86-64), else the
/// portable ones (plain C++ that the compiler vectorises for the baseline).
namespace mesh::gpu {

enum class cpu_isa {
  portable,  ///< plain C++
  avx2,      ///< AVX2 + FMA + F16C (x86-64 only)
};

/// What this CPU supports.
cpu_isa supported_isa();

/// supported_isa(), or portable when the environment variable MESH_CPU_PORTABLE is set to
/// anything but "0" (to compare the two, or to work around a kernel bug). Read once.
cpu_isa default_isa();

const char* to_string(cpu_isa isa);

}  // namespace mesh::gpu
