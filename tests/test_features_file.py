"""A features file is untrusted input: sources/features.py refuses what would give a wrong number.

Each test pins one class of bad file, written by capture's own writer from seeded values (no target
model runs) and spoiled in one way: non-finite layer inputs, token ids outside the vocabulary,
a prompt with no continuation, metadata counts that are not plain decimals, sizes that disagree
with the metadata, features of another target, ``check --features`` on a missing or misfitting
file, and an input that accepts nothing under ``--min-acceptance``. Each is one error line naming
the features file, with the README's exit code, from every command that reads features.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import cli_server
import numpy as np
import pytest
from conftest import run_cli

from dflash_convert import convert
from dflash_convert.accept import accept
from dflash_convert.check import check
from dflash_convert.errors import DFlashError, InputFileError
from dflash_convert.format.features import FEATURE_DTYPES, LOOKAHEAD, SCHEMA
from dflash_convert.quantize import quantize_for_acceptance, sweep
from dflash_convert.sources.features import config_sha256, read_features
from dflash_convert.write_features import FeatureWriter
from fixtures.drafters import make_zlab_drafter
from fixtures.targets import make_target_dir

TAPS = [0, 2]  # z-lab target_layer_ids: llama.cpp target_layers [1, 3]
LAYERS = [0, 1, 2, 3, 4]
VOCAB = 151936  # the qwen3 fixture target's


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(root, target, drafter checkpoint, its F32 GGUF, a second target: the same weights, another config.json)."""
    root = tmp_path_factory.mktemp("features-file")
    target = make_target_dir(root / "target", "qwen3", with_weights=True, seed=5)
    ckpt = make_zlab_drafter(root / "drafter", target_layer_ids=TAPS, seed=1)
    gguf = convert(ckpt, target, outfile=root / "drafter-f32.gguf", outtype="f32").output
    other = Path(shutil.copytree(target, root / "other-target"))
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "rope_theta": cfg.get("rope_theta", 10000.0) * 2}))
    return root, target, ckpt, gguf, other


def features(world, name: str, *, meta: dict[str, str] | None = None, prompts=(5, 7, 3), new_tokens: int = 4,
             continuation: int | None = None, tokens=None, layer_inputs=None, hidden: int | None = None) -> Path:
    """A features file of the documented schema for ``world``'s target (capture's writer, seeded values),
    with one thing changed: metadata keys, the continuation's length, the tokens or the layer inputs."""
    root, target = world[0], world[1]
    rng = np.random.default_rng(9)
    cont = new_tokens + LOOKAHEAD if continuation is None else continuation
    lengths = [p + cont for p in prompts]
    width = hidden or json.loads((target / "config.json").read_text())["hidden_size"]
    m = {"schema": SCHEMA, "target": str(target.resolve()), "target_config_sha256": config_sha256(target),
         "target_architecture": "Qwen3ForCausalLM", "layers": json.dumps(LAYERS), "dtype": "F32",
         "prompts_sha256": "0" * 64, "sequences": str(len(lengths)), "new_tokens": str(new_tokens), "eos_ids": "[]",
         **(meta or {})}
    w = FeatureWriter(root / name, lengths, len(LAYERS), width, FEATURE_DTYPES["f32"], m)
    for i, (n, p) in enumerate(zip(lengths, prompts, strict=True)):
        ids = rng.integers(0, 1000, n)
        x = rng.standard_normal((len(LAYERS), n, width)).astype(np.float32)
        w.write(i, tokens(i, ids) if tokens else ids, p, layer_inputs(i, x) if layer_inputs else x)
    return w.commit()


def one_line(r, code: int, *parts: str) -> str:
    """The single error line of a finished command, checked for its exit code and what it must say."""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == code and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("dflash-convert: error: ") and all(p in lines[0] for p in parts), lines[0]
    assert "please report it" not in lines[0]
    return lines[0]


def test_a_good_file_reads_with_typed_counts(world):
    f = features(world, "good.safetensors")
    got = read_features(f)
    assert (got.new_tokens, len(got.sequences), got.target) == (4, 3, str(world[1].resolve()))
    assert [s.prompt_length for s in got.sequences] == [5, 7, 3] and 0 <= got.max_token < 1000


