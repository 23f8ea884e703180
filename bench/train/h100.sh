#!/bin/bash
# The fine-tuning benchmark in one device `run` (docs/training.md, "Figures"): the PyTorch anchor
# (bench/train/finetune_reference.py: eager on 1 GPU, and DDP over NCCL on each GPU count asked)
# and mesh-bench-finetune (meshnode processes, one per GPU, on their own Vulkan devices) on the
# same Llama shape, micro-batch and optimizer, one after the other on this machine.
#
#   bash bench/train/h100.sh [CARRY_DIR]      (CARRY_DIR: .devcarry, from bench/train/devcarry.sh)
# Environment: NODES (default "1"; "1,2" on a 2-GPU machine), ARGS (shape options passed to both,
# default: the ~100M shape), STEPS (default 8), BUDGET (seconds, default 560), PROFILE (default
# 1: also the step's gradient program by kernel, mesh-bench-finetune --profile "#0"), MESH_ARGS
# (options for mesh-bench-finetune only, e.g. "--bucket-mb 0" or "--precision f16"), TORCH_ARGS
# (options for the PyTorch anchor only, e.g. "--amp f16"), TORCH (default 1; 0 skips PyTorch).
set -uo pipefail
D=${1:-.devcarry}
NODES=${NODES:-1}
STEPS=${STEPS:-8}
ARGS=${ARGS:-"--hidden 768 --layers 12 --heads 12 --kv-heads 4 --ffn 2048 --vocab 16384 --batch 4 --sequence 256 --micro 1"}
BUDGET=${BUDGET:-560}
START=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
for f in .gl/*.deb; do [ -f "$f" ] && dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export LD_LIBRARY_PATH=$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0
export MESH_TRAIN_TIMING=${MESH_TRAIN_TIMING:-1}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for n in ${NODES//,/ }; do
  [ "${TORCH:-1}" = 1 ] || break
  echo "== PyTorch, $n GPU(s)"
  timeout "$(( $(left) / 3 ))" python3 bench/train/finetune_reference.py $ARGS ${TORCH_ARGS:-} --steps "$STEPS" --ranks "$n" 2>&1 | grep -v Warning
done
if [ "${PROFILE:-1}" = 1 ]; then
  echo "== the step's gradient program on GPU 0, by kernel"
  timeout "$(( $(left) / 3 ))" "$D/mesh-bench-finetune" $ARGS ${MESH_ARGS:-} --profile "#0" 2>&1 | tail -24
fi
echo "== meshnode, nodes $NODES ${MESH_ARGS:-}"
timeout "$(( $(left) - 5 ))" "$D/mesh-bench-finetune" --nodes "$NODES" $ARGS ${MESH_ARGS:-} --steps "$STEPS" --meshnode "$D/meshnode" 2>&1 | grep -v "^  n=.* loss " | tail -80
echo "== done in $(( $(date +%s) - START )) s"
