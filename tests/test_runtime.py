"""End to end: llama.cpp's own speculative decoder runs our drafter GGUF next to its target.

A tiny hybrid Qwen3.5 target (real 248320-token vocabulary, random weights) is converted once
with upstream's ``convert_hf_to_gguf.py``; tiny z-lab drafters that pair with it are converted
with *our* converter (f16, bf16, q8_0; with and without a sliding-window layer), and
``llama-speculative-simple --spec-type draft-dflash`` (built from the same llama.cpp tree) must
load both, exit 0 and draft tokens. With random weights acceptance is about 0: drafting at all
shows the file loads, pairs with the target (hidden size, vocabulary, tapped layers, mask token)
and runs through llama.cpp's dflash graph.

Choices that matter for this to run at all:

* ``target_layer_ids`` are HF ids; the GGUF stores ``id + 1`` and llama.cpp asks the target for
  the residual stream entering that layer. The qwen35 target graph publishes layer inputs
  ``0 .. n_layer-1`` only (src/models/qwen35.cpp), so with a 4-layer target the HF ids must be
  ``<= 2``; id 3 (GGUF 4 == n_layer) aborts with "layer input tensor is null" (format spec,
  pitfall 9).
* ``-t 1``: on 2 shared cores ggml's spinning thread barrier makes ``-t 2`` about 10x slower.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from dflash_convert import convert
from fixtures.drafters import make_speculators_drafter, make_zlab_drafter
from fixtures.targets import make_target_dir
from fixtures.upstream import llama_tool, run_upstream_convert

pytestmark = [pytest.mark.runtime, pytest.mark.slow]

VOCAB = 248320  # Qwen3.5 target vocabulary (text_config.vocab_size)
MASK_TOKEN_ID = 248077  # as in z-lab/Qwen3.5-4B-DFlash
TARGET_LAYER_IDS = [1, 2]  # HF ids; see the module docstring for why not 3
SLIDING_WINDOW = 4096
PROMPT = "The quick brown fox jumps over the lazy dog"
RUN_TIMEOUT_S = 180

SWA = {"swa_layers": [True, False], "sliding_window": SLIDING_WINDOW}

# name -> (zlab_config keywords beyond the pairing ones, outtype, llama.cpp's "file type" name,
#          where the tokenizer is borrowed from: the target's HF dir or its upstream GGUF)
VARIANTS = {
    "full-f16": ({}, "f16", "F16", "dir"),
    "swa-bf16": (SWA, "bf16", "BF16", "dir"),
    "swa-q8_0": (SWA, "q8_0", "Q8_0", "dir"),
    "full-q8_0-gguf-vocab": ({}, "q8_0", "Q8_0", "gguf"),
    # speculators format with its own 4096-token vocabulary: d2t (I64), own lm_head and embeddings
    "ownvocab-bf16": ({}, "bf16", "BF16", "dir"),
}
DRAFT_VOCAB = 4096

_RELEVANT = re.compile(r"n_draft|n_predict|n_drafted|n_accept|accept\s*=|encoded|decoded|error|failed|GGML_ASSERT|"
                       r"abort|exception|requires|dflash", re.IGNORECASE)


def _relevant(text: str, tail: int = 40) -> str:
    lines = text.splitlines()
    hits = [ln for ln in lines if _RELEVANT.search(ln)]
    return "\n".join(["--- relevant lines ---", *hits[-60:], f"--- last {tail} lines ---", *lines[-tail:]])


def _number(text: str, name: str) -> int | None:
    """The last ``NAME = <int>`` printed (llama-speculative-simple's final statistics)."""
    found = re.findall(rf"\b{re.escape(name)}\s*=\s*(\d+)", text)
    return int(found[-1]) if found else None


def _draft_info(text: str, field: str) -> str | None:
    """A ``print_info: FIELD = value`` line of the *draft* model (printed after the target's)."""
    _, sep, draft_part = text.partition("loading draft model")
    if not sep:
        return None
    m = re.search(rf"print_info: {re.escape(field)}\s*=\s*(.*?)\s*$", draft_part, re.MULTILINE)
    return m.group(1) if m else None


@pytest.fixture(scope="module")
def spec_tool() -> Path:
    return llama_tool("llama-speculative-simple")


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> tuple[Path, Path, int]:
    """(target dir, target GGUF converted by upstream, target hidden size), built once."""
    root = tmp_path_factory.mktemp("runtime-target")
    target_dir = make_target_dir(root / "target", "qwen35", with_weights=True)
    text = json.loads((target_dir / "config.json").read_text())["text_config"]
    assert text["vocab_size"] == VOCAB
    assert max(TARGET_LAYER_IDS) < text["num_hidden_layers"] - 1, "qwen35 publishes layer inputs 0..n_layer-1 only"
    gguf = root / "target-f16.gguf"
    r = run_upstream_convert(target_dir, gguf, outtype="f16", extra=["--no-mtp"])
    assert r.returncode == 0 and gguf.is_file(), (
        f"upstream convert_hf_to_gguf.py failed (rc={r.returncode}):\n{r.stderr[-4000:]}\n{r.stdout[-2000:]}")
    return target_dir, gguf, int(text["hidden_size"])


@pytest.fixture(scope="module")
def drafter_dirs(tmp_path_factory, target) -> dict[str, Path]:
    """One z-lab drafter checkpoint per shape ("full", "swa"), paired with the target."""
    _, _, hidden = target
    root = tmp_path_factory.mktemp("runtime-drafters")
    out = {}
    for shape, kw in (("full", {}), ("swa", SWA)):
        out[shape] = make_zlab_drafter(root / f"drafter-{shape}", hidden=hidden, target_layer_ids=TARGET_LAYER_IDS,
                                       num_target_layers=4, vocab_size=VOCAB, mask_token_id=MASK_TOKEN_ID,
                                       schema="nested", seed=1, **kw)
    out["ownvocab"] = make_speculators_drafter(root / "drafter-ownvocab", hidden=hidden, vocab_size=VOCAB,
                                               draft_vocab_size=DRAFT_VOCAB, mask_token_id=MASK_TOKEN_ID,
                                               aux_layer_ids=[i + 1 for i in TARGET_LAYER_IDS], block_size=16, seed=2)
    return out


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_speculative_simple_drafts_with_our_gguf(variant, target, drafter_dirs, spec_tool, tmp_path):
    config_kw, outtype, file_type, vocab_from = VARIANTS[variant]
    target_dir, target_gguf, _ = target
    draft_gguf = tmp_path / f"draft-{variant}.gguf"
    src = drafter_dirs[variant.split("-")[0]]
    if vocab_from == "dir":
        convert(src, target_dir, outfile=draft_gguf, outtype=outtype)
    else:
        convert(src, target_gguf=target_gguf, outfile=draft_gguf, outtype=outtype)

    cmd = [str(spec_tool), "-m", str(target_gguf), "-md", str(draft_gguf),
           "--spec-type", "draft-dflash", "--spec-draft-n-max", "15",
           "--temp", "0", "--top-k", "1", "-p", PROMPT, "-n", "32", "-c", "512",
           "-ngl", "0", "-ngld", "0", "-fit", "off", "-t", "1", "-lv", "4"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=RUN_TIMEOUT_S,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        pytest.fail(f"llama-speculative-simple timed out after {RUN_TIMEOUT_S}s\n{_relevant(out + err)}")
    output = r.stdout + "\n" + r.stderr
    info = f"command: {' '.join(cmd)}\n{_relevant(output)}"

    assert r.returncode == 0, f"llama-speculative-simple exited {r.returncode}\n{info}"
    n_drafted, n_accept = _number(output, "n_drafted"), _number(output, "n_accept")
    print(f"\n[{variant}] n_drafted={n_drafted} n_accept={n_accept}")
    assert n_drafted is not None, f"no n_drafted in the output\n{info}"
    assert n_drafted > 0, f"the dflash drafter drafted nothing\n{info}"

    # The draft really was our file, read as a dflash model with the keys we wrote.
    assert _draft_info(output, "arch") == "dflash", info
    assert _draft_info(output, "file type") == file_type, info
    assert _draft_info(output, "n_layer") == "2", info
    n_swa = _draft_info(output, "n_swa")
    assert n_swa == (str(SLIDING_WINDOW) if config_kw.get("swa_layers") else "0"), f"n_swa={n_swa}\n{info}"
    assert _draft_info(output, "MASK token") is not None and _draft_info(output, "MASK token").startswith(str(MASK_TOKEN_ID)), info
    if variant.startswith("ownvocab"):  # the file really carries its own vocabulary
        from dflash_convert.sources.gguf import read_gguf

        names = {t.name: t for t in read_gguf(draft_gguf).tensors}
        assert names["d2t"].ne == (DRAFT_VOCAB,) and names["output.weight"].ne == (hidden_of(target), DRAFT_VOCAB)
        assert "token_embd.weight" in names


def hidden_of(target) -> int:
    return target[2]
