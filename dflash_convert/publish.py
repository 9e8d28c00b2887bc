"""publish(): one drafter checkpoint -> a release directory of validated GGUF files, sums and a model card.

The checkpoint is converted once (the release's first full-precision type, else a scratch ``auto``
conversion that is not released), every quantized type is quantized from that one file, and every
file is validated against the target right after it is written: the first that fails stops the
release (and, with ``check``, the first that fails ``check`` against the checkpoint). Beside each
file goes its ``validate --json`` report; then ``SHA256SUMS`` (``sha256sum -c`` reads it) and a
``README.md`` model card whose YAML front matter the hub reads.

Everything is written into a hidden sibling of the release directory, made exclusively for this run,
and renamed into place at the end without replacing anything that appeared meanwhile (``force``:
the old directory is swapped out atomically and removed). Any error or signal removes the staging
directory, so a release directory either is complete or does not exist. Only then, with ``upload``,
the directory is pushed with huggingface_hub; a release that fails anything is never uploaded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .conversion import plan_conversion, write_plan
from .errors import DFlashError, InputFileError
from .files import open_regular, read_regular_bytes
from .format.family import DSPARK, draft_tokens_per_block, member_of
from .format.file_names import quantized_file_name
from .format.keys import ARCH, key
from .format.quant_types import DEFAULT_RELEASE_TYPES
from .inspect_gguf import block_size, member
from .outputs import exchange_paths, hub_cache_dir, inside_hub_cache, pid_alive, rename_no_replace, temporary_name
from .plan import AUTO, FLOAT_INPUTS, parse_ftype
from .quantize import quantize
from .sources.gguf import read_gguf
from .sources.gguf_drafter import read_drafter
from .sources.hub import DRAFTER, TARGET, TARGET_WEIGHTS, resolve_source
from .terminal import visible
from .validate import validate
from .validate.gate import failure_summary
from .validate.report import LLAMA_CPP_COMMIT, render_json
from .write import fault_point

log = logging.getLogger("dflash_convert")

DEFAULT_TYPES = DEFAULT_RELEASE_TYPES
SUMS_NAME = "SHA256SUMS"
CARD_NAME = "README.md"
REPORT_SUFFIX = ".validate.json"
STAGING_SUFFIX = ".dflash-partial"
CARD_LIMIT = 1 << 20  # bytes of a source model card read; a card is a few KiB, a larger one is not a card
TAGS = ("gguf", ARCH, "speculative-decoding", "llama.cpp")  # the architecture name is the hub tag
DEFAULT_PIPELINE_TAG = "text-generation"
TOKEN_HELP = "set HF_TOKEN or log in with `hf auth login`"


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


@dataclass
class Release:
    out_dir: Path
    types: list[str]
    files: list[ReleaseFile] = field(default_factory=list)
    sums: str = ""  # SHA256SUMS's text
    card: str = ""  # README.md's text
    base_type: str = ""  # the full-precision type every quantized file comes from
    uploaded: str | None = None  # the commit the upload made
    dry_run: bool = False

    @property
    def names(self) -> list[str]:
        """Every file the release directory holds."""
        return sorted([*(f.name for f in self.files), *(f.report_name for f in self.files), SUMS_NAME, CARD_NAME])

    def dry_run_lines(self, upload: str | None = None) -> list[str]:
        """publish --dry-run: every file with its type and report, the rest of the directory, the upload."""
        listed = {f.name for f in self.files} | {f.report_name for f in self.files}
        return [f"release: {self.out_dir}; every quantized type from {self.base_type}",
                *(f"  {f.type_name:<8} {f.name} (+ {f.report_name})" for f in self.files),
                f"  and {', '.join(n for n in self.names if n not in listed)}",
                *([f"then upload to {upload}"] if upload is not None else []), "dry run: nothing written"]

    def lines(self, upload: str | None = None) -> list[str]:
        """The summary table, the directory written and, with ``upload``, the commit the upload made."""
        n = len(self.files)
        return [*summary_rows(self), f"wrote {self.out_dir}: {n} GGUF file{'s' if n != 1 else ''}, "
                f"{'their' if n != 1 else 'its'} validate report, SHA256SUMS and README.md",
                *([f"uploaded to {upload}: {self.uploaded}"] if self.uploaded is not None else [])]


# --- what to make ------------------------------------------------------------------------------


def parse_types(types: str | list[str] | tuple[str, ...]) -> list[str]:
    """``BF16,Q8_0,...`` -> canonical type names, in order; one error line for an unknown or repeated one."""
    items = types.split(",") if isinstance(types, str) else list(types)
    out: list[str] = []
    for item in items:
        name = item.strip()
        if not name:
            continue
        canon = name.upper() if name.upper() in FLOAT_INPUTS else parse_ftype(name)
        if canon in out:
            raise DFlashError(f"--types names {canon} twice")
        out.append(canon)
    if not out:
        raise DFlashError("--types names no type")
    return out


def base_type(types: list[str]) -> str | None:
    """The full-precision type quantized files come from: the first float type of the release, else None
    (a scratch ``auto`` conversion, not released)."""
    return next((t for t in types if t in FLOAT_INPUTS), None)


# --- the release directory ----------------------------------------------------------------------


def _resolved(p: Path) -> Path:
    return Path(os.path.realpath(p))


def check_release_dir(out_dir: str | os.PathLike, inputs: list[Path], *, force: bool) -> Path:
    """Refuse a release directory that is or holds an input, that exists (without ``force``), or that is
    not a directory; its folder must exist and be writable. Returns the path."""
    text = os.fspath(out_dir)
    if not text.strip():
        raise DFlashError("the release directory path is empty")
    out = Path(text.rstrip(os.sep) or os.sep)
    where = _resolved(out)
    if inside_hub_cache(where):  # refused before a staging directory is made there
        raise DFlashError(f"the release directory is inside the Hugging Face cache ({hub_cache_dir()}); choose another path", out)
    for p in inputs:
        inp = _resolved(p)
        if inp == where or where in inp.parents:
            raise DFlashError(f"the release directory would replace an input ({p}); choose another directory", out)
    if out.is_symlink():
        raise DFlashError("the release directory is a symbolic link; choose another path", out)
    if os.path.lexists(out):
        if not out.is_dir():
            raise DFlashError("exists and is not a directory", out)
        if not force:
            raise DFlashError("the release directory exists; pass --force to replace it", out)
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise DFlashError("the release directory's folder does not exist", parent)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DFlashError("the release directory's folder is not writable", parent)
    return out


def _stale_staging(out: Path) -> list[Path]:
    """Staging directories a killed run (SIGKILL, a power cut) left beside ``out``."""
    folder = out.parent if str(out.parent) else Path(".")
    stem = temporary_name(out, 0, "")[: -len(f".0-{STAGING_SUFFIX}")] + "."
    found = []
    for name in sorted(os.listdir(folder)):
        if name.startswith(stem) and name.endswith(STAGING_SUFFIX):
            pid = name[len(stem):].split("-", 1)[0]
            if pid.isdigit() and not pid_alive(int(pid)) and (folder / name).is_dir():
                found.append(folder / name)
    return found


class StagingDir:
    """A new hidden directory beside the release directory, renamed into place when complete.

    Made with mkdir (which never follows or reuses anything) under a name with 64 random bits;
    ``commit`` renames it to the release directory without replacing one that appeared meanwhile,
    or, with ``replace``, swaps it with the existing one (renameat2 RENAME_EXCHANGE) and removes the
    old one. ``discard`` removes it; as a context manager it is discarded on any exception or signal.
    """

    def __init__(self, out: Path) -> None:
        self.out = out
        folder = out.parent if str(out.parent) else Path(".")
        for _ in range(16):
            self.path = folder / temporary_name(out, os.getpid(), secrets.token_hex(8))
            try:
                os.mkdir(self.path, 0o777)
            except FileExistsError:
                continue
            except OSError as e:
                raise DFlashError(f"cannot write the release: {e.strerror or e}", out) from e
            break
        else:
            raise DFlashError("cannot create a staging directory beside the release (every random name was taken)", out)
        st = os.lstat(self.path)
        self._ident = (st.st_dev, st.st_ino)
        self.done = False

    def commit(self, *, replace: bool) -> None:
        st = os.lstat(self.path)
        if (st.st_dev, st.st_ino) != self._ident or not stat.S_ISDIR(st.st_mode):
            raise DFlashError(f"the staging directory {self.path.name} was moved or replaced; nothing was released", self.out)
        try:
            if replace and os.path.lexists(self.out):
                self._swap()
            else:
                rename_no_replace(self.path, self.out)
        except FileExistsError:
            raise DFlashError("the release directory appeared while this run was writing it (another run?); it was not "
                              "replaced: pass --force to replace it", self.out) from None
        except OSError as e:
            raise DFlashError(f"cannot write the release: {e.strerror or e}", self.out) from e
        self.done = True

    def _swap(self) -> None:
        """The staging directory becomes the release; the old release ends up here and is removed."""
        if exchange_paths(self.path, self.out):
            self.done = True
            shutil.rmtree(self.path, ignore_errors=True)
            return
        # no atomic exchange on this file system: move the old one aside, put the new one in, else move it back
        aside = self.out.parent / temporary_name(self.out, os.getpid(), secrets.token_hex(8) + "-old")
        os.rename(self.out, aside)
        try:
            rename_no_replace(self.path, self.out)
        except BaseException:
            os.rename(aside, self.out)
            raise
        self.done = True
        shutil.rmtree(aside, ignore_errors=True)

    def discard(self) -> None:
        if self.done:
            return
        try:
            st = os.lstat(self.path)
        except OSError:
            return
        if (st.st_dev, st.st_ino) == self._ident:
            shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> StagingDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()


# --- provenance and the source card -------------------------------------------------------------


def read_source_card(src: Path) -> dict[str, Any]:
    """The drafter's README.md front matter (license, pipeline_tag, ...); {} when there is no card.
    Bounded in size; malformed YAML is one error line naming the card."""
    path = src / CARD_NAME
    if not path.exists():
        return {}
    data = read_regular_bytes(path, "model card", limit=CARD_LIMIT)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputFileError(f"the model card is not UTF-8 (byte {e.start})", path) from None
    if not text.startswith("---"):
        return {}
    try:
        from huggingface_hub import ModelCard  # optional (the [publish] extra), and slow to import
    except ImportError:
        raise DFlashError("reading the model card's front matter needs huggingface_hub: pip install "
                          "'dflash-convert[publish]'", path) from None
    try:
        card = ModelCard(text, ignore_metadata_errors=False)
    except Exception as e:  # yaml's YAMLError or the card's ValueError (front matter that is not a mapping)
        first = " ".join(str(e).split())[:200]
        raise InputFileError(f"the model card's YAML front matter is malformed: {first}", path) from None
    return card.data.to_dict()


def read_provenance(gguf: Path, src: Path, target_dir: Path, *, drafter_repo: str | None, target_repo: str | None,
                    target_revision: str | None) -> Provenance:
    """The arguments first, then the converted file's general.source.hf_* / general.target.hf_* keys,
    else the local directory names."""
    g = read_gguf(gguf)
    try:
        got = {k: g.get(key(k)) for k in ("source_hf_repo", "source_hf_commit", "target_hf_repo", "target_hf_commit")}
    finally:
        g.close()
    drafter = drafter_repo or got["source_hf_repo"]
    target = target_repo or got["target_hf_repo"]
    # a revision the file records is the one of the repo it records, not of another one named here
    drafter_rev = got["source_hf_commit"] if drafter and drafter == got["source_hf_repo"] else None
    target_rev = target_revision or (got["target_hf_commit"] if target and target == got["target_hf_repo"] else None)
    return Provenance(drafter=drafter or _resolved(src).name, drafter_revision=drafter_rev,
                      target=target or _resolved(target_dir).name, target_revision=target_rev,
                      drafter_is_repo=drafter is not None)


# --- the card and the sums ---------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with os.fdopen(open_regular(path), "rb", buffering=0) as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def sums_text(folder: Path, names: list[str]) -> str:
    """``<sha256>  <name>`` lines, sorted by name: the format ``sha256sum -c`` reads."""
    return "".join(f"{sha256_of(folder / n)}  {n}\n" for n in sorted(names))


def _yaml_scalar(value: object) -> str:
    """A YAML scalar: JSON's quoting is valid YAML, and keeps any value from becoming structure."""
    return json.dumps(value, ensure_ascii=False)


