"""dflash-convert: DFlash drafter checkpoints -> llama.cpp `dflash` GGUF, checked and reproducible."""

__version__ = "0.1.0"

from .convert import ConversionPlan, convert, plan_conversion  # noqa: E402
from .errors import DFlashError  # noqa: E402

__all__ = ["ConversionPlan", "DFlashError", "__version__", "convert", "plan_conversion"]
