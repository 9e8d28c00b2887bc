"""Benchmark: `accept` on features captured from a target GGUF against llama-speculative-simple, on many prompts.

Issue 29 item 3 on every passage's opening (fixtures.trained.passage_openings: 32 prompts, 64 new
tokens each; the runtime tier, tests/test_gguf_capture.py, takes 24 of them with 16 new tokens, the
same sample spread thinner so that one near-tie flip moves a total less). Per target (F16 from llama.cpp's
converter, Q4_K_M by llama-quantize) and drafter file (full/sliding x F16/Q8_0/Q4_K_M/Q2_K):
llama-speculative-simple's n_accept/n_drafted summed over the prompts, ours from `accept` on
`capture --target-gguf` features, the points apart, and each differing prompt's first differing slot
(fixtures/loop_steps.py) with our and llama.cpp's top-two gaps, the largest of them in the table.

    python bench/bench_gguf_agreement.py [--out bench/results-gguf-agreement.md]
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fixtures.trained import build_trained_pair, drafter_gguf, passage_openings, run_speculative, target_gguf  # noqa: E402
from fixtures.upstream import build_dir, llama_tool  # noqa: E402

FILES = (("full", "F16"), ("full", "Q8_0"), ("full", "Q4_K_M"), ("full", "Q2_K"),
         ("swa", "F16"), ("swa", "Q8_0"), ("swa", "Q4_K_M"), ("swa", "Q2_K"))
def divergences(drafter: Path, target: Path, feats_path: Path, n_max: int, logs: list[str]) -> dict[int, tuple[float, float]]:
    """Per prompt whose loop parts from llama.cpp's -v log: (our, llama.cpp's) top-two gap in nats at the first
    slot the two draft differently (fixtures/loop_steps.py); prompts that agree step by step are absent."""
    from dflash_convert.runtime.weights import load_weights
    from dflash_convert.sources.features import read_features, target_for
    from dflash_convert.sources.gguf_drafter import read_drafter
    from fixtures.loop_steps import first_divergence, our_steps, speculative_steps, their_margin

    feats = read_features(feats_path)
    d = read_drafter(drafter)
    w = load_weights(d, target_for(feats, None, target), device="cpu")
    slots = feats.slots_for(d.target_layers, str(drafter))
    out = {}
    for i, log in enumerate(logs):
        if div := first_divergence(our_steps(d, w, feats, i, slots, n_max), speculative_steps(log)):
            out[i] = (div.margin, their_margin(div))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results-gguf-agreement.md")
    args = ap.parse_args()
    from dflash_convert.accept import accept
    from dflash_convert.capture import capture

    started = time.perf_counter()
    pair = build_trained_pair(seed=0)
    texts = passage_openings()
    assert set(pair.prompts) <= set(texts)
    llama_tool("llama-speculative-simple")  # builds libllama beside the tools
    lib = build_dir() / "bin" / "libllama.so"
    lines = [f"# accept on GGUF-captured features against llama-speculative-simple ({dt.date.today()})", "",
             f"The trained pair (fixtures/trained.py), {len(texts)} prompts (the first words of every "
             f"passage; the runtime tier uses 24 of them with -n 16), -n {pair.n_predict}, --spec-draft-n-max 15, one thread. "
             "`llama.cpp`: llama-speculative-simple's n_accept/n_drafted summed over the prompts; `ours`: `accept` on "
             "`capture --target-gguf` features of the same target GGUF. `differing`: prompts where the two loops part "
             "(a step accepted differently); at the first slot the two draft differently in each, `largest gap, ours`: "
             "the largest of our top-two logit gaps, `largest near-tie`: the largest of the smaller of ours and "
             "llama.cpp's (nats; nan: none part).", ""]
    with tempfile.TemporaryDirectory(prefix="bench-gguf-agreement-") as tmp:
        root = Path(tmp)
        f16 = target_gguf(pair)
        q4 = root / "target-Q4_K_M.gguf"
        subprocess.run([str(llama_tool("llama-quantize")), str(f16), str(q4), "Q4_K_M"], check=True, capture_output=True)
        (root / "prompts.txt").write_text("\n".join(texts) + "\n")
        drafters = {f: drafter_gguf(pair, f[0], root / "drafters", f[1]) for f in FILES}
        for name, target in (("F16", f16), ("Q4_K_M", q4)):
            feats = root / f"features-{name}.safetensors"
            capture(None, root / "prompts.txt", feats, new_tokens=pair.n_predict, target_gguf=target, libllama=lib,
                    threads=1)
            ours = accept([drafters[f] for f in FILES], feats, target_gguf=target, device="cpu")
            lines += [f"## {name} target", "",
                      "| drafter | llama.cpp | ours | points apart | differing prompts | largest gap, ours | largest near-tie |",
                      "|---|---:|---:|---:|---:|---:|---:|"]
            for f, r in zip(FILES, ours.results, strict=True):
                stats = [run_speculative(target, drafters[f], p, pair.n_predict, extra=("-v",)) for p in texts]
                nd, na = sum(s.n_drafted for s in stats), sum(s.n_accept for s in stats)
                differing = divergences(drafters[f], target, feats, ours.n_max, [s.output for s in stats])
                points = 100 * abs(r.loop.accept - na / nd)
                ours_gap = max((g[0] for g in differing.values()), default=math.nan)
                tie = max((min(g) if not math.isnan(g[1]) else g[0] for g in differing.values()), default=math.nan)
                lines.append(f"| {f[0]} {f[1]} | {na}/{nd} {na / nd:.1%} | {r.loop.n_accept}/{r.loop.n_drafted} | "
                             f"{points:.2f} | {len(differing)} | {ours_gap:.4f} | {tie:.4f} |")
                print(lines[-1], flush=True)
            lines.append("")
            args.out.write_text("\n".join(lines) + "\n")
    lines.append(f"Total {time.perf_counter() - started:.0f} s on this machine (2 cores).")
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
