"""runtime.head: the argmax of the head's logits from a bf16 screen, decided in float32 where it is close.

* this build's bf16 matmul rounds once after exact accumulation (integer probes whose large partial
  sums cancel), and the screen's bound holds on every logit, with the output rounding's part tight
  (a bound half as large fails);
* near-ties the screen alone gets wrong (x's low bits lost by bf16, a head that is not bf16, float32
  differences the screen rounds away, exact ties, a reduced vocabulary's order) come out as the
  float32 product's argmax;
* ``anchor_drafts`` drafts the same tokens through the screen as from the full float32 logits;
* a streamed BF16 head projects from the kept screen to the very values it reads from its file.
"""

from __future__ import annotations

import pytest
import torch

from dflash_convert import convert
from dflash_convert.runtime import accept as accept_runtime
from dflash_convert.runtime.accept import anchor_drafts
from dflash_convert.runtime.forward import gather_features
from dflash_convert.runtime.head import (
    U_BF16,
    _flush,
    candidates,
    head_argmax,
    kernel_is_sound,
    project_kept,
    screen_bounds,
    screen_of,
)
from dflash_convert.runtime.weights import LazyMatrix, load_weights
from dflash_convert.sources.gguf_drafter import read_drafter
from dflash_convert.sources.target import read_target
from fixtures.drafters import make_zlab_drafter
from fixtures.targets import make_target_dir


def _float32_argmax(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x @ w.T).argmax(dim=-1)


