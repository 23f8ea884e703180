#!/usr/bin/env python3
"""Independent reference for the architectures meshnode builds: Llama (Llama 2/3 with Llama 3 rope
scaling, Mistral), Qwen2 (q/k/v biases), Qwen3 (q/k RMSNorm) and GPT-2, written in PyTorch from the
published equations (RMSNorm, rotary embeddings in their two orders, grouped-query causal attention,
SwiGLU, LayerNorm and the tanh GELU), not from meshnode's C++. It reads the checkpoint files itself:
Hugging Face directories (config.json + model.safetensors, parsed here) and GGUF files (parsed here
from the format's specification; quantized blocks decoded by ref_dequantize.py, written from the
block definitions). Everything runs in float64 on the weights as the file gives them (widened from
f16/bf16, dequantized from the blocks), so the C++ float32 results are checked against exact math.

usage: ref_llm.py JOBS.json
  JOBS.json: [{"model": PATH, "tokens": [ids...], "generate": N, "out": PATH, "adapter": DIR?}, ...]
  "adapter" (optional): a PEFT LoRA directory (adapter_config.json, adapter_model.safetensors)
    merged into the weights first, W + lora_alpha / r * B A (LoRA's equation), B's rows of q and k
    interleaved the way llama.cpp's converter interleaves a GGUF Llama's q and k rows
  writes to each job's "out" a JSON object:
    "logits":  the logits after each prompt token ([len(tokens)][vocab])
    "greedy":  N tokens chosen greedily after the prompt (recomputing the whole sequence each time)
    "greedy_logits": the logits each greedy token was chosen from ([N][vocab])
    "greedy_logprobs": log_softmax of those logits at each greedy token ([N])
    "greedy_top": the 5 highest of that log_softmax, [[id, logprob], ...] ([N][5])
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_dequantize as dq  # noqa: E402

D = torch.float64

# ---- files ----


def read_safetensors(path):
    raw = np.fromfile(path, dtype=np.uint8)
    n = int.from_bytes(raw[:8].tobytes(), "little")
    header = json.loads(raw[8:8 + n].tobytes())
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        b = data[begin:end]
        if info["dtype"] == "F32":
            a = b.view("<f4").astype(np.float64)
        elif info["dtype"] == "F16":
            a = b.view("<f2").astype(np.float64)
        elif info["dtype"] == "BF16":
            a = (b.view("<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        else:
            raise ValueError(f"{path}: dtype {info['dtype']}")
        out[name] = torch.from_numpy(a.reshape(info["shape"]).copy())
    return out


GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
# ggml type number: (name, elements per block, bytes per block)
GGML_TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 30: ("BF16", 1, 2), 8: ("Q8_0", 32, 34), 2: ("Q4_0", 32, 18),
              3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 12: ("Q4_K", 256, 144),
              13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210)}


def read_gguf(path):
    buf = open(path, "rb").read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, buf, pos)[0]
        pos += struct.calcsize(fmt)
        return v

    def string():
        nonlocal pos
        n = take("<Q")
        s = buf[pos:pos + n].decode("utf-8")
        pos += n
        return s

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("<I"), take("<Q")
            return [value(et) for _ in range(n)]
        return take(GGUF_SCALARS[t])

    assert buf[:4] == b"GGUF", path
    pos = 4
    version, n_tensors, n_kv = take("<I"), take("<Q"), take("<Q")
    assert version in (2, 3)
    meta = {}
    for _ in range(n_kv):
        k = string()
        meta[k] = value(take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        nd = take("<I")
        ne = [take("<Q") for _ in range(nd)]
        t, off = take("<I"), take("<Q")
        infos.append((name, ne, t, off))
    align = meta.get("general.alignment", 32)
    data_start = (pos + align - 1) // align * align
    tensors = {}
    for name, ne, t, off in infos:
        tname, be, bb = GGML_TYPES[t]
        count = int(np.prod(ne))
        nbytes = count // be * bb
        b = np.frombuffer(buf, dtype=np.uint8, count=nbytes, offset=data_start + off)
        if tname == "F32":
            a = b.view("<f4").astype(np.float64)
        elif tname == "F16":
            a = dq.halves(b).astype(np.float64)
        elif tname == "BF16":
            a = (b.view("<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        else:
            a = {"Q8_0": dq.q8_0, "Q4_0": dq.q4_0, "Q4_1": dq.q4_1, "Q5_0": dq.q5_0, "Q5_1": dq.q5_1, "Q4_K": dq.q4_k,
                 "Q5_K": dq.q5_k, "Q6_K": dq.q6_k}[tname](b.copy()).astype(np.float64)
        # ne[0] is the fastest dimension: the row-major shape is ne reversed.
        tensors[name] = torch.from_numpy(a.reshape(list(reversed(ne))).copy())
    return meta, tensors


# ---- the architectures' hyper-parameters ----


class Config:
    pass


def hf_model(path):
    cfg = json.load(open(os.path.join(path, "config.json")))
    w = read_safetensors(os.path.join(path, "model.safetensors"))
    c = Config()
    c.arch = cfg["model_type"]
    if c.arch == "gpt2":
        c.d, c.layers, c.heads = cfg["n_embd"], cfg["n_layer"], cfg["n_head"]
        c.kv_heads, c.head_dim, c.eps = c.heads, c.d // c.heads, cfg["layer_norm_epsilon"]
        p = "transformer." if "transformer.wte.weight" in w else ""
        g = lambda n: w[p + n]  # noqa: E731
        c.embed, c.pos_embed = g("wte.weight"), g("wpe.weight")
        c.blocks = []
        for i in range(c.layers):
            b = lambda n: g(f"h.{i}.{n}")  # noqa: E731
            # Conv1D stores [in, out]: y = x @ W + b.
            c.blocks.append(dict(ln1=(b("ln_1.weight"), b("ln_1.bias")), qkv=(b("attn.c_attn.weight"), b("attn.c_attn.bias")),
                                 o=(b("attn.c_proj.weight"), b("attn.c_proj.bias")), ln2=(b("ln_2.weight"), b("ln_2.bias")),
                                 fc=(b("mlp.c_fc.weight"), b("mlp.c_fc.bias")), proj=(b("mlp.c_proj.weight"), b("mlp.c_proj.bias"))))
        c.final_norm = (g("ln_f.weight"), g("ln_f.bias"))
        # GPT2LMHeadModel's head: its own lm_head.weight where the file has one, else the embedding.
        c.lm_head = (w["lm_head.weight"] if "lm_head.weight" in w else c.embed).T
        return c
    c.d, c.layers, c.heads = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
    c.kv_heads = cfg.get("num_key_value_heads", c.heads)
    c.head_dim = cfg.get("head_dim") or c.d // c.heads
    c.eps, c.theta = cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)
    # Hugging Face's Llama conversion permuted q/k rows for rotate_half: every HF model is NeoX order.
    c.rope_style = "neox"
    c.inv_freq = inv_freq(c.head_dim, c.theta)
    rs = cfg.get("rope_scaling")
    if rs and rs.get("rope_type", rs.get("type")) == "llama3":
        c.inv_freq = llama3_scaling(c.inv_freq, rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"],
                                    rs["original_max_position_embeddings"])
    c.embed = w["model.embed_tokens.weight"]
    c.blocks = []
    for i in range(c.layers):
        g = lambda n: w.get(f"model.layers.{i}.{n}")  # noqa: E731
        c.blocks.append(dict(attn_norm=g("input_layernorm.weight"), q=g("self_attn.q_proj.weight"), k=g("self_attn.k_proj.weight"),
                             v=g("self_attn.v_proj.weight"), o=g("self_attn.o_proj.weight"), q_bias=g("self_attn.q_proj.bias"),
                             k_bias=g("self_attn.k_proj.bias"), v_bias=g("self_attn.v_proj.bias"), q_norm=g("self_attn.q_norm.weight"),
                             k_norm=g("self_attn.k_norm.weight"), ffn_norm=g("post_attention_layernorm.weight"),
                             gate=g("mlp.gate_proj.weight"), up=g("mlp.up_proj.weight"), down=g("mlp.down_proj.weight")))
    c.final_norm = w["model.norm.weight"]
    c.lm_head = (w["lm_head.weight"] if "lm_head.weight" in w else c.embed).T
    return c


def gguf_model(path):
    meta, w = read_gguf(path)
    a = meta["general.architecture"]
    c = Config()
    c.arch = a
    c.d, c.layers, c.heads = meta[f"{a}.embedding_length"], meta[f"{a}.block_count"], meta[f"{a}.attention.head_count"]
    c.kv_heads = meta.get(f"{a}.attention.head_count_kv", c.heads)
    c.head_dim = meta.get(f"{a}.attention.key_length", c.d // c.heads)
    c.embed = w["token_embd.weight"]
    if a == "gpt2":
        c.eps = meta[f"{a}.attention.layer_norm_epsilon"]
        c.pos_embed = w["position_embd.weight"]
        c.blocks = []
        for i in range(c.layers):
            b = lambda n: w[f"blk.{i}.{n}"]  # noqa: E731
            # GGUF projections are [out, in]: y = x @ W.T + b; transpose to the Conv1D form.
            c.blocks.append(dict(ln1=(b("attn_norm.weight"), b("attn_norm.bias")), qkv=(b("attn_qkv.weight").T, b("attn_qkv.bias")),
                                 o=(b("attn_output.weight").T, b("attn_output.bias")), ln2=(b("ffn_norm.weight"), b("ffn_norm.bias")),
                                 fc=(b("ffn_up.weight").T, b("ffn_up.bias")), proj=(b("ffn_down.weight").T, b("ffn_down.bias"))))
        c.final_norm = (w["output_norm.weight"], w["output_norm.bias"])
        c.lm_head = (w["output.weight"] if "output.weight" in w else c.embed).T
        return c
    c.eps = meta[f"{a}.attention.layer_norm_rms_epsilon"]
    c.theta = meta.get(f"{a}.rope.freq_base", 10000.0)
    # llama.cpp runs GGUF "llama" with adjacent-pair rope on the original (unpermuted) rows; Qwen in NeoX order.
    c.rope_style = "normal" if a == "llama" else "neox"
    c.inv_freq = inv_freq(c.head_dim, c.theta)
    if "rope_freqs.weight" in w:  # Llama 3: per-frequency divisors
        c.inv_freq = c.inv_freq / w["rope_freqs.weight"]
    c.blocks = []
    for i in range(c.layers):
        g = lambda n: w.get(f"blk.{i}.{n}")  # noqa: E731
        c.blocks.append(dict(attn_norm=g("attn_norm.weight"), q=g("attn_q.weight"), k=g("attn_k.weight"), v=g("attn_v.weight"),
                             o=g("attn_output.weight"), q_bias=g("attn_q.bias"), k_bias=g("attn_k.bias"), v_bias=g("attn_v.bias"),
                             q_norm=g("attn_q_norm.weight"), k_norm=g("attn_k_norm.weight"), ffn_norm=g("ffn_norm.weight"),
                             gate=g("ffn_gate.weight"), up=g("ffn_up.weight"), down=g("ffn_down.weight")))
    c.final_norm = w["output_norm.weight"]
    c.lm_head = (w["output.weight"] if "output.weight" in w else c.embed).T
    return c


# ---- the equations ----


def inv_freq(dim, theta):
    return 1.0 / theta ** (torch.arange(0, dim, 2, dtype=D) / dim)


def llama3_scaling(freqs, factor, low_freq_factor, high_freq_factor, old_context_len):
    """Llama 3.1's apply_scaling (Meta's reference implementation)."""
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    out = []
    for f in freqs.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < high_freq_wavelen:
            out.append(f)
        elif wavelen > low_freq_wavelen:
            out.append(f / factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append((1 - smooth) * f / factor + smooth * f)
    return torch.tensor(out, dtype=D)


def rms_norm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def layer_norm(x, wb, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * wb[0] + wb[1]


def gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def rotary(x, freqs, style):
    """x [T, heads, d]: rotate pairs by angle position * frequency (RoFormer); "normal" pairs
    (2i, 2i+1), "neox" pairs (i, i + d/2) (GPT-NeoX's rotate_half)."""
    t = x.shape[0]
    ang = torch.arange(t, dtype=D)[:, None] * freqs[None, :]
    cos, sin = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
    if style == "neox":
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, b * cos + a * sin], -1).flatten(-2)


