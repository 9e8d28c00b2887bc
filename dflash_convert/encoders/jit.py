"""Which quantizer backend runs: numba-compiled kernels when numba is installed, else pure numpy.

Both backends are bit-identical with ggml (the tests run both), so the choice is only speed:
numba when it imports, unless ``DFLASH_CONVERT_NO_JIT`` is set. Kernels are cached on disk
(``cache=True``). Specification: docs/quantizers.md.
"""

from __future__ import annotations

import functools
import os
from types import ModuleType

NO_JIT_ENV = "DFLASH_CONVERT_NO_JIT"


def _wanted() -> bool:
    return os.environ.get(NO_JIT_ENV, "") in ("", "0")


@functools.cache
def kquant_kernels() -> ModuleType | None:
    """The K-quant search kernels (``_kquant_kernels``), or None when numba is missing or ``DFLASH_CONVERT_NO_JIT`` is set."""
    if not _wanted():
        return None
    try:
        # lazy: numba is optional and slow to import; commands that never quantize do not pay for it
        from . import _kquant_kernels
    except Exception:  # not only ImportError: numba refusing this numpy, or finding no writable cache dir, raises others
        return None
    return _kquant_kernels


@functools.cache
def legacy_kernels() -> ModuleType | None:
    """The legacy-block and float16 kernels (``_legacy_kernels``), or None as for ``kquant_kernels``."""
    if not jit_available():
        return None
    try:
        # lazy, as _kquant_kernels above: it imports numba
        from . import _legacy_kernels
    except Exception:  # as above: numba can fail in ways other than ImportError
        return None
    return _legacy_kernels


@functools.cache
def float_kernels() -> ModuleType | None:
    """The numba float-conversion kernels (``_float_kernels``), or None as for ``kquant_kernels``."""
    if not jit_available():
        return None
    try:
        # lazy, as _kquant_kernels above: it imports numba
        from . import _float_kernels
    except Exception:  # as above: numba can fail in ways other than ImportError
        return None
    return _float_kernels


@functools.cache
def iq3_kernels() -> ModuleType | None:
    """The IQ3_XXS / IQ3_S search kernel (``_iq3_kernels``), or None as for ``kquant_kernels``."""
    if not jit_available():
        return None
    try:
        # lazy, as _kquant_kernels above: it imports numba
        from . import _iq3_kernels
    except Exception:  # as above: numba can fail in ways other than ImportError
        return None
    return _iq3_kernels


def jit_available() -> bool:
    """Whether the numba kernels are used."""
    return kquant_kernels() is not None


@functools.cache
def iq2_kernels() -> ModuleType | None:
    """The IQ2/IQ1 search kernels compiled (``_iq2_jit``), or None as for ``kquant_kernels``."""
    if not jit_available():
        return None
    try:
        # lazy, as _kquant_kernels above: it imports numba
        from . import _iq2_jit
    except Exception:  # as above: numba can fail in ways other than ImportError
        return None
    return _iq2_jit
