"""Benchmark: the whole ``dflash-convert check`` command, this tree against an earlier commit, in one run.

Why: ``check`` used to read the target up to four times and the checkpoint twice, decode every
weight twice (the runner and the reference, then the weight diagnosis again) and run the reference
forward twice even for drafters whose trained semantics are llama.cpp's. This measures the command
a user runs, end to end, on the full-size synthetic drafter (bench_convert's Qwen3.6-27B shapes,
with bench_check's full-size target embedding and head), at F16 by default.

``--before REV`` (default: the commit before the floor-plan change) is checked out into a temporary
git worktree; both trees run as ``python -m dflash_convert.cli check ...`` from their own directory
(so each imports its own package) with the same interpreter and torch threads, alternating A/B
``--repeat`` times. Wall time and peak RSS come from GNU time; both must pass, and their reports must
agree. Writes bench/results-check-command.md.

    python bench/bench_check_command.py [--before REV] [--types F16] [--repeat 2] [--context 64]
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

BEFORE = "c8a92fa"  # main before the floor plan (issue 15)
GNU_TIME = "/usr/bin/time"


def _run(tree: Path, args: list[str]) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        cmd = [GNU_TIME, "-f", "%e %M", "-o", tf.name, sys.executable, "-m", "dflash_convert.cli", *args]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=tree, env=env)
        wall, rss_kb = tf.read().split()[-2:]
    if r.returncode != 0:
        raise SystemExit(f"check in {tree} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    report = json.loads(r.stdout)
    return {"wall_s": float(wall), "rss_mb": int(rss_kb) / 1024, "report": report}


def _times(runs: list[dict[str, Any]]) -> str:
    return ", ".join(f"{r['wall_s']:.1f}" for r in runs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default=BEFORE)
    ap.add_argument("--types", default="F16")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--idle-wait", type=float, default=60.0)
    args = ap.parse_args(argv)

    setup = full_size(type_list(args.types))
    src, target, ggufs = setup.checkpoint, setup.target, setup.ggufs

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
            for _ in range(args.repeat):
                for side, tree in (("before", before), ("after", REPO)):
                    wait_for_idle(args.idle_wait)
                    runs[side].append(_run(tree, cli))
                    print(f"{t} {side}: {runs[side][-1]['wall_s']:.1f} s, {runs[side][-1]['rss_mb']:.0f} MB", flush=True)
            a, b = runs["before"][0]["report"], runs["after"][0]["report"]
            same = (a["result"], a["failures"], a["metrics"]["top1_matches"]) == (b["result"], b["failures"],
                                                                                b["metrics"]["top1_matches"])
            rows.append((t, runs, same))
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(before)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)

    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = ["# `dflash-convert check`, end to end: before and after the floor plan", "",
             f"Machine: {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), {platform.platform()}; "
             f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC. Before: {args.before}; after: this tree ({head}, "
             "with its working-tree changes).", "",
             f"Drafter: {src.name} (5 layers, hidden 5120, vocab 248320), target {target.name} (full-size random BF16 "
             f"embedding and head). `check FILE --checkpoint ... --target-model-dir ... --device cpu --context {args.context}`; "
             f"A/B alternating, {args.repeat} runs each; median wall time, peak RSS from GNU time.", "",
             "| file | before s | after s | after / before | before RSS MB | after RSS MB | same verdict | runs before / after (s) |",
             "|---|---:|---:|---:|---:|---:|---|---|"]
    for t, runs, same in rows:
        wb = statistics.median(r["wall_s"] for r in runs["before"])
        wa = statistics.median(r["wall_s"] for r in runs["after"])
        rb = max(r["rss_mb"] for r in runs["before"])
        ra = max(r["rss_mb"] for r in runs["after"])
        lines.append(f"| {t} | {wb:.1f} | {wa:.1f} | {wa / wb:.2f} | {rb:.0f} | {ra:.0f} | {'yes' if same else 'NO'} | "
                     f"{_times(runs['before'])} / {_times(runs['after'])} |")
        lines.append("")
        lines.append(f"- {t}: {(1 - wa / wb) * 100:.0f}% less wall time (target: at least 30% less: "
                     f"{'met' if wa <= 0.7 * wb else 'NOT met'})")
    text = "\n".join(lines) + "\n"
    print(text)
    (REPO / "bench" / "results-check-command.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
