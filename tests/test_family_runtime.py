"""Runtime tier for the rest of the family: llama.cpp drafts with our DFlash2, DSpark and Gemma-4 DSpark files.

``llama-speculative-simple`` (built from the 0.3.36 sdist) runs each converted drafter next to the
tiny Qwen3.5 target of tests/test_runtime.py, with no --spec-type: the driver picks the type from the
file (``draft-dspark`` when ``markov_w1.weight`` exists, else ``draft-dflash``), loads it, and must
draft tokens. The Gemma-4 DSpark layout (shared K/V, sandwich norms, GELU, proportional-RoPE table)
runs against the same target; its vocabulary is the target's, which is all the runtime pairs on.

Then the load-time rules: DFlash2 files with a selector_top_k too large for the hidden size, a
conv_group_size that does not divide it, or no selector_rank make llama.cpp's loader refuse the draft
(its message is in the log, nothing is drafted; the issue reports tools that exit 0 and go on without
the draft, this build's llama-speculative-simple exits 1); validate fails each of them. Last, quantize
writes the family's files byte for byte as llama-quantize does (which drops trailing 1 dimensions:
DSpark's conf_proj {E+R, 1} comes out {E+R}).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from drafter_gguf import drop_keys, kv, read_parts, set_key, write_parts
from gguf_compare import differences
from test_runtime import (  # noqa: F401  (spec_tool and target are fixtures)
    MASK_TOKEN_ID,
    PROMPT,
    RUN_TIMEOUT_S,
    TARGET_LAYER_IDS,
    VOCAB,
    _draft_info,
    _number,
    _relevant,
    spec_tool,
    target,
)

from dflash_convert import convert
from dflash_convert.format.family import draft_tokens_per_block, member_of
from dflash_convert.quantize import quantize
from dflash_convert.sources.gguf import read_gguf
from dflash_convert.validate import validate
from fixtures.family import make_dflash2_drafter, make_dspark_drafter, make_gemma4_dspark_drafter, make_speculators_dspark
from fixtures.targets import make_target_dir

pytestmark = [pytest.mark.runtime, pytest.mark.slow]

QWEN35 = dict(vocab_size=VOCAB, mask_token_id=MASK_TOKEN_ID)

# name -> (builder, outtype, the speculative type llama.cpp must pick)
VARIANTS = {
    "dflash2-bf16": (lambda p: make_dflash2_drafter(p, target_layer_ids=TARGET_LAYER_IDS, seed=3, **QWEN35), "bf16", "draft-dflash"),
    "dspark-q8_0": (lambda p: make_dspark_drafter(p, target_layer_ids=TARGET_LAYER_IDS, with_lm_head=False, seed=4, **QWEN35),
                    "q8_0", "draft-dspark"),
    # speculators export with its own 4096-token vocabulary: d2t, own head and embeddings, sample_from_anchor false
    "dspark-spec-bf16": (lambda p: make_speculators_dspark(p, draft_vocab_size=4096, aux_layer_ids=[i + 1 for i in TARGET_LAYER_IDS],
                                                           block_size=16, seed=5, **QWEN35), "bf16", "draft-dspark"),
    "gemma4-dspark-f16": (lambda p: make_gemma4_dspark_drafter(p, target_layer_ids=TARGET_LAYER_IDS, seed=6, **QWEN35),
                          "f16", "draft-dspark"),
}


def _run(tool: Path, target_gguf: Path, draft: Path, n_max: int) -> tuple[subprocess.CompletedProcess, str, str]:
    cmd = [str(tool), "-m", str(target_gguf), "-md", str(draft), "--spec-draft-n-max", str(n_max),
           "--temp", "0", "--top-k", "1", "-p", PROMPT, "-n", "32", "-c", "512", "-ngl", "0", "-ngld", "0", "-fit", "off", "-t", "1", "-lv", "4"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"llama-speculative-simple timed out after {RUN_TIMEOUT_S}s\n{_relevant(str(e.stdout) + str(e.stderr))}")
    output = r.stdout + "\n" + r.stderr
    return r, output, f"command: {' '.join(cmd)}\n{_relevant(output)}"


@pytest.fixture(scope="module")
def dflash2_gguf(tmp_path_factory, target) -> Path:  # noqa: F811
    target_dir, _, _ = target
    root = tmp_path_factory.mktemp("family-runtime-dflash2")
    src = VARIANTS["dflash2-bf16"][0](root / "src")
    return convert(src, target_dir, outfile=root / "dflash2.gguf", outtype="bf16").output


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_llama_cpp_drafts_with_our_family_gguf(variant, target, spec_tool, tmp_path, dflash2_gguf):  # noqa: F811
    make, outtype, spec_type = VARIANTS[variant]
    target_dir, target_gguf, _ = target
    if variant == "dflash2-bf16":
        draft = dflash2_gguf
    else:
        draft = convert(make(tmp_path / "src"), target_dir, outfile=tmp_path / f"{variant}.gguf", outtype=outtype).output
    g = read_gguf(draft)
    member = member_of({t.name for t in g.tensors})
    sfa = g.get("dflash.sample_from_anchor")
    n_max = draft_tokens_per_block(member, g.get("dflash.block_size"), sfa)
    r, output, info = _run(spec_tool, target_gguf, draft, n_max)
    assert r.returncode == 0, f"llama-speculative-simple exited {r.returncode}\n{info}"
    assert f"auto-detected speculative type '{spec_type}'" in output, info
    assert f"adding speculative implementation '{spec_type}'" in output, info
    assert _draft_info(output, "arch") == "dflash", info
    n_drafted = _number(output, "n_drafted")
    print(f"\n[{variant}] n_drafted={n_drafted} n_accept={_number(output, 'n_accept')}")
    assert n_drafted is not None and n_drafted > 0, f"the {member} drafter drafted nothing\n{info}"
    if spec_type == "draft-dspark":
        assert f"sample_from_anchor={'true' if sfa else 'false'}" in output, info
    if variant.startswith("dflash2"):
        assert "DFlash2 conv kernel = 2, group = 16, selector rank = 32, top-k = 4" in output, info


# the three load-time rules of the issue: llama.cpp's loader refuses the draft and says why
BROKEN = {
    "selector_top_k_too_large": (lambda p: set_key(p, kv("selector_top_k", 8)), "DFlash2 hidden size is too small for the selector lattice"),
    "conv_group_size_does_not_divide": (lambda p: set_key(p, kv("conv_group_size", 24)),
                                        "DFlash2 hidden size must be divisible by conv_group_size"),
    "selector_rank_missing": (lambda p: drop_keys(p, "dflash.selector_rank"), "DFlash2 model is missing conv/selector metadata"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_llama_cpp_refuses_what_validate_fails(case, target, spec_tool, dflash2_gguf, tmp_path):  # noqa: F811
    edit, message = BROKEN[case]
    _, target_gguf, _ = target
    broken = write_parts(tmp_path / f"{case}.gguf", edit(read_parts(dflash2_gguf)))
    r, output, info = _run(spec_tool, target_gguf, broken, 7)
    assert message in output, info  # the loader's own words
    assert not _number(output, "n_drafted"), info  # ... and nothing was drafted
    report = validate(broken)
    c = report.check("family")
    assert report.exit_code == 1 and c.status == "fail" and message in " ".join(c.details), (c.message, c.details)
    print(f"\n[{case}] llama-speculative-simple exit code {r.returncode}; validate: FAIL")


# --- quantize: bit-identical to llama-quantize on the family's files -----------------------------------

QTYPES = ("Q4_K_M", "Q8_0", "Q6_K", "IQ4_XS", "Q2_K")
BIG = dict(hidden=256, ffn=512, heads=4, kv_heads=1, head_dim=64, vocab_size=916, mask_token_id=4, target_layer_ids=[0, 2])


@pytest.fixture(scope="module")
def family_f16(tmp_path_factory) -> dict[str, Path]:
    """256-aligned DFlash2 (bf16) and Gemma-4 DSpark (f16) files: K-quant paths for the codebooks and Markov tables."""
    root = tmp_path_factory.mktemp("family-quantize")
    t = make_target_dir(root / "gemma4-256", "gemma4", hidden_size=256)
    d2 = make_dflash2_drafter(root / "d2", selector_rank=256, logit_transforms=False, **BIG)
    g4 = make_gemma4_dspark_drafter(root / "g4", dtype="f16", hidden=256, ffn=512, heads=4, global_head_dim=64, markov_rank=256)
    return {"dflash2-bf16": convert(d2, t, outfile=root / "d2.gguf", outtype="bf16").output,
            "gemma4-dspark-f16": convert(g4, t, outfile=root / "g4.gguf", outtype="f16").output}


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("which", ["dflash2-bf16", "gemma4-dspark-f16"])
def test_quantize_family_bit_identical_to_llama_quantize(family_f16, tmp_path, which, qtype):
    from fixtures.upstream import llama_tool

    src = family_f16[which]
    theirs, ours = tmp_path / "llama-quantize.gguf", tmp_path / "ours.gguf"
    r = subprocess.run([str(llama_tool("llama-quantize")), str(src), str(theirs), qtype, "2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    quantize(src, ours, qtype)
    assert ours.read_bytes() == theirs.read_bytes(), "\n".join(differences(ours, theirs))
    assert validate(theirs).exit_code == 0  # llama-quantize's file (conf_proj written as {E+R}) passes validate
    types = {t.name: t.ggml_type.name for t in read_gguf(ours).tensors}
    assert all(types[n] == "F32" for n in types if n.endswith("_conv_base"))
    if qtype == "Q4_K_M":
        wanted = "selector_predecessor.weight" if which.startswith("dflash2") else "markov_w1.weight"
        assert types[wanted] == "Q4_K"  # rows of 256: the K-quant itself, no fallback
