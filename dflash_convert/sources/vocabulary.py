"""The drafter's vocabulary tensors: own vocabularies (d2t/t2d), embeddings, output head, mask row.

``token_embd`` is never written without ``output`` (llama.cpp would tie them, which no drafter was
trained with); ``d2t`` is written as absolute target ids (I64), ``t2d`` only checked. Every
invariant has its own error message. Specification: docs/conversion.md, "Own vocabularies,
embeddings and heads".
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from ..drafter import Drafter, DrafterTensor
from ..encoders.floats import FLOAT_WORDS, widen_to_f32
from ..errors import InputFileError
from ..files import check_regular_file
from ..format.rules import D2T_TENSOR, EMBEDDING_TENSOR, OUTPUT_TENSOR
from ..format.tensors import CHECKED_NOT_WRITTEN, gguf_to_hf
from ..target import Target
from ..tensor_source import ArraySource, RowOverride, TensorSource, source_path, unwrap
from .checkpoint import Checkpoint
from .safetensors import TensorRef
from .target import target_tensors

log = logging.getLogger("dflash_convert")

MASK_EMBEDDING_FILE = "mask_embedding.pt"
T2D_HF = CHECKED_NOT_WRITTEN[0]  # the inverse table of d2t: checked, never written
_EMBED, _HEAD = gguf_to_hf(EMBEDDING_TENSOR), gguf_to_hf(OUTPUT_TENSOR)
COMPARE_CHUNK = 1 << 22


def _find(ckpt_tensors: list[TensorRef], name: str) -> TensorRef | None:
    return next((t for t in ckpt_tensors if t.name in (name, "model." + name)), None)


def check_d2t(d2t: np.ndarray, t2d: np.ndarray | None, n_draft: int, n_target: int, where: Path) -> np.ndarray:
    """Offsets -> absolute target ids, after checking every invariant. Returns int64 ids."""
    if d2t.ndim != 1 or d2t.shape[0] != n_draft:
        raise InputFileError(f"d2t has shape {list(d2t.shape)}, expected [{n_draft}] (draft_vocab_size)", where)
    ids = d2t.astype(np.int64) + np.arange(n_draft, dtype=np.int64)
    bad = np.flatnonzero((ids < 0) | (ids >= n_target))
    if bad.size:
        raise InputFileError(f"d2t maps draft id {bad[0]} to target id {ids[bad[0]]}, outside [0, {n_target})", where)
    if n_draft > 1 and not bool(np.all(ids[1:] > ids[:-1])):
        i = int(np.flatnonzero(ids[1:] <= ids[:-1])[0])
        kind = "duplicate" if ids[i + 1] == ids[i] else "decreasing"
        raise InputFileError(f"d2t target ids are not unique and increasing: {kind} at draft ids {i}, {i + 1} "
                             f"(target ids {ids[i]}, {ids[i + 1]})", where)
    if t2d is not None:
        if t2d.ndim != 1 or t2d.shape[0] != n_target:
            raise InputFileError(f"t2d has shape {list(t2d.shape)}, expected [{n_target}] (target vocab_size)", where)
        kept = int(np.count_nonzero(t2d))
        if kept != n_draft:
            raise InputFileError(f"t2d.sum() is {kept}, expected draft_vocab_size {n_draft}", where)
        missing = np.flatnonzero(~t2d.astype(bool)[ids])
        if missing.size:
            raise InputFileError(f"t2d is false at target id {ids[missing[0]]}, which d2t maps draft id "
                                 f"{missing[0]} to: t2d must be true exactly at the d2t ids", where)
    return ids


def _equal(a: TensorSource, b: TensorSource) -> bool:
    """Same values (streamed, so a 2 GB embedding costs no more than a chunk of memory)."""
    if a.shape != b.shape:
        return False
    if a.dtype != b.dtype and not (a.dtype in FLOAT_WORDS and b.dtype in FLOAT_WORDS):
        return False  # a quantized target head is never equal to a float drafter tensor
    rows = a.shape[0] if len(a.shape) > 1 else 1
    step = max(1, COMPARE_CHUNK // max(1, a.shape[-1]))
    for r in range(0, rows, step):
        x, y = a.rows(r, min(rows, r + step)), b.rows(r, min(rows, r + step))
        if a.dtype != b.dtype:
            x, y = widen_to_f32(x, a.dtype), widen_to_f32(y, b.dtype)
        if not np.array_equal(x, y):
            return False
    return True


def _mask_embedding(d: Drafter, path: Path) -> np.ndarray:
    import torch  # heavy: only a checkpoint with mask_embedding.pt needs it (torch.load, weights only)

    check_regular_file(path, MASK_EMBEDDING_FILE)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)  # never unpickle arbitrary objects
    except Exception as e:
        raise InputFileError(f"cannot load (weights-only): {str(e).splitlines()[0][:200]}", path) from e
    if not isinstance(obj, dict) or "mask_token_id" not in obj or "embedding" not in obj:
        raise InputFileError("must hold a dict with 'mask_token_id' and 'embedding'", path)
    mid = obj["mask_token_id"]
    mid = int(mid.item()) if isinstance(mid, torch.Tensor) else mid
    if mid != d.mask_token_id:
        raise InputFileError(f"mask_token_id {mid} differs from the config's {d.mask_token_id}", path)
    if not 0 <= mid < d.vocab_size:
        raise InputFileError(f"mask_token_id {mid} is outside the vocabulary [0, {d.vocab_size})", path)
    emb = obj["embedding"]
    if not isinstance(emb, torch.Tensor) or tuple(emb.shape) != (d.hidden_size,):
        raise InputFileError(f"embedding must be a tensor of shape [{d.hidden_size}]", path)
    if not bool(torch.isfinite(emb).all()):
        raise InputFileError("embedding has NaN or Inf values", path)
    return emb.float().numpy()


def _as_words(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values -> raw words of a safetensors dtype, converted as torch's .to(dtype) would."""
    import torch  # heavy: only the mask row of mask_embedding.pt is converted with it

    t = torch.from_numpy(values.astype(np.float32))
    if dtype == "BF16":
        return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    return t.to({"F16": torch.float16, "F32": torch.float32, "F64": torch.float64}[dtype]).numpy()


