// The NV -> KHR cooperative-matrix rewrite (gpu/spirv_coopmat.hpp) on modules shaderc compiles:
// the structure of what it writes, the SPIR-V validator's verdict on it (a validator that knows
// SPV_KHR_bfloat16, $MESH_SPIRV_VAL: dev.sh fetches one), and the modules it refuses.
#include "spirv_check.hpp"

#include <catch2/catch.hpp>

#include "gpu/spirv_coopmat.hpp"

using namespace mesh;
using namespace mesh::gpu::test;

namespace {

const char* const header =
    "#version 450\n#extension GL_EXT_shader_16bit_storage : require\n"
    "#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require\n"
    "#extension GL_NV_cooperative_matrix : require\n#extension GL_KHR_memory_scope_semantics : require\n"
    "layout(local_size_x = 32) in;\n"
    "layout(std430, binding = 0) buffer C { float v[]; } c;\n"
    "layout(std430, binding = 1) readonly buffer A { uvec4 v[]; } a;\n"
    "layout(std430, binding = 2) readonly buffer B { uvec4 v[]; } b;\n"
    "shared uvec4 As[32];\nshared uvec4 Bs[32];\n";

/// A 16x16x16 product: A row-major, B column-major, both 16-bit fragments of one NV type.
const char* const gemm_body =
    "void main() {\n  const uint t = gl_LocalInvocationID.x;\n  As[t] = a.v[t];\n  Bs[t] = b.v[t];\n  barrier();\n"
    "  fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> fa, fb;\n"
    "  fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> acc = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);\n"
    "  coopMatLoadNV(fa, As, 0, 2, false);\n  coopMatLoadNV(fb, Bs, 0, 2, true);\n"
    "  acc = coopMatMulAddNV(fa, fb, acc);\n  coopMatStoreNV(acc, c.v, 0, 16, false);\n}\n";

}  // namespace

TEST_CASE("spirv: an NV cooperative-matrix product becomes a KHR one, its A and B told apart, on f16 or bf16") {
  const auto nv = compile_glsl(std::string(header) + gemm_body);
  for (bool bf16 : {false, true}) {
    INFO((bf16 ? "bf16" : "f16"));
    auto out = gpu::khr_cooperative_matrices(nv, bf16);
    REQUIRE(out.has_value());
    const spirv_summary s = summarize(*out);
    for (uint32_t nv_op = 5358; nv_op <= 5362; ++nv_op) CHECK(s.count(nv_op) == 0);
    CHECK(s.capabilities.count(6022) == 1);  // CooperativeMatrixKHR
    CHECK(s.capabilities.count(5357) == 0);  // CooperativeMatrixNV
    CHECK(s.extensions.count("SPV_KHR_cooperative_matrix") == 1);
    CHECK(s.extensions.count("SPV_NV_cooperative_matrix") == 0);
    CHECK(s.extensions.count("SPV_KHR_bfloat16") == (bf16 ? 1u : 0u));
    CHECK(s.capabilities.count(5116) == (bf16 ? 1u : 0u));  // BFloat16TypeKHR
    CHECK(s.capabilities.count(5118) == (bf16 ? 1u : 0u));  // BFloat16CooperativeMatrixKHR
    CHECK(s.bf16_floats == (bf16 ? 1 : 0));
    // One NV f16 type became two KHR types (A, B); the f32 accumulator a third.
    CHECK(s.matrix_uses == std::multiset<uint32_t>{0, 1, 2});
    CHECK(s.count(4457) == 2);  // loads
    CHECK(s.count(4458) == 1);  // store
    CHECK(s.count(4459) == 1);  // product
    CHECK(s.load_layouts == std::multiset<uint32_t>{0, 1});  // RowMajorKHR for A, ColumnMajorKHR for B
    CHECK(s.bound > nv[3]);
    check_valid(*out, bf16 ? "bf16 product" : "f16 product");
  }
}

TEST_CASE("spirv: the rewrite refuses what it cannot carry over, naming it") {
  SECTION("one fragment as both A and B of a product") {
    const std::string body =
        "void main() {\n  fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> fa;\n"
        "  fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> acc = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);\n"
        "  coopMatLoadNV(fa, As, 0, 2, false);\n  acc = coopMatMulAddNV(fa, fa, acc);\n  coopMatStoreNV(acc, c.v, 0, 16, false);\n}\n";
    auto out = gpu::khr_cooperative_matrices(compile_glsl(std::string(header) + body), false);
    REQUIRE_FALSE(out.has_value());
    CHECK(out.error().code == error_code::unsupported);
    CHECK_THAT(out.error().message, Catch::Contains("both a product's A and its B"));
  }
  SECTION("arithmetic on a 16-bit float, which bf16 does not allow (f16 keeps it)") {
    std::string body = gemm_body;
    body.insert(body.rfind('}'), "  c.v[300] = float(float16_t(c.v[301]) * float16_t(c.v[302]));\n");
    const auto nv = compile_glsl(std::string(header) + body);
    auto out = gpu::khr_cooperative_matrices(nv, true);
    REQUIRE_FALSE(out.has_value());
    CHECK_THAT(out.error().message, Catch::Contains("computes with a 16-bit float"));
    auto f16 = gpu::khr_cooperative_matrices(nv, false);
    REQUIRE(f16.has_value());
    check_valid(*f16, "f16 product with f16 arithmetic");
  }
  SECTION("a matrix's length (per invocation), which depends on its use") {
    std::string body = gemm_body;
    body.insert(body.rfind('}'), "  c.v[300] = float(fa.length());\n");
    // Unoptimised: the optimiser folds the length into a constant.
    auto out = gpu::khr_cooperative_matrices(compile_glsl(std::string(header) + body, false), false);
    REQUIRE_FALSE(out.has_value());
    CHECK_THAT(out.error().message, Catch::Contains("OpCooperativeMatrixLengthNV"));
  }
  SECTION("no cooperative matrices, or not SPIR-V at all") {
    const auto plain = compile_glsl("#version 450\nlayout(local_size_x = 1) in;\nlayout(std430, binding = 0) buffer C { float v[]; } c;\n"
                                    "void main() { c.v[0] = 1.0; }\n");
    auto out = gpu::khr_cooperative_matrices(plain, true);
    REQUIRE_FALSE(out.has_value());
    CHECK_THAT(out.error().message, Catch::Contains("no NV cooperative matrices"));
    std::vector<uint32_t> cut = compile_glsl(std::string(header) + gemm_body);
    cut.back() = (5u << 16) | 56u;  // OpFunctionEnd claims 5 words where 1 is left
    auto truncated = gpu::khr_cooperative_matrices(cut, true);
    REQUIRE_FALSE(truncated.has_value());
    CHECK_THAT(truncated.error().message, Catch::Contains("truncated instruction"));
    CHECK_FALSE(gpu::khr_cooperative_matrices({1, 2, 3}, true).has_value());
  }
}
