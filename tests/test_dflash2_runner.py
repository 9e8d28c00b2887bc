"""DFlash2 drafters in the runner, the checkpoint reference and ``check`` (issue #18, the DFlash2 half).

What is proved, on a tiny DFlash2 drafter (2 layers, hidden 64, the synthetic Gemma-4 vocabulary of
916 tokens, top-k 4, kernel 2, group 16, Muse-Glimmer's logit transforms) converted at F32:

* the GGUF runner (runtime/forward.py + runtime/dflash2.py) and the checkpoint reference
  (runtime/reference.py + runtime/dflash2_reference.py, HF names, float64) draft the same tokens,
  the walk over the selector lattice, with the same candidates and lattice scores to float32
  rounding; the walk is not the argmax of the logits (the driver never reads them raw);
* the batched drafts of the acceptance measurement (runtime/accept.py) are the single drafts;
* libllama itself (a probe reading the lattice from h_nextn and walking it as common/speculative.cpp does, in
  C++) gives, at F32 and Q8_0 over 8 drafts, the same candidates, lattice and walked tokens (runtime tier; the
  llama.cpp build is made when absent, skipped only without g++/cmake);
* ``check`` passes the F32 file with every drafted token equal, F16/BF16/Q8_0/Q4_K_M/Q2_K files
  within their class, writes the lattice arrays with ``save_io``; a swapped pair of conv base
  kernels, a transposed codebook, a wrong selector_top_k and a wrong conv_kernel_size that still
  loads each fail with a line naming the cause; with a features file the acceptance loop drafts by the
  walk on both sides (the F32 file accepts what the checkpoint accepts, swapped conv kernels lose it).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from drafter_gguf import Tensor, get_tensor, kv, read_parts, set_key, set_tensor, swap_tensors, write_parts
from safetensors.torch import save_file

from dflash_convert import convert
from dflash_convert.check import check
from dflash_convert.format.family import ATTN_CONV_BASE, FFN_CONV_BASE, SELECTOR_PREV
from dflash_convert.format.features import SCHEMA as FEATURES_SCHEMA
from dflash_convert.format.ggml import GGMLType
from dflash_convert.format.rules import EMBEDDING_TENSOR
from dflash_convert.format.tensors import layer_name
from dflash_convert.quantize import quantize
from dflash_convert.runtime.accept import anchor_drafts
from dflash_convert.runtime.check_io import synthetic_inputs
from dflash_convert.runtime.compare import selector_agreement
from dflash_convert.runtime.dflash2 import CANDIDATES, CHOSEN, LATTICE, dynamic_conv, top_k_descending
from dflash_convert.runtime.forward import ForwardResult, block_tokens, contiguous_positions, run_gguf
from dflash_convert.runtime.reference import load_reference, reference_forward
from dflash_convert.runtime.weights import load_weights
from dflash_convert.sources.checkpoint import read_checkpoint
from dflash_convert.sources.gguf_drafter import read_drafter
from dflash_convert.sources.target import read_target_dir
from dflash_convert.write_features import FeatureWriter
from fixtures.drafters import edit_config
from fixtures.family import make_dflash2_drafter
from fixtures.targets import make_target_dir

CTX = 7
G4 = dict(vocab_size=916, mask_token_id=4)  # the synthetic Gemma-4 target vocabulary
TOP_K = 4  # the fixture's selector_top_k
GEMMA4_EMBED = "model.language_model.embed_tokens.weight"


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> tuple[Path, Path, Path, Path]:
    """(work folder, DFlash2 checkpoint, target directory with an embedding, F32 GGUF)."""
    root = tmp_path_factory.mktemp("dflash2-runner")
    tgt = make_target_dir(root / "gemma4", "gemma4")
    cfg = json.loads((tgt / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    g = torch.Generator().manual_seed(7)
    save_file({GEMMA4_EMBED: torch.randn(text["vocab_size"], text["hidden_size"], generator=g) * 0.05},
              str(tgt / "model.safetensors"))
    src = make_dflash2_drafter(root / "d2", dtype="f32", seed=1, **G4)
    out = convert(src, tgt, outfile=root / "d2-f32.gguf", outtype="f32").output
    return root, src, tgt, out


def _sides(world, gguf: Path | None = None):
    root, src, tgt, f32 = world
    target = read_target_dir(tgt)
    d = read_drafter(gguf or f32)
    return d, load_weights(d, target), load_reference(read_checkpoint(src), target)


# --- the runner against the reference ---------------------------------------------------------------


def test_runner_and_reference_draft_the_same_tokens(world):
    d, w, model = _sides(world)
    walked_differs = False
    for seed in range(4):
        feats, ids, pos = synthetic_inputs(d, CTX, seed)
        got = run_gguf(d, w, feats, ids, pos)
        want = reference_forward(model, feats.double(), ids, pos)
        assert torch.equal(got.tokens, want.tokens), seed
        assert torch.equal(got.extras[CANDIDATES], want.extras[CANDIDATES]), seed
        assert torch.equal(got.extras[CHOSEN], want.extras[CHOSEN]), seed
        assert float((got.extras[LATTICE].double() - want.extras[LATTICE]).abs().max()) < 1e-5
        assert float((got.hidden.double() - want.hidden).abs().max()) < 1e-5
        assert got.extras[LATTICE].shape == (d.block_size - 1, TOP_K, TOP_K)
        # the drafted token is the chosen candidate, and its walked score the row's maximum
        assert torch.equal(got.tokens, got.extras[CANDIDATES].gather(1, got.extras[CHOSEN][:, None])[:, 0])
        assert torch.equal(got.choice_logits().argmax(-1), got.tokens)
        walked_differs |= not torch.equal(got.tokens, got.logits.argmax(-1))
    assert walked_differs, "the lattice walk never departed from the argmax: the selector is not exercised"


def test_logit_transforms_are_applied_in_both_semantics(world):
    """llama.cpp applies logit_scale and the softcap to DFlash2's logits, so the two semantics agree here."""
    d, w, model = _sides(world)
    assert d.logit_scale and d.final_logit_softcapping == 20.0
    feats, ids, pos = synthetic_inputs(d, CTX, 0)
    got = run_gguf(d, w, feats, ids, pos)
    assert float(got.logits.abs().max()) < d.final_logit_softcapping  # capped
    trained = reference_forward(model, feats.double(), ids, pos, semantics="reference")
    assert torch.equal(trained.tokens, got.tokens)
    assert float((trained.logits - reference_forward(model, feats.double(), ids, pos).logits).abs().max()) == 0.0


