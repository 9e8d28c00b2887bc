"""Read a features file (``capture``'s output, format/features.py): every check of that untrusted input here.

Refuses a sequence without its three tensors or with inconsistent shapes, negative token ids, a
``prompt_length`` outside 1..L-1, a continuation past ``new_tokens`` + LOOKAHEAD, counts that are not
plain decimal integers, anything else in the file, and non-finite layer inputs. Every command reads
features only through here. Specification: docs/acceptance.md, "capture".
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..drafter import Drafter
from ..errors import DFlashError, InputFileError
from ..files import check_regular_file, parse_json, read_regular_bytes, sha256_file
from ..format.features import COUNTS, LOOKAHEAD, MAX_COUNT_DIGITS, NUMERICS, SCHEMA, SEQUENCE, SEQUENCE_TENSORS
from ..format.ggml import FLOAT_TYPE_NAMES
from ..target import DIRECTORY, Target
from .hub import TARGET_WEIGHTS, resolve_source
from .safetensors import TensorRef, read_header
from .target import read_target, read_target_dir, read_target_gguf

MAX_CONFIG_BYTES = 16 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")
ALLOW_OTHER = "pass --allow-other-target to measure with it anyway"


@dataclass(frozen=True)
class FeatureSequence:
    """One captured sequence: where its tensors are, and its checked prompt length."""

    index: int
    tokens: TensorRef
    prompt_length: int
    layer_inputs: TensorRef
    ends_at_eos: bool  # the continuation stops at an end-of-generation token

    @property
    def length(self) -> int:
        """Tokens in the sequence, prompt and continuation."""
        return self.tokens.shape[0]

    def read_tokens(self) -> tuple[np.ndarray, int]:
        """(token ids int64 [L], prompt length)."""
        return self.tokens.read().astype(np.int64), self.prompt_length

    def read_layer(self, slot: int) -> np.ndarray:
        """The stored layer at ``slot`` (its position in the file's ``layers``) as float32 [L, E], refused if not finite."""
        _, L, E = self.layer_inputs.shape
        raw = self.layer_inputs.read(slot * L * E, L * E)
        if self.layer_inputs.dtype == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        out = raw.astype(np.float32, copy=False).reshape(L, E)
        if not np.isfinite(out).all():
            pos = int(np.argwhere(~np.isfinite(out))[0][0])
            raise InputFileError(f"sequence {self.index}: layer_inputs slot {slot} holds a non-finite value "
                                 f"({out[pos][~np.isfinite(out[pos])][0]}) at position {pos}", self.tokens.path)
        return out


@dataclass(frozen=True)
class FeaturesFile:
    """A checked features file; tensor data stays on disk."""

    path: Path
    metadata: dict[str, str]
    layers: list[int]  # stored layer-input indices, in file order
    hidden_size: int
    dtype: str
    sequences: list[FeatureSequence]
    eos_ids: list[int]
    new_tokens: int  # the -n N the continuations were captured for
    max_token: int  # the largest token id of any sequence
    target: str | None  # the recorded target (a path or a repo id), as stored
    target_config_sha256: str | None
    target_gguf_sha256: str | None  # capture --target-gguf: the target GGUF's own hash

    def slot(self, layer: int) -> int | None:
        """The file position of stored layer ``layer``, or None."""
        return self.layers.index(layer) if layer in self.layers else None

    def slots_for(self, target_layers: list[int], who: str) -> list[int]:
        """The file positions of a drafter's taps; one error line naming the first layer the file lacks."""
        missing = [t for t in target_layers if t not in self.layers]
        if missing:
            raise InputFileError(f"{who} taps target layer {missing[0]}, which this features file does not store "
                                 f"(it stores {self.layers}); capture again with --layers all or --for that drafter",
                                 self.path)
        return [self.layers.index(t) for t in target_layers]

    def check_drafter(self, d: Drafter, where: str | Path, n_max: int | None = None) -> list[int]:
        """A drafter these features fit: its slots, or one error line naming the features file."""
        if d.hidden_size != self.hidden_size:
            raise InputFileError(f"the captured features are {self.hidden_size} wide, the drafter {where} is "
                                 f"{d.hidden_size}: features of another target", self.path)
        if d.vocab_size and self.max_token >= d.vocab_size:
            raise InputFileError(f"token id {self.max_token} is outside the vocabulary of {d.vocab_size} tokens of the "
                                 f"drafter {where}: features of another target", self.path)
        if n_max is not None:
            self.check_covers(n_max)
        return self.slots_for(d.target_layers, str(where))

    def check_covers(self, n_max: int) -> None:
        """Every continuation holds what llama-speculative-simple -n new_tokens verifies with drafts of ``n_max``."""
        need = self.new_tokens + n_max + 1
        for s in self.sequences:
            if not s.ends_at_eos and s.length - s.prompt_length < need:
                raise InputFileError(f"sequence {s.index}: the continuation holds {s.length - s.prompt_length} tokens, "
                                     f"fewer than the {need} that -n {self.new_tokens} (metadata 'new_tokens') verifies "
                                     f"with drafts of {n_max}", self.path)

    def check_target(self, target: Target, allow_other_target: bool = False) -> None:
        """Refuse a target whose config hash, hidden size or vocabulary differs from the capture's (unless ``allow_other_target``)."""
        if target.hidden_size is not None and target.hidden_size != self.hidden_size:
            raise InputFileError(f"the captured features are {self.hidden_size} wide, the target {target.source} is "
                                 f"{target.hidden_size}: features of another target", self.path)
        if target.vocab_size is not None and self.max_token >= target.vocab_size:
            raise InputFileError(f"token id {self.max_token} is outside the vocabulary of {target.vocab_size} tokens of "
                                 f"the target {target.source}: features of another target", self.path)
        if allow_other_target:
            return
        # the identity capture recorded, of the same kind as the target in use (else only the sizes above)
        recorded, what, got_of = ((self.target_config_sha256, "config.json SHA-256", config_sha256) if target.kind == DIRECTORY
                                  else (self.target_gguf_sha256, "SHA-256", sha256_file))
        if recorded is None:
            return
        got = got_of(target.source)
        if got != recorded:
            same_place = self.target is not None and os.path.realpath(self.target) == os.path.realpath(target.source)
            why = (f"{target.source} changed since the capture ({what} {recorded[:12]}... then, {got[:12]}... now)"
                   if same_place else f"captured from another target (recorded {self.target!r}, {what} {recorded[:12]}...), "
                   f"not {target.source} (SHA-256 {got[:12]}...)")
            raise InputFileError(f"{why}; {ALLOW_OTHER}", self.path)


def config_sha256(target_dir: str | Path) -> str:
    """SHA-256 of a target directory's config.json, as capture records it."""
    path = Path(target_dir) / "config.json"
    return hashlib.sha256(read_regular_bytes(path, "target config.json", MAX_CONFIG_BYTES)).hexdigest()


def _int_list(meta: dict[str, str], key: str, path: Path) -> list[int]:
    try:
        v = parse_json(meta.get(key, "null"), f"metadata {key!r}", path)
    except InputFileError:
        v = None
    if not isinstance(v, list) or not all(type(x) is int and x >= 0 for x in v):
        raise InputFileError(f"metadata {key!r} must be a JSON list of non-negative integers, got {meta.get(key)!r}", path)
    return v


def _count(meta: dict[str, str], key: str, path: Path) -> int:
    """A metadata count: plain ASCII decimal digits (no sign, no other script's digits), at least COUNTS[key]."""
    text = meta.get(key)
    if (not isinstance(text, str) or re.fullmatch(f"[0-9]{{1,{MAX_COUNT_DIGITS}}}", text, re.ASCII) is None
            or int(text) < COUNTS[key]):
        raise InputFileError(f"metadata {key!r} must be a decimal integer of at least {COUNTS[key]} "
                             f"(at most {MAX_COUNT_DIGITS} digits), got {text!r}", path)
    return int(text)


def read_features(path: str | Path) -> FeaturesFile:
    """Parse and check a features file: header, metadata, every sequence's shapes, tokens and prompt length."""
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
    n_seq, new_tokens = _count(meta, "sequences", path), _count(meta, "new_tokens", path)
    sha, gguf_sha = (meta.get(k) or None for k in ("target_config_sha256", "target_gguf_sha256"))
    for k, v in (("target_config_sha256", sha), ("target_gguf_sha256", gguf_sha)):
        if v is not None and _SHA256.fullmatch(v) is None:
            raise InputFileError(f"metadata {k!r} must be 64 lowercase hex digits, got {v[:80]!r}", path)
    by = {r.name: r for r in refs}
    sequences, E, dtype, max_token, eos_set = [], None, None, -1, set(eos)
    for i in range(n_seq):  # each pops its tensors: a count past the file's stops at the first missing one
        prefix = SEQUENCE.format(i=i)
        missing = [n for n in SEQUENCE_TENSORS if prefix + n not in by]
        if missing:
            raise InputFileError(f"sequence {i} has no {prefix + missing[0]} tensor", path)
        tok, plen, inp = (by.pop(prefix + n) for n in SEQUENCE_TENSORS)
        if tok.dtype != "I64" or len(tok.shape) != 1 or tok.shape[0] < 2:
            raise InputFileError(f"{tok.name} must be I64 [L] with L >= 2, got {tok.dtype} {list(tok.shape)}", path)
        if plen.dtype != "I64" or plen.shape != (1,):
            raise InputFileError(f"{plen.name} must be I64 [1], got {plen.dtype} {list(plen.shape)}", path)
        if inp.dtype not in FLOAT_TYPE_NAMES or len(inp.shape) != 3 or inp.shape[:2] != (len(layers), tok.shape[0]):
            raise InputFileError(f"{inp.name} must be [{len(layers)} layers, {tok.shape[0]} positions, hidden] of "
                                 f"{'/'.join(FLOAT_TYPE_NAMES)}, got {inp.dtype} {list(inp.shape)}", path)
        if E is not None and (inp.shape[2], inp.dtype) != (E, dtype):
            raise InputFileError(f"{inp.name} is {inp.dtype} of width {inp.shape[2]}, other sequences {dtype} of {E}", path)
        E, dtype = inp.shape[2], inp.dtype
        L, n = tok.shape[0], int(plen.read()[0])
        if not 1 <= n < L:
            raise InputFileError(f"sequence {i}: prompt_length {n} is not in 1..{L - 1} (the sequence holds {L} "
                                 "tokens, the continuation at least one)", path)
        if L - n > new_tokens + LOOKAHEAD:
            raise InputFileError(f"sequence {i}: the continuation holds {L - n} tokens, more than the "
                                 f"{new_tokens} + {LOOKAHEAD} capture writes for metadata 'new_tokens' {new_tokens}", path)
        tokens = tok.read()
        if int(tokens.min()) < 0:
            raise InputFileError(f"sequence {i}: token id {int(tokens.min())} is negative", path)
        max_token = max(max_token, int(tokens.max()))
        sequences.append(FeatureSequence(i, tok, n, inp, int(tokens[-1]) in eos_set))
    if by:
        raise InputFileError(f"unexpected tensor {sorted(by)[0]!r} (the file holds {n_seq} sequences)", path)
    return FeaturesFile(path, meta, layers, int(E), str(dtype), sequences, eos, new_tokens,  # type: ignore[arg-type]
                        max_token, meta.get("target") or None, sha, gguf_sha)


def recorded_target(feats: FeaturesFile) -> Target | None:
    """The target directory or GGUF the features record when it is an absolute path still there, else None."""
    rec = feats.target
    if rec is None:
        return None
    if not os.path.isabs(rec):
        raise InputFileError(f"the target it was captured from is recorded as {rec!r}, not an absolute path: name the "
                             "target with --target-model-dir (or --target-gguf)", feats.path)
    if not os.path.exists(rec):
        return None
    try:
        return read_target_dir(rec) if os.path.isdir(rec) else read_target_gguf(rec)
    except DFlashError as e:
        raise InputFileError(f"the target it was captured from, {rec!r}, cannot be read ({e}); name the target with "
                             "--target-model-dir", feats.path) from None


def target_for(feats: FeaturesFile, target_model_dir: str | Path | None = None,
               target_gguf: str | Path | None = None, *, allow_other_target: bool = False) -> Target | None:
    """The target whose embedding and head the drafters share (given, else recorded), checked against the capture."""
    if target_model_dir is not None:  # a directory, a GGUF, or a repo id (its embedding and head are read)
        target = read_target(resolve_source(target_model_dir, TARGET_WEIGHTS).path)
    elif target_gguf is not None:
        target = read_target(target_gguf)
    else:
        target = recorded_target(feats)
    if target is not None:
        feats.check_target(target, allow_other_target)
    return target


@dataclass(frozen=True)
class Measurement:
    """What accept, sweep and --min-acceptance measure with: the checked features, their target, the numerics."""

    features: FeaturesFile
    target: Target | None
    numerics: str

    @property
    def like_cpu(self) -> bool:
        """Round as llama.cpp's CPU backend does."""
        return self.numerics == "cpu"


def open_measurement(features: str | Path, *, target_model_dir: str | Path | None = None,
                     target_gguf: str | Path | None = None, numerics: str = "cpu",
                     allow_other_target: bool = False) -> Measurement:
    """The measuring commands' common start: numerics checked, features read and checked, the target matched."""
    if numerics not in NUMERICS:
        raise DFlashError(f"--numerics must be one of {', '.join(NUMERICS)}, got {numerics!r}")
    feats = read_features(features)
    return Measurement(feats, target_for(feats, target_model_dir, target_gguf, allow_other_target=allow_other_target),
                       numerics)
