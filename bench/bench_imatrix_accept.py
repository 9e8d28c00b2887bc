"""Benchmark: what an importance matrix buys in accepted tokens, on the trained pair (both drafters).

The imatrix comes from a calibration capture (CALIBRATION: the first words of 12 passages that no
measuring prompt starts) via ``dflash-convert imatrix``; acceptance is measured on the pair's own
prompts (``pair.prompts``), never the same sequences. Per drafter (full attention, sliding window)
and type: tensor bytes, ``sweep --imatrix``'s accept without and with the imatrix (our live loop),
``llama-speculative-simple``'s accept for the file ``quantize --imatrix`` writes, and the smallest
file keeping 98% of the F16 file's acceptance with and without an imatrix.

    flock /work/notes/heavy.lock python bench/bench_imatrix_accept.py [--types T1,T2] [--out bench/results-imatrix-accept.md]
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dflash_convert.errors import DFlashError  # noqa: E402
from dflash_convert.quantize import SweepRow, plan_quantize, quantize, quantize_options, sweep  # noqa: E402
from fixtures.trained import PASSAGES, build_trained_pair, drafter_gguf, run_speculative, target_gguf  # noqa: E402

TYPES = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "IQ4_XS", "Q4_0", "Q3_K_M", "IQ3_S", "IQ3_XS", "IQ3_XXS", "Q2_K", "Q2_K_S",
         "IQ2_M", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ1_M", "IQ1_S")
CALIBRATION_PASSAGES = (1, 2, 3, 4, 6, 7, 8, 9, 11, 12, 13, 14)  # none is a measuring prompt's passage (0, 5, 10, ...)
CALIBRATION_WORDS = 6
KEEP = 0.98


def writable(f16: Path, ftype: str, imatrix: Path) -> str | None:
    """Why ``ftype`` cannot be written here (an unknown type, a missing encoder), or None."""
    try:
        plan_quantize(f16, f16.with_name("probe.gguf"), ftype, options=quantize_options(imatrix=str(imatrix)))
    except (DFlashError, ValueError) as e:
        return str(e).split(": ", 1)[-1]
    return None


def smallest(rows: list[SweepRow], goal: float) -> SweepRow | None:
    """The smallest measured row whose acceptance reaches ``goal``."""
    ok = [r for r in rows if r.loop is not None and r.loop.accept >= goal]
    return min(ok, key=lambda r: r.tensor_bytes) if ok else None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--kinds", default="full,swa")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results-imatrix-accept.md")
    args = ap.parse_args()
    from dflash_convert.capture import capture

    started = time.perf_counter()
    pair = build_trained_pair(seed=0)
    target = target_gguf(pair)
    calib = [" ".join(PASSAGES[i].split()[:CALIBRATION_WORDS]) for i in CALIBRATION_PASSAGES]
    assert not set(calib) & set(pair.prompts) and len(set(calib)) == len(calib)
    lines = [f"# Accepted tokens with and without an importance matrix ({dt.date.today()})", "",
             f"The trained pair (fixtures/trained.py). Acceptance: {len(pair.prompts)} distinct measuring prompts "
             f"(the pair's own), -n {pair.n_predict}, --spec-draft-n-max 15. The imatrix: `dflash-convert imatrix` on a "
             f"calibration capture of {len(calib)} other distinct prompts (the first {CALIBRATION_WORDS} words of "
             f"passages {', '.join(map(str, CALIBRATION_PASSAGES))}; no sequence shared), -n {pair.n_predict}. "
             "`without`/`with`: our live loop (`sweep --imatrix`); `llama.cpp`: `llama-speculative-simple` on the "
             "file `quantize --imatrix` writes, summed over the measuring prompts. `needs imatrix`: llama-quantize "
             "refuses the type without one.", ""]
    with tempfile.TemporaryDirectory(prefix="bench-imatrix-") as tmp:
        root = Path(tmp)
        (root / "measure.txt").write_text("\n".join(pair.prompts) + "\n")
        (root / "calib.txt").write_text("\n".join(calib) + "\n")
        feats = capture(pair.target_dir, root / "measure.txt", root / "measure.safetensors", new_tokens=pair.n_predict,
                        device="cpu").output
        cal = capture(pair.target_dir, root / "calib.txt", root / "calib.safetensors", new_tokens=pair.n_predict,
                      device="cpu").output
        from dflash_convert.imatrix import imatrix as make_imatrix

        for kind in args.kinds.split(","):
            f16 = drafter_gguf(pair, kind, root / "gguf")
            im = root / f"{kind}.imatrix.gguf"
            make_imatrix(f16, cal, im, progress=False)
            types, skipped = [], []
            for t in args.types.split(","):
                why = writable(f16, t, im)
                (skipped.append(f"{t} ({why})") if why else types.append(t))
            t0 = time.perf_counter()
            rep = sweep(f16, feats, types, imatrix=str(im), device="cpu",
                        log=lambda line, kind=kind: print(f"[{kind}] {line}", flush=True))
            sweep_s = time.perf_counter() - t0
            base = rep.rows[0]
            spec: dict[str, tuple[int, int]] = {}
            for r in rep.rows[1:]:
                out = root / f"{kind}-{r.file_type}.gguf"
                quantize(f16, out, r.file_type, options=quantize_options(imatrix=str(im)))
                stats = [run_speculative(target, out, p, pair.n_predict) for p in pair.prompts]
                spec[r.file_type] = (sum(s.n_drafted for s in stats), sum(s.n_accept for s in stats))
                print(f"[{kind}] llama.cpp {r.file_type}: {spec[r.file_type]}", flush=True)
                out.unlink()
            name = {"full": "full attention", "swa": "sliding window (first layer)"}[kind]
            lines += [f"## {name} drafter", "",
                      "| type | tensor bytes (with imatrix) | accept without | with imatrix (ours) | llama.cpp, with imatrix |",
                      "|---|---:|---:|---:|---:|",
                      f"| F16 (input) | {base.tensor_bytes} | {base.loop.accept:.2%} | | |"]
            for r in rep.rows[1:]:
                w = r.with_imatrix
                nd, na = spec[r.file_type]
                size = f"{r.tensor_bytes}" + (f" ({w.tensor_bytes})" if w.tensor_bytes != r.tensor_bytes else "")
                plain = "needs imatrix" if r.loop is None else f"{r.loop.accept:.2%} ({r.loop.n_accept}/{r.loop.n_drafted})"
                lines.append(f"| {r.file_type} | {size} | {plain} | {w.loop.accept:.2%} ({w.loop.n_accept}/"
                             f"{w.loop.n_drafted}) | {na / nd:.2%} ({na}/{nd}) |")
            goal = KEEP * base.loop.accept
            plain_best = smallest(rep.rows, goal)
            im_best = smallest([base] + [r.with_imatrix for r in rep.rows[1:] if r.with_imatrix], goal)

            def say(r: SweepRow | None) -> str:
                return "none" if r is None else f"{r.file_type} ({r.tensor_bytes} tensor bytes, {r.loop.accept:.2%})"

            lines += ["", f"Smallest file keeping {KEEP:.0%} of F16's {base.loop.accept:.2%} (>= {goal:.2%}): "
                      f"without imatrix {say(plain_best)}; with imatrix {say(im_best)}.",
                      f"Not measured (not writable at this commit): {', '.join(skipped) or 'none'}. "
                      f"Sweep {sweep_s:.0f} s.", ""]
            args.out.write_text("\n".join(lines) + "\n")  # each drafter's table as soon as it is done
    lines.append(f"Total {time.perf_counter() - started:.0f} s on this machine (2 shared cores).")
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
