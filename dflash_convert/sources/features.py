"""Read a features file (``capture``'s output, format/features.py): every check of that input here.

The container is the hardened safetensors reader's; on top of it every sequence must have its
three tensors with consistent shapes (tokens [L], prompt_length [1] in 1..L, layer_inputs [S, L, E]
with S the stored layer count and one E for all), the metadata must name the schema and list the
stored layers, and nothing else may be in the file. Tensor data is read one sequence at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputFileError
from ..files import check_regular_file, parse_json
from ..format.features import SCHEMA, SEQUENCE, SEQUENCE_TENSORS
from ..target import Target
from .hub import TARGET_WEIGHTS, resolve_source
from .safetensors import TensorRef, read_header
from .target import read_target

FLOAT_DTYPES = ("F32", "F16", "BF16")


@dataclass(frozen=True)
class FeatureSequence:
    """One captured sequence: where its tensors are."""

    index: int
    tokens: TensorRef
    prompt_length: TensorRef
    layer_inputs: TensorRef

    @property
    def length(self) -> int:
        return self.tokens.shape[0]

    def read_tokens(self) -> tuple[np.ndarray, int]:
        """(token ids int64 [L], prompt length)."""
        tokens = self.tokens.read().astype(np.int64)
        n = int(self.prompt_length.read()[0])
        if not 1 <= n <= len(tokens):
            raise InputFileError(f"sequence {self.index}: prompt_length {n} is not in 1..{len(tokens)}", self.tokens.path)
        return tokens, n

    def read_layer(self, slot: int) -> np.ndarray:
        """The stored layer at ``slot`` (its position in the file's ``layers``) as float32 [L, E]."""
        _, L, E = self.layer_inputs.shape
        raw = self.layer_inputs.read(slot * L * E, L * E)
        if self.layer_inputs.dtype == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        return raw.astype(np.float32, copy=False).reshape(L, E)


@dataclass(frozen=True)
class FeaturesFile:
    path: Path
    metadata: dict[str, str]
    layers: list[int]  # stored layer-input indices, in file order
    hidden_size: int
    dtype: str
    sequences: list[FeatureSequence]
    eos_ids: list[int]

    def slot(self, layer: int) -> int | None:
        return self.layers.index(layer) if layer in self.layers else None

    def slots_for(self, target_layers: list[int], who: str) -> list[int]:
        """The file positions of a drafter's taps; one error line naming the first layer the file lacks."""
        missing = [t for t in target_layers if t not in self.layers]
        if missing:
            raise InputFileError(f"{who} taps target layer {missing[0]}, which this features file does not store "
                                 f"(it stores {self.layers}); capture again with --layers all or --for that drafter",
                                 self.path)
        return [self.layers.index(t) for t in target_layers]


def _int_list(meta: dict[str, str], key: str, path: Path) -> list[int]:
    try:
        v = parse_json(meta.get(key, "null"), f"metadata {key!r}", path)
    except InputFileError:
        v = None
    if not isinstance(v, list) or not all(type(x) is int and x >= 0 for x in v):
        raise InputFileError(f"metadata {key!r} must be a JSON list of non-negative integers, got {meta.get(key)!r}", path)
    return v


def read_features(path: str | Path) -> FeaturesFile:
    """Parse and check a features file; tensor data stays on disk."""
    path = Path(path)
    check_regular_file(path, "features file")
    refs, meta = read_header(path)
    if meta.get("schema") != SCHEMA:
        raise InputFileError(f"not a features file of {SCHEMA!r} (schema {meta.get('schema')!r}); write one with "
                             "dflash-convert capture", path)
    layers = _int_list(meta, "layers", path)
    if not layers or len(set(layers)) != len(layers):
        raise InputFileError(f"metadata 'layers' must list distinct layer indices, got {layers}", path)
    eos = _int_list(meta, "eos_ids", path) if "eos_ids" in meta else []
    by = {r.name: r for r in refs}
    n_seq = meta.get("sequences", "")
    if not n_seq.isdigit() or int(n_seq) < 1:
        raise InputFileError(f"metadata 'sequences' must be a positive integer, got {n_seq!r}", path)
    sequences, E, dtype = [], None, None
    for i in range(int(n_seq)):
        prefix = SEQUENCE.format(i=i)
        missing = [n for n in SEQUENCE_TENSORS if prefix + n not in by]
        if missing:
            raise InputFileError(f"sequence {i} has no {prefix + missing[0]} tensor", path)
        tok, plen, inp = (by.pop(prefix + n) for n in SEQUENCE_TENSORS)
        if tok.dtype != "I64" or len(tok.shape) != 1 or tok.shape[0] < 1:
            raise InputFileError(f"{tok.name} must be I64 [L] with L >= 1, got {tok.dtype} {list(tok.shape)}", path)
        if plen.dtype != "I64" or plen.shape != (1,):
            raise InputFileError(f"{plen.name} must be I64 [1], got {plen.dtype} {list(plen.shape)}", path)
        if inp.dtype not in FLOAT_DTYPES or len(inp.shape) != 3 or inp.shape[:2] != (len(layers), tok.shape[0]):
            raise InputFileError(f"{inp.name} must be [{len(layers)} layers, {tok.shape[0]} positions, hidden] of "
                                 f"{'/'.join(FLOAT_DTYPES)}, got {inp.dtype} {list(inp.shape)}", path)
        if E is not None and (inp.shape[2], inp.dtype) != (E, dtype):
            raise InputFileError(f"{inp.name} is {inp.dtype} of width {inp.shape[2]}, other sequences {dtype} of {E}", path)
        E, dtype = inp.shape[2], inp.dtype
        sequences.append(FeatureSequence(i, tok, plen, inp))
    if by:
        raise InputFileError(f"unexpected tensor {sorted(by)[0]!r} (the file holds {n_seq} sequences)", path)
    return FeaturesFile(path, meta, layers, int(E), str(dtype), sequences, eos)  # type: ignore[arg-type]


def target_for(feats: FeaturesFile, target_model_dir: str | Path | None = None,
               target_gguf: str | Path | None = None) -> Target | None:
    """The target whose embedding and head the drafters share: given, or the directory or GGUF the
    features were captured from when it is still there (None: the drafters must carry their own)."""
    if target_model_dir is not None:  # a directory, a GGUF, or a repo id (its embedding and head are read)
        return read_target(resolve_source(target_model_dir, TARGET_WEIGHTS).path)
    if target_gguf is not None:
        return read_target(target_gguf)
    recorded = feats.metadata.get("target")
    if recorded and (Path(recorded).is_dir() or Path(recorded).is_file()):
        return read_target(recorded)
    return None
