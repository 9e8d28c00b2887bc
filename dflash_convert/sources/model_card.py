"""A checkpoint's model card -> the general.* keys upstream's converter writes from it.

gguf-py's own heuristics do the judgement (base models, datasets, splitting a directory name);
the files are read here, bounded, with one error line for a bad file. The YAML front matter is
plain data (no tag constructs an object), at most ``MAX_CARD_BYTES``, and without aliases (a 1 KB
card could stand for 10**9 strings). ``convert`` and ``publish`` both read cards here.
Specification: docs/conversion.md, "Options" (the model card).
"""

from __future__ import annotations

import logging
import os
import reprlib
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import Any

import yaml
from gguf.metadata import Metadata as UpstreamCard
from gguf.utility import size_label as upstream_size_label

from ..errors import ConfigError, DFlashError, InputFileError, printable
from ..files import parse_json, read_regular_bytes
from ..format.keys import (
    BASE_MODEL_FIELD,
    CARD_ENTRY_FIELDS,
    DATASET_FIELD,
    FLOAT_VALUE_TYPES,
    INT_TYPES,
    KEYS,
    OVERRIDE_BASE_MODELS,
    OVERRIDE_DATASETS,
    ValueType,
    key,
)
from ..metadata import Metadata

log = logging.getLogger("dflash_convert")

CARD_NAME = "README.md"
GENERATION_CONFIG_NAME = "generation_config.json"
MAX_CARD_BYTES = 1 << 20  # model cards are kilobytes; refuse the absurd before decoding it
MAX_OVERRIDE_BYTES = 16 * 1024 * 1024
FRONT_MATTER_FENCE = "---"
SHOWN_CHARS = 80  # of a value in a message: reprlib's bounded repr, cut
# libyaml's parser where it is built (linear, and it refuses nesting past 1000 levels), else PyYAML's own
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# the card fields gguf-py reads as lists of entries: each a string (an id or a URL) or a mapping
_ENTRY_LISTS: dict[str, tuple[str, ...]] = {
    "base model": ("base_model", "base_models", "base_model_sources"),
    "dataset": ("datasets", "dataset", "dataset_sources"),
}

# the single-valued fields, in the order upstream writes their keys; each is also the KEYS short name
SCALAR_FIELDS: tuple[str, ...] = (
    "sampling_sequence", "sampling_top_k", "sampling_top_p", "sampling_min_p", "sampling_xtc_probability",
    "sampling_xtc_threshold", "sampling_temp", "sampling_penalty_last_n", "sampling_penalty_repeat",
    "sampling_mirostat", "sampling_mirostat_tau", "sampling_mirostat_eta",
    "name", "author", "version", "organization", "finetune", "basename", "description", "quantized_by",
    "size_label", "license", "license_name", "license_link", "url", "doi", "uuid", "repo_url",
    "source_url", "source_doi", "source_uuid", "source_repo_url",
)
LIST_FIELDS: tuple[str, ...] = ("tags", "languages")  # written after the base models and datasets

# generation_config.json key(s) of each sampling field, the first one present wins
_GENERATION_CONFIG: dict[str, tuple[str, ...]] = {
    "sampling_sequence": ("sequence",), "sampling_top_k": ("top_k",), "sampling_top_p": ("top_p",),
    "sampling_min_p": ("min_p",), "sampling_xtc_probability": ("xtc_probability",),
    "sampling_xtc_threshold": ("xtc_threshold",), "sampling_temp": ("temperature",),
    "sampling_penalty_last_n": ("penalty_last_n",),
    "sampling_penalty_repeat": ("penalty_repeat", "repetition_penalty"),
    "sampling_mirostat": ("mirostat",), "sampling_mirostat_tau": ("mirostat_tau",),
    "sampling_mirostat_eta": ("mirostat_eta",),
}
# what upstream's --metadata file may set: every field by its GGUF key but general.license (upstream
# reads no override for it), and the two lists of entries under their own names
_OVERRIDABLE: dict[str, str] = {
    **{key(f): f for f in (*SCALAR_FIELDS, *LIST_FIELDS) if f != "license"},
    OVERRIDE_BASE_MODELS: "base_models", OVERRIDE_DATASETS: "datasets",
}


@dataclass
class ModelCard:
    """The general.* keys a model card gives, in upstream's order, and the files they came from."""

    metadata: Metadata
    files: list[Path] = field(default_factory=list)
    front_matter: dict[str, Any] = field(default_factory=dict)  # README.md's, as read (publish's card reads it)


