#!/bin/bash
# The VK_NV_cooperative_matrix2 probe (docs/gpu.md, "Why each row is below its goal": f16 GEMM):
# a GEMM on workgroup-scope cooperative matrices loaded through tensor layouts, as llama.cpp's
# coopmat2 kernels do, timed on the GPU machine beside the project's own kernels.
# Debian 12's glslang cannot compile GL_NV_cooperative_matrix2 (nor GL_KHR_cooperative_matrix);
# Debian 13's glslang-tools (15.2) can. This script fetches it and its libraries from the Debian
# archive (no install: unpacked into $WORK and run through the unpacked ld.so), compiles the
# shader, writes a bf16 copy of the SPIR-V (to_bf16.py: every 16-bit float type made bfloat16,
# SPV_KHR_bfloat16), and builds the host program against Debian 13's Vulkan headers.
# usage (here): bench/gpu/coopmat2_probe/build.sh OUTDIR      (OUTDIR then travels to the device)
# on the device (after the .gl loader step of docs/gpu.md):
#   OUTDIR/probe OUTDIR/cm2_gemm.spv WG BM BN BK [N] [bf16]    e.g. 256 128 256 32 4096
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$(realpath -m "${1:?usage: build.sh OUTDIR}")
work=${WORK:-/tmp/trixie}
mkdir -p "$out" "$work/root" "$work/hdr"
cd "$work"
[ -s Packages ] || curl -sf http://deb.debian.org/debian/dists/trixie/main/binary-amd64/Packages.xz | xz -d >Packages
fetch() {
  local f
  f=$(awk -v p="$1" '$1=="Package:"{ok=($2==p)} ok&&$1=="Filename:"{print $2; exit}' Packages)
  [ -s "$(basename "$f")" ] || curl -sfO "http://deb.debian.org/debian/$f"
  dpkg -x "$(basename "$f")" "$2"
}
for p in glslang-tools spirv-tools libc6 libstdc++6 libgcc-s1; do fetch "$p" root; done
fetch libvulkan-dev hdr
lib=$work/root/usr/lib/x86_64-linux-gnu
"$lib/ld-linux-x86-64.so.2" --library-path "$lib" "$work/root/usr/bin/glslang" -V --target-env vulkan1.3 \
  -o "$out/cm2_gemm.spv" "$here/cm2_gemm.comp"
python3 "$here/to_bf16.py" "$out/cm2_gemm.spv" "$out/cm2_gemm_bf16.spv"
g++ -O2 -std=c++20 -Wall -Wextra -Wno-missing-field-initializers -I"$work/hdr/usr/include" "$here/probe.cpp" -o "$out/probe" \
  -static-libstdc++ -static-libgcc -lvulkan
echo "built $out/probe, $out/cm2_gemm.spv, $out/cm2_gemm_bf16.spv"
