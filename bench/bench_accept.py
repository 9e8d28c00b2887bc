"""Benchmark: ``accept``'s drafts per second on the full-size drafter, against the machine's matmul limit.

The drafter is bench_convert's full-size synthetic one (Qwen3.6-27B drafter shapes: 5 layers, hidden
5120, FFN 17408, 5 taps, vocab 248320) as the F16 GGUF bench_check makes, with bench_check's full-size
target embedding and head (BF16). One synthetic sequence of ``--context`` positions (random features;
the speed does not depend on their values) and ``--anchors`` anchors after it, drafted as ``accept``
drafts (``gguf_drafts``, CPU numerics, ``--batch`` anchors per pass (default: each tree's own
``accept`` default), context K/V once).

Each code tree (this one, and ``--before DIR``, a checkout of an older ``dflash_convert``) runs in a
child process of the same run, one after the other, and reports:

* anchors per second, after one warm-up anchor (weight loading and first-use caches not counted);
* the share of that time in the context K/V, the layers (the block rows through every layer), the
  head (the vocabulary projection and the argmax) and the rest (embedding rows, masks, rope);
* the limit: a plain ``torch.matmul`` of every matmul shape one pass makes (the layers' weights
  on ``batch * block`` rows, the head on ``batch * n_max`` rows in 16384-row chunks, the context's
  ``fc``, K and V amortised over the anchors), in float32 and with the head in bf16, timed in the
  same process right after the drafts, as anchors per second.

Both trees must draft the same tokens (checked). Writes bench/results-accept.md (``--device cuda``:
results-accept-cuda.md, every clock read after a CUDA synchronize).

    python bench/bench_accept.py [--context 512] [--anchors 32] [--batch N] [--before /tmp/before] [--device cuda]
                                 [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HEAD_CHUNK = 16384  # rows of the head per timed matmul (the whole head in float32 would be 5 GB)


def _timers(acc, w, ws, sync) -> dict[str, float]:
    """Wrap the phases of ``acc`` (runtime.accept) and ``ws`` (runtime.weights) in timers; returns the totals."""
    t = {"context": 0.0, "layers": 0.0, "head": 0.0}
    state = {"in_context": False}

    def timed(fn, key):
        def wrapper(*a, **k):
            sync()
            t0 = time.perf_counter()
            state["in_context"] |= key == "context"
            try:
                return fn(*a, **k)
            finally:
                if key == "context":
                    state["in_context"] = False
                sync()
                t[key] += time.perf_counter() - t0
        return wrapper

    acc.context_kv = timed(acc.context_kv, "context")
    ws.LazyMatrix.project = timed(ws.LazyMatrix.project, "head")
    if hasattr(ws.LazyMatrix, "argmax"):  # the greedy tokens a chunk at a time (this tree)
        ws.LazyMatrix.argmax = timed(ws.LazyMatrix.argmax, "head")
    head_mod = sys.modules.get("dflash_convert.runtime.head")
    if head_mod is not None:  # the exact bf16-screened argmax (this tree); accept imports its function by name
        for name in ("head_argmax",):
            if hasattr(acc, name):
                setattr(acc, name, timed(getattr(acc, name), "head"))

    class TimedLayers(list):
        """The layer list; iterating it outside the context pass is the block rows' way through the layers."""

        def __iter__(self):
            sync()
            t0 = time.perf_counter()
            yield from list.__iter__(self)
            sync()
            if not state["in_context"]:
                t["layers"] += time.perf_counter() - t0

    w.layers = TimedLayers(w.layers)
    return t