def front_matter(path: Path) -> dict[str, Any]:
    """The YAML front matter of a README.md as a dict; {} when it has none."""
    raw = read_regular_bytes(path, CARD_NAME, MAX_CARD_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputFileError(f"the model card is not UTF-8 text (byte {e.start})", path) from None
    lines = text.splitlines()
    if not lines or lines[0] != FRONT_MATTER_FENCE:
        return {}
    block: list[str] = []
    for line in lines[1:]:
        if line == FRONT_MATTER_FENCE:
            break
        block.append(line)
    # upstream's two textual repairs, so the same card gives the same values: YAML 1.1 reads a bare
    # `no` as false (Norwegian in a language list), and YAML forbids tabs in indentation
    source = ("\n".join(block) + "\n").replace("- no\n", '- "no"\n').replace("\t", "  ")
    data = _plain_yaml(source, path)
    if not isinstance(data, dict):
        if data is not None:  # as upstream: logged and ignored
            log.warning("%s: the model card's front matter is %s, not a mapping; ignored",
                        printable(path), type(data).__name__)
        return {}
    return data


def _plain_yaml(source: str, path: Path) -> Any:
    """The YAML document as plain data; an alias, a syntax error or deep nesting is one error line."""
    try:
        events = _YAML_LOADER(source)
        try:  # aliases first, on the event stream: nothing is built from a card that has one
            while events.check_event():
                if isinstance(events.get_event(), yaml.AliasEvent):
                    raise InputFileError("the model card's front matter uses a YAML alias (*name), which can make a small "
                                         "card expand without bound; write the values out", path)
        finally:
            events.dispose()
        return yaml.load(source, Loader=_YAML_LOADER)  # noqa: S506 - a safe loader: plain data only
    except yaml.YAMLError as e:
        raise InputFileError(f"the model card's front matter is not valid YAML: {_yaml_problem(e)}", path) from None
    except RecursionError:
        raise InputFileError("the model card's front matter nests too deeply", path) from None


def _yaml_problem(e: yaml.YAMLError) -> str:
    """One line: what the YAML parser found and on which line of the README.md (the block starts on line 2)."""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    mark = getattr(e, "problem_mark", None)
    problem = " ".join(str(problem).split())[:200]
    return f"{problem} (line {mark.line + 2})" if mark is not None else problem


def _bounded_entries(card: dict[str, Any], path: Path) -> dict[str, Any]:
    """The card with each base-model or dataset entry gguf-py cannot use replaced by its empty entry, said here shortened."""
    out = dict(card)
    for what, names in _ENTRY_LISTS.items():
        name = next((n for n in names if n in card), None)
        value = card.get(name) if name else None
        if not isinstance(value, list):
            continue
        kept = []
        for entry in value:
            if not isinstance(entry, (str, dict)):
                log.warning("%s: %s entry %s is neither a name nor a mapping; written as an empty entry, as upstream does",
                            printable(path), what, shortened(entry))
                entry = {}
            kept.append(entry)
        out[name] = kept
    return out


def generation_config(path: Path) -> dict[str, Any]:
    """generation_config.json as a dict; like upstream, one that cannot be read is left out (with a warning)."""
    try:
        data = parse_json(read_regular_bytes(path, GENERATION_CONFIG_NAME, MAX_CARD_BYTES), GENERATION_CONFIG_NAME, path)
    except InputFileError as e:
        log.warning("%s; its sampling settings are not written", e)
        return {}
    if not isinstance(data, dict):
        log.warning("%s: not a JSON object; its sampling settings are not written", printable(path))
        return {}
    return data


def read_metadata_override(path: str | os.PathLike) -> dict[str, Any]:
    """A ``--metadata FILE.json``: a JSON object of general.* keys (upstream's flag)."""
    data = parse_json(read_regular_bytes(path, "--metadata file", MAX_OVERRIDE_BYTES), "--metadata file", path)
    if not isinstance(data, dict):
        raise ConfigError("the --metadata file must hold a JSON object of general.* keys", path)
    ignored = sorted(k for k in data if k not in _OVERRIDABLE)
    if ignored:
        shown = ", ".join(printable(shortened(k)[1:-1]) for k in ignored[:10]) + (f" and {len(ignored) - 10} more" if len(ignored) > 10 else "")
        log.warning("%s: upstream's --metadata does not set %s; ignored", printable(path), shown)
    return data


def parameter_count(shapes: list[tuple[int, ...]]) -> int:
    """Elements of every tensor written: what upstream's size label is made from (a drafter has no experts)."""
    return sum(prod(s) for s in shapes)


def read_model_card(model_dir: Path, config: dict[str, Any], n_params: int,
                    override: str | os.PathLike | None = None, *, dir_name: str | None = None) -> ModelCard:
    """Every general.* key upstream's converter writes from ``model_dir``'s card, in its order (``dir_name``: the model's name)."""
    files: list[Path] = []
    # what the directory is called, even when given as "." or a link
    named = Path(dir_name) if dir_name else Path(os.path.realpath(model_dir))
    card_path, gen_path = model_dir / CARD_NAME, model_dir / GENERATION_CONFIG_NAME
    card = front_matter(card_path) if card_path.exists() else {}
    if card_path.exists():
        files.append(card_path)
    origin: dict[str, Path] = {}  # where a field's value came from, for the error line (the card otherwise)

    name_or_path = config.get("_name_or_path")
    hf_params = {"_name_or_path": name_or_path} if isinstance(name_or_path, str) else {}
    fields = UpstreamCard()
    try:
        fields = UpstreamCard.apply_metadata_heuristic(fields, _bounded_entries(card, card_path), hf_params, named, n_params)
    except (TypeError, AttributeError, ValueError) as e:  # a value of a shape upstream's heuristics cannot take
        problem = " ".join(str(e).split())[:200]
        raise ConfigError(f"the model card's front matter has a value gguf-py cannot use: {problem}", card_path) from None

    if gen_path.exists():
        gen = generation_config(gen_path)
        files.append(gen_path)
        for f, names in _GENERATION_CONFIG.items():
            present = next((n for n in names if n in gen), None)
            if present is not None:
                setattr(fields, f, gen[present])
                origin[f] = gen_path

    if override is not None:
        values = read_metadata_override(override)
        files.append(Path(override))
        for k, f in _OVERRIDABLE.items():
            if k in values:
                setattr(fields, f, values[k])
                origin[f] = Path(override)

    if fields.size_label is None and n_params > 0:
        fields.size_label = upstream_size_label(n_params, n_params, 0, 0)
    if fields.name is None:
        fields.name = named.name
    return ModelCard(_card_keys(fields, origin, card_path), files, card)


def _card_keys(fields: UpstreamCard, origin: dict[str, Path], card_path: Path) -> Metadata:
    """The keys, typed as upstream's writer types them; empty strings and lists are left out, as it does."""
    md = Metadata()

    def where(f: str) -> Path:
        return origin.get(f, card_path)

    for f in SCALAR_FIELDS:
        value = getattr(fields, f)
        if f == "license" and isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = ",".join(value)  # several licenses: one string, comma-separated
        if value is None or value == "":
            continue
        _, vtype, _ = KEYS[f]
        try:
            md.set_raw(key(f), vtype, _typed(key(f), vtype, value, where(f)))
        except ConfigError:
            raise
        except DFlashError as e:  # a value that does not fit its GGUF type: named with the file it came from
            raise ConfigError(str(e), where(f)) from None
    for f, count_key, entry_key in (("base_models", "base_model_count", BASE_MODEL_FIELD),
                                    ("datasets", "dataset_count", DATASET_FIELD)):
        entries = getattr(fields, f)
        if entries is None:
            continue
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise ConfigError(f"{f} must be a list of objects, not {shortened(entries)}", where(f))
        md.set(count_key, len(entries))
        for i, entry in enumerate(entries):
            for name in CARD_ENTRY_FIELDS:
                k = entry_key.format(i=i, field=name)
                if entry.get(name):
                    md.set_raw(k, ValueType.STRING, _typed(k, ValueType.STRING, entry[name], where(f)))
    for f in LIST_FIELDS:
        items = getattr(fields, f)
        if not items:
            continue
        if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
            raise ConfigError(f"{key(f)} must be a list of strings, not {shortened(items)}", where(f))
        md.set(f, [printable(v) for v in items])
    return md


def _typed(k: str, vtype: ValueType, value: Any, path: Path) -> Any:
    """``value`` checked against the type ``k`` is written as: one error line naming the file it came from."""
    if vtype == ValueType.STRING:
        ok = isinstance(value, str)
    elif vtype in INT_TYPES:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif vtype in FLOAT_VALUE_TYPES:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:  # pragma: no cover - every card field is a string or a number
        raise DFlashError(f"{k}: no rule for {vtype.name}")
    if not ok:
        want = {ValueType.STRING: "a string", ValueType.INT32: "an integer"}.get(vtype, "a number")
        raise ConfigError(f"{k} must be {want}, not {shortened(value)}", path)
    return printable(value) if vtype == ValueType.STRING else value


def shortened(value: Any) -> str:
    """A value as a message shows it: reprlib's bounded repr, cut to ``SHOWN_CHARS``."""
    text = reprlib.repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."
