#!/usr/bin/env bash
# The NCCL plugin against real NCCL on one machine with one CUDA GPU (docs/nccl-plugin.md, "GPU check").
#   bash scripts/gpu-check.sh [--quick] [--out FILE] [...]   (from the repository root or anywhere)
#   bash scripts/gpu-check.sh --bench [...]   all-reduce busbw: CollNet vs NCCL Socket vs the plugin p2p net
# Runs `python -m reducer.gpucheck` with this checkout first on PYTHONPATH (no pip install needed;
# the built reducer/_core*.so and reducer/lib/libnccl-net-reduction-server.so must be present).
# Exit: 0 PASS, 1 FAIL, 3 no CUDA GPU / no PyTorch with NCCL, 124 the whole check timed out.
# GPU_CHECK_TIMEOUT (seconds, default 590) bounds the whole run; PYTHON picks the interpreter.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
python="${PYTHON:-python3}"
limit="${GPU_CHECK_TIMEOUT:-590}"
exec timeout --kill-after=10 "$limit" "$python" -m reducer.gpucheck "$@"
