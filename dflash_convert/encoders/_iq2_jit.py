"""The numba-compiled IQ2/IQ1 kernels: ``_iq2_kernels``' functions, compiled (and cached on disk) as they are.

Importing this module imports numba; only ``jit.iq2_kernels()`` does, lazily. Specification:
docs/quantizers.md, "IQ2 and IQ1".
"""

from __future__ import annotations

import numba

from . import _iq2_kernels

_njit = numba.njit(nogil=True, cache=True, fastmath=False, error_model="numpy", boundscheck=False)

iq2_blocks = _njit(_iq2_kernels.iq2_blocks)
iq1_blocks = _njit(_iq2_kernels.iq1_blocks)
