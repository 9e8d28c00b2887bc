"""Benchmark: the family runner (DFlash2 and DSpark drafts) against the checkpoint reference forward.

Issue #18 item 7: on full-size synthetic layouts, one draft of a block after 512 context rows by the
GGUF runner (``runtime.forward.run_gguf`` with ``runtime.dflash2`` / ``runtime.dspark``) within 1.2x of
the reference forward (``runtime.reference``) on the same device.

Drafters (generated once into ~/.cache/dflash-convert/bench/, random BF16 from a fixed seed, written
tensor by tensor so memory stays bounded; names and shapes checked against fixtures.family's builders
on scaled-down copies of the configs):

* ``dflash2``: z-lab/Qwen3.8-27B-DFlash2 @50307d4c (shared/spec/published-configs.md §6.1): 5 layers,
  hidden 5120, FFN 17408, 32:8 heads of 128, all sliding (2048), conv kernel 2 / group 16, selector
  rank 256 / top-k 16, block 8, taps [5,19,33,47,61] of 64, vocab 248320, mask 248070;
* ``dspark``: no DSpark config is published in the spec docs, so the DFlash-lineage
  ``Qwen3DSparkModel`` gets z-lab/Qwen3.6-27B-DFlash's trunk (§3.1: 5 layers, hidden 5120, FFN 17408,
  32:8 heads, 4 sliding + 1 full, block 16, taps [1,16,31,46,61]) plus a Markov head of rank 256
  (the DFlash2 selector's rank; an assumption) and the confidence head; no lm_head (llama.cpp
  shares the target's).

Both read the bench target of bench/_common.py (Qwen3.6-27B's text shape, the real Qwen3.5/3.6
tokenizer, full-size random embedding and head: vocab 248320 = the drafters' vocabulary). Each is
converted once with this tree (``--outtype BF16`` by default) and cached.

Each side runs in its own child process (the two never share memory: a full-size side holds ~7 GB
of float32 drafter, and the 5 GB float32 target head is streamed from disk in chunks per draft) with ``torch.set_num_threads(--threads)``; the
child loads its side, drafts once to warm up, then times ``--repeat`` drafts as bench_check does;
``--rounds`` repeats the pair in ABBA order (reference, runner, runner, reference, ...) and pools them. The
table reports the median forward time, the ratio runner/reference (target <= 1.2) and the share of
drafted tokens equal to the reference's, so a fast wrong runner cannot pass. It also reports each
draft's CPU time (the child's user + system seconds): on a shared machine a draft's wall time also
counts the time other processes held the CPUs, its CPU time does not (both still pay for the memory
bandwidth and caches they share), so its ratio is the second figure to read.

    python bench/bench_family.py [--members dflash2,dspark] [--device cpu|cuda] [--context 512]
                                 [--repeat 3] [--rounds 2] [--threads 2] [--outtype BF16]

Prints a markdown table and writes bench/results-family.md (and .json) for ``--device cpu``,
bench/results-family-<device>.md otherwise.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
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
from typing import Any

REPO = Path(__file__).resolve().parent.parent
for _p in (str(REPO / "bench"), str(REPO)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import torch  # noqa: E402
from _common import ensure_target_with_heads  # noqa: E402
from bench_convert import _header, _layout, _numel, stamp_matches, wait_for_idle, write_synthetic_safetensors  # noqa: E402
from safetensors import safe_open  # noqa: E402

from fixtures.cache import cache_root  # noqa: E402
from fixtures.family import dflash2_config, dflash2_tensors, dspark_config, make_dspark_drafter  # noqa: E402

FAMILY_FIXTURE_VERSION = "1"
TARGET_RATIO = 1.2
Spec = tuple[str, tuple[int, ...], str]  # (name, shape, "matrix" | "norm") as bench_convert streams them

# the trunk every full-size bench drafter shares (z-lab's 27B drafters)
TRUNK = dict(layers=5, hidden=5120, ffn=17408, heads=32, kv_heads=8, head_dim=128, vocab_size=248320,
             mask_token_id=248070, num_target_layers=64)
SMALL = dict(hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
             vocab_size=300)  # the scaled-down copy the layouts are checked on
MARKOV_RANK = 256  # no published DSpark rank in the spec: the DFlash2 selector's rank


# --- the drafters ----------------------------------------------------------------------------------

def dflash2_full_config() -> dict[str, Any]:
    """z-lab/Qwen3.8-27B-DFlash2 @50307d4c (published-configs.md §6.1)."""
    cfg = dflash2_config(**TRUNK, conv_kernel_size=2, conv_group_size=16, selector_rank=256, selector_top_k=16,
                         block_size=8, target_layer_ids=[5, 19, 33, 47, 61], logit_transforms=False)
    cfg.update(bos_token_id=None, eos_token_id=248044, pad_token_id=248044, tie_word_embeddings=False,
               max_position_embeddings=262144)
    return cfg


def dspark_full_config() -> dict[str, Any]:
    """A Qwen3DSparkModel on z-lab/Qwen3.6-27B-DFlash's trunk (§3.1) with a rank-256 Markov head."""
    cfg = dspark_config(markov_rank=MARKOV_RANK, confidence=True, target_layer_ids=[1, 16, 31, 46, 61],
                        swa_layers=[True, True, True, True, False], sliding_window=2048, **TRUNK)
    cfg.update(tie_word_embeddings=False)
    return cfg


