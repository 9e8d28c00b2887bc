"""Benchmark: the whole ``dflash-convert check`` command, this tree against an earlier commit, in one run.

Why: ``check`` held float32 copies of the file's weights and float64 copies of the checkpoint's
(about 21 GB at F16 on the full-size drafter, issue 33); before that it read its inputs several
times (issue 15). This measures the command a user runs, end to end, on the full-size synthetic
drafter (bench_convert's Qwen3.6-27B shapes, with bench_check's full-size target embedding and
head): wall time, peak RSS against the 8 GB bound, and whether the reports agree.

``--before REV`` (default: the commit before the floor-plan change) is checked out into a temporary
git worktree; both trees run as ``python -m dflash_convert.cli check ...`` from their own directory
(so each imports its own package) with the same interpreter and torch threads, alternating A/B
``--repeat`` times. Wall time and peak RSS come from GNU time; their verdicts must agree, and every
metric that moves is listed. ``--after-only`` names types whose before run is skipped (it would
not fit this machine's memory). Writes bench/results-check-command.md.

    python bench/bench_check_command.py [--before REV] [--types F16,Q4_K_M] [--after-only Q4_K_M] [--repeat 1]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from _common import full_size, type_list  # noqa: E402
from bench_convert import wait_for_idle  # noqa: E402

BEFORE = "6c921db"  # main before the memory bound (issue 33); c8a92fa: before the floor plan (issue 15)
RSS_BOUND_MB = 8 * 1024  # issue 33: check's peak RSS on the full-size drafter
GNU_TIME = "/usr/bin/time"


def _run(tree: Path, args: list[str]) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        cmd = [GNU_TIME, "-f", "%e %M", "-o", tf.name, sys.executable, "-m", "dflash_convert.cli", *args]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=tree, env=env)
        wall, rss_kb = tf.read().split()[-2:]
    if r.returncode not in (0, 1):  # 1: a FAIL verdict, still a report (the synthetic Q4_K_M file fails its KL gate)
        raise SystemExit(f"check in {tree} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    report = json.loads(r.stdout)
    return {"wall_s": float(wall), "rss_mb": int(rss_kb) / 1024, "report": report}


def _times(runs: list[dict[str, Any]]) -> str:
    return ", ".join(f"{r['wall_s']:.1f}" for r in runs) or "-"


def _moved(a: Any, b: Any, path: str = "") -> list[str]:
    """Every number of report ``a`` that differs in ``b``: ``path a -> b (relative change)``."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [m for k in sorted(set(a) | set(b)) for m in _moved(a.get(k), b.get(k), f"{path}.{k}" if path else k)]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [m for i, (x, y) in enumerate(zip(a, b, strict=True)) for m in _moved(x, y, f"{path}[{i}]")]
    if a == b or path in ("file", "checkpoint"):
        return []
    if isinstance(a, float) and isinstance(b, float):
        return [f"{path} {a:.17g} -> {b:.17g} ({abs(b - a) / max(abs(a), 1e-300):.1e} relative)"]
    return [f"{path} {a!r} -> {b!r}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default=BEFORE)
    ap.add_argument("--types", default="F16,Q4_K_M")
    ap.add_argument("--after-only", default="", help="types whose before run is skipped (it would not fit in memory)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--idle-wait", type=float, default=60.0)
    args = ap.parse_args(argv)

    setup = full_size(type_list(args.types))
    src, target, ggufs = setup.checkpoint, setup.target, setup.ggufs
    after_only = set(type_list(args.after_only))

    work = Path(tempfile.mkdtemp(prefix="bench-check-before-"))
    before = work / "tree"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(before), args.before], check=True,
                   capture_output=True)
    try:
        rows = []
        for t, gguf in ggufs.items():
            cli = ["check", str(gguf), "--checkpoint", str(src), "--target-model-dir", str(target), "--device", "cpu",
                   "--context", str(args.context), "--json"]
            runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
            sides = (("after", REPO),) if t in after_only else (("before", before), ("after", REPO))
            for _ in range(args.repeat):
                for side, tree in sides:
                    wait_for_idle(args.idle_wait)
                    runs[side].append(_run(tree, cli))
                    print(f"{t} {side}: {runs[side][-1]['wall_s']:.1f} s, {runs[side][-1]['rss_mb']:.0f} MB", flush=True)
            rows.append((t, runs))
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(before)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)

    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = ["# `dflash-convert check`, end to end: before and after the memory bound (issue 33)", "",
             f"Machine: {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), {platform.platform()}; "
             f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC. Before: {args.before}; after: this tree ({head}, "
             "with its working-tree changes).", "",
             f"Drafter: {src.name} (5 layers, hidden 5120, vocab 248320), target {target.name} (full-size random BF16 "
             f"embedding and head). `check FILE --checkpoint ... --target-model-dir ... --device cpu --context {args.context}`; "
             f"the Q4_K_M file's F16 sibling sits beside it, so its check runs that file too. {args.repeat} run(s) per side; "
             "median wall time, peak RSS from GNU time.", "",
             f"| file | before s | after s | before RSS MB | after RSS MB | after <= {RSS_BOUND_MB} MB | same verdict | metrics moved |",
             "|---|---:|---:|---:|---:|---|---|---:|"]
    notes = []
    for t, runs in rows:
        wa = statistics.median(r["wall_s"] for r in runs["after"])
        ra = max(r["rss_mb"] for r in runs["after"])
        if runs["before"]:
            wb = f"{statistics.median(r['wall_s'] for r in runs['before']):.1f}"
            rb = f"{max(r['rss_mb'] for r in runs['before']):.0f}"
            a, b = runs["before"][0]["report"], runs["after"][0]["report"]
            same = "yes" if (a["result"], a["failures"]) == (b["result"], b["failures"]) else "NO"
            moved = _moved(a, b)
            notes += [f"- {t}: {m}" for m in moved]
            n_moved = str(len(moved))
        else:
            wb = rb = same = n_moved = "not run"
            notes.append(f"- {t}: no before run (skipped: it would not fit in this machine's memory); after: "
                         f"{runs['after'][0]['report']['result']}")
        lines.append(f"| {t} | {wb} | {wa:.1f} | {rb} | {ra:.0f} | {'yes' if ra <= RSS_BOUND_MB else 'NO'} | {same} | {n_moved} |")
    lines += ["", "Runs (s), before / after: " + "; ".join(f"{t} {_times(r['before'])} / {_times(r['after'])}" for t, r in rows),
              "", "Metrics that moved (none listed: every number identical):", ""] + (notes or ["- none"])
    text = "\n".join(lines) + "\n"
    print(text)
    (REPO / "bench" / "results-check-command.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
