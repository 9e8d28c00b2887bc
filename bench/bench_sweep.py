"""Benchmark: a whole ``sweep`` and a two-step ``quantize --min-acceptance`` search at full size (issue 33).

Inputs: bench/_common.py's full-size synthetic drafter (Qwen3.6-27B drafter shapes) as its F16 GGUF, its
full-size BF16 target embedding and head, and synthetic features: ``--sequences`` of ``--context`` prompt +
``--new-tokens`` positions, random layer inputs and prompts, the continuation written along the F16 file's
own live loop (fixtures/drafted_features.py: the target takes each draft's slots while a coin with
``--accept-p`` says yes). A random drafter on random tokens accepts nothing and visits one anchor per new
token (24 x 64 = 1536 per type), five times the few hundred a capture of a trained drafter visits;
``--accept-p 0`` keeps that worst case. Each command runs as a child under GNU time -v (wall, peak RSS):
``dflash-convert sweep F16.gguf --features F --types ... --json`` (the F16 input row and each type), then
``dflash-convert quantize F16.gguf OUT Q2_K --features F --min-acceptance 0.98 --max-steps 2``, each line it
logs timed as it arrives (a random drafter does not reach 0.98 in two steps: the command's refusal, exit 1,
is its expected end). Goal (issue 33): each under 60 min, peak RSS under 12 GB. Writes bench/results-sweep.md
(``--skip-sweep`` keeps the file's sweep section and replaces the search's).

    python bench/bench_sweep.py [--sequences 24] [--new-tokens 64] [--context 64] [--accept-p 0.8] [--types Q8_0,...]
                                [--device cpu|cuda] [--results PATH] [--features PATH] [--skip-search | --skip-sweep]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _common import full_size  # noqa: E402
from bench_search import synthetic_features  # noqa: E402

from dflash_convert.format.quant_types import DEFAULT_SWEEP_TYPES  # noqa: E402
from dflash_convert.sources.gguf_drafter import read_drafter  # noqa: E402
from dflash_convert.sources.target import read_target  # noqa: E402
from fixtures.drafted_features import drafted_features  # noqa: E402

GNU_TIME = "/usr/bin/time"
GOAL_S, GOAL_RSS_MB = 3600, 12 * 1024  # issue 33: under an hour, peak RSS under 12 GB
SEARCH_STEPS = 2
# without GNU time (a bare GPU machine): the same wait4 from a small process, so the command is not billed this
# process's high-water mark (Linux keeps it across exec); written as GNU time -v writes it
RUSAGE = ("import os, subprocess, sys\np = subprocess.Popen(sys.argv[2:])\n_, st, ru = os.wait4(p.pid, 0)\n"
          "open(sys.argv[1], 'w').write(f'Maximum resident set size (kbytes): {ru.ru_maxrss}\\n')\n"
          "sys.exit(os.waitstatus_to_exitcode(st))")


def timed(cmd: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,), stderr_too: bool = False) -> dict[str, Any]:
    """Run ``cmd`` as a child: wall s, peak RSS MB (GNU time -v), its stdout lines with the second each arrived, its rc."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        wrap = [GNU_TIME, "-v", "-o", tf.name] if os.access(GNU_TIME, os.X_OK) else [sys.executable, "-c", RUSAGE, tf.name]
        print("$", shlex.join(cmd), flush=True)
        t0 = time.perf_counter()
        lines: list[tuple[float, str]] = []
        with subprocess.Popen(wrap + cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT if stderr_too else None,
                              text=True, env={**env, "PYTHONUNBUFFERED": "1"}, cwd=REPO) as p:
            assert p.stdout is not None
            for line in p.stdout:
                lines.append((time.perf_counter() - t0, line.rstrip("\n")))
                if not line.startswith("{"):  # the sweep's JSON stays out of the log
                    print(f"  [{lines[-1][0]:7.1f} s] {line}", end="", flush=True)
        wall = time.perf_counter() - t0
        rss_kb = [int(x.rsplit(":", 1)[1]) for x in tf.read().splitlines() if "Maximum resident set size" in x]
    if p.returncode not in ok:
        raise SystemExit(f"failed ({p.returncode}): {shlex.join(cmd)}")
    print(f"  {wall:.1f} s, peak RSS {rss_kb[0] / 1024:.0f} MB, exit {p.returncode}", flush=True)
    return {"cmd": cmd, "wall_s": wall, "rss_mb": rss_kb[0] / 1024, "lines": lines, "rc": p.returncode,
            "stdout": "\n".join(x for _, x in lines)}


