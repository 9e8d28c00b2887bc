"""Choosing a quantization by acceptance, on the trained pair: sweep (table, Pareto front, plot) and
quantize --min-acceptance (the search, its recipe, its record, llama-quantize writing the same file).

The features are a small capture (4 prompts, 32 new tokens) so the search runs in about a minute;
the closing numbers of the issue come from the 24-prompt capture (README, docs/quantize.md).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from dflash_convert.errors import DFlashError
from dflash_convert.format.ggml import GGMLType
from dflash_convert.format.keys import CHOSEN_KEYS, CHOSEN_TENSOR_TYPE
from dflash_convert.mix_search import SpilledBytes, mix_plan, quantized_types, recipe, tensor_groups
from dflash_convert.quantize import SweepRow, mark_pareto, quantize_for_acceptance
from dflash_convert.runtime.counts import LoopCount
from dflash_convert.sources.gguf import read_gguf
from dflash_convert.sources.gguf_drafter import read_drafter
from fixtures.trained import TrainedPair, build_trained_pair, drafter_gguf

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def pair() -> TrainedPair:
    """Built once per machine (about two minutes on a clean clone, then read from the cache)."""
    return build_trained_pair(seed=0)


@pytest.fixture(scope="module")
def files(pair, tmp_path_factory) -> dict[str, Path]:
    from dflash_convert.capture import capture

    root = tmp_path_factory.mktemp("choose")
    prompts = root / "prompts.txt"
    prompts.write_text("\n".join(pair.prompts[:4]) + "\n")
    feats = capture(pair.target_dir, prompts, root / "features.safetensors", new_tokens=32, device="cpu").output
    one = root / "one.txt"
    one.write_text(pair.prompts[0] + "\n")
    single = capture(pair.target_dir, one, root / "single.safetensors", new_tokens=32, device="cpu").output
    return {"f16": drafter_gguf(pair, "full", root / "gguf"), "features": feats, "single": single, "root": root}


def test_sweep_table_json_and_plot(files, tmp_path):
    """About 40 s: two sweeps (three types, then one for the text table) and an accept, each a live loop
    over the small capture: a row is only shown to be accept's own count by measuring both."""
    png = tmp_path / "sweep.png"
    r = run_cli("sweep", files["f16"], "--features", files["features"], "--types", "Q8_0,Q4_K_M,Q2_K", "--json",
                "--plot", png)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    rows = {row["type"]: row for row in report["rows"]}
    assert list(rows) == ["F16", "Q8_0", "Q4_K_M", "Q2_K"] and rows["F16"]["input"]
    assert rows["Q2_K"]["tensor_bytes"] < rows["Q4_K_M"]["tensor_bytes"] < rows["Q8_0"]["tensor_bytes"] < rows["F16"]["tensor_bytes"]
    assert 2.5 < rows["Q2_K"]["bits_per_weight"] < 3.5 and 8.4 < rows["Q8_0"]["bits_per_weight"] < 8.7
    for row in rows.values():
        assert row["n_drafted"] > 0 and 0 < row["accept"] < 1
        assert row["accept"] == pytest.approx(row["n_accept"] / row["n_drafted"])
    # the smallest file is always on the front; a file beaten in size and acceptance never is
    assert rows["Q2_K"]["pareto"]
    for a in rows.values():
        dominated = any(b is not a and b["tensor_bytes"] <= a["tensor_bytes"] and b["accept"] >= a["accept"]
                        and (b["tensor_bytes"], b["accept"]) != (a["tensor_bytes"], a["accept"]) for b in rows.values())
        assert a["pareto"] == (not dominated)
    # each row is what accept measures on the same file (the live loop, llama.cpp's count)
    q4 = files["root"] / "gguf" / "q4.gguf"
    assert run_cli("quantize", "-q", files["f16"], q4, "Q4_K_M").returncode == 0
    a = run_cli("accept", q4, "--features", files["features"], "--json")
    assert a.returncode == 0, a.stderr
    got = json.loads(a.stdout)["files"][0]
    assert (got["n_drafted"], got["n_accept"]) == (rows["Q4_K_M"]["n_drafted"], rows["Q4_K_M"]["n_accept"])
    # the plot: a PNG of the size drawn, not blank (several colours, points and text)
    from matplotlib import image

    pixels = image.imread(png)
    assert pixels.shape[:2] == (540, 840)
    flat = pixels[..., :3].reshape(-1, 3)
    assert flat.std() > 0.05 and len({tuple(p) for p in flat[::37].round(2)}) > 20
    assert not list(tmp_path.glob(".*partial*"))
    # the temporary quantized files are gone
    text = run_cli("sweep", files["f16"], "--features", files["features"], "--types", "Q8_0")
    assert text.returncode == 0 and "pareto" in text.stdout and "Q8_0" in text.stdout