def test_dynamic_conv_by_hand():
    """K = 2, two groups of 2 channels, blocks of 3: out[t] = w0[t] x[t] + w1[t] x[t-1], nothing across blocks."""
    x = torch.arange(1.0, 25.0).reshape(6, 4)  # two blocks of 3 tokens, E = 4
    coeffs = torch.zeros(6, 2 * 2 * 2)
    coeffs[:, 2:4] = torch.tensor([0.5, -1.0])  # side 0, tap 1: group 0 -> 0.5, group 1 -> -1
    base = torch.zeros(2, 2, 4)
    base[0, 0] = 1.0  # side 0, tap 0: identity
    out = dynamic_conv(x, coeffs, base, 0, 3, 2)
    prev = torch.cat([torch.zeros(1, 4), x[:2], torch.zeros(1, 4), x[3:5]])  # the token before, zero at a block start
    want = x + prev * torch.tensor([0.5, 0.5, -1.0, -1.0])
    assert torch.equal(out, want)


@pytest.mark.parametrize("rows", ["distinct", "ties", "boundary-tie", "all-equal", "nan"])
def test_top_k_is_the_stable_sort_prefix(rows):
    """The selector's top-k (topk, not a full-vocabulary sort) gives what ggml_top_k's stable
    descending sort gives, ties by ascending index, also where topk alone could keep another tied id."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 5, 3000, generator=g)
    if rows == "ties":
        logits = (logits * 2).round() / 2  # a handful of distinct values: ties inside and at the k-th
    elif rows == "boundary-tie":
        top = torch.topk(logits, TOP_K, dim=-1).values
        logits[..., 2900:] = top[..., -1:]  # the k-th value recurs at larger ids than the one that holds it
    elif rows == "all-equal":
        logits = torch.zeros(2, 5, 3000)
    elif rows == "nan":
        logits[0, 1, 77] = float("nan")
    want = torch.sort(logits, dim=-1, descending=True, stable=True).indices[..., :TOP_K]
    assert torch.equal(top_k_descending(logits, TOP_K), want)
    assert torch.equal(top_k_descending(logits, 1), want[..., :1])


def test_batched_drafts_are_the_single_drafts(world):
    """runtime.accept's batched blocks (what the acceptance measurement drafts) walk the same lattice."""
    d, w, _ = _sides(world)
    feats, _, _ = synthetic_inputs(d, 12, 3)
    tokens = torch.randint(0, d.vocab_size, (12,), generator=torch.Generator().manual_seed(5))
    anchors = [3, 6, 9]
    batched = anchor_drafts(d, w, feats, tokens, anchors, d.block_size - 1, batch=2)
    for row, c in zip(batched, anchors, strict=True):
        ids = block_tokens(d, int(tokens[c]))
        single = run_gguf(d, w, feats[:c], ids, contiguous_positions(c, len(ids)))
        assert torch.equal(row, single.tokens), c


