"""Parity tier: our output equals llama.cpp's own convert_hf_to_gguf.py output (0.3.36 sdist).

Same keys with the same value types and values in the same order, general.* included (the name,
size label and model-card keys); only our provenance keys are left out. Same tensor names, order,
shapes, ggml types and bytes. Upstream runs with its own gguf-py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gguf_compare import differences, parity_differences

from dflash_convert import convert
from dflash_convert.sources.gguf import read_gguf
from dflash_convert.sources.gguf_drafter import describe, read_drafter
from fixtures.drafters import make_zlab_drafter
from fixtures.model_cards import CARDS, write_model_card
from fixtures.targets import make_target_dir
from fixtures.upstream import run_upstream_convert

pytestmark = [pytest.mark.parity, pytest.mark.slow]

QWEN35 = dict(schema="nested", vocab_size=248320, mask_token_id=248077)
# name -> (target kind, target overrides, drafter builder kwargs, post-edit of dflash_config)
DRAFTERS = {
    "dense": ("qwen3", {}, dict(target_layer_ids=[0, 2]), None),
    "hybrid_swa": ("qwen35", {}, dict(QWEN35, swa_layers=[True, False], sliding_window=2048, target_layer_ids=[0, 2]), None),
    "sharded": ("qwen3", {}, dict(shards=2, target_layer_ids=[1, 2]), None),
    "prefixed": ("qwen3", {}, dict(prefix="model.", target_layer_ids=[0, 1]), None),
    "f16_q8_fallback": ("qwen3", {"hidden_size": 48}, dict(hidden=48, heads=3, kv_heads=1, dtype="f16"), None),
    "options": ("qwen3", {}, dict(dtype="f32", layers=3, target_layer_ids=[0, 1, 2]),
                {"causal": True, "attention_value_scale": 0.5, "input_embedding_scale": 2.0}),
    # other target families: the tokenizer route is the target's (gpt2/llama-bpe, gpt2/gpt-4o, gemma4)
    "llama31": ("llama31", {}, dict(vocab_size=128256, mask_token_id=128002), None),
    "gptoss": ("gptoss", {}, dict(vocab_size=201088, mask_token_id=200000), None),
    "gemma4": ("gemma4", {}, dict(vocab_size=916, mask_token_id=4), None),
}
CASES = [(d, t) for d in ("dense", "hybrid_swa") for t in ("f32", "f16", "bf16", "q8_0", "auto")]
CASES += [("sharded", "bf16"), ("sharded", "q8_0"), ("prefixed", "bf16"), ("f16_q8_fallback", "q8_0"),
          ("options", "f16"), ("options", "q8_0"), ("llama31", "bf16"), ("gptoss", "bf16"), ("gemma4", "bf16")]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("parity")
    cache: dict[str, tuple[Path, Path]] = {}

    def get(name: str) -> tuple[Path, Path]:
        if name not in cache:
            kind, overrides, kw, dflash_extra = DRAFTERS[name]
            target = make_target_dir(root / f"{name}-target", kind, **overrides)
            src = make_zlab_drafter(root / name, **kw)
            cfg = json.loads((src / "config.json").read_text())
            if name == "options":
                cfg["partial_rotary_factor"] = 0.5
            if dflash_extra:
                cfg["dflash_config"].update(dflash_extra)
            (src / "config.json").write_text(json.dumps(cfg, indent=2))
            cache[name] = (src, target)
        return cache[name]

    return get, root


@pytest.mark.parametrize("drafter,outtype", CASES, ids=[f"{d}-{t}" for d, t in CASES])
def test_equal_to_upstream(built, drafter, outtype):
    get, root = built
    src, target = get(drafter)
    ours, theirs = root / f"{drafter}-{outtype}-ours.gguf", root / f"{drafter}-{outtype}-upstream.gguf"
    convert(src, target, outfile=ours, outtype=outtype)
    r = run_upstream_convert(src, theirs, outtype=outtype, target_model_dir=target)
    assert r.returncode == 0, r.stderr[-3000:]
    diffs = parity_differences(ours, theirs)
    assert diffs == [], "\n".join(diffs)
    # upstream's file reads into the same Drafter as ours (every field, every tensor's name, shape, type)
    assert describe(read_drafter(theirs)) == describe(read_drafter(ours))
    g = read_gguf(ours)
    assert g.architecture == "dflash" and len(g.tensors) == len(read_gguf(theirs).tensors)
    if drafter == "options":
        assert g.get("dflash.attention.causal") is True and g.get("dflash.rope.dimension_count") == 8
    expected_vocab = {"llama31": ("gpt2", "llama-bpe"), "gptoss": ("gpt2", "gpt-4o"), "gemma4": ("gemma4", None)}
    if drafter in expected_vocab:
        assert (g.get("tokenizer.ggml.model"), g.get("tokenizer.ggml.pre")) == expected_vocab[drafter]
    if drafter == "f16_q8_fallback":
        types = {t.name: t.ggml_type.name for t in g.tensors}
        assert types["blk.0.attn_q.weight"] == "F16" and types["blk.0.ffn_down.weight"] == "Q8_0"


def test_target_gguf_tokenizer_equals_target_dir_tokenizer(tmp_path):
    """--target-gguf (upstream-converted target) and --target-model-dir give the same tokenizer keys."""
    target = make_target_dir(tmp_path / "target", "qwen3", with_weights=True, num_hidden_layers=2)
    target_gguf = tmp_path / "target.gguf"
    r = run_upstream_convert(target, target_gguf, outtype="f16")
    assert r.returncode == 0, r.stderr[-3000:]
    src = make_zlab_drafter(tmp_path / "draft", target_layer_ids=[0, 1])
    via_dir, via_gguf = tmp_path / "dir.gguf", tmp_path / "gguf.gguf"
    convert(src, target, outfile=via_dir, outtype="bf16")
    convert(src, target_gguf=target_gguf, outfile=via_gguf, outtype="bf16")
    assert differences(via_gguf, via_dir) == []
    tgt = read_gguf(target_gguf)
    tok = [k for k in tgt.metadata if k.startswith("tokenizer.")]
    drafted = read_gguf(via_gguf)
    for k in tok:
        assert drafted.metadata[k] == tgt.metadata[k], k
    assert drafted.get("tokenizer.ggml.mask_token_id") == 151669


# --- model cards: README.md front matter + generation_config.json -> general.* -------------------
# One upstream run per card shape, on the tiniest drafter; the last case adds a --metadata file.
OVERRIDE = {"general.name": "Overridden Drafter", "general.sampling.top_k": 40, "general.size_label": "1B",
            "general.tags": ["draft", "overridden"], "general.datasets": [],
            "general.base_models": [{"name": "Given Base", "repo_url": "https://example.org/base"}],
            "general.license": "apache-2.0"}  # upstream's --metadata does not set the license: kept "other"
CARD_CASES = [(shape, False) for shape in CARDS] + [("list_base", True)]
# what our file must say, key by key, whatever upstream does (None: the key is absent)
EXPECTED = {
    ("single_base", False): {"general.license": "mit", "general.base_model.count": 1,
                             "general.base_model.0.repo_url": "https://huggingface.co/Qwen/Qwen3-4B",
                             "general.tags": ["dflash", "speculative-decoding", "text-generation"],
                             "general.languages": ["en", "zh"], "general.sampling.top_k": 20,
                             "general.name": "Qwen3 4B DFlash B16", "general.basename": "Qwen3"},
    ("list_base", False): {"general.license": "other", "general.license.name": "qwen-research",
                           "general.base_model.count": 3, "general.base_model.1.name": "Qwen3 8B DFlash B16",
                           "general.base_model.2.version": "v2", "general.languages": ["en", "no", "fr"],
                           "general.dataset.count": 2, "general.dataset.0.organization": "HuggingFaceH4",
                           "general.tags": ["dflash", "draft"]},
    ("named", False): {"general.name": "Tiny DFlash Drafter", "general.author": "Someone", "general.version": "1.5",
                       "general.license": "apache-2.0,mit", "general.tags": ["dflash", "text-generation"]},
    ("no_front_matter", False): {"general.license": None, "general.tags": None, "general.sampling.temp": 0.6},
    ("not_a_mapping", False): {"general.license": None, "general.name": "Qwen3 4B DFlash B16"},
    ("list_base", True): {"general.name": "Overridden Drafter", "general.sampling.top_k": 40, "general.size_label": "1B",
                          "general.tags": ["draft", "overridden"], "general.dataset.count": 0,
                          "general.base_model.count": 1, "general.base_model.0.name": "Given Base",
                          "general.license": "other"},
}


@pytest.mark.parametrize("shape,override", CARD_CASES, ids=[f"{s}{'-metadata' if o else ''}" for s, o in CARD_CASES])
def test_model_card_equal_to_upstream(qwen3_target, tmp_path, shape, override):
    src = write_model_card(make_zlab_drafter(tmp_path / shape / "Qwen3-4B-DFlash-b16", target_layer_ids=[0, 2]), shape)
    metadata = None
    if override:
        metadata = tmp_path / "metadata.json"
        metadata.write_text(json.dumps(OVERRIDE))
    ours, theirs = tmp_path / "ours.gguf", tmp_path / "upstream.gguf"
    convert(src, qwen3_target, outfile=ours, outtype="bf16", metadata=metadata)
    r = run_upstream_convert(src, theirs, outtype="bf16", target_model_dir=qwen3_target,
                             extra=["--metadata", str(metadata)] if metadata else None)
    assert r.returncode == 0, r.stderr[-3000:]
    diffs = parity_differences(ours, theirs)
    assert diffs == [], "\n".join(diffs)
    g = read_gguf(ours)
    for k, want in EXPECTED[(shape, override)].items():
        got = g.get(k)
        if isinstance(want, float):
            assert got == pytest.approx(want), k
        else:
            assert got == want, k
    # upstream's size label from the parameter count (82K for this drafter), unless overridden
    assert g.get("general.size_label") == ("1B" if override else "82K")
    assert g.get("general.converter.name") == "dflash-convert"  # our provenance stays in the file


# the tokenizer cache must not change a byte: one case per tokenizer route (gpt2 with the probe, gemma4),
# each converted with a cold cache, then a warm one, then compared to upstream (the others run with
# whatever the user cache holds)
CACHE_CASES = [("dense", "bf16"), ("gemma4", "bf16")]


@pytest.mark.parametrize("drafter,outtype", CACHE_CASES, ids=[f"{d}-{t}" for d, t in CACHE_CASES])
def test_equal_to_upstream_with_a_cold_and_a_warm_cache(built, drafter, outtype, tmp_path):
    get, root = built
    src, target = get(drafter)
    cold, warm = tmp_path / "cold.gguf", tmp_path / "warm.gguf"
    assert convert(src, target, outfile=cold, outtype=outtype, cache=tmp_path / "cache").tokenizer_cache == "miss"
    assert convert(src, target, outfile=warm, outtype=outtype, cache=tmp_path / "cache").tokenizer_cache == "hit"
    assert warm.read_bytes() == cold.read_bytes()
    theirs = tmp_path / "upstream.gguf"
    r = run_upstream_convert(src, theirs, outtype=outtype, target_model_dir=target)
    assert r.returncode == 0, r.stderr[-3000:]
    diffs = parity_differences(warm, theirs)
    assert diffs == [], "\n".join(diffs)
