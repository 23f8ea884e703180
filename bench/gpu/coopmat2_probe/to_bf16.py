#!/usr/bin/env python3
"""Rewrites every 16-bit float type of a SPIR-V module to bfloat16 (SPV_KHR_bfloat16): OpTypeFloat 16
gains the BFloat16KHR encoding, and the module declares BFloat16TypeKHR, BFloat16CooperativeMatrixKHR
and the extension. A module whose f16 values are only loaded, multiplied in cooperative matrices and
stored becomes the same kernel on bf16 data. usage: to_bf16.py IN.spv OUT.spv"""
import struct
import sys

OP_CAPABILITY, OP_EXTENSION, OP_TYPE_FLOAT = 17, 10, 22
BFLOAT16_TYPE, BFLOAT16_COOPMAT, BFLOAT16_ENCODING = 5116, 5118, 0


def words_of(data):
    return list(struct.unpack('<%dI' % (len(data) // 4), data))


def string_words(s):
    b = s.encode() + b'\0'
    b += b'\0' * (-len(b) % 4)
    return words_of(b)


def main():
    words = words_of(open(sys.argv[1], 'rb').read())
    header, body = words[:5], words[5:]
    out, i, caps_added, ext_added = [], 0, False, False
    while i < len(body):
        count, op = body[i] >> 16, body[i] & 0xffff
        ins = body[i:i + count]
        if op == OP_CAPABILITY and not caps_added:
            out += [(2 << 16) | OP_CAPABILITY, BFLOAT16_TYPE, (2 << 16) | OP_CAPABILITY, BFLOAT16_COOPMAT]
            caps_added = True
        if op == OP_EXTENSION and not ext_added:
            name = string_words("SPV_KHR_bfloat16")
            out += [((1 + len(name)) << 16) | OP_EXTENSION] + name
            ext_added = True
        if op == OP_TYPE_FLOAT and count == 3 and ins[2] == 16:
            ins = [(4 << 16) | OP_TYPE_FLOAT, ins[1], 16, BFLOAT16_ENCODING]
        out += ins
        i += count
    if not (caps_added and ext_added):
        sys.exit("to_bf16.py: the module declares no capability or no extension to add beside")
    open(sys.argv[2], 'wb').write(struct.pack('<%dI' % (len(header) + len(out)), *(header + out)))


main()
