"""dflash-convert: DFlash drafter checkpoints -> llama.cpp `dflash` GGUF, checked and reproducible."""

from __future__ import annotations

from typing import Any

from ._version import __version__
from .errors import DFlashError

__all__ = ["ConversionPlan", "DFlashError", "__version__", "convert", "plan_conversion"]


def __getattr__(name: str) -> Any:
    if name in ("ConversionPlan", "convert", "plan_conversion"):
        # PEP 562: `import dflash_convert` stays cheap for child processes and light commands;
        # the conversion API (numpy, every reader) loads on first use
        from . import conversion

        return getattr(conversion, name)
    raise AttributeError(name)
