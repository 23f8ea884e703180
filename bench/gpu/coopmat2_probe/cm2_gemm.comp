#version 450
#extension GL_EXT_control_flow_attributes : enable
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : enable
#extension GL_KHR_cooperative_matrix : enable
#extension GL_NV_cooperative_matrix2 : enable

layout(local_size_x_id = 0, local_size_y = 1, local_size_z = 1) in;
layout(constant_id = 1) const uint BM = 128;
layout(constant_id = 2) const uint BN = 256;
layout(constant_id = 3) const uint BK = 64;

layout(push_constant) uniform params { uint M; uint N; uint K; } p;
layout(binding = 0) readonly buffer A { float16_t a[]; };
layout(binding = 1) readonly buffer B { float16_t b[]; };
layout(binding = 2) writeonly buffer C { float16_t c[]; };

void main() {
  const uint tiles_m = p.M / BM;
  const uint tm = gl_WorkGroupID.x % tiles_m;
  const uint tn = gl_WorkGroupID.x / tiles_m;
  tensorLayoutNV<2> la = createTensorLayoutNV(2);
  tensorLayoutNV<2> lb = createTensorLayoutNV(2);
  tensorLayoutNV<2> lc = createTensorLayoutNV(2);
  la = setTensorLayoutDimensionNV(la, p.M, p.K);
  lb = setTensorLayoutDimensionNV(lb, p.K, p.N);
  lc = setTensorLayoutDimensionNV(lc, p.M, p.N);
  coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> acc =
      coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(0.0);
  for (uint k = 0; k < p.K; k += BK) {
    coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA> ma;
    coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> mb;
    coopMatLoadTensorNV(ma, a, 0, sliceTensorLayoutNV(la, tm * BM, BM, k, BK));
    coopMatLoadTensorNV(mb, b, 0, sliceTensorLayoutNV(lb, k, BK, tn * BN, BN));
    acc = coopMatMulAdd(ma, mb, acc);
  }
  coopmat<float16_t, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> res =
      coopmat<float16_t, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(acc);
  coopMatStoreTensorNV(res, c, 0, sliceTensorLayoutNV(lc, tm * BM, BM, tn * BN, BN));
}