def _limit(torch, w, n_rows_blk: int, n_rows_head: int, L: int, n_anchors: int, batch: int, sync) -> dict[str, float]:
    """Seconds of a plain torch.matmul of every shape one pass of ``batch`` anchors makes (context amortised)."""

    def clock(a, b) -> float:
        torch.matmul(a, b)  # warm
        best = float("inf")
        for _ in range(3):  # the best of three: one product alone varied up to 1.8x between runs
            sync()
            t0 = time.perf_counter()
            torch.matmul(a, b)
            sync()
            best = min(best, time.perf_counter() - t0)
        return best

    g = torch.Generator().manual_seed(1)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(w.device)

    layer = 0.0
    lw = w.layers[0]
    for m in (lw.wq, lw.wk, lw.wv, lw.wo, lw.gate, lw.up, lw.down):
        if m is not None:
            layer += clock(randn(n_rows_blk, m.shape[1]), m.T)
    V, E = w.head.shape
    chunk = randn(HEAD_CHUNK, E)
    xh = randn(n_rows_head, E)
    head32 = clock(xh, chunk.T) * V / HEAD_CHUNK
    head16 = clock(xh.bfloat16(), chunk.bfloat16().T) * V / HEAD_CHUNK
    del chunk
    ctx = clock(randn(L, w.fc.shape[1]), w.fc.T)
    xe = randn(L, E)
    ctx += sum(clock(xe, m.T) for m in (lw.wk, lw.wv) if m is not None) * len(w.layers)
    return {"layers": layer * len(w.layers), "head_f32": head32, "head_bf16": head16,
            "context": ctx * batch / n_anchors}


