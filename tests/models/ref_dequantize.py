#!/usr/bin/env python3
"""Independent reference for the dequantization of ggml's block types, written from the format
definitions (the block tables in ggml-common.h and the dequantizers' documented element order),
not from meshnode's C++: the unit tests compare models/dequantize.cpp against it.

usage: ref_dequantize.py TYPE IN OUT N
  TYPE  F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K
  IN    the row's bytes as they lie in a GGUF file
  OUT   written: N little-endian float32 values
Every product is rounded to float32 in the order ggml computes it (d * scale first), so results are
exact matches except where the C++ compiler fuses a multiply and add.
"""
import sys

import numpy as np

F32 = np.float32


def halves(raw):
    """Little-endian IEEE halves (uint8 array of even length) as float32."""
    return np.ascontiguousarray(raw).view("<f2").astype(F32)


def q8_0(b):
    blocks = b.reshape(-1, 34)
    d = halves(blocks[:, 0:2]).reshape(-1, 1)
    q = blocks[:, 2:].view(np.int8).astype(F32)
    return (q * d).reshape(-1)


def q4_0(b):
    blocks = b.reshape(-1, 18)
    d = halves(blocks[:, 0:2]).reshape(-1, 1)
    qs = blocks[:, 2:]
    # Elements 0..15 are the low nibbles of bytes 0..15, elements 16..31 the high nibbles.
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int32) - 8
    return (q.astype(F32) * d).reshape(-1)


def nibbles32(qs):
    """The 32 low 4 bits of q4_0-style blocks (qs: [nblocks, 16]): elements 0..15 are the low
    nibbles of bytes 0..15, elements 16..31 the high nibbles."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int32)


def fifth_bits(qh):
    """Bit i of the little-endian uint32 qh ([nblocks, 4] bytes), for i in 0..31, as 0 or 16."""
    mask = np.ascontiguousarray(qh).view("<u4").astype(np.int64)  # [nblocks, 1]
    return (((mask >> np.arange(32)) & 1) << 4).astype(np.int32)


def q4_1(b):
    blocks = b.reshape(-1, 20)
    d = halves(blocks[:, 0:2]).reshape(-1, 1)
    m = halves(blocks[:, 2:4]).reshape(-1, 1)
    q = nibbles32(blocks[:, 4:]).astype(F32)
    return ((q * d).astype(F32) + m).astype(F32).reshape(-1)


def q5_0(b):
    blocks = b.reshape(-1, 22)
    d = halves(blocks[:, 0:2]).reshape(-1, 1)
    q = (nibbles32(blocks[:, 6:]) | fifth_bits(blocks[:, 2:6])) - 16
    return (q.astype(F32) * d).reshape(-1)


def q5_1(b):
    blocks = b.reshape(-1, 24)
    d = halves(blocks[:, 0:2]).reshape(-1, 1)
    m = halves(blocks[:, 2:4]).reshape(-1, 1)
    q = (nibbles32(blocks[:, 8:]) | fifth_bits(blocks[:, 4:8])).astype(F32)
    return ((q * d).astype(F32) + m).astype(F32).reshape(-1)


def q4_k_scales(s):
    """The 8 six-bit scales and mins packed in 12 bytes (s: [nblocks, 12] uint8)."""
    s = s.astype(np.int32)
    scale = np.zeros((s.shape[0], 8), np.int32)
    mn = np.zeros((s.shape[0], 8), np.int32)
    # Sub-blocks 0-3: low 6 bits of bytes 0-3 (scales) and 4-7 (mins).
    scale[:, 0:4] = s[:, 0:4] & 63
    mn[:, 0:4] = s[:, 4:8] & 63
    # Sub-blocks 4-7: low 4 bits in bytes 8-11 (scale: low nibble, min: high nibble), top 2 bits in
    # the top bits of bytes 0-3 (scales) and 4-7 (mins).
    scale[:, 4:8] = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:8] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return scale, mn


def q4_k(b):
    blocks = b.reshape(-1, 144)
    d = halves(blocks[:, 0:2]).reshape(-1, 1)
    dmin = halves(blocks[:, 2:4]).reshape(-1, 1)
    scale, mn = q4_k_scales(blocks[:, 4:16])
    qs = blocks[:, 16:].reshape(-1, 4, 32)
    # 32-byte group g: low nibbles are sub-block 2g, high nibbles sub-block 2g+1.
    q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32).astype(F32)
    dl = (d * scale.astype(F32)).astype(F32)[:, :, None]
    ml = (dmin * mn.astype(F32)).astype(F32)[:, :, None]
    return ((dl * q).astype(F32) - ml).astype(F32).reshape(-1)


def q5_k(b):
    blocks = b.reshape(-1, 176)
    d = halves(blocks[:, 0:2]).reshape(-1, 1)
    dmin = halves(blocks[:, 2:4]).reshape(-1, 1)
    scale, mn = q4_k_scales(blocks[:, 4:16])
    qh = blocks[:, 16:48].astype(np.int32)  # [n, 32]: bit j of byte l is element l of sub-block j
    qs = blocks[:, 48:].reshape(-1, 4, 32)
    low = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32).astype(np.int32)
    high = np.stack([(qh >> j) & 1 for j in range(8)], axis=1) << 4  # [n, 8, 32]
    q = (low | high).astype(F32)
    dl = (d * scale.astype(F32)).astype(F32)[:, :, None]
    ml = (dmin * mn.astype(F32)).astype(F32)[:, :, None]
    return ((dl * q).astype(F32) - ml).astype(F32).reshape(-1)


def q6_k(b):
    blocks = b.reshape(-1, 210)
    ql = blocks[:, 0:128].reshape(-1, 2, 64).astype(np.int32)
    qh = blocks[:, 128:192].reshape(-1, 2, 32).astype(np.int32)
    sc = blocks[:, 192:208].view(np.int8).astype(F32)
    d = halves(blocks[:, 208:210]).reshape(-1, 1)
    n = blocks.shape[0]
    q = np.zeros((n, 2, 128), np.int32)
    for group in range(4):  # element 32*group + l of each 128-element half
        low = ql[:, :, 32 * (group % 2): 32 * (group % 2) + 32]
        low = (low >> (4 * (group // 2))) & 0x0F
        high = (qh >> (2 * group)) & 3
        q[:, :, 32 * group: 32 * group + 32] = (low | (high << 4)) - 32
    q = q.reshape(n, 256).astype(F32)
    scale = np.repeat(sc, 16, axis=1)  # 16 elements per scale
    return (((d * scale).astype(F32)) * q).astype(F32).reshape(-1)


def main():
    kind, src, dst, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    b = np.fromfile(src, dtype=np.uint8)
    if kind == "F32":
        out = b.view("<f4").astype(F32)
    elif kind == "F16":
        out = halves(b)
    elif kind == "BF16":
        out = (b.view("<u2").astype(np.uint32) << 16).view(F32)
    else:
        out = {"Q8_0": q8_0, "Q4_0": q4_0, "Q4_1": q4_1, "Q5_0": q5_0, "Q5_1": q5_1, "Q4_K": q4_k, "Q5_K": q5_k,
               "Q6_K": q6_k}[kind](b)
    if out.size != n:
        sys.exit(f"expected {n} values, decoded {out.size}")
    out.astype("<f4").tofile(dst)


if __name__ == "__main__":
    with np.errstate(all="ignore"):  # extreme scales overflow to inf and 0 * inf is NaN, as in C
        main()
