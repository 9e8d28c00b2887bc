"""publish(): one drafter checkpoint -> a release directory of validated GGUF files, sums and a model card.

Converted once, every quantized type quantized from that file, each file validated right after it
is written: the first failure stops the release. Everything is staged beside the release directory
and committed as every output is (outputs.py); an error or a signal leaves no directory.
Specification: docs/publish.md.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .conversion import plan_conversion, write_plan
from .errors import DFlashError
from .files import hub_cache_dir, inside_hub_cache, sha256_file
from .format.family import DSPARK, draft_tokens_per_block, member_of
from .format.file_names import quantized_file_name
from .format.ggml import FLOAT_TYPE_NAMES
from .format.keys import key
from .format.quant_types import DEFAULT_RELEASE_TYPES
from .inspect_gguf import block_size, member
from .metadata import Metadata
from .outputs import TemporaryDirectory, resolved_path, stale_partials
from .plan import AUTO, parse_ftype
from .quantize import quantize
from .release_card import (
    CARD_NAME,
    REPORT_SUFFIX,
    SUMS_NAME,
    Provenance,
    ReleaseFile,
    fidelity_text,
    model_card,
    sums_text,
)
from .sources.gguf import GGUFFile
from .sources.gguf_drafter import read_drafter
from .sources.hub import DRAFTER, TARGET, TARGET_WEIGHTS, resolve_source
from .terminal import human_size, visible
from .tokenizer.cache import open_cache
from .upload import Timeouts, upload_check, upload_release
from .validate import PairingTarget, pairing_target, validate
from .validate.gate import failure_summary
from .validate.report import render_json
from .write import fault_point

log = logging.getLogger("dflash_convert")

DEFAULT_TYPES = DEFAULT_RELEASE_TYPES


@dataclass
class Release:
    """What publish made (or, with dry_run, would make): the files, their sums and card, the upload's commit."""

    out_dir: Path
    types: list[str]
    files: list[ReleaseFile] = field(default_factory=list)
    sums: str = ""
    card: str = ""
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


# --- what to make


def parse_types(types: str | list[str] | tuple[str, ...]) -> list[str]:
    """``BF16,Q8_0,...`` -> canonical type names, in order; one error line for an unknown or repeated one."""
    items = types.split(",") if isinstance(types, str) else list(types)
    out: list[str] = []
    for item in items:
        name = item.strip()
        if not name:
            continue
        canon = name.upper() if name.upper() in FLOAT_TYPE_NAMES else parse_ftype(name)
        if canon in out:
            raise DFlashError(f"--types names {canon} twice")
        out.append(canon)
    if not out:
        raise DFlashError("--types names no type")
    return out


def base_type(types: list[str]) -> str | None:
    """The full-precision type quantized files come from: the release's first float type, else None (a scratch conversion)."""
    return next((t for t in types if t in FLOAT_TYPE_NAMES), None)


# --- the release directory


def check_release_dir(out_dir: str | os.PathLike, inputs: list[Path], *, force: bool) -> Path:
    """Refuse a release directory that is or holds an input, exists (without ``force``) or is not a directory; returns it."""
    text = os.fspath(out_dir)
    if not text.strip():
        raise DFlashError("the release directory path is empty")
    out = Path(text.rstrip(os.sep) or os.sep)
    where = resolved_path(out)
    if inside_hub_cache(where):  # refused before a staging directory is made there
        raise DFlashError(f"the release directory is inside the Hugging Face cache ({hub_cache_dir()}); choose another path", out)
    for p in inputs:
        inp = resolved_path(p)
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
    return [p for p in stale_partials(out) if p.is_dir() and not p.is_symlink()]


