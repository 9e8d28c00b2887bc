"""capture's inputs read as untrusted: the target directory through our own readers, the options bounded.

Each hostile target is a tiny real Qwen3 target (config, tokenizer, safetensors) with one thing
changed. What is proved, each as one ``dflash-convert: error:`` line with the README's exit code and
no output file:

* a ``model.safetensors.index.json`` naming a pickle (``pytorch_model.bin``, planted to create a
  file when unpickled) or a file outside the directory (``../../target/model.safetensors``) is
  refused by the hardened reader (exit 2): the pickle is never opened, and convert refuses the same;
* a config whose sizes the weights cannot fill is refused before a model is built (exit 2): a count
  of repeated modules past the bound (``num_hidden_layers: 1000000``), more layers than the weights
  number, a ``hidden_size`` other than the embedding's width, and (built on the meta device, no
  memory) more parameters than the weights' bytes hold;
* ``--new-tokens`` past its bound or past the target's context, ``--for`` with ``--layers``, a layer
  that does not exist: usage errors (64); a prompt whose sequence outgrows the target's
  ``max_position_embeddings``: exit 2 naming the prompts file and the prompt.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
from conftest import run_cli
from safetensors.torch import load_file, save_file

from dflash_convert.errors import InputFileError
from dflash_convert.sources.safetensors import read_header
from dflash_convert.sources.target import read_target_dir, read_target_weights
from fixtures.targets import make_target_dir


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(root, a qwen3 target with weights, a prompts file)."""
    root = tmp_path_factory.mktemp("capture-inputs")
    target = make_target_dir(root / "target", "qwen3", with_weights=True, seed=3)
    prompts = root / "prompts.txt"
    prompts.write_text("The quick brown fox\nIn 1901 the\n")
    return root, target, prompts


def _copy(world, tmp_path: Path, name: str = "t", **config) -> Path:
    """The target copied into ``tmp_path/name``, its config.json updated with ``config``."""
    out = tmp_path / name
    shutil.copytree(world[1], out)
    if config:
        cfg = json.loads((out / "config.json").read_text())
        cfg.update(config)
        (out / "config.json").write_text(json.dumps(cfg))
    return out


def _capture(target: Path, prompts: Path, out: Path, *extra: str):
    return run_cli("capture", "--target-model-dir", target, "--prompts", prompts, "-o", out, "--device", "cpu", "-q",
                   *extra)


def _one_line(r, code: int, *needles: str) -> str:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dflash-convert: error: "), r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def _names(path: Path) -> list[str]:
    return sorted(r.name for r in read_header(path)[0])


