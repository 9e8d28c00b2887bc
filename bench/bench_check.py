"""Benchmark: the in-process runner (``check``'s GGUF side) against the checkpoint's reference forward.

The drafter, its target with a full-size embedding and head, and the GGUFs (F16 and Q4_K_M by
default, made once with this tree and cached) come from bench/_common.py.

Each measurement runs in its own child process (so one side's weights never share memory with the
other's) with the same torch thread count:

* ``reference``: ``load_reference(dtype=float32)``, then ``reference_forward`` (llama.cpp semantics)
  on one block of 16 after ``--context`` (512) synthetic context rows;
* ``runner F16`` / ``runner Q4_K_M``: ``load_weights`` (read and dequantize every tensor on the
  device: the "load" column), then ``run_gguf`` on the same inputs.

Forward times are the fastest of ``--repeat`` runs after one warm-up. The ratio runner/reference
is the figure issue 9 asks for (target <= 1.2 at F16 on the same device); the runner's outputs are
also compared with the reference's (top-1 agreement) so a fast wrong runner cannot pass.

    python bench/bench_check.py [--device cpu|cuda] [--context 512] [--repeat 3] [--blocks N]

``--blocks N`` also times N consecutive drafts per GGUF (drafted blocks per second: the GPU
figure). Prints a markdown table and writes bench/results-check-<device>.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import torch  # noqa: E402
from _common import full_size, type_list  # noqa: E402
from bench_convert import wait_for_idle  # noqa: E402

# --- the child process -----------------------------------------------------------------------------


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def worker(args: argparse.Namespace) -> dict[str, Any]:
    from dflash_convert.runtime.check_io import synthetic_inputs
    from dflash_convert.runtime.forward import run_gguf
    from dflash_convert.runtime.reference import load_reference, reference_forward
    from dflash_convert.runtime.weights import load_weights
    from dflash_convert.sources.checkpoint import read_checkpoint
    from dflash_convert.sources.gguf_drafter import read_drafter
    from dflash_convert.sources.target import read_target

    dev = torch.device(args.device)
    d_any = read_drafter(args.shape_from)
    feats, ids, pos = synthetic_inputs(d_any, args.context, 0)
    t0 = time.perf_counter()
    if args.worker == "reference":
        model = load_reference(read_checkpoint(args.checkpoint), read_target(args.target), device=dev, dtype=torch.float32)

        def forward():
            return reference_forward(model, feats, ids, pos, semantics="llama.cpp")
    else:
        d = read_drafter(args.worker)
        w = load_weights(d, read_target(args.target), device=dev)

        def forward():
            return run_gguf(d, w, feats, ids, pos)
    _sync(dev)
    load_s = time.perf_counter() - t0
    res = forward()  # warm-up (and the embedding rows it reads)
    _sync(dev)
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        res = forward()
        _sync(dev)
        times.append(time.perf_counter() - t)
    out: dict[str, Any] = {"load_s": load_s, "forward_s": min(times), "forward_all_s": times,
                           "tokens": res.tokens.cpu().tolist(), "peak_cuda_gb": None}
    if args.blocks:
        _sync(dev)
        t = time.perf_counter()
        for _ in range(args.blocks):
            forward()
        _sync(dev)
        out["blocks_per_s"] = args.blocks / (time.perf_counter() - t)
    if dev.type == "cuda":
        out["peak_cuda_gb"] = torch.cuda.max_memory_allocated(dev) / 1e9
    return out


def _child(side: str, args: argparse.Namespace, src: Path, target: Path, shape_from: Path) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", side, "--checkpoint", str(src), "--target", str(target),
           "--shape-from", str(shape_from), "--device", args.device, "--context", str(args.context),
           "--repeat", str(args.repeat), "--blocks", str(args.blocks if side != "reference" else 0)]
    wait_for_idle(args.idle_wait)
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if r.returncode != 0:
        raise SystemExit(f"{side} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=0)
    ap.add_argument("--types", default="F16,Q4_K_M")
    ap.add_argument("--idle-wait", type=float, default=60.0)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", help=argparse.SUPPRESS)
    ap.add_argument("--target", help=argparse.SUPPRESS)
    ap.add_argument("--shape-from", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0

    types = type_list(args.types)
    setup = full_size(types)
    src, target, ggufs = setup.checkpoint, setup.target, setup.ggufs
    shape_from = next(iter(ggufs.values()))
    results = {"reference": _child("reference", args, src, target, shape_from)}
    for t, path in ggufs.items():
        results[t] = _child(str(path), args, src, target, shape_from)

    ref = results["reference"]
    lines = [f"# dflash-convert check: runner vs reference forward ({args.device})", "",
             f"Machine: {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), torch {torch.__version__}"
             f" with {torch.get_num_threads()} threads, {platform.platform()}; "
             f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC", "",
             f"Drafter: {src.name} (5 layers, hidden 5120, vocab 248320). One draft: a block of 16 after "
             f"{args.context} context rows; float32 compute on both sides; fastest of {args.repeat} after a warm-up.", "",
             "| side | load s | forward s | ratio to reference | top-1 agreement with reference |"
             + (" blocks/s |" if args.blocks else ""),
             "|---|---:|---:|---:|---:|" + ("---:|" if args.blocks else "")]
    lines.append(f"| reference (checkpoint BF16) | {ref['load_s']:.1f} | {ref['forward_s']:.2f} | 1.00 | - |"
                 + (" - |" if args.blocks else ""))
    for t in types:
        r = results[t]
        agree = sum(a == b for a, b in zip(r["tokens"], ref["tokens"], strict=True)) / len(ref["tokens"])
        lines.append(f"| runner {t} | {r['load_s']:.1f} | {r['forward_s']:.2f} | {r['forward_s'] / ref['forward_s']:.2f} | "
                     f"{agree:.3f} |" + (f" {r['blocks_per_s']:.2f} |" if args.blocks else ""))
    if "F16" in results:
        ratio = results["F16"]["forward_s"] / ref["forward_s"]
        lines += ["", f"- F16 runner / reference forward time: {ratio:.2f} (target <= 1.2: {'met' if ratio <= 1.2 else 'NOT met'})"]
    if "Q4_K_M" in results:
        lines.append(f"- Q4_K_M load (read + dequantize every tensor on {args.device}): {results['Q4_K_M']['load_s']:.1f} s")
    text = "\n".join(lines) + "\n"
    print(text)
    (REPO / "bench" / f"results-check-{args.device}.md").write_text(text)
    (REPO / "bench" / f"results-check-{args.device}.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
