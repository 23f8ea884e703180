#!/usr/bin/env python3
"""Independent reference for fine-tuning: the causal language-model loss of a Llama-family or
GPT-2 checkpoint and its gradients, by PyTorch autograd in float64, from the published equations
(ref_llm.py's RMSNorm, rotary embeddings, grouped-query causal attention and SwiGLU; GPT-2's
LayerNorm, learned positions and tanh GELU; written from the papers, not from meshnode's C++), on
the weights as the file gives them.

LoRA (Hu et al. 2021): a target projection W x becomes W x + (alpha / r) B A x, A [r, in],
B [out, r]; only A and B get gradients.

Mixed precision ("compute": "f16" or "bf16"; Micikevicius et al. 2018): the operands of every
product (the projections, attention's q k^T and p v, LoRA's two products, the head) are rounded to
the compute dtype, the product's result is rounded to it too (the value a half-precision product
stores), and widened back; the backward pass mirrors it: the gradient entering a product is rounded
to the compute dtype, and the product's gradients with respect to its operands are rounded
results of half-precision products. Everything else (norms, softmax, rope, residuals, the loss,
sums of gradients) stays float64 here.

usage: ref_train.py JOBS.json
  JOBS.json: a list of {"model": PATH, "tokens": [[ids]], "targets": [[ids]], "mask": [[0/1]],
             "lora": null or {"rank": r, "alpha": a, "tensors": PATH.safetensors},
             "out": PATH}, ...
  "tensors" holds "<module>.lora_A.weight" and "<module>.lora_B.weight" (module: the projection's
  Hugging Face name without ".weight") in Hugging Face's row order. For a GGUF Llama (whose q and k
  rows llama.cpp's converter interleaves for its rope), B's rows of q and k are interleaved here the
  converter's way before the forward pass, which then runs in the file's own layout.
  "compute" (optional): null, "f16" or "bf16" (mixed precision, above).
  writes {"loss": float, "grads": {name: [flat values]}}: every weight of the model by its Hugging
  Face name (full fine-tuning: HF directories only for the Llama family; GPT-2 from either, its
  Conv1D weights [in, out] as GPT2LMHeadModel names them, "transformer.h.0.attn.c_attn.weight"),
  or every adapter tensor (LoRA; GPT-2's modules "transformer.h.<i>.attn.c_attn", ...).
"""
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_llm as R  # noqa: E402

D = torch.float64

ROLES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
         "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
VECTORS = {"attn_norm": "input_layernorm.weight", "ffn_norm": "post_attention_layernorm.weight",
           "q_bias": "self_attn.q_proj.bias", "k_bias": "self_attn.k_proj.bias", "v_bias": "self_attn.v_proj.bias",
           "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight"}


def converter_permute(w, n_head):
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute: each head's rows (i, i + half) become
    (2i, 2i + 1)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def rounder(low):
    return (lambda x: x) if low is None else (lambda x: x.to(low).to(D))