def _machine(device: str) -> str:
    cpu = f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), {platform.platform()}"
    if device != "cuda" or not shutil.which("nvidia-smi"):  # no torch.cuda here: its context would sit in the GPU peak
        return cpu
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    return f"{gpu.stdout.strip() or 'CUDA'}; {cpu}"


def _goal(wall_s: float, rss_mb: float) -> str:
    ok = wall_s < GOAL_S and rss_mb < GOAL_RSS_MB
    return f"goal under {GOAL_S // 60} min, peak RSS under {GOAL_RSS_MB // 1024} GB: **{'met' if ok else 'not met'}**"


def _command(run: dict[str, Any]) -> str:
    words = [Path(a).name for a in run["cmd"][1:]]  # paths as their names
    return "`" + shlex.join(["dflash-convert", *words[2:]] if words[0] == "-m" else ["python", *words]) + "`"


def _features_text(args: argparse.Namespace, sweep: dict[str, Any]) -> str:
    if not args.accept_p:
        return ("random continuations: a random drafter accepts nothing, one live-loop anchor per new token "
                f"({args.sequences * args.new_tokens} per type).")
    mean = sum(args.accept_p ** k for k in range(1, 16))
    built = ("built by an earlier run (--features)" if sweep["features_s"] is None
             else f"built in {sweep['features_s']:.0f} s before the timed commands")
    return (f"continuations written along the F16 file's own live loop, the target taking each draft's slots while a "
            f"coin with p = {args.accept_p} says yes (fixtures/drafted_features.py; about {mean:.2f} accepted per step, "
            f"{args.sequences * args.new_tokens / (1 + mean):.0f} anchors per type for the F16 file: the few hundred a "
            f"capture of a trained drafter visits), {built}. A "
            "random drafter on random tokens accepts nothing instead and visits one anchor per new token "
            f"({args.sequences * args.new_tokens} per type): `--accept-p 0`.")


