"""Which torch device a command runs on."""

from __future__ import annotations

import torch

from ..errors import DFlashError

AUTO = "auto"


def resolve_device(device: str | torch.device) -> torch.device:
    """``auto``: CUDA when torch sees a device, else the CPU."""
    if str(device) == AUTO:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise DFlashError(f"unknown device {device!r}: {e}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DFlashError(f"device {device!r} requested but torch sees no CUDA device")
    return dev