def product_fn(low):
    """a @ b as mixed precision computes it (module docstring); plain a @ b when low is None."""
    if low is None:
        return torch.matmul
    r = rounder(low)

    class Product(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            a, b = r(a), r(b)
            ctx.save_for_backward(a, b)
            return r(a @ b)

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            g = r(g)
            return r(g @ b.transpose(-1, -2)), r(a.transpose(-1, -2) @ g)

    return Product.apply


def attention(q, k, v, kv_heads, mm):
    """R.causal_attention with its two products through mm."""
    t, h, d = q.shape
    k = k.repeat_interleave(h // kv_heads, dim=1)
    v = v.repeat_interleave(h // kv_heads, dim=1)
    scores = mm(q.transpose(0, 1), k.permute(1, 2, 0)) / math.sqrt(d)  # [h, t, s]
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    p = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)
    return mm(p, v.transpose(0, 1)).transpose(0, 1).reshape(t, h * d)


def with_adapter(y, h, adapter, mm):
    """y + scale B A h for a LoRA adapter (A, B, scale); y without one."""
    if adapter is None:
        return y
    a, b, s = adapter
    return y + s * mm(mm(h, a.T), b.T)


def forward(c, tokens, lora, low=None):
    """Logits [T, vocab] of one sequence; lora: {(layer, role): (A, B, scale)}; low: the compute
    dtype of mixed precision (None: float64 throughout)."""
    t = len(tokens)
    x = c.embed[torch.tensor(tokens)]
    mm = product_fn(low)

    def proj(h, b, i, role, bias=None):
        y = mm(h, b[role].T)
        if bias is not None:
            y = y + bias
        return with_adapter(y, h, lora.get((i, role)), mm)

    for i, b in enumerate(c.blocks):
        h = R.rms_norm(x, b["attn_norm"], c.eps)
        q = proj(h, b, i, "q", b["q_bias"]).reshape(t, c.heads, c.head_dim)
        k = proj(h, b, i, "k", b["k_bias"]).reshape(t, c.kv_heads, c.head_dim)
        v = proj(h, b, i, "v", b["v_bias"]).reshape(t, c.kv_heads, c.head_dim)
        if b["q_norm"] is not None:
            q, k = R.rms_norm(q, b["q_norm"], c.eps), R.rms_norm(k, b["k_norm"], c.eps)
        q, k = R.rotary(q, c.inv_freq, c.rope_style), R.rotary(k, c.inv_freq, c.rope_style)
        x = x + proj(attention(q, k, v, c.kv_heads, mm), b, i, "o")
        h = R.rms_norm(x, b["ffn_norm"], c.eps)
        gate = proj(h, b, i, "gate")
        x = x + proj(gate * torch.sigmoid(gate) * proj(h, b, i, "up"), b, i, "down")
    return mm(R.rms_norm(x, c.final_norm, c.eps), c.lm_head)


GPT2_ROLES = {"qkv": "attn.c_attn", "o": "attn.c_proj", "fc": "mlp.c_fc", "proj": "mlp.c_proj"}
GPT2_NORMS = {"ln1": "ln_1", "ln2": "ln_2"}


def gpt2_forward(c, tokens, lora, low=None):
    """GPT-2's logits [T, vocab] (ref_llm.py's LayerNorm, learned positions, tanh GELU; Conv1D
    weights [in, out]: y = x W + b); lora: {(layer, role): (A, B, scale)} with A [r, in], B [out, r]."""
    t = len(tokens)
    x = c.embed[torch.tensor(tokens)] + c.pos_embed[torch.arange(t)]
    mm = product_fn(low)

    def proj(h, b, i, role):
        w, bias = b[role]
        return with_adapter(mm(h, w) + bias, h, lora.get((i, role)), mm)

    for i, b in enumerate(c.blocks):
        h = R.layer_norm(x, b["ln1"], c.eps)
        q, k, v = proj(h, b, i, "qkv").split(c.d, dim=-1)
        shape = (t, c.heads, c.head_dim)
        x = x + proj(attention(q.reshape(shape), k.reshape(shape), v.reshape(shape), c.heads, mm), b, i, "o")
        h = R.layer_norm(x, b["ln2"], c.eps)
        x = x + proj(R.gelu_tanh(proj(h, b, i, "fc")), b, i, "proj")
    return mm(R.layer_norm(x, c.final_norm, c.eps), c.lm_head)


def gpt2_leaves(c, tied):
    """Every GPT-2 weight made a leaf, by its name in GPT2LMHeadModel's state dict (the Conv1D
    weights [in, out], whatever the file's layout)."""
    leaves = {}

    def leaf(name, value):
        v = value.clone().requires_grad_(True)
        leaves[name] = v
        return v

    c.embed = leaf("transformer.wte.weight", c.embed)
    c.pos_embed = leaf("transformer.wpe.weight", c.pos_embed)
    for i, b in enumerate(c.blocks):
        p = f"transformer.h.{i}."
        for role, hf in list(GPT2_ROLES.items()) + list(GPT2_NORMS.items()):
            w, bias = b[role]
            b[role] = (leaf(p + hf + ".weight", w), leaf(p + hf + ".bias", bias))
    c.final_norm = (leaf("transformer.ln_f.weight", c.final_norm[0]), leaf("transformer.ln_f.bias", c.final_norm[1]))
    c.lm_head = c.embed.T if tied else leaf("lm_head.weight", c.lm_head.T).T
    return leaves


def run(job):
    path = job["model"]
    gguf = os.path.isfile(path) and open(path, "rb").read(4) == b"GGUF"
    c = R.gguf_model(path) if gguf else R.hf_model(path)
    lora = {}
    leaves = {}
    if job.get("lora"):
        lj = job["lora"]
        s = lj["alpha"] / lj["rank"]
        raw = R.read_safetensors(lj["tensors"])
        for name in raw:
            if not name.endswith(".lora_A.weight"):
                continue
            module = name[: -len(".lora_A.weight")]
            layer = int(module.split(".")[2])
            roles = GPT2_ROLES if c.arch == "gpt2" else ROLES
            role = next(r for r, hf in roles.items() if module.endswith(hf))
            a = raw[name].clone().requires_grad_(True)
            b = raw[module + ".lora_B.weight"].clone().requires_grad_(True)
            leaves[module + ".lora_A.weight"] = a
            leaves[module + ".lora_B.weight"] = b
            b_used = b
            if gguf and c.arch != "gpt2" and c.rope_style == "normal" and role in ("q", "k"):
                b_used = converter_permute(b, c.heads if role == "q" else c.kv_heads)
            lora[(layer, role)] = (a, b_used, s)
    elif c.arch == "gpt2":
        names = R.read_gguf(path)[1] if gguf else R.read_safetensors(os.path.join(path, "model.safetensors"))
        tied = not any(n in names for n in ("output.weight", "lm_head.weight", "transformer.lm_head.weight"))
        leaves = gpt2_leaves(c, tied)
    else:
        if gguf:
            raise SystemExit("full fine-tuning reference for the Llama family: Hugging Face directories only")
        tied = "lm_head.weight" not in R.read_safetensors(os.path.join(path, "model.safetensors"))
        c.embed = c.embed.clone().requires_grad_(True)
        leaves["model.embed_tokens.weight"] = c.embed
        if tied:
            c.lm_head = c.embed.T
        else:
            head = c.lm_head.T.clone().requires_grad_(True)
            leaves["lm_head.weight"] = head
            c.lm_head = head.T
        c.final_norm = c.final_norm.clone().requires_grad_(True)
        leaves["model.norm.weight"] = c.final_norm
        for i, b in enumerate(c.blocks):
            for role, hf in list(ROLES.items()) + list(VECTORS.items()):
                if b[role] is None:
                    continue
                b[role] = b[role].clone().requires_grad_(True)
                leaves[f"model.layers.{i}.{hf}" + (".weight" if role in ROLES else "")] = b[role]

    total = torch.zeros((), dtype=D)
    count = 0.0
    for tokens, targets, mask in zip(job["tokens"], job["targets"], job["mask"]):
        low = {None: None, "f16": torch.float16, "bf16": torch.bfloat16}[job.get("compute")]
        logits = gpt2_forward(c, tokens, lora, low) if c.arch == "gpt2" else forward(c, tokens, lora, low)
        logp = torch.log_softmax(logits, -1)
        nll = -logp[torch.arange(len(targets)), torch.tensor(targets)]
        m = torch.tensor(mask, dtype=D)
        total = total + (nll * m).sum()
        count += float(sum(mask))
    loss = total / max(count, 1.0)
    loss.backward()
    grads = {}
    for name, leaf in leaves.items():
        g = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
        grads[name] = g.reshape(-1).tolist()
    json.dump({"loss": float(loss), "grads": grads}, open(job["out"], "w"))


def main():
    for job in json.load(open(sys.argv[1])):
        run(job)


if __name__ == "__main__":
    main()
