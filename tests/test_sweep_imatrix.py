"""sweep --imatrix (both columns, both curves) and quantize --min-acceptance --imatrix (the ladder with
the imatrix-only types), on the trained pair: measured on 4 passage prompts, the imatrix from 3 others.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from dflash_convert.format.ggml import GGMLType
from dflash_convert.format.keys import CHOSEN_KEYS
from dflash_convert.format.quant_types import RAISE_LADDER, raise_ladder
from dflash_convert.mix_search import raise_group
from dflash_convert.quantize import SweepReport, SweepRow, mark_pareto_both
from dflash_convert.runtime.counts import LoopCount
from dflash_convert.sources.gguf import read_gguf
from dflash_convert.write_imatrix import ImatrixFile, write_gguf_imatrix
from fixtures.trained import PASSAGES, TrainedPair, build_trained_pair, drafter_gguf

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def pair() -> TrainedPair:
    return build_trained_pair(seed=0)


@pytest.fixture(scope="module")
def files(pair, tmp_path_factory) -> dict[str, Path]:
    from dflash_convert.capture import capture

    root = tmp_path_factory.mktemp("sweep-imatrix")
    measure, calib = root / "measure.txt", root / "calib.txt"
    measure.write_text("\n".join(pair.prompts[:4]) + "\n")
    calib_prompts = [" ".join(PASSAGES[i].split()[:6]) for i in (1, 2, 3)]  # no measuring prompt among them
    assert not set(calib_prompts) & set(pair.prompts)
    calib.write_text("\n".join(calib_prompts) + "\n")
    feats = capture(pair.target_dir, measure, root / "features.safetensors", new_tokens=32, device="cpu").output
    cal = capture(pair.target_dir, calib, root / "calib.safetensors", new_tokens=32, device="cpu").output
    f16 = drafter_gguf(pair, "full", root / "gguf")
    im = root / "draft.imatrix.gguf"
    r = run_cli("imatrix", f16, "--features", cal, "-o", im)
    assert r.returncode == 0, r.stderr
    return {"f16": f16, "features": feats, "imatrix": im, "root": root}


def test_sweep_imatrix_two_columns_and_curves(files, tmp_path):
    """About 25 s: Q4_K_M measured twice, IQ3_XS once (it needs the imatrix), one accept of the imatrix file."""
    png = tmp_path / "sweep.png"
    r = run_cli("sweep", files["f16"], "--features", files["features"], "--types", "Q4_K_M,IQ3_XS",
                "--imatrix", files["imatrix"], "--json", "--plot", png)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["imatrix"] == str(files["imatrix"])
    rows = {row["type"]: row for row in report["rows"]}
    assert list(rows) == ["F16", "Q4_K_M", "IQ3_XS"] and rows["F16"]["imatrix"] is None
    q4, iq3 = rows["Q4_K_M"], rows["IQ3_XS"]
    assert not q4["needs_imatrix"] and q4["n_drafted"] > 0 and q4["imatrix"]["n_drafted"] > 0
    assert q4["imatrix"]["tensor_bytes"] == q4["tensor_bytes"]  # Q4_K_M's mix has no has_imatrix rule
    # the imatrix-only type: only in the with column
    assert iq3["needs_imatrix"] and iq3["accept"] is None and iq3["n_drafted"] is None
    assert iq3["imatrix"]["n_drafted"] > 0 and 0 <= iq3["imatrix"]["accept"] < 1
    assert iq3["tensor_bytes"] == iq3["imatrix"]["tensor_bytes"] < q4["tensor_bytes"]
    # the with column is accept's own count of the file quantize --imatrix writes
    made = tmp_path / "iq3.gguf"
    assert run_cli("quantize", "-q", "--imatrix", files["imatrix"], files["f16"], made, "IQ3_XS").returncode == 0
    a = run_cli("accept", made, "--features", files["features"], "--json")
    got = json.loads(a.stdout)["files"][0]
    assert (got["n_drafted"], got["n_accept"]) == (iq3["imatrix"]["n_drafted"], iq3["imatrix"]["n_accept"])
    # two curves: the red and the blue front both drawn
    from matplotlib import image

    rgb = image.imread(png)[..., :3].reshape(-1, 3)
    for colour in [(0.84, 0.15, 0.16), (0.12, 0.47, 0.71)]:  # tab:red, tab:blue
        assert (np.abs(rgb - colour).max(axis=1) < 0.05).sum() > 30, colour
    # the text table: the second column, "needs imatrix" where the plain column cannot be
    rep = SweepReport(files["f16"], "f", 15, 32, 4, "cpu", imatrix="im.gguf")
    loop = LoopCount(n_drafted=10, n_accept=5, steps=2)
    rep.rows = [SweepRow("F16", 9, 8, 16, loop, baseline=True),
                SweepRow("IQ3_XS", 3, 2, 3.3, None, with_imatrix=SweepRow("IQ3_XS", 3, 2, 3.3, loop))]
    mark_pareto_both(rep)
    line = rep.render_text().splitlines()[-2]
    assert line.split()[0] == "IQ3_XS" and "needs imatrix" in line and "50.00%" in line.split("|")[1], line
    assert rep.rows[1].with_imatrix.pareto and rep.rows[0].pareto and not rep.rows[1].pareto


def test_ladder_takes_the_imatrix_only_types():
    """Data-driven: the IMATRIX_REQUIRED types the encoders write join the ladder, by bits per weight."""
    from dflash_convert.encoders import QUANTIZERS

    ladder = raise_ladder(QUANTIZERS)
    assert set(RAISE_LADDER) < set(ladder) and GGMLType.IQ3_XXS in ladder
    assert ladder.index(GGMLType.Q2_K) < ladder.index(GGMLType.IQ3_XXS) < ladder.index(GGMLType.Q3_K)
    assert raise_ladder() == RAISE_LADDER
    state = {"a": GGMLType.Q2_K, "b": GGMLType.Q2_K}
    up = raise_group(state, ["a", "b"], {"a": 256, "b": 256}, {"a": ladder})
    assert up == {"a": GGMLType.IQ3_XXS, "b": GGMLType.Q3_K}  # b has no imatrix entry: the plain ladder


def test_min_acceptance_with_imatrix_chooses_an_imatrix_only_type(files, tmp_path):
    """Q2_K_S needs the imatrix; a low goal keeps its mix: chosen, recorded, and llama-quantize --imatrix agrees."""
    out = tmp_path / "chosen.gguf"
    args = (files["f16"], out, "Q2_K_S", "--features", files["features"], "--min-acceptance", "0.05")
    r = run_cli("quantize", *args)
    assert r.returncode == 1 and "needs an importance matrix" in r.stderr and not out.exists()
    r = run_cli("quantize", *args, "--imatrix", files["imatrix"])
    assert r.returncode == 0, r.stderr
    md = read_gguf(out).metadata
    assert md[CHOSEN_KEYS["base_type"][0]].value == b"Q2_K_S" and md["quantize.imatrix.file"].value
    types = {t.name: t.ggml_type for t in read_gguf(out).tensors}
    assert types["blk.0.ffn_up.weight"] == GGMLType.Q2_K
    line = next(x for x in r.stdout.splitlines() if x.startswith("llama-quantize writes the same file with: "))
    cmd = shlex.split(line.split(": ", 1)[1])[1:]
    assert cmd[:2] == ["--imatrix", str(files["imatrix"])]
    pytest.importorskip("fixtures.upstream")
    from fixtures.upstream import llama_tool

    theirs = tmp_path / "theirs.gguf"
    cmd[-2] = str(theirs)
    q = subprocess.run([str(llama_tool("llama-quantize")), *cmd, "2"], capture_output=True, text=True)
    assert q.returncode == 0, q.stdout[-1500:] + q.stderr[-1500:]
    assert theirs.read_bytes() == out.read_bytes()


def test_imatrix_options_refused(files, tmp_path):
    """An imatrix of another model: the reader's one line, before any measuring; a missing file likewise."""
    other = tmp_path / "other.imatrix.gguf"
    write_gguf_imatrix(other, ImatrixFile(sums={"blk.0.attn_q.weight": np.ones(100, np.float32)},
                                          counts={"blk.0.attn_q.weight": 4}, datasets=["x"], chunk_count=1))
    feats = files["features"]
    for cmd in (["sweep", files["f16"], "--features", feats, "--types", "Q4_K_M", "--imatrix", other],
                ["quantize", files["f16"], tmp_path / "x.gguf", "Q4_K_M", "--features", feats, "--min-acceptance", "0.9",
                 "--imatrix", other]):
        r = run_cli(*cmd)
        assert r.returncode == 2, r.stderr
        assert r.stderr.count("\n") == 1 and str(other) in r.stderr and "has 100 values; the tensor needs 256" in r.stderr
        missing = [str(a) if a != other else str(tmp_path / "nope.gguf") for a in cmd]
        r = run_cli(*missing)
        assert r.returncode == 2 and "nope.gguf" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = run_cli("quantize", files["f16"], tmp_path / "x.gguf", "Q4_K_M", "--features", feats, "--min-acceptance", "0.9",
                "--include-weights", "attn")
    assert r.returncode != 0 and "--imatrix" in r.stderr
    assert not (tmp_path / "x.gguf").exists()
