"""llama.cpp's own library through ctypes: load a target GGUF, decode it, read its layer inputs.

Refuses, as one error line, a library that lacks a call used here or whose default parameter
structs do not read back as llama.cpp 0c1e57098 fills them. The layer-input calls are found by
their Itanium-mangled names. Specification: docs/acceptance.md ("Capturing from a target GGUF").
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import DFlashError, InputFileError

LIBLLAMA_ENV = "DFLASH_CONVERT_LIBLLAMA"
LLAMA_CPP_PYTHON = "llama-cpp-python"
SUPPORTED_BINDING = "0.3.36"  # the llama-cpp-python release that vendors llama.cpp 0c1e57098
SUPPORTED_COMMIT = "0c1e57098"
HOW_TO_GET = (f"install it with pip install 'dflash-convert[llama]' ({LLAMA_CPP_PYTHON}=={SUPPORTED_BINDING}), "
              f"or pass --libllama a libllama built from llama.cpp {SUPPORTED_COMMIT}")
LIBRARY_NAMES = {"linux": "libllama.so", "darwin": "libllama.dylib", "win32": "llama.dll"}

# public name -> the symbol to look up (C linkage, or the Itanium name of a src/llama-ext.h declaration)
LAYER_INPUT_SYMBOLS = {
    "llama_set_embeddings_layer_inp": "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
    "llama_get_embeddings_layer_inp": "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
}
# present at 0c1e57098 and not in older releases: a library without them is another version
VERSION_MARKERS = ("llama_process", "llama_model_n_ctx_train")


class LlamaModelParams(ctypes.Structure):
    """``struct llama_model_params`` (include/llama.h at 0c1e57098)."""

    _fields_ = [
        ("devices", ctypes.c_void_p),
        ("tensor_buft_overrides", ctypes.c_void_p),
        ("n_gpu_layers", ctypes.c_int32),
        ("split_mode", ctypes.c_int),
        ("load_mode", ctypes.c_int),
        ("lazy_mode", ctypes.c_int),
        ("main_gpu", ctypes.c_int32),
        ("tensor_split", ctypes.c_void_p),
        ("progress_callback", ctypes.c_void_p),
        ("progress_callback_user_data", ctypes.c_void_p),
        ("kv_overrides", ctypes.c_void_p),
        ("vocab_only", ctypes.c_bool),
        ("check_tensors", ctypes.c_bool),
        ("use_extra_bufts", ctypes.c_bool),
        ("no_host", ctypes.c_bool),
        ("no_alloc", ctypes.c_bool),
        ("load_mtp", ctypes.c_bool),
    ]


class LlamaContextParams(ctypes.Structure):
    """``struct llama_context_params`` (include/llama.h at 0c1e57098)."""

    _fields_ = [
        ("n_ctx", ctypes.c_uint32),
        ("n_batch", ctypes.c_uint32),
        ("n_ubatch", ctypes.c_uint32),
        ("n_seq_max", ctypes.c_uint32),
        ("n_rs_seq", ctypes.c_uint32),
        ("n_outputs_max", ctypes.c_uint32),
        ("n_outputs_max_per_seq", ctypes.c_uint32),
        ("n_threads", ctypes.c_int32),
        ("n_threads_batch", ctypes.c_int32),
        ("ctx_type", ctypes.c_int),
        ("rope_scaling_type", ctypes.c_int),
        ("pooling_type", ctypes.c_int),
        ("attention_type", ctypes.c_int),
        ("flash_attn_type", ctypes.c_int),
        ("rope_freq_base", ctypes.c_float),
        ("rope_freq_scale", ctypes.c_float),
        ("yarn_ext_factor", ctypes.c_float),
        ("yarn_attn_factor", ctypes.c_float),
        ("yarn_beta_fast", ctypes.c_float),
        ("yarn_beta_slow", ctypes.c_float),
        ("yarn_orig_ctx", ctypes.c_uint32),
        ("defrag_thold", ctypes.c_float),
        ("cb_eval", ctypes.c_void_p),
        ("cb_eval_user_data", ctypes.c_void_p),
        ("type_k", ctypes.c_int),
        ("type_v", ctypes.c_int),
        ("abort_callback", ctypes.c_void_p),
        ("abort_callback_data", ctypes.c_void_p),
        ("embeddings", ctypes.c_bool),
        ("offload_kqv", ctypes.c_bool),
        ("no_perf", ctypes.c_bool),
        ("op_offload", ctypes.c_bool),
        ("swa_full", ctypes.c_bool),
        ("kv_unified", ctypes.c_bool),
        ("samplers", ctypes.c_void_p),
        ("n_samplers", ctypes.c_size_t),
        ("ctx_other", ctypes.c_void_p),
    ]


class LlamaBatch(ctypes.Structure):
    """``struct llama_batch``."""

    _fields_ = [
        ("n_tokens", ctypes.c_int32),
        ("token", ctypes.POINTER(ctypes.c_int32)),
        ("embd", ctypes.POINTER(ctypes.c_float)),
        ("pos", ctypes.POINTER(ctypes.c_int32)),
        ("n_seq_id", ctypes.POINTER(ctypes.c_int32)),
        ("seq_id", ctypes.POINTER(ctypes.POINTER(ctypes.c_int32))),
        ("logits", ctypes.POINTER(ctypes.c_int8)),
    ]


# the fields a default struct must hold at this version (src/llama-context.cpp, src/llama-model.cpp):
# values at the wrong offsets mean another layout, and passing our struct would misconfigure llama.cpp
CONTEXT_DEFAULTS = {"n_ctx": 512, "n_batch": 2048, "n_ubatch": 512, "n_seq_max": 1, "n_outputs_max_per_seq": 1,
                    "flash_attn_type": -1, "yarn_ext_factor": -1.0, "defrag_thold": -1.0, "type_k": 1, "type_v": 1,
                    "embeddings": False, "offload_kqv": True, "no_perf": True, "op_offload": True, "swa_full": True,
                    "kv_unified": False, "n_samplers": 0, "ctx_other": None}
MODEL_DEFAULTS = {"n_gpu_layers": -1, "split_mode": 1, "load_mode": -1, "lazy_mode": 1, "main_gpu": 0,
                  "vocab_only": False, "use_extra_bufts": True, "load_mtp": False}
STRUCT_NAMES = {LlamaContextParams: "struct llama_context_params", LlamaModelParams: "struct llama_model_params"}
_SPARE = 512  # bytes past our struct for a default-params call: a larger struct from another version lands there

_P = ctypes.c_void_p
_LOG_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
GGML_LOG_LEVEL_ERROR = 4
# name -> (argument types, result type) of every C call used
C_CALLS: dict[str, tuple[list, object]] = {
    "llama_backend_init": ([], None),
    "llama_log_set": ([_LOG_CALLBACK, _P], None),
    "llama_model_load_from_file": ([ctypes.c_char_p, LlamaModelParams], _P),
    "llama_model_free": ([_P], None),
    "llama_init_from_model": ([_P, LlamaContextParams], _P),
    "llama_free": ([_P], None),
    "llama_model_get_vocab": ([_P], _P),
    "llama_model_n_layer": ([_P], ctypes.c_int32),
    "llama_model_n_embd": ([_P], ctypes.c_int32),
    "llama_model_n_ctx_train": ([_P], ctypes.c_int32),
    "llama_vocab_n_tokens": ([_P], ctypes.c_int32),
    "llama_vocab_is_eog": ([_P, ctypes.c_int32], ctypes.c_bool),
    "llama_tokenize": ([_P, ctypes.c_char_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32), ctypes.c_int32,
                        ctypes.c_bool, ctypes.c_bool], ctypes.c_int32),
    "llama_batch_get_one": ([ctypes.POINTER(ctypes.c_int32), ctypes.c_int32], LlamaBatch),
    "llama_decode": ([_P, LlamaBatch], ctypes.c_int32),
    "llama_get_logits_ith": ([_P, ctypes.c_int32], ctypes.POINTER(ctypes.c_float)),
    "llama_get_memory": ([_P], _P),
    "llama_memory_clear": ([_P, ctypes.c_bool], None),
    "llama_n_ctx": ([_P], ctypes.c_uint32),
    "llama_token_to_piece": ([_P, ctypes.c_int32, ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_bool],
                             ctypes.c_int32),
    "llama_process": ([_P, ctypes.c_int, _P], ctypes.c_int32),
}
LAYER_INPUT_CALLS: dict[str, tuple[list, object]] = {
    "llama_set_embeddings_layer_inp": ([_P, ctypes.c_uint32, ctypes.c_bool], None),
    "llama_get_embeddings_layer_inp": ([_P, ctypes.c_uint32], ctypes.POINTER(ctypes.c_float)),
}


@dataclass
class LibLlama:
    """A loaded, checked libllama: its path, where it came from, and its calls as attributes."""

    path: Path
    origin: str  # "--libllama", the environment variable, or the package
    cdll: ctypes.CDLL
    errors: list[str]  # llama.cpp's own error-level log lines, newest last

    def __getattr__(self, name: str):
        return getattr(self.cdll, LAYER_INPUT_SYMBOLS.get(name, name))

    def model_params(self) -> LlamaModelParams:
        """llama.cpp's default model parameters."""
        return _defaults(self.cdll, "llama_model_default_params", LlamaModelParams)

    def context_params(self) -> LlamaContextParams:
        """llama.cpp's default context parameters."""
        return _defaults(self.cdll, "llama_context_default_params", LlamaContextParams)


