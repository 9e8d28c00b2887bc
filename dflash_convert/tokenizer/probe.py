"""Ask the `tokenizers` library two questions about a tokenizer.json, in a child process.

The pre-tokenizer fingerprint (sha256 of str(token ids of the probe text), as llama.cpp hashes), and
the encode/decode round trip of added tokens that are not normalized. The child (``python -I``, in
``/``, this package by its installed location) runs no code a user controls and keeps a large BPE's
memory out of the parent. Out of memory: exit 1; a file the child refuses: exit 2.
Specification: docs/conversion.md, "How every output is written" (the isolated child).
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import FAULT_ENV, InputFileError, ResourceError
from ..files import MAX_JSON_DEPTH, check_regular_file, json_depth, read_regular_bytes
from .pre_hashes import PROBE_TEXT

REFUSED = 3  # the child's exit status when it refuses the file itself; its last stderr line says why
OUT_OF_MEMORY = 4  # the child's exit status after a MemoryError
# what a child short of memory prints: the tokenizers library (Rust) before it aborts on a failed
# allocation, Python's MemoryError, the loader unable to map the library, a failed mmap or malloc
_OUT_OF_MEMORY_SIGNS = ("memory allocation of", "MemoryError", "failed to map segment", "Cannot allocate memory")


@dataclass
class ProbeResult:
    """The probe's answers: the pre-tokenizer hash and the added tokens' round trips."""
    probe_hash: str
    roundtrip: dict[str, str]


def probe_in_process(tokenizer_json: Path) -> ProbeResult:
    """The probe's answers computed in this process (the child runs this)."""
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
    """The isolated ``python -I`` command line of the probe child."""
    return [sys.executable, "-I", "-c", CHILD, str(PACKAGE_PARENT), str(Path(tokenizer_json).resolve())]


class Probe:
    """A running probe; call result() to collect it."""

    def __init__(self, tokenizer_json: Path) -> None:
        check_regular_file(tokenizer_json, "tokenizer.json")
        self.path = tokenizer_json
        self.proc = subprocess.Popen(child_command(tokenizer_json), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, cwd=os.sep)

    def kill(self) -> None:
        """Kill the probe child and reap it."""
        self.proc.kill()
        self.proc.communicate()

    def result(self) -> ProbeResult:
        """Wait for the probe child and return its answers; its failures become one error naming the file and the cause."""
        out, err = self.proc.communicate()
        rc = self.proc.returncode
        if rc != 0:
            text = err.decode("utf-8", "replace")
            lines = [ln for ln in text.splitlines() if ln.strip()]
            last = lines[-1] if lines else "the tokenizer process failed"
            if rc == REFUSED:
                raise InputFileError(last, self.path)
            not_judged = "tokenizer.json was not judged; free memory or raise the limit and run again"
            if rc == OUT_OF_MEMORY or any(sign in text for sign in _OUT_OF_MEMORY_SIGNS):
                raise ResourceError(f"the tokenizer process ran out of memory loading this file; {not_judged}", self.path)
            if rc < 0:
                name = signal.Signals(-rc).name if -rc in signal.valid_signals() else f"signal {-rc}"
                why = " (the kernel's out-of-memory killer, most likely)" if -rc == signal.SIGKILL else ""
                raise ResourceError(f"the tokenizer process was killed by {name}{why} loading this file; {not_judged}",
                                    self.path)
            raise InputFileError(f"cannot load tokenizer.json: {last}", self.path)
        data = json.loads(out)
        return ProbeResult(data["hash"], data["roundtrip"])


def _injected_memory_limit() -> None:
    """The tests' way to run this child short of memory: DFLASH_CONVERT_FAULT="probe:AS=<bytes>"."""
    phase, _, what = os.environ.get(FAULT_ENV, "").partition(":")
    if phase == "probe" and what.startswith("AS="):
        limit = int(what[3:])
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main(argv: list[str] | None = None) -> int:
    """The probe child's entry point: check the JSON depth, load the tokenizer, print the answers as JSON."""
    path = Path((sys.argv[1:] if argv is None else argv)[0])
    try:
        depth = json_depth(read_regular_bytes(path, "tokenizer.json"))
    except InputFileError as e:
        sys.stderr.write(f"{e.message}\n")
        return REFUSED
    if depth > MAX_JSON_DEPTH:  # the library's parser would recurse into it
        sys.stderr.write(f"tokenizer.json nests JSON {depth} levels deep, deeper than the {MAX_JSON_DEPTH} levels accepted\n")
        return REFUSED
    _injected_memory_limit()
    try:
        r = probe_in_process(path)
    except MemoryError:
        sys.stderr.write("MemoryError\n")
        return OUT_OF_MEMORY
    sys.stdout.write(json.dumps({"hash": r.probe_hash, "roundtrip": r.roundtrip}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
