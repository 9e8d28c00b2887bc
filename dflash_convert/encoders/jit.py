"""Which quantizer backend runs: numba-compiled kernels when numba is installed, else pure numpy.

The numpy quantizers are bound by memory traffic and numpy's per-call cost in the K-quant scale
searches; the same C loops compiled by numba run in registers. Both backends are bit-identical with
ggml (the tests run both), so the choice is only about speed: numba when it imports, unless
``DFLASH_CONVERT_NO_JIT`` is set. The package works without numba, where it has no wheel or fails
to import. The kernels compile on first use and are cached on disk (numba's ``cache=True``: beside
the module, or under ``NUMBA_CACHE_DIR``), so later processes only load them.

Specification: docs/quantizers.md.
"""

from __future__ import annotations

import functools
import os
from types import ModuleType

NO_JIT_ENV = "DFLASH_CONVERT_NO_JIT"


@functools.cache
def kernels() -> ModuleType | None:
    """The numba kernel module, or None when numba is missing or ``DFLASH_CONVERT_NO_JIT`` is set."""
    if os.environ.get(NO_JIT_ENV, "") not in ("", "0"):
        return None
    try:
        # lazy: numba is optional and takes about half a second to import (llvmlite with it);
        # commands that never quantize should not pay for it
        from . import _kernels
    except Exception:  # not only ImportError: numba refusing this numpy, or finding no writable cache dir, raises others
        return None
    return _kernels


@functools.cache
def float_kernels() -> ModuleType | None:
    """The numba float-conversion kernels (``_float_kernels``), or None as for ``kernels``."""
    if kernels() is None:
        return None
    try:
        # lazy, as _kernels above: it imports numba
        from . import _float_kernels
    except Exception:  # as above: numba can fail in ways other than ImportError
        return None
    return _float_kernels


def jit_available() -> bool:
    """Whether the numba kernels are used."""
    return kernels() is not None

