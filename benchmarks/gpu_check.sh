#!/usr/bin/env bash
# The GPU check (issue 16, item 4): every config case that fits this machine's GPUs with
# --harness-device cuda under torchrun and the zygote, the CUDA run against the CPU reference
# of the same key, and the throughput benchmark; one summary file. Details: gpu_check.py.
#
#   benchmarks/gpu_check.sh [--out DIR] [--quick] [--device cpu] [-k EXPR] [...]
#
# Each part has its own budget and is killed past it (gpu_check.py). This wrapper bounds the
# whole run too: GPU_CHECK_TIMEOUT seconds, by default 540 on a machine with at most one GPU
# (the budgets add up to 470 s; 263 s measured on one H200) and 3600 with more (more cases fit: the matrix budgets
# grow with them). On the limit the check is sent SIGTERM: it kills the running part with all
# its processes and writes the summary as it stands.
# PYTHON picks the interpreter (default: python3 on PATH, e.g. an activated virtualenv).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
    gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
fi
if [ "${gpus:-0}" -gt 1 ]; then default_limit=3600; else default_limit=540; fi
limit="${GPU_CHECK_TIMEOUT:-$default_limit}"
cd "$here/.."
exec timeout --signal=TERM --kill-after=30 "$limit" "$python" "$here/gpu_check.py" "$@"
