"""The numba backend: chosen automatically, switched off by DFLASH_CONVERT_NO_JIT, and its
vectorised lane kernels equal to its group-by-group exact kernels on hard input.

Bit-identity with ggml itself is tested for both backends in the test_codecs_* modules (the
``quantizer_backend`` fixture); here the lane kernels, which handle 64 groups at a time and fall
back to the exact kernel for tiles that leave nearest_int's fast range, are checked against that
exact kernel directly, tile boundaries and fallback tiles included, without needing llama.cpp.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from dflash_convert.encoders import jit, warm_up_kernels

needs_numba = pytest.mark.skipif(not jit.jit_available(), reason="numba is not installed")


def _backend_in_subprocess(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != jit.NO_JIT_ENV}
    if env_value is not None:
        env[jit.NO_JIT_ENV] = env_value
    code = "from dflash_convert.encoders import jit; print(jit.jit_available())"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.strip()


@needs_numba
def test_numba_is_chosen_when_installed_and_the_environment_opts_out():
    assert _backend_in_subprocess(None) == "True"
    assert _backend_in_subprocess("0") == "True"
    assert _backend_in_subprocess("1") == "False"


@needs_numba
def test_warm_up_compiles_every_kernel():
    assert warm_up_kernels() > 0
    for k, names in ((jit.kquant_kernels(), ("qkx2_search", "qkx_final_levels", "qx_search", "qx_final_levels", "q3_search",
                                             "q2_finish", "q3_finish")),
                     (jit.legacy_kernels(), ("legacy_quantize", "legacy_quantize_f16", "widen_f16", "legacy_quantize_weighted")),
                     (jit.iq3_kernels(), ("quantize_blocks",))):
        for name in names:
            assert getattr(k, name).signatures, name


def test_numpy_path_when_numba_does_not_import():
    """An installed-but-broken numba (ImportError, e.g. a numpy it does not support) means the numpy path."""
    code = ("import sys; sys.modules['numba'] = None\n"  # makes `import numba` raise ImportError
            "import numpy as np\n"
            "from dflash_convert.encoders import jit, QUANTIZERS\n"
            "from dflash_convert.format.ggml import GGMLType\n"
            "y = QUANTIZERS[GGMLType.Q4_K](np.linspace(-1, 1, 512, dtype=np.float32))\n"
            "print(jit.jit_available(), y.size)")
    env = {k: v for k, v in os.environ.items() if k != jit.NO_JIT_ENV}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", str(2 * 144)]


def _hard_groups(n_groups: int, size: int, seed: int) -> np.ndarray:
    """[n_groups, size] float32: N(0, 0.02) groups, some on a half-step grid (rounding ties),
    flat and zero groups, 1e-30-wide spreads, subnormals, huge values, and one inf/NaN tile."""
    r = np.random.default_rng(seed)
    x = r.standard_normal((n_groups, size)) * 0.02
    x[1::9] = r.integers(-8, 9, (len(x[1::9]), size)) * 0.5
    x[2::13] = r.uniform(-3, 3, (len(x[2::13]), 1))  # constant groups
    x[3::17] = 0
    x[4::19] = 1.0 + r.standard_normal((len(x[4::19]), size)) * 1e-7  # nearly flat: huge iscale
    x[5::23] *= 1e-40  # subnormal
    x[6::29] *= 1e30
    x[7::31, 0] = 1e6  # an outlier among small values
    x = x.astype(np.float32)
    x[64 + 3, 5] = np.nan  # the second tile has a NaN and an inf: exact fallback there
    x[64 + 40, 7] = np.inf
    return np.ascontiguousarray(x)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))


@needs_numba
@pytest.mark.parametrize("size, nmax, rmin, nstep, mad, av_weights", [
    (32, 15, -1.0, 20, False, True),   # Q4_K
    (32, 31, -0.5, 15, False, True),   # Q5_K
    (16, 3, -0.5, 15, True, False),    # Q2_K
])
def test_qkx2_lanes_equal_exact(size, nmax, rmin, nstep, mad, av_weights):
    k = jit.kquant_kernels()
    xg = _hard_groups(64 * 4 + 37, size, seed=size + nmax)  # 4 full tiles and a partial one
    G = xg.shape[0]
    outs = []
    for lanes in (True, False):
        s, m, L = np.empty(G, np.float32), np.empty(G, np.float32), np.empty((G, size), np.uint8)
        args = (xg, nmax, np.float32(rmin), np.float32(0.1), nstep, mad, av_weights, s, m, L)
        if lanes:
            k.qkx2_search(*args)
        else:
            k.qkx2_search_exact(*args, 0, G)
        outs.append((s, m, L))
    for a, b in zip(*outs, strict=True):
        assert _same(a, b)


@needs_numba
def test_qx_and_q3_lanes_equal_exact():
    k = jit.kquant_kernels()
    xg = _hard_groups(64 * 4 + 5, 16, seed=7)
    G = xg.shape[0]
    for lanes_fn, exact_fn in ((k.qx_search, k.qx_search_exact), (k.q3_search, k.q3_search_exact)):
        s1, L1 = np.empty(G, np.float32), np.empty((G, 16), np.uint8)
        s2, L2 = np.empty(G, np.float32), np.empty((G, 16), np.uint8)
        lanes_fn(xg, s1, L1)
        exact_fn(xg, s2, L2, 0, G)
        assert _same(s1, s2) and _same(L1, L2), lanes_fn


@needs_numba
@pytest.mark.parametrize("groups", [1, 63, 64, 65, 128, 129, 64 * 4 + 5, 64 * 37 + 11])
def test_q3_queues_equal_exact(groups: int) -> None:
    """Q3_K's lane kernel moves the groups still changing from one sweep's queue to the next and
    writes the settled ones out of order: every group must still get exactly C's scale and levels,
    for inputs that settle at once (normal), keep changing (cubed normal: heavy tails), hold the
    hard cases (ties, flat, zero, subnormal, NaN/inf), and for counts that leave queues half full."""
    k = jit.kquant_kernels()
    rng = np.random.default_rng(groups)
    hard = _hard_groups(max(groups, 128), 16, seed=groups)[:groups]
    # groups whose fifth sweep still changes a level (found by running C's loop with four): rare
    # (132 in 200000 uniform groups), so planted among the others
    fifth = np.random.default_rng(1).uniform(-1, 1, (200_000, 16))[[1175, 1598, 3061, 8993, 9739]]
    planted = rng.uniform(-1, 1, (groups, 16))
    planted[rng.permutation(groups)[:5]] = fifth[:groups]
    for xg in (hard, rng.standard_normal((groups, 16)), rng.standard_normal((groups, 16)) ** 3, planted):
        xg = np.ascontiguousarray(xg, dtype=np.float32)
        s1, L1 = np.empty(groups, np.float32), np.empty((groups, 16), np.uint8)
        s2, L2 = np.empty(groups, np.float32), np.empty((groups, 16), np.uint8)
        k.q3_search(xg, s1, L1)
        k.q3_search_exact(xg, s2, L2, 0, groups)
        assert _same(s1, s2) and _same(L1, L2)


@needs_numba
@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_legacy_from_f16_words_equals_widening_first(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The F16 -> legacy encoder widens inside the kernel; every half bit pattern (subnormals,
    -0.0, inf, NaN), in three orders so each lands in every lane and beside every other, must give
    the bytes of widening with numpy first and of the numpy fallback (by the same encoder, whose
    backend is chosen per call)."""
    from dflash_convert.encoders import encoder, legacy
    from dflash_convert.format.ggml import GGMLType

    every = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    x = np.concatenate([every, every[::-1], np.random.default_rng(7).permutation(every)])
    fused = encoder("F16", GGMLType[name])
    got = fused(x)
    widened = getattr(legacy, f"quantize_{name.lower()}")(x.astype(np.float32))
    np.testing.assert_array_equal(got, widened)
    monkeypatch.setattr(jit, "legacy_kernels", lambda: None)  # the numpy port, as without numba
    np.testing.assert_array_equal(getattr(legacy, f"quantize_{name.lower()}")(x.astype(np.float32)), got)
    np.testing.assert_array_equal(fused(x), got)  # the same encoder, now widening with numpy first


