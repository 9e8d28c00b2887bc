"""llama-quantize's per-tensor flags: --tensor-type, --tensor-type-file, --output-tensor-type,
--token-embedding-type, --leave-output-tensor, --pure, --override-kv, --prune-layers.

The runtime tier runs the real llama-quantize (0c1e57098, built from the sdist) with the same flags
on the same F16 drafters and demands byte-identical files: the 256-aligned own-vocabulary drafter
(token_embd, output, d2t, 5 layers: the Q4_K_M mix's counters) and the small one whose rows force
the block-size fallback after a manual type. The one deliberate difference, a pruned sliding-window
drafter's pattern, is tested against what validate and llama.cpp's loader then need.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import run_cli
from gguf_compare import differences

from dflash_convert import convert
from dflash_convert.errors import DFlashError
from dflash_convert.format.ggml import GGMLType
from dflash_convert.format.keys import key
from dflash_convert.format.quant_types import TypeOverrides, choose_quant_types
from dflash_convert.quantize import plan_quantize, quantize, quantize_options, write_quantize
from dflash_convert.sources.gguf import read_gguf
from dflash_convert.validate import validate
from fixtures.drafters import make_speculators_drafter, make_zlab_drafter
from fixtures.targets import make_target_dir

BIG = dict(layers=5, hidden=256, ffn=512, heads=4, kv_heads=2, head_dim=64, vocab_size=916, draft_vocab_size=512,
           mask_token_id=4, aux_layer_ids=[1, 3])


@pytest.fixture(scope="module")
def drafters(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("quantize-flags")
    big_target = make_target_dir(root / "gemma-256", "gemma4", hidden_size=256)
    small_target = make_target_dir(root / "qwen3-96", "qwen3", hidden_size=96)
    big = make_speculators_drafter(root / "big", dtype="f16", **BIG)
    small = make_zlab_drafter(root / "small", dtype="f16", layers=3, hidden=96, ffn=160, heads=3, kv_heads=1, head_dim=32,
                              target_layer_ids=[0, 2])
    swa = make_zlab_drafter(root / "swa", dtype="f16", layers=4, hidden=96, ffn=160, heads=3, kv_heads=1, head_dim=32,
                            target_layer_ids=[0, 2], swa_layers=[True, False, True, False])
    return {"big": convert(big, big_target, outfile=root / "big.gguf", outtype="f16").output,
            "small": convert(small, small_target, outfile=root / "small.gguf", outtype="f16").output,
            "swa": convert(swa, small_target, outfile=root / "swa.gguf", outtype="f16").output,
            "root": root}


def options_from_flags(flags: list[str]):
    """The same flags as the Python API takes them (the CLI is tested on its own below)."""
    kw: dict = {"tensor_types": [], "override_kv": []}
    it = iter(flags)
    for flag in it:
        name = flag.lstrip("-").replace("-", "_")
        if name in ("leave_output_tensor", "pure"):
            kw[name] = True
        elif name in ("tensor_type", "override_kv"):
            kw["tensor_types" if name == "tensor_type" else name].append(next(it))
        else:
            kw[name] = next(it)
    return quantize_options(**kw)


def llama_quantize(src: Path, out: Path, qtype: str, flags: list[str]) -> subprocess.CompletedProcess:
    from fixtures.upstream import llama_tool

    return subprocess.run([str(llama_tool("llama-quantize")), *flags, str(src), str(out), qtype, "2"],
                          capture_output=True, text=True)


TYPE_FILE = "ffn_down=q8_0\n  blk\\.0\\.=q5_0\tffn=q4_0\n"  # whitespace-separated; file order is match order

CASES = {
    "tensor-type": ("big", "Q4_K_M", ["--tensor-type", "attn_q=q8_0", "--tensor-type", r"blk\.[12]\.ffn_.*=q5_k"]),
    # upper case is lower-cased; a manual attn_v does not advance the mix's attn_v counter
    "tensor-type-case": ("big", "Q4_K_M", ["--tensor-type", "ATTN_V=Q4_0"]),
    "first-match-wins": ("big", "Q4_K_M", ["--tensor-type", "blk\\.0\\.=q8_0", "--tensor-type", "attn=q4_0"]),
    "tensor-type-file": ("big", "Q4_K_M", ["--tensor-type-file", "{type_file}"]),
    "output-and-embedding": ("big", "Q5_K_M", ["--output-tensor-type", "q8_0", "--token-embedding-type", "q4_0"]),
    "leave-output": ("big", "Q4_K_M", ["--leave-output-tensor"]),
    "pure": ("big", "Q4_K_M", ["--pure"]),
    "pure-with-output": ("big", "Q8_0", ["--pure", "--output-tensor-type", "f16"]),
    "override-kv": ("big", "Q4_K_M", ["--override-kv", "general.name=str:renamed", "--override-kv", "dflash_convert.i=int:-7",
                                      "--override-kv", "dflash_convert.f=float:0.5", "--override-kv", "dflash_convert.b=bool:true"]),
    "prune-middle": ("big", "Q4_K_M", ["--prune-layers", "3,1"]),
    "prune-first": ("big", "Q4_K_M", ["--prune-layers", "0,0"]),
    "prune-last": ("big", "Q4_K_M", ["--prune-layers", "4"]),  # a layer beyond the last is refused (see below)
    "manual-then-fallback": ("small", "Q4_K_M", ["--tensor-type", "attn_q=q4_k", "--tensor-type", "ffn=iq4_xs"]),
    "float-file-type": ("big", "F16", ["--tensor-type", "attn_q=q8_0", "--output-tensor-type", "q8_0"]),
    "k-mix": ("big", "Q3_K_M", ["--tensor-type", "attn_v=q3_k", "--tensor-type", "ffn_down=q2_k", "--pure"]),
}


@pytest.mark.runtime
@pytest.mark.parametrize("case", list(CASES))
def test_flags_are_byte_identical_to_llama_quantize(drafters, tmp_path, case):
    which, qtype, flags = CASES[case]
    type_file = tmp_path / "types.txt"
    type_file.write_text(TYPE_FILE)
    flags = [f.format(type_file=type_file) for f in flags]
    src, theirs, ours = drafters[which], tmp_path / "theirs.gguf", tmp_path / "ours.gguf"
    r = llama_quantize(src, theirs, qtype, flags)
    assert r.returncode == 0, r.stdout[-1500:] + r.stderr[-1500:]
    plan = plan_quantize(src, ours, qtype, options=options_from_flags(flags))
    write_quantize(plan, progress=False)
    if ours.read_bytes() != theirs.read_bytes():
        pytest.fail(f"{case}: files differ:\n" + "\n".join(differences(ours, theirs)))
    if plan.fallbacks:
        assert f"{plan.fallbacks} of {len(plan.tensors)} tensor(s) required fallback quantization" in r.stdout + r.stderr
    # and the command line gives the same bytes (the flags spelled as llama-quantize spells them)
    cli_out = tmp_path / "cli.gguf"
    c = run_cli("quantize", src, cli_out, qtype, *flags, "-q")
    assert c.returncode == 0, c.stderr
    assert cli_out.read_bytes() == theirs.read_bytes()


def test_what_the_flags_choose(drafters, tmp_path):
    """The semantics, readable without llama.cpp: a regex searched anywhere, first match wins, the
    file's items in order, outright types for output/token_embd, counters, prune renumbering."""
    src = drafters["big"]

    def types(*flags, qtype="Q4_K_M"):
        plan = plan_quantize(src, tmp_path / "x.gguf", qtype, options=options_from_flags(list(flags)))
        return {p.tensor.gguf_name: p.ggml_type.name for p in plan.tensors}, plan

    plain, _ = types()
    assert plain["blk.2.attn_v.weight"] == "Q6_K" and plain["blk.1.attn_v.weight"] == "Q4_K"  # the mix's use_more_bits
    t, _ = types("--tensor-type", "attn_q=q8_0")  # searched anywhere: no anchor needed
    assert {t[f"blk.{i}.attn_q.weight"] for i in range(5)} == {"Q8_0"} and t["blk.0.attn_k.weight"] == "Q4_K"
    t, _ = types("--tensor-type", r"blk\.0\.=q8_0", "--tensor-type", "attn=q4_0")
    assert t["blk.0.attn_q.weight"] == "Q8_0" and t["blk.1.attn_q.weight"] == "Q4_0"  # the first that matches
    assert t["blk.0.ffn_up.weight"] == "Q8_0" and t["blk.1.ffn_up.weight"] == "Q4_K"
    t, _ = types("--tensor-type", "attn_v.weight=q5_0")  # '.' is a regex: any character
    assert {t[f"blk.{i}.attn_v.weight"] for i in range(5)} == {"Q5_0"}
    t, _ = types("--token-embedding-type", "q8_0", "--output-tensor-type", "q4_0")
    assert t["token_embd.weight"] == "Q8_0" and t["output.weight"] == "Q4_0"
    t, _ = types("--tensor-type", "output=q8_0")  # a pattern reaches the output head too
    assert t["output.weight"] == "Q8_0"
    t, _ = types("--leave-output-tensor")
    assert t["output.weight"] == "F16" and t["blk.0.attn_q.weight"] == "Q4_K"
    t, _ = types("--pure")
    assert set(v for k, v in t.items() if k.endswith("weight") and "norm" not in k) == {"Q4_K"}
    t, plan = types("--prune-layers", "1,3")
    assert sorted({k.split(".")[1] for k in t if k.startswith("blk.")}) == ["0", "1", "2"]
    assert plan.metadata.get(key("block_count")) == 3
    # pruned layers' tensors are gone, the rest renumbered in order: old 2 is new 1, old 4 is new 2
    by_new = {p.tensor.gguf_name: p for p in plan.tensors}
    old = {t.gguf_name: t for t in read_gguf_drafter(src).tensors}
    assert by_new["blk.1.attn_q.weight"].ne == tuple(reversed(old["blk.2.attn_q.weight"].shape))