@pytest.mark.parametrize("width", [256, 5120])
def test_bf16_matmul_rounds_once_after_exact_accumulation(width):
    assert kernel_is_sound(width)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(1, 60, (240, width), generator=g).float()
    w = torch.randint(1, 60, (512, width), generator=g).float()
    w[:, width // 2:] *= -1
    z = x.double() @ w.double().T  # exact: every partial sum is an integer below 2^24
    y = x.bfloat16() @ w.bfloat16().T
    assert torch.equal(y, z.float().bfloat16())
    nz = y != 0
    rel = ((y.double() - z).abs()[nz] / y.double().abs()[nz]).max()
    assert U_BF16 / 2 < rel <= U_BF16  # the output rounding's term: reached, never exceeded


@pytest.mark.parametrize("exact_x", [True, False])
def test_the_screen_bound_holds_on_every_logit(exact_x):
    g = torch.Generator().manual_seed(2)
    E = 1024
    w = torch.randn(3000, E, generator=g) * 0.05
    w[:, : E // 2] = w[:, : E // 2].abs() * 4  # cancelling halves: large partial sums
    w[:, E // 2:] = -w[:, E // 2:].abs() * 4
    m = LazyMatrix.of(w.half().float(), "head", "F16")  # not bf16: the head's own rounding counts too
    x = torch.randn(64, E, generator=g).abs() * 3
    if exact_x:
        x = x.bfloat16().float()
    s = screen_of(m)
    assert not s.exact and s.diff > 0
    low_x = _flush(x.bfloat16())
    y = (low_x @ s.low.T).double()
    z = x.double() @ m.full().double().T
    a = screen_bounds(x, low_x, s)
    assert ((y - z).abs() <= U_BF16 * y.abs() + a[:, None]).all()
    assert bool(candidates(y.bfloat16(), a).any(dim=1).all())


def _flip_case(n_up: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """x, w where row 0 wins the screen (x rounded to bf16) but row 1 wins the exact product."""
    E = 2 * n_up + 8
    x = torch.ones(1, E)
    x[0, :n_up] = 1 + 3 * 2 ** -10  # lost by bf16 (half an ulp is 2^-8)
    w = torch.zeros(2, E)
    w[1, :n_up] = 1.0
    w[1, n_up:2 * n_up - 1] = -1.0  # row 1: 256.75 - 255 = 1.75 exactly, 1.0 on the screen
    w[0, 2 * n_up] = 1.5  # row 0: 1.5 on both
    return x, w


def test_a_flip_by_x_rounding_is_decided_in_float32():
    x, w = _flip_case()
    m = LazyMatrix.of(w, "head", "BF16")
    screen_only = (x.bfloat16() @ w.bfloat16().T).argmax(dim=-1)
    assert int(screen_only) == 0 and int(_float32_argmax(x, w)) == 1
    assert int(head_argmax(m, x)) == 1
    s = screen_of(m)
    low_x = _flush(x.bfloat16())
    bound = screen_bounds(x, low_x, s)
    assert bound > 0.5  # ||x - bf16(x)|| ||W_j|| is what keeps row 1: without it row 1 is out
    no_x_term = torch.tensor([float(bound) - float(torch.linalg.vector_norm(x - low_x.float())) * s.norm])
    assert not bool(candidates(low_x @ s.low.T, no_x_term)[0, 1])


def test_a_flip_by_head_rounding_is_decided_in_float32():
    x, w = _flip_case()
    n_up = 256
    w[1, :n_up] = x[0, :n_up]  # the lost low bits now in the head's row, x all ones
    x = torch.ones_like(x)
    m = LazyMatrix.of(w, "head", "F32")
    screen_only = (x.bfloat16() @ screen_of(m).low.T).argmax(dim=-1)
    assert int(screen_only) == 0 and int(_float32_argmax(x, w)) == 1
    assert int(head_argmax(m, x)) == 1
    assert not screen_of(m).exact and screen_of(m).diff > 0


def test_near_ties_the_screen_rounds_together():
    g = torch.Generator().manual_seed(4)
    E, V = 512, 4096
    w = (torch.randn(V, E, generator=g) * 0.05).bfloat16().float()
    x = (torch.randn(16, E, generator=g)).bfloat16().float()
    top = _float32_argmax(x, w)
    # for each row: a copy of its best head row nudged up by one float32-visible step, at a lower index
    for r in range(16):
        j = (int(top[r]) + 1 + r) % V
        w[j] = w[top[r]]
        k = int(x[r].abs().argmax())
        w[j, k] = w[j, k] + torch.sign(x[r, k]) * 2.0 ** -14  # bf16-exact? no: a near-tie only float32 sees
    m = LazyMatrix.of(w, "head", "F32")
    want = _float32_argmax(x, w)
    y = x.bfloat16() @ screen_of(m).low.T
    assert not torch.equal(y.argmax(dim=-1), want)  # the screen alone gets some wrong
    assert torch.equal(head_argmax(m, x), want)


def test_exact_ties_go_to_the_lowest_index_or_key():
    g = torch.Generator().manual_seed(5)
    w = (torch.randn(64, 128, generator=g) * 0.1).bfloat16().float()
    w[40] = w[9] = w[51] = w[0] * 0 + 3 * w[3]  # three equal rows, the largest logits by far for x = w[3]
    x = w[3:4].clone()
    m = LazyMatrix.of(w, "head", "BF16")
    assert int(head_argmax(m, x)) == 9 == int(_float32_argmax(x, w))
    order = torch.arange(64, 0, -1)  # a d2t reversing the order: the highest row has the lowest key
    assert int(head_argmax(m, x, order)) == 51


def test_refuses_what_it_cannot_bound():
    w = torch.randn(8, 32)
    m = LazyMatrix.of(w, "head", "F32")
    assert head_argmax(m, torch.full((1, 32), float("nan"))) is None
    assert head_argmax(m, torch.randn(1, 32).double()) is None


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A bf16 drafter reading its target's 151936-row head, and features for 24 positions."""
    root = tmp_path_factory.mktemp("screen")
    target = make_target_dir(root / "target", "qwen3", with_weights=True, seed=5)
    src = make_zlab_drafter(root / "d", target_layer_ids=[0, 2], seed=1)
    d = read_drafter(convert(src, target, outfile=root / "d.gguf", outtype="bf16").output)
    w = load_weights(d, read_target(target))
    g = torch.Generator().manual_seed(3)
    feats = gather_features(d, torch.randn(5, 24, d.hidden_size, generator=g))
    return d, w, feats, torch.randint(0, 1000, (24,), generator=g)


@pytest.mark.parametrize("cpu_matmul", [True, False])
def test_anchor_drafts_through_the_screen_are_the_float32_drafts(small, cpu_matmul, monkeypatch):
    d, w, feats, tokens = small
    decided = []

    def recorded(m, x, order=None):
        decided.append(head_argmax(m, x, order) is not None)
        return head_argmax(m, x, order)

    monkeypatch.setattr(accept_runtime, "head_argmax", recorded)
    monkeypatch.setattr(accept_runtime, "HEAD_SCREEN", True)  # taken on every CPU here, the faster path or not
    anchors = list(range(feats.shape[0]))
    kw = {"batch": 5, "cpu_matmul": cpu_matmul, "kv_cache_dtype": torch.float16 if cpu_matmul else None}
    screened = anchor_drafts(d, w, feats, tokens, anchors, d.block_size - 1, **kw)
    assert decided and all(decided)  # every pass went through the screen
    full, logits = anchor_drafts(d, w, feats, tokens, anchors, d.block_size - 1, keep_logits=True, **kw)
    assert torch.equal(screened, full)
    assert torch.equal(full, logits.argmax(dim=-1))


def test_a_streamed_bf16_head_projects_from_the_screen_to_the_values_it_streams(small):
    _, w, _, _ = small
    streamed = LazyMatrix(w.head.source, "cpu", torch.float32, "head", keep=False)  # the target's bf16 head
    assert streamed.streams() and not w.head.streams()
    x = torch.randn(7, streamed.shape[1], generator=torch.Generator().manual_seed(4))
    assert project_kept(streamed, x) is None  # no screen kept yet: nothing to project from
    assert screen_of(streamed).exact
    got = project_kept(streamed, x)
    assert got is not None and torch.equal(got, streamed.project(x))
    screen_of(w.head)
    assert project_kept(w.head, x) is None  # a head kept decoded projects from its own values