def test_non_finite_layer_inputs_give_no_number(world, tmp_path):
    """NaN or Inf in a tapped layer: accept, sweep, --min-acceptance and check --features refuse, naming the file."""
    _, target, ckpt, gguf, _ = world

    def spoil(value):
        def edit(i, x):
            x[1, 2, 3] = value  # slot 1 = target layer 1, which the drafter taps
            return x
        return edit

    nan = features(world, "nan.safetensors", layer_inputs=spoil(np.nan))
    inf = features(world, "inf.safetensors", layer_inputs=spoil(np.inf))
    one_line(run_cli("accept", gguf, "--features", nan, "--device", "cpu"), 2, str(nan), "non-finite value (nan)")
    with pytest.raises(InputFileError, match="non-finite value") as e:
        sweep(gguf, inf, ["Q8_0"], device="cpu")
    assert e.value.path == str(inf)
    out = tmp_path / "chosen.gguf"
    with pytest.raises(InputFileError, match="non-finite value"):
        quantize_for_acceptance(gguf, out, "Q4_K_M", inf, 0.9, device="cpu")
    assert not out.exists()
    with pytest.raises(InputFileError, match="non-finite value"):
        check(gguf, ckpt, target_model_dir=target, features=str(nan), device="cpu", context=4)


def test_token_ids_outside_the_vocabulary_are_refused(world):
    """An id at or past the vocabulary, or negative: exit 2 naming the features file, in accept and sweep alike."""
    gguf = world[3]
    big = features(world, "oov.safetensors", tokens=lambda i, t: np.where(np.arange(len(t)) == 2, VOCAB, t))
    neg = features(world, "negative.safetensors", tokens=lambda i, t: np.where(np.arange(len(t)) == 2, -3, t))
    one_line(run_cli("accept", gguf, "--features", big, "--device", "cpu"), 2, str(big),
             f"token id {VOCAB} is outside the vocabulary of {VOCAB} tokens")
    for cmd in (["accept", gguf], ["sweep", gguf, "--types", "Q8_0"]):
        one_line(run_cli(*cmd, "--features", neg, "--device", "cpu"), 2, str(neg), "sequence 0: token id -3 is negative")


def test_a_prompt_must_leave_a_continuation(world):
    f = features(world, "no-continuation.safetensors", continuation=0)
    one_line(run_cli("accept", world[3], "--features", f, "--device", "cpu"), 2, str(f),
             "sequence 0: prompt_length 5 is not in 1..4")


@pytest.mark.parametrize("key,value", [("sequences", "\u00b2"), ("sequences", "3.0"), ("sequences", "-3"),
                                       ("sequences", " 3"), ("sequences", "0"), ("new_tokens", "abc"),
                                       ("new_tokens", "\u0664"), ("new_tokens", "0"), ("new_tokens", "1" * 12)])
def test_metadata_counts_are_plain_decimal_integers(world, key, value):
    f = features(world, f"count-{key}-{value.encode().hex()}.safetensors", meta={key: value})
    with pytest.raises(InputFileError, match=f"metadata '{key}' must be a decimal integer") as e:
        read_features(f)
    assert e.value.path == str(f)
    if value == "\u00b2":  # passes str.isdigit, fails int(): once an internal error
        one_line(run_cli("accept", world[3], "--features", f, "--device", "cpu"), 2, str(f), repr(value))


def test_sizes_must_agree_with_the_metadata(world):
    """A continuation longer than capture writes for new_tokens (accept would run on), or shorter than the
    loop reads (an internal error once): one line before any measuring. One that stops at an
    end-of-generation token may be short."""
    gguf = world[3]
    long = features(world, "long.safetensors", continuation=4000)
    one_line(run_cli("accept", gguf, "--features", long, "--device", "cpu"), 2, str(long),
             f"the continuation holds 4000 tokens, more than the 4 + {LOOKAHEAD}")
    short = features(world, "short.safetensors", meta={"new_tokens": "30"})
    one_line(run_cli("accept", gguf, "--features", short, "--device", "cpu"), 2, str(short),
             "sequence 0: the continuation holds 37 tokens, fewer than the 46 that -n 30 (metadata 'new_tokens') verifies")
    eos = features(world, "eos.safetensors", continuation=3, meta={"eos_ids": "[7]"},
                   tokens=lambda i, t: np.where(np.arange(len(t)) == len(t) - 1, 7, t))
    rep = accept([gguf], eos, device="cpu")
    assert rep.new_tokens == 4 and rep.results[0].loop.steps >= 3