def read_gguf_drafter(path):
    from dflash_convert.sources.gguf_drafter import read_drafter

    return read_drafter(path)


def test_override_kv_types_and_errors(drafters, tmp_path):
    out = tmp_path / "kv.gguf"
    quantize(drafters["big"], out, "Q8_0", options=options_from_flags(
        ["--override-kv", "dflash_convert.i=int:-7", "--override-kv", "dflash_convert.s=str:a b",
         "--override-kv", "dflash_convert.f=float:2.5", "--override-kv", "dflash_convert.b=bool:false"]))
    md = read_gguf(out).metadata
    assert md["dflash_convert.i"].value == 7 and md["dflash_convert.i"].vtype.name == "UINT32"  # |int| as UINT32, as upstream
    assert md["dflash_convert.f"].vtype.name == "FLOAT32" and md["dflash_convert.f"].value == 2.5
    assert md["dflash_convert.b"].value is False and md["dflash_convert.s"].value == b"a b"
    for bad, why in [("nokey", "expected KEY=TYPE:VALUE"), ("k=int", "expected KEY=TYPE:VALUE"),
                     ("k=u8:1", "expected KEY=TYPE:VALUE"), ("k=int:x", "int value 'x'"),
                     ("k=int:99999999999", "out of range"), ("k=bool:yes", "not true or false"),
                     ("k=str:" + "x" * 200, "longer than 127 bytes"), ("k" * 200 + "=int:1", "longer than 127 bytes")]:
        with pytest.raises(DFlashError, match=why):
            options_from_flags(["--override-kv", bad])
    # a key llama.cpp then reads with the wrong type: the file would not load, so it is not written
    refused = tmp_path / "refused.gguf"
    with pytest.raises(DFlashError):
        quantize(drafters["big"], refused, "Q8_0", options=options_from_flags(["--override-kv", f"{key('block_size')}=str:x"]))
    assert not refused.exists() and not list(tmp_path.glob(".refused*"))