def front_matter(source_card: dict[str, Any], prov: Provenance) -> str:
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


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def fidelity_text(f: dict[str, Any] | None) -> str:
    if f is None:
        return "not measured"
    return (f"{f['result']}: top-1 {f['top1_agreement_tie_aware']:.3f}, KL {f['kl_mean']:.3g}, "
            f"hidden rel err {f['hidden_max_rel_err']:.3g} ({f['precision_class']} limits)")


def model_card(release: Release, prov: Provenance, source_card: dict[str, Any], *, spec_type: str, n_max: int,
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
    rows = [f"| `{f.name}` | {f.type_name} | {_human(f.size)} | `{f.sha256}` | {f.validate} |"
            + (f" {fidelity_text(f.fidelity)} |" if checked else "") for f in release.files]
    pick = next((f for f in release.files if f.type_name == "Q4_K_M"), release.files[-1])
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


def _write_new(path: Path, text: str) -> None:
    """A new file in the staging directory (exclusive: nothing there is followed or replaced)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o666)
    with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


# --- upload -------------------------------------------------------------------------------------


def upload_token(repo_id: str) -> str:
    """The hub token (HF_TOKEN, else the login cache) and a well-formed repo id, before any work is done."""
    try:
        # optional (the [publish] extra), and slow to import
        from huggingface_hub import get_token
        from huggingface_hub.utils import HFValidationError, validate_repo_id
    except ImportError:
        raise DFlashError("--upload needs huggingface_hub: pip install 'dflash-convert[publish]'") from None
    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise DFlashError(f"--upload {repo_id!r} is not a repo id (org/name): {e}") from None
    if repo_id.count("/") != 1:
        raise DFlashError(f"--upload {repo_id!r} is not a repo id of the form org/name")
    token = get_token()
    if not token:
        raise DFlashError(f"--upload needs a Hugging Face token: {TOKEN_HELP}")
    return token


def upload_release(folder: Path, repo_id: str, token: str, names: list[str]) -> str:
    """Push the release directory in one commit (HF_ENDPOINT honoured); returns the commit's url."""
    from huggingface_hub import HfApi  # optional (the [publish] extra), and slow to import

    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None, token=token)
    try:
        api.create_repo(repo_id, repo_type="model", exist_ok=True)
        info = api.upload_folder(repo_id=repo_id, repo_type="model", folder_path=folder, allow_patterns=names,
                                 commit_message=f"dflash-convert publish: {len(names)} files")
    except Exception as e:  # the hub client raises HTTP, network and validation errors of many kinds
        first = " ".join(str(e).split())[:300]
        raise DFlashError(f"the upload to {repo_id} failed ({type(e).__name__}: {first}); the release is complete: "
                          "run publish again with --force --upload to push it", folder) from None
    return str(getattr(info, "commit_url", info))


