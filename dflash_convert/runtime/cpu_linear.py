"""Float32 ``x @ w.T`` on the CPU through oneDNN where a caller asks for it: 1.4-2.5x MKL's on AMD Zen.

The same float32 arithmetic (exact products, float32 sums) in another summation order, so results
move at float32 rounding. ``runtime.accept`` turns it on for its drafts (``onednn_matmuls``); every
other caller keeps ``x @ w.T``. It falls back to that for anything but 2-D float32 CPU tensors, a
weight under MIN_WEIGHT_ELEMENTS, a torch without oneDNN, or a float32 matmul precision other than
the default. Spec: docs/acceptance.md, "Speed".
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

_ON: ContextVar[bool] = ContextVar("onednn_float32", default=False)
MIN_WEIGHT_ELEMENTS = 1 << 22  # smaller matrices: oneDNN's per-call cost outweighs its speed (a 256-wide drafter runs slower)


@contextmanager
def onednn_matmuls() -> Iterator[None]:
    """Inside the block, ``linear`` runs float32 CPU products through oneDNN."""
    token = _ON.set(True)
    try:
        yield
    finally:
        _ON.reset(token)


def _usable(x: torch.Tensor, w: torch.Tensor) -> bool:
    """oneDNN's float32 path applies: 2-D CPU float32, oneDNN built in, no reduced-precision float32 mode."""
    return (x.dim() == 2 and w.dim() == 2 and w.numel() >= MIN_WEIGHT_ELEMENTS and x.dtype == w.dtype == torch.float32
            and x.device.type == w.device.type == "cpu"
            and torch.backends.mkldnn.is_available() and torch.get_float32_matmul_precision() == "highest"
            and torch.backends.mkldnn.matmul.fp32_precision in ("none", "ieee"))


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w.T, through oneDNN inside ``onednn_matmuls`` where it applies."""
    if _ON.get() and _usable(x, w):
        return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
    return x @ w.T


__all__ = ["linear", "onednn_matmuls"]
