"""dflash-convert: DFlash drafter checkpoints -> llama.cpp `dflash` GGUF, checked and reproducible."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["ConversionPlan", "DFlashError", "__version__", "convert", "plan_conversion"]


def __getattr__(name: str) -> Any:
    # Lazy: `inspect` and other light commands should not pay for importing torch.
    if name in ("ConversionPlan", "convert", "plan_conversion"):
        from . import converter as _convert

        return getattr(_convert, name)
    if name == "DFlashError":
        from .errors import DFlashError

        return DFlashError
    raise AttributeError(name)
