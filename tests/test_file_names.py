"""Our file names, judged by llama.cpp's own -hf resolution rule.

The rule is written again here, from llama.cpp 0c1e57098's common/download.cpp, independently of
dflash_convert/format/file_names.py (a test that shared the package's code could not catch it):

* ``get_gguf_split_info``: strip ``.gguf`` (else no info), strip ``-NNNNN-of-NNNNN`` (icase), the tag
  is the last ``[-.]([A-Z0-9_]+)$`` (icase), upper-cased; ``extract_quant_bits``: the tag's digits from
  its first digit (``std::stoi``), 0 when it has none.
* ``gguf_filename_is_model``: ends in ``.gguf`` (case-sensitive) and the base name holds none of
  ``mmproj``, ``imatrix``, ``mtp-``, ``eagle3-``, ``dflash-``, ``dspark-`` (``std::string::find``,
  case-sensitive).
* ``find_best_model``: the tags ``[TAG]`` (or ``Q4_K_M``, ``Q8_0`` when none is given), each as the
  regex ``TAG[.-]`` (icase) searched in the path; the first model file that matches (a split file
  only as part 1); with no tag, the first model file.
* ``find_best_sibling`` (``find_best_dflash``: keyword ``dflash-``, ``find_best_dspark``: ``dspark-``):
  ``.gguf`` files whose path holds the keyword (case-sensitive), in the model's directory or above;
  deeper shared directory first, then the exact match ``"-" + TAG + "."`` in the upper-cased path,
  then the closest quantization bits (to the tag, or to the model's when no tag is given).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import cli_server
import pytest
from conftest import run_cli

from dflash_convert import convert
from dflash_convert.conversion import default_output
from dflash_convert.format.file_names import (
    discovery_problem,
    drafter_file_name,
    file_tag,
    quantized_file_name,
    safe_name,
)
from dflash_convert.format.file_types import FILE_TYPES
from dflash_convert.validate import validate
from fixtures.drafters import make_zlab_drafter
from fixtures.family import make_dspark_drafter
from fixtures.targets import make_target_dir

# --- llama.cpp 0c1e57098 common/download.cpp, reimplemented ---------------------------------------


def get_gguf_split_info(path: str) -> tuple[str, str, int, int] | None:
    """(prefix, tag, index, count), or None for a name not ending in .gguf."""
    if not path.endswith(".gguf"):
        return None
    prefix = path[:-5]
    index = count = 1
    if m := re.fullmatch(r"(.+)-([0-9]{5})-of-([0-9]{5})", prefix, re.IGNORECASE):
        prefix, index, count = m.group(1), int(m.group(2)), int(m.group(3))
    m = re.search(r"[-.]([A-Z0-9_]+)$", prefix, re.IGNORECASE)
    return prefix, (m.group(1).upper() if m else ""), index, count


def _bits(tag: str) -> int:
    """std::stoi(tag.substr(tag.find_first_of("0123456789"))): the first run of digits, 0 without one."""
    m = re.search(r"[0-9]+", tag)
    return int(m.group(0)) if m else 0


def extract_quant_bits(path: str) -> int:
    info = get_gguf_split_info(path)
    return _bits(info[1] if info else "")


def gguf_filename_is_model(path: str) -> bool:
    if not path.endswith(".gguf"):
        return False
    name = path.rsplit("/", 1)[-1]
    return not any(w in name for w in ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-"))


def _first_part_or_whole(path: str) -> bool:
    info = get_gguf_split_info(path)
    return not (info and info[3] > 1 and info[2] != 1)


def find_best_model(files: list[str], tag: str) -> str:
    for t in [tag] if tag else ["Q4_K_M", "Q8_0"]:
        pattern = re.compile(t + "[.-]", re.IGNORECASE)
        for f in files:
            if gguf_filename_is_model(f) and pattern.search(f) and _first_part_or_whole(f):
                return f
    if not tag:
        for f in files:
            if gguf_filename_is_model(f) and _first_part_or_whole(f):
                return f
    return ""


def find_best_sibling(files: list[str], model: str, keyword: str, tag: str = "") -> str:
    tag_upper = tag.upper()
    model_bits = _bits(tag_upper) if tag_upper else extract_quant_bits(model)
    model_dirs = model.split("/")[:-1]
    best, found = "", False
    best_depth = best_diff = 0
    best_exact = False
    for f in files:
        if not f.endswith(".gguf") or keyword not in f:
            continue
        sib_dirs = f.split("/")[:-1]
        depth = 0
        while depth < min(len(model_dirs), len(sib_dirs)) and model_dirs[depth] == sib_dirs[depth]:
            depth += 1
        if depth != len(sib_dirs):  # the sibling's folder must be the model's or one above it
            continue
        diff = abs(extract_quant_bits(f) - model_bits)
        exact = bool(tag_upper) and f"-{tag_upper}." in f.upper()
        if (not found or depth > best_depth or (depth == best_depth and exact and not best_exact)
                or (depth == best_depth and exact == best_exact and diff < best_diff)):
            best, best_depth, best_diff, best_exact, found = f, depth, diff, exact, True
    return best


def find_best_dflash(files: list[str], model: str, tag: str = "") -> str:
    return find_best_sibling(files, model, "dflash-", tag)


def find_best_dspark(files: list[str], model: str, tag: str = "") -> str:
    return find_best_sibling(files, model, "dspark-", tag)


# --- the reimplementation itself, on the cases its comments name -----------------------------------

def test_the_reimplemented_rule():
    assert get_gguf_split_info("a/Qwen3-8B-Q4_K_M-00002-of-00003.gguf") == ("a/Qwen3-8B-Q4_K_M", "Q4_K_M", 2, 3)
    assert get_gguf_split_info("x.bin") is None and extract_quant_bits("m-bf16.gguf") == 16
    assert extract_quant_bits("m-Q4_K_M.gguf") == 4 and extract_quant_bits("m-mxfp.gguf") == 0
    assert not gguf_filename_is_model("mmproj-x-F16.gguf") and gguf_filename_is_model("dir/dflash-x/m-F16.gguf")
    files = ["m-Q8_0-00002-of-00002.gguf", "m-Q8_0-00001-of-00002.gguf", "m-Q4_K_M.gguf"]
    assert find_best_model(files, "q8_0") == "m-Q8_0-00001-of-00002.gguf" and find_best_model(files, "") == "m-Q4_K_M.gguf"
    assert find_best_model(["m-F16.gguf"], "Q8_0") == "" and find_best_model(["m-F16.gguf"], "") == "m-F16.gguf"
    assert find_best_dflash(["sub/dflash-a-Q8_0.gguf", "dflash-a-F16.gguf"], "m-Q8_0.gguf", "Q8_0") == "dflash-a-F16.gguf"


# --- our names, every type, both members ----------------------------------------------------------

TYPES = tuple(FILE_TYPES)
TARGETS = ["Qwen3-8B-Q4_K_M.gguf", "Qwen3-8B-Q8_0.gguf", "Qwen3-8B-BF16.gguf"]


@pytest.mark.parametrize("dspark", [False, True], ids=["dflash", "dspark"])
def test_default_names_are_found_as_drafters_and_never_as_models(dspark):
    ours = {t: drafter_file_name("Qwen3-8B-DFlash-b16", t, dspark=dspark) for t in TYPES}
    find = find_best_dspark if dspark else find_best_dflash
    other = find_best_dflash if dspark else find_best_dspark
    for files in (TARGETS + list(ours.values()), list(ours.values()) + TARGETS):  # listing order must not matter
        assert find_best_model(files, "") == "Qwen3-8B-Q4_K_M.gguf"
        for t, name in ours.items():
            assert name.startswith("dspark-" if dspark else "dflash-") and name.endswith(f"-{t}.gguf")
            assert not gguf_filename_is_model(name)
            assert discovery_problem(name, dspark=dspark, type_name=t) is None, name
            assert get_gguf_split_info(name)[1] == t  # the tag llama.cpp reads is the type
            model = find_best_model(files, t)
            assert model in ("", *TARGETS), (t, model)  # -hf REPO:TYPE never takes a drafter as the model
            assert find(files, model or "Qwen3-8B-Q4_K_M.gguf", t) == name  # the -TAG. match picks this type
            assert other(files, model, t) == ""  # the other member's search never offers it


def test_old_names_are_offered_as_models_and_never_as_drafters():
    old = "Qwen3-8B-DFlash-b16-BF16.gguf"
    files = [old, "Qwen3-8B-Q8_0.gguf"]
    assert gguf_filename_is_model(old) and find_best_dflash(files, "Qwen3-8B-Q8_0.gguf", "BF16") == ""
    assert find_best_model([old], "") == old  # -hf on the drafter's repo takes the drafter as the main model
    problem = discovery_problem(old, dspark=False, type_name="BF16")
    assert problem is not None and "'dflash-'" in problem and "main model" in problem and "\n" not in problem
    # a capitalised prefix is not the prefix: llama.cpp's find is case-sensitive
    assert gguf_filename_is_model("DFlash-Qwen3-BF16.gguf") and discovery_problem("DFlash-Qwen3-BF16.gguf", dspark=False)
    assert "never looks at it" in discovery_problem("dflash-Qwen3-BF16.GGUF", dspark=False)


def test_wrong_member_other_sidecar_and_wrong_tag_are_warned():
    # a DSpark drafter named dflash-: not a model, but find_best_dspark (--spec-type draft-dspark) misses it
    p = discovery_problem("dflash-Qwen3-8B-BF16.gguf", dspark=True)
    assert find_best_dspark(["dflash-Qwen3-8B-BF16.gguf"], "", "BF16") == ""
    assert p is not None and "'dspark-'" in p and "main model" not in p
    assert "'mtp-'" in discovery_problem("dflash-mtp-Qwen3-Q8_0.gguf", dspark=False)
    p = discovery_problem("dflash-Qwen3-Q8_0.gguf", dspark=False, type_name="Q4_K_M")
    assert p is not None and "'Q8_0'" in p and "'Q4_K_M'" in p
    assert discovery_problem("dflash-Qwen3-q8_0.gguf", dspark=False, type_name="Q8_0") is None  # the tag compare is case-free


def test_the_default_output_takes_general_name_when_the_plan_has_one(tmp_path):
    assert default_output(tmp_path, "BF16", "Qwen3 8B DFlash b16") == tmp_path / "dflash-Qwen3-8B-DFlash-b16-BF16.gguf"
    assert default_output(tmp_path / "dir", "Q8_0", None, dspark=True) == tmp_path / "dir" / "dspark-dir-Q8_0.gguf"


def test_names_are_sanitised():
    assert safe_name("../.hidden/dir\x00name") == "hidden-dir-name"
    assert safe_name(" My Drafter ") == "My-Drafter" and safe_name("...") == "drafter" and safe_name("-x") == "x"
    assert drafter_file_name("dflash-Qwen3", "q4_k_m", dspark=False) == "dflash-Qwen3-Q4_K_M.gguf"
    assert drafter_file_name("a/b", "BF16", dspark=True) == "dspark-a-b-BF16.gguf"
    assert file_tag("dflash-x-Q4_K_M-00001-of-00002.gguf") == "Q4_K_M" and file_tag("x") == ""


def test_quantize_names_replace_the_type_tag():
    assert quantized_file_name("dflash-Qwen3-8B-BF16.gguf", "Q4_K_M", dspark=False) == "dflash-Qwen3-8B-Q4_K_M.gguf"
    assert quantized_file_name("Qwen3-8B-DFlash-b16-F16.gguf", "Q8_0", dspark=False) == \
        "dflash-Qwen3-8B-DFlash-b16-Q8_0.gguf"
    assert quantized_file_name("drafter.gguf", "Q8_0", dspark=True) == "dspark-drafter-Q8_0.gguf"
    assert quantized_file_name("dflash-Qwen3-8B.gguf", "Q8_0", dspark=False) == "dflash-Qwen3-8B-Q8_0.gguf"


def read_gguf_metadata_name(path):
    """general.name as our reader sees it (gguf-py's reader builds a Python object for every one of the
    151k tokens: 15 s for one key; test_gguf_reader checks our reader against it)."""
    from dflash_convert.sources.gguf import read_gguf

    return read_gguf(path).get("general.name")


# --- real conversions, validate and inspect --------------------------------------------------------

def test_convert_without_o_writes_the_discoverable_name(tmp_path, qwen3_target):
    src = make_zlab_drafter(tmp_path / "Qwen3-tiny-DFlash", target_layer_ids=[0, 2])
    out = convert(src, qwen3_target, outtype="f16").output
    # <Name> is general.name as upstream derives it from the directory (title-cased words: "Qwen3 Tiny DFlash")
    assert read_gguf_metadata_name(out) == "Qwen3 Tiny DFlash"
    assert out == src / "dflash-Qwen3-Tiny-DFlash-F16.gguf" and out.is_file()
    assert sorted(p.name for p in src.glob("*.gguf")) == [out.name]
    r = validate(out)
    assert r.exit_code == 0 and r.check("file_name").status == "pass"
    folder = tmp_path / "out"
    folder.mkdir()
    r = run_cli("convert", src, "--target-model-dir", qwen3_target, "--outtype", "q8_0", "-o", folder, "-q")
    assert r.returncode == 0, r.stderr
    assert [p.name for p in folder.iterdir()] == ["dflash-Qwen3-Tiny-DFlash-Q8_0.gguf"]
    # quantize into a folder: the input's name with the type tag replaced
    r = run_cli("quantize", out, folder, "Q4_0", "-q")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["dflash-Qwen3-Tiny-DFlash-Q4_0.gguf",
                                                        "dflash-Qwen3-Tiny-DFlash-Q8_0.gguf"]


def test_a_dspark_drafter_gets_the_dspark_prefix(tmp_path):
    target = make_target_dir(tmp_path / "gemma4", "gemma4")
    src = make_dspark_drafter(tmp_path / "tiny-DSpark", vocab_size=916, mask_token_id=4)
    out = convert(src, target, outtype="bf16").output
    assert out.name == "dspark-Tiny-DSpark-BF16.gguf" and out.is_file()
    assert validate(out).check("file_name").status == "pass"
    wrong = tmp_path / "dflash-tiny-DSpark-BF16.gguf"
    shutil.copyfile(out, wrong)
    c = validate(wrong).check("file_name")
    assert c.status == "warn" and "'dspark-'" in c.message


def _cli(*args: str | Path) -> subprocess.CompletedProcess:
    return cli_server.run(*args, env={**os.environ, "COLUMNS": "200"})


def test_validate_and_inspect_warn_on_an_undiscoverable_name(tmp_path, qwen3_target):
    src = make_zlab_drafter(tmp_path / "d", target_layer_ids=[0, 2])
    old = convert(src, qwen3_target, outfile=tmp_path / "Qwen3-8B-DFlash-b16-BF16.gguf", outtype="bf16").output
    r = validate(old)
    c = r.check("file_name")
    assert r.exit_code == 0 and c.status == "warn" and "main model" in c.message  # a warning, not a failure
    v = _cli("validate", old, "--json")
    assert v.returncode == 0 and '"id": "file_name"' in v.stdout and '"status": "warn"' in v.stdout
    i = _cli("inspect", old)
    assert i.returncode == 0 and i.stderr == ""
    warnings = [line for line in i.stdout.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and "holds no 'dflash-'" in warnings[0] and "main model" in warnings[0], i.stdout
    good = tmp_path / "dflash-Qwen3-8B-BF16.gguf"
    shutil.copyfile(old, good)
    i = _cli("inspect", good)
    assert i.returncode == 0 and "warning" not in i.stdout + i.stderr and "drafter: DFlash" in i.stdout
    # the file's type is BF16: a Q8_0 tag would make -hf REPO:BF16 miss it
    tagged = tmp_path / "dflash-Qwen3-8B-Q8_0.gguf"
    shutil.copyfile(old, tagged)
    assert "'BF16'" in validate(tagged).check("file_name").message