def test_features_of_another_target_are_refused_unless_allowed(world, tmp_path):
    root, target, ckpt, gguf, other = world
    f = features(world, "good-target.safetensors")
    line = one_line(run_cli("accept", gguf, "--features", f, "--target-model-dir", other, "--device", "cpu"), 2, str(f),
                    "captured from another target", "--allow-other-target")
    assert str(other) in line
    r = run_cli("accept", gguf, "--features", f, "--target-model-dir", other, "--device", "cpu", "--allow-other-target")
    assert r.returncode == 0, r.stderr
    for call in (lambda: sweep(gguf, f, ["Q8_0"], target_model_dir=other, device="cpu"),
                 lambda: quantize_for_acceptance(gguf, tmp_path / "x.gguf", "Q4_K_M", f, 0.9, target_model_dir=other),
                 lambda: check(gguf, ckpt, target_model_dir=other, features=str(f), device="cpu")):
        with pytest.raises(InputFileError, match="captured from another target"):
            call()
    # the recorded target changed since the capture: the same refusal, with no target named
    moved = features(world, "recorded-other.safetensors", meta={"target": str(other.resolve())})
    one_line(run_cli("accept", gguf, "--features", moved, "--device", "cpu"), 2, str(moved), "changed since the capture",
             "--allow-other-target")
    # a relative recorded target names nothing certain: another directory's ./target is not used
    rel = features(world, "relative.safetensors", meta={"target": "target"})
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(other, elsewhere / "target")
    r = cli_server.run("accept", gguf, "--features", rel, "--device", "cpu", cwd=elsewhere)
    one_line(r, 2, f"{rel}: the target it was captured from is recorded as 'target', not an absolute path")
    r = cli_server.run("accept", gguf, "--features", rel, "--device", "cpu", "--target-model-dir", target, cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    # a recorded target that cannot be read names the features file
    root_target = features(world, "root-target.safetensors", meta={"target": "/"})
    one_line(run_cli("accept", gguf, "--features", root_target, "--device", "cpu"), 2, f"{root_target}: the target it "
             "was captured from, '/', cannot be read", "--target-model-dir")


def test_check_features_file_errors_are_one_line(world):
    root, target, ckpt, gguf, _ = world
    missing = root / "missing.safetensors"
    one_line(run_cli("check", gguf, "--checkpoint", ckpt, "--target-model-dir", target, "--features", missing), 2,
             f"{missing}: no such features file")
    wide = features(world, "wide.safetensors", hidden=48)
    one_line(run_cli("check", gguf, "--checkpoint", ckpt, "--target-model-dir", target, "--features", wide), 2,
             f"{wide}: the captured features are 48 wide")
    one_line(run_cli("check", gguf, "--checkpoint", ckpt, "--features", wide), 2, f"{wide}: the captured features are 48 wide")


def test_an_input_that_accepts_nothing_chooses_nothing(world, tmp_path):
    """Random tokens: the input drafter accepts none, so no mix can be chosen by acceptance (exit 1, nothing written)."""
    gguf = world[3]
    f = features(world, "random.safetensors")
    assert accept([gguf], f, device="cpu").results[0].loop.n_accept == 0  # the premise
    out = tmp_path / "chosen.gguf"
    one_line(run_cli("quantize", gguf, out, "Q4_K_M", "--features", f, "--min-acceptance", "0.9", "--device", "cpu"), 1,
             "nothing can be chosen by acceptance when the reference accepts nothing")
    assert not out.exists()
    with pytest.raises(DFlashError, match="accepts no drafted token"):
        quantize_for_acceptance(gguf, out, "Q4_K_M", f, 0.9, device="cpu")
