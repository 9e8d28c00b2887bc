"""Ask the `tokenizers` library two questions about a tokenizer.json, in a child process.

1. The pre-tokenizer fingerprint: sha256 of str(token ids of the probe text), as llama.cpp hashes.
2. For added tokens that are not normalized: their encode/decode round trip (llama.cpp stores
   them pre-normalized).

Loading a 250k-token BPE takes ~200 MB; doing it in a short-lived child, finished before the
parent parses tokenizer.json itself, keeps the peak memory of the whole process tree low (the
source files are hashed on the other core meanwhile). The child only reads the file; it runs no
code from it, nor from anywhere else a user controls: it starts isolated (``python -I``: no
current directory or script directory on its path, no PYTHON* variables, no user site), in the
root directory, and finds this package by its installed location only.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputFileError
from ..files import check_regular_file
from .pre_hashes import PROBE_TEXT


@dataclass
class ProbeResult:
    probe_hash: str
    roundtrip: dict[str, str]


def probe_in_process(tokenizer_json: Path) -> ProbeResult:
    from tokenizers import Tokenizer  # heavy (~200 MB for a large BPE): loaded only in the probe's own process

    tok = Tokenizer.from_file(str(tokenizer_json))
    texts = [a.content for a in tok.get_added_tokens_decoder().values() if not a.normalized]
    ids = tok.encode(PROBE_TEXT).ids
    h = hashlib.sha256(str(ids).encode()).hexdigest()
    rt = {t: tok.decode(tok.encode(t, add_special_tokens=False).ids, skip_special_tokens=False) for t in texts}
    return ProbeResult(h, rt)


# where this package is installed (or checked out): the one directory the isolated child adds to its path
PACKAGE_PARENT = Path(__file__).resolve().parents[2]
# the child's program: isolated, it imports this package from PACKAGE_PARENT and probes one file
CHILD = ("import sys; sys.path.insert(0, sys.argv[1]); "
         "from dflash_convert.tokenizer.probe import main; sys.exit(main(sys.argv[2:]))")


def child_command(tokenizer_json: Path) -> list[str]:
    return [sys.executable, "-I", "-c", CHILD, str(PACKAGE_PARENT), str(Path(tokenizer_json).resolve())]


class Probe:
    """A running probe; call result() to collect it."""

    def __init__(self, tokenizer_json: Path) -> None:
        check_regular_file(tokenizer_json, "tokenizer.json")
        self.path = tokenizer_json
        self.proc = subprocess.Popen(child_command(tokenizer_json), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, cwd=os.sep)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.communicate()

    def result(self) -> ProbeResult:
        out, err = self.proc.communicate()
        if self.proc.returncode != 0:
            lines = [ln for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
            raise InputFileError(f"cannot load tokenizer.json: {lines[-1] if lines else 'tokenizer process failed'}", self.path)
        data = json.loads(out)
        return ProbeResult(data["hash"], data["roundtrip"])


def main(argv: list[str] | None = None) -> int:
    r = probe_in_process(Path((sys.argv[1:] if argv is None else argv)[0]))
    sys.stdout.write(json.dumps({"hash": r.probe_hash, "roundtrip": r.roundtrip}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
