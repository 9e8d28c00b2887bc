"""The in-process runner (runtime/forward.py) against the checkpoint reference (runtime/reference.py).

What is proved here, per tiny drafter converted at F32: the GGUF, run as llama.cpp runs it,
computes what the checkpoint computes under llama.cpp's semantics (to float error), and the
tokens are identical; F16/Q8_0 files stay close; where llama.cpp's runtime and the trained model
differ (causal sliding layers, a window smaller than the block, erf GELU, output multiplier) the
two semantics of the reference differ; and GGUFs broken on purpose (wrong rope base, swapped
tensors, a scaled norm, reversed taps) are caught. In the runtime tier a small probe program built
against libllama of the cached sdist (built first when absent, ``fixtures.libllama_probe``) runs the
same files through llama.cpp itself (CPU, F32 KV cache, flash attention off) as the ground truth for
the runner: logits, and the tokens llama.cpp drafts from 8 contexts per case, equal except near-ties.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from drafter_gguf import (
    KV,
    Tensor,
    full_key,
    get_key,
    kv,
    map_key,
    read_parts,
    scale_tensor,
    set_tensor,
    swap_tensors,
    write_parts,
)
from safetensors.torch import save_file

from dflash_convert import convert
from dflash_convert.drafter import Drafter
from dflash_convert.errors import DFlashError
from dflash_convert.format.ggml import GGMLType
from dflash_convert.format.keys import ValueType
from dflash_convert.format.rules import EMBEDDING_TENSOR, OUTPUT_TENSOR
from dflash_convert.format.tensors import layer_name
from dflash_convert.quantize import quantize
from dflash_convert.runtime.forward import ForwardResult, block_tokens, contiguous_positions, gather_features, run_gguf
from dflash_convert.runtime.reference import (
    ReferenceModel,
    layer_attention,
    load_reference,
    reference_features,
    reference_forward,
)
from dflash_convert.runtime.weights import LAYER_ROLES, DrafterWeights, load_weights, target_weights
from dflash_convert.sources.checkpoint import read_checkpoint
from dflash_convert.sources.gguf import read_gguf
from dflash_convert.sources.gguf_drafter import drafter_from_gguf
from dflash_convert.sources.target import read_target
from fixtures.drafters import add_tensors, make_speculators_drafter, make_zlab_drafter, write_mask_embedding

F32_TOL = 1e-4  # run_gguf (float32) vs the float64 reference on an F32 file; measured ~1e-6
CTX = 7  # committed positions whose features are injected
TARGET_LAYERS = 4  # the fixture targets' decoder layers


@dataclass
class Case:
    name: str
    src: Path
    target: Path
    gguf: Path
    drafter: Drafter
    weights: DrafterWeights
    ref: ReferenceModel
    states: torch.Tensor  # [target layers + 1, ctx, E]: what HF's output_hidden_states would give
    ids: torch.Tensor
    pos: torch.Tensor

    @property
    def feats(self) -> torch.Tensor:
        """Features as llama.cpp's driver gathers them from the GGUF's target_layers."""
        return gather_features(self.drafter, self.states)

    def run(self, **kw) -> ForwardResult:
        return run_gguf(self.drafter, self.weights, self.feats, self.ids, self.pos, **kw)

    def reference(self, semantics: str = "llama.cpp") -> ForwardResult:
        """The checkpoint, fed the way its own code takes features (target_layer_ids + 1, or aux ids)."""
        return reference_forward(self.ref, reference_features(self.ref, self.states), self.ids, self.pos, semantics=semantics)


def _options(src: Path) -> Path:
    """Everything optional at once: partial rotary, YaRN, causal, scales, GELU, sinks, output multiplier."""
    cfg = json.loads((src / "config.json").read_text())
    cfg["partial_rotary_factor"] = 0.5
    cfg["hidden_act"] = "gelu_pytorch_tanh"
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
    cfg["dflash_config"].update({"causal": True, "attention_value_scale": 0.5, "input_embedding_scale": 2.0,
                                 "output_multiplier": 2.0})
    (src / "config.json").write_text(json.dumps(cfg, indent=2))
    g = torch.Generator().manual_seed(5)
    return add_tensors(src, {f"layers.{i}.self_attn.sinks": torch.randn(cfg["num_attention_heads"], generator=g)
                             for i in range(cfg["num_hidden_layers"])})


def _interleaved(src: Path) -> Path:
    cfg = json.loads((src / "config.json").read_text())
    cfg["rope_is_neox_style"] = False
    (src / "config.json").write_text(json.dumps(cfg, indent=2))
    return src


QWEN35 = dict(schema="nested", vocab_size=248320, mask_token_id=248077)
# name -> (target kind, builder, first position)
BUILDERS = {
    # Qwen3 layout, from a checkpoint with interleaved (GPT-J) rotary rows: the converter permutes
    # q/k rows to NeoX, the reference ropes the original rows pairwise
    "dense": ("qwen3", lambda out: _interleaved(make_zlab_drafter(out, target_layer_ids=[0, 2])), 100),
    # Qwen3.5 layout: M-RoPE target (degenerate sections), sliding layer with a window below the block
    "hybrid_swa": ("qwen35", lambda out: make_zlab_drafter(out, **QWEN35, swa_layers=[True, False], sliding_window=4,
                                                           target_layer_ids=[0, 2]), 40),
    # own vocabulary (d2t), own embedding and head, exact-GELU config, block size 8
    "speculators": ("qwen3", lambda out: make_speculators_drafter(out, vocab_size=151936, draft_vocab_size=2048,
                                                                  mask_token_id=151669, aux_layer_ids=[2, 3],
                                                                  hidden_act="gelu"), 0),
    "options": ("qwen3", lambda out: _options(make_zlab_drafter(out, dtype="f32", layers=3, target_layer_ids=[0, 1, 2])),
                3000),
    # MiMo-style mask_embedding.pt: the GGUF carries the target embedding with the mask row replaced
    "mask_embedding": ("qwen3", lambda out: write_mask_embedding(make_zlab_drafter(out, target_layer_ids=[1, 3], seed=4),
                                                                 151669, 64), 0),
}
CASES = list(BUILDERS)


# where each fixture target keeps its token embedding (both tie their head to it)
EMBED_NAMES = {"qwen3": "model.embed_tokens.weight", "qwen35": "model.language_model.embed_tokens.weight"}


@pytest.fixture(scope="module")
def world(tmp_path_factory, qwen3_target, qwen35_target):
    """Cases built on first use. Targets are the session's target directories plus a safetensors
    file holding only the embedding: all a drafter reads from its target (the head is tied), and
    far cheaper than building the whole target model with transformers."""
    root = tmp_path_factory.mktemp("runner")
    targets: dict[str, Path] = {}
    cases: dict[str, Case] = {}
    sources = {"qwen3": qwen3_target, "qwen35": qwen35_target}

    def target(kind: str) -> Path:
        if kind not in targets:
            out = root / f"target-{kind}"
            shutil.copytree(sources[kind], out)
            cfg = json.loads((out / "config.json").read_text())
            text = cfg.get("text_config", cfg)
            assert text["tie_word_embeddings"] and not any(out.glob("*.safetensors"))
            g = torch.Generator().manual_seed(7)
            emb = (torch.randn(text["vocab_size"], text["hidden_size"], generator=g) * 0.05).to(torch.bfloat16)
            save_file({EMBED_NAMES[kind]: emb}, str(out / "model.safetensors"))
            targets[kind] = out
        return targets[kind]

    def get(name: str) -> Case:
        if name not in cases:
            kind, build, start = BUILDERS[name]
            src = build(root / name)
            tgt = target(kind)
            out = root / f"{name}-f32.gguf"
            convert(src, tgt, outfile=out, outtype="f32")
            parsed = read_gguf(out)  # parsed once: a 150k-token vocabulary takes a while to read
            d = drafter_from_gguf(parsed)
            g = torch.Generator().manual_seed(11)
            states = torch.randn(TARGET_LAYERS + 1, CTX, d.hidden_size, generator=g)
            ids = block_tokens(d, anchor=1234)
            cases[name] = Case(name, src, tgt, out, d, load_weights(d, read_target(tgt)),
                               load_reference(read_checkpoint(src), read_target(tgt)), states, ids,
                               contiguous_positions(CTX, len(ids), start))
        return cases[name]

    return get, root


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest difference over the finite entries; the -inf pattern (d2t) must be the same."""
    fa, fb = torch.isfinite(a), torch.isfinite(b.to(a.device))
    assert torch.equal(fa, fb), "the -inf pattern differs"
    return float((a[fa].double() - b.to(a.device)[fb].double()).abs().max())


