"""A hook on the runner's matrix multiplications: what ``imatrix`` collects its statistics through.

The runner calls :func:`observe` with each weight (or head) and its input before any CPU rounding
of the activations; with no observer installed (every command but ``imatrix``) the call does
nothing. Specification: docs/quantize.md, "Importance matrix".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

# (the weight object the runner multiplies by, its input rows [n, in]) -> None
Observer = Callable[[object, torch.Tensor], None]
_OBSERVER: ContextVar[Observer | None] = ContextVar("matmul_observer", default=None)


def observe(weight: object, x: torch.Tensor) -> None:
    """Hand one matmul's input to the installed observer, if any."""
    o = _OBSERVER.get()
    if o is not None:
        o(weight, x.reshape(-1, x.shape[-1]))


@contextmanager
def observing(observer: Observer) -> Iterator[None]:
    """Install ``observer`` for the duration of the block."""
    token = _OBSERVER.set(observer)
    try:
        yield
    finally:
        _OBSERVER.reset(token)


__all__ = ["Observer", "observe", "observing"]