def test_sweep_refuses_clearly(files, tmp_path):
    r = run_cli("sweep", files["f16"], "--features", files["features"], "--types", "Q9_K")
    assert r.returncode == 64 and "Q9_K" in r.stderr and "Traceback" not in r.stderr
    planted = tmp_path / "no-matplotlib" / "matplotlib"
    planted.mkdir(parents=True)
    (planted / "__init__.py").write_text("raise ImportError('not installed (planted)')\n")
    env = dict(os.environ, PYTHONPATH=str(planted.parent))
    r = subprocess.run([sys.executable, "-m", "dflash_convert.cli", "sweep", str(files["f16"]), "--features",
                        str(files["features"]), "--plot", str(tmp_path / "p.png")], capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "--plot needs matplotlib" in r.stderr and "dflash-convert[plot]" in r.stderr
    assert not (tmp_path / "p.png").exists()
    r = run_cli("sweep", files["f16"], "--features", files["features"], "--plot", files["f16"], "--force")
    assert r.returncode == 1 and "input" in r.stderr  # never over an input


def test_pareto_marking():
    rows = [SweepRow(name, 0, size, 1, LoopCount(n_drafted=10, n_accept=n, steps=1))
            for name, size, n in [("a", 100, 5), ("b", 200, 5), ("c", 300, 7), ("d", 150, 4)]]
    mark_pareto(rows)
    assert [r.pareto for r in rows] == [True, False, True, False]


def test_min_acceptance_chooses_records_and_llama_quantize_agrees(files, tmp_path):
    out = tmp_path / "chosen.gguf"
    r = run_cli("quantize", files["f16"], out, "Q2_K", "--features", files["features"], "--min-acceptance", "0.98")
    assert r.returncode == 0, r.stderr
    assert "recipe: " in r.stdout and "llama-quantize writes the same file with: llama-quantize" in r.stdout
    md = read_gguf(out).metadata
    key = {k: v[0] for k, v in CHOSEN_KEYS.items()}
    base = md[key["baseline_acceptance"]].value
    got = md[key["acceptance"]].value
    assert md[key["base_type"]].value == b"Q2_K" and md[key["min_acceptance"]].value == pytest.approx(0.98)
    assert got >= 0.98 * base - 1e-6  # the held-out goal, as measured and recorded
    n = md[key["tensor_type_count"]].value
    items = [md[CHOSEN_TENSOR_TYPE.format(i=i)].value.decode() for i in range(n)]
    recipe_line = next(x for x in r.stdout.splitlines() if x.startswith("recipe: "))
    assert shlex.split(recipe_line[len("recipe: "):])[1::2] == items or (not items and "plain mix" in recipe_line)
    # more tensor bytes than plain Q2_K (it raised something) unless plain Q2_K already kept the
    # acceptance, and then the very same tensors (the file is bigger only by the keys that record the choice)
    plain = tmp_path / "plain.gguf"
    assert run_cli("quantize", "-q", files["f16"], plain, "Q2_K").returncode == 0
    chosen_tensors, plain_tensors = read_gguf(out).tensors, read_gguf(plain).tensors
    if items:
        assert sum(t.nbytes for t in chosen_tensors) > sum(t.nbytes for t in plain_tensors)
    else:
        assert [(t.name, t.ggml_type, t.nbytes) for t in chosen_tensors] == [(t.name, t.ggml_type, t.nbytes) for t in plain_tensors]
    # inspect shows how the file was chosen
    i = run_cli("inspect", out)
    assert i.returncode == 0 and "chosen by acceptance (quantize --min-acceptance 0.98): Q2_K" in i.stdout
    # llama-quantize given the printed flags writes the very same bytes
    pytest.importorskip("fixtures.upstream")
    from fixtures.upstream import llama_tool

    line = next(x for x in r.stdout.splitlines() if x.startswith("llama-quantize writes the same file with: "))
    args = shlex.split(line.split(": ", 1)[1])[1:]
    theirs = tmp_path / "theirs.gguf"
    args[-2] = str(theirs)
    q = subprocess.run([str(llama_tool("llama-quantize")), *args[:-1], args[-1], "2"], capture_output=True, text=True)
    assert q.returncode == 0, q.stdout[-1500:] + q.stderr[-1500:]
    assert theirs.read_bytes() == out.read_bytes()


def test_search_refuses_what_it_cannot(files, tmp_path):
    f16, feats = files["f16"], files["features"]
    for args, why, code in [(["--min-acceptance", "0.9"], "go together", 64), (["--features", str(feats)], "go together", 64),
                            (["--features", str(feats), "--min-acceptance", "0.9", "--tensor-type", "attn=q8_0"],
                             "--tensor-type", 64),
                            (["--features", str(feats), "--min-acceptance", "1.5"], "not in the range 0<x<=1", 64),
                            (["--features", str(files["single"]), "--min-acceptance", "0.9"], "at least 2", 1)]:
        r = run_cli("quantize", f16, tmp_path / "x.gguf", "Q2_K", *args)
        assert r.returncode == code and why in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    assert not (tmp_path / "x.gguf").exists()
    # out of steps: refused, unless the plain mix or its first step already keeps all the input's held-out
    # acceptance (plain Q2_K does on some machines' pair: the pair is trained with this CPU's kernels)
    r = run_cli("quantize", f16, tmp_path / "x.gguf", "Q2_K", "--features", feats, "--min-acceptance", "1",
                "--max-steps", "1", "--dry-run", "--device", "cpu")
    if r.returncode == 1:
        assert "no mix from Q2_K within 1 step(s) reaches it" in r.stderr and "nothing written" in r.stderr, r.stderr
        assert r.stdout.count("  step ") == 1, r.stdout
    else:
        assert r.returncode == 0 and "chosen: Q2_K mix raised in " in r.stdout and r.stdout.count("  step ") <= 1, r.stdout
    try:
        chosen = quantize_for_acceptance(f16, tmp_path / "x.gguf", "Q2_K", feats, 1.0, device="cpu", max_steps=0,
                                         dry_run=True)
    except DFlashError as e:
        assert "within 0 step(s) reaches it" in str(e) and "nothing written" in str(e), e
    else:
        res = chosen.search
        assert res.reached and not res.steps and not chosen.tensor_types and res.plain.accept >= res.baseline.accept, res
    q8 = tmp_path / "q8.gguf"
    assert run_cli("quantize", "-q", f16, q8, "Q8_0").returncode == 0
    r = run_cli("quantize", q8, tmp_path / "x.gguf", "Q2_K", "--features", feats, "--min-acceptance", "0.9")
    assert r.returncode == 1 and not (tmp_path / "x.gguf").exists()
    assert not list(tmp_path.glob(".*partial*"))


def test_recipe_reproduces_any_assignment(files):
    """Pinning one attn_v moves the mix's attn_v counter for later layers: the recipe pins those too."""
    d = read_drafter(files["f16"])
    state = quantized_types(mix_plan(d, "Q4_K_M"), d)
    assert [g for g, _ in tensor_groups(d, set(state))] == ["fc", "blk.0.attn", "blk.0.ffn", "blk.1.attn", "blk.1.ffn"]
    want = dict(state, **{"blk.0.attn_v.weight": GGMLType.Q8_0, "blk.0.ffn_up.weight": GGMLType.Q5_K,
                          "blk.0.ffn_gate.weight": GGMLType.Q5_K})
    items = recipe(d, "Q4_K_M", want)
    got = {p.tensor.gguf_name: p.ggml_type for p in mix_plan(d, "Q4_K_M", tuple(items))}
    assert all(got[n] == t for n, t in want.items())
    assert (r"blk\.0\.(ffn_gate|ffn_up)\.weight", GGMLType.Q5_K) in items
    assert recipe(d, "Q4_K_M", state) == []  # the plain mix needs no item


def test_calibration_score_by_layers_equals_every_slot_block_by_block(files):
    """The search's score, computed layer by layer from a scored mix's layer inputs with the lazy head, equals
    the definition computed block by block with every slot's logits (to SOFT_FLOOR's bound and float rounding)."""
    import torch

    from dflash_convert.mix_search import MixEvaluator, raise_group, split
    from dflash_convert.runtime.accept import SOFT_FLOOR
    from dflash_convert.sources.features import read_features, target_for

    feats = read_features(files["features"])
    d = read_drafter(files["f16"])
    state = quantized_types(mix_plan(d, "Q2_K"), d)
    ncols = {p.tensor.gguf_name: p.ne[0] for p in mix_plan(d, "Q2_K")}
    groups = dict(tensor_groups(d, set(state)))
    last = raise_group(state, groups["blk.1.ffn"], ncols)  # starts from the state's input of layer 1
    first = raise_group(state, groups["fc"], ncols)  # every layer again
    cal, _ = split(len(feats.sequences))
    ev = MixEvaluator(d, target_for(feats), feats, d.block_size - 1)
    torch.manual_seed(0)
    scores = [ev.expected_length(state, cal)]
    assert ev._nearest_prefix(last, cal, 2)[0] == 1 and ev._nearest_prefix(first, cal, 2)[0] == 0
    scores += [ev.expected_length(s, cal) for s in (last, first)]
    fresh = MixEvaluator(d, target_for(feats), feats, d.block_size - 1)
    by_blocks = [fresh._soft_by_blocks(s, cal, 2) for s in (state, last, first)]
    assert len(set(scores)) == 3 and max(scores) > 0.1  # a trained drafter: the raises move the score
    for got, want in zip(scores, by_blocks, strict=True):
        assert abs(got - want) <= 1e-6 * want + (d.block_size - 1) * SOFT_FLOOR, (scores, by_blocks)


def test_calibration_score_drafts_at_most_its_anchor_budget(files):
    """The score drafts every second anchor of the calibration half; past ``calibration_anchors`` of them, that
    many, evenly spaced through every sequence's, and its value is the definition's mean over those alone."""
    from dflash_convert.mix_search import CALIBRATION_ANCHORS, MixEvaluator, split
    from dflash_convert.runtime.accept import SOFT_FLOOR
    from dflash_convert.sources.features import read_features, target_for

    feats = read_features(files["features"])
    d = read_drafter(files["f16"])
    n_max = d.block_size - 1
    cal, _ = split(len(feats.sequences))
    state = quantized_types(mix_plan(d, "Q2_K"), d)
    full = MixEvaluator(d, target_for(feats), feats, n_max)
    every = full.scored_anchors(cal)
    assert every == [list(range(feats.sequences[i].prompt_length - 1, feats.sequences[i].length - 1 - n_max, 2))
                     for i in cal]
    assert 5 < sum(map(len, every)) <= CALIBRATION_ANCHORS  # this capture is under the budget: all of them

    few = MixEvaluator(d, target_for(feats), feats, n_max, calibration_anchors=5)
    got = few.scored_anchors(cal)
    flat = [(j, c) for j, anchors in enumerate(every) for c in anchors]
    assert [(j, c) for j, anchors in enumerate(got) for c in anchors] == [flat[k * len(flat) // 5] for k in range(5)]
    assert all(got)  # each sequence keeps some
    score, by_blocks = few.expected_length(state, cal), few._soft_by_blocks(state, cal, 2)
    assert abs(score - by_blocks) <= 1e-6 * by_blocks + n_max * SOFT_FLOOR, (score, by_blocks)
    assert score != full.expected_length(state, cal)  # fewer anchors, another mean


def test_spilled_bytes_read_back_what_was_put():
    store = SpilledBytes()
    g = np.random.default_rng(0)
    kept = {("blk.0.ffn_up.weight", k): g.integers(0, 256, n, dtype=np.uint8) for k, n in enumerate([0, 1, 4097, 1 << 20])}
    for key, data in kept.items():
        store.put(key, data)
    store.put("float", np.arange(5, dtype=np.float32))  # any array: its bytes
    assert store.get(("blk.0.ffn_up.weight", 9)) is None
    for key, data in reversed(kept.items()):
        got = store.get(key)
        assert got is not None and got.dtype == np.uint8 and np.array_equal(got, data)
    assert np.array_equal(store.get("float").view(np.float32), np.arange(5, dtype=np.float32))


def test_a_full_temporary_folder_is_named_as_such(tmp_path):
    """The search's spill file on a full disk (RLIMIT_FSIZE in a child: EFBIG) is one error naming $TMPDIR, not the output."""
    from test_faults_outputs import _fsize_limited

    code = ("import numpy as np\nfrom dflash_convert.errors import DFlashError\nfrom dflash_convert.mix_search import "
            "SpilledBytes\ntry:\n    SpilledBytes().put('k', np.zeros(1 << 20, np.uint8))\nexcept DFlashError as e:\n"
            "    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, preexec_fn=_fsize_limited,
                       env={**os.environ, "TMPDIR": str(tmp_path)})
    assert r.returncode == 0 and r.stdout.startswith(f"{tmp_path}: the search's temporary file: File too large"), r
    assert "set TMPDIR to a disk with room" in r.stdout and not any(tmp_path.iterdir())
