#!/bin/bash
# Issue 21's CPU benchmark: meshnode's CPU executor beside llama.cpp's CPU build on the same
# random-weight GGUF files (Llama-3.2-1B and Qwen2.5-0.5B shapes; F16, Q8_0, Q4_K_M), prompt 128
# and generation 32 tokens/s with 2 threads, peak RSS against file size.
#
# usage, from the repository root:  bench/models/cpu.sh [FILE.gguf...]
#   (default: the six files in $GGUF_DIR, smallest first)
# Environment:
#   GGUF_DIR   default /tmp/gguf (qwen05b-f16/Q8_0/Q4_K_M.gguf, llama1b-...; written by make_gguf.py
#              and llama-quantize, see docs/models.md "Benchmarks")
#   LLAMA_BIN  default /tmp/llcpu/build/bin (llama-bench of llama.cpp's CPU build, -DGGML_NATIVE=ON)
#   MESH       default build/release/bench/models/mesh-bench-generate (a Release build)
#   THREADS    default 2;  REPS default 3 (llama-bench -r and mesh-bench-generate --runs)
#   OUT        where results and the table go (default /tmp/bench-cpu-<time>)
#   SKIP_LLAMA=1 / SKIP_MESH=1   one side only (results already in OUT are kept and tabled; a
#              later result for the same file replaces an earlier one)
#   CASE_TIMEOUT  seconds per file and side (default 900); PROMPT, GENERATE (default 128, 32)
#   MESH_VARIANTS  space-separated environment settings, meshnode run once with each after
#              llama.cpp on every file, one table each (e.g. "MESH_CPU_LINEAR=f32
#              MESH_CPU_LINEAR=int8": the f32 and the integer decode kernels, docs/gpu.md)
# llama-bench runs -p 128 -n 32 -d 0,128 (tg32 at an empty cache and after 128 positions, which is
# where meshnode's generation runs). Both run THREADS threads (llama-bench -t, mesh --threads).
# One file at a time, llama.cpp then meshnode, so that the two of a file see about the same load
# (the machine is shared: the load average is printed beside each run).
set -u -o pipefail
T0=$SECONDS
HERE=$(cd "$(dirname "$0")" && pwd)
GGUF_DIR=${GGUF_DIR:-/tmp/gguf}
LLAMA_BIN=${LLAMA_BIN:-/tmp/llcpu/build/bin}
MESH=${MESH:-build/release/bench/models/mesh-bench-generate}
THREADS=${THREADS:-2}
REPS=${REPS:-3}
O=${OUT:-/tmp/bench-cpu-$(date +%Y%m%d-%H%M%S)}
P=${PROMPT:-128} G=${GENERATE:-32}
mkdir -p "$O"
log() { printf '[cpu %4ds] %s\n' $((SECONDS - T0)) "$*"; }
load() { cut -d' ' -f1-3 /proc/loadavg; }
if [ $# -gt 0 ]; then FILES=("$@"); else
  FILES=()
  for s in qwen05b-Q4_K_M qwen05b-Q8_0 llama1b-Q4_K_M qwen05b-f16 llama1b-Q8_0 llama1b-f16; do FILES+=("$GGUF_DIR/$s.gguf"); done
fi
log "out $O; $(nproc) cores; load: $(load)"
grep -m1 'model name' /proc/cpuinfo

# Peak RSS of a child (llama-bench prints none).
cat >"$O/rss.py" <<'EOF'
import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
with open(sys.argv[1], "a") as f:
    f.write("%s peak_rss_kib=%d\n" % (sys.argv[sys.argv.index("-m") + 1], resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(rc)
EOF

llama_one() {
  local f=$1 rc
  log "+ llama-bench $f (load $(load))"
  /usr/bin/python3 "$O/rss.py" "$O/llama-rss.txt" timeout "${CASE_TIMEOUT:-900}" "$LLAMA_BIN/llama-bench" -m "$f" \
    -p "$P" -n "$G" -d "0,$P" -t "$THREADS" -r "$REPS" -o jsonl -oe md >>"$O/llama.jsonl" 2>"$O/llama-bench.err"
  rc=$?
  grep '^|' "$O/llama-bench.err" | grep -v '^| model\|^| ---'
  [ $rc = 0 ] || { log "llama-bench exit $rc"; tail -5 "$O/llama-bench.err"; }
}

mesh_one() {
  local f=$1 v=${2:-} rc
  local d=$O${v:+/$v}
  mkdir -p "$d"
  log "+ ${v:+$v }mesh-bench-generate $f --cpu (load $(load))"
  env $v timeout "${CASE_TIMEOUT:-900}" "$MESH" "$f" --cpu --prompt "$P" --generate "$G" --context $((P + G)) \
    --runs "$REPS" --threads "$THREADS" >"$d/mesh.out" 2>"$d/mesh.err"
  rc=$?
  cat "$d/mesh.out"; tail -5 "$d/mesh.err"
  [ $rc = 0 ] || log "mesh-bench-generate exit $rc$([ $rc = 124 ] && echo ' (timed out)')"
  cat "$d/mesh.out" >>"$d/mesh.txt"
}

for f in "${FILES[@]}"; do
  [ -s "$f" ] || { log "missing $f"; continue; }
  [ "${SKIP_LLAMA:-0}" = 1 ] || llama_one "$f"
  if [ "${SKIP_MESH:-0}" != 1 ]; then
    if [ -n "${MESH_VARIANTS:-}" ]; then
      for v in $MESH_VARIANTS; do mesh_one "$f" "$v"; done
    else mesh_one "$f"; fi
  fi
done

log "done (load $(load)); table (also in $O/table.md):"
if [ -n "${MESH_VARIANTS:-}" ]; then
  for v in $MESH_VARIANTS; do
    for x in llama.jsonl llama-rss.txt; do [ -e "$O/$x" ] && ln -sf "$O/$x" "$O/$v/$x"; done
    echo "meshnode with $v:"
    /usr/bin/python3 "$HERE/bench_table.py" "$O/$v" "$P" "$G" "${FILES[@]}"
    echo
  done | tee "$O/table.md"
else
  /usr/bin/python3 "$HERE/bench_table.py" "$O" "$P" "$G" "${FILES[@]}" | tee "$O/table.md"
fi
