"""The IQ2/IQ1 mixes with an importance matrix, and our IQ2/IQ1 tensors, against the real ``llama-quantize --imatrix``.

As ``tests/test_quantize_iq3.py``: llama-quantize gets a hand-written legacy ``.dat`` importance matrix
(``ncall`` 1, values used as given) for every matrix of the held-out 256-aligned drafter; the type it
gives each tensor must be ``choose_quant_types(..., has_imatrix=True)``'s, and every tensor it stores
as IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S or IQ1_M must be byte for byte what our quantizer writes from the
same values and importance, and the file must pass ``check`` in our runtime (runtime tier). Without an
imatrix, both refuse every file type here.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from test_quantize_iq3 import SPEC, write_legacy_imatrix

from dflash_convert import convert
from dflash_convert.check import check
from dflash_convert.encoders import QUANTIZERS
from dflash_convert.errors import DFlashError
from dflash_convert.format.ggml import GGMLType
from dflash_convert.format.quant_types import TypeOverrides, choose_quant_types, is_quantizable
from dflash_convert.plan import QuantizeOptions
from dflash_convert.quantize import quantize
from dflash_convert.sources.gguf_drafter import read_drafter
from fixtures.drafters import make_speculators_drafter
from fixtures.targets import make_target_dir

pytestmark = pytest.mark.runtime

TYPES = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M")
OURS = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M")  # the ggml types this file's quantizers write


@pytest.fixture(scope="module")
def iq2_drafter(tmp_path_factory) -> tuple[Path, Path, dict[str, np.ndarray], Path]:
    """(F16 GGUF, its imatrix .dat, the imatrix's values by tensor name, the checkpoint)."""
    root = tmp_path_factory.mktemp("iq2-imatrix")
    target = make_target_dir(root / "gemma-256", "gemma4", hidden_size=256)
    ckpt = make_speculators_drafter(root / "big", dtype="f16", **SPEC)
    f16 = convert(ckpt, target, outfile=root / "big-f16.gguf", outtype="f16").output
    rng = np.random.default_rng(31)
    entries = {t.name: np.exp(rng.uniform(-4, 3, int(t.shape[0]))).astype(np.float32)
               for t in GGUFReader(f16).tensors if is_quantizable(t.name, tuple(int(n) for n in t.shape))}
    dat = root / "imatrix.dat"
    write_legacy_imatrix(dat, entries)
    return f16, dat, entries, ckpt


# llama-quantize builds IQ1's 2048-point neighbour tables in ~17 s on 2 cores, per run: IQ1_M (IQ1_S's mix rows
# and grid; its bytes are compared with ggml_quantize_chunk in test_codecs_iq2) is left to IQ1_S here
@pytest.mark.parametrize("qtype", [t for t in TYPES if t != "IQ1_M"])
def test_mix_and_iq2_bytes_with_an_imatrix(iq2_drafter, tmp_path, qtype):
    from fixtures.upstream import llama_tool

    f16, dat, entries, ckpt = iq2_drafter
    theirs = tmp_path / f"{qtype}.gguf"
    r = subprocess.run([str(llama_tool("llama-quantize")), "--imatrix", str(dat), str(f16), str(theirs), qtype, "2"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    src = {t.name: t for t in GGUFReader(f16).tensors}
    out = {t.name: t for t in GGUFReader(theirs).tensors}
    d = read_drafter(f16)
    tensors = [(name, tuple(int(n) for n in t.shape)) for name, t in src.items()]
    _, choices = choose_quant_types(tensors, qtype, input_types=[t.tensor_type.name for t in src.values()],
                                    n_layer=d.n_layers, n_head=d.n_head, n_head_kv=d.n_head_kv, has_imatrix=True)
    assert {n: t.tensor_type.name for n, t in out.items()} == {name: t for (name, _), (t, _) in zip(tensors, choices, strict=True)}
    compared = set()
    for name, t in out.items():
        if t.tensor_type.name not in OURS:
            continue
        x = np.asarray(src[name].data, dtype=np.float16).astype(np.float32).reshape(-1)
        mine = QUANTIZERS[GGMLType[t.tensor_type.name]](x, entries[name])
        assert mine.tobytes() == np.asarray(t.data).tobytes(), f"{qtype}: {name} ({t.tensor_type.name}) differs"
        compared.add(t.tensor_type.name)
    assert compared  # every one of these file types stores some tensors in an IQ2/IQ1 type
    rep = check(theirs, ckpt, device="cpu", context=12)  # our runtime reads llama.cpp's file and passes it (class Q1)
    assert rep.passed and rep.precision_class == "Q1", rep.render_text()


@pytest.mark.parametrize("qtype", TYPES)
def test_refused_without_an_imatrix_as_llama_quantize_refuses(iq2_drafter, tmp_path, qtype):
    from fixtures.upstream import llama_tool

    f16, _, _, _ = iq2_drafter
    r = subprocess.run([str(llama_tool("llama-quantize")), str(f16), str(tmp_path / "theirs.gguf"), qtype, "2"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "requires an importance matrix" in r.stdout + r.stderr
    with pytest.raises(DFlashError, match=f"{qtype} needs an importance matrix"):
        quantize(f16, tmp_path / "ours.gguf", qtype)
    assert not (tmp_path / "ours.gguf").exists()


def test_an_exempt_tensor_in_a_type_ggml_cannot_write_bare_is_refused(iq2_drafter, tmp_path):
    """token_embd is exempt from llama-quantize's refusal, so --token-embedding-type IQ2_XXS makes it abort in ggml; we refuse."""
    from fixtures.upstream import llama_tool

    f16, _, _, _ = iq2_drafter
    r = subprocess.run([str(llama_tool("llama-quantize")), "--token-embedding-type", "iq2_xxs", str(f16), str(tmp_path / "t.gguf"),
                        "Q4_K_M", "2"], capture_output=True, text=True)
    assert r.returncode != 0 and "GGML_ASSERT(imatrix != NULL)" in r.stdout + r.stderr
    with pytest.raises(DFlashError, match="token_embd.weight would be IQ2_XXS, which ggml cannot quantize without an importance"):
        quantize(f16, tmp_path / "ours.gguf", "Q4_K_M",
                 options=QuantizeOptions(types=TypeOverrides(token_embedding_type=GGMLType.IQ2_XXS)))
    assert not (tmp_path / "ours.gguf").exists()
