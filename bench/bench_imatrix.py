"""Benchmark: ``dflash-convert imatrix`` on the full-size synthetic drafter, wall time and peak RSS.

The drafter is bench_convert's full-size synthetic one (Qwen3.6-27B drafter shapes) as bench_check's
F16 GGUF, with bench_check's full-size target embedding and head. The features are synthetic
(bench_search's: random layer inputs and tokens, ``--sequences`` of ``--prompt`` + ``--new-tokens``
positions; the cost does not depend on the values). A random drafter accepts nothing, so the live
loop drafts ``--new-tokens`` times per sequence. The command runs as a child under GNU time; the
imatrix it writes is kept in the cache (``IMATRIX_NAME``) for ``bench_quantize.py --imatrix``.

    python bench/bench_imatrix.py [--sequences 2] [--prompt 64] [--new-tokens 8] [--every-anchor]
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for _p in (str(REPO / "bench"), str(REPO)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from _common import full_size  # noqa: E402
from bench_convert import _machine, measure  # noqa: E402

from dflash_convert.sources.gguf_drafter import read_drafter  # noqa: E402

IMATRIX_NAME = "drafter-F16.imatrix.gguf"  # in the bench cache: the file bench_quantize --imatrix uses by default


def ensure_features(root: Path, gguf: Path, sequences: int, prompt: int, new_tokens: int) -> Path:
    """The synthetic features file for these sizes, made once into the bench cache."""
    path = root / f"imatrix-features-s{sequences}-p{prompt}-n{new_tokens}.safetensors"
    if not path.is_file():
        from bench_search import synthetic_features

        synthetic_features(path, read_drafter(gguf), sequences, prompt, new_tokens)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sequences", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--every-anchor", action="store_true")
    ap.add_argument("--results", type=Path, default=REPO / "bench" / "results-imatrix.md")
    args = ap.parse_args(argv)

    setup = full_size(["F16"])
    gguf = setup.ggufs["F16"]
    feats = ensure_features(setup.root, gguf, args.sequences, args.prompt, args.new_tokens)
    out = setup.root / IMATRIX_NAME
    cmd = [sys.executable, "-m", "dflash_convert.cli", "imatrix", str(gguf), "--features", str(feats), "-o", str(out),
           "--target-model-dir", str(setup.target), "--allow-other-target", "--device", "cpu", "--force", "-q",
           *(["--every-anchor"] if args.every_anchor else [])]
    keep = out.with_name(out.name + ".keep")  # measure() deletes its output first: the last good file survives a failure
    if out.is_file():
        out.replace(keep)
    r = measure("dflash-convert imatrix", cmd, None, "imatrix", out)
    print(r.log[-2000:])
    if r.rc != 0:
        if keep.is_file():
            keep.replace(out)
        raise SystemExit(f"imatrix failed (rc {r.rc})")
    keep.unlink(missing_ok=True)
    summary = next((ln for ln in r.log.splitlines() if ln.startswith("wrote ")), "")
    mode = "every anchor" if args.every_anchor else "the live loop (a random drafter accepts nothing: one draft per new token)"
    lines = ["# `dflash-convert imatrix` on the full-size synthetic drafter", "",
             f"Machine: {_machine()}; {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC.", "",
             f"Drafter: {setup.checkpoint.name} as F16 ({gguf.name}, 3.47 GB), full-size target embedding and head "
             f"(248320 x 5120, BF16); synthetic features: {args.sequences} sequences of {args.prompt} prompt + "
             f"{args.new_tokens} new tokens (random layer inputs and tokens), drafted over {mode}; `--device cpu`.", "",
             "| command | wall s | peak RSS MB | process-tree peak MB | CPU s | other load CPU s |", "|---|---:|---:|---:|---:|---:|",
             f"| `{' '.join(['dflash-convert', *cmd[3:]]).replace(str(setup.root), '$CACHE')}` | {r.wall_s:.1f} | {r.rss_mb:.0f} | "
             f"{r.tree_mb:.0f} | {r.cpu_s:.1f} | {r.foreign_cpu_s:.1f} |", "",
             f"Output: {summary.replace(str(setup.root), '$CACHE')}", ""]
    text = "\n".join(lines)
    print(text)
    args.results.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
