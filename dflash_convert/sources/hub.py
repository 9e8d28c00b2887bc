"""Hugging Face repo ids as inputs: ``org/name[@revision]`` -> a snapshot directory in the shared cache.

A path that exists is always a path; a repo id is looked up offline first, and only its role's files
are downloaded, when allowed. The cache is untrusted: a bad revision or ref and a snapshot entry
resolving outside the repo's folder are refused (one line, exit 2). The HF_* variables are read on
every call. Specification: docs/conversion.md, "Inputs from the Hugging Face cache".
"""

from __future__ import annotations

import os
import re
import reprlib
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputFileError, RepoError
from ..files import hub_cache_dir, read_regular_bytes
from .checkpoint import INDEX_NAME, read_json

DRAFTER, TARGET, TARGET_WEIGHTS = "drafter", "target", "target_weights"

# the files each role reads (huggingface_hub allow_patterns); a target's weights only for the
# commands that read its embedding and head or run it (check, quantize's acceptance)
_TARGET_FILES: tuple[str, ...] = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
    "special_tokens_map.json", "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt", "chat_template*",
)
_WEIGHT_FILES: tuple[str, ...] = ("*.safetensors", INDEX_NAME)
ALLOW_PATTERNS: dict[str, tuple[str, ...]] = {
    DRAFTER: ("config.json", *_WEIGHT_FILES, "README.md", "generation_config.json"),
    TARGET: _TARGET_FILES,
    TARGET_WEIGHTS: (*_TARGET_FILES, *_WEIGHT_FILES),
}
# what each role cannot do without (besides config.json): one of these names must be in the snapshot
TOKENIZER_FILES: tuple[str, ...] = ("tokenizer.json", "tokenizer.model")
NEEDS_TOKENIZER = (TARGET, TARGET_WEIGHTS)
NEEDS_WEIGHTS = (DRAFTER, TARGET_WEIGHTS)

DEFAULT_REVISION = "main"
COMMIT_SHA = re.compile(r"[0-9a-f]{40}")
# one part of a ref name (git check-ref-format; the Hub's own refs/pr/1 pass): no control character,
# space or any of ~^:?*[\ ; parts led by a dot ('..' included) and '.lock' parts are refused below
_REF_PART = re.compile(r"[^\x00-\x20\x7f~^:?*\[\\]{1,255}")
MAX_REVISION_CHARS = 255
MAX_REF_BYTES = 1024  # a ref holds 40 hex digits
MAX_SNAPSHOT_ENTRIES = 100_000  # a snapshot's files, walked to check where each link leads
_TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's spelling of a true environment flag


@dataclass(frozen=True)
class ResolvedRepo:
    """Where an input lives: a local directory (repo_id and commit None) or a cache snapshot."""

    path: Path
    repo_id: str | None
    commit: str | None

    @property
    def name(self) -> str:
        """The model's name: the repo's own (``org/name`` -> ``name``), or the directory's."""
        if self.repo_id is not None:
            return self.repo_id.rsplit("/", 1)[-1]
        return Path(os.path.realpath(self.path)).name


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) as set now."""
    flag = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return flag.upper() in _TRUE


def parse_repo_spec(spec: str) -> tuple[str, str] | None:
    """``org/name[@revision]`` -> (repo id, revision), or None when ``spec`` is not shaped like one."""
    repo_id, at, revision = spec.partition("@")
    if repo_id.count("/") != 1 or (at and not revision.strip()):
        return None
    # huggingface_hub is a heavy import: only a spec that may be a repo id pays for it
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        return None
    return repo_id, revision or DEFAULT_REVISION


def resolve_source(spec: str | os.PathLike, role: str) -> ResolvedRepo:
    """A local directory as it is, or a repo id resolved to a complete cache snapshot (downloaded if allowed)."""
    if role not in ALLOW_PATTERNS:
        raise ValueError(f"unknown role {role!r}; expected one of {sorted(ALLOW_PATTERNS)}")
    text = os.fspath(spec)
    if isinstance(text, bytes) or os.path.lexists(text):
        return ResolvedRepo(Path(os.fsdecode(text)), None, None)
    parsed = parse_repo_spec(text)
    if parsed is None:
        return ResolvedRepo(Path(text), None, None)
    repo_id, revision = parsed
    label = f"{repo_id}@{revision}"
    check_revision(revision, label)
    cache = hub_cache_dir()
    repo_dir = _repo_dir(cache, repo_id)
    commit = _commit_of(repo_dir, revision, label)
    snapshot, listed_complete = _cached_snapshot(repo_id, commit, role, cache, label) if commit else (None, False)
    if snapshot is not None:
        _confine(snapshot, repo_dir, cache, label)
    missing = _missing(snapshot, role) if snapshot is not None else "not in the cache"
    # a snapshot the cached listing calls incomplete is completed when the hub may be asked; offline,
    # what this command reads is enough (a README missing does not stop a conversion)
    if missing is not None or (not listed_complete and not hub_offline()):
        if hub_offline():
            if snapshot is None:
                raise RepoError(_not_cached(repo_dir, revision, commit, cache, label))
            raise RepoError(f"{label}: the cached snapshot {snapshot.name} is incomplete: {missing} "
                            "(HF_HUB_OFFLINE=1: unset it to download the rest)")
        snapshot = _download(repo_id, revision, role, cache, label, repo_dir, commit)
        _confine(snapshot, repo_dir, cache, label)
        missing = _missing(snapshot, role)
        if missing is not None:
            raise RepoError(f"{label}: the snapshot {snapshot.name} is incomplete: {missing}")
    return ResolvedRepo(snapshot, repo_id, snapshot.name)


def check_revision(revision: str, label: str) -> None:
    """Refuse a revision that is neither a commit nor a ref name git accepts (it would name a path outside refs/)."""
    if COMMIT_SHA.fullmatch(revision):
        return
    parts = revision.split("/")
    if (len(revision) > MAX_REVISION_CHARS or "@{" in revision or revision == "@" or revision.endswith(".")
            or any(not _REF_PART.fullmatch(p) or p.startswith(".") or p.endswith(".lock") for p in parts)):
        raise RepoError(f"{label}: the revision is not a branch, tag or commit name (a name like main, v1.0 or "
                        "refs/pr/1, or 40 hex digits)")


def _repo_dir(cache: Path, repo_id: str) -> Path:
    """The repo's folder in the cache (``models--org--name``), as huggingface_hub names it."""
    # huggingface_hub is a heavy import: only a repo id pays for it
    from huggingface_hub.file_download import repo_folder_name

    return cache / repo_folder_name(repo_id=repo_id, repo_type="model")


