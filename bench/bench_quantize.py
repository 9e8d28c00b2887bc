"""Benchmark: dflash-convert quantize vs llama-quantize, and the one-pass convert --outtype Q4_K_M.

The full-size synthetic drafter of bench_convert.py (z-lab Qwen3.6-27B-DFlash shapes, 3.46 GB BF16)
is converted once to F16 by llama.cpp's converter; then, in the same run, each TYPE is quantized
by ours and by llama-quantize (2 threads, no imatrix) and the outputs are compared byte for byte.
The one-pass figure: ours `convert --outtype Q4_K_M` straight from the checkpoint, against
upstream `convert_hf_to_gguf.py --outtype bf16` followed by `llama-quantize Q4_K_M` (summed).
Wall time, peak RSS (GNU time) and the ratios go to a markdown table in bench/results-quantize.md.
``--imatrix [FILE]`` (issue #30 item 5): both tools quantize with the same importance matrix (default:
the one bench_imatrix.py made for this drafter) from bench_check's F16 GGUF (the imatrix's drafter),
the imatrix types by default, no one-pass; the table goes to bench/results-quantize-imatrix.md.

    python bench/bench_quantize.py [--types Q8_0,Q4_K_M] [--repeats 3] [--runs 1] [--threads 2] [--imatrix [FILE]]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_convert import _machine, _upstream_cmd, ensure_drafter, ensure_target, measure, wait_for_idle  # noqa: E402

from fixtures.cache import cache_root  # noqa: E402
from fixtures.upstream import llama_tool, upstream_env  # noqa: E402

# issue #20: at most 1.0x llama-quantize's wall time for every type, 0.8x for the types drafters are
# published in; peak RSS under 300 MB
ALL_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M",
             "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS", "F16", "BF16")
FAST_GOAL = 0.8
TARGETS = {**{t: 1.0 for t in ALL_TYPES}, **{t: FAST_GOAL for t in ("Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_XS")},
           "rss_mb": 300}
# a single A/B run whose ratio is this close to its goal could decide the verdict by noise: it is
# run twice more (A/B in turn) and the medians are reported
CLOSE_CALL = 0.8
# issue #30 item 5: with --imatrix, at most 0.8x for the K-quants and IQ4_XS, 1.0x for the IQ1/IQ2/IQ3 types and Q2_K_S
IMATRIX_TYPES = ("Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_XS", "IQ3_XXS", "IQ3_XS", "IQ3_S", "IQ3_M", "Q2_K_S",
                 "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M")
IMATRIX_TARGETS = {**{t: 1.0 for t in IMATRIX_TYPES}, **{t: FAST_GOAL for t in IMATRIX_TYPES[:6]}, "rss_mb": 300}
ONE_PASS_GOAL = 0.6  # checkpoint -> Q4_K_M in one pass against upstream convert --outtype bf16 + llama-quantize


def _ours(*args: str) -> list[str]:
    exe = Path(sys.executable).with_name("dflash-convert")
    return [*([str(exe)] if exe.is_file() else [sys.executable, "-m", "dflash_convert.cli"]), *args]


def _run(name: str, cmd: list[str], env: dict[str, str] | None, out: Path, idle_wait: float):
    os.sync()
    wait_for_idle(idle_wait)
    r = measure(name, cmd, env, name, out)
    print(f"{name:34} {r.wall_s:7.1f} s  RSS {r.rss_mb:6.0f} MB  cpu {r.cpu_s:6.1f} s  other load {r.foreign_cpu_s:5.1f}  rc={r.rc}",
          flush=True)
    if r.rc != 0:
        print(r.log[-3000:], file=sys.stderr)
        raise SystemExit(f"{name} failed")
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default=None, help="default: every type (with --imatrix: IMATRIX_TYPES)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of a close call (median reported)")
    ap.add_argument("--runs", type=int, default=1, help="A/B runs of every type at least (a close call gets --repeats)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--idle-wait", type=float, default=120.0)
    ap.add_argument("--no-one-pass", action="store_true", help="skip the checkpoint -> Q4_K_M comparison")
    ap.add_argument("--imatrix", nargs="?", const="cache", type=str, default=None, metavar="FILE",
                    help="quantize with this importance matrix (default: bench_imatrix.py's, in the bench cache)")
    ap.add_argument("--results", type=Path, default=None)
    args = ap.parse_args(argv)
    here = Path(__file__).resolve().parent
    targets = IMATRIX_TARGETS if args.imatrix else TARGETS
    types = [t.strip() for t in (args.types or ",".join(IMATRIX_TYPES if args.imatrix else ALL_TYPES)).split(",") if t.strip()]
    results = args.results or here / ("results-quantize-imatrix.md" if args.imatrix else "results-quantize.md")

    root = cache_root() / "bench"
    root.mkdir(parents=True, exist_ok=True)
    src, target = ensure_drafter(root), ensure_target(root)
    outdir = root / "qout"
    outdir.mkdir(exist_ok=True)
    f16 = outdir / "drafter-F16.gguf"
    im_args: list[str] = []
    if args.imatrix:
        from _common import full_size
        from bench_imatrix import IMATRIX_NAME

        f16 = full_size(["F16"]).ggufs["F16"]  # the drafter the imatrix was collected on
        imatrix = root / IMATRIX_NAME if args.imatrix == "cache" else Path(args.imatrix)
        if not imatrix.is_file():
            raise SystemExit(f"no imatrix at {imatrix}: run bench/bench_imatrix.py first")
        im_args = ["--imatrix", str(imatrix)]
        args.no_one_pass = True
    if not f16.is_file():
        _run("upstream convert -> F16 (setup)", _upstream_cmd(src, target, f16, "f16"), upstream_env(), f16, 0)
    quantize_tool = str(llama_tool("llama-quantize"))
    # numba compiles the quantizers once per machine (then loads them from its cache): do that
    # before timing, and say how long it took
    warm = subprocess.run([sys.executable, "-c", "from dflash_convert.encoders import warm_up_kernels; print(f'{warm_up_kernels():.1f}')"],
                          capture_output=True, text=True, check=True).stdout.strip()
    print(f"numba kernels compiled or loaded in {warm} s (one-off, not in the timings)", flush=True)

    def write(rows: list, one_pass: tuple | None, partial: bool) -> None:
        """The table so far to ``results`` (after every type: a stopped run leaves what it measured)."""
        made_by = "by this tree (bench_check's check-F16.gguf, the imatrix's drafter)" if im_args else "by upstream's converter"
        lines = ["# dflash-convert quantize benchmark" + (" with an importance matrix" if im_args else ""), "", f"Machine: {_machine()}", "",
                 f"Drafter: {src.name} (3.46 GB BF16 checkpoint), F16 GGUF made {made_by}; {args.threads} threads each"
                 + (f"; both tools given `--imatrix {Path(im_args[1]).name}`" if im_args else "") + ".", "",
                 f"numba kernels compiled or loaded before timing in {warm} s (once per machine; later runs load them from the cache).", "",
                 f"Each type is quantized by llama-quantize then by us, in turn; a type whose first ratio is within "
                 f"{CLOSE_CALL:.0%} of its goal is run {args.repeats} times and the medians are shown (runs column)"
                 + (f"; every type at least {args.runs} times" if args.runs > 1 else "") + ".", "",
                 "| TYPE | ours wall s | llama-quantize wall s | ratio ours/llama | goal | ours peak RSS MB | llama peak RSS MB | bytes | runs "
                 "| ours CPU s | llama CPU s | CPU ratio | other load CPU s (ours / llama) |",
                 "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
        verdicts = []
        for t, o, u, same, n in rows:
            ratio = o.wall_s / u.wall_s
            lines.append(f"| {t} | {o.wall_s:.1f} | {u.wall_s:.1f} | {ratio:.2f} | {targets.get(t, 1.0)} | {o.rss_mb:.0f} | {u.rss_mb:.0f} | "
                         f"{'identical' if same else 'DIFFERENT'} | {n} | {o.cpu_s:.0f} | {u.cpu_s:.0f} | {o.cpu_s / u.cpu_s:.2f} | "
                         f"{o.foreign_cpu_s:.0f} / {u.foreign_cpu_s:.0f} |")
            goal = targets.get(t)
            if goal is not None:
                verdicts.append(f"- {t}: {ratio:.2f}x llama-quantize's wall time (target <= {goal}x: {'met' if ratio <= goal else 'NOT met'}); "
                                f"peak RSS {o.rss_mb:.0f} MB (target < {targets['rss_mb']}: {'met' if o.rss_mb < targets['rss_mb'] else 'NOT met'})")
        if one_pass:
            c, q, o, diffs = one_pass
            up = c.wall_s + q.wall_s
            lines += ["", "| one pass, checkpoint -> Q4_K_M | wall s | peak RSS MB |", "|---|---:|---:|",
                      f"| dflash-convert convert --outtype Q4_K_M | {o.wall_s:.1f} | {o.rss_mb:.0f} |",
                      f"| upstream convert bf16 + llama-quantize | {up:.1f} ({c.wall_s:.1f} + {q.wall_s:.1f}) | {max(c.rss_mb, q.rss_mb):.0f} |",
                      f"| ratio ours/upstream | {o.wall_s / up:.2f} | {o.rss_mb / max(c.rss_mb, q.rss_mb):.2f} |", "",
                      "Same file as upstream's but for our provenance keys: " + ("yes (every key and tensor)" if not diffs
                                                                                     else "NO: " + "; ".join(diffs[:3]))]
            verdicts.append(f"- one pass: {o.wall_s / up:.2f}x upstream convert + llama-quantize (target <= {ONE_PASS_GOAL}x: "
                            f"{'met' if o.wall_s / up <= ONE_PASS_GOAL else 'NOT met'})")
        if partial:
            lines[2:2] = [f"**Partial: {len(rows)} of {len(types)} types measured so far.**", ""]
        report = "\n".join([*lines, "", *verdicts, ""])
        if not partial:
            print(report)
        results.write_text(report)

    rows = []
    for t in types:
        theirs, ours = outdir / f"llama-quantize-{t}.gguf", outdir / f"ours-{t}.gguf"
        runs_u, runs_o = [], []
        while True:  # A/B in turn
            runs_u.append(_run(f"llama-quantize {t}", [quantize_tool, *im_args, str(f16), str(theirs), t, str(args.threads)], None, theirs,
                               args.idle_wait))
            runs_o.append(_run(f"dflash-convert quantize {t}", _ours("quantize", str(f16), str(ours), t, "--threads",
                                                                      str(args.threads), *im_args, "-q", "--force"), None, ours, args.idle_wait))
            if len(runs_u) == 1:
                same = _same_file(ours, theirs)
                print(f"  {t}: {'IDENTICAL files' if same else 'FILES DIFFER'}", flush=True)
            ratio = runs_o[0].wall_s / runs_u[0].wall_s
            if len(runs_u) >= max(args.repeats, args.runs) or (len(runs_u) >= args.runs and ratio < CLOSE_CALL * targets.get(t, 1.0)):
                break
        rows.append((t, _median(runs_o), _median(runs_u), same, len(runs_u)))
        write(rows, None, partial=True)
        theirs.unlink(missing_ok=True)
        ours.unlink(missing_ok=True)

    one_pass = None
    if not args.no_one_pass:
        mid, q_up, q_ours = outdir / "up-bf16.gguf", outdir / "up-Q4_K_M.gguf", outdir / "one-pass-Q4_K_M.gguf"
        c = _run("upstream convert -> BF16", _upstream_cmd(src, target, mid, "bf16"), upstream_env(), mid, args.idle_wait)
        q = _run("llama-quantize BF16 -> Q4_K_M", [quantize_tool, str(mid), str(q_up), "Q4_K_M", str(args.threads)], None, q_up,
                 args.idle_wait)
        o = _run("dflash-convert convert --outtype Q4_K_M", _ours("convert", str(src), "--target-model-dir", str(target), "-o",
                                                                  str(q_ours), "--outtype", "Q4_K_M", "-q"), None, q_ours, args.idle_wait)
        from dflash_convert.validate.compare import differences

        # the same file but for our provenance keys (general.converter.*, general.source.*): every other
        # key, general.* included, and every tensor's bytes
        diffs = differences(q_ours, q_up, general=True)
        one_pass = (c, q, o, diffs)
        for p in (mid, q_up, q_ours):
            p.unlink(missing_ok=True)

    write(rows, one_pass, partial=False)
    return 0 if all(row[3] for row in rows) else 1


def _median(runs: list):
    """The run of median wall time (its RSS with it)."""
    return sorted(runs, key=lambda r: r.wall_s)[len(runs) // 2]


def _same_file(a: Path, b: Path) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb", buffering=0) as fa, open(b, "rb", buffering=0) as fb:
        while True:
            x, y = fa.read(64 << 20), fb.read(64 << 20)
            if x != y:
                return False
            if not x:
                return True


if __name__ == "__main__":
    raise SystemExit(main())
