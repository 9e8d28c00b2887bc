"""choose_quant_types against the real llama-quantize (0c1e57098), type by type, tensor by tensor.

The runtime tests quantize a few small dflash drafters with the built ``llama-quantize`` to every
file type we offer and compare, for every tensor, the ggml type it wrote with ours; also the
general.file_type it sets, the metadata it adds or moves, the order it writes the tensors in and
the fallback count it prints. The unit tests pin the tables on hand-made tensor lists.
"""

from __future__ import annotations

import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from drafter_gguf import Parts, drafter_parts, set_tensor, tensor, write_parts

from dflash_convert.format.ggml import GGMLType
from dflash_convert.format.keys import key
from dflash_convert.format.quant_types import (
    FTYPES,
    KEEP,
    NoFallback,
    choose_quant_types,
    fallback_count,
    is_quantizable,
    loader_order,
    resolve_ftype,
)
from dflash_convert.sources.gguf import read_gguf

TYPES = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M",
         "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS", "F32",
         "IQ3_XXS", "IQ3_XS", "IQ3_S", "IQ3_M", "Q2_K_S", "TQ1_0", "TQ2_0", "Q1_0", "Q2_0"]
# run with an importance matrix (a legacy .dat of ones): llama-quantize refuses these on 256-wide rows without one
WITH_IMATRIX = ("IQ3_XXS", "IQ3_XS", "Q2_K_S")

FALLBACK_LINE = re.compile(r"WARNING: (\d+) of (\d+) tensor\(s\) required fallback quantization")


# --- input drafters ---------------------------------------------------------------------------

def _big() -> Parts:
    """Rows all multiples of 256; 8 layers (Q4_K_M/Q5_K_M raise layers 0, 3, 6, 7); GQA 4; untied
    output and token_embd (F32, a 2-D float source), a d2t I64 table, and a (256, 1) weight that
    ggml counts as 1-D."""
    parts = drafter_parts(layers=8, E=256, F=512, H=4, KV_=1, D=64)
    for t in (tensor("token_embd.weight", (256, 5), GGMLType.F32, seed=3), tensor("output.weight", (256, 5), GGMLType.F16, seed=4),
              tensor("d2t", (5,), GGMLType.I64), tensor("dspark_conf_proj.weight", (256, 1), GGMLType.F32, seed=5)):
        parts = set_tensor(parts, t)
    return parts


def _tied() -> Parts:
    """5 layers (the mix pattern is 2, 4), GQA 2, token_embd and no output.weight (tied)."""
    return set_tensor(drafter_parts(layers=5, E=256, F=512, H=4, KV_=2, D=64), tensor("token_embd.weight", (256, 5), GGMLType.F16, seed=3))


def _small() -> Parts:
    """E=96, F=160: K-quants fall back to legacy types; attn_output rows are 48 long (not a multiple
    of 32: F16 last resort); output.weight rows 96; BF16 matrices; no token_embd."""
    parts = drafter_parts(layers=3, E=96, F=160, H=3, KV_=1, D=16, matrix=GGMLType.BF16)
    return set_tensor(parts, tensor("output.weight", (96, 5), GGMLType.BF16, seed=4))


DRAFTERS = {"big": _big, "tied": _tied, "small": _small}


@dataclass
class Run:
    src: Path
    out: Path
    rc: int
    log: str