@pytest.mark.runtime  # llama-quantize writes the same pruned file
def test_prune_layers_rewrites_what_validate_needs(drafters, tmp_path):
    """llama-quantize keeps a pruned sliding-window drafter's 4-entry pattern for 2 layers: llama.cpp's
    get_arr takes it and gives layer 1 the pruned layer 1's flag. We drop the pruned entries instead."""
    src = drafters["swa"]
    out = tmp_path / "pruned.gguf"
    quantize(src, out, "Q8_0", options=options_from_flags(["--prune-layers", "1,2"]))
    md = read_gguf(out).metadata
    assert md[key("block_count")].value == 2
    assert [bool(v) for v in md[key("sliding_window_pattern")].value] == [True, False]  # layers 0 and 3 kept
    report = validate(out)
    assert report.exit_code == 0, [c.message for c in report.checks if not c.passed]
    # what llama-quantize writes for the same flags fails validate (the reason we differ)
    pytest.importorskip("fixtures.upstream")
    theirs = tmp_path / "theirs.gguf"
    if llama_quantize(src, theirs, "Q8_0", ["--prune-layers", "1,2"]).returncode == 0:
        assert len(read_gguf(theirs).metadata[key("sliding_window_pattern")].value) == 4
        assert validate(theirs).exit_code == 1
    # every layer pruned: nothing llama.cpp could run, refused
    with pytest.raises(DFlashError, match="removes every layer"):
        quantize(src, tmp_path / "none.gguf", "Q8_0", options=options_from_flags(["--prune-layers", "0,1,2,3"]))
    assert not (tmp_path / "none.gguf").exists()
    for bad in ["", "a", "1,-2", "1,,2"]:
        with pytest.raises(DFlashError, match="--prune-layers"):
            options_from_flags(["--prune-layers", bad])


