// GLSL decoders of ggml's quantized blocks (graph/quant.hpp has the layouts and the CPU
// reference they are tested against). A quantized tensor is bound as a `uint v[]` buffer (its
// allocation rounded up to 4 bytes) and read through functions named after its binding:
//   <b>_dq(i)          element i of the tensor (flat index, any kernel's index arithmetic);
//   <b>_chunk(r, c, v) elements [32c, 32c + 32) of row r into v[32], whole 32-bit words at a time
//                      (the matrix-vector kernel: one block header per 32 values), through
//   <b>_chunk_at(o, sub, v), the same for 32-element chunk `sub` of the block at byte offset o.
// Every block size is even and every field sits at an even offset, so a 16-bit field never
// straddles a word and a 32-bit read at an even offset spans at most two words.
#include <cstdio>
#include <vector>

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

/// <p>_sm(o, j): the 6-bit scale and min of sub-block j (0..7) of a q4_k or q5_k block at o, from
/// the 12 packed bytes at o + 4.
std::string scale_min(const std::string& p) {
  return "vec2 " + p + "_sm(uint o, uint j) {\n  uint q = o + 4u;\n  if (j < 4u) return vec2(float(" + p + "_u8(q + j) & 63u), float(" + p +
         "_u8(q + j + 4u) & 63u));\n  return vec2(float((" + p + "_u8(q + j + 4u) & 15u) | ((" + p + "_u8(q + j - 4u) >> 6) << 4)), float((" + p +
         "_u8(q + j + 4u) >> 4) | ((" + p + "_u8(q + j) >> 6) << 4)));\n}\n";
}

/// The chunk decoder of a 32-element block with f16 d at o, nibbles at o + qs (q4_0's order),
/// 5th bits at o + qh (a 32-bit mask; qh 0: none) and f16 m at o + 2 when `with_min`:
/// x = q * d + m (q4_1, q5_1), else (q - bias) * d (q5_0).
std::string block32_decoder(const std::string& head, const std::string& p, int qh, int qs, bool with_min, int bias) {
  auto value = [&](const std::string& q) {
    return with_min ? "float(" + q + ") * d + m" : "(float(" + q + ") - " + std::to_string(bias) + ".0) * d";
  };
  std::string s = head + "  float d = " + p + "_f16(o)" + (with_min ? ", m = " + p + "_f16(o + 2u)" : "") + ";\n";
  s += qh ? "  uint qh = " + p + "_u32(o + " + u(qh) + ");\n" : "  const uint qh = 0u;\n";
  s += "  [[unroll]] for (uint w = 0u; w < 4u; ++w) {\n    uint q = " + p + "_u32(o + " + u(qs) + " + 4u * w);\n";
  s += "    [[unroll]] for (uint e = 0u; e < 4u; ++e) {\n      uint j = 4u * w + e, x = (q >> (8u * e)) & 255u;\n";
  s += "      v[j] = " + value("(x & 15u) | (((qh >> j) & 1u) << 4)") + ";\n";
  s += "      v[j + 16u] = " + value("(x >> 4) | (((qh >> (j + 16u)) & 1u) << 4)") + ";\n    }\n  }\n}\n";
  return s;
}

/// `vec2 <p>_lane_sm(uvec3 w, uint i)`: a q4_k block's sub-block i scale and minimum (6 bits
/// each) from header words 1..3 without branches: bytes i & 3 of them (a0, a1, a2) give i < 4:
/// scale a0 & 63, min a1 & 63; else scale (a2 & 15) | (a0 >> 6) << 4, min (a2 >> 4) | (a1 >> 6) << 4.
std::string q4_k_lane_scale_min(const std::string& p) {
  return "vec2 " + p + "_lane_sm(uvec3 w, uint i) {\n  uvec3 a = (w >> (8u * (i & 3u))) & 255u;\n" +
         "  return i < 4u ? vec2(float(a.x & 63u), float(a.y & 63u))\n" +
         "                : vec2(float((a.z & 15u) | ((a.x >> 6) << 4)), float((a.z >> 4) | ((a.y >> 6) << 4)));\n}\n";
}

