"""Small real DFlash drafter GGUF files for validator and migrate tests, and a way to edit them.

``drafter_parts`` builds the keys and tensors of a complete upstream drafter (random weights,
a 4-token vocabulary) small enough to write in a millisecond; ``write_parts`` writes any list of
parts with our writer; ``read_parts`` reads any GGUF back into parts (tensor bytes included), so
a test can take a file, change one thing, and write it again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from dflash_convert.arrays import NumArray
from dflash_convert.format.ggml import GGMLType
from dflash_convert.format.keys import KEYS, ValueType, key
from dflash_convert.metadata import Metadata
from dflash_convert.sources.gguf import read_gguf
from dflash_convert.write import OutTensor, write_gguf


@dataclass
class KV:
    key: str
    vtype: ValueType
    value: Any
    sub: ValueType | None = None


@dataclass
class Tensor:
    name: str
    ne: tuple[int, ...]
    gtype: GGMLType
    data: bytes


Parts = tuple[list[KV], list[Tensor]]


def kv(short: str, value: Any, arch: str = "dflash") -> KV:
    template, vtype, sub = KEYS[short]
    return KV(template.format(arch=arch), vtype, value, sub)


def _q8_0(n: int, rng: np.random.Generator) -> bytes:
    blocks = np.zeros((n // 32, 34), np.uint8)
    blocks[:, :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    blocks[:, 2:] = rng.integers(0, 255, (n // 32, 32))
    return blocks.tobytes()


def tensor(name: str, ne: tuple[int, ...], gtype: GGMLType = GGMLType.F32, *, seed: int = 0, fill: float | None = None) -> Tensor:
    rng = np.random.default_rng(seed)
    n = int(np.prod(ne))
    if gtype == GGMLType.Q8_0:
        return Tensor(name, ne, gtype, _q8_0(n, rng))
    if gtype == GGMLType.I64:
        return Tensor(name, ne, gtype, np.arange(n, dtype="<i8").tobytes())
    dtype = {GGMLType.F32: "<f4", GGMLType.F16: "<f2", GGMLType.BF16: "<f4"}[gtype]
    values = rng.standard_normal(n).astype("<f4") * 0.05 + 1.0 if fill is None else np.full(n, fill, "<f4")
    if gtype == GGMLType.BF16:
        return Tensor(name, ne, gtype, (values.view("<u4") >> 16).astype("<u2").tobytes())
    return Tensor(name, ne, gtype, values.astype(dtype).tobytes())


def drafter_parts(*, layers: int = 2, E: int = 32, F: int = 64, H: int = 2, KV_: int = 1, D: int = 16,
                  target_layers: list[int] | None = None, tokens: list[str] | None = None, matrix: GGMLType = GGMLType.F16,
                  swa: list[bool] | None = None) -> Parts:
    """A complete upstream dflash drafter: every required key and tensor, consistent shapes."""
    ids = [1, 3] if target_layers is None else target_layers
    toks = ["a", "b", "c", "ab", "<|mask|>"] if tokens is None else tokens
    kvs = [kv("architecture", "dflash"), kv("type", "model"), kv("name", "tiny"), kv("block_count", layers),
           kv("context_length", 4096), kv("embedding_length", E), kv("feed_forward_length", F), kv("head_count", H),
           kv("head_count_kv", KV_), kv("rope_freq_base", 1e6), kv("rms_eps", 1e-6), kv("key_length", D),
           kv("value_length", D), kv("file_type", 1), kv("block_size", 16), kv("target_layers", ids)]
    if swa is not None:
        kvs += [kv("sliding_window", 64), kv("sliding_window_pattern", swa)]
    kvs += [kv("quantization_version", 2), kv("tok_model", "gpt2"), kv("tok_pre", "qwen2"), kv("tok_tokens", toks),
            kv("tok_token_type", [1] * (len(toks) - 1) + [3]), kv("tok_merges", ["a b"]),
            KV("tokenizer.ggml.eos_token_id", ValueType.UINT32, 0), kv("mask_token_id", len(toks) - 1)]
    T = len(ids)
    ts = [tensor("fc.weight", (T * E, E), matrix, seed=1), tensor("enc.output_norm.weight", (E,)),
          tensor("output_norm.weight", (E,), seed=2)]
    for i in range(layers):
        p = f"blk.{i}."
        s = 10 * (i + 1)
        ts += [tensor(p + "attn_norm.weight", (E,), seed=s), tensor(p + "attn_q.weight", (E, H * D), matrix, seed=s + 1),
               tensor(p + "attn_k.weight", (E, KV_ * D), matrix, seed=s + 2),
               tensor(p + "attn_v.weight", (E, KV_ * D), matrix, seed=s + 3),
               tensor(p + "attn_output.weight", (H * D, E), matrix, seed=s + 4),
               tensor(p + "attn_q_norm.weight", (D,), seed=s + 5), tensor(p + "attn_k_norm.weight", (D,), seed=s + 6),
               tensor(p + "ffn_norm.weight", (E,), seed=s + 7), tensor(p + "ffn_gate.weight", (E, F), matrix, seed=s + 8),
               tensor(p + "ffn_up.weight", (E, F), matrix, seed=s + 9), tensor(p + "ffn_down.weight", (F, E), matrix, seed=s + 10)]
    return kvs, ts


def write_parts(path: Path, parts: Parts) -> Path:
    kvs, ts = parts
    md = Metadata()
    for k in kvs:
        md.set_raw(k.key, k.vtype, k.value, k.sub)
    out = [OutTensor(t.name, t.ne, t.gtype, len(t.data), chunks=lambda t=t: [t.data]) for t in ts]
    write_gguf(path, md, out, progress=False, replace=True)  # test fixtures rewrite their files
    return path


def write_drafter(path: Path, **kw: Any) -> Path:
    return write_parts(path, drafter_parts(**kw))


def read_parts(path: Path) -> Parts:
    g = read_gguf(path)
    kvs = []
    for name, v in g.metadata.items():
        value = v.value.tolist() if isinstance(v.value, NumArray) else v.value
        kvs.append(KV(name, v.vtype, value, v.sub))
    ts = [Tensor(t.name, t.ne, t.ggml_type, g.tensor_bytes(t).tobytes()) for t in g.tensors]
    g.close()
    return kvs, ts


# --- edits (each returns new parts) -------------------------------------------------------------

def set_key(parts: Parts, k: KV) -> Parts:
    kvs, ts = parts
    if any(x.key == k.key for x in kvs):
        return [k if x.key == k.key else x for x in kvs], ts
    return [*kvs, k], ts


def drop_keys(parts: Parts, *names: str) -> Parts:
    kvs, ts = parts
    return [x for x in kvs if x.key not in names], ts


def rename_keys(parts: Parts, mapping: dict[str, str]) -> Parts:
    kvs, ts = parts
    return [replace(x, key=mapping.get(x.key, x.key)) for x in kvs], ts


def get_key(parts: Parts, name: str) -> KV:
    return next(x for x in parts[0] if x.key == name)


def set_tensor(parts: Parts, t: Tensor) -> Parts:
    kvs, ts = parts
    if any(x.name == t.name for x in ts):
        return kvs, [t if x.name == t.name else x for x in ts]
    return kvs, [*ts, t]


def drop_tensors(parts: Parts, *names: str) -> Parts:
    kvs, ts = parts
    return kvs, [t for t in ts if t.name not in names]


def rename_tensors(parts: Parts, mapping: dict[str, str]) -> Parts:
    kvs, ts = parts
    return kvs, [replace(t, name=mapping.get(t.name, t.name)) for t in ts]


def get_tensor(parts: Parts, name: str) -> Tensor:
    return next(t for t in parts[1] if t.name == name)


def full_key(short: str, arch: str = "dflash") -> str:
    return key(short, arch)


# --- the edits that break a drafter on purpose (check and runner tests) -------------------------

def map_key(parts: Parts, short: str, fn: Any) -> Parts:
    """The dflash key ``short`` with its value replaced by ``fn(value)``, same value type."""
    k = get_key(parts, full_key(short))
    return set_key(parts, replace(k, value=fn(k.value)))


def swap_tensors(parts: Parts, a: str, b: str) -> Parts:
    """Tensors ``a`` and ``b`` exchange names (so each holds the other's data)."""
    return rename_tensors(parts, {a: b, b: a})


def scale_tensor(parts: Parts, name: str, factor: float) -> Parts:
    """An F32 tensor multiplied by ``factor``."""
    t = get_tensor(parts, name)
    assert t.gtype == GGMLType.F32, f"{name} is {t.gtype.name}, not F32"
    values = (np.frombuffer(t.data, "<f4") * factor).astype("<f4")
    return set_tensor(parts, replace(t, data=values.tobytes()))
