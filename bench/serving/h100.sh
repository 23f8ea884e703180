#!/bin/bash
# Issue 22's single-node serving benchmark in one device `run` (under 600 s): meshnode's model host
# and HTTP API (mesh-bench-serve, Vulkan) beside llama.cpp's llama-server (CUDA build) on the same
# random-weight GGUF file (Llama-3.2-1B shape, Q4_K_M), both driven by bench/serving/load.py:
# 1, 4 and 16 concurrent streams, each request a 100-word prompt and 128 generated tokens.
#
# usage, from the repository root on the GPU machine:  bash bench/serving/h100.sh
#   .devcarry/ (bench/serving/devcarry.sh fills it): mesh-bench-serve and its lib/, llama-src.tar.gz,
#   make_gguf.py; .gl/: the Vulkan loader packages (shared/PLATFORM.md).
# Environment: H100_BUDGET (seconds, default 570), H100_WORK (default /tmp/ls), STREAMS (default
#   1,4,16), REQUESTS (per stream, default 2), MAX_TOKENS (128), PROMPT_WORDS (100), SHAPE (llama1b),
#   QUANT (Q4_K_M), NP (slots of both servers, default 16), SKIP_SERVE=1 (no mesh-bench-serve),
#   SPLITS (e.g. "1 2 3": also the split benchmark, bench/serving/split.sh, with meshnode and
#   meshctl from .devcarry; SPLIT_LINKS, default "loopback shaped"; ROUNDS, default 1; DEVICES:
#   the nodes' devices, e.g. "#0 #1" on two GPUs),
#   LLAMA_SERVER=0 (no llama-server: llama.cpp's CPU build of llama-quantize only, for the file).
# llama-server runs with -np NP slots (its continuous batching) and -c NP*2048; mesh-bench-serve
# with --parallel NP (its continuous batching) and a context of 2048 per slot.
# Results: $OUT (default $H100_WORK/out): serving.log, results.jsonl, llama-server.log, mesh.log.
set -u -o pipefail
T0=$SECONDS
BUDGET=${H100_BUDGET:-570}
ROOT=$(pwd)
D=$ROOT/.devcarry
W=${H100_WORK:-/tmp/ls}
O=${OUT:-$W/out}
M=$W/m
mkdir -p "$W/src" "$M" "$O"
exec > >(tee -a "$O/serving.log") 2>&1
log() { printf '[serve %4ds] %s\n' $((SECONDS - T0)) "$*"; }
left() { echo $((BUDGET - (SECONDS - T0))); }
SHAPE=${SHAPE:-llama1b} QUANT=${QUANT:-Q4_K_M} NP=${NP:-16}
STREAMS=${STREAMS:-1,4,16} REQUESTS=${REQUESTS:-2} MAX_TOKENS=${MAX_TOKENS:-128} PROMPT_WORDS=${PROMPT_WORDS:-100}
F=$M/$SHAPE-$QUANT.gguf
LOAD="python3 $ROOT/bench/serving/load.py --streams $STREAMS --requests $REQUESTS --max-tokens $MAX_TOKENS --prompt-words $PROMPT_WORDS --json $O/results.jsonl"

log "budget ${BUDGET}s, file $F, streams $STREAMS x $REQUESTS requests, $MAX_TOKENS tokens"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1