/// `<p>_w<n>(o, out uint q[n])`: n 32-bit words from the even byte offset o, without branches
/// (a block of 34 or 210 bytes sits at a 2-byte offset every other block). Aligned, the last
/// load repeats the one before it, so nothing past the words is read.
std::string words_reader(const std::string& p, int n) {
  const std::string N = std::to_string(n);
  return "void " + p + "_w" + N + "(uint o, out uint q[" + N + "]) {\n  uint w = o >> 2, odd = (o >> 1) & 1u, c[" + std::to_string(n + 1) +
         "];\n  [[unroll]] for (uint i = 0u; i <= " + N + "u; ++i) c[i] = " + p + ".v[w + min(i, " + std::to_string(n - 1) +
         "u + odd)];\n  [[unroll]] for (uint i = 0u; i < " + N + "u; ++i) q[i] = odd == 0u ? c[i] : (c[i] >> 16) | (c[i + 1u] << 16);\n}\n";
}

/// The `bits`-bit field at bit `from` of the uint expression `word`, moved to bit `to` (masked).
std::string field(const std::string& word, int from, int bits, int to) {
  const int shift = to - from;
  const std::string moved = shift > 0 ? "(" + word + " << " + std::to_string(shift) + ")"
                            : shift < 0 ? "(" + word + " >> " + std::to_string(-shift) + ")"
                                        : word;
  char mask[16];
  std::snprintf(mask, sizeof mask, "0x%08xu", ((1u << bits) - 1u) << to);
  return "(" + moved + " & " + mask + ")";
}

/// The float 1 + q / 2^b from fields that fill the top b bits of an f32 mantissa (field() with
/// to = 23 - b, or several fields side by side): exact, and two integer instructions where an
/// int-to-float conversion runs at a fraction of the rate of arithmetic on GPUs.
std::string unit_float(const std::vector<std::string>& fields) {
  std::string s = "uintBitsToFloat(0x3f800000u";
  for (const auto& f : fields) s += " | " + f;
  return s + ")";
}

}  // namespace

std::string quant_chunk_decoder(dtype t, const std::string& p) {
  std::string s;
  const std::string head = "void " + p + "_chunk_at(uint o, uint sub, out float v[32]) {\n";
  switch (t) {
    case dtype::q8_0:
      s += head + "  float d = " + p + "_f16(o);\n  [[unroll]] for (uint w = 0u; w < 8u; ++w) {\n    uint q = " + p +
           "_u32(o + 2u + 4u * w);\n" +
           "    [[unroll]] for (uint e = 0u; e < 4u; ++e) v[4u * w + e] = d * float(int(q << (24u - 8u * e)) >> 24);\n  }\n}\n";
      break;
    case dtype::q4_0:
      s += head + "  float d = " + p + "_f16(o);\n  [[unroll]] for (uint w = 0u; w < 4u; ++w) {\n    uint q = " + p +
           "_u32(o + 2u + 4u * w);\n" + "    [[unroll]] for (uint e = 0u; e < 4u; ++e) {\n      uint x = (q >> (8u * e)) & 255u;\n" +
           "      v[4u * w + e] = (float(x & 15u) - 8.0) * d;\n      v[4u * w + e + 16u] = (float(x >> 4) - 8.0) * d;\n    }\n  }\n}\n";
      break;
    case dtype::q4_1: s += block32_decoder(head, p, 0, 4, true, 0); break;
    case dtype::q5_0: s += block32_decoder(head, p, 2, 6, false, 16); break;
    case dtype::q5_1: s += block32_decoder(head, p, 4, 8, true, 0); break;
    case dtype::q4_k:
      s += scale_min(p);
      s += head + "  vec2 sm = " + p + "_sm(o, sub);\n  float d = " + p + "_f16(o) * sm.x, m = " + p +
           "_f16(o + 2u) * sm.y;\n  uint shift = (sub & 1u) * 4u;\n" + "  [[unroll]] for (uint w = 0u; w < 8u; ++w) {\n    uint q = " + p +
           "_u32(o + 16u + 32u * (sub / 2u) + 4u * w) >> shift;\n" +
           "    [[unroll]] for (uint e = 0u; e < 4u; ++e) v[4u * w + e] = d * float((q >> (8u * e)) & 15u) - m;\n  }\n}\n";
      break;
    case dtype::q5_k:
      // q4_k's nibbles at o + 48, and the 5th bits: bit `sub` of the 32 qh bytes at o + 16.
      s += scale_min(p);
      s += head + "  vec2 sm = " + p + "_sm(o, sub);\n  float d = " + p + "_f16(o) * sm.x, m = " + p +
           "_f16(o + 2u) * sm.y;\n  uint shift = (sub & 1u) * 4u;\n" + "  [[unroll]] for (uint w = 0u; w < 8u; ++w) {\n    uint q = " + p +
           "_u32(o + 48u + 32u * (sub / 2u) + 4u * w) >> shift, h = " + p + "_u32(o + 16u + 4u * w) >> sub;\n" +
           "    [[unroll]] for (uint e = 0u; e < 4u; ++e) v[4u * w + e] = d * float(((q >> (8u * e)) & 15u) | (((h >> (8u * e)) & 1u) << 4)) - m;\n" +
           "  }\n}\n";
      break;
    case dtype::q6_k:
      s += head + "  uint h = sub / 4u, quad = sub % 4u, qlo = o + 64u * h + 32u * (quad & 1u), qho = o + 128u + 32u * h;\n" +
           "  uint so = o + 192u + 8u * h + 2u * quad;\n  float d = " + p + "_f16(o + 208u);\n" + "  float d0 = d * float(int(" + p +
           "_u8(so) << 24) >> 24), d1 = d * float(int(" + p + "_u8(so + 1u) << 24) >> 24);\n" +
           "  uint lshift = quad < 2u ? 0u : 4u, hshift = 2u * quad;\n" + "  [[unroll]] for (uint w = 0u; w < 8u; ++w) {\n    uint ql = " + p +
           "_u32(qlo + 4u * w) >> lshift, qh = " + p + "_u32(qho + 4u * w) >> hshift;\n" +
           "    [[unroll]] for (uint e = 0u; e < 4u; ++e) {\n      int q = int(((ql >> (8u * e)) & 15u) | (((qh >> (8u * e)) & 3u) << 4)) - 32;\n" +
           "      v[4u * w + e] = (w < 4u ? d0 : d1) * float(q);\n    }\n  }\n}\n";
      break;
    default: break;
  }
  return s;
}

