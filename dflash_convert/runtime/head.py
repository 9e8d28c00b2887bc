"""The head's greedy tokens without every logit in float32: a bf16 screen, float32 only where it decides.

``head_argmax``: per row of ``x``, the argmax of ``x @ W.T`` as float32 ranks it; the rows that could
beat a bf16 screen's best are recomputed in float32. CPU only; returns None (take the float32 product)
for non-finite inputs, a bf16 kernel that fails the probe, or too many candidates.
Spec: docs/acceptance.md, "Speed".
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import torch

from .weights import HEAD_CHUNK_ROWS, LazyMatrix

U_BF16 = 2.0 ** -8  # RNE to bf16: |y - acc| <= 2^-8 |y| (half an ulp of 8 significant bits)
U_ACC = 2.0 ** -23  # one float32 accumulation step, any rounding mode (2u, u = 2^-24)
TINY = 2.0 ** -100  # covers products that underflow below float32's normal range (flushed to zero)
SMALLEST_NORMAL = 2.0 ** -126  # bf16 and float32 share it; smaller values are flushed before the screen
MAX_CANDIDATE_SHARE = 0.25  # more distinct candidate rows than this share of W: the float32 product is cheaper
MIN_CANDIDATES = 1024  # ...unless there are this few
PROBE_ROWS = (1, 7, 64, 240)  # activation row counts the kernel probe covers (accept's passes: 1..batch*n_max)


@dataclass
class Screen:
    """W rounded to bf16, with the norms that bound the screen's error."""

    low: torch.Tensor  # [V, E] bf16, subnormals flushed to zero
    exact: bool  # low holds W's values exactly (a BF16 head): candidate rows are read from it
    norm: float  # >= every ||W_j|| and ||low_j||
    diff: float  # >= every ||W_j - low_j||


_SCREENS: weakref.WeakKeyDictionary[LazyMatrix, Screen] = weakref.WeakKeyDictionary()
_SOUND: dict[int, bool] = {}  # row width -> whether the bf16 matmul kept the bound on the probe


def _flush(t: torch.Tensor) -> torch.Tensor:
    """Subnormals to zero: the bf16 kernel treats them so (DAZ); the norms then account for the change."""
    return torch.where(t.abs() < SMALLEST_NORMAL, torch.zeros_like(t), t)


def _norms(t: torch.Tensor) -> torch.Tensor:
    """An upper bound of each row's 2-norm: float32's, widened by its worst rounding and by squares that underflow."""
    k = t.shape[-1]
    return torch.linalg.vector_norm(t.float(), dim=-1).double() * (1 + 2 * gamma(k + 2)) + math.sqrt(k) * 2.0 ** -63


def gamma(k: int) -> float:
    """Higham's gamma_k for float32 accumulation of k exact products in any order."""
    return k * U_ACC / (1 - k * U_ACC)


def screen_of(m: LazyMatrix) -> Screen:
    """``m``'s screen, built once (one pass over its rows) and kept while ``m`` lives."""
    s = _SCREENS.get(m)
    if s is not None:
        return s
    n = m.shape[0]
    low = torch.empty(m.shape, dtype=torch.bfloat16)
    exact, norm, diff = True, 0.0, 0.0
    for a in range(0, n, HEAD_CHUNK_ROWS):
        vals = m.row_range(a, min(n, a + HEAD_CHUNK_ROWS)).float().cpu()
        part = vals.to(torch.bfloat16)
        flushed = (part != 0) & (part.abs() < SMALLEST_NORMAL)
        if bool(flushed.any()):
            part[flushed] = 0
        low[a:a + part.shape[0]] = part
        norm = max(norm, float(_norms(vals).max()))
        # a value whose low 16 bits are zero is a bf16 value: only subnormals then change
        if bool(flushed.any()) or bool((vals.view(torch.int32) & 0xFFFF).any()):
            back = part.float()
            exact = exact and torch.equal(back, vals)
            norm = max(norm, float(_norms(back).max()))
            diff = max(diff, float(_norms(vals - back).max()))
    s = _SCREENS[m] = Screen(low, exact, norm, diff)
    return s


def screen_bounds(x: torch.Tensor, low_x: torch.Tensor, s: Screen) -> torch.Tensor:
    """Per row r: a_r with |y_rj - z_rj| <= 2^-8 |y_rj| + a_r and |f_rj - z_rj| folded in (float64).

    z is the exact product x.W_j, y the bf16 screen's value, f any float32 product's value.
    """
    k = x.shape[-1]
    nx, nlow, ndx = _norms(x), _norms(low_x.float()), _norms(x - low_x.float())
    g = gamma(k)
    return (g * (nlow + nx) * s.norm + nlow * s.diff + ndx * s.norm) * (1 + 1e-6) + 2 * k * TINY  # 1e-6: float64