@needs_numba
def test_fp16_scales_in_the_kernel_equal_ggml_rounding() -> None:
    """The legacy kernels round their scales to fp16 themselves (``_legacy_kernels.f32_to_f16_bits``): equal to
    ``legacy.fp16_bits`` (numpy's round-to-nearest-even, NaN as ggml's ``sign | 0x7E00``) on every
    float32 whose exponent is near a boundary (half subnormals, the smallest normals, the overflow
    to inf, inf and NaN), each with every low mantissa pattern, and on 4M random bit patterns.
    (All 2**32 were compared once when the kernel was written: no difference.)"""
    from dflash_convert.encoders.legacy import fp16_bits

    k = jit.legacy_kernels()
    exponents = np.array([0, 1, 100, 101, 102, 103, 111, 112, 113, 114, 126, 127, 141, 142, 143, 144, 254, 255], np.uint32)
    mantissas = np.concatenate([np.arange(1 << 14, dtype=np.uint32), (np.arange(1 << 14, dtype=np.uint32) << 9) | 0x1FF])
    near = ((exponents[:, None] << 23) | mantissas[None, :]).reshape(-1)
    rand = np.random.default_rng(11).integers(0, 1 << 32, 1 << 22, dtype=np.uint64).astype(np.uint32)
    bits = np.concatenate([near, near | np.uint32(0x80000000), rand])
    values = bits.view(np.float32)
    got = np.empty(values.shape, np.uint16)
    k.f16_bits_of(values, got)
    np.testing.assert_array_equal(got, fp16_bits(values))


@needs_numba
def test_f16_to_bf16_kernel_equals_widening_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """F16 -> BF16 in one kernel pass: every half bit pattern (subnormals, -0.0, inf, NaN quieted),
    in two orders and an odd length, gives the words of widening to float32 and rounding (the numpy
    fallback, which is also what the encoder runs without numba)."""
    from dflash_convert.encoders import encoder
    from dflash_convert.encoders.floats import f32_to_bf16, widen_to_f32
    from dflash_convert.format.ggml import GGMLType

    every = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    x = np.concatenate([every, np.random.default_rng(3).permutation(every)[:-5]])
    want = f32_to_bf16(widen_to_f32(x, "F16"))
    to_bf16 = encoder("F16", GGMLType.BF16)
    assert jit.float_kernels() is not None
    np.testing.assert_array_equal(to_bf16(x), want)
    np.testing.assert_array_equal(to_bf16(x[1:][::2]), want[1:][::2])  # a strided chunk
    monkeypatch.setattr(jit, "kquant_kernels", lambda: None)  # numba unusable: no float kernels either
    jit.float_kernels.cache_clear()
    try:
        assert jit.float_kernels() is None
        np.testing.assert_array_equal(to_bf16(x), want)
    finally:
        jit.float_kernels.cache_clear()
