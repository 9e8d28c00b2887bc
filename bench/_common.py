"""The setup bench_check, bench_accept and bench_check_command share: the full-size bench drafter,
its target directory with a full-size embedding and head, and GGUFs of the drafter made by this tree.

The drafter is bench_convert's full-size synthetic one (the shapes of z-lab/Qwen3.6-27B-DFlash: 5
layers, hidden 5120, FFN 17408, 32:8 heads of 128, 5 taps, vocab 248320). Its target directory gets
full-size random BF16 ``embed_tokens`` and ``lm_head`` tensors (2 x 2.54 GB, generated once into the
cache) so every side reads a real embedding and head. GGUFs are made once per type with
``convert --outtype TYPE`` and cached, each with a stamp of what it was made from.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for _p in (str(REPO / "bench"), str(REPO)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from bench_convert import ensure_drafter, ensure_target, stamp_matches, write_synthetic_safetensors  # noqa: E402

from fixtures.cache import cache_root  # noqa: E402

HEADS_VERSION = "1"
EMBED = "model.language_model.embed_tokens.weight"  # Qwen3.5/3.6 names (untied, as the 27B ships)
HEAD = "lm_head.weight"
VOCAB, HIDDEN = 248320, 5120


def ensure_target_with_heads(root: Path) -> Path:
    """The bench target dir plus a model.safetensors holding only the embedding and the head."""
    out = root / "Qwen3.6-27B-target-heads"
    stamp = out / "bench-fixture.json"
    want = {"version": HEADS_VERSION, "tensors": [EMBED, HEAD], "shape": [VOCAB, HIDDEN]}
    if (out / "model.safetensors").is_file() and stamp_matches(stamp, want):
        return out
    print(f"generating {out} (2 x {VOCAB * HIDDEN * 2 / 1e9:.2f} GB, once) ...", flush=True)
    tmp = root / f".heads.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(ensure_target(root), tmp)
    write_synthetic_safetensors(tmp / "model.safetensors", [(EMBED, (VOCAB, HIDDEN), "matrix"),
                                                           (HEAD, (VOCAB, HIDDEN), "matrix")], seed=1)
    (tmp / "bench-fixture.json").write_text(json.dumps(want) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def ensure_gguf(root: Path, src: Path, target: Path, outtype: str) -> Path:
    """A GGUF of the bench drafter made by this tree, cached beside the checkpoint."""
    out = root / f"check-{outtype}.gguf"
    stamp = root / f"check-{outtype}.json"
    want = {"checkpoint_size": (src / "model.safetensors").stat().st_size, "outtype": outtype}
    if out.is_file() and stamp_matches(stamp, want):
        return out
    print(f"converting {src.name} -> {out.name} ...", flush=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dflash_convert.cli", "convert", str(src), "--target-model-dir", str(target),
                    "--outtype", outtype, "-o", str(out), "--force", "-q"], check=True, cwd=REPO)
    stamp.write_text(json.dumps(want) + "\n")
    print(f"  done in {time.perf_counter() - t0:.1f} s", flush=True)
    return out


@dataclass
class FullSize:
    """The cached full-size bench inputs: the checkpoint, its target dir with heads, one GGUF per type."""

    root: Path
    checkpoint: Path
    target: Path
    ggufs: dict[str, Path]


def full_size(types: list[str]) -> FullSize:
    """Make (once) and return the full-size drafter, its target with heads, and a GGUF of each type."""
    root = cache_root() / "bench"
    root.mkdir(parents=True, exist_ok=True)
    src = ensure_drafter(root)
    target = ensure_target_with_heads(root)
    return FullSize(root, src, target, {t: ensure_gguf(root, src, target, t) for t in types})


def type_list(text: str) -> list[str]:
    """--types F16,Q4_K_M -> ["F16", "Q4_K_M"]."""
    return [t for t in text.split(",") if t]