def rerun(case: Case, path: Path) -> tuple[Drafter, ForwardResult]:
    """The case's inputs through another GGUF file: features gathered by that file's own target_layers."""
    g = read_gguf(path)
    d = drafter_from_gguf(g)
    return d, run_gguf(d, load_weights(d, read_target(case.target)), gather_features(d, case.states), case.ids, case.pos)


# --- the GGUF computes what the checkpoint computes ----------------------------------------------


@pytest.mark.parametrize("name", CASES)
def test_f32_gguf_matches_checkpoint(world, name):
    case = world[0](name)
    got, want = case.run(), case.reference("llama.cpp")
    assert got.logits.shape == (len(case.ids) - 1, case.drafter.vocab_size)
    assert max_err(got.logits, want.logits) < F32_TOL
    assert max_err(got.hidden, want.hidden) < F32_TOL
    assert torch.equal(got.tokens, want.tokens)
    if case.drafter.draft_vocab_size:  # own vocabulary: only the d2t ids are finite
        assert int(torch.isfinite(got.logits[0]).sum()) == case.drafter.draft_vocab_size
        assert bool(torch.isin(got.tokens, case.weights.d2t).all())


def test_cases_exercise_what_they_claim(world):
    """Guard against a fixture silently losing the feature its case is there to test."""
    get = world[0]
    h = get("hybrid_swa").drafter
    assert h.rope_sections == [8, 0, 0, 0] and h.swa_pattern == [True, False] and h.sliding_window < h.block_size
    o, ow = get("options").drafter, get("options").weights
    assert o.n_rot == 8 and o.rope_scaling.kind == "yarn" and o.causal is True and o.hidden_act == "gelu_pytorch_tanh"
    assert o.value_scale == 0.5 and o.embedding_scale == 2.0 and all(lw.sinks is not None for lw in ow.layers)
    s, sw = get("speculators").drafter, get("speculators").weights
    assert s.draft_vocab_size == 2048 and sw.d2t is not None and (sw.embed_from, sw.head_from) == ("drafter", "drafter")
    dense = get("dense")
    assert dense.weights.embed_from == "target" and dense.ref.config["rope_is_neox_style"] is False
    m = get("mask_embedding")
    assert m.weights.embed_from == "drafter" and m.ref.mask_row is not None
    mask = torch.tensor([m.drafter.mask_token_id])
    assert torch.allclose(m.weights.embed.rows(mask)[0].double(), m.ref.mask_row)
    assert not torch.allclose(m.weights.embed.rows(mask)[0], target_weights(read_target(m.target))[0].rows(mask)[0])


