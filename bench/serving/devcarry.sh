#!/bin/bash
# Adds what bench/serving/h100.sh needs to the git-ignored .devcarry/ that the device `run`
# carries (run from the checkout's root): mesh-bench-serve (Release build of this checkout, static
# libstdc++), meshnode and meshctl and the shared libraries it needs that the GPU machine lacks (cpp-httplib and its
# OpenSSL, zlib and Brotli, libfmt, ...) in .devcarry/lib. llama-src.tar.gz, make_gguf.py and .gl/
# come from bench/models/devcarry.sh (run it first on a fresh checkout).
# Environment: SKIP_BUILD=1 (copy an existing build), JOBS (default 2).
set -euo pipefail
log() { printf '[devcarry serving] %s\n' "$*"; }
[ -f CMakeLists.txt ] && [ -e .git ] || { log "run from a checkout's root"; exit 2; }
[ -s .devcarry/llama-src.tar.gz ] && [ -f .devcarry/make_gguf.py ] && ls .gl/libvulkan1_*.deb >/dev/null 2>&1 ||
  { log "run bench/models/devcarry.sh first (llama.cpp source, make_gguf.py, the Vulkan loader)"; exit 2; }
source "$(dirname "$0")/../carry_binary.sh"
carry_binary mesh-bench-serve build/release/bench/serving/mesh-bench-serve
# The split benchmark (h100.sh with SPLITS) runs meshnode and meshctl, which link libstdc++
# dynamically: this machine's comes along, in case the GPU machine's is older.
carry_binary meshnode build/release/apps/meshnode
carry_binary meshctl build/release/apps/meshctl
carry_binary mesh-delay-line build/release/bench/serving/mesh-delay-line
cp -L "$(g++ -print-file-name=libstdc++.so.6)" .devcarry/lib/
du -sh .devcarry .gl
