#!/bin/bash
# Fills the git-ignored folders that the device `run` of bench/models/h100.sh carries, in the
# checkout that `run` sends (run this from that checkout's root, after any change to the sources):
#   .devcarry/  mesh-bench-generate (Release build of THIS checkout, static libstdc++ and shaderc),
#               lib/ (the shared libraries it needs that the GPU machine lacks: libfmt.so.9),
#               llama-src.tar.gz (llama.cpp 34af94cd without models/ media/ docs/ .github),
#               make_gguf.py (shared/anchors/llama_cpp), mesh-h100.sh + bench_table.py (copies of
#               bench/models/h100.sh and bench_table.py, so a checkout without them can run them)
#   .gl/        the Debian packages of the Vulkan loader (shared/PLATFORM.md)
# usage: bench/models/devcarry.sh        (or /other/worktree/bench/models/devcarry.sh from the root)
# Environment: SKIP_BUILD=1 (copy an existing build), JOBS (default 2), LLAMA_MIRROR (a git dir
#   holding commit 34af94cd; default /work/.mirror/unslothai+llama.cpp/repo, from the tool
#   `fetch github:unslothai/llama.cpp`), LLAMA_TGZ (an existing llama-src.tar.gz to copy instead),
#   ANCHORS (default /work/shared/anchors/llama_cpp).
# Heavy steps run under nice; ccache gets CCACHE_BASEDIR of this checkout.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
log() { printf '[devcarry] %s\n' "$*"; }
[ -f CMakeLists.txt ] && [ -e .git ] || { log "run from a checkout's root"; exit 2; }
for d in .devcarry .gl; do
  mkdir -p "$d"
  git check-ignore -q "$d" || { log "$d is not ignored by git: add /$d/ to .gitignore or .git/info/exclude"; exit 2; }
done

# 1. mesh-bench-generate, Release, and the shared libraries it needs in .devcarry/lib.
rm -rf .devcarry/lib
source "$here/../carry_binary.sh"
carry_binary mesh-bench-generate build/release/bench/models/mesh-bench-generate

# 2. llama.cpp source, make_gguf.py, the scripts.
if [ ! -s .devcarry/llama-src.tar.gz ]; then
  if [ -n "${LLAMA_TGZ:-}" ]; then
    cp "$LLAMA_TGZ" .devcarry/llama-src.tar.gz
  else
    mirror=${LLAMA_MIRROR:-/work/.mirror/unslothai+llama.cpp/repo}
    tmp=$(mktemp -d)
    # The mirror lacks models/'s blobs: git archive prints an error about one and still writes the rest.
    git -C "$mirror" archive --format=tar 34af94cd -- . ':!models' ':!media' ':!docs' ':!.github' >"$tmp/l.tar" || true
    mkdir "$tmp/src" && tar -xf "$tmp/l.tar" -C "$tmp/src"
    [ -f "$tmp/src/CMakeLists.txt" ] && [ -d "$tmp/src/gguf-py" ] || { log "llama.cpp archive incomplete"; exit 1; }
    tar -czf .devcarry/llama-src.tar.gz -C "$tmp/src" .
    rm -rf "$tmp"
  fi
fi
anchors=${ANCHORS:-/work/shared/anchors/llama_cpp}
[ -f shared/anchors/llama_cpp/make_gguf.py ] && anchors=shared/anchors/llama_cpp
install -m 644 "$anchors/make_gguf.py" .devcarry/make_gguf.py
install -m 755 "$here/h100.sh" .devcarry/mesh-h100.sh
install -m 644 "$here/bench_table.py" .devcarry/bench_table.py

# 3. Vulkan loader packages.
if ! ls .gl/libvulkan1_*.deb >/dev/null 2>&1; then
  o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
  mkdir -p /tmp/amd64/partial
  apt-get $o update >/dev/null
  (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
fi

ls -la .devcarry .devcarry/lib .gl
du -sh .devcarry .gl
tree_bytes=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
carry_bytes=$(du -cb .devcarry .gl | tail -1 | cut -f1)
log "working tree that travels: $((tree_bytes >> 20)) MiB + carried $((carry_bytes >> 20)) MiB (limit 64 MiB)"
