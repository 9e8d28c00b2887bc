"""The values the command table's type names take, from the format tables: a wrong one is a usage error.

Each returns the text as typed (the API resolves it again, the one resolution) or raises ValueError
with what it takes; the parser turns that into one usage line, exit 64.
"""

from __future__ import annotations

from ..format.file_types import OUTTYPES, QUANT_TYPES
from ..format.quant_types import resolve_ftype

AUTO = "auto"
ALL = "all"


def quant_type(text: str) -> str:
    """A quantize TYPE as llama-quantize names it (any case, Q4_K for Q4_K_M)."""
    try:
        known = resolve_ftype(text) in QUANT_TYPES
    except ValueError:
        known = False
    if not known:
        raise ValueError(f"{text!r} is not a quantization type (choose from {', '.join(QUANT_TYPES)})")
    return text


def outtype(text: str) -> str:
    """convert's --outtype: auto, a float type the converter writes, or a quantize TYPE."""
    if text == AUTO or text in OUTTYPES:
        return text
    try:
        return quant_type(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an output type (choose from {AUTO}, {', '.join(OUTTYPES)}, or a quantization "
                         f"type: {', '.join(QUANT_TYPES)})") from None


def _types(text: str, floats: tuple[str, ...], once: bool) -> str:
    """Comma-separated quantize TYPEs (and these float types), at least one; with ``once``, none twice."""
    seen: list[str] = []
    for item in (i.strip() for i in text.split(",") if i.strip()):
        name = item.upper() if item.upper() in floats else resolve_ftype(quant_type(item))
        if once and name in seen:
            raise ValueError(f"{text!r} names {name} twice")
        seen.append(name)
    if not seen:
        raise ValueError(f"{text!r} names no type")
    return text


def sweep_types(text: str) -> str:
    """sweep's --types: quantize TYPEs."""
    return _types(text, (), once=False)


def release_types(text: str) -> str:
    """publish's --types: quantize TYPEs and F32, each once."""
    return _types(text, ("F32",), once=True)


def layer_numbers(text: str) -> str:
    """Comma-separated layer numbers (0, 1, ...)."""
    try:
        ok = all(int(x) >= 0 for x in text.split(","))
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{text!r} is not a comma-separated list of layer numbers")
    return text


def layers_or_all(text: str) -> str:
    """capture's --layers: all, or comma-separated layer inputs."""
    if text != ALL:
        try:
            layer_numbers(",".join(x for x in text.split(",") if x.strip()))
        except ValueError:
            raise ValueError(f"{text!r} is neither {ALL} nor a comma-separated list of layer numbers") from None
    return text
