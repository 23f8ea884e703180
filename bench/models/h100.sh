#!/bin/bash
# Issue 21's GPU benchmark in one device `run` (under 600 s): meshnode through Vulkan beside
# llama.cpp's CUDA and Vulkan builds on the very same random-weight GGUF files (Llama-3.2-1B and Qwen2.5-0.5B
# shapes; F16, Q8_0, Q4_K_M), prompt 512 and generation 128 tokens/s, peak RSS against file size.
#
# usage, from the repository root on the GPU machine:  bash bench/models/h100.sh [DIR]
#   DIR (default .devcarry, carried): llama-src.tar.gz (llama.cpp 34af94cd without models/ etc.),
#   make_gguf.py (shared/anchors/llama_cpp), llama-vulkan.tar.xz (bench/models/llama_vulkan.sh:
#   llama.cpp's Vulkan build, optional), mesh-bench-generate (Release build of this tree:
#   static libstdc++ and shaderc; needs libvulkan.so.1 and DIR/lib). .gl/ (carried) holds the Debian
#   packages of the Vulkan loader that the GPU machine lacks (docs/gpu.md, shared/PLATFORM.md).
# Environment: SHAPES (default "qwen05b llama1b"), H100_BUDGET (seconds the whole script may take, default 570), H100_WORK (work folder,
#   default /tmp/ll: build, files in m/), MESH_RUNS (timed runs
#   of mesh-bench-generate, default 3), LLAMA_REPS (llama-bench -r, default 5), SKIP_LLAMA=1
#   (no CUDA build: llama-quantize from the Vulkan pack, else a CPU-only build, about 2 minutes),
#   SKIP_LLAMA_VK=1 (no llama.cpp Vulkan rows), SKIP_MESH=1, MESH_BASELINE=1 (the Llama-1B files
#   again without fused projections and the few-row matmul: mesh-baseline.txt), MESH_KERNELS=1 (--kernels: the kernel
#   list of a decode step, timed with GPU timestamps, which slow a step by 10-15%).
# Steps: Vulkan loader; llama.cpp CUDA build (sm_90, ~2.5 min) in the background while make_gguf.py
# writes the F16 files; llama-quantize to Q8_0 and Q4_K_M; llama-bench per file (-p 512 -n 128
# -d 0,512 -ngl 99); mesh-bench-generate per file, smallest first. Every step has a timeout and
# a failed step skips only what needs it; each result is printed as it comes and the table at the
# end (bench_table.py). Logs and results go to $OUT (h100.log, table.md, results in llama.jsonl,
# llama-rss.txt, mesh.txt, llama-build.log), which comes back from the device `run`.
# DIR/lib/ holds shared libraries mesh-bench-generate needs beyond libvulkan.so.1 (Debian's
# libfmt.so.9: Debian ships no static libfmt); bench/models/devcarry.sh fills DIR and .gl/.
set -u -o pipefail
T0=$SECONDS
BUDGET=${H100_BUDGET:-570}
ROOT=$(pwd)
D=$(realpath "${1:-.devcarry}")
HERE=$(cd "$(dirname "$0")" && pwd)
W=${H100_WORK:-/tmp/ll}
M=$W/m
O=${OUT:-$W/out}
mkdir -p "$W/src" "$M" "$O"
exec > >(tee -a "$O/h100.log") 2>&1
exec 3>&1  # log lines go here even while a step's output is redirected

log() { printf '[h100 %4ds] %s\n' $((SECONDS - T0)) "$*" >&3; }
left() { echo $((BUDGET - (SECONDS - T0))); }
# cap N: N seconds, or fewer so as to end 10 s before the budget (at least 1).
cap() { local c=$(($(left) - 10)); [ "$c" -lt "$1" ] || c=$1; [ "$c" -ge 1 ] || c=1; echo "$c"; }
# t SECONDS CMD...: run CMD under a timeout, log it and its exit status (124: timed out).
t() {
  local s=$1; shift
  log "+ (timeout ${s}s) $*"
  timeout -k 5 "$s" "$@"
  local rc=$?
  [ $rc = 0 ] || log "exit $rc ($([ $rc = 124 ] && echo 'timed out' || echo failed)): $*"
  return $rc
}
TABLE=$HERE/bench_table.py
[ -f "$TABLE" ] || TABLE=$D/bench_table.py
SHAPES=${SHAPES:-"qwen05b llama1b"}
# Smallest first, so that a short budget still measures most rows.
FILES=
for f in qwen05b-Q4_K_M qwen05b-Q8_0 llama1b-Q4_K_M qwen05b-f16 llama1b-Q8_0 llama1b-f16; do
  case " $SHAPES " in *" ${f%%-*} "*) FILES="$FILES $M/$f.gguf" ;; esac
done
table() { python3 "$TABLE" "$O" 512 128 $FILES | tee "$O/table.md"; }

log "dir $D, budget ${BUDGET}s, out $O"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv 2>&1
nproc; python3 -c 'import numpy; print("numpy", numpy.__version__)' 2>&1

