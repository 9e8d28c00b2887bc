"""read_drafter is the exact inverse of the writer: read_drafter(convert(checkpoint)) == the planned Drafter.

Every fixture shape x every outtype: all hyper-parameter fields compare equal, and the tensor
list (names, shapes, ggml types) equals the plan's. Upstream's files read into the same Drafter
(test_parity.py / test_zoo.py check that against llama.cpp's converter).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dflash_convert import plan_conversion
from dflash_convert.conversion import write_plan
from dflash_convert.errors import InputFileError
from dflash_convert.sources.gguf import read_gguf
from dflash_convert.sources.gguf_drafter import describe, drafter_from_gguf, read_drafter
from fixtures.drafters import add_tensors, edit_config, make_speculators_drafter, make_zlab_drafter, write_mask_embedding
from fixtures.targets import make_target_dir

OUTTYPES = ("f32", "f16", "bf16", "q8_0", "auto")
QWEN35 = dict(schema="nested", vocab_size=248320, mask_token_id=248077)


def _build(root: Path, shape: str, qwen3: Path, qwen35: Path, weighted: Path) -> tuple[Path, Path]:
    src = root / shape
    if shape == "dense":
        return make_zlab_drafter(src, target_layer_ids=[0, 2]), qwen3
    if shape == "hybrid_swa":
        return make_zlab_drafter(src, swa_layers=[True, False], sliding_window=2048, target_layer_ids=[0, 2], **QWEN35), qwen35
    if shape == "options":
        make_zlab_drafter(src, dtype="f32", layers=3, target_layer_ids=[0, 1, 2])
        edit_config(src, partial_rotary_factor=0.5, is_causal=False)
        return src, qwen3
    if shape == "f16_fallback":
        return make_zlab_drafter(src, hidden=48, heads=3, kv_heads=1, dtype="f16"), make_target_dir(root / "t48", "qwen3", hidden_size=48)
    if shape == "speculators":
        return make_speculators_drafter(src, draft_vocab_size=2048, aux_layer_ids=[1, 3]), qwen3
    if shape == "interleaved":
        return edit_config(make_zlab_drafter(src), rope_is_neox_style=False), qwen3
    if shape == "sinks":
        make_zlab_drafter(src)
        g = torch.Generator().manual_seed(5)
        add_tensors(src, {f"layers.{i}.self_attn.sinks": torch.randn(4, generator=g).to(torch.bfloat16) for i in range(2)})
        return src, qwen3
    if shape == "gelu":
        return edit_config(make_zlab_drafter(src), hidden_act="gelu_pytorch_tanh"), qwen3
    if shape == "mask_embedding":
        write_mask_embedding(make_zlab_drafter(src), 151669, 64)
        return src, weighted
    raise AssertionError(shape)


SHAPES = ("dense", "hybrid_swa", "options", "f16_fallback", "speculators", "interleaved", "sinks", "gelu", "mask_embedding")


@pytest.fixture(scope="module")
def fixtures_built(tmp_path_factory, qwen3_target, qwen35_target):
    root = tmp_path_factory.mktemp("roundtrip")
    weighted = make_target_dir(root / "weighted", "qwen3", with_weights=True, tie_word_embeddings=False)
    cache: dict[str, tuple[Path, Path]] = {}

    def get(shape: str) -> tuple[Path, Path]:
        if shape not in cache:
            cache[shape] = _build(root, shape, qwen3_target, qwen35_target, weighted)
        return cache[shape]

    return get, root


@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_read_drafter_inverts_convert(fixtures_built, shape, outtype):
    get, root = fixtures_built
    src, target = get(shape)
    out = root / f"{shape}-{outtype}.gguf"
    plan = plan_conversion(src, target, outfile=out, outtype=outtype)
    write_plan(plan, force=True, progress=False)
    back = read_drafter(out)
    assert back.hparams() == plan.drafter.hparams()
    planned = [(p.tensor.gguf_name, list(p.tensor.shape), p.ggml_type.name) for p in plan.tensors]
    assert describe(back)["tensors"] == planned
    # the values a GGUF source hands out are the bytes the writer wrote
    g = read_gguf(out)
    for t in back.tensors:
        rows = int(np.prod(t.shape[:-1])) if len(t.shape) > 1 else 1
        assert t.source.rows(0, rows).tobytes() == g.tensor_bytes(g.tensor(t.gguf_name)).tobytes()


def test_strict_reader_refuses_what_validate_would_fail(tmp_path, qwen3_target):
    from drafter_gguf import drafter_parts, write_parts

    keys, tensors = drafter_parts()
    keys = [k for k in keys if not k.key.endswith(".target_layers")]
    path = write_parts(tmp_path / "no-layers.gguf", (keys, tensors))
    with pytest.raises(InputFileError, match="target_layers missing"):
        read_drafter(path)
    lenient = drafter_from_gguf(read_gguf(path), strict=False)
    assert lenient.target_layers is None and lenient.n_layers is not None


def test_not_a_drafter(tmp_path):
    from drafter_gguf import drafter_parts, kv, write_parts

    keys, tensors = drafter_parts()
    keys = [kv("architecture", "llama") if k.key == "general.architecture" else k for k in keys]
    path = write_parts(tmp_path / "llama.gguf", (keys, tensors))
    with pytest.raises(InputFileError, match="not a DFlash drafter"):
        read_drafter(path)