def causal_attention(q, k, v, kv_heads):
    """q [T, H, d], k and v [T, KV, d]: head h attends with key/value head h // (H / KV)."""
    t, h, d = q.shape
    k = k.repeat_interleave(h // kv_heads, dim=1)
    v = v.repeat_interleave(h // kv_heads, dim=1)
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(d)
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    p = torch.softmax(scores, -1)
    return torch.einsum("hts,shd->thd", p, v).reshape(t, h * d)


def lin(x, w, b=None):
    """nn.Linear: w [out, in]."""
    y = x @ w.T
    return y if b is None else y + b


def forward(c, tokens):
    t = len(tokens)
    ids = torch.tensor(tokens)
    x = c.embed[ids]
    if c.arch == "gpt2":
        x = x + c.pos_embed[torch.arange(t)]
        for b in c.blocks:
            h = layer_norm(x, b["ln1"], c.eps)
            qkv = h @ b["qkv"][0] + b["qkv"][1]
            q, k, v = qkv.split(c.d, dim=-1)
            shape = (t, c.heads, c.head_dim)
            a = causal_attention(q.reshape(shape), k.reshape(shape), v.reshape(shape), c.heads)
            x = x + a @ b["o"][0] + b["o"][1]
            h = layer_norm(x, b["ln2"], c.eps)
            x = x + gelu_tanh(h @ b["fc"][0] + b["fc"][1]) @ b["proj"][0] + b["proj"][1]
        return layer_norm(x, c.final_norm, c.eps) @ c.lm_head
    for b in c.blocks:
        h = rms_norm(x, b["attn_norm"], c.eps)
        q = lin(h, b["q"], b["q_bias"]).reshape(t, c.heads, c.head_dim)
        k = lin(h, b["k"], b["k_bias"]).reshape(t, c.kv_heads, c.head_dim)
        v = lin(h, b["v"], b["v_bias"]).reshape(t, c.kv_heads, c.head_dim)
        if b["q_norm"] is not None:  # Qwen3
            q, k = rms_norm(q, b["q_norm"], c.eps), rms_norm(k, b["k_norm"], c.eps)
        q, k = rotary(q, c.inv_freq, c.rope_style), rotary(k, c.inv_freq, c.rope_style)
        x = x + lin(causal_attention(q, k, v, c.kv_heads), b["o"])
        h = rms_norm(x, b["ffn_norm"], c.eps)
        gate = lin(h, b["gate"])
        x = x + lin(gate * torch.sigmoid(gate) * lin(h, b["up"]), b["down"])
    return rms_norm(x, c.final_norm, c.eps) @ c.lm_head


ADAPTER_ROLES = {"self_attn.q_proj": "q", "self_attn.k_proj": "k", "self_attn.v_proj": "v", "self_attn.o_proj": "o",
                 "mlp.gate_proj": "gate", "mlp.up_proj": "up", "mlp.down_proj": "down"}
# GPT-2's modules (transformer.h.<i>.<module>) and their blocks' keys; the weights are Conv1D [in, out].
GPT2_ADAPTER_ROLES = {"attn.c_attn": "qkv", "attn.c_proj": "o", "mlp.c_fc": "fc", "mlp.c_proj": "proj"}


def merge_adapter(c, directory, gguf):
    cfg = json.load(open(os.path.join(directory, "adapter_config.json")))
    r, alpha = cfg["r"], cfg["lora_alpha"]
    scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    t = read_safetensors(os.path.join(directory, "adapter_model.safetensors"))
    for name in t:
        if not name.endswith(".lora_A.weight"):
            continue
        module = name[len("base_model.model."):-len(".lora_A.weight")]
        parts = module.split(".")  # model.layers.<i>.<block>.<proj>, transformer.h.<i>.<block>.<proj>
        delta = scale * (t[module_b(name)] @ t[name])  # [out, in]
        if c.arch == "gpt2":
            layer, role = int(parts[2]), GPT2_ADAPTER_ROLES[".".join(parts[3:])]
            w, b = c.blocks[layer][role]
            c.blocks[layer][role] = (w + delta.T, b)
            continue
        layer, role = int(parts[2]), ADAPTER_ROLES[".".join(parts[3:])]
        if gguf and c.rope_style == "normal" and role in ("q", "k"):
            heads = c.heads if role == "q" else c.kv_heads
            # convert_hf_to_gguf.py LlamaModel.permute
            delta = delta.reshape(heads, 2, delta.shape[0] // heads // 2, delta.shape[1]).swapaxes(1, 2).reshape(delta.shape)
        c.blocks[layer][role] = c.blocks[layer][role] + delta


def module_b(a_name):
    return a_name[:-len(".lora_A.weight")] + ".lora_B.weight"


def run(job):
    path = job["model"]
    c = gguf_model(path) if os.path.isfile(path) else hf_model(path)
    if job.get("adapter"):
        merge_adapter(c, job["adapter"], os.path.isfile(path))
    tokens = list(job["tokens"])
    with torch.no_grad():
        out = {"logits": forward(c, tokens).tolist(), "greedy": [], "greedy_logits": [], "greedy_logprobs": [],
               "greedy_top": []}
        for _ in range(job["generate"]):
            last = forward(c, tokens)[-1]
            nxt = int(torch.argmax(last))
            out["greedy"].append(nxt)
            out["greedy_logits"].append(last.tolist())
            logprobs = torch.log_softmax(last, dim=-1)
            out["greedy_logprobs"].append(float(logprobs[nxt]))
            top = torch.topk(logprobs, min(5, logprobs.numel()))
            out["greedy_top"].append([[int(i), float(v)] for v, i in zip(top.values, top.indices)])
            tokens.append(nxt)
    json.dump(out, open(job["out"], "w"))


def main():
    for job in json.load(open(sys.argv[1])):
        run(job)


if __name__ == "__main__":
    main()
