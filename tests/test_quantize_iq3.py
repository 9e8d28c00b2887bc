"""The IQ3/Q2_K_S mixes with an importance matrix, and our IQ3 tensors, against the real ``llama-quantize --imatrix``.

Without an imatrix ``tests/test_quantize.py`` compares whole files (and both refuse the types that
need one). Here llama-quantize gets a legacy ``.dat`` importance matrix written by hand (``ncall`` 1,
so it uses the values as given) for every matrix of the held-out 256-aligned drafter: the type it
gives each tensor must be ``choose_quant_types(..., has_imatrix=True)``'s, and every tensor it stores
as IQ3_XXS or IQ3_S must be what our quantizer writes from the same values and importance (runtime tier).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from dflash_convert import convert
from dflash_convert.encoders import QUANTIZERS
from dflash_convert.format.ggml import GGMLType
from dflash_convert.format.quant_types import choose_quant_types, is_quantizable
from dflash_convert.sources.gguf_drafter import read_drafter
from fixtures.drafters import make_speculators_drafter
from fixtures.imatrix_files import write_legacy_imatrix
from fixtures.targets import make_target_dir

pytestmark = pytest.mark.runtime

# the held-out shapes of test_quantize.py's big drafter; 5 layers: IQ3_XS's ffn_gate/ffn_up rule (n/8 <= i < 7n/8)
# takes layers 0-3 and leaves layer 4
SPEC = dict(layers=5, hidden=256, ffn=512, heads=4, kv_heads=2, head_dim=64, vocab_size=916, draft_vocab_size=512,
            mask_token_id=4, aux_layer_ids=[1, 3])
TYPES = ("IQ3_XXS", "IQ3_XS", "IQ3_S", "IQ3_M", "Q2_K_S")


@pytest.fixture(scope="module")
def drafter(tmp_path_factory) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """(F16 GGUF, its imatrix .dat, the imatrix's values by tensor name)."""
    root = tmp_path_factory.mktemp("iq3-imatrix")
    target = make_target_dir(root / "gemma-256", "gemma4", hidden_size=256)
    f16 = convert(make_speculators_drafter(root / "big", dtype="f16", **SPEC), target, outfile=root / "big-f16.gguf",
                  outtype="f16").output
    rng = np.random.default_rng(30)
    entries = {t.name: np.exp(rng.uniform(-4, 3, int(t.shape[0]))).astype(np.float32)
               for t in GGUFReader(f16).tensors if is_quantizable(t.name, tuple(int(n) for n in t.shape))}
    dat = root / "imatrix.dat"
    write_legacy_imatrix(dat, entries)
    return f16, dat, entries


@pytest.mark.parametrize("qtype", TYPES)
def test_mix_and_iq3_bytes_with_an_imatrix(drafter, tmp_path, qtype):
    from fixtures.upstream import llama_tool

    f16, dat, entries = drafter
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
    ours = {name: t for (name, _), (t, _) in zip(tensors, choices, strict=True)}
    assert {n: t.tensor_type.name for n, t in out.items()} == ours
    compared = 0
    for name, t in out.items():
        if t.tensor_type.name not in ("IQ3_XXS", "IQ3_S"):
            continue
        x = np.asarray(src[name].data, dtype=np.float16).astype(np.float32).reshape(-1)
        mine = QUANTIZERS[GGMLType[t.tensor_type.name]](x, entries[name])
        assert mine.tobytes() == np.asarray(t.data).tobytes(), f"{qtype}: {name} ({t.tensor_type.name}) differs"
        compared += 1
    assert compared > 0 or not qtype.startswith("IQ3")  # every IQ3 file type stores some of its tensors in IQ3
