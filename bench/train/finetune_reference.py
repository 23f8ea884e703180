#!/usr/bin/env python3
"""PyTorch anchor for mesh-bench-finetune: the same Llama shape (embedding, RMSNorm, rotary
embeddings, grouped-query causal attention, SwiGLU, untied head), the same micro-batch and Adam, in
fp32 with TF32 off, written from the published equations. Eager mode, attention through
scaled_dot_product_attention (what Hugging Face's "sdpa" attention runs). With --ranks N:
DistributedDataParallel over NCCL, one process per GPU, each with the same per-GPU batch (weak
scaling, as mesh-bench-finetune's nodes). Prints tokens/s over the steps after two warm-up steps.

usage: finetune_reference.py [--hidden 768] [--layers 12] [--heads 12] [--kv-heads 4] [--ffn 2048]
                             [--vocab 16384] [--batch 4] [--sequence 256] [--micro 1] [--steps 8]
                             [--ranks 1] [--amp none|bf16|f16]
--amp: mixed precision with torch.autocast (products in bf16 or f16, fp32 master weights; f16 with
torch.amp.GradScaler's dynamic loss scaling), against mesh-bench-finetune --precision.
"""
import argparse
import os
import time

import torch
import torch.nn.functional as F


def rms_norm(x, w, eps=1e-5):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


class Llama(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        hd = a.hidden // a.heads
        self.a, self.hd = a, hd
        P = lambda *s: torch.nn.Parameter(torch.randn(*s) * 0.02)  # noqa: E731
        self.embed = P(a.vocab, a.hidden)
        self.head = P(a.vocab, a.hidden)
        self.norm = torch.nn.Parameter(torch.ones(a.hidden))
        self.layers = torch.nn.ModuleList()
        for _ in range(a.layers):
            m = torch.nn.Module()
            m.n1 = torch.nn.Parameter(torch.ones(a.hidden))
            m.n2 = torch.nn.Parameter(torch.ones(a.hidden))
            m.q, m.k, m.v = P(a.heads * hd, a.hidden), P(a.kv_heads * hd, a.hidden), P(a.kv_heads * hd, a.hidden)
            m.o = P(a.hidden, a.heads * hd)
            m.gate, m.up, m.down = P(a.ffn, a.hidden), P(a.ffn, a.hidden), P(a.hidden, a.ffn)
            self.layers.append(m)
        inv = 10000.0 ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        ang = torch.arange(a.sequence, dtype=torch.float64)[:, None] * inv[None, :]
        self.register_buffer("cos", torch.cos(ang).float()[None, :, None, :], persistent=False)
        self.register_buffer("sin", torch.sin(ang).float()[None, :, None, :], persistent=False)

    def rope(self, x):  # x [B, T, H, hd], rotate halves (Hugging Face's order)
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * self.cos - x2 * self.sin, x2 * self.cos + x1 * self.sin], -1)

    def forward(self, tokens, targets):
        a, hd = self.a, self.hd
        B, T = tokens.shape
        x = self.embed[tokens]
        for m in self.layers:
            h = rms_norm(x, m.n1)
            q = self.rope((h @ m.q.T).view(B, T, a.heads, hd)).transpose(1, 2)
            k = self.rope((h @ m.k.T).view(B, T, a.kv_heads, hd)).transpose(1, 2)
            v = (h @ m.v.T).view(B, T, a.kv_heads, hd).transpose(1, 2)
            g = a.heads // a.kv_heads
            k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, a.heads * hd)
            x = x + att @ m.o.T
            h = rms_norm(x, m.n2)
            x = x + (F.silu(h @ m.gate.T) * (h @ m.up.T)) @ m.down.T
        logits = rms_norm(x, self.norm) @ self.head.T
        return F.cross_entropy(logits.view(-1, a.vocab), targets.view(-1))


def run(rank, a):
    ddp = a.ranks > 1
    if ddp:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        torch.distributed.init_process_group("nccl", rank=rank, world_size=a.ranks)
    torch.cuda.set_device(rank)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(1)
    model = Llama(a).cuda()
    params = sum(p.numel() for p in model.parameters())
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.Adam(model.parameters(), lr=1e-5)
    g = torch.Generator(device="cuda").manual_seed(2 + rank)
    rows = a.batch
    tokens = torch.randint(0, a.vocab, (a.micro, rows, a.sequence), device="cuda", generator=g)
    targets = torch.randint(0, a.vocab, (a.micro, rows, a.sequence), device="cuda", generator=g)

    low = {"none": None, "bf16": torch.bfloat16, "f16": torch.float16}[a.amp]
    scaler = torch.amp.GradScaler("cuda", enabled=low == torch.float16)

    def loss_of(i):
        with torch.autocast("cuda", dtype=low or torch.float32, enabled=low is not None):
            return model(tokens[i], targets[i]) / a.micro

    def step():
        opt.zero_grad(set_to_none=True)
        for i in range(a.micro):  # gradient accumulation over the micro-batches, as the mesh does
            if ddp and i + 1 < a.micro:
                with model.no_sync():
                    scaler.scale(loss_of(i)).backward()
            else:
                scaler.scale(loss_of(i)).backward()
        scaler.step(opt)
        scaler.update()

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    if ddp:
        torch.distributed.barrier()
    t0 = time.perf_counter()
    for _ in range(a.steps - 2):
        step()
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    tok = (a.steps - 2) * a.micro * rows * a.sequence / secs
    if ddp:
        t = torch.tensor([tok], device="cuda")
        torch.distributed.all_reduce(t)
        tok = float(t)
    if rank == 0:
        what = (f"DDP over {a.ranks} GPUs (NCCL)" if ddp else "eager, 1 GPU") + ("" if a.amp == "none" else f", autocast {a.amp}")
        print(f"torch {torch.__version__} {what}: {params / 1e6:.1f} M parameters, {tok:.0f} tokens/s, "
              f"step {1000 * secs / (a.steps - 2):.1f} ms ({torch.cuda.get_device_name()})", flush=True)
    if ddp:
        torch.distributed.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    for k, v in dict(hidden=768, layers=12, heads=12, kv_heads=4, ffn=2048, vocab=16384, batch=4, sequence=256, micro=1,
                     steps=8, ranks=1).items():
        p.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    p.add_argument("--amp", choices=["none", "bf16", "f16"], default="none")
    a = p.parse_args()
    if a.ranks > 1:
        torch.multiprocessing.spawn(run, args=(a,), nprocs=a.ranks)
    else:
        run(0, a)


if __name__ == "__main__":
    main()