@pytest.mark.parametrize("qtype,rel_tol", [("F16", 2e-3), ("Q8_0", 3e-2)])
def test_quantized_gguf_stays_close(world, qtype, rel_tol):
    get, root = world
    case = get("dense")
    out = root / f"dense-{qtype}.gguf"
    quantize(case.gguf, out, qtype)
    d, got = rerun(case, out)
    want = case.reference("llama.cpp")
    assert {t.dtype for t in d.tensors if len(t.shape) == 2} == {qtype}
    scale = float(want.logits.abs().max())
    assert max_err(got.logits, want.logits) < rel_tol * scale
    assert (got.tokens == want.tokens).float().mean() >= 0.8


# --- the two semantics differ exactly where documented ----------------------------------------------


def test_semantics_agree_on_a_plain_drafter(world):
    case = world[0]("dense")
    assert max_err(case.reference("reference").logits, case.reference("llama.cpp").logits) < 1e-12


def test_sliding_layer_semantics_differ(world):
    """Qwen3.5 layout: the trained model masks its sliding layer causally and windows it; llama.cpp does neither."""
    case = world[0]("hybrid_swa")
    assert layer_attention(case.ref, "reference") == [(True, 4, True), (False, None, True)]
    assert layer_attention(case.ref, "llama.cpp") == [(False, 4, False), (False, None, False)]
    assert max_err(case.reference("reference").logits, case.reference("llama.cpp").logits) > 1e-2


