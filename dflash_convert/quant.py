"""Element conversions between checkpoint dtypes and ggml output types, chunk by chunk.

Results are bit-exact with llama.cpp's converter (which widens everything that is not F16/F32 to
F32 first, then narrows with round-to-nearest-even) and with ggml's reference quantizer for Q8_0.
Each function works on a 1-D chunk, so callers stream a tensor in pieces of any size that is a
multiple of the block size. The arithmetic runs in torch: its element-wise float ops are IEEE
exact like numpy's, but multi-threaded and with fewer temporaries, which is where our speed over
the upstream converter comes from (see bench/).
"""

from __future__ import annotations

import numpy as np
import torch

from .format.ggml import GGMLType

# The float32 just below 0.5: adding it and truncating is C roundf(); adding 0.5 would turn
# 0.49999997 into 1.
_BELOW_HALF = float(np.nextafter(np.float32(0.5), np.float32(0)))

# safetensors dtype -> torch dtype of the raw words as stored
_TORCH_WORDS = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
}


def as_torch(raw: np.ndarray, src_dtype: str) -> torch.Tensor:
    """View raw little-endian words read from a checkpoint as a torch tensor of their dtype."""
    if src_dtype == "BF16":
        return torch.from_numpy(raw.view(np.int16)).view(torch.bfloat16)
    if src_dtype not in _TORCH_WORDS:
        raise ValueError(f"cannot convert {src_dtype} to a float type")
    return torch.from_numpy(raw)


def f32_to_bf16(x: torch.Tensor) -> torch.Tensor:
    """float32 -> bfloat16 words (int16): round to nearest even, NaN forced quiet, as ggml does."""
    u = x.view(torch.int32)
    # (u + 0x7fff + lsb) >> 16 in 32-bit two's complement equals ggml's unsigned arithmetic for
    # every non-NaN input; NaNs are fixed up below.
    r = torch.bitwise_right_shift(u + (0x7FFF + ((u >> 16) & 1)), 16).to(torch.int16)
    nan = torch.isnan(x)
    if bool(nan.any()):
        r[nan] = ((u[nan] >> 16) | 0x40).to(torch.int16)
    return r


def quiet_bf16_nans(words: torch.Tensor) -> torch.Tensor:
    """bfloat16 words copied through float32 and back by upstream: only signalling NaNs change."""
    w = words.view(torch.int16)
    nan = (w & 0x7FFF) > 0x7F80
    if bool(nan.any()):
        w = w.clone()
        w[nan] |= 0x40
    return w


def quantize_q8_0(x: torch.Tensor) -> torch.Tensor:
    """float32 (n*32,) -> Q8_0 blocks as bytes (n*34,): per 32 values an f16 scale and 32 int8.

    Same arithmetic as ggml's quantize_row_q8_0_ref: d = amax/127, q = roundf(x * (1/d)).
    """
    b = x.view(-1, 32)
    d = b.abs().amax(dim=1) / 127
    inv = torch.where(d == 0, 0.0, 1.0 / d)
    v = b * inv[:, None]
    v += torch.copysign(torch.full_like(v, _BELOW_HALF), v)
    out = torch.empty((b.shape[0], 34), dtype=torch.uint8)
    out[:, :2] = d.to(torch.float16).view(torch.uint8).view(-1, 2)
    out[:, 2:] = v.to(torch.int8).view(torch.uint8)  # float -> int truncates toward zero
    return out.view(-1)


def to_f16(x: torch.Tensor) -> torch.Tensor:
    """Any float -> float16, round to nearest even; NaN payloads as numpy (upstream) makes them."""
    out = x.to(torch.float16)
    nan = torch.isnan(out)
    if bool(nan.any()):
        out[nan] = torch.from_numpy(x[nan].to(torch.float32).numpy().astype(np.float16))
    return out


def encode(words: torch.Tensor, out_type: GGMLType) -> np.ndarray:
    """One chunk of source values (any float dtype) -> the output type's bytes as a numpy array."""
    src = words.dtype
    if out_type == GGMLType.BF16 and src == torch.bfloat16:
        out = quiet_bf16_nans(words)
    elif out_type == GGMLType.F16 and src in (torch.float16, torch.bfloat16):
        out = to_f16(words)  # bf16 -> f16 through f32 is exact, then one RNE rounding
    else:
        x = words if src == torch.float32 else words.to(torch.float32)
        if out_type == GGMLType.F32:
            out = x
        elif out_type == GGMLType.F16:
            out = to_f16(x)
        elif out_type == GGMLType.BF16:
            out = f32_to_bf16(x)
        elif out_type == GGMLType.Q8_0:
            out = quantize_q8_0(x)
        else:
            raise ValueError(f"output type {out_type.name} is not produced by the converter")
    return out.contiguous().numpy()