def _dflash2_layout(cfg: dict[str, Any]) -> list[Spec]:
    E, V = cfg["hidden_size"], cfg["vocab_size"]
    dc = cfg["dflash_config"]
    K, G, r = dc["conv_kernel_size"], dc["conv_group_size"], dc["selector_rank"]
    specs = _layout(cfg)
    for i in range(cfg["num_hidden_layers"]):
        for part in ("attention_conv", "mlp_conv"):
            specs += [(f"layers.{i}.{part}.base_kernel", (2, K, E), "matrix"),
                      (f"layers.{i}.{part}.kernel_projection.weight", (2 * K * (E // G), E), "matrix")]
    return specs + [("candidate_selector.hidden_projection.weight", (r, E), "matrix"),
                    ("candidate_selector.predecessor_codebook", (V, r), "matrix"),
                    ("candidate_selector.successor_codebook", (V, r), "matrix")]


def _dspark_layout(cfg: dict[str, Any]) -> list[Spec]:
    E, V, R = cfg["hidden_size"], cfg["vocab_size"], cfg["markov_rank"]
    return _layout(cfg) + [("markov_head.markov_w1.weight", (V, R), "matrix"),
                           ("markov_head.markov_w2.weight", (V, R), "matrix"),
                           ("confidence_head.proj.weight", (1, E + R), "matrix"),
                           ("confidence_head.proj.bias", (1,), "matrix")]


def _small(cfg: dict[str, Any]) -> dict[str, Any]:
    return {**cfg, **SMALL, "dflash_config": {**cfg["dflash_config"], "mask_token_id": 5}}


def _fixture_shapes(member: str, small: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """What fixtures.family builds for the scaled-down config (it materialises everything: not at full size)."""
    if member == "dflash2":
        return {k: tuple(v.shape) for k, v in dflash2_tensors(small).items()}
    kw = {k: small[k] for k in ("markov_rank",)}
    with tempfile.TemporaryDirectory() as tmp:
        out = make_dspark_drafter(Path(tmp) / "d", with_lm_head=False, layers=small["num_hidden_layers"],
                                  hidden=small["hidden_size"], ffn=small["intermediate_size"],
                                  heads=small["num_attention_heads"], kv_heads=small["num_key_value_heads"],
                                  head_dim=small["head_dim"], vocab_size=small["vocab_size"], mask_token_id=5,
                                  target_layer_ids=small["dflash_config"]["target_layer_ids"], **kw)
        with safe_open(str(out / "model.safetensors"), "pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 (safe_open has no iterator)


MEMBERS = {"dflash2": ("Qwen3.8-27B-DFlash2-synthetic", dflash2_full_config, _dflash2_layout),
           "dspark": ("Qwen3.6-27B-DSpark-synthetic", dspark_full_config, _dspark_layout)}


def member_specs(member: str) -> tuple[dict[str, Any], list[Spec]]:
    """The member's full-size config and streamed layout, after checking the layout against fixtures.family."""
    _, config_of, layout_of = MEMBERS[member]
    cfg = config_of()
    small = _small(cfg)
    if _fixture_shapes(member, small) != {n: s for n, s, _ in layout_of(small)}:
        raise RuntimeError(f"bench {member} layout drifted from fixtures.family")
    return cfg, layout_of(cfg)


def ensure_member(root: Path, member: str) -> Path:
    """The cached full-size checkpoint of ``member`` (generated on first use; a stamp says what it holds)."""
    name = MEMBERS[member][0]
    out = root / name
    cfg, specs = member_specs(member)
    header, _ = _header(specs)
    expected = len(header) + sum(2 * _numel(s) for _, s, _ in specs)
    want = {"version": FAMILY_FIXTURE_VERSION, "size": expected, "config": cfg}
    st = out / "model.safetensors"
    if st.is_file() and st.stat().st_size == expected and stamp_matches(out / "bench-fixture.json", want):
        return out
    print(f"generating {out} ({expected / 1e9:.2f} GB, once) ...", flush=True)
    t0 = time.perf_counter()
    tmp = root / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    size = write_synthetic_safetensors(tmp / "model.safetensors", specs, seed=3)
    assert size == expected, (size, expected)
    (tmp / "bench-fixture.json").write_text(json.dumps(want, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    print(f"  done in {time.perf_counter() - t0:.1f} s", flush=True)
    return out


def ensure_member_gguf(root: Path, src: Path, target: Path, outtype: str) -> Path:
    """This tree's GGUF of a bench checkpoint, cached beside it with a stamp of what it was made from."""
    out = root / f"{src.name}-{outtype}.gguf"
    stamp = root / f"{src.name}-{outtype}.json"
    want = {"checkpoint_size": (src / "model.safetensors").stat().st_size,
            "config": json.loads((src / "config.json").read_text()), "outtype": outtype}
    if out.is_file() and stamp_matches(stamp, want):
        return out
    print(f"converting {src.name} -> {out.name} ...", flush=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dflash_convert.cli", "convert", str(src), "--target-model-dir", str(target),
                    "--outtype", outtype, "-o", str(out), "--force", "-q"], check=True, cwd=REPO)
    stamp.write_text(json.dumps(want) + "\n")
    print(f"  done in {time.perf_counter() - t0:.1f} s", flush=True)
    return out


# --- the measurement -------------------------------------------------------------------------------

def _child(side: str, args: argparse.Namespace, src: Path, target: Path, gguf: Path) -> dict[str, Any]:
    """One side in a fresh process (run_worker), after waiting for the CPUs to be idle."""
    cmd = [sys.executable, __file__, "--worker", side, "--checkpoint", str(src), "--target", str(target),
           "--shape-from", str(gguf), "--device", args.device, "--context", str(args.context),
           "--repeat", str(args.repeat), "--threads", str(args.threads)]
    wait_for_idle(args.idle_wait)
    load_before = os.getloadavg()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if r.returncode != 0:
        raise SystemExit(f"{side} failed:\n{r.stderr[-3000:]}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res["loadavg_before"], res["loadavg_after"] = load_before, os.getloadavg()
    return res


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def run_worker(args: argparse.Namespace) -> dict[str, Any]:
    """Load one side, draft once to warm up, then time ``--repeat`` drafts (wall and this process's CPU time)."""
    # the child's side only: the runtime is imported where it is timed, not in the parent
    from dflash_convert.runtime.check_io import synthetic_inputs
    from dflash_convert.runtime.forward import run_gguf
    from dflash_convert.runtime.reference import load_reference, reference_forward
    from dflash_convert.runtime.weights import load_weights
    from dflash_convert.sources.checkpoint import read_checkpoint
    from dflash_convert.sources.gguf_drafter import read_drafter
    from dflash_convert.sources.target import read_target

    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    feats, ids, pos = synthetic_inputs(read_drafter(args.shape_from), args.context, 0)
    t0 = time.perf_counter()
    if args.worker == "reference":
        model = load_reference(read_checkpoint(args.checkpoint), read_target(args.target), device=dev, dtype=torch.float32)

        def forward() -> Any:
            return reference_forward(model, feats, ids, pos, semantics="llama.cpp")
    else:
        d = read_drafter(args.worker)
        w = load_weights(d, read_target(args.target), device=dev)

        def forward() -> Any:
            return run_gguf(d, w, feats, ids, pos)
    _sync(dev)
    load_s = time.perf_counter() - t0
    res = forward()  # warm-up (and the embedding rows it reads)
    _sync(dev)
    wall, cpu = [], []
    for _ in range(args.repeat):
        t, c = time.perf_counter(), time.process_time()
        res = forward()
        _sync(dev)
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return {"load_s": load_s, "forward_all_s": wall, "forward_median_s": statistics.median(wall),
            "cpu_all_s": cpu, "cpu_median_s": statistics.median(cpu), "threads": torch.get_num_threads(),
            "tokens": res.tokens.cpu().tolist(),
            # this child's high-water mark (ru_maxrss survives exec, but the parent's ~0.4 GB is far below a side)
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6}


def _merge(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One side's rounds as one: every timed draft pooled, the first load, the highest RSS."""
    if any(r["tokens"] != rounds[0]["tokens"] for r in rounds):
        raise SystemExit("a side drafted different tokens in two rounds: the forward is not deterministic")
    wall = [t for r in rounds for t in r["forward_all_s"]]
    cpu = [t for r in rounds for t in r["cpu_all_s"]]
    return {**rounds[0], "forward_all_s": wall, "forward_median_s": statistics.median(wall), "cpu_all_s": cpu,
            "cpu_median_s": statistics.median(cpu), "peak_rss_gb": max(r["peak_rss_gb"] for r in rounds),
            "loadavg_before": rounds[0]["loadavg_before"], "loadavg_after": rounds[-1]["loadavg_after"],
            "rounds": rounds}


def _machine() -> str:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), {mem:.0f} GiB, torch {torch.__version__}, "
            f"{platform.platform()}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", default="dflash2,dspark")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--outtype", default="BF16")
    ap.add_argument("--idle-wait", type=float, default=60.0)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", help=argparse.SUPPRESS)
    ap.add_argument("--target", help=argparse.SUPPRESS)
    ap.add_argument("--shape-from", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(run_worker(args)))
        return 0

    members = [m for m in args.members.split(",") if m]
    unknown = sorted(set(members) - set(MEMBERS))
    if unknown:
        raise SystemExit(f"unknown members {unknown}: choose from {sorted(MEMBERS)}")
    root = cache_root() / "bench"
    root.mkdir(parents=True, exist_ok=True)
    target = ensure_target_with_heads(root)
    started = dt.datetime.now(dt.timezone.utc)
    load_start = os.getloadavg()
    results: dict[str, dict[str, Any]] = {}
    for m in members:
        src = ensure_member(root, m)
        gguf = ensure_member_gguf(root, src, target, args.outtype)
        sides = {"reference": "reference", "runner": str(gguf)}
        runs: dict[str, list[dict[str, Any]]] = {"reference": [], "runner": []}
        for rnd in range(args.rounds):  # ABBA: neither side always runs first while the other load drifts
            for side in (("reference", "runner") if rnd % 2 == 0 else ("runner", "reference")):
                runs[side].append(_child(sides[side], args, src, target, gguf))
        results[m] = {"checkpoint": src.name, "gguf": gguf.name, **{k: _merge(v) for k, v in runs.items()}}
    load_end = os.getloadavg()

    lines = [f"# dflash-convert family runner vs reference forward ({args.device})", "",
             f"Machine: {_machine()}; {started:%Y-%m-%d %H:%M} UTC.", "",
             f"One draft: one block after {args.context} synthetic context rows (check's synthetic inputs, seed 0); "
             f"float32 compute on both sides (the runner dequantizes the {args.outtype} GGUF, the reference reads the BF16 "
             f"checkpoint as float32); {args.threads} torch threads; each side in its own process, one after the other, "
             f"{args.rounds} rounds in ABBA order; in each, one warm-up draft and {args.repeat} timed ones; the median is "
             f"over all {args.rounds * args.repeat} timed drafts of a side.", "",
             "| member | side | load s | forward ms (median) | all runs ms | ratio | CPU s per draft (median) | "
             "CPU ratio | tokens equal to reference | peak RSS GB | load avg before / after |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---|"]
    verdicts = []
    for m, r in results.items():
        ref, run = r["reference"], r["runner"]
        ratio = run["forward_median_s"] / ref["forward_median_s"]
        cpu_ratio = run["cpu_median_s"] / ref["cpu_median_s"]
        agree = sum(a == b for a, b in zip(run["tokens"], ref["tokens"], strict=True)) / len(ref["tokens"])
        for side, x, label, cpu_label in (("reference (checkpoint)", ref, "1.00", "1.00"),
                                          (f"runner ({args.outtype} GGUF)", run, f"{ratio:.2f}", f"{cpu_ratio:.2f}")):
            la = f"{x['loadavg_before'][0]:.2f} / {x['loadavg_after'][0]:.2f}"
            lines.append(f"| {m} | {side} | {x['load_s']:.1f} | {x['forward_median_s'] * 1e3:.0f} | "
                         f"{', '.join(f'{t * 1e3:.0f}' for t in x['forward_all_s'])} | {label} | {x['cpu_median_s']:.2f} | "
                         f"{cpu_label} | {'-' if x is ref else f'{agree:.3f}'} | {x['peak_rss_gb']:.1f} | {la} |")
        verdicts.append(f"- {m} ({r['checkpoint']}, {r['gguf']}): runner / reference = {ratio:.2f} wall, {cpu_ratio:.2f} CPU "
                        f"(target <= {TARGET_RATIO}: {'met' if ratio <= TARGET_RATIO else 'NOT met'}); "
                        f"drafted tokens equal: {agree:.3f}")
    lines += ["", *verdicts, "",
              f"Load average (1 min) at the start / end of the whole run: {load_start[0]:.2f} / {load_end[0]:.2f} "
              "(a shared machine: each side waits for the CPUs to be idle first, up to "
              f"{args.idle_wait:.0f} s; the per-side column shows what the run still shared)."]
    text = "\n".join(lines) + "\n"
    print(text)
    stem = "results-family" if args.device == "cpu" else f"results-family-{args.device}"
    (REPO / "bench" / f"{stem}.md").write_text(text)
    (REPO / "bench" / f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
