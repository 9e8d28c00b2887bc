"""A target GGUF run by llama.cpp's own library: its tokens, greedy continuation and layer inputs.

``open_gguf_target`` reads the file with our hardened GGUF reader first and refuses what llama.cpp
would abort on or cannot tap: a file that is not a model, an architecture whose graph records no
layer inputs, a layer index past what it records. ``GGUFTarget`` then decodes as
``llama-speculative-simple``'s target does. Specification: docs/acceptance.md ("Capturing from a
target GGUF").
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DFlashError, InputFileError
from ..files import check_regular_file
from ..format.keys import key
from ..format.rules import DRAFTER_ARCHS, LAST_LAYER_OUTPUT_ARCHS, LAYER_INPUT_TARGET_ARCHS
from ..sources.gguf import read_gguf
from ..target import decoder_layers
from .libllama import SUPPORTED_COMMIT, LibLlama

IMATRIX_TYPE = "imatrix"  # general.type of llama-imatrix's files


@dataclass(frozen=True)
class GGUFTargetInfo:
    """What our reader says of a target GGUF before llama.cpp sees it."""

    path: Path
    architecture: str
    n_layers: int  # decoder layers (nextn layers excluded)
    hidden_size: int
    context_length: int | None
    file_type: int | None

    def layer_indices(self) -> range:
        """The layer-input indices llama.cpp records for this architecture."""
        last = self.n_layers + 1 if self.architecture in LAST_LAYER_OUTPUT_ARCHS else self.n_layers
        return range(0, last)


def inspect_gguf_target(path: str | Path) -> GGUFTargetInfo:
    """Check that ``path`` is a target model llama.cpp can tap, and read its sizes."""
    path = Path(path)
    check_regular_file(path, "target GGUF")
    g = read_gguf(path)
    try:
        if g.get(key("type")) == IMATRIX_TYPE:
            raise InputFileError(f"this is an importance matrix ({key('type')} {IMATRIX_TYPE}), not a model; pass the "
                                 "target's GGUF", path)
        arch = g.architecture
        if arch is None:
            raise InputFileError(f"target GGUF has no {key('architecture')}: not a model", path)
        if arch in DRAFTER_ARCHS:
            raise InputFileError(f"this is a {arch} drafter, not a target model; pass the target's GGUF", path)
        if arch not in LAYER_INPUT_TARGET_ARCHS:
            raise DFlashError(f"llama.cpp {SUPPORTED_COMMIT} does not record the layer inputs of a {arch!r} model, so no "
                              f"drafter can read this target (architectures that do: {', '.join(LAYER_INPUT_TARGET_ARCHS)})", path)

        def count(short: str) -> int | None:
            v = g.get(key(short, arch))
            return v if type(v) is int and v > 0 else None

        blocks, hidden = count("block_count"), count("embedding_length")
        if blocks is None or hidden is None:
            raise InputFileError(f"target GGUF lacks a positive {key('block_count', arch)} or {key('embedding_length', arch)}",
                                 path)
        nextn = g.get(key("nextn_predict_layers", arch))
        ftype = g.get(key("file_type"))
        return GGUFTargetInfo(path, arch, decoder_layers(blocks, nextn if type(nextn) is int else None) or 0, hidden,
                              count("context_length"), ftype if type(ftype) is int else None)
    finally:
        g.close()


class GGUFTarget:
    """One llama.cpp model and context over a target GGUF; ``close`` frees both."""

    def __init__(self, lib: LibLlama, info: GGUFTargetInfo, *, n_ctx: int = 0, threads: int = 1, n_gpu_layers: int = 0,
                 vocab_only: bool = False) -> None:
        self.lib, self.info, self.n_ctx = lib, info, n_ctx
        self.model = self.ctx = None
        mp = lib.model_params()
        mp.n_gpu_layers, mp.vocab_only = n_gpu_layers, vocab_only
        self.model = lib.llama_model_load_from_file(str(info.path).encode(), mp)
        if not self.model:
            raise InputFileError(f"llama.cpp cannot load this model: {self._why('no reason given')}", info.path)
        self.vocab = lib.llama_model_get_vocab(self.model)
        self.n_vocab = lib.llama_vocab_n_tokens(self.vocab)
        if vocab_only:
            return
        if lib.llama_model_n_embd(self.model) != info.hidden_size:
            raise InputFileError(f"llama.cpp reads a hidden size of {lib.llama_model_n_embd(self.model)}, the file's metadata "
                                 f"says {info.hidden_size}", info.path)
        cp = lib.context_params()
        cp.n_ctx = cp.n_batch = n_ctx  # one llama_decode call covers a whole sequence
        cp.n_ubatch = min(cp.n_ubatch, n_ctx)
        cp.n_threads = cp.n_threads_batch = threads
        self.ctx = lib.llama_init_from_model(self.model, cp)
        if not self.ctx:
            self.close()
            raise DFlashError(f"llama.cpp cannot create a context of {n_ctx} tokens for this model: "
                              f"{self._why('no reason given')}", info.path)
        self.memory = lib.llama_get_memory(self.ctx)
        self.taps: tuple[int, ...] = ()

    def _why(self, default: str) -> str:
        return self.lib.errors[-1] if self.lib.errors else default

    def close(self) -> None:
        """Free the context and the model."""
        if self.ctx:
            self.lib.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            self.lib.llama_model_free(self.model)
            self.model = None

    def tokenize(self, text: str) -> list[int]:
        """``text`` as llama-speculative-simple's -p tokenizes it: special tokens added and parsed."""
        raw = text.encode("utf-8", "surrogatepass")
        room = len(raw) + 16
        buf = (ctypes.c_int32 * room)()
        n = self.lib.llama_tokenize(self.vocab, raw, len(raw), buf, room, True, True)
        if n < 0:  # more tokens than bytes + 16 is impossible for a byte-level vocabulary; asked again all the same
            room = -n
            buf = (ctypes.c_int32 * room)()
            n = self.lib.llama_tokenize(self.vocab, raw, len(raw), buf, room, True, True)
        if n < 0:
            raise DFlashError("llama.cpp could not tokenize a prompt", self.info.path)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes a token prints as, special tokens rendered (as common_token_to_piece)."""
        buf = ctypes.create_string_buffer(256)
        n = self.lib.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self.lib.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        return buf.raw[:max(n, 0)]

    def eog_ids(self) -> list[int]:
        """Every id the vocabulary says ends a generation."""
        return [i for i in range(self.n_vocab) if self.lib.llama_vocab_is_eog(self.vocab, i)]

    def _decode(self, tokens: list[int]) -> None:
        arr = (ctypes.c_int32 * len(tokens))(*tokens)
        rc = self.lib.llama_decode(self.ctx, self.lib.llama_batch_get_one(arr, len(tokens)))
        if rc != 0:
            raise DFlashError(f"llama_decode failed ({rc}): {self._why('no reason given')}", self.info.path)

    def greedy(self, prompt: list[int], n_new: int) -> list[int]:
        """The prompt then up to ``n_new`` greedy tokens, ending early at (and keeping) an end-of-generation id."""
        if len(prompt) + n_new > self.n_ctx:
            raise DFlashError(f"a prompt of {len(prompt)} tokens and {n_new} new ones do not fit the context of "
                              f"{self.n_ctx} tokens (--ctx-size)", self.info.path)
        self.lib.llama_memory_clear(self.memory, True)
        out, step = list(prompt), list(prompt)
        for _ in range(n_new):
            self._decode(step)
            logits = np.ctypeslib.as_array(self.lib.llama_get_logits_ith(self.ctx, -1), (self.n_vocab,))
            nxt = int(np.argmax(logits))  # the first of equal maxima, as llama.cpp's greedy sampler picks
            out.append(nxt)
            if self.lib.llama_vocab_is_eog(self.vocab, nxt):
                break
            step = [nxt]
        return out

    def layer_inputs(self, tokens: list[int], lids: list[int]) -> np.ndarray:
        """[len(lids), len(tokens), hidden] float32: the input of each layer ``lid`` at every position."""
        bad = [x for x in lids if x not in self.info.layer_indices()]
        if bad:
            raise DFlashError(f"llama.cpp records layer inputs 0..{self.info.layer_indices()[-1]} of this "
                              f"{self.info.architecture} model, not {bad[0]}", self.info.path)
        if tuple(lids) != self.taps:
            for lid in set(self.taps) - set(lids):
                self.lib.llama_set_embeddings_layer_inp(self.ctx, lid, False)
            for lid in lids:
                self.lib.llama_set_embeddings_layer_inp(self.ctx, lid, True)
            self.taps = tuple(lids)
        self.lib.llama_memory_clear(self.memory, True)
        self._decode(tokens)
        out = np.empty((len(lids), len(tokens), self.info.hidden_size), dtype=np.float32)
        for j, lid in enumerate(lids):
            rows = self.lib.llama_get_embeddings_layer_inp(self.ctx, lid)
            out[j] = np.ctypeslib.as_array(rows, (len(tokens), self.info.hidden_size))
        return out


__all__ = ["GGUFTarget", "GGUFTargetInfo", "inspect_gguf_target"]