def find_libllama(explicit: str | os.PathLike | None = None) -> tuple[Path, str]:
    """(path, origin) of the libllama to load: ``explicit``, else the environment variable, else the package's."""
    if explicit is not None:
        return Path(explicit), "--libllama"
    if os.environ.get(LIBLLAMA_ENV):
        return Path(os.environ[LIBLLAMA_ENV]), LIBLLAMA_ENV
    spec = importlib.util.find_spec("llama_cpp")  # finds the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise DFlashError(f"capture --target-gguf runs llama.cpp's library, and none was found: {HOW_TO_GET}, "
                          f"or set {LIBLLAMA_ENV}")
    try:
        version = importlib.metadata.version(LLAMA_CPP_PYTHON)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    if version != SUPPORTED_BINDING:
        raise DFlashError(f"{LLAMA_CPP_PYTHON} {version} is installed; capture --target-gguf needs "
                          f"{SUPPORTED_BINDING} (llama.cpp {SUPPORTED_COMMIT}): {HOW_TO_GET}")
    name = LIBRARY_NAMES.get(sys.platform, "libllama.so")
    return Path(list(spec.submodule_search_locations)[0]) / "lib" / name, LLAMA_CPP_PYTHON


def load_libllama(explicit: str | os.PathLike | None = None) -> LibLlama:
    """Find, load and check libllama: every call present, the parameter structs of our version."""
    path, origin = find_libllama(explicit)
    if not path.is_file():
        raise InputFileError(f"no libllama here (from {origin}): {HOW_TO_GET}", path)
    try:
        cdll = ctypes.CDLL(str(path))
    except OSError as e:
        raise InputFileError(f"not a loadable shared library ({str(e).splitlines()[0]}): {HOW_TO_GET}", path) from None
    for name, symbol in [(n, n) for n in (*C_CALLS, *VERSION_MARKERS)] + list(LAYER_INPUT_SYMBOLS.items()):
        if not hasattr(cdll, symbol):
            what = "the layer-input call" if name in LAYER_INPUT_SYMBOLS else "the call"
            raise DFlashError(f"this libllama lacks {what} {name} ({symbol}): it is not llama.cpp {SUPPORTED_COMMIT}'s "
                              f"library; {HOW_TO_GET}", path)
    for name, (args, res) in {**C_CALLS, **LAYER_INPUT_CALLS}.items():
        fn = getattr(cdll, LAYER_INPUT_SYMBOLS.get(name, name))
        fn.argtypes, fn.restype = args, res
    lib = LibLlama(path, origin, cdll, [])
    _check_layout(lib)
    _route_log(lib)
    lib.llama_backend_init()
    return lib


