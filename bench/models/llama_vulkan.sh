#!/bin/bash
# Packs llama.cpp's Vulkan build, the anchor issue 21 names, for the GPU machine:
#   .devcarry/llama-vulkan.tar.xz  llama-bench and llama-quantize with the shared libraries they run on.
#
# llama.cpp's own Vulkan back end does not build with Debian 12's Vulkan headers and glslc
# (shared/anchors/llama_cpp/README.md). node-llama-cpp publishes it prebuilt on npm
# (@node-llama-cpp/linux-x64-vulkan: libllama, libggml-base, the Vulkan back end libggml-vulkan.so
# with its SPIR-V compiled by a current Vulkan SDK, CPU back ends; Ubuntu 22.04, glibc 2.34), and its
# main package (node-llama-cpp) carries the matching llama.cpp source as a git bundle. This script
# compiles only llama-bench and llama-quantize from that source, against those prebuilt libraries,
# so the benchmark runs llama.cpp's Vulkan shaders exactly as released. Both packages come from the
# npm registry (reachable here, not from the GPU machine).
#
# usage, from a checkout's root:  bash bench/models/llama_vulkan.sh
# Environment: NLC_VERSION (default 3.22.1), NLC_CACHE (downloads, default /tmp/nlc-cache).
# Check: ./llama-bench --list-devices (needs libvulkan.so.1; on lavapipe it lists no Vulkan device,
# ggml-vulkan skips CPU devices).
set -euo pipefail
log() { printf '[llama-vulkan] %s\n' "$*"; }
[ -f CMakeLists.txt ] && [ -e .git ] || { log "run from a checkout's root"; exit 2; }
V=${NLC_VERSION:-3.22.1}
C=${NLC_CACHE:-/tmp/nlc-cache}/$V
mkdir -p "$C" .devcarry
if [ ! -d "$C/bin" ] || [ ! -d "$C/src" ]; then
  (cd "$C" && npm pack --silent "@node-llama-cpp/linux-x64-vulkan@$V" "node-llama-cpp@$V" >/dev/null)
  rm -rf "$C/x" && mkdir -p "$C/x/bin" "$C/x/main"
  tar -xzf "$C/node-llama-cpp-linux-x64-vulkan-$V.tgz" -C "$C/x/bin"
  tar -xzf "$C/node-llama-cpp-$V.tgz" -C "$C/x/main"
  git clone -q "$C/x/main/package/llama/gitRelease.bundle" "$C/src" 2>/dev/null
  mv "$C/x/bin/package/bins/linux-x64-vulkan" "$C/bin"
  cp "$C/x/main/package/llama/llama.cpp.info.json" "$C/bin/"
  rm -rf "$C/x"
fi
P=$(mktemp -d)/llama-vulkan
mkdir -p "$P"
lib=$C/bin
cp "$lib"/libllama-common.so "$lib"/libllama.vulkan.*.so "$lib"/libggml.vulkan.*.so "$lib"/libggml-base.so \
  "$lib"/libggml-vulkan.so "$lib"/libggml-cpu-x64.so "$lib"/libggml-cpu-haswell.so "$lib"/libggml-cpu-icelake.so \
  "$lib"/libggml-cpu-sapphirerapids.so "$lib"/libggml-cpu-zen4.so "$P/"
links="-L$P -lllama-common -l:$(basename "$lib"/libllama.vulkan.*.so) -l:$(basename "$lib"/libggml.vulkan.*.so) -lggml-base"
S=$C/src
flags="-O2 -DNDEBUG -std=c++17 -I$S/include -I$S/ggml/include -I$S/common -I$S/vendor -pthread -Wl,-rpath,\$ORIGIN"
log "compiling llama-bench and llama-quantize against the prebuilt libraries (about 40 s)"
nice g++ $flags "$S/tools/llama-bench/llama-bench.cpp" "$S/tools/llama-bench/main.cpp" -o "$P/llama-bench" $links
nice g++ $flags "$S/tools/quantize/quantize.cpp" "$S/tools/quantize/main.cpp" -o "$P/llama-quantize" $links
{
  echo "node-llama-cpp $V prebuilt Vulkan libraries (npm @node-llama-cpp/linux-x64-vulkan)"
  echo "llama.cpp source: the git bundle of npm node-llama-cpp@$V, commit $(git -C "$S" rev-parse --short HEAD)"
  cat "$lib/llama.cpp.info.json" "$lib/_nlcBuildMetadata.json"
} >"$P/VERSION"
tar -cJf .devcarry/llama-vulkan.tar.xz -C "$(dirname "$P")" llama-vulkan
rm -rf "$(dirname "$P")"
ls -la .devcarry/llama-vulkan.tar.xz
