"""Parity tier for the rest of the family: our DFlash2 / DSpark / Gemma-4 DSpark files equal llama.cpp's own.

Upstream's convert_hf_to_gguf.py (0.3.36 sdist, its own gguf-py) and ours convert the same tiny
checkpoints; keys, value types, values and order, tensor names, order, shapes, types and bytes must
be equal (general.* too, but for our provenance keys), and upstream's file reads into the same Drafter as ours. Every
member is covered for every outtype; the variants (no confidence head, Gemma-4 keys the config
lacks, a Qwen3.5 target with M-RoPE sections, a prefixed sharded DFlash2) once each. The tiny
synthetic Gemma-4 vocabulary (916 tokens) keeps the vocabulary-sized tensors small.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gguf_compare import parity_differences

from dflash_convert import convert
from dflash_convert.sources.gguf import read_gguf
from dflash_convert.sources.gguf_drafter import describe, read_drafter
from fixtures.family import make_dflash2_drafter, make_dspark_drafter, make_gemma4_dspark_drafter, make_speculators_dspark
from fixtures.targets import make_target_dir
from fixtures.upstream import run_upstream_convert

pytestmark = [pytest.mark.parity, pytest.mark.slow]

G4 = dict(vocab_size=916, mask_token_id=4)
OUTTYPES = ("f32", "f16", "bf16", "q8_0", "auto")


def _gemma4_late(src: Path) -> Path:
    make_gemma4_dspark_drafter(src, rope="default", confidence=False)
    cfg = json.loads((src / "config.json").read_text())
    del cfg["head_dim"], cfg["num_key_value_heads"]
    (src / "config.json").write_text(json.dumps(cfg, indent=2))
    return src


# name -> (target kind, builder)
MEMBERS = {
    "dflash2": ("gemma4", lambda p: make_dflash2_drafter(p, dtype="f32", **G4)),
    "dspark": ("gemma4", lambda p: make_dspark_drafter(p, **G4)),
    "dspark_spec": ("gemma4", lambda p: make_speculators_dspark(p, dtype="f16", draft_vocab_size=512, aux_layer_ids=[1, 3], **G4)),
    "gemma4_dspark": ("gemma4", lambda p: make_gemma4_dspark_drafter(p)),
    "dspark_noconf": ("gemma4", lambda p: make_dspark_drafter(p, architecture="LingDSparkModel", confidence=False, nested=False,
                                                              with_lm_head=False, **G4)),
    "gemma4_late": ("gemma4", _gemma4_late),
    "dflash2_qwen35": ("qwen35", lambda p: make_dflash2_drafter(p, prefix="model.", shards=2, logit_transforms=False)),
}
CASES = [(m, t) for m in ("dflash2", "dspark", "dspark_spec", "gemma4_dspark") for t in OUTTYPES]
CASES += [("dspark_noconf", "bf16"), ("gemma4_late", "q8_0"), ("dflash2_qwen35", "bf16")]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("family-parity")
    targets: dict[str, Path] = {}
    cache: dict[str, tuple[Path, Path]] = {}

    def get(name: str) -> tuple[Path, Path]:
        if name not in cache:
            kind, make = MEMBERS[name]
            if kind not in targets:
                targets[kind] = make_target_dir(root / f"target-{kind}", kind)
            cache[name] = (make(root / name), targets[kind])
        return cache[name]

    return get, root


@pytest.mark.parametrize("member,outtype", CASES, ids=[f"{m}-{t}" for m, t in CASES])
def test_equal_to_upstream(built, member, outtype):
    get, root = built
    src, target = get(member)
    ours, theirs = root / f"{member}-{outtype}-ours.gguf", root / f"{member}-{outtype}-upstream.gguf"
    convert(src, target, outfile=ours, outtype=outtype)
    r = run_upstream_convert(src, theirs, outtype=outtype, target_model_dir=target)
    assert r.returncode == 0, r.stderr[-3000:]
    diffs = parity_differences(ours, theirs)
    assert diffs == [], "\n".join(diffs)
    assert describe(read_drafter(theirs)) == describe(read_drafter(ours))
    g = read_gguf(ours)
    names = {t.name for t in g.tensors}
    if member.startswith("dflash2"):
        assert "selector_hidden.weight" in names and g.get("dflash.selector_top_k") == 4
    else:
        assert "markov_w1.weight" in names and g.get("dflash.sample_from_anchor") is (member != "dspark_spec")
    if member == "dflash2_qwen35":
        assert g.get("dflash.rope.dimension_sections") == [8, 0, 0, 0]  # M-RoPE target
