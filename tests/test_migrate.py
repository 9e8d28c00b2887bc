"""Other forks' DFlash files: recognised by validate, rewritten by migrate into upstream dflash.

The foreign files are made from a good upstream drafter by applying each dialect's documented
differences (format/dialects.py, from the forks' own converters and loaders): a migrated file must
come back with the original's keys, tensor names and order, and byte-identical tensor data.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_cli
from drafter_gguf import KV, Parts, drafter_parts, drop_keys, get_key, read_parts, set_tensor, tensor, write_parts

from dflash_convert.errors import DFlashError, InputFileError
from dflash_convert.format.keys import ValueType
from dflash_convert.migrate import migrate
from dflash_convert.sources.gguf import read_gguf
from dflash_convert.validate import validate

U32, I32, BOOL, ARR, STR = ValueType.UINT32, ValueType.INT32, ValueType.BOOL, ValueType.ARRAY, ValueType.STRING
IDS = [1, 3]  # upstream target_layers of drafter_parts(); checkpoint ids are [0, 2]


def _dialect(parts: Parts, arch: str, *, ids_key: str | None, ids: list[int] | None, extra: list[KV],
             tensor_names: dict[str, str], keep_tokenizer_mask: bool = False, mask_key: str | None = None) -> Parts:
    kvs, ts = parts
    out = []
    for k in kvs:
        if k.key == "general.architecture":
            out.append(KV(k.key, STR, arch))
        elif k.key == "dflash.target_layers":
            if ids_key is not None:
                out.append(KV(ids_key, ARR, ids, I32))
        elif k.key == "tokenizer.ggml.mask_token_id" and not keep_tokenizer_mask:
            if mask_key is not None:
                out.append(KV(mask_key, U32, k.value))
        elif k.key == "dflash.block_size" and arch != "dflash":
            out.append(KV(f"{arch}.dflash.block_size", U32, k.value))
        elif k.key.startswith("dflash.") and arch != "dflash":
            out.append(KV(arch + k.key[len("dflash"):], k.vtype, k.value, k.sub))
        else:
            out.append(k)
    new_ts = []
    for t in ts:
        name = t.name
        for old, new in tensor_names.items():
            if "{bid}" in old:
                for i in range(8):
                    if name == old.format(bid=i):
                        name = new.format(bid=i)
            elif name == old:
                name = new
        new_ts.append(type(t)(name, t.ne, t.gtype, t.data))
    return out + extra, new_ts


def buun(parts: Parts | None = None) -> Parts:
    """spiritbuun's dflash-draft: checkpoint ids, dflash_* tensors, post_attention_norm as the pre-FFN norm."""
    parts = parts or drafter_parts()
    return _dialect(parts, "dflash-draft", ids_key="dflash-draft.dflash.target_layer_ids", ids=[i - 1 for i in IDS],
                    mask_key="dflash-draft.dflash.mask_token_id",
                    extra=[KV("dflash-draft.dflash.n_target_features", U32, 64), KV("dflash-draft.attention.causal", BOOL, False),
                           KV("dflash-draft.rope.dimension_count", U32, 16)],
                    tensor_names={"fc.weight": "dflash_fc.weight", "enc.output_norm.weight": "dflash_hidden_norm.weight",
                                  "blk.{bid}.ffn_norm.weight": "blk.{bid}.post_attention_norm.weight"})


def lucebox(ids: list[int] | None = (0, 2)) -> Parts:
    extra = [KV("qwen35-dflash-draft.dflash.n_target_layers", U32, 2)]
    return _dialect(drafter_parts(), "qwen35-dflash-draft", ids_key=None if ids is None else "qwen35-dflash-draft.dflash.target_layer_ids",
                    ids=None if ids is None else list(ids), extra=extra,
                    tensor_names={"fc.weight": "dflash.fc.weight", "enc.output_norm.weight": "dflash.hidden_norm.weight"})


def pre_merge() -> Parts:
    return _dialect(drafter_parts(), "dflash", ids_key="dflash.target_layer_ids", ids=[0, 2], extra=[], tensor_names={},
                    keep_tokenizer_mask=True)


def _same_as_original(out: Path, extra_keys: set[str] = frozenset()) -> None:
    """Same keys and values as the upstream original (plus extra_keys), same tensors, same bytes."""
    orig = read_gguf(write_parts(out.with_name(out.stem + "-original.gguf"), drafter_parts()))
    got = read_gguf(out)
    assert [t.name for t in got.tensors] == [t.name for t in orig.tensors]
    for t, o in zip(got.tensors, orig.tensors, strict=True):
        assert (t.ne, t.ggml_type) == (o.ne, o.ggml_type), t.name
        assert got.tensor_bytes(t).tobytes() == orig.tensor_bytes(o).tobytes(), t.name
    assert set(got.metadata) == set(orig.metadata) | set(extra_keys)
    for k, v in orig.metadata.items():
        assert got.metadata[k] == v, k


