"""llama.cpp accepts a real, middling share of a *trained* drafter's tokens, and quantization moves it.

The pair of ``fixtures.trained`` (a tiny Qwen3 target that memorised a corpus, and two DFlash
drafters trained for it: full attention, and a sliding window on the first layer) is built once
and cached (about 2.5 minutes cold on one core). The target is converted with llama.cpp's own
``convert_hf_to_gguf.py`` (F16), each drafter with our command line (F16, then our quantizer), and
``llama-speculative-simple --spec-type draft-dflash`` runs greedily on the fixture's prompts:

* at F16 the acceptance over the passage prompts is inside 40-90%: a real drafter that has not
  saturated (random weights give ~0%, a drafter that memorised everything ~100%);
* llama.cpp's numbers are the build's Python replay of the same loop on the bf16 checkpoint (a
  converter or runtime that computes something else drafts other tokens);
* on held-out prompts (text the drafters never trained on) acceptance is far lower;
* the quantized drafters (Q8_0 .. Q2_K) do not all accept the same share.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fixtures.trained import SpecStats, TrainedPair, build_trained_pair, drafter_gguf, run_speculative, target_gguf

pytestmark = [pytest.mark.runtime, pytest.mark.slow]

WINDOW = (0.40, 0.90)
QUANT_TYPES = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "IQ4_XS", "Q3_K_M", "Q2_K")
REPLAY_TOLERANCE = 0.05  # llama.cpp vs the Python replay, aggregate acceptance (observed: equal)


@pytest.fixture(scope="module")
def pair() -> TrainedPair:
    """Built once per machine (about two minutes on a clean clone, then read from the cache): the
    setup time of whichever test asks first."""
    return build_trained_pair(seed=0)


@pytest.fixture(scope="module")
def target(pair):
    return target_gguf(pair)


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("trained-gguf")


def _draft_info(text: str, field: str) -> str | None:
    """A ``print_info: FIELD = value`` line of the *draft* model (printed after the target's)."""
    _, sep, draft_part = text.partition("loading draft model")
    m = re.search(rf"print_info: {re.escape(field)}\s*=\s*(.*?)\s*$", draft_part, re.MULTILINE) if sep else None
    return m.group(1) if m else None


@pytest.fixture(scope="module")
def llama_runs() -> dict[tuple[Path, Path, str], SpecStats]:
    """llama-speculative-simple's runs by (target, drafter, prompt), each made once per module: the tests below
    read the same files' runs (the full F16 file's in three of them)."""
    return {}


def _run(runs: dict, pair: TrainedPair, target, drafter, prompts: list[str]) -> list[SpecStats]:
    """Each prompt's run, -v (the debug log, print_info lines included), made where ``runs`` lacks it."""
    for p in prompts:
        if (target, drafter, p) not in runs:
            runs[(target, drafter, p)] = run_speculative(target, drafter, p, pair.n_predict, extra=("-v",))
    return [runs[(target, drafter, p)] for p in prompts]


def _rate(stats) -> float:
    return sum(s.n_accept for s in stats) / sum(s.n_drafted for s in stats)


def _table(prompts, stats) -> str:
    return "\n".join(f"  {p!r}: n_drafted={s.n_drafted} n_accept={s.n_accept} accept={s.accept:.3f}"
                     for p, s in zip(prompts, stats, strict=True))


@pytest.mark.parametrize("kind", ["full", "swa"])
def test_f16_acceptance_is_real_and_unsaturated(kind, pair, target, gguf_dir, llama_runs):
    """About 30 s per drafter: the six prompts and the two held-out ones through llama-speculative-simple
    (64 tokens each); the acceptance window and the replay bound need every prompt's drafted tokens."""
    drafter = drafter_gguf(pair, kind, gguf_dir, "F16")
    stats = _run(llama_runs, pair, target, drafter, pair.prompts)
    rate = _rate(stats)
    print(f"\n[{kind} F16] accept {rate:.3f}\n{_table(pair.prompts, stats)}")
    assert WINDOW[0] <= rate <= WINDOW[1], f"{kind}: accept {rate:.3f} outside {WINDOW}\n{_table(pair.prompts, stats)}"
    assert all(s.n_accept > 0 for s in stats), _table(pair.prompts, stats)
    if kind == "swa":
        assert _draft_info(stats[0].output, "n_swa") == str(pair.info["params"]["sliding_window"])

    replay = pair.replay(kind)
    want = sum(replay[p][1] for p in pair.prompts) / sum(replay[p][0] for p in pair.prompts)
    assert abs(rate - want) <= REPLAY_TOLERANCE, (
        f"{kind}: llama.cpp accepts {rate:.3f}, the checkpoint's replay {want:.3f}\n"
        + "\n".join(f"  {p!r}: llama.cpp {(s.n_drafted, s.n_accept)} replay {replay[p]}"
                    for p, s in zip(pair.prompts, stats, strict=True)))

    held = _run(llama_runs, pair, target, drafter, pair.held_out_prompts)
    print(f"[{kind} F16 held out] accept {_rate(held):.3f}\n{_table(pair.held_out_prompts, held)}")
    assert _rate(held) < rate / 2, _table(pair.held_out_prompts, held)


def test_quantized_drafters_accept_differently(pair, target, gguf_dir, llama_runs):
    """Eight files (F16 and seven quantized types) x the six prompts through llama-speculative-simple,
    about two minutes: fewer types could all accept alike by chance (neighbouring types often do on a
    drafter this small), and fewer prompts leave too few drafted tokens for a 2-bit file to differ."""
    rates = {}
    for qtype in ("F16", *QUANT_TYPES):
        stats = _run(llama_runs, pair, target, drafter_gguf(pair, "full", gguf_dir, qtype), pair.prompts)
        rates[qtype] = (sum(s.n_drafted for s in stats), sum(s.n_accept for s in stats), _rate(stats))
    print("\n" + "\n".join(f"  {q}: n_drafted={d} n_accept={a} accept={r:.3f}" for q, (d, a, r) in rates.items()))
    assert len({rates[q] for q in QUANT_TYPES}) > 1, f"every quant type accepts the same: {rates}"
    assert all(r > 0.2 for _, _, r in rates.values()), rates


# --- accept agrees with llama.cpp's own count (issue 16, item 4) ------------------------------------------

AGREEMENT = 0.02  # accept's live-loop rate within 2 percentage points of llama-speculative-simple's
AGREEMENT_FILES = (("full", "F16"), ("full", "Q8_0"), ("full", "Q4_K_M"), ("full", "Q2_K"), ("swa", "F16"), ("swa", "Q4_K_M"))


@pytest.fixture(scope="module")
def features(pair, tmp_path_factory):
    """The target's greedy continuations and layer inputs, captured once with our capture (transformers' class)."""
    from dflash_convert.capture import capture

    root = tmp_path_factory.mktemp("trained-features")
    prompts = root / "prompts.txt"
    prompts.write_text("\n".join(pair.prompts) + "\n")
    return capture(pair.target_dir, prompts, root / "features.safetensors", new_tokens=pair.n_predict, device="cpu").output


def _last_target_tokens(output: str) -> list[int]:
    """The target's token closing each step, from llama-speculative-simple's debug log (-v)."""
    return [int(t) for t in re.findall(r"accepted \d+/\d+ draft tokens, the last target token is: \((\d+)\)", output)]


def test_accept_agrees_with_llama_cpp(pair, target, gguf_dir, features, llama_runs):
    """accept's live loop against llama-speculative-simple on the same prompts, target and drafter files.

    About two minutes: six files (both drafters, F16 to Q2_K) x six prompts in llama.cpp, and accept on
    the same; the agreement bound (2 points) means something only over hundreds of drafted tokens per file.

    The captured features agree with llama.cpp's target wherever it matters: at every step llama.cpp
    logs the token its target chose to close the step, and that token is the captured continuation's
    at the position accept's replay of llama.cpp's accepted counts reaches (checked on the F16 file).
    Where the rates differ at all, it is a slot whose two best tokens are nearly tied (one such slot on
    the Q4_K_M file: probabilities 0.283 and 0.277), which the two implementations' rounding orders
    settle differently; that changes the loop's path from there on.
    """
    from dflash_convert.accept import accept
    from dflash_convert.sources.features import read_features

    files = {(k, q): drafter_gguf(pair, k, gguf_dir, q) for k, q in AGREEMENT_FILES}
    ours = accept(list(files.values()), features, device="cpu")
    lines, worst = [], 0.0
    for (k, q), r in zip(files, ours.results, strict=True):
        stats = _run(llama_runs, pair, target, files[(k, q)], pair.prompts)
        theirs = _rate(stats)
        lines.append(f"  {k} {q}: ours {r.loop.n_drafted}/{r.loop.n_accept} = {r.loop.accept:.3f}, llama.cpp "
                     f"{sum(s.n_drafted for s in stats)}/{sum(s.n_accept for s in stats)} = {theirs:.3f}")
        worst = max(worst, abs(r.loop.accept - theirs))
        if (k, q) == ("full", "F16"):
            f = read_features(features)
            for i, s in enumerate(stats):
                tokens, n_prompt = f.sequences[i].read_tokens()
                accepted = [int(a) for a in re.findall(r"accepted (\d+)/\d+ draft tokens", s.output)]
                c, seen = n_prompt - 1, []
                for a in accepted:
                    c += a + 1
                    seen.append(int(tokens[c]))
                assert seen == _last_target_tokens(s.output), (i, seen, _last_target_tokens(s.output))
    print("\n" + "\n".join(lines))
    assert worst <= AGREEMENT, "\n".join(lines)


def test_check_judges_a_file_by_its_acceptance(pair, gguf_dir, features, monkeypatch):
    """check --features FILE: a file's acceptance next to its checkpoint's, failing past its class's allowance.

    Needs the whole capture (6 prompts x 64 tokens, about a minute per check): the gate is only tested
    where the Q2_K file loses something, and on a few short sequences a Q2_K file can accept exactly as
    many tokens as its checkpoint. What it loses depends on the pair (trained on this machine's CPU
    kernels), so the stricter allowance is set from the measured loss.
    """
    import dflash_convert.check as check_module
    from dflash_convert.format.check_limits import ACCEPT_ALLOWANCE

    q2 = drafter_gguf(pair, "full", gguf_dir, "Q2_K")
    rep = check_module.check(q2, pair.drafters["full"], target_model_dir=pair.target_dir, features=str(features),
                             device="cpu", context=32)
    a = rep.metrics["acceptance"]
    print(f"\n{rep.render_text()}")
    assert rep.passed and 0 < a["lost"] <= a["allowance"] == ACCEPT_ALLOWANCE["Q2_K"], rep.failures
    assert a["lost"] == pytest.approx(a["checkpoint"]["accept"] - a["file"]["accept"])
    stricter = a["lost"] / 2  # an allowance the file does not earn
    monkeypatch.setitem(ACCEPT_ALLOWANCE, "Q2_K", stricter)
    rep = check_module.check(q2, pair.drafters["full"], target_model_dir=pair.target_dir, features=str(features),
                             device="cpu", context=32)
    want = (f"accepted tokens lost: the file accepts {a['file']['accept']:.3f} of its drafted tokens, the checkpoint "
            f"{a['checkpoint']['accept']:.3f}: {a['lost']:.3f} more than {stricter:g} (Q2_K) lost")
    assert not rep.passed and want in rep.failures, rep.failures
