"""Benchmark: the cost of ``quantize --min-acceptance``'s search, on the trained pair and full size.

* ``trained``: the trained fixture pair's full-attention drafter (F16) and a capture of its prompts
  (``--prompts N`` of them, ``--new-tokens``): the whole search from ``--start`` to 0.98, wall time,
  measurements, tensors quantized, and one plain ``accept`` of the same features for scale.
* ``full-size``: bench_convert's synthetic Qwen3.6-27B drafter (5 layers, hidden 5120, FFN 17408,
  5 taps) as bench_check's F16 GGUF, with its full-size target head, on synthetic features (random
  target features and tokens: a random drafter accepts nothing, so the goal is never reached and
  the search runs ``--steps`` steps, which is what is timed). Reports the time to quantize and
  decode the start mix, per measurement, and per step (every group's candidate measured once).

The cost bound the search keeps: each (tensor, type) is quantized once (its bytes are kept, the
decoded values only for the current mix); each sequence's context K/V is computed once per layer
and per types of fc and that layer's K/V projections; only the live loop's anchors are drafted.

    python bench/bench_search.py [--which trained,full-size] [--steps 1] [--new-tokens 8] [--sequences 2]
                                 [--device cpu|cuda] [--results bench/results-search.md]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _common import full_size as full_size_inputs  # noqa: E402

from dflash_convert.mix_search import (  # noqa: E402
    MixEvaluator,
    file_acceptance,
    mix_plan,
    quantized_types,
    raise_group,
    search_mix,
    tensor_groups,
)
from dflash_convert.sources.features import read_features, target_for  # noqa: E402
from dflash_convert.sources.gguf_drafter import read_drafter  # noqa: E402
from dflash_convert.sources.target import read_target  # noqa: E402


def trained(args: argparse.Namespace, tmp: Path) -> dict:
    from dflash_convert.capture import capture
    from fixtures.trained import build_trained_pair, drafter_gguf

    pair = build_trained_pair(seed=0)
    prompts = tmp / "prompts.txt"
    prompts.write_text("\n".join(pair.prompts[:args.prompts]) + "\n")
    feats_path = capture(pair.target_dir, prompts, tmp / "features.safetensors", new_tokens=args.new_tokens_trained,
                         device="cpu").output
    f16 = drafter_gguf(pair, "full", tmp / "gguf")
    feats = read_features(feats_path)
    target = target_for(feats)
    t0 = time.perf_counter()
    file_acceptance(f16, target, feats, 15)
    accept_s = time.perf_counter() - t0
    d = read_drafter(f16)
    t0 = time.perf_counter()
    ev = MixEvaluator(d, target, feats, d.block_size - 1)
    res = search_mix(ev, args.start, 0.98)
    return {"sequences": len(feats.sequences), "new_tokens": args.new_tokens_trained, "start": args.start,
            "reached": res.reached, "steps": len(res.steps), "measurements": res.evaluations, "quantized": res.quantized,
            "search_s": time.perf_counter() - t0, "one_live_loop_s": accept_s,
            "held_out": res.result.accept, "baseline_held_out": res.baseline.accept}


def synthetic_features(path: Path, d, sequences: int, prompt: int, new_tokens: int) -> Path:
    from fixtures.drafted_features import TOKEN_RANGE, synthetic_writer

    g = np.random.default_rng(0)
    w, L, taps = synthetic_writer(path, d, sequences, prompt, new_tokens)
    for i in range(sequences):
        w.write(i, g.integers(0, TOKEN_RANGE, L).astype(np.int64), prompt,
                g.standard_normal((len(taps), L, d.hidden_size)).astype(np.float16))
    return w.commit()


def full_size(args: argparse.Namespace, tmp: Path) -> dict:
    inputs = full_size_inputs(["F16"])
    target_dir = inputs.target
    d = read_drafter(inputs.ggufs["F16"])
    feats = read_features(synthetic_features(tmp / "features.safetensors", d, args.sequences, args.context,
                                             args.new_tokens))
    target = read_target(target_dir)
    t0 = time.perf_counter()
    ev = MixEvaluator(d, target, feats, d.block_size - 1, device=args.device)
    init_s = time.perf_counter() - t0
    state = quantized_types(mix_plan(d, args.start), d)
    t0 = time.perf_counter()
    first = ev.accept(state, [1])
    start_s = time.perf_counter() - t0  # quantize + decode every tensor of the start mix, then one measurement
    t0 = time.perf_counter()
    ev._results.clear()
    ev.accept(state, [1])
    measure_s = time.perf_counter() - t0  # one measurement, nothing to quantize, context K/V kept
    # one search step: every group's candidate quantized (once) and scored on the calibration half. A random
    # drafter accepts nothing, so search_mix would stop at once (0 >= 0.98 x 0): the step is timed as it runs there
    planned = mix_plan(d, args.start)
    ncols = {p.tensor.gguf_name: p.ne[0] for p in planned if p.tensor.gguf_name in state}
    groups = tensor_groups(d, set(state))
    before = (ev.evaluations, ev.quantized)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        here, best = ev.expected_length(state, [0]), None
        for _label, names in groups:
            candidate = raise_group(state, names, ncols)
            if candidate is not None:
                gain = ev.expected_length(candidate, [0]) - here
                best = (gain, candidate) if best is None or gain > best[0] else best
                ev.retain(state, best[1])  # as the search keeps the best candidate's layer inputs
        # the next step raises from the chosen mix, as the search does (the same candidates again would be memoised)
        state = best[1]
        ev.retain(state)
    step_s = (time.perf_counter() - t0) / args.steps
    return {"layers": d.n_layers, "hidden": d.hidden_size, "sequences": args.sequences, "new_tokens": args.new_tokens,
            "context": args.context, "start": args.start, "load_s": init_s, "start_mix_s": start_s,
            "measurement_s": measure_s, "steps": args.steps, "groups": len(groups), "step_s": step_s,
            "step_measurements": ev.evaluations - before[0], "step_quantized": ev.quantized - before[1],
            "drafted_per_measurement": first.n_drafted}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--which", default="trained,full-size")
    ap.add_argument("--start", default="Q2_K")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--new-tokens-trained", type=int, default=64)
    ap.add_argument("--sequences", type=int, default=2, help="full-size: synthetic sequences (the search needs 2)")
    ap.add_argument("--device", default="cpu", help="full-size: where the search's drafts run (cpu or cuda)")
    ap.add_argument("--results", type=Path, default=REPO / "bench" / "results-search.md")
    args = ap.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench-search-") as tmp:
        for which in args.which.split(","):
            sub = Path(tmp) / which
            sub.mkdir()
            out[which] = trained(args, sub) if which == "trained" else full_size(args, sub)
            print(which, json.dumps(out[which]), flush=True)
    lines = [f"# quantize --min-acceptance: the search's cost ({dt.datetime.now(dt.timezone.utc):%Y-%m-%d})", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}. "
             "`python bench/bench_search.py`.", ""]
    if "trained" in out:
        t = out["trained"]
        lines += ["## Trained pair (full-attention drafter, F16)", "",
                  f"{t['sequences']} captured sequences, -n {t['new_tokens']}, from {t['start']} to 0.98: "
                  f"{'reached' if t['reached'] else 'not reached'} in {t['steps']} steps, {t['measurements']} measurements "
                  f"(a live loop or a calibration score over one half), {t['quantized']} tensors quantized, **{t['search_s']:.1f} s**; one live loop "
                  f"over all sequences takes {t['one_live_loop_s']:.1f} s. Held-out accept {t['held_out']:.4f} "
                  f"(unquantized {t['baseline_held_out']:.4f}).", ""]
    if "full-size" in out:
        f = out["full-size"]
        lines += ["## Full-size synthetic drafter (Qwen3.6-27B shapes, F16, 3.3 GB)", "",
                  f"{f['layers']} layers, hidden {f['hidden']}; synthetic features: {f['sequences']} sequences of {f['context']} context "
                  f"+ {f['new_tokens']} new tokens (a random drafter accepts nothing: {f['drafted_per_measurement']} "
                  "drafts per measurement).", "",
                  "| what | seconds |", "|---|---|",
                  f"| read the F16 file, load the target head | {f['load_s']:.1f} |",
                  f"| quantize + decode the {f['start']} mix, first measurement | {f['start_mix_s']:.1f} |",
                  f"| one measurement (nothing new to quantize) | {f['measurement_s']:.1f} |",
                  f"| one search step: {f['groups']} groups' candidates scored on the calibration half "
                  f"({f['step_measurements'] // f['steps']} measurements, {f['step_quantized'] // f['steps']} tensors "
                  f"quantized) | {f['step_s']:.1f} |", "",
                  "A random drafter accepts nothing, so the search itself would stop at once (0 >= 0.98 x 0); the step "
                  "is timed as the search runs it. A search of S steps costs about start + S x step."]
    args.results.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