def read_provenance(recorded: Metadata | GGUFFile, src: Path, target_dir: Path, *, drafter_repo: str | None,
                    target_repo: str | None, target_revision: str | None) -> Provenance:
    """The arguments, else the general.source/target.hf_* keys ``recorded`` holds, else the local directory names."""
    got = {k: recorded.get(key(k)) for k in ("source_hf_repo", "source_hf_commit", "target_hf_repo", "target_hf_commit")}
    drafter = drafter_repo or got["source_hf_repo"]
    target = target_repo or got["target_hf_repo"]
    # a revision the file records is the one of the repo it records, not of another one named here
    drafter_rev = got["source_hf_commit"] if drafter and drafter == got["source_hf_repo"] else None
    target_rev = target_revision or (got["target_hf_commit"] if target and target == got["target_hf_repo"] else None)
    return Provenance(drafter=drafter or resolved_path(src).name, drafter_revision=drafter_rev,
                      target=target or resolved_path(target_dir).name, target_revision=target_rev,
                      drafter_is_repo=drafter is not None)


def _write_new(path: Path, text: str) -> None:
    """A new file in the staging directory (exclusive: nothing there is followed or replaced)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o666)
    with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)




class FileBar:
    """One progress bar per release file (written, validated, checked) above the writer's byte bar; only on a terminal."""

    def __init__(self, name: str, steps: int, progress: bool) -> None:
        self.bar = None
        self.name = visible(name)
        if progress:
            from tqdm import tqdm  # only a progress bar on a terminal needs it

            self.bar = tqdm(total=steps, desc=self.name, unit="step", leave=True, disable=None, bar_format="{bar:12} {desc}")

    def doing(self, what: str) -> None:
        """Show ``what`` as the current step."""
        if self.bar is not None:
            self.bar.set_description_str(f"{self.name}: {what}")

    def step(self, then: str) -> None:
        """Count a step done and show ``then`` as the next."""
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


def _validated(path: Path, target: PairingTarget, target_label: str, type_name: str, report_dir: Path) -> ReleaseFile:
    """validate the file against the target (stop on a failure) and write its report beside it."""
    report = validate(path, target)
    if report.exit_code != 0:
        why = failure_summary(report) or report.error_line() or report.result
        raise DFlashError(f"fails validate against the target ({why}); nothing was released", path.name)
    report.file = Path(path.name)  # as the release names it: no local path goes into a published file
    report.target = Path(target_label)
    report_name = path.name + REPORT_SUFFIX
    _write_new(report_dir / report_name, render_json(report) + "\n")
    return ReleaseFile(path.name, type_name, path.stat().st_size, sha256_file(path), report.result, report_name)


