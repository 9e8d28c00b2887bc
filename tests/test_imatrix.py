"""imatrix: a drafter's importance matrix, as llama-imatrix would collect it if it could run a drafter.

Four tiny drafters on the synthetic Gemma-4 target (916 tokens, hidden 64) cover the family: classic
DFlash, DFlash2 (conv projections, selector), DSpark (Markov and confidence heads, the target's head)
and a speculators DSpark with its own vocabulary (own head). Features are seeded random layer
inputs in capture's schema (no target model runs). Checked without llama.cpp: the row counts follow
the stated rules (every sequence's positions once through fc/attn_k/attn_v, each draft's block
through the block weights and heads), fc's sums are the features' own squares, the GGUF and the
``.dat`` hold what llama.cpp's writers would, and hostile inputs are one error line. In the runtime
tier the real ``llama-quantize --imatrix`` reads both forms and quantizes differently with them, and
the ground truth: a probe (fixtures/probes/imatrix_probe.cpp) drives llama.cpp's own drafter graph
through libllama over the same drafts with an eval callback collecting MUL_MAT inputs as imatrix.cpp
does; the names and the counts must be identical and each tensor's sums agree to 1e-4 (relative).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
from pathlib import Path

import cli_server
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from dflash_convert import convert
from dflash_convert.capture import LOOKAHEAD
from dflash_convert.format import imatrix as fmt
from dflash_convert.format.family import ATTN_CONV_PROJ, CONF_PROJ, FFN_CONV_PROJ, MARKOV_W2, SELECTOR_HIDDEN
from dflash_convert.format.features import FEATURE_DTYPES, SCHEMA
from dflash_convert.format.keys import key
from dflash_convert.format.rules import EMBEDDING_TENSOR, FC_TENSOR, OUTPUT_TENSOR
from dflash_convert.format.tensors import layer_name
from dflash_convert.imatrix import imatrix
from dflash_convert.runtime.imatrix import CHAINED, collect, draft_length
from dflash_convert.runtime.weights import load_weights
from dflash_convert.sources.features import config_sha256, read_features
from dflash_convert.sources.gguf import read_gguf
from dflash_convert.sources.gguf_drafter import read_drafter
from dflash_convert.sources.target import read_target
from fixtures.drafters import make_zlab_drafter
from fixtures.family import make_dflash2_drafter, make_dspark_drafter, make_speculators_dspark
from fixtures.targets import make_target_dir

G4 = dict(vocab_size=916, mask_token_id=4)  # the synthetic Gemma-4 target vocabulary
GEMMA4_EMBED = "model.language_model.embed_tokens.weight"
MEMBERS = {
    "dflash": lambda p: make_zlab_drafter(p, target_layer_ids=[0, 2], seed=1, **G4),
    "dflash2": lambda p: make_dflash2_drafter(p, dtype="f32", seed=1, block_size=16, **G4),
    "dspark": lambda p: make_dspark_drafter(p, target_layer_ids=[0, 2], markov_scale=0.3, **G4),
    "own_vocab": lambda p: make_speculators_dspark(p, dtype="f16", draft_vocab_size=512, aux_layer_ids=[1, 3],
                                                   block_size=16, markov_scale=0.3, **G4),
}
PROMPTS = [18, 5]  # prompt lengths of the two synthetic sequences
NEW_TOKENS = 3


def run_cli(*args: object) -> subprocess.CompletedProcess:
    return cli_server.run(*args, timeout=600)


def write_features(target: Path, out: Path, layers: list[int], seed: int = 9, prompts: list[int] = PROMPTS,
                   ends: list[int] | None = None) -> Path:
    """Capture's schema from seeded random layer inputs and tokens of the target's vocabulary; ``ends``: each
    sequence's length, its last token an end of generation (else what capture writes after each prompt)."""
    from dflash_convert.write_features import FeatureWriter

    cfg = json.loads((target / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    rng = np.random.default_rng(seed)
    lengths = ends or [p + NEW_TOKENS + LOOKAHEAD for p in prompts]
    eos = 2
    meta = {"schema": SCHEMA, "target": str(target.resolve()), "target_config_sha256": config_sha256(target),
            "target_architecture": cfg["architectures"][0], "layers": json.dumps(layers), "dtype": FEATURE_DTYPES["f32"],
            "prompts_sha256": "ab" * 32, "sequences": str(len(lengths)), "new_tokens": str(NEW_TOKENS),
            "eos_ids": json.dumps([eos] if ends else [])}
    w = FeatureWriter(out, lengths, len(layers), text["hidden_size"], FEATURE_DTYPES["f32"], meta)
    for i, (n, p) in enumerate(zip(lengths, prompts, strict=True)):
        tokens = rng.integers(5, text["vocab_size"], n)
        if ends:
            tokens[-1] = eos
        w.write(i, tokens, p, rng.standard_normal((len(layers), n, text["hidden_size"])).astype(np.float32))
    return w.commit()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(root, target, features of every layer input, get(member) -> F32 GGUF), drafters built as asked for."""
    root = tmp_path_factory.mktemp("imatrix")
    tgt = make_target_dir(root / "target", "gemma4")
    text = json.loads((tgt / "config.json").read_text())["text_config"]
    emb = torch.randn(text["vocab_size"], text["hidden_size"], generator=torch.Generator().manual_seed(7)) * 0.05
    save_file({GEMMA4_EMBED: emb.to(torch.bfloat16)}, str(tgt / "model.safetensors"))  # the shared embedding and tied head
    feats = write_features(tgt, root / "features.safetensors", list(range(text["num_hidden_layers"] + 1)))
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            built[name] = convert(MEMBERS[name](root / name), tgt, outfile=root / f"{name}-f32.gguf", outtype="f32").output
        return built[name]

    return root, tgt, feats, get


def _collect(world, name: str, gguf: Path | None = None, **kw):
    _, tgt, feats_path, get = world
    d = read_drafter(gguf or get(name))
    w = load_weights(d, read_target(tgt))
    feats = read_features(feats_path)
    slots = feats.check_drafter(d, name, draft_length(d, w))
    return d, w, feats, slots, collect(d, w, feats, slots, **kw)


# --- the counting rules, without llama.cpp ---------------------------------------------------------------


@pytest.mark.parametrize("every_anchor", [False, True])
def test_counts_follow_the_rules(world, every_anchor):
    d, w, feats, slots, stats = _collect(world, "dflash", every_anchor=every_anchor)
    B, drafts = d.block_size, sum(len(a) for a in stats.drafts)
    lengths = [s.length for s in feats.sequences]
    assert stats.lengths == lengths and B >= fmt.MIN_ROWS
    if every_anchor:  # every position of each continuation but the last
        assert stats.drafts == [list(range(s.prompt_length - 1, s.length - 1)) for s in feats.sequences]
    else:  # the live loop's anchors: first the prompt's last token
        assert [a[0] for a in stats.drafts] == [p - 1 for p in PROMPTS] and drafts < sum(lengths)
    assert stats.counts[FC_TENSOR] == sum(lengths)
    for il in range(d.n_layers):
        assert stats.counts[f"blk.{il}.attn_k.weight"] == sum(lengths) + B * drafts  # injection + blocks
        for role in ("attn_q", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
            assert stats.counts[f"blk.{il}.{role}.weight"] == B * drafts
    # the head is the target's: no entry (the drafter file has no such tensor for llama-quantize to weight)
    assert w.head_from == "target" and OUTPUT_TENSOR not in stats.sums and EMBEDDING_TENSOR not in stats.sums
    # fc's inputs are the features themselves: their squares, summed in float64, rounded once
    x = np.concatenate([np.concatenate([s.read_layer(k) for k in slots], -1) for s in feats.sequences]).astype(np.float64)
    np.testing.assert_array_equal(stats.sums[FC_TENSOR], (x * x).sum(0).astype(np.float32))


@pytest.mark.parametrize("name,extra,absent", [
    ("dflash2", [SELECTOR_HIDDEN, layer_name(0, ATTN_CONV_PROJ), layer_name(1, FFN_CONV_PROJ)], [OUTPUT_TENSOR]),
    ("dspark", [MARKOV_W2, CONF_PROJ], [OUTPUT_TENSOR]),
    ("own_vocab", [MARKOV_W2, OUTPUT_TENSOR], []),
])
def test_each_member_weights_its_own_matrices(world, name, extra, absent):
    d, w, _, _, stats = _collect(world, name)
    assert set(extra) <= set(stats.sums) and not set(absent) & set(stats.sums)
    drafts = sum(len(a) for a in stats.drafts)
    for n in set(CHAINED) & set(stats.sums):  # one row per chained slot of each block, whatever the count
        assert stats.counts[n] == (d.block_size - w.markov.first_slot) * drafts
    for n, s in stats.sums.items():
        assert s.dtype == np.float32 and np.isfinite(s).all() and (s > 0).any(), n


def test_gguf_and_dat_hold_what_llama_imatrix_writes(world, tmp_path):
    root, _, feats, get = world
    out = tmp_path / "d.imatrix.gguf"
    r = run_cli("imatrix", get("dflash"), "--features", feats, "-o", out, "--device", "cpu", "-q")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"wrote {out} (gguf, ") and "prompts-sha256:" + "ab" * 32 in r.stdout
    g = read_gguf(out)
    assert g.get(key("type")) == fmt.GENERAL_TYPE
    assert g.get(fmt.DATASETS) == ["prompts-sha256:" + "ab" * 32]
    assert g.get(fmt.CHUNK_COUNT) == len(PROMPTS) and g.get(fmt.CHUNK_SIZE) == max(PROMPTS) + NEW_TOKENS + LOOKAHEAD
    *_, stats = _collect(world, "dflash")
    names = [t.name for t in g.tensors]
    assert names == [n + s for n in sorted(stats.sums) for s in (fmt.IN_SUM2_SUFFIX, fmt.COUNTS_SUFFIX)]
    by = {t.name: t for t in g.tensors}
    for n, s in stats.sums.items():
        t, c = by[n + fmt.IN_SUM2_SUFFIX], by[n + fmt.COUNTS_SUFFIX]
        assert t.ne == (s.shape[0], 1) and c.ne == (1, 1)
        np.testing.assert_array_equal(g.tensor_bytes(t).view("<f4"), s)
        assert g.tensor_bytes(c).view("<f4").tolist() == [stats.counts[n]]
    dat = tmp_path / "d.imatrix.dat"
    r = run_cli("imatrix", get("dflash"), "--features", feats, "-o", dat, "--output-format", "dat", "--device", "cpu", "-q")
    assert r.returncode == 0, r.stderr
    raw, chunk = dat.read_bytes(), max(PROMPTS) + NEW_TOKENS + LOOKAHEAD
    (n,), off = struct.unpack_from("<i", raw), 4
    assert n == len(stats.sums)
    for name in sorted(stats.sums):
        (ln,) = struct.unpack_from("<i", raw, off)
        assert raw[off + 4:off + 4 + ln].decode() == name
        ncall, nval = struct.unpack_from("<ii", raw, off + 4 + ln)
        vals = np.frombuffer(raw, "<f4", nval, off + 12 + ln)
        assert ncall == -(-stats.counts[name] // chunk)  # ceiling: never 0
        np.testing.assert_array_equal(vals, stats.sums[name] / np.float32(stats.counts[name]) * np.float32(ncall))
        off += 12 + ln + 4 * nval
    (chunks, ln), = [struct.unpack_from("<ii", raw, off)]
    assert chunks == len(PROMPTS) and raw[off + 8:] == ("prompts-sha256:" + "ab" * 32).encode() and len(raw) == off + 8 + ln


# --- hostile inputs: one line each, no output ------------------------------------------------------------


def _one_line(r, code: int, *parts: str) -> None:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == code and len(lines) == 1 and lines[0].startswith("dflash-convert: error: "), r.stderr
    assert all(p in lines[0] for p in parts), lines[0]


def test_hostile_inputs_are_one_line(world, tmp_path):
    root, tgt, feats, get = world
    draft = get("dflash")
    before = {p: p.read_bytes() for p in (draft, feats)}
    for victim in (draft, feats):  # the output is an input: refused before anything runs
        _one_line(run_cli("imatrix", draft, "--features", feats, "-o", victim, "--force"), 1, "overwrite an input file")
    assert {p: p.read_bytes() for p in before} == before
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    _one_line(run_cli("imatrix", draft, "--features", feats, "-o", fifo, "--force"), 1, "only a regular file is replaced")
    mine = tmp_path / "mine.gguf"
    mine.write_bytes(b"mine")
    _one_line(run_cli("imatrix", draft, "--features", feats, "-o", mine), 1, "output exists; pass --force")
    assert mine.read_bytes() == b"mine"
    # features of another drafter: capture --for stored only the layers that drafter taps
    other = write_features(tgt, tmp_path / "other.safetensors", [2, 4])
    out = tmp_path / "x.gguf"
    _one_line(run_cli("imatrix", draft, "--features", other, "-o", out), 2, str(other), "taps target layer 1")
    # features of another target: wider than the drafter
    wide = make_target_dir(tmp_path / "wide", "qwen3")
    wide_feats = write_features(wide, tmp_path / "wide.safetensors", [1, 3])
    _one_line(run_cli("imatrix", draft, "--features", wide_feats, "-o", out, "--allow-other-target"), 2,
              "features of another target")
    _one_line(run_cli("imatrix", feats, "--features", feats, "-o", out), 2, str(feats))  # not a GGUF
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.endswith(".dflash-partial")]


def test_a_block_under_16_rows_weights_only_the_injections(world, tmp_path):
    root, tgt, _, _ = world
    small = convert(make_dflash2_drafter(tmp_path / "b8", dtype="f32", seed=2, block_size=8, **G4), tgt,
                    outfile=tmp_path / "b8.gguf", outtype="f32").output
    res = imatrix(small, write_features(tgt, tmp_path / "f.safetensors", [1, 3]), tmp_path / "b8.imatrix.gguf",
                  device="cpu", progress=False)
    assert res.entries == {n: sum(p + NEW_TOKENS + LOOKAHEAD for p in PROMPTS) for n in
                           (FC_TENSOR, "blk.0.attn_k.weight", "blk.0.attn_v.weight", "blk.1.attn_k.weight", "blk.1.attn_v.weight")}
    # and sequences shorter than 16 positions as well: nothing to write, one line
    short = write_features(tgt, tmp_path / "s.safetensors", [1, 3], prompts=[3, 4], ends=[9, 12])
    _one_line(run_cli("imatrix", small, "--features", short, "-o", tmp_path / "s.gguf"), 1,
              "no weight saw enough rows for an importance matrix")
    assert not (tmp_path / "s.gguf").exists()


# --- runtime tier: llama-quantize reads it, llama.cpp's own graph agrees ----------------------------------


def _quantize(src: Path, out: Path, qtype: str, imatrix_file: Path | None = None) -> str:
    from fixtures.upstream import llama_tool

    args = [str(llama_tool("llama-quantize"))] + (["--imatrix", str(imatrix_file)] if imatrix_file else [])
    r = subprocess.run([*args, str(src), str(out), qtype, "2"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout + r.stderr


@pytest.mark.runtime
@pytest.mark.parametrize("form", ["gguf", "dat"])
def test_llama_quantize_reads_the_file_and_quantizes_with_it(world, tmp_path, form):
    _, _, feats, get = world
    src = get("dflash")
    im = imatrix(src, feats, tmp_path / f"d.imatrix.{form}", output_format=form, device="cpu", progress=False)
    log = _quantize(src, tmp_path / "with.gguf", "Q4_0", im.output)
    assert f"loaded {len(im.entries)} importance matrix entries from {im.output} computed on {len(PROMPTS)} chunks" in log
    assert "did not find weights" not in log
    _quantize(src, tmp_path / "without.gguf", "Q4_0")
    a, b = read_gguf(tmp_path / "with.gguf"), read_gguf(tmp_path / "without.gguf")
    assert a.get(fmt.QUANTIZE_ENTRIES) == len(im.entries) and b.get(fmt.QUANTIZE_ENTRIES) is None
    tb = {t.name: t for t in b.tensors}
    # the same type both ways (Q4_0's has_imatrix rule moves only ffn_down), different blocks: the weights chose them
    same = [t for t in a.tensors if t.name in im.entries and t.ggml_type == tb[t.name].ggml_type]
    assert same and all(not np.array_equal(a.tensor_bytes(t), b.tensor_bytes(tb[t.name])) for t in same)


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    """fixtures/probes/imatrix_probe.cpp, compiled against the cached llama.cpp build (built first when absent)."""
    from fixtures.libllama_probe import compile_probe

    return compile_probe("imatrix_probe", tmp_path_factory.mktemp("imatrix-probe"))


def _self_contained(world, name: str, qtype: str | None = None) -> Path:
    """The member's GGUF (quantized to ``qtype``) with the target's embedding written in (the probe has no target
    context; the tied head is then token_embd, as llama.cpp's loader falls back)."""
    from drafter_gguf import Tensor, read_parts, set_tensor, write_parts

    from dflash_convert.format.ggml import GGMLType
    from dflash_convert.quantize import quantize

    root, tgt, _, get = world
    path = get(name)
    if qtype is not None:
        path = root / f"{name}-{qtype}.gguf"
        if not path.exists():
            quantize(get(name), path, qtype)
    d = read_drafter(path)
    w = load_weights(d, read_target(tgt))
    if w.embed_from == "drafter":
        return path
    v = w.embed.full().to(torch.float32).numpy()
    parts = set_tensor(read_parts(path), Tensor(EMBEDDING_TENSOR, (v.shape[1], v.shape[0]), GGMLType.F32, v.astype("<f4").tobytes()))
    return write_parts(root / f"{path.stem}-self-contained.gguf", parts)


def llama_cpp_imatrix(exe: Path, gguf: Path, d, feats, slots: list[int], drafts: list[list[int]], work: Path
                      ) -> dict[str, tuple[np.ndarray, int]]:
    """The probe's sums and rows per weight over ``drafts`` (anchors per sequence) of ``feats``."""
    B = d.block_size
    parts = [np.array([len(drafts), len(slots) * d.hidden_size, B], "<i4").tobytes()]
    for seq, anchors in zip(feats.sequences, drafts, strict=True):
        f = np.concatenate([seq.read_layer(s) for s in slots], axis=-1).astype("<f4")
        tokens, _ = seq.read_tokens()
        parts.append(np.array([f.shape[0], len(anchors)], "<i4").tobytes() + f.tobytes())
        for c in anchors:
            ids = np.full(B, d.mask_token_id, "<i4")
            ids[0] = tokens[c]
            parts.append(np.array([c], "<i4").tobytes() + ids.tobytes())
    io = work / f"{gguf.stem}-io.bin"
    io.write_bytes(b"".join(parts))
    r = subprocess.run([str(exe), str(gguf), str(io), *CHAINED], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"probe failed ({r.returncode}): {r.stderr[-2000:]}"
    raw, out = io.read_bytes(), {}
    (n,), off = struct.unpack_from("<i", raw), 4
    for _ in range(n):
        (ln,) = struct.unpack_from("<i", raw, off)
        name = raw[off + 4:off + 4 + ln].decode()
        n_in, rows = struct.unpack_from("<iq", raw, off + 4 + ln)
        out[name] = (np.frombuffer(raw, "<f4", n_in, off + 16 + ln).copy(), rows)
        off += 16 + ln + 4 * n_in
    return out


# relative difference of a tensor's sums allowed: float32 error for float files; a quantized file's activations
# are rounded to Q8 blocks before each matmul, where a float32 difference upstream can move a value across a
# rounding step (measured: 2.6e-4 here; up to 1e-3 on other drafts, in the last layer's ffn_down)
SUM_TOL = {None: 1e-4, "Q4_0": 3e-3}


@pytest.mark.runtime
@pytest.mark.slow
@pytest.mark.parametrize("name,qtype", [(m, None) for m in MEMBERS] + [("dflash", "Q4_0")])
def test_sums_and_counts_equal_llama_cpps_graph(world, probe, name, qtype, tmp_path, record_property):
    """Over the live loop's drafts (every anchor for classic DFlash), libllama's MUL_MAT inputs give the same
    entries and counts, and sums within float32 summation error (our activations are the runner's)."""
    gguf = _self_contained(world, name, qtype)
    d, w, feats, slots, stats = _collect(world, name, gguf, every_anchor=name == "dflash")
    theirs = llama_cpp_imatrix(probe, gguf, d, feats, slots, stats.drafts, tmp_path)
    assert sorted(theirs) == sorted(stats.sums)
    worst = 0.0
    for n, (s, rows) in theirs.items():
        assert stats.counts[n] == rows, n
        ours, ref = stats.sums[n].astype(np.float64), s.astype(np.float64)
        rel = float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))
        assert rel < SUM_TOL[qtype], (n, rel)
        worst = max(worst, rel)
    record_property("imatrix_worst_relative", f"{name} {qtype or 'F32'}: {worst:.2e} over {len(theirs)} tensors")
