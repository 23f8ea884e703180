#!/bin/bash
# What the free-memory probe (gpu/memory_probe.hpp) reports on a GPU, checked in one device `run`:
# test_gpu_runtime's probe test (512 MiB of parameters must lower the driver's figure), then two
# meshnode processes on the one GPU, each logging its own figure at start and showing the
# other's, carried by heartbeats, in `meshctl peers`.
#
# usage, from the repository root on the GPU machine:  bash bench/gpu/free_memory.sh [DIR]
#   DIR (default .devcarry): meshnode, meshctl, test_gpu_runtime (Release builds of this tree,
#   carried with bench/carry_binary.sh) and lib/; .gl/ holds the Vulkan loader's Debian packages.
set -u -o pipefail
D=$(realpath "${1:-.devcarry}")
O=${OUT:-/tmp/free-memory}
mkdir -p "$O"
for f in .gl/*.deb; do dpkg -x "$f" / 2>/dev/null || echo "dpkg -x $f failed"; done
export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
echo "== test_gpu_runtime: the memory probe"
"$D/test_gpu_runtime" "runtime: the memory probe*" -s 2>&1 | grep -E "free|after|passed|failed|FAILED" | head -20
echo "== two nodes"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$O/secret"
chmod 600 "$O/secret"
"$D/meshnode" --state-dir "$O/a" --secret-file "$O/secret" --mdns off --bind 127.0.0.1 --port 7201 --api-bind off >"$O/a.log" 2>&1 &
A=$!
for _ in $(seq 100); do [ -s "$O/a/endpoint" ] && break; sleep 0.1; done
"$D/meshnode" --state-dir "$O/b" --secret-file "$O/secret" --mdns off --bind 127.0.0.1 --port 7202 --api-bind off --peer "$(cat "$O/a/endpoint")" >"$O/b.log" 2>&1 &
B=$!
sleep 8
grep -h "device memory" "$O/a.log" "$O/b.log"
"$D/meshctl" --state-dir "$O/a" --secret-file "$O/secret" peers
nvidia-smi --query-gpu=memory.used --format=csv,noheader
kill "$A" "$B"; wait