def test_tensor_type_errors(drafters, tmp_path):
    for bad, why in [("attn_q", "expected PATTERN=TYPE"), ("=q8_0", "expected PATTERN=TYPE"), ("attn_q=", "expected PATTERN=TYPE"),
                     ("attn_q=q9_9", "unknown or unsupported tensor type"), ("attn_q=Q8_K", "unknown or unsupported"),
                     ("attn_[q=q8_0", "not a regular expression")]:
        with pytest.raises(DFlashError, match=why):
            options_from_flags(["--tensor-type", bad])
    f = tmp_path / "bad.txt"
    f.write_text("attn_q=q8_0 ffn_up\n")
    with pytest.raises(DFlashError, match="bad.txt.*expected PATTERN=TYPE"):
        options_from_flags(["--tensor-type-file", str(f)])
    with pytest.raises(DFlashError, match="missing.txt"):
        options_from_flags(["--tensor-type-file", str(tmp_path / "missing.txt")])
    # an outright type whose blocks the rows do not fill is refused (llama-quantize would abort in ggml)
    tensors = [("token_embd.weight", (96, 300)), ("output.weight", (96, 300)), ("blk.0.attn_q.weight", (96, 96))]
    with pytest.raises(ValueError, match="output.weight: --output-tensor-type Q4_K needs rows of whole 256-value blocks"):
        choose_quant_types(tensors, "Q8_0", overrides=TypeOverrides(output_tensor_type=GGMLType.Q4_K))
    _, chosen = choose_quant_types(tensors, "Q8_0", overrides=TypeOverrides(tensor_types=(("attn_q", GGMLType.Q4_K),)))
    assert chosen[2][0] == "Q5_0" and chosen[2][1].startswith("fallback")  # a pattern's type still falls back


