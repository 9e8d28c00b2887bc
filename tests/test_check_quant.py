"""``check`` runs every type a drafter GGUF comes in: ours (``quantize``) and llama-quantize's.

A 256-aligned speculators drafter (own embedding and own d2t head, so no target weights are
needed) is converted to F16, then quantized to every type of ``QUANT_TYPES`` by our quantize and
by llama-quantize built from the 0.3.36 sdist (runtime tier). Each file is read with
``read_drafter``, run by the runner with our torch dequantizers, and must pass ``check`` against
the checkpoint at its precision class, with its matrices really stored in the type's ggml types
(no silent fallback hides a K-quant or IQ4 block from the runner).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dflash_convert import convert
from dflash_convert.check import check
from dflash_convert.errors import DFlashError
from dflash_convert.format.quant_types import FTYPES
from dflash_convert.quantize import QUANT_TYPES, quantize
from dflash_convert.runtime.diagnose import tensor_differences
from dflash_convert.sources.checkpoint import read_checkpoint
from dflash_convert.sources.dispatch import read_checkpoint_drafter
from dflash_convert.sources.gguf_drafter import read_drafter
from fixtures.drafters import make_speculators_drafter
from fixtures.targets import make_target_dir

SPEC = dict(layers=2, hidden=256, ffn=512, heads=4, kv_heads=2, head_dim=64, vocab_size=916, draft_vocab_size=512,
            mask_token_id=4, aux_layer_ids=[1, 3])
CTX = 12


@pytest.fixture(scope="module")
def f16(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(root, checkpoint, F16 GGUF)."""
    root = tmp_path_factory.mktemp("check-quant")
    target = make_target_dir(root / "gemma-256", "gemma4", hidden_size=256)
    src = make_speculators_drafter(root / "spec", dtype="bf16", **SPEC)
    out = convert(src, target, outfile=root / "spec-f16.gguf", outtype="f16").output
    return root, src, out


def _check_type(src: Path, path: Path, qtype: str) -> None:
    d = read_drafter(path)
    main_type = FTYPES[qtype][1].name
    assert main_type in {t.dtype for t in d.tensors if len(t.shape) == 2}, f"{qtype}: no matrix stored as {main_type}"
    rep = check(path, src, device="cpu", context=CTX)
    assert rep.file_type == qtype
    assert rep.passed, f"{qtype}:\n{rep.render_text()}"
    # the diagnosis a failing check would print stays silent on a right file of any type
    assert tensor_differences(d, read_checkpoint_drafter(read_checkpoint(src), None, keep_embeddings=True)) == []


@pytest.mark.parametrize("qtype", QUANT_TYPES)
def test_every_type_our_quantize_writes_passes_check(f16, qtype):
    root, src, f16_file = f16
    out = root / f"ours-{qtype}.gguf"
    try:
        quantize(f16_file, out, qtype)
    except DFlashError as e:  # refused as llama-quantize refuses it (tests/test_quantize.py): nothing to check
        assert "needs an importance matrix" in str(e), e
        pytest.skip(f"{qtype} needs an importance matrix on this drafter")
    _check_type(src, out, qtype)


@pytest.mark.runtime
@pytest.mark.parametrize("qtype", QUANT_TYPES)
def test_every_type_llama_quantize_writes_passes_check(f16, qtype):
    from fixtures.upstream import llama_tool

    root, src, f16_file = f16
    out = root / f"llama-{qtype}.gguf"
    r = subprocess.run([str(llama_tool("llama-quantize")), str(f16_file), str(out), qtype, "2"], capture_output=True, text=True)
    if r.returncode != 0 and "requires an importance matrix" in r.stdout + r.stderr:
        pytest.skip(f"llama-quantize needs an importance matrix for {qtype} on this drafter")
    assert r.returncode == 0, r.stderr[-2000:]
    _check_type(src, out, qtype)


def test_a_scaled_norm_cannot_hide_in_a_4_bit_file(f16):
    """The forward's Q4 gates are loose; the weight comparison is not: a norm x1.1 fails, named."""
    from drafter_gguf import read_parts, scale_tensor, write_parts

    from dflash_convert.format.tensors import layer_name
    from dflash_convert.runtime.weights import LAYER_ROLES

    root, src, f16_file = f16
    q4 = root / "scaled-Q4_K_M.gguf"
    quantize(f16_file, q4, "Q4_K_M")
    name = layer_name(1, LAYER_ROLES["ffn_norm"])
    broken = write_parts(root / "scaled-norm-Q4_K_M.gguf", scale_tensor(read_parts(q4), name, 1.1))
    rep = check(broken, src, device="cpu", context=CTX)
    assert not rep.passed
    assert [f for f in rep.failures if f.startswith("tensor differs:")] == [
        f for f in rep.failures if f.startswith(f"tensor differs: {name}: ") and "about 1.1 times the checkpoint's values" in f]
    assert any(f.startswith(f"tensor differs: {name}: ") for f in rep.failures)