def worker(args: argparse.Namespace) -> int:
    """Time one code tree (the one first on sys.path) and write its JSON to ``args.json``."""
    if args.code:
        sys.path.insert(0, args.code)
    import torch

    from dflash_convert.runtime import accept as acc
    from dflash_convert.runtime import weights as ws
    from dflash_convert.sources.gguf_drafter import read_drafter
    from dflash_convert.sources.target import read_target

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)  # CUDA runs ahead of the host's clock
    d = read_drafter(Path(args.gguf))
    t0 = time.perf_counter()
    w = ws.load_weights(d, read_target(Path(args.target)), device=device)
    sync()
    load_s = time.perf_counter() - t0
    n_max = d.block_size - 1
    L = args.context + args.anchors
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(L, len(d.target_layers) * d.hidden_size, generator=g)
    tokens = torch.randint(0, 150000, (L,), generator=g)
    anchors = list(range(args.context, L))
    batch = args.batch or getattr(acc, "ACCEPT_BATCH", 16)  # the tree's own accept default (16 before it had one)
    drafts_of = acc.gguf_drafts(d, w, n_max, like_cpu=True, batch=batch)
    t0 = time.perf_counter()
    drafts_of(feats[:args.context // 2 + 1], tokens, [args.context // 2])  # first-use caches (a head copy)
    sync()
    warm_s = time.perf_counter() - t0
    t = _timers(acc, w, ws, sync)
    t0 = time.perf_counter()
    drafted = drafts_of(feats, tokens, anchors).cpu()
    total = time.perf_counter() - t0
    limit = _limit(torch, w, batch * d.block_size, batch * n_max, L, len(anchors), batch, sync)
    out = {"code": args.code or str(REPO), "load_s": load_s, "warm_s": warm_s, "seconds": total, "anchors": len(anchors),
           "phases": t, "limit": limit, "threads": torch.get_num_threads(), "torch": torch.__version__,
           "drafts_sha256": hashlib.sha256(drafted.numpy().tobytes()).hexdigest(), "n_max": n_max, "device": args.device,
           "batch": batch}
    if device.type == "cuda":
        out["gpu_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
    Path(args.json).write_text(json.dumps(out))
    return 0


def _row(name: str, r: dict) -> list[str]:
    """The table rows of one tree's result."""
    rate = r["anchors"] / r["seconds"]
    lim = r["limit"]
    per_pass = r["anchors"] / r["batch"]
    lim32 = r["anchors"] / (per_pass * (lim["layers"] + lim["head_f32"] + lim["context"]))
    lim16 = r["anchors"] / (per_pass * (lim["layers"] + lim["head_bf16"] + lim["context"]))
    ph = r["phases"]
    rest = r["seconds"] - ph["context"] - ph["layers"] - ph["head"]
    share = " / ".join(f"{100 * v / r['seconds']:.0f}%" for v in (ph["context"], ph["layers"], ph["head"], rest))
    return [f"| {name} | {r['batch']} | {r['anchors']} | {r['seconds']:.1f} | **{rate:.3f}** | {lim32:.3f} ({rate / lim32:.0%}) | "
            f"{lim16:.3f} ({rate / lim16:.0%}) | {share} |"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--anchors", type=int, default=32)
    ap.add_argument("--batch", type=int, help="anchors per pass (default: each tree's accept default)")
    ap.add_argument("--out", type=Path, help="the results file (default bench/results-accept[-DEVICE].md)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the drafts run")
    ap.add_argument("--before", help="a directory holding an older dflash_convert package to time first")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--code", help=argparse.SUPPRESS)
    ap.add_argument("--gguf", help=argparse.SUPPRESS)
    ap.add_argument("--target", help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)

    sys.path.insert(0, str(REPO / "bench"))
    from _common import full_size

    setup = full_size(["F16"])
    trees = ([("before (" + args.before + ")", args.before)] if args.before else []) + [("this tree", "")]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, code in trees:
            out = Path(tmp) / f"{len(results)}.json"
            cmd = [sys.executable, __file__, "--worker", "--gguf", str(setup.ggufs["F16"]), "--target", str(setup.target),
                   "--json", str(out), "--context", str(args.context), "--anchors", str(args.anchors),
                   *(["--batch", str(args.batch)] if args.batch else []), "--threads", str(args.threads),
                   "--device", args.device] + (["--code", code] if code else [])
            env = dict(os.environ, PYTHONPATH=code or str(REPO))
            subprocess.run(cmd, check=True, env=env)
            results.append((name, json.loads(out.read_text())))
            print(name, results[-1][1], flush=True)
    r0 = results[-1][1]
    same = len({r["drafts_sha256"] for _, r in results}) == 1
    lines = ["# `accept`: anchors per second on the full-size drafter, against the matmul limit", "",
             f"Machine: {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), torch {r0['torch']} with "
             f"{r0['threads']} threads, {platform.platform()}, device {args.device}; "
             f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC", "",
             f"Drafter: {setup.checkpoint.name} as F16 ({setup.ggufs['F16'].name}), full-size BF16 target embedding and "
             f"head (248320 x 5120); one sequence of {args.context + args.anchors} positions, {args.anchors} anchors after "
             f"{args.context} context rows, n_max {r0['n_max']}, `accept`'s CPU numerics "
             f"(`gguf_drafts(like_cpu=True)`). Every tree ran in this one run, one after the other.", "",
             "Limit: a plain `torch.matmul` of every shape a pass makes (the layers' weights on batch x block rows, the "
             "head on batch x n_max rows, the context's fc/K/V amortised), timed in the same process right after the "
             "drafts; `f32` with every matmul in float32, `bf16 head` with the head's in bf16. Shares: context K/V / "
             "layers / head / rest.", "",
             "| code | batch | anchors | seconds | anchors / s | f32 limit (reached) | bf16-head limit (reached) | shares |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, r in results:
        lines += _row(name, r)
    lines += ["", f"Both trees drafted the same tokens: {'yes' if same else 'NO'}. Weights loaded in "
              + ", ".join(f"{r['load_s']:.1f} s" for _, r in results) + "; the warm-up anchor (first-use caches) took "
              + ", ".join(f"{r['warm_s']:.1f} s" for _, r in results) + " (neither counted)."
              + "".join(f" GPU peak (torch) {r['gpu_peak_mb']:.0f} MB ({name})." for name, r in results if "gpu_peak_mb" in r), ""]
    text = "\n".join(lines)
    print(text)
    out = args.out or REPO / "bench" / ("results-accept.md" if args.device == "cpu" else f"results-accept-{args.device}.md")
    out.write_text(text)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