def _defaults(cdll: ctypes.CDLL, fn_name: str, struct: type[ctypes.Structure]) -> ctypes.Structure:
    # returned into a buffer larger than ours, so a library whose struct is larger cannot write past it
    padded = type(f"{struct.__name__}Padded", (ctypes.Structure,),
                  {"_fields_": [("head", struct), ("spare", ctypes.c_uint8 * _SPARE)]})
    fn = getattr(cdll, fn_name)
    fn.argtypes, fn.restype = [], padded
    return fn().head


def _check_layout(lib: LibLlama) -> None:
    """Refuse a library whose default parameters do not read back as our version's."""
    for fn_name, struct, expected in (("llama_context_default_params", LlamaContextParams, CONTEXT_DEFAULTS),
                                      ("llama_model_default_params", LlamaModelParams, MODEL_DEFAULTS)):
        if not hasattr(lib.cdll, fn_name):
            raise DFlashError(f"this libllama lacks the call {fn_name}: {HOW_TO_GET}", lib.path)
        got = _defaults(lib.cdll, fn_name, struct)
        wrong = [f for f, v in expected.items() if getattr(got, f) != v]
        if wrong:
            raise DFlashError(f"this libllama's {STRUCT_NAMES[struct]} does not have llama.cpp {SUPPORTED_COMMIT}'s "
                              f"layout ({wrong[0]} reads {getattr(got, wrong[0])!r}, expected {expected[wrong[0]]!r}): "
                              f"it is another version; {HOW_TO_GET}", lib.path)


def _route_log(lib: LibLlama) -> None:
    """llama.cpp's log goes nowhere but its error lines, kept for the message of a failed call."""
    def log(level: int, text: bytes | None, _user: object) -> None:
        if level == GGML_LOG_LEVEL_ERROR and text:
            lib.errors.append(text.decode("utf-8", "replace").strip())
            del lib.errors[:-8]

    lib._log_callback = _LOG_CALLBACK(log)  # kept alive as long as the library
    lib.llama_log_set(lib._log_callback, None)


__all__ = ["LIBLLAMA_ENV", "LibLlama", "find_libllama", "load_libllama"]