def resolve_vocabulary(d: Drafter, ckpt: Checkpoint, target: Target | None, *, keep_embeddings: bool = False) -> None:
    """Finalize d.tensors' vocabulary part: d2t, mask row, which of token_embd/output to write."""
    by = {t.gguf_name: t for t in d.tensors}
    t2d_ref = _find(ckpt.tensors, T2D_HF)

    # own vocabulary
    if d.draft_vocab_size is not None or D2T_TENSOR in by or t2d_ref is not None:
        n_draft = d.draft_vocab_size or d.vocab_size
        if D2T_TENSOR not in by:
            raise InputFileError(f"draft_vocab_size {n_draft} is below vocab_size {d.vocab_size} but the checkpoint "
                                 "has no d2t tensor to map draft ids to target ids", d.source)
        ref = unwrap(by[D2T_TENSOR].source)
        assert isinstance(ref, TensorRef)
        if ref.dtype not in ("I64", "I32"):
            raise InputFileError(f"d2t has dtype {ref.dtype}, expected I64 offsets", ref.path)
        t2d = None
        if t2d_ref is not None:
            if t2d_ref.dtype not in ("BOOL", "U8"):
                raise InputFileError(f"t2d has dtype {t2d_ref.dtype}, expected BOOL", t2d_ref.path)
            t2d = t2d_ref.read().reshape(t2d_ref.shape).astype(bool)
        else:
            log.warning("%s: no t2d tensor; d2t is checked on its own", d.source)
        ids = check_d2t(ref.read().reshape(ref.shape), t2d, n_draft, d.vocab_size, ref.path)
        if d.draft_vocab_size is None:  # a d2t over the full vocabulary must be the identity
            if not np.array_equal(ids, np.arange(d.vocab_size)):
                raise InputFileError("d2t covers the full vocabulary but is not the identity", ref.path)
            d.tensors.remove(by.pop(D2T_TENSOR))
        else:
            by[D2T_TENSOR].source = ArraySource(ids, "I64")
            if OUTPUT_TENSOR not in by:
                raise InputFileError("a drafter with its own vocabulary (d2t) needs its lm_head; none found", d.source)

    # MiMo-style mask embedding: the target's (or draft's) embedding with the mask row replaced
    mask_path = ckpt.dir / MASK_EMBEDDING_FILE
    if mask_path.exists():
        row = _mask_embedding(d, mask_path)
        front: list[DrafterTensor] = []
        if OUTPUT_TENSOR not in by:
            head = _target_head(target, d, MASK_EMBEDDING_FILE)
            front.append(DrafterTensor(OUTPUT_TENSOR, f"{_HEAD} (target)", head))
        emb = by.pop(EMBEDDING_TENSOR, None)
        if emb is not None:
            d.tensors.remove(emb)
        else:
            emb = DrafterTensor(EMBEDDING_TENSOR, f"{_EMBED} (target)", _target_tensor(target, d, "embed", MASK_EMBEDDING_FILE))
        if emb.shape != (d.vocab_size, d.hidden_size):
            raise InputFileError(f"token embedding has shape {list(emb.shape)}, expected [{d.vocab_size}, {d.hidden_size}]",
                                 source_path(emb.source))
        emb.source = RowOverride(emb.source, d.mask_token_id, _as_words(row, emb.dtype))
        front.append(emb)
        d.tensors[:0] = front  # llama.cpp's converter emits these two first
        return

    emb, head = by.get(EMBEDDING_TENSOR), by.get(OUTPUT_TENSOR)
    weights = target_tensors(target) if target is not None else None
    if emb is not None and not keep_embeddings and weights:
        t_emb = weights.get("embed")
        same_emb = t_emb is not None and _equal(emb.source, t_emb)
        same_head = head is None or d.draft_vocab_size is not None or (
            weights.get("head") is not None and _equal(head.source, weights["head"]))
        if same_emb and same_head:
            d.tensors.remove(emb)
            log.info("embed_tokens equals the target's: not written (llama.cpp shares the target's)")
            if head is not None and d.draft_vocab_size is None:
                d.tensors.remove(head)
            return
    if emb is not None and head is None:
        t_head = _target_head(target, d, "a drafter that ships embed_tokens but no lm_head")
        d.tensors.insert(d.tensors.index(emb) + 1, DrafterTensor(OUTPUT_TENSOR, f"{_HEAD} (target)", t_head))


def _target_tensor(target: Target | None, d: Drafter, which: str, why: str, what: str | None = None) -> TensorSource:
    weights = target_tensors(target) if target is not None else None
    ref = (weights or {}).get(which)
    if ref is None:
        what = what or ("embedding" if which == "embed" else "output head")
        raise InputFileError(f"{why} needs the target's {what}: pass --target-model-dir with the target's safetensors "
                             "(without it llama.cpp would tie the output head to the embedding)", d.source)
    return ref


def _target_head(target: Target | None, d: Drafter, why: str) -> TensorSource:
    tied = target is not None and target.tie_word_embeddings
    return _target_tensor(target, d, "embed" if tied else "head", why, "output head")
