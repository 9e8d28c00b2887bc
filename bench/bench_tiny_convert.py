"""Benchmark: a tiny conversion's wall time with a cold and a warm tokenizer cache (issue #20, item 3).

A tiny z-lab drafter (2 layers, hidden 64, the Qwen3 vocabulary of 151936 rows; ~170 KB of
weights) is converted against a Qwen3 target directory with the real 151k-token tokenizer, as a
user runs it: ``dflash-convert convert ... -q`` as a child process. Three ways, ``--repeat`` runs
each, interleaved (wall time, and the CPU time of the command and its probe child, which a
busy machine moves less): **cold** (an empty cache directory: probe, parse, store), **warm** (the entry
already there) and **no cache** (``--no-cache``, what every run cost before). Then, in this
process, where the time goes: the command's imports, the borrowed keys built and read back, the
rest of the conversion. Targets: warm < 1.5 s, cold < 3 s.

    python bench/bench_tiny_convert.py [--repeat 3] [--results bench/results-tiny-convert.md]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fixtures.drafters import make_zlab_drafter  # noqa: E402
from fixtures.targets import make_target_dir  # noqa: E402

TARGETS = {"warm": 1.5, "cold": 3.0}


def _cpu_of_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)  # the command and its probe child, once waited for
    return r.ru_utime + r.ru_stime


def _run(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s of the command and its child): CPU time moves less with the machine's load."""
    t0, c0 = time.perf_counter(), _cpu_of_children()
    subprocess.run([sys.executable, "-m", "dflash_convert.cli", *args], check=True, env=env, cwd=REPO,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0, _cpu_of_children() - c0


def measure(root: Path, repeat: int) -> dict[str, list[tuple[float, float]]]:
    src = make_zlab_drafter(root / "draft", target_layer_ids=[0, 2])
    target = make_target_dir(root / "qwen3-target", "qwen3")
    base = ["convert", str(src), "--target-model-dir", str(target), "-q", "--force", "-o", str(root / "out.gguf")]
    warm_env = dict(os.environ, DFLASH_CONVERT_CACHE=str(root / "warm-cache"))
    _run(base, warm_env)  # fills the warm cache (and the page cache: every way reads the same files)
    times: dict[str, list[tuple[float, float]]] = {"cold": [], "warm": [], "no cache": []}
    for i in range(repeat):
        cold_root = root / f"cold-cache-{i}"
        times["cold"].append(_run(base, dict(os.environ, DFLASH_CONVERT_CACHE=str(cold_root))))
        times["warm"].append(_run(base, warm_env))
        times["no cache"].append(_run([*base, "--no-cache"], warm_env))
        shutil.rmtree(cold_root)
    return times


def breakdown(root: Path) -> list[tuple[str, float]]:
    """Where a conversion's time goes, measured in this process (and one child for the imports)."""
    from dflash_convert.metadata import Metadata
    from dflash_convert.tokenizer.borrow import borrow_from_dir
    from dflash_convert.tokenizer.cache import TokenizerCache

    target = root / "qwen3-target"
    env = dict(os.environ)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import dflash_convert.cli"], check=True, env=env)
    start_and_import = time.perf_counter() - t0
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True, env=env)
    bare = time.perf_counter() - t0
    torch = subprocess.run([sys.executable, "-X", "importtime", "-m", "dflash_convert.cli", "convert", str(root / "draft"),
                            "--target-model-dir", str(target), "-q", "--force", "-o", str(root / "out.gguf")],
                           capture_output=True, text=True, check=True, env=env)
    imports_torch = any(line.rstrip().endswith(("| torch", "| transformers")) for line in torch.stderr.splitlines())
    cache = TokenizerCache(Path(tempfile.mkdtemp(dir=root)))
    t0 = time.perf_counter()
    borrow_from_dir(Metadata(), target, "Qwen3ForCausalLM", 151936, cache=TokenizerCache(None))
    built = time.perf_counter() - t0
    borrow_from_dir(Metadata(), target, "Qwen3ForCausalLM", 151936, cache=cache)
    t0 = time.perf_counter()
    borrow_from_dir(Metadata(), target, "Qwen3ForCausalLM", 151936, cache=cache)
    read_back = time.perf_counter() - t0
    assert cache.outcome == "hit"
    return [("python start (bare interpreter)", bare), ("python start + import dflash_convert.cli", start_and_import),
            ("convert imports torch or transformers", float(imports_torch)),
            ("tokenizer keys built (probe child, parse, vocab, merges)", built),
            ("tokenizer keys read back from the cache", read_back)]


def report(times: dict[str, list[tuple[float, float]]], parts: list[tuple[str, float]], repeat: int) -> str:
    load = os.getloadavg()
    lines = ["# A tiny conversion, cold and warm tokenizer cache", "",
             f"Machine: {os.cpu_count()} CPUs ({platform.machine()}), {platform.platform()}; "
             f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
             "(a machine shared with other jobs: the numbers move with them).", "",
             "Tiny z-lab drafter (2 layers, hidden 64, 151936-row vocabulary) against a Qwen3 target dir with the real "
             f"151k-token tokenizer; `dflash-convert convert ... -q` as a child process, {repeat} runs each, interleaved.", "",
             "| cache | median wall s | wall runs (s) | median CPU s | target (wall) |", "|---|---:|---|---:|---|"]
    for way, runs in times.items():
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        goal = TARGETS.get(way)
        verdict = "" if goal is None else f"< {goal} s: {'met' if statistics.median(walls) < goal else 'NOT met'}"
        lines.append(f"| {way} | {statistics.median(walls):.2f} | {', '.join(f'{t:.2f}' for t in walls)} | "
                     f"{statistics.median(cpus):.2f} | {verdict} |")
    lines += ["", "Where the time goes (in-process, one run each):", "", "| part | s |", "|---|---:|"]
    for name, value in parts:
        shown = ("yes" if value else "no") if name.startswith("convert imports") else f"{value:.2f}"
        lines.append(f"| {name} | {shown} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--results", type=Path, default=REPO / "bench" / "results-tiny-convert.md")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-tiny-") as tmp:
        root = Path(tmp)
        times = measure(root, args.repeat)
        parts = breakdown(root)
    text = report(times, parts, args.repeat)
    print(text, end="")
    args.results.write_text(text)


if __name__ == "__main__":
    main()
