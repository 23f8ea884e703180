#!/bin/bash
# Adds what bench/serving/h100.sh needs to the git-ignored .devcarry/ that the device `run`
# carries (run from the checkout's root): mesh-bench-serve (Release build of this checkout, static
# libstdc++) and the shared libraries it needs that the GPU machine lacks (cpp-httplib and its
# OpenSSL, zlib and Brotli, libfmt, ...) in .devcarry/lib. llama-src.tar.gz, make_gguf.py and .gl/
# come from bench/models/devcarry.sh (run it first on a fresh checkout).
# Environment: SKIP_BUILD=1 (copy an existing build), JOBS (default 2).
set -euo pipefail
root=$(pwd)
log() { printf '[devcarry serving] %s\n' "$*"; }
[ -f CMakeLists.txt ] && [ -e .git ] || { log "run from a checkout's root"; exit 2; }
[ -s .devcarry/llama-src.tar.gz ] && [ -f .devcarry/make_gguf.py ] && ls .gl/libvulkan1_*.deb >/dev/null 2>&1 ||
  { log "run bench/models/devcarry.sh first (llama.cpp source, make_gguf.py, the Vulkan loader)"; exit 2; }
bin=build/release/bench/serving/mesh-bench-serve
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  export CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1
  nice -n 10 cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  nice -n 10 cmake --build build/release -j "${JOBS:-2}" --target mesh-bench-serve
fi
install -m 755 "$bin" .devcarry/mesh-bench-serve
mkdir -p .devcarry/lib
ldd "$bin" | awk '/=> \// {print $1, $3}' | while read -r name path; do
  case $name in
    libc.so.*|libm.so.*|libdl.so.*|librt.so.*|libpthread.so.*|libvulkan.so.*|libstdc++.so.*|libgcc_s.so.*) ;;
    *) cp -L "$path" ".devcarry/lib/$name"; log "carried $name" ;;
  esac
done
du -sh .devcarry .gl