def candidates(y: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """[R, V] bool: the columns whose exact value could reach the row's best, given y's bound 2^-8|y| + a."""
    c = U_BF16
    best = y.max(dim=-1).values.double()
    floor = best - c * best.abs() - a  # a value every float32 product of the best column reaches
    # hi(v) = v + c|v| + a increases with v: hi(v) >= floor  <=>  v >= t
    t = torch.where(floor - a >= 0, (floor - a) / (1 + c), (floor - a) / (1 - c))
    t_low = (t - t.abs() * 2.0 ** -7 - SMALLEST_NORMAL).to(torch.bfloat16)  # a bf16 value <= t: a superset
    return y >= t_low[:, None]


def screen_pays() -> bool:
    """Whether this CPU multiplies bf16 in oneDNN's AVX-512 or AMX kernels, where the screen saves time.

    With AVX2 alone torch's bf16 product is slower than float32's, so the screen would cost more than it saves.
    """
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def kernel_is_sound(width: int) -> bool:
    """Whether this build's bf16 matmul rounds once, after exact float32-width accumulation, on a probe.

    Integers with partial sums below 2^24 accumulate exactly; cancelling large sums expose early rounding.
    """
    if width not in _SOUND:
        g = torch.Generator().manual_seed(width)
        half = width // 2
        top = min(127, math.isqrt((1 << 24) // max(1, width - half)))  # every partial sum below 2^24
        w = torch.randint(1, top + 1, (1024, width), generator=g).float()
        w[:, half:] *= -1  # every partial sum lies in [-sum of negatives, sum of positives]
        ok = True
        for rows in PROBE_ROWS:
            x = torch.randint(1, top + 1, (rows, width), generator=g).float()
            z = x.double() @ w.double().T  # exact integers, below 2^24
            y = x.to(torch.bfloat16) @ w.to(torch.bfloat16).T
            ok = ok and torch.equal(y, z.float().to(torch.bfloat16))
        _SOUND[width] = ok
    return _SOUND[width]


@torch.no_grad()
def project_kept(m: LazyMatrix, x: torch.Tensor) -> torch.Tensor | None:
    """x @ W.T from the screen ``head_argmax`` keeps, where it holds W exactly; None where it does not.

    The same float32 values, in the same row chunks, as ``m.project`` reads from the file (a BF16 head
    decodes exactly to float32), without reading the file again.
    """
    s = _SCREENS.get(m)
    if s is None or not s.exact or not m.streams() or x.device.type != "cpu":
        return None
    n = m.shape[0]
    return torch.cat([x @ s.low[a:a + HEAD_CHUNK_ROWS].to(x.dtype).T for a in range(0, n, HEAD_CHUNK_ROWS)], dim=-1)


def head_argmax(m: LazyMatrix, x: torch.Tensor, order: torch.Tensor | None = None) -> torch.Tensor | None:
    """Per row of ``x`` [R, E] (float32), the row of ``m`` with the largest float32 logit; None: take the product."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.shape[0] == 0 or not bool(torch.isfinite(x).all()):
        return None
    if not kernel_is_sound(x.shape[-1]):
        return None
    s = screen_of(m)
    if not (torch.isfinite(torch.tensor([s.norm, s.diff])).all()):
        return None
    low_x = _flush(x.to(torch.bfloat16))
    y = low_x @ s.low.T  # [R, V] bf16, float32 accumulation
    a = screen_bounds(x, low_x, s)
    if not bool(torch.isfinite(y.max(dim=-1).values).all()) or not bool(torch.isfinite(a).all()):
        return None
    mask = candidates(y, a)
    del y
    cols = mask.any(dim=0).nonzero().flatten()  # sorted: ties go to the lowest index, as torch.argmax
    if cols.numel() > max(MIN_CANDIDATES, MAX_CANDIDATE_SHARE * m.shape[0]):
        return None
    rows = s.low[cols].float() if s.exact else m.rows(cols).float()
    f = (x @ rows.T).masked_fill(~mask[:, cols], float("-inf"))  # float32, as the full product computes it
    if order is None:
        return cols[f.argmax(dim=-1)]
    best = f.max(dim=-1, keepdim=True).values
    keys = torch.where(f == best, order[cols][None, :].to(torch.int64), torch.iinfo(torch.int64).max)
    return cols[keys.argmin(dim=-1)]


__all__ = ["Screen", "candidates", "gamma", "head_argmax", "kernel_is_sound", "project_kept", "screen_bounds", "screen_of",
           "screen_pays"]
