"""Microbenchmark: each quantizer on one matrix, numba and numpy backends against ggml's own C quantizer.

One thread (run it under ``taskset -c 0``), a fixed bf16-valued N(0, 0.02) matrix (default 512 x
5120, a slice of the full-size drafter's FFN), best of ``--repeat`` runs; ggml's timing is
``ggml_quantize_chunk`` on the same floats through ctypes (what llama-quantize runs per tensor,
without the file I/O), and every output is compared with ggml's bytes. Prints a markdown table.

    OMP_NUM_THREADS=1 taskset -c 0 python bench/bench_encoders.py [--types Q4_K,Q6_K] [--rows 512] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dflash_convert.encoders import QUANTIZERS, jit  # noqa: E402
from dflash_convert.format.ggml import GGMLType  # noqa: E402
from fixtures.ggml_oracle import ggml_quantize  # noqa: E402


def _matrix(rows: int, cols: int) -> np.ndarray:
    u = (np.random.default_rng(0).standard_normal((rows, cols)) * 0.02).astype(np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) & np.uint32(0xFFFF0000)).view(np.float32)  # round to bf16


def _best(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default=",".join(t.name for t in QUANTIZERS))
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--cols", type=int, default=5120)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    if not jit.jit_available():
        raise SystemExit("numba is not installed (or DFLASH_CONVERT_NO_JIT is set): nothing to compare")
    x = _matrix(args.rows, args.cols)
    flat = x.reshape(-1)
    print(f"{args.rows}x{args.cols} values, 1 thread, best of {args.repeat}\n")
    print("| type | ggml s | numpy s | numpy / ggml | numba s | numba / ggml | bytes |")
    print("|---|---|---|---|---|---|---|")
    compiled = jit.kquant_kernels, jit.legacy_kernels
    for name in args.types.split(","):
        t = GGMLType[name]
        quantize = QUANTIZERS[t]
        quantize(flat[:4096])  # compile or load the kernels outside the timing
        t_ggml, ref = _best(lambda t=t: ggml_quantize(int(t), x), args.repeat)
        t_jit, y_jit = _best(lambda q=quantize: q(flat), args.repeat)
        jit.kquant_kernels = jit.legacy_kernels = lambda: None
        try:
            t_np, y_np = _best(lambda q=quantize: q(flat), args.repeat)
        finally:
            jit.kquant_kernels, jit.legacy_kernels = compiled
        same = y_jit.tobytes() == ref and y_np.tobytes() == ref
        print(f"| {name} | {t_ggml:.3f} | {t_np:.3f} | {t_np / t_ggml:.2f} | {t_jit:.3f} | {t_jit / t_ggml:.2f} | "
              f"{'identical' if same else 'DIFFERENT'} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