def _inside(path: str | os.PathLike, root: str | os.PathLike) -> bool:
    """Does ``path``, symbolic links resolved, lie in ``root`` (resolved too)?"""
    where, top = os.path.realpath(path), os.path.realpath(root)
    return where == top or where.startswith(top.rstrip(os.sep) + os.sep)


def _commit_of(repo_dir: Path, revision: str, label: str) -> str | None:
    """The commit a revision names: itself, else the 40 hex digits of its ref under refs/ (None without such a ref)."""
    if COMMIT_SHA.fullmatch(revision):
        return revision
    refs = repo_dir / "refs"
    ref = refs / revision
    if not os.path.lexists(ref):
        return None
    if not (_inside(refs, repo_dir) and _inside(ref, refs)):
        raise RepoError(f"{label}: the cache's ref {ref} leads outside {refs}")
    if os.path.isdir(ref):  # refs/pr with refs/pr/1 in it: a folder of refs, not this one
        return None
    try:
        raw = read_regular_bytes(ref, "Hugging Face cache ref", MAX_REF_BYTES)
    except InputFileError as e:
        raise RepoError(f"{label}: {e}") from None
    text = raw.decode("ascii", "replace")
    commit = text[:-1] if text.endswith("\n") else text
    if not COMMIT_SHA.fullmatch(commit):
        raise RepoError(f"{label}: the cache's ref {ref} does not hold a commit (40 hex digits): {reprlib.repr(text)}")
    return commit


def _confine(snapshot: Path, repo_dir: Path, cache: Path, label: str) -> None:
    """Refuse a snapshot folder, or any entry in it, that resolves outside the repo's cache folder."""
    if not _inside(repo_dir, cache):
        raise RepoError(f"{label}: the cache's folder {repo_dir} leads outside the cache {cache}")
    snapshots = repo_dir / "snapshots"
    if not (_inside(snapshots, repo_dir) and os.path.realpath(snapshot) == os.path.join(os.path.realpath(snapshots),
                                                                                          snapshot.name)):
        raise RepoError(f"{label}: the cache's snapshot {snapshot} leads outside {snapshots}")
    seen = 0
    for top, dirs, files in os.walk(snapshot):  # links to folders are entries here, never walked into
        for name in (*dirs, *files):
            seen += 1
            entry = os.path.join(top, name)
            if seen > MAX_SNAPSHOT_ENTRIES:
                raise RepoError(f"{label}: the cache's snapshot {snapshot} holds more than {MAX_SNAPSHOT_ENTRIES} entries")
            if not _inside(entry, repo_dir):
                raise RepoError(f"{label}: {entry} in the cache's snapshot leads outside {repo_dir} "
                                f"(to {os.path.realpath(entry)})")


def _cached_snapshot(repo_id: str, commit: str, role: str, cache: Path, label: str) -> tuple[Path | None, bool]:
    """(snapshot folder of this commit or None, whether the cache's listing finds every file of the role), offline; given a commit, never a ref."""
    # huggingface_hub is a heavy import: only a repo id pays for it
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import IncompleteSnapshotError, LocalEntryNotFoundError

    try:
        folder = snapshot_download(repo_id, revision=commit, cache_dir=cache, local_files_only=True,
                                   allow_patterns=list(ALLOW_PATTERNS[role]))
    except IncompleteSnapshotError as e:  # the folder is there; whether it will do, the caller decides
        return _snapshot_path(Path(e.snapshot_path), label), False
    except LocalEntryNotFoundError:
        return None, False
    except (OSError, ValueError) as e:
        raise RepoError(f"{label}: cannot read the Hugging Face cache at {cache}: {_first_line(e)}") from None
    return _snapshot_path(Path(folder), label), True


