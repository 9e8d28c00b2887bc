"""The CI recipe in docs/validate.md runs: every dflash-convert and hf command in it exists, with its flags.

The YAML block is parsed (yaml.safe_load), every ``run:`` step split into commands (line
continuations joined, one command per line, ``|``, ``&&``, ``||`` and ``;`` separating, redirections
dropped), and each ``dflash-convert SUB ...`` / ``hf SUB ...`` checked against ``SUB --help``: the
subcommand must exist and every ``-x`` / ``--flag`` it uses must be an option that help declares.
Ours runs from this checkout; ``hf`` from the installed huggingface_hub (its console script,
``huggingface_hub.cli.hf:main``), offline. A doctored recipe shows the checker catches a misspelling.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

RECIPE_DOC = Path(__file__).resolve().parent.parent / "docs" / "validate.md"
# how each checked program is run here: ours from this checkout, hf from the installed huggingface_hub
PROGRAMS: dict[str, list[str]] = {
    "dflash-convert": [sys.executable, "-m", "dflash_convert.cli"],
    "hf": [sys.executable, "-m", "huggingface_hub.cli.hf"],
}
SEPARATORS = {"|", "||", "&&", ";", "&"}
REDIRECTIONS = {">", ">>", "<", ">&", "<&", ">|"}
HELP_ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "NO_COLOR": "1", "COLUMNS": "200",
            "TERM": "dumb"}


def recipe_yaml(markdown: str) -> str:
    """The one fenced ```yaml block of the document."""
    blocks = re.findall(r"^```yaml\n(.*?)^```", markdown, re.M | re.S)
    assert len(blocks) == 1, f"expected one yaml block in {RECIPE_DOC.name}, found {len(blocks)}"
    return blocks[0]


def run_scripts(workflow: dict) -> list[str]:
    """Every ``run:`` script of every step of every job."""
    scripts = []
    for job in workflow["jobs"].values():
        for step in job["steps"]:
            if "run" in step:
                scripts.append(step["run"])
    return scripts


def commands(script: str) -> list[list[str]]:
    """The simple commands of a shell script: words, with variable assignments in front and redirections gone."""
    out: list[list[str]] = []
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        tokens = list(lexer)
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            if tok in SEPARATORS:
                out.append(words)
                words = []
            elif tok in REDIRECTIONS:
                i += 1  # and its target
            elif not words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", tok):
                pass  # NAME=value before the command
            else:
                words.append(tok)
            i += 1
        out.append(words)
    return [c for c in out if c]


@functools.cache
def help_text(program: str, sub: str) -> tuple[int, str]:
    r = subprocess.run([*PROGRAMS[program], sub, "--help"], capture_output=True, text=True, env=HELP_ENV, timeout=120)
    return r.returncode, r.stdout


def declared_options(help_out: str) -> set[str]:
    """The option names a click-style help declares: the part of each option line before its description."""
    names: set[str] = set()
    for line in help_out.splitlines():
        stripped = line.lstrip()
        if not stripped.startswith("-") or line == stripped:
            continue
        declaration = re.split(r"\s{2,}", stripped, maxsplit=1)[0]
        names.update(re.findall(r"(?<![\w-])(--?[A-Za-z0-9][\w-]*)", declaration))
    return names


def used_options(words: list[str]) -> list[str]:
    return [w.split("=", 1)[0] for w in words[2:] if w.startswith("-") and w != "-" and w != "--"]


def problems(markdown: str) -> list[str]:
    """What is wrong with the recipe's dflash-convert and hf commands; [] when every one would run."""
    found: list[str] = []
    checked = 0
    for script in run_scripts(yaml.safe_load(recipe_yaml(markdown))):
        for words in commands(script):
            program = words[0]
            if program not in PROGRAMS:
                continue
            checked += 1
            if len(words) < 2 or words[1].startswith("-"):
                found.append(f"{shlex.join(words)}: no subcommand")
                continue
            code, out = help_text(program, words[1])
            if code != 0 or not out.startswith("Usage:"):
                found.append(f"{program} {words[1]}: no such subcommand")
                continue
            known = declared_options(out)
            found += [f"{program} {words[1]}: no option {flag}" for flag in used_options(words) if flag not in known]
    if not checked:
        found.append("no dflash-convert or hf command found in the recipe")
    return found


@pytest.fixture(scope="module")
def recipe() -> str:
    return RECIPE_DOC.read_text(encoding="utf-8")


def test_the_splitter_and_the_help_reader():
    script = 'a=1 hf download "$X" --local-dir d \\\n  --revision r > log || status=$?\nexit ${status:-0} # done'
    # an assignment alone is no command; the redirection and its target go
    assert commands(script) == [["hf", "download", "$X", "--local-dir", "d", "--revision", "r"], ["exit", "${status:-0}"]]
    assert declared_options("Options:\n  -o, --outfile PATH  Output --not-this\n  --a / --no-a  x\n") == \
        {"-o", "--outfile", "--a", "--no-a"}


def test_every_command_of_the_recipe_exists_with_its_flags(recipe):
    assert problems(recipe) == []
    words = [w for s in run_scripts(yaml.safe_load(recipe_yaml(recipe))) for c in commands(s) for w in c]
    assert "huggingface-cli" not in words and "huggingface_hub[cli]" not in words  # gone in huggingface_hub 1.0
    ran = {(c[0], c[1]) for s in run_scripts(yaml.safe_load(recipe_yaml(recipe))) for c in commands(s) if c[0] in PROGRAMS}
    assert {("hf", "download"), ("hf", "upload"), ("dflash-convert", "convert"), ("dflash-convert", "validate")} <= ran


def test_the_checker_catches_a_misspelled_flag_or_subcommand(recipe):
    doctored = recipe.replace("--target-model-dir target", "--target-modeldir target", 1)
    assert doctored != recipe
    assert problems(doctored) == ["dflash-convert convert: no option --target-modeldir"]
    doctored = recipe.replace("--local-dir drafter", "--localdir drafter", 1)
    assert problems(doctored) == ["hf download: no option --localdir"]
    doctored = recipe.replace("hf upload", "hf uplaod", 1)
    assert problems(doctored) == ["hf uplaod: no such subcommand"]
    doctored = recipe.replace("validate \"$OUT\" --target target --deep", "validate \"$OUT\" --target target -deep", 1)
    assert problems(doctored) == ["dflash-convert validate: no option -deep"]