def report(args: argparse.Namespace, sweep: dict[str, Any], search: dict[str, Any] | None) -> str:
    """bench/results-sweep.md: settings, the sweep's table, its and the search's wall time and peak RSS."""
    rep = sweep["report"]
    lines = ["# `sweep` and `quantize --min-acceptance` on the full-size drafter", "",
             f"Machine: {_machine(args.device)}; device {args.device}; {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC.", "",
             f"Drafter: the full-size synthetic Qwen3.6-27B drafter as F16 (random weights), full-size BF16 target embedding "
             f"and head (248320 x 5120). Features: {rep['sequences']} synthetic sequences of {args.context} prompt + "
             f"{rep['new_tokens']} new tokens, n_max {rep['n_max']}, {rep['numerics']} numerics; " + _features_text(args, sweep), "",
             f"## sweep: {len(rep['rows'])} rows", "", _command(sweep), "",
             "| type | file bytes | bits/weight | accept | drafted | accepted | steps (anchors drafted) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rep["rows"]:
        acc = "needs imatrix" if r["accept"] is None else f"{r['accept']:.4f}"
        lines.append(f"| {r['type']}{' (input)' if r['input'] else ''} | {r['file_bytes']:,} | {r['bits_per_weight']:.2f} | "
                     f"{acc} | {r['n_drafted']} | {r['n_accept']} | {r['steps']} |")
    anchors = sum(r["steps"] or 0 for r in rep["rows"])
    lines += ["", f"{anchors} anchors drafted in all: {anchors / sweep['wall_s']:.2f} per second of the whole sweep "
              "(quantizing each type and loading each file included)."]
    lines += ["", f"Wall **{sweep['wall_s'] / 60:.1f} min** ({sweep['wall_s']:.0f} s), peak RSS **{sweep['rss_mb']:.0f} MB**; "
              + _goal(sweep["wall_s"], sweep["rss_mb"]) + "."]
    if search is not None:
        lines += [""] + search_section(search)
    return "\n".join(lines) + "\n"


def search_section(search: dict[str, Any]) -> list[str]:
    """The search's part of results-sweep.md: each line the command logged, the second it arrived, wall and peak RSS."""
    rows, last = [], 0.0
    for t, line in search["lines"]:
        rows.append(f"| {t:.0f} | {t - last:.0f} | `{line.strip()}` |")
        last = t
    return [f"## quantize --min-acceptance 0.98 from Q2_K: {SEARCH_STEPS} search steps", "", _command(search), "",
            "Each line the command printed, with the second it arrived (so the rows read: the time the phase before it "
            "took). The unquantized line comes after reading the files, the held-out live loop of the F16 file and its "
            "calibration score; the Q2_K line after quantizing its mix and its held-out live loop; each step's line after "
            "scoring every group's candidate on the calibration half, quantizing what they need, and the chosen mix's "
            "held-out live loop.", "",
            "| second | phase (s) | line |", "|---:|---:|---|", *rows, "",
            f"Exit {search['rc']}{' (the expected refusal: not reached within the steps)' if search['rc'] == 1 else ''}; "
            f"wall **{search['wall_s'] / 60:.1f} min** ({search['wall_s']:.0f} s), peak RSS **{search['rss_mb']:.0f} MB**; "
            + _goal(search["wall_s"], search["rss_mb"]) + "."]


def _features(path: Path, f16: Path, target: Path, args: argparse.Namespace) -> Path:
    d = read_drafter(f16)
    if not args.accept_p:
        return synthetic_features(path, d, args.sequences, args.context, args.new_tokens)
    import torch

    from dflash_convert.runtime.weights import load_weights

    torch.set_num_threads(os.cpu_count() or 1)
    w = load_weights(d, read_target(target))
    return drafted_features(path, d, w, args.sequences, args.context, args.new_tokens, accept_p=args.accept_p)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sequences", type=int, default=24)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--accept-p", type=float, default=0.8, help="the continuation follows the F16 file's drafts with "
                    "this chance per slot (0: random tokens, nothing accepted)")
    ap.add_argument("--types", default=",".join(DEFAULT_SWEEP_TYPES), help="quantized types (the F16 input is a row too)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--results", type=Path, default=REPO / "bench" / "results-sweep.md")
    ap.add_argument("--features", type=Path, help="read the features from this file, built there first when it is "
                    "missing (30 min on a 2-core AVX2 machine: build once, time the commands again and again)")
    skip = ap.add_mutually_exclusive_group()
    skip.add_argument("--skip-search", action="store_true")
    skip.add_argument("--skip-sweep", action="store_true", help="keep the results file's sweep section")
    args = ap.parse_args(argv)

    setup = full_size(["F16"])
    f16 = setup.ggufs["F16"]
    # the CLI's torch uses every core; bench_search's defaults to 1 thread
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "BENCH_THREADS": os.environ.get("BENCH_THREADS", str(os.cpu_count()))}
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        if args.features is not None and args.features.exists():
            feats, features_s = args.features, None
        else:
            t0 = time.perf_counter()
            if args.features is not None:  # built beside it, renamed when whole: an interrupted build is not reused
                part = args.features.with_name(args.features.stem + ".part" + args.features.suffix)
                feats = _features(part, f16, setup.target, args).rename(args.features)
            else:
                feats = _features(Path(tmp) / "features.safetensors", f16, setup.target, args)
            features_s = time.perf_counter() - t0
        target = ["--target-model-dir", str(setup.target), "--allow-other-target", "--device", args.device]
        if not args.skip_sweep:
            sweep = timed([sys.executable, "-m", "dflash_convert.cli", "sweep", str(f16), "--features", str(feats),
                           "--types", args.types, *target, "--json"], env)
            sweep["report"] = json.loads(sweep.pop("stdout"))
            sweep["features_s"] = features_s
            args.results.write_text(report(args, sweep, None))  # the sweep's table now, should the search be cut short
        search = None
        if not args.skip_search:
            search = timed([sys.executable, "-m", "dflash_convert.cli", "quantize", str(f16), str(Path(tmp) / "chosen.gguf"),
                            "Q2_K", "--features", str(feats), "--min-acceptance", "0.98", "--max-steps", str(SEARCH_STEPS),
                            *target], env, ok=(0, 1), stderr_too=True)
    if args.skip_sweep:  # the file's sweep section as it stands, the search's replaced
        kept = args.results.read_text().split("\n## quantize --min-acceptance")[0].rstrip("\n")
        text = kept + "\n\n" + "\n".join(search_section(search)) + "\n" if search else kept + "\n"
        args.results.write_text(text)
        print(text)
        return 0
    text = report(args, sweep, search)
    args.results.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
