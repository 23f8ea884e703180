#!/usr/bin/env python3
"""Anchor for mesh-bench-gpu --attention: PyTorch's scaled_dot_product_attention on the same
causal shape (1 x 8 heads x 4096 rows x 4096 keys, d = 64), f32 (the math mesh-bench-gpu's kernel
does) and f16 with the flash back end (tensor cores), timed with CUDA events after a warm-up;
GFLOP/s count the causal half: 4 * heads * d * l * (l + 1) / 2."""
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

torch.backends.cuda.matmul.allow_tf32 = False
B, H, L, D = 1, 8, int(sys.argv[1]) if len(sys.argv) > 1 else 4096, 64
flops = 4.0 * H * D * L * (L + 1) / 2
print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
for dtype, backends in ((torch.float32, [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]), (torch.float16, [SDPBackend.FLASH_ATTENTION])):
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.rand(B, H, L, D, device="cuda", dtype=dtype, generator=g) * 2 - 1 for _ in range(3))
    for backend in backends:
        try:
            with sdpa_kernel(backend):
                for _ in range(10):
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)
                torch.cuda.synchronize()
                times = []
                for _ in range(30):
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    b.record()
                    torch.cuda.synchronize()
                    times.append(a.elapsed_time(b))
            ms = sorted(times)[len(times) // 2]
            print(f"sdpa {str(dtype).split('.')[-1]} {backend.name}: {ms:.3f} ms, {flops / ms / 1e6:,.0f} GFLOP/s")
        except RuntimeError as e:
            print(f"sdpa {str(dtype).split('.')[-1]} {backend.name}: not available ({str(e).splitlines()[0]})")