def test_window_smaller_than_block_hides_future_only_in_reference(world):
    """With causality equal (is_causal false), only the future side of the window differs, and only while window < block."""
    case = world[0]("hybrid_swa")
    case.ref.config["is_causal"] = False
    try:
        assert max_err(case.reference("reference").logits, case.reference("llama.cpp").logits) > 1e-2
        case.ref.drafter.sliding_window = len(case.ids) + CTX  # the window covers the block: the rules agree
        assert max_err(case.reference("reference").logits, case.reference("llama.cpp").logits) < 1e-12
    finally:
        case.ref.config.pop("is_causal")
        case.ref.drafter.sliding_window = case.drafter.sliding_window


def test_output_multiplier_only_in_reference(world):
    case = world[0]("options")
    ref, lcpp = case.reference("reference"), case.reference("llama.cpp")
    assert torch.allclose(ref.logits, 2.0 * lcpp.logits, rtol=1e-12, atol=1e-12)


def test_exact_gelu_only_in_reference(world):
    """hidden_act gelu is erf GELU in transformers, the tanh approximation in llama.cpp: close, not equal."""
    case = world[0]("speculators")
    diff = max_err(case.reference("reference").logits, case.reference("llama.cpp").logits)
    assert 1e-7 < diff < 1e-2


# --- files broken on purpose are caught ------------------------------------------------------------


_PARTS: dict[Path, object] = {}


def _edited(case: Case, root: Path, what: str, edit) -> Path:
    if case.gguf not in _PARTS:
        _PARTS[case.gguf] = read_parts(case.gguf)
    out = root / f"{case.name}-{what}.gguf"
    write_parts(out, edit(_PARTS[case.gguf]))
    return out


def _wrong_rope_base(parts):
    assert get_key(parts, full_key("rope_freq_base")).value == 1e6
    return map_key(parts, "rope_freq_base", lambda v: 1e4)


def _swap_gate_up(parts):
    return swap_tensors(parts, layer_name(0, LAYER_ROLES["gate"]), layer_name(0, LAYER_ROLES["up"]))


def _scaled_norm(parts):
    return scale_tensor(parts, layer_name(1, LAYER_ROLES["ffn_norm"]), 1.5)


def _reversed_taps(parts):
    return map_key(parts, "target_layers", lambda v: list(reversed(v)))


@pytest.mark.parametrize("what,edit", [("rope-base", _wrong_rope_base), ("swapped-gate-up", _swap_gate_up),
                                       ("scaled-norm", _scaled_norm), ("reversed-taps", _reversed_taps)])
def test_broken_gguf_is_caught(world, what, edit):
    get, root = world
    case = get("dense")
    want = case.reference("llama.cpp")
    assert max_err(case.run().logits, want.logits) < F32_TOL
    _, broken = rerun(case, _edited(case, root, what, edit))
    assert max_err(broken.logits, want.logits) > 1e-2


# --- options, devices, inputs -----------------------------------------------------------------------


def test_llama_cpp_default_numerics_are_small_perturbations(world):
    case = world[0]("options")
    base = case.run()
    for kw in ({"kv_cache_dtype": torch.float16}, {"gelu_fp16_table": True}):
        diff = max_err(case.run(**kw).logits, base.logits)
        assert 0 < diff < 1e-2, kw


