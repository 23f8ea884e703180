#!/usr/bin/env python3
"""Side-by-side table of llama.cpp (llama-bench -o jsonl) and meshnode (mesh-bench-generate) runs on
the same GGUF files, for bench/models/h100.sh and cpu.sh. Standard library only.

usage: bench_table.py DIR PROMPT GENERATE FILE...
  DIR/llama.jsonl  llama-bench's jsonl lines (any number of runs; matched by model_filename)
  DIR/llama-vk.jsonl  the same from llama.cpp's Vulkan build (a second table when present)
  DIR/llama-rss.txt  lines "FILE peak_rss_kib=N" (llama-bench's peak resident memory)
  DIR/mesh.txt     mesh-bench-generate's "bench_generate ... file=PATH" lines
Prints a markdown table, one row per FILE in the order given; a missing figure is "-" (a run that
failed or was not made)."""
import json
import os
import sys


def read_lines(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().splitlines()
    except OSError:
        return []


def read_llama(path, prompt, gen):
    """(file, test) -> (avg_ts, stddev_ts) from llama-bench's jsonl lines; test: pp, tg, tgd (tg at
    depth = prompt)."""
    llama = {}
    for line in read_lines(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            r = json.loads(line)
        except ValueError:
            continue
        f = os.path.realpath(r.get("model_filename", ""))
        n_p, n_g, depth = r.get("n_prompt", 0), r.get("n_gen", 0), r.get("n_depth", 0)
        if n_p == prompt and n_g == 0 and depth == 0:
            llama[(f, "pp")] = (r["avg_ts"], r["stddev_ts"])
        elif n_p == 0 and n_g == gen and depth == 0:
            llama[(f, "tg")] = (r["avg_ts"], r["stddev_ts"])
        elif n_p == 0 and n_g == gen and depth == prompt:
            llama[(f, "tgd")] = (r["avg_ts"], r["stddev_ts"])
    return llama


def main():
    if len(sys.argv) < 5:
        print(__doc__, file=sys.stderr)
        return 2
    d, prompt, gen, files = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    key = lambda p: os.path.realpath(p)
    llama = read_llama(os.path.join(d, "llama.jsonl"), prompt, gen)
    llama_vk = read_llama(os.path.join(d, "llama-vk.jsonl"), prompt, gen)
    llama_rss = {}
    for line in read_lines(os.path.join(d, "llama-rss.txt")):
        parts = line.rsplit(" peak_rss_kib=", 1)
        if len(parts) == 2 and parts[1].strip().isdigit():
            llama_rss[key(parts[0])] = int(parts[1]) / 1024
    mesh = {}
    # The "bench_generate ... file=PATH" line; else (an older mesh-bench-generate) its
    # human-readable "checkpoint / prompt / generation / peak RSS" lines.
    cur = None
    for line in read_lines(os.path.join(d, "mesh.txt")):
        if line.startswith("bench_generate "):
            head, _, path = line.partition(" file=")
            kv = dict(t.split("=", 1) for t in head.split()[1:] if "=" in t)
            mesh[key(path.strip())] = kv
            cur = None
            continue
        word, _, rest = line.partition(" ")
        rest = rest.strip()
        try:
            if word == "device":
                cur = {"device": rest.replace(" ", "_")}
            elif word == "checkpoint" and cur is not None:
                cur["file"] = key(rest.split(" (", 1)[0])
            elif word in ("prompt", "generation") and cur is not None:
                tps = rest.split(": ", 1)[1].split()[0]
                cur["prompt_tps" if word == "prompt" else "gen_tps"] = tps
                cur.setdefault("prompt_tps_sd" if word == "prompt" else "gen_tps_sd", "nan")
            elif line.startswith("peak RSS") and cur is not None and "file" in cur:
                cur["peak_rss_mib"] = line.split()[2]
                if cur["file"] not in mesh and "gen_tps" in cur:
                    mesh[cur["file"]] = cur
                cur = None
        except (IndexError, ValueError):
            cur = None

    def num(x, fmt="{:,.1f}"):
        return "-" if x is None else fmt.format(x)

    def ratio(a, b):
        if a is None or b is None or b == 0:
            return "-"
        return ("{:.0%}" if a / b >= 0.1 else "{:.1%}").format(a / b)

    def tps(x):  # tokens/s: two decimals below 10
        return ("{:,.2f}" if abs(x) < 10 else "{:,.1f}").format(x)

    device = next((m.get("device", "").replace("_", " ") for m in mesh.values()), "")
    print(f"meshnode device: {device or '-'}; llama-bench t/s are mean ± sd of its repetitions, "
          f"meshnode's of its --runs; meshnode generates after the {prompt}-token prompt (depth {prompt}).")
    print()
    print(f"| file | MiB | llama.cpp pp{prompt} | meshnode pp{prompt} | pp ratio "
          f"| llama.cpp tg{gen} | llama.cpp tg{gen} @ d{prompt} | meshnode tg{gen} @ d{prompt} | tg ratio (vs @ d{prompt}) "
          f"| meshnode peak RSS MiB | RSS / file | llama.cpp peak RSS MiB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    def fmt_sd(x):
        return "-" if x is None else tps(x[0]) + " ± " + tps(x[1])

    def figures(anchor, k):
        """An anchor's pp, tg, tg @ depth of file key k, meshnode's line and its pp and tg."""
        pp, tg, tgd = (anchor.get((k, t)) for t in ("pp", "tg", "tgd"))
        m = mesh.get(k)
        return pp, tg, tgd, m, float(m["prompt_tps"]) if m else None, float(m["gen_tps"]) if m else None

    for f in files:
        k = key(f)
        size = os.path.getsize(f) / 2**20 if os.path.exists(f) else None
        pp, tg, tgd, m, m_pp, m_tg = figures(llama, k)
        m_rss = float(m["peak_rss_mib"]) if m else None
        def with_sd(x, sd):
            return "-" if m is None else tps(x) + ("" if sd == "nan" else " ± " + tps(float(sd)))
        m_pp_s = with_sd(m_pp, m and m.get("prompt_tps_sd", "nan"))
        m_tg_s = with_sd(m_tg, m and m.get("gen_tps_sd", "nan"))
        print(f"| {os.path.basename(f)} | {num(size, '{:,.0f}')} | {fmt_sd(pp)} | {m_pp_s} | "
              f"{ratio(m_pp, pp and pp[0])} | {fmt_sd(tg)} | {fmt_sd(tgd)} | {m_tg_s} | {ratio(m_tg, tgd and tgd[0])} | "
              f"{num(m_rss, '{:,.0f}')} | {num(m_rss / size, '{:.2f}x') if m_rss and size else '-'} | "
              f"{num(llama_rss.get(k), '{:,.0f}')} |")
    if llama_vk:
        print()
        print(f"llama.cpp's Vulkan build (llama-vk.jsonl) beside meshnode, same files:")
        print()
        print(f"| file | llama.cpp Vulkan pp{prompt} | meshnode pp{prompt} | pp ratio "
              f"| llama.cpp Vulkan tg{gen} | llama.cpp Vulkan tg{gen} @ d{prompt} | meshnode tg{gen} @ d{prompt} "
              f"| tg ratio (vs @ d{prompt}) |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for f in files:
            pp, tg, tgd, m, m_pp, m_tg = figures(llama_vk, key(f))
            print(f"| {os.path.basename(f)} | {fmt_sd(pp)} | {num(m_pp)} | {ratio(m_pp, pp and pp[0])} | "
                  f"{fmt_sd(tg)} | {fmt_sd(tgd)} | {num(m_tg)} | {ratio(m_tg, tgd and tgd[0])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