# --- publish ------------------------------------------------------------------------------------


class FileBar:
    """One progress bar per file of the release (its steps: written, validated, checked), left on the screen;
    the writer's own byte bar runs beneath it while the file is written. Nothing without ``progress``, or
    off a terminal."""

    def __init__(self, name: str, steps: int, progress: bool) -> None:
        self.bar = None
        self.name = visible(name)
        if progress:
            from tqdm import tqdm  # only a progress bar on a terminal needs it

            self.bar = tqdm(total=steps, desc=self.name, unit="step", leave=True, disable=None, bar_format="{bar:12} {desc}")

    def doing(self, what: str) -> None:
        if self.bar is not None:
            self.bar.set_description_str(f"{self.name}: {what}")

    def step(self, then: str) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_description_str(f"{self.name}: {then}")

    def __enter__(self) -> FileBar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()


def _fidelity(path: Path, src: str | os.PathLike, target_dir: str | os.PathLike, device: str) -> dict[str, Any]:
    from .check import check as run_check  # imports torch: only --check pays for it

    report = run_check(path, src, target_model_dir=target_dir, device=device)
    m = report.metrics
    out = {"result": "pass" if report.passed else "fail", "precision_class": report.precision_class,
           "top1_agreement_tie_aware": m["top1_agreement_tie_aware"], "kl_mean": m["kl_mean"],
           "hidden_max_rel_err": m["hidden_max_rel_err"]}
    if not report.passed:
        raise DFlashError(f"fails check against the checkpoint ({report.failures[0]}); nothing was released", path.name)
    return out


