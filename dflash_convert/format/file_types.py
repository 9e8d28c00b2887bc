"""File types (``general.file_type``): every name, value and matrix type in one table.

Each row is a ``LLAMA_FTYPE_*``: its ``general.file_type`` value, the ggml type its quantizable
tensors default to, the name a user types (case-insensitive); ``outtype`` is convert's spelling for
the four types upstream's converter writes, ``quantize`` marks the types our quantize writes.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ggml import FLOAT_TYPES, GGMLType


@dataclass(frozen=True)
class FileType:
    """One llama.cpp file type: its name, ``general.file_type`` value and default type of quantizable tensors."""
    name: str
    value: int  # LLAMA_FTYPE_* = general.file_type
    matrix_type: GGMLType  # the default ggml type of quantizable tensors
    outtype: str | None = None  # convert --outtype name, for the types upstream's converter writes
    quantize: bool = True  # written by our quantize

    @property
    def quantized(self) -> bool:
        """Not a plain float type: llama-quantize's mixes and fallbacks apply."""
        return self.matrix_type not in FLOAT_TYPES


# in the order commands list them
FILE_TYPES: dict[str, FileType] = {ft.name: ft for ft in (
    FileType("F32", 0, GGMLType.F32, "f32", quantize=False),
    FileType("F16", 1, GGMLType.F16, "f16"),
    FileType("BF16", 32, GGMLType.BF16, "bf16"),
    FileType("Q8_0", 7, GGMLType.Q8_0, "q8_0"),
    FileType("Q4_0", 2, GGMLType.Q4_0),
    FileType("Q4_1", 3, GGMLType.Q4_1),
    FileType("Q5_0", 8, GGMLType.Q5_0),
    FileType("Q5_1", 9, GGMLType.Q5_1),
    FileType("Q2_K", 10, GGMLType.Q2_K),
    FileType("Q3_K_S", 11, GGMLType.Q3_K),
    FileType("Q3_K_M", 12, GGMLType.Q3_K),
    FileType("Q3_K_L", 13, GGMLType.Q3_K),
    FileType("Q4_K_S", 14, GGMLType.Q4_K),
    FileType("Q4_K_M", 15, GGMLType.Q4_K),
    FileType("Q5_K_S", 16, GGMLType.Q5_K),
    FileType("Q5_K_M", 17, GGMLType.Q5_K),
    FileType("Q6_K", 18, GGMLType.Q6_K),
    FileType("IQ4_NL", 25, GGMLType.IQ4_NL),
    FileType("IQ4_XS", 30, GGMLType.IQ4_XS),
    FileType("TQ1_0", 36, GGMLType.TQ1_0),
    FileType("TQ2_0", 37, GGMLType.TQ2_0),
    FileType("IQ3_XXS", 23, GGMLType.IQ3_XXS),
    FileType("IQ3_XS", 22, GGMLType.IQ3_S),
    FileType("IQ3_S", 26, GGMLType.IQ3_S),
    FileType("IQ3_M", 27, GGMLType.IQ3_S),
    FileType("Q2_K_S", 21, GGMLType.Q2_K),
    FileType("Q1_0", 40, GGMLType.Q1_0),
    FileType("Q2_0", 41, GGMLType.Q2_0),
    FileType("IQ2_XXS", 19, GGMLType.IQ2_XXS),
    FileType("IQ2_XS", 20, GGMLType.IQ2_XS),
    FileType("IQ2_S", 28, GGMLType.IQ2_XS),  # llama.cpp's IQ2_S file is IQ2_XS by default; IQ2_M is the IQ2_S one
    FileType("IQ2_M", 29, GGMLType.IQ2_S),
    FileType("IQ1_S", 24, GGMLType.IQ1_S),
    FileType("IQ1_M", 31, GGMLType.IQ1_M),
)}

# quantize.cpp's aliases: the bare K names mean the _M mix
FTYPE_ALIASES: dict[str, str] = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}

# views of the one table
OUTTYPES: dict[str, FileType] = {ft.outtype: ft for ft in FILE_TYPES.values() if ft.outtype}
QUANT_TYPES: tuple[str, ...] = tuple(name for name, ft in FILE_TYPES.items() if ft.quantize)
FILE_TYPE_NAMES: dict[int, str] = {ft.value: name for name, ft in FILE_TYPES.items()}