def _quantize(exe: Path, src: Path, out: Path, ftype: str) -> Run:
    imatrix = []
    if ftype in WITH_IMATRIX:
        from test_quantize_iq3 import write_legacy_imatrix

        dat = out.with_suffix(".imatrix.dat")
        write_legacy_imatrix(dat, {t.name: np.ones(t.ne[0], np.float32) for t in read_gguf(src).tensors if is_quantizable(t.name, t.ne)})
        imatrix = ["--imatrix", str(dat)]
    r = subprocess.run([str(exe), *imatrix, str(src), str(out), ftype, "1"], capture_output=True, text=True)
    return Run(src, out, r.returncode, r.stdout + r.stderr)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[tuple[str, str], Run]:
    """Every drafter quantized to every type, two at a time (the tool itself runs one thread)."""
    from fixtures.upstream import llama_tool

    exe = llama_tool("llama-quantize")
    root = tmp_path_factory.mktemp("quant-types")
    srcs = {name: write_parts(root / f"{name}.gguf", make()) for name, make in DRAFTERS.items()}
    jobs = [(d, t) for d in DRAFTERS for t in TYPES]
    with ThreadPoolExecutor(2) as pool:
        done = pool.map(lambda job: _quantize(exe, srcs[job[0]], root / f"{job[0]}-{job[1]}.gguf", job[1]), jobs)
        return dict(zip(jobs, done, strict=True))


def _ours(src: Path, ftype: str) -> tuple[int, list[tuple[str, str]], list[str]]:
    g = read_gguf(src)
    tensors = [(t.name, t.ne) for t in g.tensors]
    file_type, choices = choose_quant_types(tensors, ftype, input_types=[t.ggml_type.name for t in g.tensors],
                                            n_layer=g.get(key("block_count")), n_head=g.get(key("head_count")),
                                            n_head_kv=g.get(key("head_count_kv")), has_imatrix=ftype in WITH_IMATRIX)
    return file_type, choices, [t.name for t in g.tensors]


@pytest.mark.runtime
@pytest.mark.parametrize("drafter", list(DRAFTERS))
@pytest.mark.parametrize("ftype", TYPES)
def test_types_match_llama_quantize(runs, drafter: str, ftype: str) -> None:
    run = runs[(drafter, ftype)]
    try:
        file_type, choices, names = _ours(run.src, ftype)
    except NoFallback:  # Q1_0 on rows that are not a multiple of 128: refused by both
        assert run.rc != 0 and "no tensor type fallback is defined" in run.log, run.log[-2000:]
        return
    assert run.rc == 0, run.log[-2000:]
    got = read_gguf(run.out)
    theirs = {t.name: t.ggml_type.name for t in got.tensors}
    ours = {n: c[0] for n, c in zip(names, choices, strict=True)}
    diff = {n: (ours[n], theirs.get(n), choices[i][1]) for i, n in enumerate(names) if ours[n] != theirs.get(n)}
    assert not diff, f"{drafter} {ftype}: (ours, llama-quantize, our note): {diff}"
    # general.file_type is the LLAMA_FTYPE value, as UINT32, and these two keys move to the end
    assert got.get(key("file_type")) == file_type == FTYPES[ftype][0]
    kept = [k for k in got.metadata if not k.startswith("quantize.imatrix.")]  # the imatrix's keys: tests/test_quantize_imatrix*
    assert kept[-2:] == [key("quantization_version"), key("file_type")]
    assert got.metadata[key("file_type")].vtype.name == "UINT32"
    # every other key is copied unchanged, in order
    src = read_gguf(run.src)
    moved = {key("quantization_version"), key("file_type")}
    assert [(k, v) for k, v in src.metadata.items() if k not in moved] == [(k, got.metadata[k]) for k in kept if k not in moved]
    # the tensors come out in the loader's order
    assert [t.name for t in got.tensors] == [names[i] for i in loader_order(names)]
    # the fallback count it prints
    m = FALLBACK_LINE.search(run.log)
    assert (int(m.group(1)) if m else 0) == fallback_count(choices), run.log[-3000:]
    if m:
        assert int(m.group(2)) == len(names)


