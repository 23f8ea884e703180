#!/usr/bin/env python3
"""Concurrent streamed completions against an OpenAI-compatible server (meshnode's HTTP API,
llama.cpp's llama-server): tokens/s, time to first token and inter-token latency.

  python3 bench/serving/load.py --url http://127.0.0.1:8080 --model tiny --streams 1,4,16 \
      --requests 2 --prompt-words 100 --max-tokens 64 [--label meshnode] [--json out.jsonl]

After --warmup untimed requests (default 1: the first request of a server may build its
programs), each of N streams sends --requests requests one after another, each a streamed /v1/completions
with `ignore_eos` (both servers honour it), so every request generates exactly --max-tokens
tokens. Time to first token: from sending the request to the first text chunk. Inter-token
latency: between consecutive text chunks (a chunk may carry several tokens when text is held
back, e.g. a partial UTF-8 character). Throughput: all completion tokens over the wall time of
the whole level. Every prompt starts with its own number, so no server can reuse a cached
prefix. Standard library only.
"""
import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse


def one_request(url, model, prompt, max_tokens, timeout):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    first = None
    chunk_times = []
    tokens = None
    chunks = 0
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: "):
            continue
        payload = line[6:]
        if payload == "[DONE]":
            break
        event = json.loads(payload)
        if event.get("error"):  # an error after the stream began: the request failed
            raise RuntimeError(f"error event: {event['error'].get('message', '')[:300]}")
        if event.get("usage"):
            tokens = event["usage"].get("completion_tokens", tokens)
        for choice in event.get("choices", []):
            if choice.get("text"):
                now = time.perf_counter()
                if first is None:
                    first = now - t0
                chunk_times.append(now)
                chunks += 1
    conn.close()
    end = time.perf_counter()
    itl = [b - a for a, b in zip(chunk_times, chunk_times[1:])]
    return {"ttft": first if first is not None else end - t0, "itl": itl,
            "tokens": tokens if tokens is not None else chunks, "seconds": end - t0}


def run_level(args, streams, prompt):
    results, errors = [], []
    lock = threading.Lock()
    counter = iter(range(1 << 30))

    def worker():
        for _ in range(args.requests):
            try:
                # A number first: no two prompts share a prefix, so a server's prompt cache
                # (llama-server keeps each slot's last prompt) cannot skip the prefill.
                with lock:
                    n = next(counter)
                r = one_request(args.url, args.model, f"{n} {prompt}", args.max_tokens, args.timeout)
                with lock:
                    results.append(r)
            except Exception as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(str(e))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = sum(r["tokens"] for r in results)
    ttft = sorted(r["ttft"] for r in results)
    itl = sorted(x for r in results for x in r["itl"])

    def pct(xs, p):
        return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")

    per_stream = [r["tokens"] / r["seconds"] for r in results if r["seconds"] > 0]
    return {"label": args.label, "streams": streams, "requests": len(results), "errors": len(errors),
            "first_error": errors[0] if errors else "", "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall if wall > 0 else 0,
            "stream_tokens_per_s": statistics.mean(per_stream) if per_stream else 0,
            "ttft_p50_s": pct(ttft, 0.5), "ttft_p90_s": pct(ttft, 0.9),
            "itl_p50_ms": 1e3 * pct(itl, 0.5), "itl_p90_ms": 1e3 * pct(itl, 0.9)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--streams", default="1,4,16", help="comma-separated concurrency levels")
    ap.add_argument("--requests", type=int, default=2, help="requests per stream")
    ap.add_argument("--prompt-words", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed requests first (a server's first request may build its programs)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every level this many times (a server that builds programs for new batch sizes "
                         "pays for them in the first round; the later ones show the steady state)")
    ap.add_argument("--label", default="")
    ap.add_argument("--json", help="append one JSON line per level to this file")
    args = ap.parse_args()
    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing".split()
    prompt = " ".join(words[i % len(words)] for i in range(args.prompt_words))
    for _ in range(args.warmup):
        one_request(args.url, args.model, prompt, args.max_tokens, args.timeout)
    print(f"{'label':<12} {'streams':>7} {'reqs':>5} {'err':>4} {'tok/s':>9} {'per stream':>10} "
          f"{'TTFT p50':>9} {'TTFT p90':>9} {'ITL p50':>8} {'ITL p90':>8}")
    failed = False
    levels = [int(x) for x in args.streams.split(",")]
    for rnd, n in ((rnd, n) for rnd in range(args.rounds) for n in levels):
        r = run_level(args, n, prompt)
        r["round"] = rnd + 1
        print(f"{r['label'] + (f' r{rnd + 1}' if args.rounds > 1 else ''):<12} {n:>7} {r['requests']:>5} {r['errors']:>4} {r['tokens_per_s']:>9.1f} "
              f"{r['stream_tokens_per_s']:>10.1f} {r['ttft_p50_s']:>8.3f}s {r['ttft_p90_s']:>8.3f}s "
              f"{r['itl_p50_ms']:>6.1f}ms {r['itl_p90_ms']:>6.1f}ms", flush=True)
        if r["errors"]:
            print(f"  first error: {r['first_error']}", file=sys.stderr)
            failed = True
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(r) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
