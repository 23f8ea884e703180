#!/bin/bash
# Adds what bench/train/h100.sh needs to the git-ignored .devcarry/ that the device `run` carries
# (run from the checkout's root): mesh-bench-finetune and meshnode (Release builds of this
# checkout) and the shared libraries they need that the GPU machine lacks, in .devcarry/lib. The
# Vulkan loader debs in .gl/ come from bench/models/devcarry.sh.
# Environment: SKIP_BUILD=1 (copy an existing build), JOBS (default 2).
set -euo pipefail
log() { printf '[devcarry train] %s\n' "$*"; }
[ -f CMakeLists.txt ] && [ -e .git ] || { log "run from a checkout's root"; exit 2; }
source "$(dirname "$0")/../carry_binary.sh"
carry_binary mesh-bench-finetune build/release/bench/train/mesh-bench-finetune
carry_binary meshnode build/release/apps/meshnode
cp -L "$(g++ -print-file-name=libstdc++.so.6)" .devcarry/lib/
strip .devcarry/mesh-bench-finetune .devcarry/meshnode
du -sh .devcarry .gl