@pytest.mark.runtime
def test_the_runs_cover_the_interesting_cases(runs) -> None:
    """Guard against drafters that silently stop exercising the rules this file is about."""
    notes = {(d, t): _ours(run.src, t)[1] for (d, t), run in runs.items() if (d, t) != ("small", "Q1_0")}
    assert any("more_bits" in n for _, n in notes[("big", "Q4_K_M")])
    assert any("gqa>=4" in n for _, n in notes[("big", "Q2_K")])
    assert any(ty == "Q3_K" and "attn_v" in n for ty, n in notes[("tied", "Q2_K")])  # GQA 2: no Q4_K
    assert any("tied" in n for _, n in notes[("tied", "Q4_K_M")])
    assert fallback_count(notes[("small", "Q4_K_M")]) > 0
    assert any(ty == "F16" and n.startswith("fallback") for ty, n in notes[("small", "Q4_0")])
    # the IQ3 / low-bit rules: GQA 4, 8 layers, an untied token_embd and output (IQ3_XXS: with an imatrix)
    assert any("n/8<=i<7n/8" in n for _, n in notes[("big", "IQ3_XS")])
    assert any("gqa>=4" in n for _, n in notes[("big", "IQ3_S")])
    assert {ty for ty, n in notes[("big", "IQ3_XXS")] if "attn_q" in n or "attn_k" in n} == {"IQ2_S"}
    assert ("Q5_K", "output") in notes[("big", "IQ3_XXS")] and any(ty == "IQ3_S" and "token_embd" in n for ty, n in notes[("big", "IQ3_XXS")])
    assert any(ty == "Q4_K" and "token_embd" in n for ty, n in notes[("big", "TQ1_0")])


@pytest.mark.runtime
def test_already_quantized_tensors(tmp_path) -> None:
    """Q8_0 matrices: kept as they are for a Q8_0 file; any other quantized target is refused
    (llama-quantize needs --allow-requantize), and so do we."""
    from fixtures.upstream import llama_tool

    exe = llama_tool("llama-quantize")
    src = write_parts(tmp_path / "q8.gguf", drafter_parts(layers=2, E=64, F=128, H=2, KV_=1, D=32, matrix=GGMLType.Q8_0))
    ok = _quantize(exe, src, tmp_path / "q8-q8.gguf", "Q8_0")
    assert ok.rc == 0, ok.log[-2000:]
    _, choices, names = _ours(src, "Q8_0")
    assert [t.ggml_type.name for t in read_gguf(ok.out).tensors] == [choices[i][0] for i in loader_order(names)]
    bad = _quantize(exe, src, tmp_path / "q8-q4.gguf", "Q4_0")
    assert bad.rc != 0 and "requantizing from type q8_0 is disabled" in bad.log
    with pytest.raises(ValueError, match="requantize"):
        _ours(src, "Q4_0")


# --- unit tests of the tables (fast tier) -------------------------------------------------------

def _layered(n: int, E: int = 256, F: int = 512, *, output: bool = True) -> list[tuple[str, tuple[int, ...]]]:
    ts: list[tuple[str, tuple[int, ...]]] = [("fc.weight", (2 * E, E)), ("output_norm.weight", (E,)), ("d2t", (5,))]
    if output:
        ts.append(("output.weight", (E, 5)))
    for i in range(n):
        ts += [(f"blk.{i}.attn_norm.weight", (E,)), (f"blk.{i}.attn_q.weight", (E, 256)), (f"blk.{i}.attn_k.weight", (E, 64)),
               (f"blk.{i}.attn_v.weight", (E, 64)), (f"blk.{i}.attn_output.weight", (256, E)),
               (f"blk.{i}.ffn_down.weight", (F, E)), (f"blk.{i}.ffn_up.weight", (E, F))]
    return ts


def _types(ts: list[tuple[str, tuple[int, ...]]], ftype: str, **kw) -> dict[str, str]:
    return {n: c[0] for (n, _), c in zip(ts, choose_quant_types(ts, ftype, **kw)[1], strict=True)}


def test_q4_k_m_layer_pattern() -> None:
    ts = _layered(8)
    got = _types(ts, "q4_k")  # an alias, lower case: as llama-quantize reads it
    raised = {i for i in range(8) if got[f"blk.{i}.attn_v.weight"] == "Q6_K"}
    assert raised == {i for i in range(8) if got[f"blk.{i}.ffn_down.weight"] == "Q6_K"} == {0, 3, 6, 7}
    assert got["output.weight"] == "Q6_K" and got["fc.weight"] == got["blk.1.attn_q.weight"] == "Q4_K"
    assert got["output_norm.weight"] == got["d2t"] == KEEP


