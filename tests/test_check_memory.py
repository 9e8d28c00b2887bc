"""``check``'s peak memory is bounded by the file, not by float copies of every weight.

A 16-layer drafter (50M values, a 102 MB F16 file) is checked in a child process; its peak RSS
after the imports (``ru_maxrss``, a high-water mark: no timing involved) may grow by the file's
size plus OVERHEAD (the 151936-token logits of both sides, one widened matrix, the allocator):
measured 290-325 MB. Before the bound (float32 runner weights, float64 reference weights, cached
float heads) the same check grew by 838 MB.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dflash_convert import convert
from dflash_convert.quantize import quantize
from fixtures.drafters import make_zlab_drafter

REPO = Path(__file__).resolve().parent.parent
LAYERS, FFN = 16, 16384  # 16 x 3 x 64 x 16384: 50M values in matrices of 1M, so the weights dwarf the noise
OVERHEAD = 320 << 20

CHILD = """
import json, resource, sys
import dflash_convert.check as c
from dflash_convert.runtime import check_io, compare, diagnose, forward, reference, weights  # noqa: F401 - imports first
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
rep = c.check(sys.argv[1], sys.argv[2], target_model_dir=sys.argv[3], device="cpu", context=7)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"passed": rep.passed, "base_kb": base, "peak_kb": peak}))
"""


def _target(root: Path, source: Path) -> Path:
    """The session's Qwen3 target with an embedding-only safetensors (the drafter's head is tied to it)."""
    out = root / "target"
    shutil.copytree(source, out)
    cfg = json.loads((out / "config.json").read_text())
    g = torch.Generator().manual_seed(7)
    emb = (torch.randn(cfg["vocab_size"], cfg["hidden_size"], generator=g) * 0.05).to(torch.bfloat16)
    save_file({"model.embed_tokens.weight": emb}, str(out / "model.safetensors"))
    return out


@pytest.mark.slow
def test_check_peak_memory_is_bounded_by_the_file(tmp_path, qwen3_target):
    src = make_zlab_drafter(tmp_path / "wide", target_layer_ids=[0, 2], layers=LAYERS, ffn=FFN)
    tgt = _target(tmp_path, qwen3_target)
    f32, f16 = tmp_path / "wide-f32.gguf", tmp_path / "wide-F16.gguf"
    convert(src, tgt, outfile=f32, outtype="f32")
    quantize(f32, f16, "F16")
    f32.unlink()  # not a sibling the check would run too
    r = subprocess.run([sys.executable, "-c", CHILD, str(f16), str(src), str(tgt)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["passed"]
    growth = (got["peak_kb"] - got["base_kb"]) * 1024
    size = f16.stat().st_size
    assert growth <= size + OVERHEAD, f"check grew by {growth / 2**20:.0f} MB for a {size / 2**20:.0f} MB file"