def _validated(path: Path, target_dir: Path, target_label: str, type_name: str, report_dir: Path) -> ReleaseFile:
    """validate the file against the target (stop on a failure) and write its report beside it."""
    report = validate(path, target_dir)
    if report.exit_code != 0:
        why = failure_summary(report) or report.error_line() or report.result
        raise DFlashError(f"fails validate against the target ({why}); nothing was released", path.name)
    report.file = Path(path.name)  # as the release names it: no local path goes into a published file
    report.target = Path(target_label)
    report_name = path.name + REPORT_SUFFIX
    _write_new(report_dir / report_name, render_json(report) + "\n")
    return ReleaseFile(path.name, type_name, path.stat().st_size, sha256_of(path), report.result, report_name)


def publish(src: str | os.PathLike, target_model_dir: str | os.PathLike, out_dir: str | os.PathLike, *,
            types: str | list[str] | tuple[str, ...] = DEFAULT_TYPES, check: bool = False, upload: str | None = None,
            dry_run: bool = False, force: bool = False, progress: bool = False, drafter_repo: str | None = None,
            target_repo: str | None = None, target_revision: str | None = None, tokenizer_pre: str | None = None,
            device: str = "auto") -> Release:
    """Convert, quantize, validate (and ``check``) every type into a new release directory; with ``upload``
    push it to that hub repo. Raises DFlashError, leaving no directory, when any file fails.

    ``src`` and ``target_model_dir`` are directories or Hugging Face repo ids (``org/name[@revision]``,
    sources/hub.py); a repo id's resolved commit goes into the files and so into the card."""
    src_spec, target_spec = src, target_model_dir
    source = resolve_source(src, DRAFTER)
    target = resolve_source(target_model_dir, TARGET_WEIGHTS if check else TARGET)  # check reads the target's head
    src, target_dir = source.path, target.path
    names = parse_types(types)
    out = check_release_dir(out_dir, [src, target_dir], force=force)
    token = upload_token(upload) if upload is not None else None
    source_card = read_source_card(src)
    base = base_type(names)
    release = Release(out, names, base_type=base or AUTO, dry_run=dry_run)
    # the names convert and quantize give these files by default (dflash-<Name>-<TYPE>.gguf, dspark- for
    # DSpark; <Name> is general.name from the card): read from one plan, which writes nothing
    plan = plan_conversion(src_spec, target_spec, outfile=out.parent, outtype=(base or AUTO).lower(),
                           tokenizer_pre=tokenizer_pre, hash_sources=False)
    dspark = member_of({t.gguf_name for t in plan.drafter.tensors}) == DSPARK
    file_names = {t: quantized_file_name(plan.output.name, t, dspark=dspark) for t in names}
    if dry_run:
        release.base_type = plan.type_name
        release.files = [ReleaseFile(file_names[t], t, 0, "", "", file_names[t] + REPORT_SUFFIX) for t in names]
        return release
    for stale in _stale_staging(out):
        if force:
            shutil.rmtree(stale, ignore_errors=True)
            log.warning("removed %s, left by a publish that did not finish", stale)
        else:
            log.warning("%s was left by a publish that did not finish; remove it, or pass --force to have it removed", stale)
    target_label = target_repo or target.repo_id or _resolved(target_dir).name
    with StagingDir(out) as staging:
        folder = staging.path
        # the full-precision file first (every quantized file comes from it), the release in the order asked
        order = [base, *(t for t in names if t != base)] if base else names
        base_path: Path | None = None
        if base is None:
            with FileBar(f"scratch {AUTO} conversion", 1, progress) as bar:
                plan = plan_conversion(src_spec, target_spec, outfile=folder / f".scratch-{AUTO}.gguf", outtype=AUTO,
                                       tokenizer_pre=tokenizer_pre)
                base_path = write_plan(plan, progress=progress)
                release.base_type = plan.type_name
                bar.step("written (not released)")
        files: dict[str, ReleaseFile] = {}
        for t in order:
            name = file_names[t]
            with FileBar(name, 3 if check else 2, progress) as bar:
                bar.doing("writing")
                if t in FLOAT_INPUTS:  # converted from the checkpoint, never through another rounding
                    plan = plan_conversion(src_spec, target_spec, outfile=folder / name, outtype=t.lower(),
                                           tokenizer_pre=tokenizer_pre)
                    path = write_plan(plan, progress=progress)
                    if t == base:
                        base_path, release.base_type = path, plan.type_name
                else:
                    assert base_path is not None
                    path = quantize(base_path, folder / name, t, progress=progress).output
                bar.step("validating")
                files[t] = _validated(path, target_dir, target_label, t, folder)
                if check:
                    bar.step("checking")
                    files[t].fidelity = _fidelity(path, src_spec, target_spec, device)
                bar.step(f"validate {files[t].validate}" + (f", check {files[t].fidelity['result']}" if check else ""))
        assert base_path is not None
        prov = read_provenance(base_path, src, target_dir, drafter_repo=drafter_repo, target_repo=target_repo,
                               target_revision=target_revision)
        if base is None:
            base_path.unlink()  # the scratch conversion is no file of the release
        release.files = [files[t] for t in names]
        d = read_drafter(folder / release.files[0].name)
        kind, spec_type = member(d)
        n_max = max(1, draft_tokens_per_block(kind, block_size(d), d.sample_from_anchor))
        release.card = model_card(release, prov, source_card, spec_type=spec_type, n_max=n_max, upload=upload, checked=check)
        _write_new(folder / CARD_NAME, release.card)
        listed = [n for n in release.names if n != SUMS_NAME]
        release.sums = sums_text(folder, listed)
        _write_new(folder / SUMS_NAME, release.sums)
        unexpected = sorted(set(os.listdir(folder)) - set(release.names))
        if unexpected:  # nothing but what the card and the sums describe is released
            raise DFlashError(f"internal error: the staging directory holds unexpected files {unexpected}", out)
        fault_point("release")
        staging.commit(replace=force)
    if upload is not None:
        assert token is not None
        release.uploaded = upload_release(out, upload, token, release.names)
    return release


def summary_rows(release: Release) -> list[str]:
    """The summary table: type, size, sha256 prefix, validate's verdict, fidelity with check."""
    checked = any(f.fidelity is not None for f in release.files)
    width = max(len(f.name) for f in release.files)
    rows = [f"{'file':<{width}}  {'type':<7} {'size':>10}  {'sha256':<12}  validate" + ("  fidelity" if checked else "")]
    for f in release.files:
        rows.append(f"{visible(f.name):<{width}}  {f.type_name:<7} {_human(f.size):>10}  {f.sha256[:12]:<12}  {f.validate:<8}"
                    + (f"  {fidelity_text(f.fidelity)}" if checked else ""))
    return rows


__all__ = ["DEFAULT_TYPES", "Release", "ReleaseFile", "publish", "summary_rows"]
