"""publish --upload: whether this run can upload (asked before anything is built), and the upload.

``upload_check`` refuses, in one line, a run that could build a release and then not send it (no
huggingface_hub >= 1.0, a bad repo id, ``HF_HUB_OFFLINE``, no token). ``upload_release`` pushes a
finished release in one commit, with connect and read timeouts (the client's default waits forever
on a silent endpoint); the release stays on disk either way. Specification: docs/publish.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .errors import DFlashError

TOKEN_HELP = "set HF_TOKEN or log in with `hf auth login`"
INSTALL_HELP = "pip install 'dflash-convert[publish]'"


@dataclass(frozen=True)
class Timeouts:
    """Seconds one request may wait: to connect, and for each read or write once connected."""

    connect: float = 30.0
    transfer: float = 120.0  # the hub answers a commit of large files only once it has stored them


def upload_check(repo_id: str) -> str:
    """The hub token for uploading to ``repo_id``, or one error line saying why no upload could be made."""
    try:
        # optional (the [publish] extra), and slow to import
        from huggingface_hub import constants, get_token
        from huggingface_hub.utils import HFValidationError, validate_repo_id
    except ImportError:
        raise DFlashError(f"--upload needs huggingface_hub: {INSTALL_HELP}") from None
    if not _has_client_factory():
        raise DFlashError(f"--upload needs huggingface_hub 1.0 or later (its HTTP client takes timeouts): {INSTALL_HELP}")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise DFlashError(f"--upload {repo_id!r} is not a repo id (org/name): {e}") from None
    if repo_id.count("/") != 1:
        raise DFlashError(f"--upload {repo_id!r} is not a repo id of the form org/name")
    if constants.is_offline_mode():
        raise DFlashError("--upload cannot upload with HF_HUB_OFFLINE set; unset it, or publish without --upload")
    token = get_token()
    if not token:
        raise DFlashError(f"--upload needs a Hugging Face token: {TOKEN_HELP}")
    return token


def _has_client_factory() -> bool:
    import huggingface_hub  # optional (the [publish] extra), and slow to import

    return hasattr(huggingface_hub, "set_client_factory")


def _use_timeouts(timeouts: Timeouts) -> None:
    """Make every request huggingface_hub sends from now on time out (its client's default is no timeout)."""
    from huggingface_hub import get_session  # optional (the [publish] extra), and slow to import

    # the shared client every hub call uses; (connect, read, write, pool), as its Timeout reads a tuple
    get_session().timeout = (timeouts.connect, timeouts.transfer, timeouts.transfer, timeouts.connect)


def upload_release(folder: Path, repo_id: str, token: str, names: list[str], *,
                   timeouts: Timeouts = Timeouts()) -> str:
    """Push the release directory in one commit (HF_ENDPOINT honoured); returns the commit's url."""
    from huggingface_hub import HfApi  # optional (the [publish] extra), and slow to import

    _use_timeouts(timeouts)
    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None, token=token)
    try:
        api.create_repo(repo_id, repo_type="model", exist_ok=True)
        info = api.upload_folder(repo_id=repo_id, repo_type="model", folder_path=folder, allow_patterns=names,
                                 commit_message=f"dflash-convert publish: {len(names)} files")
    except Exception as e:  # the hub client raises HTTP, network, timeout and validation errors of many kinds
        first = " ".join(str(e).split())[:300] or "no answer"
        raise DFlashError(f"the upload to {repo_id} failed ({type(e).__name__}: {first}); the release is complete: "
                          "run publish again with --force --upload to push it", folder) from None
    return str(getattr(info, "commit_url", info))
