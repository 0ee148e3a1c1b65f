#!/usr/bin/env bash
# The GPU check, in one short run on a machine with a CUDA GPU (docs/engine.md, "GPU check"):
#   1. the gpu test tier: RankTrainer on one rank, NCCL process group of one, bf16 autocast,
#      fused attention only, asynchronous checkpoint (tests/gpu/test_gpu_engine.py);
#   2. MFU of the real engine (RankTrainer, llama-1b, seq 2048) against transformers' Llama of the
#      same shape in a plain loop and the GPU's measured matmul rate, with bench/gpu_mfu.py; the
#      arguments go to it (default --quick; e.g. `bench/gpu_check.sh --out DIR` for the full run,
#      its results written to DIR).
# Needs a CUDA build of torch 2.13.0 in the venv (README, "GPU installation"). Exits non-zero when
# there is no CUDA device, so a skipped tier is never taken for a passed one.
#   bench/gpu_check.sh            # uses .venv/bin/python, or $PYTHON
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" - <<'PY'
import torch
if not torch.cuda.is_available():
    raise SystemExit(f"gpu_check: no CUDA device (torch {torch.__version__}); nothing checked")
print(f"gpu_check: torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}")
PY
# both run even when the first fails (a failed test must not hide the numbers); the exit status is
# the first failure's
status=0
"$PY" -m pytest tests/gpu -m gpu -q -s -p no:cacheprovider -o addopts="" -rs || status=$?
"$PY" -m bench.gpu_mfu "${@:---quick}" || { rc=$?; [ "$status" -ne 0 ] || status=$rc; }
exit "$status"