def test_file_types_and_float_targets() -> None:
    assert {t: FTYPES[resolve_ftype(t)][0] for t in ("F16", "Q8_0", "Q4_K_M", "q5_k", "Q3_K", "IQ4_XS", "BF16")} == {
        "F16": 1, "Q8_0": 7, "Q4_K_M": 15, "q5_k": 17, "Q3_K": 12, "IQ4_XS": 30, "BF16": 32}
    ts = _layered(2, E=96, F=160)  # F16/BF16 targets: no mixes and no fallback, whatever the rows
    assert set(_types(ts, "BF16").values()) == {"BF16", KEEP}
    with pytest.raises(ValueError, match="unknown quantization type"):
        resolve_ftype("Q4_K_XL")


def test_fallbacks_and_output() -> None:
    ts = _layered(2, E=96, F=160) + [("blk.1.attn_extra.weight", (48, 96))]
    ft, choices = choose_quant_types(ts, "Q4_K_M")
    got = {n: c[0] for (n, _), c in zip(ts, choices, strict=True)}
    assert ft == 15
    assert got["blk.0.attn_q.weight"] == "Q5_0"  # Q4_K -> Q5_0
    assert got["blk.0.ffn_down.weight"] == "Q5_0"  # Q4_K -> Q5_0
    assert got["blk.1.ffn_down.weight"] == "Q8_0"  # raised to Q6_K (last layer of 2) -> Q8_0
    assert got["blk.1.attn_extra.weight"] == "F16"  # 48 is not a multiple of 32 either
    assert got["output.weight"] == "Q8_0"  # 96 does not fill Q4_K blocks: Q8_0, not a fallback
    assert fallback_count(choices) == sum(ne[0] % 256 != 0 for n, ne in ts if len(ne) == 2 and n.endswith("weight") and n != "output.weight")
    q40 = _types(ts, "Q4_0")
    assert q40["output.weight"] == "Q8_0" and q40["blk.1.attn_extra.weight"] == "F16"


def test_tied_embeddings_and_gqa() -> None:
    ts = [*_layered(3, output=False), ("token_embd.weight", (256, 5))]
    assert _types(ts, "Q5_K_S")["token_embd.weight"] == "Q6_K"  # tied: treated as the output
    assert _types([*_layered(3), ("token_embd.weight", (256, 5))], "Q5_K_S")["token_embd.weight"] == "Q5_K"
    assert _types(ts, "Q2_K")["blk.0.attn_v.weight"] == "Q4_K"  # 256/64 rows: GQA 4, inferred
    assert _types(ts, "Q2_K", n_head=4, n_head_kv=2)["blk.0.attn_v.weight"] == "Q3_K"


def test_loader_order_sorts_layers_numerically() -> None:
    names = ["blk.10.a.weight", "blk.2.b.weight", "fc.weight", "blk.2.a.weight", "d2t"]
    assert [names[i] for i in loader_order(names)] == ["d2t", "fc.weight", "blk.2.a.weight", "blk.2.b.weight", "blk.10.a.weight"]


def test_which_tensors_are_quantized() -> None:
    assert is_quantizable("blk.0.attn_q.weight", (256, 256))
    assert not is_quantizable("blk.0.attn_q_norm.weight", (64, 4))  # norms never, even 2-D
    assert not is_quantizable("dspark_conf_proj.weight", (256, 1))  # trailing 1: ggml counts 1 dim
    assert not is_quantizable("fc.abc", (64, 4))  # must end in "weight"
    assert is_quantizable("fc.ab", (64, 4))  # llama.cpp's size_t wrap: a 5-character name passes (checked against the tool)