def test_cli_flags(drafters, tmp_path):
    src = drafters["big"]
    r = run_cli("quantize", src, tmp_path / "d.gguf", "Q4_K_M", "--tensor-type", "attn_q=q8_0", "--pure",
                "--leave-output-tensor", "--dry-run")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if "blk.0.attn_q.weight" in x)
    assert "Q8_0" in line and "--tensor-type attn_q" in line
    assert "F16   -> F16" in next(x for x in r.stdout.splitlines() if "output.weight" in x)
    r = run_cli("quantize", src, tmp_path / "e.gguf", "Q4_K_M", "--tensor-type", "attn_q=q9")
    assert r.returncode != 0 and "unknown or unsupported tensor type" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "e.gguf").exists()
    # --tensor-type and --tensor-type-file in command-line order, as llama-quantize collects them
    f = tmp_path / "t.txt"
    f.write_text("attn_q=q4_0")
    first_file = run_cli("quantize", src, tmp_path / "f.gguf", "Q4_K_M", "--tensor-type-file", f, "--tensor-type", "attn_q=q8_0",
                         "--dry-run")
    first_flag = run_cli("quantize", src, tmp_path / "f.gguf", "Q4_K_M", "--tensor-type", "attn_q=q8_0", "--tensor-type-file", f,
                         "--dry-run")
    pick = [next(x for x in r.stdout.splitlines() if "blk.0.attn_q.weight" in x) for r in (first_file, first_flag)]
    assert "Q4_0" in pick[0] and "Q8_0" in pick[1]


# --- user patterns: one bounded compiler (format/tensor_patterns.py) ---------------------------------

# patterns llama-quantize users write, and names they must (not) match: the bounded compiler keeps re's answer
KEPT_PATTERNS = [r"attn_v", r"blk\.[0-3]\.ffn_down", r"blk\.\d+\.(attn|ffn)_.*\.weight", r"^(?!.*ffn_down).*weight",
                 r"blk\.(1|3)\.attn_(q|k)", r"(blk)\.\d\.\1?attn", r".*_norm.*", r"\.weight$", r"ffn_(up|gate)"]
NAMES = ["blk.0.attn_v.weight", "blk.3.ffn_down.weight", "blk.12.attn_q.weight", "output_norm.weight", "token_embd.weight",
         "blk.1.ffn_up.weight", "fc.scale", "d2t", "blk.1.attn_k.weight", "x" * 63]


def test_accepted_patterns_match_as_re_searches_them():
    import re

    from dflash_convert.format.tensor_patterns import compile_pattern
    for p in KEPT_PATTERNS:
        bounded = compile_pattern(p)
        assert [bool(bounded.search(n)) for n in NAMES] == [bool(re.search(p, n)) for n in NAMES], p


@pytest.mark.parametrize("pattern", [r"(.*)*(.*)*(.*)*X", r"(a|aa)*b", r"(ab|ab)*x", r"(a|a){40}x", r".*.*.*.*x",
                                     r"(\w+)+z", r"(?!(.*)*)x"])
def test_a_pattern_that_could_backtrack_exponentially_is_refused_before_any_match(pattern):
    from dflash_convert.errors import OptionValueError
    with pytest.raises(OptionValueError, match="exponential time"):
        options_from_flags(["--tensor-type", f"{pattern}=q8_0"])


def test_a_repetition_count_too_large_is_a_usage_error():
    from dflash_convert.errors import OptionValueError
    from dflash_convert.format.tensor_patterns import REPEAT_MAX
    for pattern in ["a{99999999999}", f"a{{{REPEAT_MAX + 1}}}", f"a{{0,{REPEAT_MAX + 1}}}"]:
        with pytest.raises(OptionValueError, match="repetition count.*too large"):
            options_from_flags(["--tensor-type", f"{pattern}=q8_0"])
    options_from_flags(["--tensor-type", f"a{{{REPEAT_MAX}}}=q8_0"])  # the largest count is still a pattern


def test_keep_type_globs_are_bounded_and_match_as_fnmatchcase(tmp_path):
    import fnmatch

    from dflash_convert.format.tensor_patterns import tensor_glob
    for glob in ["blk.[01].attn_*", "*.weight", "*a*a*a*a*a*a*a*a*a*a*b", "blk.?.ffn_*", "[!b]*"]:
        matches = tensor_glob(glob)
        assert [matches(n) for n in NAMES] == [fnmatch.fnmatchcase(n, glob) for n in NAMES], glob


