#!/usr/bin/env bash
# Fetches a SPIR-V validator that knows SPV_KHR_cooperative_matrix and SPV_KHR_bfloat16 (the
# codegen tests check the bf16 kernels' rewritten SPIR-V with it: tests/gpu/spirv_check.hpp).
# Debian 12's spirv-val (2023.1) knows neither, so this takes spirv-tools from Debian testing
# (forky) with the C and C++ runtimes it was built against, unpacked (not installed) into DIR
# and run through their own dynamic loader. Prints the path of the wrapper to set as MESH_SPIRV_VAL.
# usage: tests/fetch_spirv_val.sh [DIR]     (default: ~/.cache/meshnode/spirv-val)
set -euo pipefail
dir=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/meshnode/spirv-val}
wrapper=$dir/spirv-val
if [ -x "$wrapper" ] && "$wrapper" --version >/dev/null 2>&1; then echo "$wrapper"; exit 0; fi
mkdir -p "$dir/debs" "$dir/root"
cd "$dir"
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
curl -sSf "$mirror/dists/forky/main/binary-amd64/Packages.xz" | xz -d >Packages
for p in spirv-tools libc6 libstdc++6 libgcc-s1; do
  f=$(awk -v p="$p" '$1=="Package:"{ok=($2==p)} ok&&$1=="Filename:"{print $2; exit}' Packages)
  [ -n "$f" ] || { echo "fetch_spirv_val.sh: no package $p in Debian testing" >&2; exit 1; }
  [ -s "debs/$(basename "$f")" ] || curl -sSf -o "debs/$(basename "$f")" "$mirror/$f"
  dpkg -x "debs/$(basename "$f")" root
done
lib=$dir/root/usr/lib/x86_64-linux-gnu
cat >"$wrapper" <<WRAP
#!/bin/sh
exec "$lib/ld-linux-x86-64.so.2" --library-path "$lib" "$dir/root/usr/bin/spirv-val" "\$@"
WRAP
chmod +x "$wrapper"
"$wrapper" --version >/dev/null
echo "$wrapper"