def test_embedding_and_head_from_target_gguf_equal_target_dir(world, tmp_path):
    """A target GGUF supplies only token_embd/output: build one by hand and compare with the directory's."""
    case = world[0]("dense")
    emb, head = target_weights(read_target(case.target))
    e = emb.full().numpy()
    parts = ([kv("architecture", "qwen3"), kv("tok_tokens", [f"t{i}" for i in range(e.shape[0])]),
              KV(full_key("embedding_length", "qwen3"), ValueType.UINT32, e.shape[1])],
             [Tensor(EMBEDDING_TENSOR, (e.shape[1], e.shape[0]), GGMLType.F32, e.astype("<f4").tobytes())])
    path = write_parts(tmp_path / "target.gguf", parts)
    got = run_gguf(case.drafter, load_weights(case.drafter, read_target(path)), case.feats, case.ids, case.pos)
    assert max_err(got.logits, case.run().logits) == 0.0  # tied head: the qwen3 fixture ties too
    assert torch.equal(head.full(), emb.full())


def test_per_tensor_scales_multiply_their_matmul(world):
    """llama.cpp's build_lora_mm multiplies by an optional ``<name>.scale``: a scale of 2 on ffn_up and
    fc equals doubled weights (the converter never writes scales; NVFP4-style files carry them)."""
    case = world[0]("dense")
    w = case.weights
    two = torch.tensor([2.0])
    scaled_layers = [replace(w.layers[0], scales={"up": two}), *w.layers[1:]]
    doubled_layers = [replace(w.layers[0], up=w.layers[0].up * 2), *w.layers[1:]]
    scaled = run_gguf(case.drafter, replace(w, layers=scaled_layers, fc_scale=two), case.feats, case.ids, case.pos)
    doubled = run_gguf(case.drafter, replace(w, layers=doubled_layers, fc=w.fc * 2), case.feats, case.ids, case.pos)
    assert max_err(scaled.logits, doubled.logits) < 1e-6
    assert max_err(scaled.logits, case.run().logits) > 1e-2


def test_bad_inputs_are_refused(world):
    case = world[0]("dense")
    with pytest.raises(DFlashError, match="target_hidden"):
        run_gguf(case.drafter, case.weights, case.feats[:, :-1], case.ids, case.pos)
    with pytest.raises(DFlashError, match="positions"):
        run_gguf(case.drafter, case.weights, case.feats, case.ids, case.pos[:-1])
    bad = case.ids.clone()
    bad[0] = case.drafter.vocab_size
    with pytest.raises(DFlashError, match="outside the vocabulary"):
        run_gguf(case.drafter, case.weights, case.feats, bad, case.pos)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu(world):
    case = world[0]("hybrid_swa")
    w = load_weights(case.drafter, read_target(case.target), device="cuda")
    got = run_gguf(case.drafter, w, case.feats, case.ids, case.pos)
    assert got.logits.is_cuda
    assert max_err(got.logits.cpu(), case.run().logits) < F32_TOL
    ref = reference_forward(load_reference(read_checkpoint(case.src), read_target(case.target), device="cuda"), case.feats, case.ids, case.pos)
    assert max_err(ref.logits.cpu(), case.reference().logits) < 1e-9


# --- ground truth: libllama itself ------------------------------------------------------------------

PROBE = "runner"  # fixtures/probes/runner.cpp


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    """The probe, compiled against the llama.cpp build from the cached sdist (built first when absent)."""
    from fixtures.libllama_probe import compile_probe

    return compile_probe(PROBE, tmp_path_factory.mktemp("probe"))


def _self_contained(case: Case, root: Path) -> Path:
    """The case's GGUF with the target's embedding (and head) written in: the probe has no target context.

    The fixture targets tie their head to the embedding, so only token_embd is added and llama.cpp's
    tied-head fallback supplies the head: the same values, half the file.
    """
    w = case.weights
    if w.embed_from == "drafter" and w.head_from == "drafter":
        return case.gguf
    parts = read_parts(case.gguf)
    adds = [(EMBEDDING_TENSOR, w.embed)] + ([] if w.head is w.embed else [(OUTPUT_TENSOR, w.head)])
    for name, m in adds:
        v = m.full().to(torch.float32).numpy()
        parts = set_tensor(parts, Tensor(name, (v.shape[1], v.shape[0]), GGMLType.F32, v.astype("<f4").tobytes()))
    return write_parts(root / f"{case.name}-self-contained.gguf", parts)