def test_buun_is_recognised_and_named(tmp_path):
    src = write_parts(tmp_path / "buun.gguf", buun())
    r = validate(src)
    assert r.exit_code == 1 and r.dialect == "buun-dflash-draft"
    msg = r.check("dialect").message
    assert "'dflash-draft'" in msg and "will not load it" in msg and "upstream's minus 1" in msg and "dflash-convert migrate" in msg
    assert {c.status for c in r.checks[2:]} == {"skip"}


def test_buun_migrates_to_the_original(tmp_path):
    src = write_parts(tmp_path / "buun.gguf", buun())
    before = src.read_bytes()
    result = migrate(src, tmp_path / "up.gguf")
    assert result.report.exit_code == 0, [(c.id, c.details) for c in result.report.failures()]
    assert result.plan.target_layers == IDS
    assert any("+ 1 (buun's converter writes" in n for n in result.plan.notes)
    _same_as_original(result.output, {"dflash.attention.causal", "dflash.rope.dimension_count"})
    assert src.read_bytes() == before  # the input is never touched


def test_buun_cli(tmp_path):
    src = write_parts(tmp_path / "buun.gguf", buun())
    out = tmp_path / "up.gguf"
    r = run_cli("migrate", src, out)
    assert r.returncode == 0, r.stderr
    assert "buun-dflash-draft -> dflash" in r.stdout and "target_layers [1, 3] = dflash-draft.dflash.target_layer_ids [0, 2] + 1" in r.stdout
    assert "dflash_fc.weight -> fc.weight" in r.stdout and "validate: PASS" in r.stdout
    assert run_cli("validate", out).returncode == 0
    # never over an existing file without --force, never over the input
    r = run_cli("migrate", src, out)
    assert r.returncode == 1 and "--force" in r.stderr and r.stderr.count("\n") == 1
    assert run_cli("migrate", src, out, "--force").returncode == 0
    r = run_cli("migrate", src, src, "--force")
    assert r.returncode == 1 and "overwrite an input" in r.stderr
    # a contradicting offset is refused, not applied
    r = run_cli("migrate", src, tmp_path / "o.gguf", "--target-layers-offset", "0")
    assert r.returncode == 1 and "contradicts the buun-dflash-draft dialect" in r.stderr
    assert not (tmp_path / "o.gguf").exists()


def test_lucebox_needs_an_explicit_offset(tmp_path):
    src = write_parts(tmp_path / "luce.gguf", lucebox())
    assert "do not say which convention" in validate(src).check("dialect").message
    r = run_cli("migrate", src, tmp_path / "o.gguf", "--mask-token-id", "4")
    assert r.returncode == 1 and "--target-layers-offset 1 or 0" in r.stderr and "cannot tell" in r.stderr
    assert not (tmp_path / "o.gguf").exists()
    result = migrate(src, tmp_path / "o.gguf", target_layers_offset=1, mask_token_id=4)
    assert result.report.exit_code == 0 and result.plan.target_layers == IDS
    _same_as_original(result.output)


def test_lucebox_without_ids_or_mask(tmp_path):
    src = write_parts(tmp_path / "luce.gguf", lucebox(ids=None))
    with pytest.raises(DFlashError, match="holds no target layer ids; pass --target-layers"):
        migrate(src, tmp_path / "o.gguf", mask_token_id=4)
    with pytest.raises(DFlashError, match="no mask token id; pass --mask-token-id"):
        migrate(src, tmp_path / "o.gguf", target_layers=IDS)
    r = run_cli("migrate", src, tmp_path / "o.gguf", "--target-layers", "1,3", "--mask-token-id", "4")
    assert r.returncode == 0, r.stderr
    _same_as_original(tmp_path / "o.gguf")


def test_pre_merge_upstream_file(tmp_path):
    src = write_parts(tmp_path / "old.gguf", pre_merge())
    r = validate(src)
    assert r.dialect == "pre-merge-dflash" and r.check("target_layers").status == "fail"
    assert "dflash.target_layer_ids is not a key llama.cpp reads" in " ".join(r.check("keys.types").details)
    with pytest.raises(DFlashError, match="cannot tell"):
        migrate(src, tmp_path / "o.gguf")
    result = migrate(src, tmp_path / "o.gguf", target_layers_offset=1)
    assert result.report.exit_code == 0
    _same_as_original(result.output)
    # offset 0 is the user's explicit call: written as given, and validate still passes
    assert migrate(src, tmp_path / "o0.gguf", target_layers_offset=0).plan.target_layers == [0, 2]


def test_missing_vocabulary_needs_a_target_gguf(tmp_path):
    kvs, ts = buun()
    src = write_parts(tmp_path / "novocab.gguf", ([k for k in kvs if not k.key.startswith("tokenizer.")], ts))
    with pytest.raises(DFlashError, match="no vocabulary .* pass --target-gguf"):
        migrate(src, tmp_path / "o.gguf")
    orig_kvs, _ = drafter_parts()
    target = write_parts(tmp_path / "target.gguf", ([KV("general.architecture", STR, "qwen3"), KV("qwen3.block_count", U32, 4),
                                                      *[k for k in orig_kvs if k.key.startswith("tokenizer.") and "mask" not in k.key]],
                                                     [tensor("token_embd.weight", (32, 5))]))
    result = migrate(src, tmp_path / "o.gguf", target_gguf=target)
    assert result.report.exit_code == 0
    _same_as_original(result.output, {"dflash.attention.causal", "dflash.rope.dimension_count"})