lane_decoder quant_lane_decoder(dtype t, const std::string& p, int64_t k) {
  const auto rb = row_bytes(t, k);
  if (!rb || k <= 0) return {};
  const std::string row = "r * " + u(*rb);
  const int64_t blocks = k / block_elements(t);
  lane_decoder d;
  auto head = [&](int values) { return "void " + p + "_lane(uint r, uint s, uint lane, out float v[" + std::to_string(values) + "]) {\n"; };
  switch (t) {
    case dtype::q8_0: {
      // A step is 16 blocks, two lanes each: lane l reads the 16 quants of half l % 2 of block
      // 16s + l / 2 (4 words at an even offset) and its f16 scale.
      d.groups = 1;
      d.group_len = 16;
      d.step = 512;
      d.first = "512u * s + 32u * (vl / 2u) + 16u * (vl % 2u)";
      d.valid = "16u * s + vl / 2u < " + u(blocks);
      d.glsl = words_reader(p, 4) + head(16) + "  uint o = " + row + " + (16u * s + lane / 2u) * 34u, q[4];\n  " + p +
               "_w4(o + 2u + 16u * (lane % 2u), q);\n";
      // The quant plus 128 (0..255), as f = 1 + (q + 128) / 256: d q = 256 d f - 384 d.
      d.glsl += "  float a = 256.0 * " + p + "_f16(o), b = -1.5 * a;\n";
      for (int w = 0; w < 4; ++w) {
        const std::string x = "q[" + std::to_string(w) + "] ^ 0x80808080u";
        for (int e = 0; e < 4; ++e)
          d.glsl += "  v[" + std::to_string(4 * w + e) + "] = fma(" + unit_float({field("(" + x + ")", 8 * e, 8, 15)}) + ", a, b);\n";
      }
      d.glsl += "}\n";
      return d;
    }
    case dtype::q4_0:
    case dtype::q5_0: {
      // A step is 8 blocks: lane l reads word l % 4 of block 8s + l / 4's nibbles, its low halves
      // elements 4w .. 4w + 3 of the block, its high halves 16 more.
      const bool five = t == dtype::q5_0;
      const int64_t bb = block_bytes(t);
      d.first = "256u * s + 32u * (vl / 4u) + 4u * (vl % 4u)";
      d.group_stride = 16;
      d.valid = "8u * s + vl / 4u < " + u(blocks);
      d.glsl = head(8) + "  uint o = " + row + " + (8u * s + lane / 4u) * " + u(bb) + ", w = lane % 4u;\n  float d = " + p + "_f16(o);\n";
      d.glsl += five ? "  uint qh = " + p + "_u32(o + 2u), q = " + p + "_u32(o + 6u + 4u * w);\n" : "  const uint qh = 0u;\n  uint q = " + p + "_u32(o + 2u + 4u * w);\n";
      d.glsl += "  [[unroll]] for (uint e = 0u; e < 4u; ++e) {\n    uint j = 4u * w + e, x = (q >> (8u * e)) & 255u;\n";
      const std::string bias = five ? "16.0" : "8.0";
      d.glsl += "    v[e] = (float((x & 15u) | (((qh >> j) & 1u) << 4)) - " + bias + ") * d;\n";
      d.glsl += "    v[e + 4u] = (float((x >> 4) | (((qh >> (j + 16u)) & 1u) << 4)) - " + bias + ") * d;\n  }\n}\n";
      return d;
    }
    case dtype::q4_k: {
      // A block is 9 uvec4s: the header (d and dmin, then 12 bytes of 6-bit scales and mins),
      // then 8 of nibbles. A step is 4 blocks of 8 lanes: lane j = l % 8 of block 4s + l / 8
      // reads the header and nibble uvec4 j, bytes 16h .. 16h + 15 (h = j % 2) of 32-byte group
      // g = j / 2, whose low nibbles are elements 16h .. of sub-block 2g and high nibbles of
      // sub-block 2g + 1. The scale and min of sub-block i come from header words 1..3 without
      // branches: bytes i & 3 of them (a0, a1, a2) give i < 4: scale a0 & 63, min a1 & 63; else
      // scale (a2 & 15) | (a0 >> 6) << 4, min (a2 >> 4) | (a1 >> 6) << 4.
      d.uvec4 = true;
      d.group_len = 16;
      d.group_stride = 32;
      d.step = 1024;
      d.first = "1024u * s + 256u * (vl / 8u) + 64u * ((vl % 8u) / 2u) + 16u * (vl % 2u)";
      d.valid = "4u * s + vl / 8u < " + u(blocks);
      d.swizzle = "p ^ ((p >> 4) & 3u)";  // lane j of a block reads groups 16 (j / 2) + 4 (j % 2) + c (+ 8)
      d.glsl = q4_k_lane_scale_min(p);
      d.glsl += head(32) + "  uint base = r * " + u(*rb / 16) + " + (4u * s + lane / 8u) * 9u, j = lane % 8u;\n  uvec4 hd = " + p +
                ".v[base], q = " + p + ".v[base + 1u + j];\n  vec2 dm = unpackHalf2x16(hd.x);\n  vec2 a = " + p +
                "_lane_sm(hd.yzw, j & 6u) * dm, b = " + p + "_lane_sm(hd.yzw, (j & 6u) + 1u) * dm;\n";
      // With f = 1 + q / 16: scale q - min = 16 scale f - (16 scale + min).
      d.glsl += "  float la = 16.0 * a.x, lb = -(la + a.y), ha = 16.0 * b.x, hb = -(ha + b.y);\n";
      for (int w = 0; w < 4; ++w)
        for (int e = 0; e < 4; ++e) {
          const std::string x = "q[" + std::to_string(w) + "]", i = std::to_string(4 * w + e), i2 = std::to_string(16 + 4 * w + e);
          d.glsl += "  v[" + i + "] = fma(" + unit_float({field(x, 8 * e, 4, 19)}) + ", la, lb);\n";
          d.glsl += "  v[" + i2 + "] = fma(" + unit_float({field(x, 8 * e + 4, 4, 19)}) + ", ha, hb);\n";
        }
      d.glsl += "}\n";
      return d;
    }
    case dtype::q6_k: {
      // A block (210 bytes, so at an even offset) holds two halves of 128 elements: 64 bytes of
      // low nibbles, 32 of top bits, 8 int8 scales each. Element l (0..31) of quarter qa (0..3)
      // of half h: low 4 bits in byte 64h + l + 32 (qa & 1) (high nibble when qa >= 2), top 2
      // bits at 2 qa in byte 128 + 32h + l, scale byte 192 + 8h + 2qa + l / 16. A step is 4
      // blocks of 8 lanes: lane j = l % 8 takes elements l0 .. l0 + 7 (l0 = 8 (j % 4)) of every
      // quarter of half j / 4.
      d.groups = 4;
      d.group_len = 8;
      d.group_stride = 32;
      d.step = 1024;
      d.first = "1024u * s + 256u * (vl / 8u) + 128u * ((vl % 8u) / 4u) + 8u * (vl % 4u)";
      d.valid = "4u * s + vl / 8u < " + u(blocks);
      d.glsl = words_reader(p, 2) + head(32) + "  uint o = " + row + " + (4u * s + lane / 8u) * 210u, j = lane % 8u, h = j / 4u, l0 = 8u * (j % 4u);\n";
      d.glsl += "  uint ql0[2], ql1[2], qh[2], sc[2];\n  " + p + "_w2(o + 64u * h + l0, ql0);\n  " + p + "_w2(o + 64u * h + 32u + l0, ql1);\n  " + p +
                "_w2(o + 128u + 32u * h + l0, qh);\n  " + p + "_w2(o + 192u + 8u * h, sc);\n";
      // With f = 1 + q / 64 (q the 6 bits): scale (q - 32) = 64 scale f - 96 scale.
      d.glsl += "  float d = 64.0 * " + p + "_f16(o + 208u);\n  uint sh = 24u - 8u * (l0 / 16u);\n";
      d.glsl += "  float a[4] = float[4](d * float(int(sc[0] << sh) >> 24), d * float(int(sc[0] << (sh - 16u)) >> 24),\n" +
                std::string("                       d * float(int(sc[1] << sh) >> 24), d * float(int(sc[1] << (sh - 16u)) >> 24));\n");
      for (int qa = 0; qa < 4; ++qa)
        for (int i = 0; i < 8; ++i) {
          const std::string lo = std::string(qa & 1 ? "ql1[" : "ql0[") + std::to_string(i / 4) + "]", hi = "qh[" + std::to_string(i / 4) + "]";
          const std::string A = "a[" + std::to_string(qa) + "]";
          d.glsl += "  v[" + std::to_string(8 * qa + i) + "] = fma(" +
                    unit_float({field(lo, 8 * (i % 4) + (qa >= 2 ? 4 : 0), 4, 17), field(hi, 8 * (i % 4) + 2 * qa, 2, 21)}) + ", " + A +
                    ", -1.5 * " + A + ");\n";
        }
      d.glsl += "}\n";
      return d;
    }
    default: return {};
  }
}