def llama_cpp_drafts(exe: Path, gguf: Path, case: Case, work: Path, drafts: list[tuple[torch.Tensor, torch.Tensor]]
                     ) -> list[torch.Tensor]:
    """libllama's logits [n_block - 1, V] of the slots the driver reads (1..), per (features, block ids) draft,
    at the case's positions."""
    io = work / f"{case.name}-io.bin"
    header = np.array([len(drafts), CTX, drafts[0][0].shape[1], len(case.ids), int(case.pos[0])], np.int32)
    body = b"".join(f.numpy().astype("<f4").tobytes() + ids.numpy().astype("<i4").tobytes() for f, ids in drafts)
    io.write_bytes(header.tobytes() + body)
    r = subprocess.run([str(exe), str(gguf), str(io)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"probe failed ({r.returncode}): {r.stderr[-2000:]}"
    raw = np.fromfile(io, np.uint8)
    n_vocab = int(raw[:4].view(np.int32)[0])
    logits = torch.from_numpy(raw[4:].view(np.float32).reshape(len(drafts), len(case.ids), n_vocab).copy())
    io.unlink()
    return list(logits[:, 1:])


def llama_cpp_logits(exe: Path, gguf: Path, case: Case, work: Path, feats: torch.Tensor | None = None) -> torch.Tensor:
    return llama_cpp_drafts(exe, gguf, case, work, [(case.feats if feats is None else feats, case.ids)])[0]


# max |runner - libllama| on the logits. SiLU drafters agree to float32 rounding; a GELU drafter goes
# through ggml's fp16 GELU table, where float32 differences in the matmuls flip a table entry now and
# then, so it agrees to ~1e-4 even with the table emulated (gelu_fp16_table=True).
ORACLE_TOL = {"dense": 1e-5, "hybrid_swa": 1e-5, "speculators": 5e-4, "options": 1e-3}


@pytest.mark.runtime
@pytest.mark.slow
@pytest.mark.parametrize("name", list(ORACLE_TOL))
def test_runner_matches_libllama(world, probe, name):
    get, root = world
    case = get(name)
    want = llama_cpp_logits(probe, _self_contained(case, root), case, root)
    got = case.run(gelu_fp16_table=case.drafter.hidden_act != "silu")
    assert max_err(got.logits, want) < ORACLE_TOL[name]
    assert torch.equal(got.tokens, want.argmax(-1))


DRAFTS = 8  # contexts (and anchors) per case: 8 x 15 slots for a block of 16


def _draft_inputs(case: Case, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded target states (gathered by the file's target_layers, as the driver does) and an anchor other
    than the mask token."""
    g = torch.Generator().manual_seed(1000 + seed)
    states = torch.randn(case.states.shape, generator=g)
    anchor = int(torch.randint(0, case.drafter.vocab_size, (1,), generator=g))
    anchor += anchor == case.drafter.mask_token_id
    return gather_features(case.drafter, states), block_tokens(case.drafter, anchor)


@pytest.mark.runtime
@pytest.mark.slow
@pytest.mark.parametrize("name", list(ORACLE_TOL))
def test_libllama_drafts_the_runners_tokens(world, probe, name, record_property):
    """Classic DFlash: the tokens llama.cpp drafts are the tokens the runner drafts, over DRAFTS contexts.

    How llama.cpp's drafted tokens are extracted: the probe (fixtures/probes/runner.cpp, built against the sdist's
    libllama in the ``probe`` fixture) drives the draft context as common/speculative.cpp's draft-dflash
    does and writes every block slot's logits; the driver reads slots 1.. greedily (its top-k sampler's
    first candidate at --spec-draft-p-min 0), so each slot's argmax is llama.cpp's drafted token. On these
    F32 files every slot must agree except near-ties (llama.cpp's top two within check's F32 margin,
    ``fixtures.libllama_probe.NEAR_TIE_MARGIN``), which are counted and recorded (``near_ties`` property).
    """
    from fixtures.libllama_probe import draft_agreement

    get, root = world
    case = get(name)
    inputs = [_draft_inputs(case, seed) for seed in range(DRAFTS)]
    theirs = llama_cpp_drafts(probe, _self_contained(case, root), case, root, inputs)
    ours = [run_gguf(case.drafter, case.weights, f, ids, case.pos, gelu_fp16_table=case.drafter.hidden_act != "silu")
            for f, ids in inputs]
    logits = torch.cat(theirs)
    agreement = draft_agreement(torch.cat([r.tokens for r in ours]), logits.argmax(-1), logits)
    err = max(max_err(r.logits, t) for r, t in zip(ours, theirs, strict=True))
    record_property("near_ties", agreement.tied)
    record_property("logits_max_abs_diff", err)
    print(agreement.line(f"classic DFlash {name}"), f"logits max abs diff {err:.3g}")
    assert agreement.slots == DRAFTS * (len(case.ids) - 1)
    assert agreement.untied_differences == (), agreement
    assert err < ORACLE_TOL[name]
    assert len({int(ids[0]) for _, ids in inputs}) == DRAFTS  # eight different anchors, not one draft eight times


def test_draft_agreement_excuses_near_ties_only():
    """The rule the libllama comparisons judge drafts by: a differing slot passes only when llama.cpp's top two
    lie within the F32 margin and our token is one of them; any other difference is named."""
    from fixtures.libllama_probe import NEAR_TIE_MARGIN, draft_agreement

    scores = torch.tensor([[1.0, 0.0, 0.5], [2.0, 2.0 - NEAR_TIE_MARGIN / 2, 0.0], [0.0, 3.0, 3.0 - 0.01],
                           [0.0, 1.0, 1.0 - NEAR_TIE_MARGIN / 2]])
    theirs = scores.argmax(-1)
    same = draft_agreement(theirs, theirs, scores)
    assert (same.slots, same.tied, same.differing, same.untied_differences) == (4, 2, 0, ())
    flipped_tie = draft_agreement(torch.tensor([0, 1, 1, 2]), theirs, scores)
    assert (flipped_tie.differing, flipped_tie.untied_differences) == (2, ())
    # slot 2: 0.01 apart, no near-tie; slot 3: a near-tie, but our token is not one of the tied two
    assert draft_agreement(torch.tensor([0, 0, 2, 0]), theirs, scores).untied_differences == (2, 3)


@pytest.mark.runtime
@pytest.mark.slow
def test_cpu_matmul_rounding_matches_libllama_on_q8_0(world, probe):
    """A Q8_0 file on CPU: llama.cpp quantizes every matmul's activations to Q8_0 blocks first.

    With ``cpu_matmul`` the runner does the same and agrees to float32 rounding, except when an
    activation sits on a rounding boundary of that int8 quantization and the two sides round it
    differently (one step of one block, then propagated): so most inputs, not all, must agree
    exactly, and the greedy tokens always.
    """
    get, root = world
    case = get("dense")
    path = root / "dense-self-contained-Q8_0.gguf"
    # self-contained on purpose (token_embd, no output.weight: validate's tied_head fails it), so unvalidated
    quantize(_self_contained(case, root), path, "Q8_0", validate=False)
    g = read_gguf(path)
    d = drafter_from_gguf(g)
    w = load_weights(d)
    exact, plain = [], []
    for seed in range(3):
        states = torch.randn(case.states.shape, generator=torch.Generator().manual_seed(100 + seed))
        feats = gather_features(d, states)
        want = llama_cpp_logits(probe, path, case, root, feats)
        got = run_gguf(d, w, feats, case.ids, case.pos, cpu_matmul=True)
        assert torch.equal(got.tokens, want.argmax(-1))
        exact.append(max_err(got.logits, want))
        plain.append(max_err(run_gguf(d, w, feats, case.ids, case.pos).logits, want))
    assert sorted(exact)[1] < 1e-5, exact  # the median input agrees to float rounding
    assert sorted(exact)[1] < sorted(plain)[1] / 100, (exact, plain)  # and unmodelled rounding is far off