class _Planted:
    """Unpickling it opens (creates) ``marker``: proof that a pickle was loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


# --- the weights: the hardened reader, before transformers sees anything ---------------------------------


def test_a_weight_map_naming_a_pickle_is_refused_unopened(world, tmp_path):
    target = _copy(world, tmp_path)
    names = _names(target / "model.safetensors")
    marker = tmp_path / "unpickled"
    (target / "pytorch_model.bin").write_bytes(pickle.dumps(_Planted(marker)))
    index = {"weight_map": {n: "pytorch_model.bin" if n == names[0] else "model.safetensors" for n in names}}
    (target / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(InputFileError, match="names 'pytorch_model.bin', not a .safetensors file"):
        read_target_weights(read_target_dir(target))
    out = tmp_path / "f.safetensors"
    _one_line(_capture(target, world[2], out), 2, f"{target / 'model.safetensors.index.json'}: weight_map entry for",
              "'pytorch_model.bin', not a .safetensors file (pickle checkpoints are not read, for safety)")
    assert not out.exists() and not marker.exists()


def test_a_weight_map_entry_outside_the_directory_is_refused(world, tmp_path):
    """``../../target/model.safetensors`` from ``tmp/x/esc`` names ``tmp/target``: a real file, never read."""
    target = _copy(world, tmp_path, "target")
    esc = tmp_path / "x" / "esc"
    shutil.copytree(target, esc)
    (esc / "model.safetensors").unlink()
    names = _names(target / "model.safetensors")
    entry = "../../target/model.safetensors"
    assert (esc / entry).is_file()
    (esc / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: entry for n in names}}))
    out = tmp_path / "f.safetensors"
    _one_line(_capture(esc, world[2], out), 2, "is not a plain file name: '../../target/model.safetensors'")
    assert not out.exists()


# --- the config's sizes against the weights, before a model is built --------------------------------------


def test_a_layer_count_past_the_bound_is_refused(world, tmp_path):
    target = _copy(world, tmp_path, num_hidden_layers=1000000)
    out = tmp_path / "f.safetensors"
    _one_line(_capture(target, world[2], out), 2, f"{target / 'config.json'}: num_hidden_layers is 1000000, outside 0..1024")
    assert not out.exists()


def test_more_layers_than_the_weights_hold_is_refused(world, tmp_path):
    target = _copy(world, tmp_path, num_hidden_layers=8)
    with pytest.raises(InputFileError, match=r"num_hidden_layers is 8, but the target's safetensors hold at most 4 layers "
                                             r"\(no tensor has an index past 3\)"):
        read_target_weights(read_target_dir(target))
    only_embedding = _copy(world, tmp_path, "embedding-only")
    st = only_embedding / "model.safetensors"
    save_file({k: v for k, v in load_file(st).items() if k.endswith("embed_tokens.weight")}, str(st))
    with pytest.raises(InputFileError, match=r"hold at most 0 layers \(no tensor belongs to a numbered layer\)"):
        read_target_weights(read_target_dir(only_embedding))


def test_a_hidden_size_other_than_the_embedding_width_is_refused(world, tmp_path):
    target = _copy(world, tmp_path, hidden_size=4096)
    out = tmp_path / "f.safetensors"
    _one_line(_capture(target, world[2], out), 2, "hidden_size is 4096, but the embedding model.embed_tokens.weight has "
              "shape [151936, 64]")
    assert not out.exists()


@pytest.mark.slow  # imports transformers to build the model on the meta device (5-10 s)
def test_a_config_larger_than_its_weights_is_refused_before_loading(world, tmp_path):
    """intermediate_size 10**9 over 4 layers of 64: 768 billion parameters, no memory spent on them."""
    target = _copy(world, tmp_path, intermediate_size=10**9)
    out = tmp_path / "f.safetensors"
    _one_line(_capture(target, world[2], out), 2, f"{target}: config.json describes a Qwen3ForCausalLM of ",
              "parameters, but the safetensors hold", "the config does not fit its weights")
    assert not out.exists()


# --- the options and the prompts against the target -------------------------------------------------------


def test_new_tokens_past_the_bound_is_a_usage_error(world, tmp_path):
    out = tmp_path / "f.safetensors"
    _one_line(_capture(world[1], world[2], out, "--new-tokens", "1000000000"), 64,
              "--new-tokens must be 1..65536, got 1000000000")
    assert not out.exists()


def test_new_tokens_past_the_target_context_is_a_usage_error(world, tmp_path):
    target = _copy(world, tmp_path, max_position_embeddings=64)
    out = tmp_path / "f.safetensors"
    _one_line(_capture(target, world[2], out, "--new-tokens", "40"), 64, "--new-tokens 40:",
              "the target's context (max_position_embeddings) is 64: at most --new-tokens 30")
    assert not out.exists()


def test_a_prompt_past_the_target_context_is_refused(world, tmp_path):
    """A 100-token prompt for a 64-position target."""
    target = _copy(world, tmp_path, max_position_embeddings=64)
    prompts = tmp_path / "long.txt"
    prompts.write_text("a short one\n" + " ".join(["word"] * 100) + "\n")
    out = tmp_path / "f.safetensors"
    _one_line(_capture(target, prompts, out, "--new-tokens", "4"), 2, f"{prompts}: prompt 2 is 100 tokens",
              "needs 137 positions, the target's context (max_position_embeddings) is 64")
    assert not out.exists()


def test_for_with_layers_is_a_usage_error(world, tmp_path):
    """--for names the layers (the drafter's taps): --layers beside it, even 'all', contradicts it."""
    out = tmp_path / "f.safetensors"
    for layers in ("0", "all"):
        _one_line(_capture(world[1], world[2], out, "--for", tmp_path / "any.gguf", "--layers", layers), 64,
                  "--layers and --for both say which layers to store: give one of them")
    assert not out.exists()


def test_a_layer_that_does_not_exist_is_a_usage_error(world, tmp_path):
    out = tmp_path / "f.safetensors"
    _one_line(_capture(world[1], world[2], out, "--layers", "1,9"), 64, "--layers: layer input 9 does not exist")
    assert not out.exists()


def test_convert_refuses_the_same_weight_map(world, tmp_path):
    """The check lives in the one reader of weight maps: a drafter's index naming a pickle is refused too."""
    from fixtures.drafters import make_zlab_drafter

    drafter = make_zlab_drafter(tmp_path / "drafter", target_layer_ids=[0, 2])
    names = _names(drafter / "model.safetensors")
    index = {"weight_map": {n: "pytorch_model.bin" if n == names[0] else "model.safetensors" for n in names}}
    (drafter / "model.safetensors.index.json").write_text(json.dumps(index))
    out = tmp_path / "d.gguf"
    r = run_cli("convert", drafter, "--target-model-dir", world[1], "-o", out)
    _one_line(r, 2, "names 'pytorch_model.bin', not a .safetensors file")
    assert not out.exists()
