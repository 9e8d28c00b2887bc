"""The rest of the dflash family: DFlash2, DSpark (z-lab lineage and speculators exports), Gemma-4 DSpark.

Unit tier: each member converts (keys, key order, tensors, types), reads back into the same Drafter
for every outtype, is refused where upstream refuses or llama.cpp would, quantizes with the per-tensor
rules of llama-quantize, and is named by inspect. Then validate's catalogue: one broken file per
load-time rule llama.cpp enforces for the DFlash2 and DSpark parts, each failing the ``family`` check.
Parity with upstream's converter is tests/test_family_parity.py; llama.cpp running our files is
tests/test_family_runtime.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli
from drafter_gguf import KV, Tensor, drafter_parts, drop_keys, drop_tensors, kv, set_key, set_tensor, tensor, write_parts

from dflash_convert import convert, plan_conversion
from dflash_convert.conversion import write_plan
from dflash_convert.errors import DFlashError
from dflash_convert.format.ggml import GGMLType
from dflash_convert.format.keys import ValueType, key
from dflash_convert.format.quant_types import choose_quant_types
from dflash_convert.inspect_gguf import member_line, pairing_hint
from dflash_convert.quantize import quantize
from dflash_convert.sources.gguf import read_gguf
from dflash_convert.sources.gguf_drafter import describe, read_drafter
from dflash_convert.validate import validate
from fixtures.drafters import edit_config
from fixtures.family import (
    make_deepseek_v4_dspark,
    make_dflash2_drafter,
    make_dspark_drafter,
    make_gemma4_dspark_drafter,
    make_speculators_dspark,
)
from fixtures.targets import make_target_dir

OUTTYPES = ("f32", "f16", "bf16", "q8_0", "auto")
G4 = dict(vocab_size=916, mask_token_id=4)  # the synthetic Gemma-4 target vocabulary


@pytest.fixture(scope="module")
def gemma4_target(tmp_path_factory) -> Path:
    return make_target_dir(tmp_path_factory.mktemp("family-target") / "gemma4", "gemma4")


def _build(root: Path, member: str) -> Path:
    src = root / member
    if member == "dflash2":
        return make_dflash2_drafter(src, dtype="f32", **G4)
    if member == "dspark":
        return make_dspark_drafter(src, **G4)
    if member == "dspark_noconf":
        return make_dspark_drafter(src, architecture="DSparkDraftModel", confidence=False, nested=False, with_lm_head=False, **G4)
    if member == "dspark_spec":
        return make_speculators_dspark(src, dtype="f16", draft_vocab_size=512, aux_layer_ids=[1, 3], **G4)
    if member == "gemma4_dspark":
        return make_gemma4_dspark_drafter(src)
    if member == "gemma4_late":  # a config without head_dim / num_key_value_heads and default RoPE
        make_gemma4_dspark_drafter(src, rope="default", confidence=False)
        cfg = json.loads((src / "config.json").read_text())
        del cfg["head_dim"], cfg["num_key_value_heads"]
        (src / "config.json").write_text(json.dumps(cfg, indent=2))
        return src
    raise AssertionError(member)


MEMBERS = ("dflash2", "dspark", "dspark_noconf", "dspark_spec", "gemma4_dspark", "gemma4_late")


@pytest.fixture(scope="module")
def built(tmp_path_factory, gemma4_target):
    root = tmp_path_factory.mktemp("family")
    cache: dict[str, Path] = {}

    def get(member: str) -> Path:
        if member not in cache:
            cache[member] = _build(root, member)
        return cache[member]

    return get, root


def _keys(path: Path) -> list[str]:
    return [k for k in read_gguf(path).metadata if k.startswith("dflash.")]


@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("member", MEMBERS)
def test_read_drafter_inverts_convert(built, gemma4_target, member, outtype):
    get, root = built
    out = root / f"{member}-{outtype}.gguf"
    plan = plan_conversion(get(member), gemma4_target, outfile=out, outtype=outtype)
    write_plan(plan, force=True, progress=False)
    back = read_drafter(out)
    assert back.hparams() == plan.drafter.hparams()
    assert describe(back)["tensors"] == [(p.tensor.gguf_name, list(p.tensor.shape), p.ggml_type.name) for p in plan.tensors]
    types = {t.name: t.ggml_type.name for t in read_gguf(out).tensors}
    assert all(types[n] == "F32" for n in types if n.endswith("_conv_base"))  # conv base kernels stay F32
    assert validate(out).exit_code == 0


def test_dflash2_keys_and_tensors(built, gemma4_target, tmp_path):
    get, _ = built
    out = convert(get("dflash2"), gemma4_target, outfile=tmp_path / "d2.gguf", outtype="q8_0").output
    g = read_gguf(out)
    keys = _keys(out)
    i = keys.index("dflash.block_size")
    assert keys[i:i + 5] == ["dflash.block_size", "dflash.conv_kernel_size", "dflash.conv_group_size", "dflash.selector_rank",
                             "dflash.selector_top_k"]
    assert [g.get(k) for k in keys[i + 1:i + 5]] == [2, 16, 32, 4]
    assert g.get("dflash.logit_scale") == pytest.approx(0.19611613513818404) and g.get("dflash.final_logit_softcapping") == 20.0
    t = {x.name: x for x in g.tensors}
    assert [x.name for x in g.tensors][:3] == ["selector_hidden.weight", "selector_predecessor.weight", "selector_successor.weight"]
    assert t["selector_predecessor.weight"].ne == (32, 916) and t["selector_hidden.weight"].ne == (64, 32)
    assert t["blk.0.attn_conv_base"].ne == (64, 2, 2) and t["blk.0.attn_conv_base"].ggml_type.name == "F32"
    assert t["blk.1.ffn_conv_proj.weight"].ne == (64, 16) and t["blk.1.ffn_conv_proj.weight"].ggml_type.name == "Q8_0"
    assert t["selector_successor.weight"].ggml_type.name == "Q8_0"
    assert "dflash.sample_from_anchor" not in keys


def test_dspark_keys_defaults_and_d2t(built, gemma4_target, tmp_path):
    get, _ = built
    zlab = read_gguf(convert(get("dspark"), gemma4_target, outfile=tmp_path / "z.gguf").output)
    assert _keys(zlab.path)[-2:] == ["dflash.sample_from_anchor", "dflash.has_confidence_head"]
    assert zlab.get("dflash.sample_from_anchor") is True and zlab.get("dflash.has_confidence_head") is True
    assert "output.weight" not in {t.name for t in zlab.tensors}  # full vocabulary: the target's head is shared
    noconf = read_gguf(convert(get("dspark_noconf"), gemma4_target, outfile=tmp_path / "n.gguf").output)
    assert noconf.get("dflash.has_confidence_head") is False and noconf.get("dflash.target_layers") == [2, 3]
    spec = read_gguf(convert(get("dspark_spec"), gemma4_target, outfile=tmp_path / "s.gguf").output)
    assert spec.get("dflash.sample_from_anchor") is False  # speculators (EAGLE-3 style) default
    assert spec.get("dflash.target_layers") == [1, 3] and spec.get("dflash.block_size") == 8
    names = [t.name for t in spec.tensors]
    assert names[-1] == "d2t" and "t2d" not in names  # upstream writes d2t last
    t = {x.name: x for x in spec.tensors}
    assert t["d2t"].ggml_type == GGMLType.I64 and t["markov_w2.weight"].ne == (32, 512) and t["markov_w1.weight"].ne == (32, 916)
    assert t["output.weight"].ne == (64, 512) and t["conf_proj.weight"].ne == (96, 1)
    ids = spec.tensor_bytes(t["d2t"]).view("<i8")
    assert np.all(np.diff(ids) > 0) and ids.max() < 916  # absolute target ids
    assert read_drafter(spec.path).markov.rank == 32


def test_full_vocabulary_dspark_with_own_embeddings_keeps_its_head(tmp_path, gemma4_target):
    """Upstream drops a full-vocabulary lm_head; with the embeddings kept its file would tie the head to them."""
    src = make_speculators_dspark(tmp_path / "s", draft_vocab_size=None, aux_layer_ids=[1, 3], **G4)
    g = read_gguf(convert(src, gemma4_target, outfile=tmp_path / "s.gguf").output)
    names = {t.name for t in g.tensors}
    assert {"token_embd.weight", "output.weight"} <= names and "d2t" not in names
    assert validate(g.path).check("tied_head").status == "pass"


def test_sample_from_anchor_follows_the_config(tmp_path, gemma4_target):
    src = make_speculators_dspark(tmp_path / "s", draft_vocab_size=512, aux_layer_ids=[1, 3], sample_from_anchor=True, **G4)
    g = read_gguf(convert(src, gemma4_target, outfile=tmp_path / "s.gguf").output)
    assert g.get("dflash.sample_from_anchor") is True
    src = make_dspark_drafter(tmp_path / "z", sample_from_anchor=False, **G4)
    assert read_gguf(convert(src, gemma4_target, outfile=tmp_path / "z.gguf").output).get("dflash.sample_from_anchor") is False


def test_gemma4_dspark_keys_and_rope_freqs(built, gemma4_target, tmp_path):
    get, _ = built
    g = read_gguf(convert(get("gemma4_dspark"), gemma4_target, outfile=tmp_path / "g.gguf").output)
    assert g.get("dflash.attention.head_count_kv") == 1 and g.get("dflash.attention.key_length") == 32
    assert g.get("dflash.rope.dimension_count") == 32 and g.get("dflash.embedding_scale") == 8.0
    assert g.get("dflash.attention.scale") == 1.0 and g.get("dflash.hidden_activation") == "gelu_pytorch_tanh"
    assert _keys(g.path)[-5:] == ["dflash.embedding_scale", "dflash.attention.scale", "dflash.hidden_activation",
                                  "dflash.sample_from_anchor", "dflash.has_confidence_head"]
    t = {x.name: x for x in g.tensors}
    assert g.tensors[0].name == "rope_freqs.weight" and t["rope_freqs.weight"].ne == (16,)
    freqs = g.tensor_bytes(t["rope_freqs.weight"]).view("<f4")
    assert list(freqs[:4]) == [1.0] * 4 and np.all(freqs[4:] == np.float32(1e30))  # 0.25 of 32 dims rotate: 4 pairs
    assert "blk.0.attn_v.weight" not in t and t["blk.0.post_attention_norm.weight"].ne == (64,)
    assert t["blk.1.layer_output_scale.weight"].ne == (1,) and t["conf_proj.weight"].ne == (96, 1)
    assert t["token_embd.weight"].ne == (64, 916) and t["output.weight"].ne == (64, 916)
    r = validate(g.path)
    assert r.exit_code == 0 and r.check("tensors.inventory").status == "pass"  # shared K/V by design: no warning
    late = read_gguf(convert(get("gemma4_late"), gemma4_target, outfile=tmp_path / "l.gguf").output)
    assert _keys(late.path)[-9:-4] == ["dflash.attention.head_count_kv", "dflash.attention.key_length",
                                       "dflash.attention.value_length", "dflash.rope.dimension_count", "dflash.embedding_scale"]
    assert "rope_freqs.weight" not in {x.name for x in late.tensors}
    assert read_drafter(late.path).late_keys == ("head_count_kv", "key_length", "value_length", "rope_dimension_count",
                                                 "embedding_scale")


# --- refusals -----------------------------------------------------------------------------------

def _refused(src: Path, target: Path, phrase: str, tmp_path: Path) -> None:
    with pytest.raises(DFlashError, match=phrase):
        convert(src, target, outfile=tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


def test_refusals(tmp_path, gemma4_target):
    def d2(name: str, **kw: Any) -> Path:
        return make_dflash2_drafter(tmp_path / name, **{**G4, **kw})

    _refused(d2("lattice", selector_top_k=8), gemma4_target, "too small for the selector lattice", tmp_path)
    _refused(d2("group", conv_group_size=24), gemma4_target, "not divisible by dflash_config.conv_group_size 24", tmp_path)
    src = d2("norank")
    cfg = json.loads((src / "config.json").read_text())
    del cfg["dflash_config"]["selector_rank"]
    (src / "config.json").write_text(json.dumps(cfg))
    _refused(src, gemma4_target, "missing required key 'dflash_config.selector_rank'", tmp_path)
    src = d2("nokeys")
    cfg = json.loads((src / "config.json").read_text())
    for k in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
        del cfg["dflash_config"][k]
    (src / "config.json").write_text(json.dumps(cfg))
    _refused(src, gemma4_target, "missing conv/selector metadata", tmp_path)
    _refused(make_dspark_drafter(tmp_path / "gated", markov_head_type="gated", **G4), gemma4_target,
             "unsupported markov_head_type 'gated'", tmp_path)
    _refused(make_deepseek_v4_dspark(tmp_path / "dsv4"), gemma4_target, "convert_hf_to_gguf.py --dspark", tmp_path)
    _refused(make_gemma4_dspark_drafter(tmp_path / "kv", attention_k_eq_v=False), gemma4_target, "attention_k_eq_v", tmp_path)
    _refused(make_gemma4_dspark_drafter(tmp_path / "cap", final_logit_softcapping=30.0), gemma4_target,
             "final_logit_softcapping is not supported", tmp_path)
    _refused(make_gemma4_dspark_drafter(tmp_path / "swa", layer_types=["sliding_attention", "full_attention"]), gemma4_target,
             "uniform full attention", tmp_path)
    src = make_dspark_drafter(tmp_path / "dv", **G4)
    edit_config(src, draft_vocab_size=2000)
    _refused(src, gemma4_target, "draft_vocab_size 2000 exceeds vocab_size 916", tmp_path)
    r = run_cli("convert", make_deepseek_v4_dspark(tmp_path / "dsv4-cli"), "--target-model-dir", gemma4_target)
    assert r.returncode == 1 and "--dspark" in r.stderr and r.stderr.count("\n") == 1
    # check reads checkpoints through the same dispatcher: the same line names the member and why, never
    # "not a DFlash drafter"
    f32 = convert(make_dspark_drafter(tmp_path / "any", **G4), gemma4_target, outfile=tmp_path / "any.gguf", outtype="f32").output
    c = run_cli("check", f32, "--checkpoint", tmp_path / "dsv4-cli", "--target-model-dir", gemma4_target)
    assert c.returncode == 1 and c.stderr == r.stderr and "not a DFlash drafter" not in c.stderr


# --- quantize and inspect -------------------------------------------------------------------------

def test_quant_types_cover_the_family():
    ts = [("selector_hidden.weight", (256, 32)), ("selector_predecessor.weight", (32, 916)),
          ("markov_w1.weight", (256, 916)), ("conf_proj.weight", (288, 1)), ("conf_proj.bias", (1,)),
          ("blk.0.attn_conv_base", (256, 2, 2)), ("blk.0.attn_conv_proj.weight", (256, 64)), ("blk.0.attn_q.weight", (256, 256))]
    types = [c[0] for c in choose_quant_types(ts, "Q4_K_M", n_layer=1, n_head=4, n_head_kv=1)[1]]
    # codebooks and Markov tables take the default type (or its fallback), conv bases and 1-D conf_proj are kept
    assert types == ["Q4_K", "Q5_0", "Q4_K", "keep", "keep", "keep", "Q4_K", "Q4_K"]  # rows of 32: Q4_K -> Q5_0


def test_quantize_and_inspect_family_files(built, gemma4_target, tmp_path):
    get, _ = built
    src = convert(get("dflash2"), gemma4_target, outfile=tmp_path / "d2.gguf", outtype="bf16").output
    plan = quantize(src, tmp_path / "q.gguf", "Q4_K_M")
    t = {x.name: x.ggml_type.name for x in read_gguf(plan.output).tensors}
    assert t["blk.0.attn_conv_base"] == "F32" and t["selector_predecessor.weight"] == "Q5_0"
    assert validate(plan.output).exit_code == 0
    assert read_drafter(plan.output).hparams() == read_drafter(src).hparams()
    g = read_drafter(src)
    assert member_line(g).startswith("drafter: DFlash2 (llama.cpp runs it as --spec-type draft-dflash")
    assert "--spec-type draft-dflash --spec-draft-n-max 7" in pairing_hint(g)
    ds = read_drafter(convert(get("dspark"), gemma4_target, outfile=tmp_path / "ds.gguf").output)
    assert member_line(ds).startswith("drafter: DSpark (llama.cpp runs it as --spec-type draft-dspark: markov_w1.weight")
    assert "--spec-type draft-dspark --spec-draft-n-max 16" in pairing_hint(ds)  # samples from the anchor: every slot
    r = run_cli("inspect", ds.origin.path)
    assert r.returncode == 0 and "drafter: DSpark" in r.stdout and "--spec-type draft-dspark" in r.stdout


# --- validate: one broken file per load-time rule ----------------------------------------------------

E, SR, R, K, GRP = 32, 8, 8, 2, 16  # drafter_parts: hidden 32, 5 tokens, 2 layers


def dflash2_parts():
    kvs, ts = drafter_parts()
    kvs = [*kvs, kv("conv_kernel_size", K), kv("conv_group_size", GRP), kv("selector_rank", SR), kv("selector_top_k", 4)]
    ts = [*ts, tensor("selector_hidden.weight", (E, SR), GGMLType.F16), tensor("selector_predecessor.weight", (SR, 5), GGMLType.F16),
          tensor("selector_successor.weight", (SR, 5), GGMLType.F16)]
    for i in range(2):
        for part in ("attn", "ffn"):
            ts += [tensor(f"blk.{i}.{part}_conv_base", (E, K, 2)),
                   tensor(f"blk.{i}.{part}_conv_proj.weight", (E, 2 * K * E // GRP), GGMLType.F16)]
    return kvs, ts


def dspark_parts(conf: bool = True):
    kvs, ts = drafter_parts()
    kvs = [*kvs, kv("sample_from_anchor", True), kv("has_confidence_head", conf)]
    ts = [*ts, tensor("markov_w1.weight", (R, 5), GGMLType.F16), tensor("markov_w2.weight", (R, 5), GGMLType.F16)]
    if conf:
        ts += [tensor("conf_proj.weight", (E + R, 1), GGMLType.F16), tensor("conf_proj.bias", (1,))]
    return kvs, ts


def _own_vocab(parts):
    """A 3-token own vocabulary (d2t and the drafter's head) under an unchanged markov_w2 of 5 rows."""
    parts = set_tensor(parts, Tensor("d2t", (3,), GGMLType.I64, np.array([0, 2, 4], "<i8").tobytes()))
    return set_tensor(parts, tensor("output.weight", (E, 3), GGMLType.F16))


# name -> (parts, status of the family check, phrase in its message or details)
CATALOGUE: dict[str, tuple[Any, str, str]] = {
    "dflash2_ok": (dflash2_parts(), "pass", "DFlash2: conv kernel 2, group 16; selector rank 8, top-k 4"),
    "dspark_ok": (dspark_parts(), "pass", "DSpark: Markov head rank 8, with confidence head"),
    "classic_ok": (drafter_parts(), "pass", "DFlash: no DFlash2 or DSpark parts; llama.cpp runs it as --spec-type draft-dflash"),
    # DFlash2: the loader's three rules, the keys together, the tensors the selector claims
    "selector_lattice": (set_key(dflash2_parts(), kv("selector_top_k", 6)), "fail", "too small for the selector lattice"),
    "conv_group_divides": (set_key(dflash2_parts(), kv("conv_group_size", 12)), "fail",
                           "must be divisible by conv_group_size"),
    "selector_rank_missing": (drop_keys(dflash2_parts(), "dflash.selector_rank"), "fail", "missing conv/selector metadata"),
    "conv_keys_apart": (drop_keys(dflash2_parts(), "dflash.conv_group_size"), "fail", "come together"),
    "dflash2_block_size_missing": (drop_keys(dflash2_parts(), "dflash.block_size"), "fail", "dflash.block_size (the loader reads 0"),
    "conv_tensor_missing": (drop_tensors(dflash2_parts(), "blk.1.ffn_conv_proj.weight"), "fail",
                            "blk.1.ffn_conv_proj.weight is missing (required with selector_hidden.weight)"),
    "codebook_missing": (drop_tensors(dflash2_parts(), "selector_successor.weight"), "fail", "selector_successor.weight is missing"),
    "dflash2_without_selector": (drop_tensors(dflash2_parts(), "selector_hidden.weight"), "fail",
                                 "only with selector_hidden.weight"),
    "codebook_shape": (set_tensor(dflash2_parts(), tensor("selector_predecessor.weight", (SR, 4), GGMLType.F16)), "fail",
                       "selector_predecessor.weight has shape {8, 4}, llama.cpp expects {8, 5}"),
    "conv_proj_shape": (set_tensor(dflash2_parts(), tensor("blk.0.attn_conv_proj.weight", (E, 4), GGMLType.F16)), "fail",
                        "blk.0.attn_conv_proj.weight has shape {32, 4}, llama.cpp expects {32, 8}"),
    "conv_base_f16": (set_tensor(dflash2_parts(), tensor("blk.0.attn_conv_base", (E, K, 2), GGMLType.F16)), "fail",
                      "blk.0.attn_conv_base is F16, must be F32"),
    # DSpark: the Markov ranks, the confidence flag, the block size, the tensors markov_w1 claims
    "markov_rank_w2": (set_tensor(dspark_parts(), tensor("markov_w2.weight", (R + 4, 5), GGMLType.F16)), "fail",
                       "the Markov ranks disagree: markov_w1.weight has 8 columns, markov_w2.weight 12"),
    "markov_rank_conf": (set_tensor(dspark_parts(), tensor("conf_proj.weight", (E + R + 1, 1), GGMLType.F16)), "fail",
                         "conf_proj.weight takes 41 inputs, but hidden + Markov rank is 32 + 8 = 40"),
    "markov_w2_missing": (drop_tensors(dspark_parts(), "markov_w2.weight"), "fail", "markov_w2.weight is missing"),
    "markov_w1_missing": (drop_tensors(dspark_parts(), "markov_w1.weight"), "fail", "only with markov_w1.weight"),
    "markov_w1_vocab": (set_tensor(dspark_parts(), tensor("markov_w1.weight", (R, 4), GGMLType.F16)), "fail",
                        "markov_w1.weight has shape {8, 4}, llama.cpp expects {8, 5}"),
    "confidence_flag_true": (set_key(dspark_parts(conf=False), kv("has_confidence_head", True)), "fail",
                             "has_confidence_head is true but there is no conf_proj.weight"),
    "confidence_flag_false": (set_key(dspark_parts(), kv("has_confidence_head", False)), "fail",
                              "has_confidence_head is false but conf_proj.weight is present"),
    "confidence_flag_missing": (drop_keys(dspark_parts(conf=False), "dflash.has_confidence_head"), "warn",
                                "the driver assumes a confidence head when the key is missing"),
    "dspark_block_size_missing": (drop_keys(dspark_parts(), "dflash.block_size"), "fail",
                                  "DSpark draft requires 'dflash.block_size' in GGUF metadata"),
    "conf_bias_f16": (set_tensor(dspark_parts(), tensor("conf_proj.bias", (1,), GGMLType.F16)), "fail",
                      "conf_proj.bias is F16, must be F32"),
    "markov_w2_draft_vocab": (_own_vocab(dspark_parts()), "fail", "markov_w2.weight has shape {8, 5}, llama.cpp expects {8, 3}"),
    "dspark_keys_without_head": (set_key(drafter_parts(), kv("sample_from_anchor", False)), "warn",
                                 "without a Markov head: read only by draft-dspark"),
}


@pytest.mark.parametrize("case", sorted(CATALOGUE))
def test_validate_catalogue(tmp_path, case):
    parts, status, phrase = CATALOGUE[case]
    r = validate(write_parts(tmp_path / f"{case}.gguf", parts))
    c = r.check("family")
    text = " | ".join([c.message, *c.details])
    assert c.status == status, text
    assert phrase in text, text
    assert r.exit_code == (1 if status == "fail" else 0), [(x.id, x.status, x.message, x.details) for x in r.failures()]


def test_dspark_key_types_are_checked(tmp_path):
    r = validate(write_parts(tmp_path / "t.gguf", set_key(dspark_parts(), KV("dflash.sample_from_anchor", ValueType.UINT32, 1))))
    assert r.check("keys.types").status == "fail" and "dflash.sample_from_anchor is UINT32, llama.cpp expects BOOL" in " ".join(
        r.check("keys.types").details)


def test_key_names_come_from_the_tables():
    assert key("selector_top_k") == "dflash.selector_top_k" and key("has_confidence_head") == "dflash.has_confidence_head"