def _download(repo_id: str, revision: str, role: str, cache: Path, label: str, repo_dir: Path, commit: str | None) -> Path:
    """Fetch the files ``role`` reads into the cache; every failure the Hub can answer is one line."""
    # huggingface_hub is a heavy import: only a repo id pays for it
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        folder = snapshot_download(repo_id, revision=revision, cache_dir=cache, allow_patterns=list(ALLOW_PATTERNS[role]))
    except GatedRepoError:
        raise RepoError(f"{label}: the repository is gated: accept its terms on the Hub and log in (hf auth login)") from None
    except RepositoryNotFoundError:
        raise RepoError(f"{label}: no such repository on the Hugging Face Hub (or it is private: log in with "
                        "hf auth login)") from None
    except RevisionNotFoundError:
        raise RepoError(f"{label}: the repository has no revision {revision!r} (a branch, tag or commit)") from None
    except (LocalEntryNotFoundError, OfflineModeIsEnabled):
        raise RepoError(f"{_not_cached(repo_dir, revision, commit, cache, label)}, and the Hub cannot be reached") from None
    except HfHubHTTPError as e:
        raise RepoError(f"{label}: the Hub refused the download: {_first_line(e)}") from None
    except (OSError, ValueError) as e:  # a full disk, a cache folder we may not write, a connection reset
        raise RepoError(f"{label}: the download failed: {_first_line(e)}") from None
    except Exception as e:
        if type(e).__module__.split(".")[0] not in ("huggingface_hub", "httpx", "httpx2", "httpcore"):
            raise
        raise RepoError(f"{label}: the download failed: {type(e).__name__}: {_first_line(e)}") from None
    return _snapshot_path(Path(folder), label)


def _snapshot_path(folder: Path, label: str) -> Path:
    if not COMMIT_SHA.fullmatch(folder.name):
        raise RepoError(f"{label}: the cache's snapshot folder {folder} is not named by a commit")
    return folder


def _not_cached(repo_dir: Path, revision: str, commit: str | None, cache: Path, label: str) -> str:
    """Why the cache has no snapshot of this revision (no repo, a commit without snapshot, or the refs it has)."""
    offline = " (HF_HUB_OFFLINE=1)" if hub_offline() else ""
    if not repo_dir.is_dir():
        return f"{label}: no such directory, and not in the Hugging Face cache at {cache}{offline}"
    if commit is not None and commit != revision:
        return f"{label}: the cache's ref {revision!r} names commit {commit}, whose snapshot is not in the cache{offline}"
    held = ", ".join(_held_refs(repo_dir / "refs")) or "no branch or tag"
    return f"{label}: revision {revision!r} is not in the Hugging Face cache (it holds {held}){offline}"


def _held_refs(refs: Path, most: int = 20) -> list[str]:
    """The ref names under ``refs`` (links to folders not followed), the first ``most`` of them, sorted."""
    names: list[str] = []
    for top, _dirs, files in os.walk(refs):
        names += (Path(top, f).relative_to(refs).as_posix() for f in files)
        if len(names) > most:
            return [*sorted(names)[:most], "..."]
    return sorted(names)


def _missing(snapshot: Path, role: str) -> str | None:
    """What a snapshot lacks for ``role`` (one phrase), or None when it is complete."""
    if not (snapshot / "config.json").is_file():  # a link into blobs whose blob is gone is missing too
        return "no config.json"
    if role in NEEDS_TOKENIZER and not any((snapshot / n).is_file() for n in TOKENIZER_FILES):
        return f"no tokenizer ({' or '.join(TOKENIZER_FILES)})"
    if role in NEEDS_WEIGHTS:
        index = snapshot / INDEX_NAME
        if index.exists():
            data = read_json(index, INDEX_NAME)
            weight_map = data.get("weight_map") if isinstance(data, dict) else None
            shards = sorted({v for v in weight_map.values() if isinstance(v, str)}) if isinstance(weight_map, dict) else []
            absent = [s for s in shards if "/" not in s and not (snapshot / s).is_file()]
            if absent:
                return f"{INDEX_NAME} names shard {absent[0]!r}, which is not there"
        elif not any(p.name.endswith(".safetensors") and p.is_file() for p in snapshot.iterdir()):
            return "no .safetensors weights"
    return None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


__all__ = ["ALLOW_PATTERNS", "DRAFTER", "TARGET", "TARGET_WEIGHTS", "ResolvedRepo", "check_revision", "hub_offline",
           "parse_repo_spec", "resolve_source"]