def test_bad_patterns_on_the_command_line_exit_64_and_from_a_file_exit_2(drafters, tmp_path):
    src = drafters["small"]
    for flag, item, why in [("--tensor-type", "(.*)*(.*)*(.*)*X=q8_0", "exponential time"),
                            ("--tensor-type", "a{99999999999}=q8_0", "a repetition count is too large"),
                            ("--tensor-type", "attn_[q=q8_0", "not a regular expression"),
                            ("--keep-type", "blk.[=Q8_0", "")]:
        r = run_cli("quantize", src, tmp_path / "o.gguf", "Q4_K_M", flag, item)
        lines = r.stderr.splitlines()
        if why:
            assert r.returncode == 64 and len(lines) == 1 and why in lines[0] and item in lines[0], (item, r.stderr)
        assert "please report it" not in r.stderr and not (tmp_path / "o.gguf").exists()
    f = tmp_path / "types.txt"
    f.write_text("attn_q=q8_0\n(a|aa)*b=q4_0\n")
    r = run_cli("quantize", src, tmp_path / "o.gguf", "Q4_K_M", "--tensor-type-file", f)
    assert r.returncode == 2 and str(f) in r.stderr and "exponential time" in r.stderr, r.stderr
    assert len(r.stderr.splitlines()) == 1 and not (tmp_path / "o.gguf").exists()


def test_prune_layers_beyond_the_drafter_are_a_usage_error(drafters, tmp_path):
    """llama-quantize ignores a layer number the file does not have (a typo prunes nothing, silently):
    refused, naming the file, the layers it has and the ones it has not; exit 64, nothing written."""
    from dflash_convert.errors import OptionValueError
    src = drafters["small"]  # 3 layers
    with pytest.raises(OptionValueError, match=r"--prune-layers 1,5: the drafter has 3 layer\(s\), 0..2; there is no layer 5"):
        plan_quantize(src, tmp_path / "p.gguf", "Q8_0", options=options_from_flags(["--prune-layers", "1,5"]))
    r = run_cli("quantize", src, tmp_path / "p.gguf", "Q8_0", "--prune-layers", "5")
    assert r.returncode == 64 and r.stderr.splitlines() == [
        f"dflash-convert: error: {src}: --prune-layers 5: the drafter has 3 layer(s), 0..2; there is no layer 5"]
    assert not (tmp_path / "p.gguf").exists()
    r = run_cli("quantize", src, tmp_path / "p.gguf", "Q8_0", "--prune-layers", "1,x")
    assert r.returncode == 64 and "is not a comma-separated list of layer numbers" in r.stderr


def test_a_file_refused_before_its_rename_is_named_by_its_output_path(drafters, tmp_path):
    """The gate validates the temporary file through /proc/self/fd/N; its error line names the output."""
    out = tmp_path / "aligned.gguf"
    r = run_cli("quantize", drafters["small"], out, "Q8_0", "--override-kv", "general.alignment=int:3")
    assert r.returncode == 1 and r.stderr.splitlines() == [
        f"dflash-convert: error: {out}: refusing to write a file that fails validate (container: {out}: general.alignment 3 "
        "is not a power of two)"]
    assert "/proc/" not in r.stderr and not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_refused_pattern_is_shown_cut_in_its_error_line(tmp_path):
    """A pattern of 100,000 characters (50,000 nested groups) is refused in one short line naming the file."""
    f = tmp_path / "deep.txt"
    f.write_text("(" * 50_000 + "a" + ")" * 50_000 + "=q8_0")
    with pytest.raises(DFlashError, match=r"deep.txt: '\(+' \.\.\. \(100006 characters\) \.\.\. '\)+=q8_0': the pattern nests") as e:
        options_from_flags(["--tensor-type-file", str(f)])
    assert len(str(e.value)) < 300
