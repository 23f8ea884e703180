// GLSL decoders of ggml's quantized blocks (graph/quant.hpp has the layouts and the CPU
// reference they are tested against). A quantized tensor is bound as a `uint v[]` buffer (its
// allocation rounded up to 4 bytes) and read through functions named after its binding:
//   <b>_dq(i)          element i of the tensor (flat index, any kernel's index arithmetic);
//   <b>_chunk(r, c, v) elements [32c, 32c + 32) of row r into v[32], whole 32-bit words at a time
//                      (the matrix-vector kernel: one block header per 32 values).
// Every block size is even and every field sits at an even offset, so a 16-bit field never
// straddles a word and a 32-bit read at an even offset spans at most two words.
#include "gpu/glsl_emitter.hpp"
#include "graph/quant.hpp"

namespace mesh::gpu::detail {
namespace {

/// Byte, 16-bit and 32-bit (even offset) reads of buffer `b`, and an f16 field.
std::string readers(const std::string& b) {
  std::string s;
  s += "uint " + b + "_u8(uint o) { return (" + b + ".v[o >> 2] >> ((o & 3u) << 3)) & 255u; }\n";
  s += "uint " + b + "_u16(uint o) { return (" + b + ".v[o >> 2] >> ((o & 2u) << 3)) & 65535u; }\n";
  s += "uint " + b + "_u32(uint o) { uint w = o >> 2; return (o & 2u) == 0u ? " + b + ".v[w] : (" + b + ".v[w] >> 16) | (" + b +
       ".v[w + 1u] << 16); }\n";
  s += "float " + b + "_f16(uint o) { return unpackHalf2x16(" + b + "_u16(o)).x; }\n";
  return s;
}

}  // namespace

std::string quant_decoders(const node& n, const std::string& b) {
  const dtype t = n.type;
  const int64_t k = n.dims.back(), rb = *row_bytes(t, k), be = block_elements(t), bb = block_bytes(t);
  std::string s = readers(b);
  // Element i: its row, its block's byte offset o and its index j in the block.
  const std::string locate = "  uint r = i / " + u(k) + ", c = i % " + u(k) + ", o = r * " + u(rb) + " + (c / " + u(be) +
                             ") * " + u(bb) + ", j = c % " + u(be) + ";\n";
  switch (t) {
    case dtype::q8_0:
      s += "float " + b + "_dq(uint i) {\n" + locate + "  return " + b + "_f16(o) * float(int(" + b + "_u8(o + 2u + j) << 24) >> 24);\n}\n";
      s += "void " + b + "_chunk(uint r, uint c, out float v[32]) {\n  uint o = r * " + u(rb) + " + c * 34u;\n  float d = " + b +
           "_f16(o);\n  [[unroll]] for (uint w = 0u; w < 8u; ++w) {\n    uint q = " + b + "_u32(o + 2u + 4u * w);\n" +
           "    [[unroll]] for (uint e = 0u; e < 4u; ++e) v[4u * w + e] = d * float(int(q << (24u - 8u * e)) >> 24);\n  }\n}\n";
      break;
    case dtype::q4_0:
      s += "float " + b + "_dq(uint i) {\n" + locate + "  uint q = " + b + "_u8(o + 2u + (j & 15u));\n  q = j < 16u ? q & 15u : q >> 4;\n  return " +
           b + "_f16(o) * (float(q) - 8.0);\n}\n";
      s += "void " + b + "_chunk(uint r, uint c, out float v[32]) {\n  uint o = r * " + u(rb) + " + c * 18u;\n  float d = " + b +
           "_f16(o);\n  [[unroll]] for (uint w = 0u; w < 4u; ++w) {\n    uint q = " + b + "_u32(o + 2u + 4u * w);\n" +
           "    [[unroll]] for (uint e = 0u; e < 4u; ++e) {\n      uint x = (q >> (8u * e)) & 255u;\n" +
           "      v[4u * w + e] = (float(x & 15u) - 8.0) * d;\n      v[4u * w + e + 16u] = (float(x >> 4) - 8.0) * d;\n    }\n  }\n}\n";
      break;
    case dtype::q4_k:
      // Scale and min of sub-block j (0..7) from the 12 packed bytes at o + 4.
      s += "vec2 " + b + "_sm(uint o, uint j) {\n  uint p = o + 4u;\n  if (j < 4u) return vec2(float(" + b + "_u8(p + j) & 63u), float(" + b +
           "_u8(p + j + 4u) & 63u));\n  return vec2(float((" + b + "_u8(p + j + 4u) & 15u) | ((" + b + "_u8(p + j - 4u) >> 6) << 4)), float((" + b +
           "_u8(p + j + 4u) >> 4) | ((" + b + "_u8(p + j) >> 6) << 4)));\n}\n";
      s += "float " + b + "_dq(uint i) {\n" + locate + "  uint sub = j / 32u;\n  uint q = " + b +
           "_u8(o + 16u + 32u * (sub / 2u) + j % 32u);\n  q = (sub & 1u) == 0u ? q & 15u : q >> 4;\n  vec2 sm = " + b +
           "_sm(o, sub);\n  return " + b + "_f16(o) * sm.x * float(q) - " + b + "_f16(o + 2u) * sm.y;\n}\n";
      s += "void " + b + "_chunk(uint r, uint c, out float v[32]) {\n  uint o = r * " + u(rb) + " + (c / 8u) * 144u, sub = c % 8u;\n  vec2 sm = " + b +
           "_sm(o, sub);\n  float d = " + b + "_f16(o) * sm.x, m = " + b + "_f16(o + 2u) * sm.y;\n  uint shift = (sub & 1u) * 4u;\n" +
           "  [[unroll]] for (uint w = 0u; w < 8u; ++w) {\n    uint q = " + b + ".v[(o + 16u + 32u * (sub / 2u)) / 4u + w] >> shift;\n" +
           "    [[unroll]] for (uint e = 0u; e < 4u; ++e) v[4u * w + e] = d * float((q >> (8u * e)) & 15u) - m;\n  }\n}\n";
      break;
    case dtype::q6_k:
      s += "float " + b + "_dq(uint i) {\n" + locate +
           "  uint h = j / 128u, quad = (j % 128u) / 32u, l = j % 32u;\n  uint ql = " + b + "_u8(o + 64u * h + l + 32u * (quad & 1u));\n" +
           "  uint lo = quad < 2u ? ql & 15u : ql >> 4;\n  uint hi = (" + b + "_u8(o + 128u + 32u * h + l) >> (2u * quad)) & 3u;\n" +
           "  int sc = int(" + b + "_u8(o + 192u + 8u * h + l / 16u + 2u * quad) << 24) >> 24;\n  return " + b +
           "_f16(o + 208u) * float(sc) * float(int(lo | (hi << 4)) - 32);\n}\n";
      s += "void " + b + "_chunk(uint r, uint c, out float v[32]) {\n  uint o = r * " + u(rb) + " + (c / 8u) * 210u, sub = c % 8u;\n" +
           "  uint h = sub / 4u, quad = sub % 4u, qlo = o + 64u * h + 32u * (quad & 1u), qho = o + 128u + 32u * h;\n" +
           "  uint so = o + 192u + 8u * h + 2u * quad;\n  float d = " + b + "_f16(o + 208u);\n" +
           "  float d0 = d * float(int(" + b + "_u8(so) << 24) >> 24), d1 = d * float(int(" + b + "_u8(so + 1u) << 24) >> 24);\n" +
           "  uint lshift = quad < 2u ? 0u : 4u, hshift = 2u * quad;\n" +
           "  [[unroll]] for (uint w = 0u; w < 8u; ++w) {\n    uint ql = " + b + "_u32(qlo + 4u * w) >> lshift, qh = " + b +
           "_u32(qho + 4u * w) >> hshift;\n" +
           "    [[unroll]] for (uint e = 0u; e < 4u; ++e) {\n      int q = int(((ql >> (8u * e)) & 15u) | (((qh >> (8u * e)) & 3u) << 4)) - 32;\n" +
           "      v[4u * w + e] = (w < 4u ? d0 : d1) * float(q);\n    }\n  }\n}\n";
      break;
    default: break;
  }
  return s;
}

}  // namespace mesh::gpu::detail
