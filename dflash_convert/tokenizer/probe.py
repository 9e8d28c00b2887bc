"""Ask the `tokenizers` library two questions about a tokenizer.json, in a child process.

1. The pre-tokenizer fingerprint: sha256 of str(token ids of the probe text), as llama.cpp hashes.
2. For added tokens that are not normalized: their encode/decode round trip (llama.cpp stores
   them pre-normalized).

Loading a 250k-token BPE takes ~200 MB; doing it in a short-lived child keeps the converter's
own memory flat while it streams gigabytes, and lets the parent parse tokenizer.json at the
same time on the other core. The child only reads the file; it runs no code from it.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputFileError
from .pre_hashes import PROBE_TEXT


@dataclass
class ProbeResult:
    probe_hash: str
    roundtrip: dict[str, str]


def probe_in_process(tokenizer_json: Path, texts: list[str]) -> ProbeResult:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    ids = tok.encode(PROBE_TEXT).ids
    h = hashlib.sha256(str(ids).encode()).hexdigest()
    rt = {t: tok.decode(tok.encode(t, add_special_tokens=False).ids, skip_special_tokens=False) for t in texts}
    return ProbeResult(h, rt)


class Probe:
    """A running probe; call result() to collect it."""

    def __init__(self, tokenizer_json: Path, texts: list[str]) -> None:
        self.path = tokenizer_json
        self.proc = subprocess.Popen([sys.executable, "-m", "dflash_convert.tokenizer.probe", str(tokenizer_json)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.texts = texts

    def kill(self) -> None:
        self.proc.kill()
        self.proc.communicate()

    def result(self) -> ProbeResult:
        out, err = self.proc.communicate(json.dumps(self.texts).encode())
        if self.proc.returncode != 0:
            lines = [ln for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
            raise InputFileError(f"cannot load tokenizer.json: {lines[-1] if lines else 'tokenizer process failed'}", self.path)
        data = json.loads(out)
        return ProbeResult(data["hash"], data["roundtrip"])


def main() -> int:
    texts = json.loads(sys.stdin.buffer.read() or b"[]")
    r = probe_in_process(Path(sys.argv[1]), texts)
    sys.stdout.write(json.dumps({"hash": r.probe_hash, "roundtrip": r.roundtrip}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
