"""Benchmark: ``accept``'s batched drafts against one ``check``-style forward per anchor.

The drafter is bench_convert's full-size synthetic one (Qwen3.6-27B drafter shapes: 5 layers, hidden
5120, FFN 17408, 5 taps, vocab 248320) as the F16 GGUF bench_check makes, with bench_check's full-size
target embedding and head. One synthetic sequence of ``--context`` positions (random features; the
speed does not depend on their values) and ``--anchors`` anchors at its end:

* ``batched``: ``runtime.accept.anchor_drafts`` (context K/V once for the sequence, ``--batch``
  blocks per pass through the layers and the head);
* ``per anchor``: ``runtime.forward.run_gguf`` once per anchor on its own context prefix, what
  ``check`` does for one draft (timed on ``--per-anchor`` anchors, it is slow).

Both draft the same tokens (checked). Prints anchors per second for each and their ratio, and writes
bench/results-accept.md.

    python bench/bench_accept.py [--context 512] [--anchors 64] [--batch 16] [--per-anchor 4]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import torch  # noqa: E402
from _common import full_size  # noqa: E402

from dflash_convert.runtime.accept import anchor_drafts  # noqa: E402
from dflash_convert.runtime.forward import block_tokens, contiguous_positions, run_gguf  # noqa: E402
from dflash_convert.runtime.weights import load_weights  # noqa: E402
from dflash_convert.sources.gguf_drafter import read_drafter  # noqa: E402
from dflash_convert.sources.target import read_target  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--anchors", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--per-anchor", type=int, default=4)
    args = ap.parse_args(argv)

    setup = full_size(["F16"])
    src, target_dir, gguf = setup.checkpoint, setup.target, setup.ggufs["F16"]
    d = read_drafter(gguf)
    t0 = time.perf_counter()
    w = load_weights(d, read_target(target_dir))
    load_s = time.perf_counter() - t0
    n_max = d.block_size - 1
    L = args.context + args.anchors
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(L, len(d.target_layers) * d.hidden_size, generator=g)
    tokens = torch.randint(0, 150000, (L,), generator=g)
    anchors = list(range(args.context, L))

    t0 = time.perf_counter()
    batched = anchor_drafts(d, w, feats, tokens, anchors, n_max, batch=args.batch)
    batched_s = time.perf_counter() - t0

    one_s = []
    for c in anchors[:args.per_anchor]:
        ids = block_tokens(d, int(tokens[c]))
        t0 = time.perf_counter()
        r = run_gguf(d, w, feats[:c], ids, contiguous_positions(c, len(ids)))
        one_s.append(time.perf_counter() - t0)
        same = torch.equal(r.tokens[:n_max], batched[anchors.index(c)])
        if not same:
            print(f"warning: anchor {c}: the batched draft differs from run_gguf's (a near-tie?)", flush=True)
    per_anchor_rate = len(one_s) / sum(one_s)
    batched_rate = len(anchors) / batched_s
    lines = ["# `accept`: batched drafts against one forward per anchor", "",
             f"Machine: {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), torch {torch.__version__} with "
             f"{torch.get_num_threads()} threads, {platform.platform()}; {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC", "",
             f"Drafter: {src.name} as F16 ({gguf.name}), full-size target embedding and head (248320 x 5120, streamed); "
             f"one sequence of {L} positions, {len(anchors)} anchors after {args.context} context rows, n_max {n_max}; "
             f"weights loaded in {load_s:.1f} s (not counted).", "",
             "| method | anchors timed | seconds | anchors / s | ratio |", "|---|---:|---:|---:|---:|",
             f"| one run_gguf per anchor (check's forward) | {len(one_s)} | {sum(one_s):.1f} | {per_anchor_rate:.3f} | 1.00 |",
             f"| anchor_drafts, batch {args.batch}, context K/V once | {len(anchors)} | {batched_s:.1f} | {batched_rate:.3f} | "
             f"{batched_rate / per_anchor_rate:.1f} |", ""]
    text = "\n".join(lines)
    print(text)
    (REPO / "bench" / "results-accept.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