def publish(src: str | os.PathLike, target_model_dir: str | os.PathLike, out_dir: str | os.PathLike, *,
            types: str | list[str] | tuple[str, ...] = DEFAULT_TYPES, check: bool = False, upload: str | None = None,
            dry_run: bool = False, force: bool = False, progress: bool = False, drafter_repo: str | None = None,
            target_repo: str | None = None, target_revision: str | None = None, tokenizer_pre: str | None = None,
            device: str = "auto", upload_timeout: float = Timeouts.transfer) -> Release:
    """Convert, quantize, validate (and ``check``) every type into a new release directory, optionally uploaded; none left on failure."""
    token = upload_check(upload) if upload is not None else None  # before anything is read or built
    src_spec, target_spec = src, target_model_dir
    source = resolve_source(src, DRAFTER)
    target = resolve_source(target_model_dir, TARGET_WEIGHTS if check else TARGET)  # check reads the target's head
    src, target_dir = source.path, target.path
    names = parse_types(types)
    out = check_release_dir(out_dir, [src, target_dir], force=force)
    base = base_type(names)
    release = Release(out, names, base_type=base or AUTO, dry_run=dry_run)
    # the conversion every quantized file comes from, read once: its names are the ones convert and
    # quantize give these files (dflash-<Name>-<TYPE>.gguf, dspark- for DSpark; <Name> from the card)
    tokenizers = open_cache(True)  # one cache for the conversions and the target validate reads
    plan = plan_conversion(src_spec, target_spec, outtype=(base or AUTO).lower(), tokenizer_pre=tokenizer_pre,
                           hash_sources=not dry_run, cache=tokenizers)
    release.base_type = plan.type_name
    dspark = member_of({t.gguf_name for t in plan.drafter.tensors}) == DSPARK
    file_names = {t: quantized_file_name(plan.output.name, t, dspark=dspark) for t in names}
    if dry_run:
        release.files = [ReleaseFile(file_names[t], t, 0, "", "", file_names[t] + REPORT_SUFFIX) for t in names]
        return release
    for stale in _stale_staging(out):
        if force:
            shutil.rmtree(stale, ignore_errors=True)
            log.warning("removed %s, left by a publish that did not finish", stale)
        else:
            log.warning("%s was left by a publish that did not finish; remove it, or pass --force to have it removed", stale)
    target_label = target_repo or target.repo_id or resolved_path(target_dir).name
    # the target as the conversion read it, its tokenizer keys derived without --tokenizer-pre: every file is
    # validated against this one reading
    paired = pairing_target(target_dir, plan.drafter.vocab_size, tokenizers, read=plan.target)
    with TemporaryDirectory(out) as staging:
        folder = staging.path
        # the full-precision file first (every quantized file comes from it), the release in the order asked
        order = [base, *(t for t in names if t != base)] if base else names
        if base is None:
            with FileBar(f"scratch {AUTO} conversion", 1, progress) as bar:
                plan.output = folder / f".scratch-{AUTO}.gguf"
                base_path = write_plan(plan, progress=progress)
                bar.step("written (not released)")
        files: dict[str, ReleaseFile] = {}
        for t in order:
            name = file_names[t]
            with FileBar(name, 3 if check else 2, progress) as bar:
                bar.doing("writing")
                if t == base:
                    plan.output = folder / name
                    path = base_path = write_plan(plan, progress=progress)
                elif t in FLOAT_TYPE_NAMES:  # converted from the checkpoint, never through another rounding
                    other = plan_conversion(src_spec, target_spec, outfile=folder / name, outtype=t.lower(),
                                            tokenizer_pre=tokenizer_pre, cache=tokenizers)
                    path = write_plan(other, progress=progress)
                else:
                    path = quantize(base_path, folder / name, t, progress=progress).output
                bar.step("validating")
                files[t] = _validated(path, paired, target_label, t, folder)
                if check:
                    bar.step("checking")
                    files[t].fidelity = _fidelity(path, src_spec, target_spec, device)
                bar.step(f"validate {files[t].validate}" + (f", check {files[t].fidelity['result']}" if check else ""))
        prov = read_provenance(plan.metadata, src, target_dir, drafter_repo=drafter_repo, target_repo=target_repo,
                               target_revision=target_revision)
        if base is None:
            base_path.unlink()  # the scratch conversion is no file of the release
        release.files = [files[t] for t in names]
        d = read_drafter(folder / release.files[0].name)
        kind, spec_type = member(d)
        n_max = max(1, draft_tokens_per_block(kind, block_size(d), d.sample_from_anchor))
        release.card = model_card(release.files, prov, plan.source_card, spec_type=spec_type, n_max=n_max, upload=upload,
                                  checked=check)
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
        release.uploaded = upload_release(out, upload, token, release.names,
                                          timeouts=Timeouts(min(Timeouts.connect, upload_timeout), upload_timeout))
    return release


def summary_rows(release: Release) -> list[str]:
    """The summary table: type, size, sha256 prefix, validate's verdict, fidelity with check."""
    checked = any(f.fidelity is not None for f in release.files)
    width = max(len(f.name) for f in release.files)
    rows = [f"{'file':<{width}}  {'type':<7} {'size':>10}  {'sha256':<12}  validate" + ("  fidelity" if checked else "")]
    for f in release.files:
        rows.append(f"{visible(f.name):<{width}}  {f.type_name:<7} {human_size(f.size):>10}  {f.sha256[:12]:<12}  {f.validate:<8}"
                    + (f"  {fidelity_text(f.fidelity)}" if checked else ""))
    return rows


__all__ = ["DEFAULT_TYPES", "Release", "ReleaseFile", "publish", "summary_rows"]