def test_refusals(tmp_path):
    up = write_parts(tmp_path / "up.gguf", drafter_parts())
    with pytest.raises(DFlashError, match="already in llama.cpp's upstream dflash dialect"):
        migrate(up, tmp_path / "o.gguf")
    dspark = write_parts(tmp_path / "dspark.gguf", _dialect(drafter_parts(), "dspark", ids_key="dspark.target_layers", ids=[0, 2],
                                                              extra=[], tensor_names={}))
    r = validate(dspark)
    assert r.dialect == "prismml-dspark" and "gguf-dspark-to-dflash" in r.check("dialect").message
    with pytest.raises(DFlashError, match="cannot be migrated"):
        migrate(dspark, tmp_path / "o.gguf")
    # a tensor no dialect table maps
    odd = write_parts(tmp_path / "odd.gguf", set_tensor(lucebox(), tensor("dflash.domino.start", (8,))))
    with pytest.raises(DFlashError, match="does not load and migrate cannot map: dflash.domino.start"):
        migrate(odd, tmp_path / "o.gguf", target_layers_offset=1, mask_token_id=4)
    # both the fork's and upstream's name for the pre-FFN norm: which one is meant is unknowable
    both = write_parts(tmp_path / "both.gguf", set_tensor(buun(), tensor("blk.0.ffn_norm.weight", (32,))))
    with pytest.raises(DFlashError, match="would both become 'blk.0.ffn_norm.weight'"):
        migrate(both, tmp_path / "o.gguf")
    # layer ids that disagree with fc's width
    kvs, ts = buun()
    kvs = [KV(k.key, k.vtype, [0, 1, 2], k.sub) if k.key.endswith("target_layer_ids") else k for k in kvs]
    wrong = write_parts(tmp_path / "wrong.gguf", (kvs, ts))
    with pytest.raises(DFlashError, match="the layer ids and the weights disagree"):
        migrate(wrong, tmp_path / "o.gguf")
    kvs, ts = buun()
    kvs = [KV(k.key, k.vtype, 96, k.sub) if k.key.endswith("n_target_features") else k for k in kvs]
    width = write_parts(tmp_path / "width.gguf", (kvs, ts))
    with pytest.raises(DFlashError, match="n_target_features = 96 but 2 taps of hidden 32 give 64"):
        migrate(width, tmp_path / "o.gguf")
    assert not (tmp_path / "o.gguf").exists()
    # unreadable input: exit code 2 on the command line
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"nope")
    with pytest.raises(InputFileError):
        migrate(bad, tmp_path / "o.gguf")
    r = run_cli("migrate", bad, tmp_path / "o.gguf")
    assert r.returncode == 2 and "not a GGUF file" in r.stderr


def test_tensor_data_is_streamed_in_chunks(tmp_path, monkeypatch):
    """Migrate copies through the one pipeline: inside the kernel (copy_file_range) on buffered
    writes, else a row chunk at a time (here: one row per chunk, with direct writes); the same file."""
    from dflash_convert import pipeline, write

    spans = []
    real = pipeline.row_spans
    monkeypatch.setattr(pipeline, "CHUNK_ELEMENTS", 1)
    monkeypatch.setattr(pipeline, "row_spans", lambda p, c=None: spans.append(real(p, c)) or spans[-1])
    src = write_parts(tmp_path / "buun.gguf", buun())
    monkeypatch.setenv(write.DIRECT_IO_ENV, "1")
    result = migrate(src, tmp_path / "o.gguf")
    assert max(len(s) for s in spans) > 1 and all(b - a == 1 for s in spans for a, b in s)
    _same_as_original(result.output, {"dflash.attention.causal", "dflash.rope.dimension_count"})
    spans.clear()
    copied = []
    monkeypatch.setenv(write.DIRECT_IO_ENV, "0")
    monkeypatch.setattr(write._OutputFile, "copy_span", lambda self, *a, real=write._OutputFile.copy_span:
                        copied.append(a) or real(self, *a))
    again = migrate(src, tmp_path / "o2.gguf")
    assert copied and not spans  # every tensor a byte copy, none read into memory
    assert again.output.read_bytes() == result.output.read_bytes()


def test_read_parts_round_trip(tmp_path):
    path = write_parts(tmp_path / "a.gguf", drafter_parts())
    again = write_parts(tmp_path / "b.gguf", read_parts(path))
    assert path.read_bytes() == again.read_bytes()
    assert get_key(drop_keys(read_parts(path), "dflash.block_size"), "dflash.block_count").value == 2