# 1. Vulkan loader (+ libEGL/libGLdispatch that the NVIDIA ICD needs).
GL=${GL_DIR:-$ROOT/.gl}
for f in "$GL"/*.deb; do dpkg -x "$f" / || log "dpkg -x $f failed"; done
ldconfig
ldconfig -p | grep -q 'libvulkan.so.1' && log "libvulkan.so.1 present" || log "NO libvulkan.so.1 (carry .gl)"
if ! ls /etc/vulkan/icd.d/*nvidia* /usr/share/vulkan/icd.d/*nvidia* >/dev/null 2>&1 &&
    [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
  log "using VK_DRIVER_FILES=$VK_DRIVER_FILES"
fi
MESH=$D/mesh-bench-generate
LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$MESH" 2>&1 | sed 's/^/  ldd: /'

# 2. llama.cpp CUDA build in the background; the F16 files meanwhile.
LB=$W/build/bin
BUILD_PID=
if [ "${SKIP_LLAMA:-0}" != 1 ] && { [ ! -x "$LB/llama-bench" ] || [ ! -x "$LB/llama-quantize" ]; }; then
  [ -f "$W/src/CMakeLists.txt" ] || t 60 tar -xzf "$D/llama-src.tar.gz" -C "$W/src"
  (
    cd "$W" &&
      timeout 90 cmake -S src -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF >cfg.log 2>&1 &&
      timeout 330 cmake --build build -j"$(nproc)" --target llama-bench llama-quantize
  ) >"$O/llama-build.log" 2>&1 &
  BUILD_PID=$!
  log "llama.cpp build started (pid $BUILD_PID, log $O/llama-build.log)"
fi
GGUF_PIDS=
for s in $SHAPES; do
  if [ ! -s "$M/$s-f16.gguf" ]; then
    # gguf-py from the llama.cpp tree; wait for the tarball to be unpacked (done above) if needed.
    [ -f "$W/src/gguf-py/gguf/__init__.py" ] || t 60 tar -xzf "$D/llama-src.tar.gz" -C "$W/src"
    (timeout 240 python3 "$D/make_gguf.py" "$W/src" $s "$M/$s-f16.gguf.tmp" && mv "$M/$s-f16.gguf.tmp" "$M/$s-f16.gguf") \
      >"$W/gguf-$s.log" 2>&1 &
    GGUF_PIDS="$GGUF_PIDS $!"
  fi
done
for p in $GGUF_PIDS; do wait "$p" || log "make_gguf (pid $p) failed"; done
for s in $SHAPES; do tail -2 "$W/gguf-$s.log" 2>/dev/null; done
log "F16 files written"
if [ -n "$BUILD_PID" ]; then
  wait "$BUILD_PID" && log "llama.cpp built" || { log "llama.cpp build FAILED:"; tail -25 "$O/llama-build.log"; tail -5 "$W/cfg.log"; }
fi

# 3. Q8_0 and Q4_K_M with llama-quantize. Without the CUDA build (SKIP_LLAMA=1 on a fresh machine,
# or a failed build) a CPU-only llama-quantize is built instead (about a minute on 16 cores;
# llama-quantize quantizes on the CPU in both builds).
# llama.cpp's Vulkan build (bench/models/llama_vulkan.sh packs it: prebuilt libraries from npm, tools
# compiled against them); its llama-quantize serves when the CUDA build is skipped or failed.
LVK=$W/llama-vulkan
if [ "${SKIP_LLAMA_VK:-0}" != 1 ] && [ -s "$D/llama-vulkan.tar.xz" ] && [ ! -x "$LVK/llama-bench" ]; then
  t 60 tar -xJf "$D/llama-vulkan.tar.xz" -C "$W" && cat "$LVK/VERSION"
fi
LQ=$LB/llama-quantize
[ -x "$LQ" ] || LQ=$LVK/llama-quantize
[ -x "$LQ" ] || LQ=$W/build-cpu/bin/llama-quantize
if [ ! -x "$LQ" ] && [ -f "$W/src/CMakeLists.txt" ] && [ "$(left)" -gt 150 ]; then
  log "building a CPU-only llama-quantize (log $W/build-cpu.log)"
  (
    cd "$W" &&
      timeout 60 cmake -S src -B build-cpu -G Ninja -DGGML_CUDA=OFF -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF &&
      timeout 240 cmake --build build-cpu -j"$(nproc)" --target llama-quantize
  ) >"$W/build-cpu.log" 2>&1 && log "built" || { log "CPU llama-quantize build FAILED"; tail -10 "$W/build-cpu.log"; }
fi
if [ -x "$LQ" ]; then
  for s in $SHAPES; do
    for q in Q8_0 Q4_K_M; do
      [ -s "$M/$s-$q.gguf" ] && continue
      [ -s "$M/$s-f16.gguf" ] || continue
      t "$(cap 120)" "$LQ" "$M/$s-f16.gguf" "$M/$s-$q.gguf.tmp" $q >"$W/quantize.log" 2>&1 &&
        mv "$M/$s-$q.gguf.tmp" "$M/$s-$q.gguf" || tail -5 "$W/quantize.log"
    done
  done
else
  log "no llama-quantize: no Q8_0 / Q4_K_M files"
fi
ls -la "$M"

# Peak RSS of a child (llama-bench prints none): a Python wrapper, no GNU time needed.
cat >"$W/rss.py" <<'EOF'
import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
with open(sys.argv[1], "a") as f:
    f.write("%s peak_rss_kib=%d\n" % (sys.argv[sys.argv.index("-m") + 1], resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(rc)
EOF

# 4. llama.cpp CUDA, one process per file (its own peak RSS; a failure costs one row).
if [ "${SKIP_LLAMA:-0}" != 1 ] && [ -x "$LB/llama-bench" ]; then
  for f in $FILES; do
    [ -s "$f" ] || { log "missing $f"; continue; }
    [ "$(left)" -gt 40 ] || { log "budget: skip llama-bench $f"; continue; }
    t "$(cap 90)" python3 "$W/rss.py" "$O/llama-rss.txt" "$LB/llama-bench" -m "$f" -p 512 -n 128 -d 0,512 -ngl 99 \
      -r "${LLAMA_REPS:-5}" -o jsonl -oe md >>"$O/llama.jsonl" 2>"$W/llama-bench.err"
    grep '^|' "$W/llama-bench.err" | grep -v '^| model\|^| ---'
    grep -i 'error\|fail' "$W/llama-bench.err" | head -5
    tail -1 "$O/llama-rss.txt"
  done
fi

# 4b. llama.cpp Vulkan, the same way.
if [ "${SKIP_LLAMA_VK:-0}" != 1 ] && [ -x "$LVK/llama-bench" ]; then
  t 30 "$LVK/llama-bench" --list-devices 2>&1 | tail -5
  for f in $FILES; do
    [ -s "$f" ] || continue
    [ "$(left)" -gt 60 ] || { log "budget: skip llama-bench (Vulkan) $f"; continue; }
    t "$(cap 90)" python3 "$W/rss.py" "$O/llama-vk-rss.txt" "$LVK/llama-bench" -m "$f" -p 512 -n 128 -d 0,512 -ngl 99 \
      -r "${LLAMA_REPS:-5}" -o jsonl -oe md >>"$O/llama-vk.jsonl" 2>"$W/llama-vk.err"
    grep '^|' "$W/llama-vk.err" | grep -v '^| model\|^| ---'
    grep -i 'error\|fail\|ggml_vulkan' "$W/llama-vk.err" | head -5
  done
fi

# 5. meshnode through Vulkan, same files, smallest first, each under a share of the time left.
# Options an older mesh-bench-generate lacks (--runs, --kernels) are left out; bench_table.py reads
# its human-readable lines too. Full output (kernel lists included) goes to $OUT/mesh.txt.
if [ "${SKIP_MESH:-0}" != 1 ]; then
  export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  usage=$("$MESH" 2>&1)
  opts=""
  grep -q -- --runs <<<"$usage" && opts="$opts --runs ${MESH_RUNS:-3}"
  grep -q -- --kernels <<<"$usage" && [ "${MESH_KERNELS:-0}" = 1 ] && opts="$opts --kernels"
  n=0; for f in $FILES; do [ -s "$f" ] && n=$((n + 1)); done
  for f in $FILES; do
    [ -s "$f" ] || continue
    # an equal share of the time left, at most 150 s; at least 30 s while the budget has them
    share=$(( ($(left) - 15) / n )); [ $share -gt 150 ] && share=150
    [ $share -ge 30 ] || share=$(cap 30)
    n=$((n - 1))
    [ "$share" -ge 15 ] || { log "budget: skip meshnode $f"; continue; }
    t $share "$MESH" "$f" --prompt 512 --generate 128 --context 640 $opts >"$W/mesh.out" 2>"$W/mesh.err"
    grep -v '^  ' "$W/mesh.out"; tail -15 "$W/mesh.err"
    cat "$W/mesh.out" >>"$O/mesh.txt"
  done
fi

# 6. What the fused projections and the few-row attention matmul gain: the Llama-1B files again
# without them (--unfused, MESH_GEMM=noskinny), same budget rules, into $OUT/mesh-baseline.txt.
if [ "${SKIP_MESH:-0}" != 1 ] && [ "${MESH_BASELINE:-0}" = 1 ]; then
  for f in $M/llama1b-Q4_K_M.gguf $M/llama1b-f16.gguf; do
    [ -s "$f" ] || continue
    [ "$(left)" -gt 45 ] || { log "budget: skip the baseline of $f"; continue; }
    MESH_GEMM=noskinny t "$(cap 60)" "$MESH" "$f" --prompt 512 --generate 128 --context 640 $opts --unfused \
      >"$W/mesh.out" 2>"$W/mesh.err"
    grep -v '^  ' "$W/mesh.out"; tail -5 "$W/mesh.err"
    cat "$W/mesh.out" >>"$O/mesh-baseline.txt"
  done
fi

log "done; table (also in \$OUT/table.md):"
table
sleep 1  # let tee write the log
exit 0
