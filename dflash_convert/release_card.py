"""The release's model card (README.md) and its SHA256SUMS, from the files a publish made.

The card's front matter is written here, value by value, each a JSON-quoted scalar (so nothing of the
source card becomes structure); only the source card's license and pipeline tag are carried over.
The body says what the files are, their sizes, hashes and verdicts, the target they pair with, and
how llama-server runs them. SHA256SUMS is the format ``sha256sum -c`` reads. Specification:
docs/publish.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .files import sha256_file
from .format.keys import ARCH
from .terminal import human_size
from .validate.report import LLAMA_CPP_COMMIT

SUMS_NAME = "SHA256SUMS"
CARD_NAME = "README.md"
REPORT_SUFFIX = ".validate.json"
TAGS = ("gguf", ARCH, "speculative-decoding", "llama.cpp")  # the architecture name is the hub tag
DEFAULT_PIPELINE_TAG = "text-generation"


@dataclass
class ReleaseFile:
    """One GGUF of the release, as the card and the summary table show it."""

    name: str
    type_name: str
    size: int
    sha256: str
    validate: str  # validate's result against the target: pass (a release holds no other)
    report_name: str  # the validate --json report beside it
    fidelity: dict[str, Any] | None = None  # check against the checkpoint, with check=True


@dataclass
class Provenance:
    """Where the drafter and its target come from, for the card: hub repos and revisions, or local names."""

    drafter: str
    drafter_revision: str | None
    target: str
    target_revision: str | None
    drafter_is_repo: bool = False


def sums_text(folder: Path, names: list[str]) -> str:
    """``<sha256>  <name>`` lines, sorted by name: the format ``sha256sum -c`` reads."""
    return "".join(f"{sha256_file(folder / n)}  {n}\n" for n in sorted(names))


def _yaml_scalar(value: object) -> str:
    """A YAML scalar: JSON's quoting is valid YAML, and keeps any value from becoming structure."""
    return json.dumps(value, ensure_ascii=False)


def front_matter(source_card: dict[str, Any], prov: Provenance) -> str:
    """The release card's YAML front matter: its base model, the source card's license and pipeline tag, our tags."""
    lines = ["---", f"base_model: {_yaml_scalar(prov.drafter)}", "base_model_relation: quantized"]
    for name in ("license", "license_name", "license_link"):
        value = source_card.get(name)
        if isinstance(value, str) and value.strip():
            lines.append(f"{name}: {_yaml_scalar(value)}")
    tag = source_card.get("pipeline_tag")
    lines.append(f"pipeline_tag: {_yaml_scalar(tag if isinstance(tag, str) and tag.strip() else DEFAULT_PIPELINE_TAG)}")
    lines.append("tags:")
    lines += [f"- {_yaml_scalar(t)}" for t in TAGS]
    lines.append("---")
    return "\n".join(lines) + "\n"


def fidelity_text(f: dict[str, Any] | None) -> str:
    """check's verdict on one file, as the card and the summary table show it."""
    if f is None:
        return "not measured"
    return (f"{f['result']}: top-1 {f['top1_agreement_tie_aware']:.3f}, KL {f['kl_mean']:.3g}, "
            f"hidden rel err {f['hidden_max_rel_err']:.3g} ({f['precision_class']} limits)")


def model_card(files: list[ReleaseFile], prov: Provenance, source_card: dict[str, Any], *, spec_type: str, n_max: int,
               upload: str | None, checked: bool) -> str:
    """README.md: front matter, what the files are, the table, the pairing, how to run them."""
    title = prov.drafter.rsplit("/", 1)[-1]
    repo = upload or "ORG/NAME"
    drafter = f"[{prov.drafter}](https://huggingface.co/{prov.drafter})" if prov.drafter_is_repo else f"`{prov.drafter}` (a local directory)"
    if prov.drafter_revision:
        drafter += f" at revision `{prov.drafter_revision}`"
    target = f"`{prov.target}`" + (f" at revision `{prov.target_revision}`" if prov.target_revision
                                     else " (revision not recorded)")
    header = "| File | Type | Size | SHA-256 | validate |" + (" fidelity (check) |" if checked else "")
    rule = "|---|---|---|---|---|" + ("---|" if checked else "")
    rows = [f"| `{f.name}` | {f.type_name} | {human_size(f.size)} | `{f.sha256}` | {f.validate} |"
            + (f" {fidelity_text(f.fidelity)} |" if checked else "") for f in files]
    pick = next((f for f in files if f.type_name == "Q4_K_M"), files[-1])
    spec = f"--spec-type {spec_type} --spec-draft-n-max {n_max}"
    parts = [
        front_matter(source_card, prov),
        f"# {title} GGUF",
        "",
        f"GGUF files of the DFlash drafter {drafter} for llama.cpp's speculative decoding, written by "
        "dflash-convert (`dflash-convert publish`).",
        "",
        "## Target",
        "",
        f"The drafter pairs with the target model {target}; every file was validated against it.",
        "",
        "## Files",
        "",
        header, rule, *rows,
        "",
        f"Every file passes `dflash-convert validate` against the target for llama.cpp commit `{LLAMA_CPP_COMMIT}`; "
        f"its report is the `{REPORT_SUFFIX}` file beside it. Check the downloads with `sha256sum -c {SUMS_NAME}`.",
    ]
    if checked:
        parts += ["", "Fidelity: `dflash-convert check` of each file against the checkpoint (the tie-aware top-1 "
                  "agreement of the drafted tokens, the mean KL divergence, the hidden states' max relative error)."]
    parts += [
        "",
        "## Usage",
        "",
        "From the hub (the target's own GGUF repository for `-hf`):",
        "",
        "```",
        f"llama-server -hf TARGET-GGUF-REPO:Q4_K_M -hfd {repo}:{pick.type_name} {spec} -fa on",
        "```",
        "",
        "From local files:",
        "",
        "```",
        f"llama-server -m TARGET.gguf -md {pick.name} {spec} -fa on",
        "```",
        "",
    ]
    return "\n".join(parts)