# --- ground truth: libllama ----------------------------------------------------------------------------

PROBE = "dflash2_runner"  # fixtures/probes/dflash2_runner.cpp


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    """The probe, compiled against the llama.cpp build from the cached sdist (built first when absent)."""
    from fixtures.libllama_probe import compile_probe

    return compile_probe(PROBE, tmp_path_factory.mktemp("probe2"))


DRAFTS = 8  # contexts (and anchors) per file


@pytest.mark.runtime
@pytest.mark.slow
@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_runner_matches_libllama(world, probe, qtype, record_property):
    """The tokens llama.cpp's driver walks out of the lattice are the runner's, over DRAFTS contexts.

    How llama.cpp's drafted tokens are extracted: the probe (fixtures/probes/dflash2_runner.cpp, built against the sdist's libllama in
    the ``probe`` fixture) decodes each block as the driver does and runs the driver's own walk over the lattice
    libllama returns in h_nextn, in C++, mirroring common/speculative.cpp's loop line for line; it writes the
    walked tokens, the choices and the raw rows (for the candidates and scores). Compared: the candidates
    (equal), the free-running walks (token for token up to the first slot whose walked row's top two lie within
    check's F32 near-tie margin: after a flip the walks follow different predecessors), and every slot's pick of
    the runner's lattice given llama.cpp's previous choice (equal except near-ties, counted and recorded as
    ``near_ties``). The lattice agrees to float32 rounding; a Q8_0 file with the CPU backend's activation
    rounding (``cpu_matmul``) too, except where an activation sits on an int8 rounding boundary and the two
    round it apart (then ~5e-4): the median draft agrees to rounding."""
    from fixtures.libllama_probe import draft_agreement, tied_slots

    root, _, _, f32 = world
    gguf = f32
    if qtype != "F32":
        gguf = root / f"d2-probe-{qtype}.gguf"
        quantize(f32, gguf, qtype)
    d, w, _ = _sides(world, gguf)
    v = w.embed.full().to(torch.float32).numpy()  # the probe has no target context: the embedding goes in the file
    own = write_parts(root / f"d2-{qtype}-self-contained.gguf", set_tensor(read_parts(gguf), Tensor(
        EMBEDDING_TENSOR, (v.shape[1], v.shape[0]), GGMLType.F32, v.astype("<f4").tobytes())))
    inputs = [synthetic_inputs(d, CTX, seed) for seed in range(DRAFTS)]
    n_block = len(inputs[0][1])
    io = root / "probe-io.bin"
    io.write_bytes(np.array([DRAFTS, CTX, inputs[0][0].shape[1], n_block], np.int32).tobytes()
                   + b"".join(f.numpy().astype("<f4").tobytes() + ids.numpy().astype("<i4").tobytes() for f, ids, _ in inputs))
    r = subprocess.run([str(probe), str(own), str(io)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"probe failed ({r.returncode}): {r.stderr[-2000:]}"
    raw = np.fromfile(io, np.uint8)
    n_embd, top_k = (int(x) for x in raw[:8].view(np.int32))
    assert top_k == TOP_K
    n = n_block - 1
    per_draft = 2 * n + n_block * n_embd
    body = raw[8:].view(np.int32).reshape(DRAFTS, per_draft)
    errors, ours, theirs, rows, walks_equal = [], [], [], [], 0
    for k, (feats, ids, pos) in enumerate(inputs):
        walked = torch.from_numpy(body[k, :n].astype(np.int64))
        chosen = torch.from_numpy(body[k, n:2 * n].astype(np.int64))
        lat_rows = torch.from_numpy(body[k, 2 * n:].view(np.float32).reshape(n_block, n_embd).copy())[1:]
        cand = lat_rows[:, :TOP_K].round().to(torch.int64)
        lattice = lat_rows[:, TOP_K:TOP_K + TOP_K * TOP_K].reshape(-1, TOP_K, TOP_K)
        assert not lat_rows[:, TOP_K + TOP_K * TOP_K:].any()  # the rest of each row is padding
        assert torch.equal(cand.gather(1, chosen[:, None])[:, 0], walked)
        prev = torch.cat([torch.zeros(1, dtype=torch.int64), chosen[:-1]])
        walked_rows = lattice[torch.arange(n), prev]  # [n, k]: the scores the driver picked each slot from
        got = run_gguf(d, w, feats, ids, pos, cpu_matmul=True)
        assert torch.equal(got.extras[CANDIDATES], cand), k
        # the free-running walks: equal up to the first near-tie
        tied = tied_slots(walked_rows)
        first_tie = int(torch.nonzero(tied).flatten()[0]) if bool(tied.any()) else n
        assert torch.equal(got.tokens[:first_tie], walked[:first_tie]), (k, got.tokens, walked)
        walks_equal += torch.equal(got.tokens, walked)
        # every slot: the runner's lattice walked from llama.cpp's previous choice
        ours.append(got.extras[LATTICE][torch.arange(n), prev].argmax(-1))
        theirs.append(chosen)
        rows.append(walked_rows)
        errors.append(float((got.extras[LATTICE] - lattice).abs().max()))
    agreement = draft_agreement(torch.cat(ours), torch.cat(theirs), torch.cat(rows))
    record_property("near_ties", agreement.tied)
    record_property("lattice_max_abs_diff", max(errors))
    print(agreement.line(f"DFlash2 {qtype}"), f"lattice max abs diff {max(errors):.3g} (median draft "
          f"{sorted(errors)[DRAFTS // 2]:.3g}), free-running walks equal {walks_equal}/{DRAFTS}")
    assert agreement.slots == DRAFTS * n
    assert agreement.untied_differences == (), agreement
    assert walks_equal == DRAFTS or agreement.tied > 0  # only a near-tie may part the two walks
    assert (max(errors) if qtype == "F32" else sorted(errors)[DRAFTS // 2]) < 1e-5, errors


# --- check ----------------------------------------------------------------------------------------------


def _check(world, gguf: Path, **kw):
    _, src, tgt, _ = world
    return check(gguf, src, target_model_dir=tgt, device="cpu", context=CTX, **kw)


def test_check_passes_f32_with_every_drafted_token_equal(world):
    rep = _check(world, world[3])
    assert rep.passed, rep.render_text()
    assert rep.precision_class == "F32" and rep.metrics["top1_agreement"] == 1.0
    assert rep.metrics["slots"] == 7 and rep.metrics["hidden_max_rel_err"] < 1e-5
    assert not rep.semantics_gap["differs"] and not any("as it was trained" in w for w in rep.warnings)
    sel = rep.metrics["selector"]
    assert sel["candidate_sets_equal"] == 1.0 and sel["lattice_max_abs_err"] < 1e-5 and sel["top_k"] == [TOP_K, TOP_K]
    assert "selector               candidate sets equal in 1.000 of the slots" in rep.render_text()


def test_selector_agreement_aligns_candidates_by_id():
    """The same lattice with its candidates in another order on one side compares as equal; another set does not."""
    g = torch.Generator().manual_seed(0)
    cand = torch.tensor([[5, 9, 2], [7, 3, 8], [1, 4, 6]])
    lat = torch.randn(3, 3, 3, generator=g)
    lat[0] = lat[0, :1].expand(3, 3)  # the first slot's rows are all the anchor's
    perm = torch.tensor([[2, 0, 1], [1, 2, 0], [0, 2, 1]])
    cand2 = cand.gather(1, perm)
    prev = torch.cat([torch.arange(3)[None], perm[:-1]])
    lat2 = lat.gather(2, perm[:, None, :].expand(3, 3, 3)).gather(1, prev[:, :, None].expand(3, 3, 3))

    def result(c, lt):
        return ForwardResult(hidden=torch.zeros(4, 2), logits=torch.zeros(3, 10), tokens=c[:, 0],
                             extras={CANDIDATES: c, LATTICE: lt, CHOSEN: torch.zeros(3, dtype=torch.int64)})

    same = selector_agreement(result(cand2, lat2), result(cand, lat))
    assert same["candidate_sets_equal"] == 1.0 and same["lattice_max_abs_err"] < 1e-6
    other = cand.clone()
    other[1, 0] = 0  # slot 2 draws another set: it and slot 3 (whose predecessors differ) are not compared
    part = selector_agreement(result(other, lat), result(cand, lat))
    assert part["candidate_sets_equal"] == pytest.approx(2 / 3) and part["lattice_max_abs_err"] == 0.0
    assert selector_agreement(result(cand, lat + 1.0), result(cand, lat))["lattice_max_abs_err"] == pytest.approx(1.0)


@pytest.mark.parametrize("qtype,cls", [("F16", "F16"), ("BF16", "BF16"), ("Q8_0", "Q8_0"), ("Q4_K_M", "Q4"), ("Q2_K", "Q2_K")])
def test_check_passes_quantized_files(world, qtype, cls):
    root, _, _, f32 = world
    out = root / f"d2-{qtype}.gguf"
    quantize(f32, out, qtype)
    rep = _check(world, out, reference_gguf=f32)
    assert rep.passed, rep.render_text()
    assert rep.precision_class == cls
    assert rep.metrics["against_reference_gguf"]["file_type"] == "F32"


def test_save_io_has_the_lattice(world, tmp_path):
    d = read_drafter(world[3])
    out = tmp_path / "io.npz"
    _check(world, world[3], save_io=out)
    n = d.block_size - 1
    want = {CANDIDATES: (np.int64, (n, TOP_K)), LATTICE: (np.float32, (n, TOP_K, TOP_K)), CHOSEN: (np.int64, (n,))}
    with np.load(out) as z:
        for name, (dtype, shape) in want.items():
            for side in ("gguf", "ref"):
                a = z[f"{name}_{side}"]
                assert a.dtype == dtype and a.shape == shape, (name, side)
        assert np.array_equal(z["candidates_gguf"], z["candidates_ref"])
        assert np.array_equal(z["tokens_gguf"], z["tokens_ref"])
        picked = np.take_along_axis(z["candidates_gguf"], z["chosen_gguf"][:, None], 1)[:, 0]
        assert np.array_equal(picked, z["tokens_gguf"])
        assert float(np.abs(z["lattice_gguf"] - z["lattice_ref"]).max()) < 1e-5


# --- files broken on purpose ------------------------------------------------------------------------------


def _swap_conv_bases(parts):
    return swap_tensors(parts, layer_name(0, ATTN_CONV_BASE), layer_name(0, FFN_CONV_BASE))


def _transposed_codebook(parts):
    """The predecessor codebook's [V, r] values written transposed into the same shape (a missed transpose)."""
    t = get_tensor(parts, SELECTOR_PREV)
    r, V = t.ne
    vals = np.frombuffer(t.data, "<f4").reshape(V, r)
    return set_tensor(parts, Tensor(t.name, t.ne, t.gtype, np.ascontiguousarray(vals.T).astype("<f4").tobytes()))


def _top_k(parts):
    return set_key(parts, kv("selector_top_k", TOP_K - 1))


def _kernel_size(parts):
    """conv_kernel_size 1 with group 8: the projections keep their shape, the bases keep their first tap, so
    llama.cpp loads the file (every shape is what its keys demand)."""
    parts = set_key(set_key(parts, kv("conv_kernel_size", 1)), kv("conv_group_size", 8))
    for i in range(2):
        for base in (ATTN_CONV_BASE, FFN_CONV_BASE):
            t = get_tensor(parts, layer_name(i, base))
            vals = np.frombuffer(t.data, "<f4").reshape(2, 2, t.ne[0])[:, :1]
            parts = set_tensor(parts, Tensor(t.name, (t.ne[0], 1, 2), t.gtype, np.ascontiguousarray(vals).tobytes()))
    return parts


@pytest.mark.parametrize("what,edit,cause", [
    ("swapped-conv-bases", _swap_conv_bases,
     f"tensor differs: {layer_name(0, ATTN_CONV_BASE)}: relative RMS error"),
    ("transposed-codebook", _transposed_codebook, f"tensor differs: {SELECTOR_PREV}: relative RMS error"),
    ("selector-top-k", _top_k, f"hyper-parameter differs from the checkpoint's: selector_top_k: file {TOP_K - 1}, "
                               f"checkpoint {TOP_K}"),
    ("conv-kernel-size", _kernel_size, "hyper-parameter differs from the checkpoint's: conv_kernel_size: file 1, checkpoint 2"),
])
def test_broken_file_fails_naming_the_cause(world, what, edit, cause):
    root, _, _, f32 = world
    out = write_parts(root / f"broken-{what}.gguf", edit(read_parts(f32)))
    rep = _check(world, out)
    assert not rep.passed and rep.exit_code == 1
    assert any(f.startswith(cause) for f in rep.failures), rep.failures
    assert not any(f.startswith("the file fails validate") for f in rep.failures), rep.failures  # llama.cpp loads it
    if what == "selector-top-k":
        assert rep.metrics["selector"]["top_k"] == [TOP_K - 1, TOP_K]
    if what == "swapped-conv-bases":
        assert any("(swapped?)" in f for f in rep.failures), rep.failures
    assert f"FAIL: {cause}" in rep.render_text()


def test_kernel_size_edit_keeps_a_loadable_file(world):
    """The conv_kernel_size sabotage is a file llama.cpp would run, not one its loader refuses."""
    root = world[0]
    out = write_parts(root / "kernel1.gguf", _kernel_size(read_parts(world[3])))
    d = read_drafter(out)
    assert d.conv is not None and (d.conv.kernel_size, d.conv.group_size) == (1, 8)
    w = load_weights(d, read_target_dir(world[2]))
    assert w.dflash2 is not None and w.dflash2.attn[0].base.shape == (2, 1, d.hidden_size)



def test_semantics_gap_for_a_window_below_the_block(world, tmp_path):
    """Window 4 < block 8, non-causal: the trained model hides future cells 4 or more slots away, llama.cpp never
    does. The file is right (llama.cpp's semantics pass); the trained semantics differ and are reported."""
    _, _, tgt, _ = world
    src = make_dflash2_drafter(tmp_path / "swa", dtype="f32", seed=2, **G4)
    edit_config(src, sliding_window=4)
    out = convert(src, tgt, outfile=tmp_path / "swa-f32.gguf", outtype="f32").output
    rep = check(out, src, target_model_dir=tgt, device="cpu", context=CTX)
    assert rep.passed, rep.render_text()
    assert rep.semantics_gap["differs"] and rep.semantics_gap["hidden_max_abs_err"] > 1e-3
    assert any(w.startswith("llama.cpp does not run this drafter as it was trained") for w in rep.warnings)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_drafts_what_cpu_drafts(world):
    d, w, _ = _sides(world)
    wc = load_weights(d, read_target_dir(world[2]), device="cuda")
    for seed in range(3):
        feats, ids, pos = synthetic_inputs(d, CTX, seed)
        cpu, gpu = run_gguf(d, w, feats, ids, pos), run_gguf(d, wc, feats, ids, pos)
        assert gpu.tokens.is_cuda and torch.equal(gpu.tokens.cpu(), cpu.tokens)
        assert torch.equal(gpu.extras[CANDIDATES].cpu(), cpu.extras[CANDIDATES])
        assert float((gpu.extras[LATTICE].cpu() - cpu.extras[LATTICE]).abs().max()) < 1e-4


# --- acceptance: check with a features file --------------------------------------------------------------

NEW_TOKENS = 24
ACCEPT_PER_STEP = 3  # the continuation follows the checkpoint's drafts this far at every loop anchor


def _features_file(world, out: Path) -> Path:
    """A features file the checkpoint drafts into: random layer inputs, a random prompt, then a continuation
    built along llama-speculative-simple's loop that takes ACCEPT_PER_STEP tokens of the checkpoint's draft
    (the reference, walked) and then one token it did not draft. No target model is needed to write it."""
    d, _, model = _sides(world)
    layers = list(d.target_layers)
    g = torch.Generator().manual_seed(11)
    total, prompt = 8 + NEW_TOKENS + d.block_size + 2, 8
    streams = torch.randn(len(layers), total, d.hidden_size, generator=g)
    feats = torch.cat(list(streams), dim=-1).double()
    tokens = torch.randint(5, d.vocab_size, (total,), generator=g)
    c = prompt - 1
    while c + ACCEPT_PER_STEP + 1 < total:
        ids = block_tokens(d, int(tokens[c]))
        draft = reference_forward(model, feats[:c], ids, contiguous_positions(c, len(ids))).tokens
        tokens[c + 1:c + 1 + ACCEPT_PER_STEP] = draft[:ACCEPT_PER_STEP]
        tokens[c + 1 + ACCEPT_PER_STEP] = (int(draft[ACCEPT_PER_STEP]) + 1) % d.vocab_size  # the draft stops here
        c += ACCEPT_PER_STEP + 1
    meta = {"schema": FEATURES_SCHEMA, "layers": json.dumps(layers), "dtype": "F32", "sequences": "1",
            "new_tokens": str(NEW_TOKENS), "eos_ids": "[]"}
    w = FeatureWriter(out, [total], len(layers), d.hidden_size, "F32", meta)
    w.write(0, tokens.numpy(), prompt, streams.numpy())
    return w.commit()


def test_check_measures_acceptance_on_the_walked_drafts(world, tmp_path):
    """With a features file the acceptance loop drafts by the walk on both sides: the F32 file accepts what the
    checkpoint accepts (ACCEPT_PER_STEP per step by construction); swapped conv kernels lose it."""
    root, _, _, f32 = world
    feats = _features_file(world, tmp_path / "feats.safetensors")
    rep = _check(world, f32, features=str(feats))
    assert rep.passed, rep.render_text()
    a = rep.metrics["acceptance"]
    assert a["checkpoint"]["n_accept"] == ACCEPT_PER_STEP * a["checkpoint"]["steps"] and a["checkpoint"]["accept"] > 0.3
    assert a["file"] == a["checkpoint"] and a["lost"] == 0.0
    broken = write_parts(root / "broken-acceptance.gguf", _swap_conv_bases(read_parts(f32)))
    bad = _check(world, broken, features=str(feats))
    assert bad.metrics["acceptance"]["lost"] > 0.2
    assert any(f.startswith("accepted tokens lost: the file accepts") for f in bad.failures), bad.failures