# 1. Vulkan loader.
for f in "$ROOT"/.gl/*.deb; do dpkg -x "$f" / || log "dpkg -x $f failed"; done
ldconfig
if ! ls /etc/vulkan/icd.d/*nvidia* /usr/share/vulkan/icd.d/*nvidia* >/dev/null 2>&1 &&
    [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
fi
export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ldd "$D/mesh-bench-serve" | grep -i "not found" && log "mesh-bench-serve misses libraries"

# 2. llama.cpp CUDA build (llama-server, llama-quantize) in the background; the F16 file meanwhile.
LB=$W/build/bin
tar -xzf "$D/llama-src.tar.gz" -C "$W/src"
(
  cd "$W" &&
    if [ "${LLAMA_SERVER:-1}" = 1 ]; then CUDA=ON TARGETS="llama-server llama-quantize"; else CUDA=OFF TARGETS=llama-quantize; fi &&
    timeout 90 cmake -S src -B build -G Ninja -DGGML_CUDA=$CUDA -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
      -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >cfg.log 2>&1 &&
    timeout 360 cmake --build build -j"$(nproc)" --target $TARGETS
) >"$O/llama-build.log" 2>&1 &
BUILD=$!
# make_gguf.py's vocabulary has the merge "Ġ Ġ", whose result "ĠĠ" is not a token: llama.cpp
# ignores such a merge, meshnode's tokenizer refuses the file (as Hugging Face's tokenizers do).
# The file for both servers keeps only the merge "t 1" (its result "t1" is a token).
sed 's/\["Ġ Ġ", "t 1"\]/["t 1"]/' "$D/make_gguf.py" >"$W/make_gguf.py"
grep -q '\["t 1"\]' "$W/make_gguf.py" || log "make_gguf.py: the merge list was not found to patch"
timeout 240 python3 "$W/make_gguf.py" "$W/src" "$SHAPE" "$M/$SHAPE-f16.gguf" >"$W/gguf.log" 2>&1 || { log "make_gguf failed"; tail -5 "$W/gguf.log"; }
wait $BUILD && log "llama.cpp built" || { log "llama.cpp build FAILED"; tail -20 "$O/llama-build.log"; tail -5 "$W/cfg.log"; }
timeout 120 "$LB/llama-quantize" "$M/$SHAPE-f16.gguf" "$F" "$QUANT" >"$W/quantize.log" 2>&1 || { log "quantize failed"; tail -5 "$W/quantize.log"; }
ls -la "$M"

# wait_http URL SECONDS PID: until URL answers 200 (false at once when PID has exited).
wait_http() {
  for _ in $(seq $(($2 * 5))); do
    kill -0 "$3" 2>/dev/null || return 1
    python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=2)" "$1" 2>/dev/null && return 0
    sleep 0.2
  done
  return 1
}

# 3. llama-server, then meshnode, one at a time on the same GPU.
if [ -x "$LB/llama-server" ] && [ -s "$F" ]; then
  "$LB/llama-server" -m "$F" -ngl 99 -np "$NP" -c $((NP * 2048)) --host 127.0.0.1 --port 8090 >"$O/llama-server.log" 2>&1 &
  LS=$!
  if wait_http http://127.0.0.1:8090/health 120 $LS; then
    log "llama-server up"
    timeout "$(( $(left) / 2 ))" $LOAD --url http://127.0.0.1:8090 --model "$SHAPE-$QUANT" --label llama-server
  else
    log "llama-server did not start"; tail -20 "$O/llama-server.log"
  fi
  kill $LS; wait $LS 2>/dev/null
fi
if [ -s "$F" ] && [ "${SKIP_SERVE:-0}" != 1 ]; then
  "$D/mesh-bench-serve" "$F" --port 8091 --context 2048 --parallel "$NP" --id "$SHAPE-$QUANT" >"$O/mesh.log" 2>&1 &
  MS=$!
  if wait_http http://127.0.0.1:8091/v1/models 180 $MS; then
    log "mesh-bench-serve up: $(head -1 "$O/mesh.log")"
    timeout "$(( $(left) - 10 ))" $LOAD --url http://127.0.0.1:8091 --model "$SHAPE-$QUANT" --label meshnode
  else
    log "mesh-bench-serve did not start"; tail -20 "$O/mesh.log"
  fi
  kill $MS; wait $MS 2>/dev/null
fi
# 4. With SPLITS (e.g. "1 2 3"): the same file served by meshnode processes on this GPU, split
#    over 1, 2 and 3 of them (bench/serving/split.sh), on loopback and, where this machine allows
#    network namespaces and tc, over shaped links (1 Gbit/s, 1 ms each way).
if [ -n "${SPLITS:-}" ] && [ -x "$D/meshnode" ] && [ -s "$F" ]; then
  for link in ${SPLIT_LINKS:-loopback shaped}; do
    if [ "$link" = shaped ] && ! { command -v tc >/dev/null && ip netns add "mnprobe$$" 2>/dev/null && ip netns del "mnprobe$$"; }; then
      log "no network namespaces or tc here: shaped links skipped"
      continue
    fi
    LINK=$link BIN=$D DELAY_LINE=$D/mesh-delay-line DEVICE=vulkan DEVICES="${DEVICES:-}" SPLITS="$SPLITS" OUT=$O/split-$link NP=$NP CONTEXT=2048 STREAMS=$STREAMS \
      REQUESTS=$REQUESTS MAX_TOKENS=$MAX_TOKENS PROMPT_WORDS=$PROMPT_WORDS ROUNDS=${ROUNDS:-1} \
      timeout "$(( $(left) - 10 ))" bash "$ROOT/bench/serving/split.sh" "$F"
  done
fi
log "done"
cat "$O/results.jsonl" 2>/dev/null