lane_decoder quant_int8_lane_decoder(dtype t, const std::string& p, int64_t k) {
  lane_decoder d = quant_lane_decoder(t, p, k);  // the same lanes, steps and runs of the row
  const auto rb = row_bytes(t, k);
  if (d.glsl.empty() || !rb) return {};
  d.glsl.clear();
  const std::string row = "r * " + u(*rb), W = p + "_W";
  // x's codes of elements i .. i + 3 (i a multiple of 4, a GLSL expression) as one packed word.
  const auto x_word = [](const std::string& i) { return "xq[(" + i + ") >> 4][((" + i + ") >> 2) & 3u]"; };
  switch (t) {
    case dtype::q8_0: {
      // The lane's 16 codes are the weight's own bytes: 4 dots, one scale product per lane.
      d.glsl = words_reader(p, 4) + "struct " + W + " { uint q[4]; float d; };\n";
      d.glsl += "void " + p + "_iload(uint r, uint s, uint lane, out " + W + " w) {\n  uint o = " + row +
                " + (16u * s + lane / 2u) * 34u;\n  " + p + "_w4(o + 2u + 16u * (lane % 2u), w.q);\n  w.d = " + p + "_f16(o);\n}\n";
      d.glsl += "float " + p + "_idot(" + W + " w, uint e) {\n  uvec4 x = xq[e >> 4];\n";
      d.glsl += "  int s = idot4(w.q[0], x.x) + idot4(w.q[1], x.y) + idot4(w.q[2], x.z) + idot4(w.q[3], x.w);\n";
      d.glsl += "  return w.d * xd[e >> 5] * float(s);\n}\n";
      return d;
    }
    case dtype::q4_k: {
      // Low nibbles (sub-block 2g) and high nibbles (2g + 1) of the lane's 16 bytes, each 4 bytes
      // a packed word of codes 0..15; the minimum's term takes the x codes' sum over the run.
      d.sums = true;
      d.glsl = q4_k_lane_scale_min(p) + "struct " + W + " { uvec4 q; vec4 a; };\n";
      d.glsl += "void " + p + "_iload(uint r, uint s, uint lane, out " + W + " w) {\n  uint base = r * " + u(*rb / 16) +
                " + (4u * s + lane / 8u) * 9u, j = lane % 8u;\n  uvec4 hd = " + p + ".v[base];\n  w.q = " + p +
                ".v[base + 1u + j];\n  vec2 dm = unpackHalf2x16(hd.x);\n  w.a = vec4(" + p + "_lane_sm(hd.yzw, j & 6u) * dm, " + p +
                "_lane_sm(hd.yzw, (j & 6u) + 1u) * dm);\n}\n";
      d.glsl += "float " + p + "_idot(" + W + " w, uint e) {\n  uvec4 xa = xq[e >> 4], xb = xq[(e + 32u) >> 4];\n";
      d.glsl += "  uvec4 lo = w.q & 0x0f0f0f0fu, hi = (w.q >> 4) & 0x0f0f0f0fu;\n";
      d.glsl += "  int sa = idot4(lo.x, xa.x) + idot4(lo.y, xa.y) + idot4(lo.z, xa.z) + idot4(lo.w, xa.w);\n";
      d.glsl += "  int sb = idot4(hi.x, xb.x) + idot4(hi.y, xb.y) + idot4(hi.z, xb.z) + idot4(hi.w, xb.w);\n";
      d.glsl += "  return w.a.x * xd[e >> 5] * float(sa) - w.a.y * xsum[e >> 4] + w.a.z * xd[(e + 32u) >> 5] * float(sb) - w.a.w * xsum[(e + 32u) >> 4];\n}\n";
      return d;
    }
    case dtype::q6_k: {
      // Quarter qa's 8 codes u = low nibble | top 2 bits << 4 (0..63) become the signed bytes
      // u - 32 without borrows between bytes: ((u | 0x80) - 0x20) ^ 0x80 per byte.
      d.glsl = words_reader(p, 2) + "struct " + W + " { uint ql0[2], ql1[2], qh[2]; vec4 a; };\n";
      d.glsl += "void " + p + "_iload(uint r, uint s, uint lane, out " + W + " w) {\n  uint o = " + row +
                " + (4u * s + lane / 8u) * 210u, j = lane % 8u, h = j / 4u, l0 = 8u * (j % 4u);\n  uint sc[2];\n  " + p +
                "_w2(o + 64u * h + l0, w.ql0);\n  " + p + "_w2(o + 64u * h + 32u + l0, w.ql1);\n  " + p + "_w2(o + 128u + 32u * h + l0, w.qh);\n  " +
                p + "_w2(o + 192u + 8u * h, sc);\n  float d = " + p + "_f16(o + 208u);\n  uint sh = 24u - 8u * (l0 / 16u);\n";
      d.glsl += "  w.a = d * vec4(float(int(sc[0] << sh) >> 24), float(int(sc[0] << (sh - 16u)) >> 24), float(int(sc[1] << sh) >> 24),\n"
                "                 float(int(sc[1] << (sh - 16u)) >> 24));\n}\n";
      d.glsl += "float " + p + "_idot(" + W + " w, uint e0) {\n  float acc = 0.0;\n";
      for (int qa = 0; qa < 4; ++qa) {
        const std::string Q = std::to_string(qa), lo = qa & 1 ? "w.ql1" : "w.ql0";
        d.glsl += "  {\n    uint e = e0 + " + u(32 * qa) + ";\n    int s = 0;\n";
        for (int i = 0; i < 2; ++i) {
          const std::string I = "[" + std::to_string(i) + "]";
          d.glsl += "    s += idot4((((((" + lo + I + (qa >= 2 ? " >> 4)" : ")") + " & 0x0f0f0f0fu) | (((w.qh" + I + " >> " +
                    std::to_string(2 * qa) + ") & 0x03030303u) << 4)) | 0x80808080u) - 0x20202020u) ^ 0x80808080u, " +
                    x_word(i == 0 ? "e" : "e + 4u") + ");\n";
        }
        d.glsl += "    acc += w.a[" + Q + "] * xd[e >> 5] * float(s);\n  }\n";
      }
      d.glsl += "  return acc;\n}\n";
      return d;
    }
    default: return {};
  }
}

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
      break;
    case dtype::q4_0:
      s += "float " + b + "_dq(uint i) {\n" + locate + "  uint q = " + b + "_u8(o + 2u + (j & 15u));\n  q = j < 16u ? q & 15u : q >> 4;\n  return " +
           b + "_f16(o) * (float(q) - 8.0);\n}\n";
      break;
    case dtype::q4_1:
    case dtype::q5_0:
    case dtype::q5_1: {
      // The nibble of element j (q4_0's order), its 5th bit from the 32-bit mask, then the value.
      const bool five = t != dtype::q4_1, with_min = t != dtype::q5_0;
      const std::string qs = t == dtype::q4_1 ? "4u" : t == dtype::q5_0 ? "6u" : "8u", qh = t == dtype::q5_0 ? "2u" : "4u";
      s += "float " + b + "_dq(uint i) {\n" + locate + "  uint q = " + b + "_u8(o + " + qs + " + (j & 15u));\n  q = j < 16u ? q & 15u : q >> 4;\n";
      if (five) s += "  q |= ((" + b + "_u32(o + " + qh + ") >> j) & 1u) << 4;\n";
      s += "  return " + (with_min ? "float(q) * " + b + "_f16(o) + " + b + "_f16(o + 2u)" : "(float(q) - 16.0) * " + b + "_f16(o)") +
           ";\n}\n";
      break;
    }
    case dtype::q4_k:
      s += quant_chunk_decoder(t, b);  // defines <b>_sm, which _dq uses
      s += "float " + b + "_dq(uint i) {\n" + locate + "  uint sub = j / 32u;\n  uint q = " + b +
           "_u8(o + 16u + 32u * (sub / 2u) + j % 32u);\n  q = (sub & 1u) == 0u ? q & 15u : q >> 4;\n  vec2 sm = " + b +
           "_sm(o, sub);\n  return " + b + "_f16(o) * sm.x * float(q) - " + b + "_f16(o + 2u) * sm.y;\n}\n";
      break;
    case dtype::q5_k:
      s += quant_chunk_decoder(t, b);  // defines <b>_sm
      s += "float " + b + "_dq(uint i) {\n" + locate + "  uint sub = j / 32u, l = j % 32u;\n  uint q = " + b +
           "_u8(o + 48u + 32u * (sub / 2u) + l);\n  q = ((sub & 1u) == 0u ? q & 15u : q >> 4) | (((" + b +
           "_u8(o + 16u + l) >> sub) & 1u) << 4);\n  vec2 sm = " + b + "_sm(o, sub);\n  return " + b + "_f16(o) * sm.x * float(q) - " + b +
           "_f16(o + 2u) * sm.y;\n}\n";
      break;
    case dtype::q6_k:
      s += "float " + b + "_dq(uint i) {\n" + locate +
           "  uint h = j / 128u, quad = (j % 128u) / 32u, l = j % 32u;\n  uint ql = " + b + "_u8(o + 64u * h + l + 32u * (quad & 1u));\n" +
           "  uint lo = quad < 2u ? ql & 15u : ql >> 4;\n  uint hi = (" + b + "_u8(o + 128u + 32u * h + l) >> (2u * quad)) & 3u;\n" +
           "  int sc = int(" + b + "_u8(o + 192u + 8u * h + l / 16u + 2u * quad) << 24) >> 24;\n  return " + b +
           "_f16(o + 208u) * float(sc) * float(int(lo | (hi << 4)) - 32);\n}\n";
      break;
    default: return s;
  }
  if (t != dtype::q4_k && t != dtype::q5_k) s += quant_chunk_decoder(t, b);
  const int64_t chunks_per_block = be / 32;
  s += "void " + b + "_chunk(uint r, uint c, out float v[32]) {\n  " + b + "_chunk_at(r * " + u(rb) + " + (c / " + u(chunks_per_block) +
       ") * " + u(bb) + ", c % " + u(chunks_per_block) + ", v);\n}\n";
  return s;
}

}  // namespace mesh::gpu::detail
