"""Run the command line as a fresh process, without paying the interpreter's start and numpy's import
each time: a fork server.

One server process per test worker imports numpy and the command layer once (nothing that reads the
environment at import, starts threads, or is heavy: no torch, numba, tokenizers, huggingface_hub),
then forks a child for every command line. The child gets the test's argv, environment and working
directory, /dev/null on stdin and files on stdout and stderr, runs ``dflash_convert.cli.main`` as
``python -m dflash_convert.cli`` would, and exits with its code (or dies by its signal); the result is
a ``subprocess.CompletedProcess`` like ``subprocess.run``'s. Each command line still runs in its own
process, with its own signal handlers, descriptors and exit status: only the start-up is shared.

``DFLASH_CONVERT_TEST_SUBPROCESS=1`` runs every command line with ``subprocess.run`` instead (as the
tests did before); tests about the entry point itself, signals, terminals and closed descriptors
start their own processes either way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

_SERVER = r'''
import io, json, os, signal, sys
proto_in, proto_out = os.fdopen(os.dup(0), "rb", buffering=0), os.dup(1)
null = os.open(os.devnull, os.O_RDWR)
os.dup2(null, 0)
os.dup2(null, 1)
import numpy  # noqa: F401 - the start-up every child shares
import dflash_convert.cli as cli
for line in proto_in:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        try:
            proto_in.close()
            os.close(proto_out)
            out = os.open(req["stdout"], os.O_WRONLY)
            err = os.open(req["stderr"], os.O_WRONLY)
            os.dup2(null, 0)
            os.dup2(out, 1)
            os.dup2(err, 2)
            for fd in (out, err, null):
                os.close(fd)
            os.chdir(req["cwd"])
            os.environ.clear()
            os.environ.update(req["env"])
            sys.argv = [cli.__file__, *req["argv"]]
            sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
            sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
            sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                                          line_buffering=True)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            code = 0
            try:
                cli.main(req["argv"])
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            os._exit(code)
        except BaseException:
            import traceback
            traceback.print_exc()
            os._exit(120)
    os.write(proto_out, (json.dumps({"pid": pid}) + "\n").encode())
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    os.write(proto_out, (json.dumps({"code": code}) + "\n").encode())
'''

_USE_SUBPROCESS = "DFLASH_CONVERT_TEST_SUBPROCESS"


class _Server:
    def __init__(self) -> None:
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1")  # no BLAS threads in the process that forks
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, cwd=Path(__file__).resolve().parent.parent)
        self.lock = threading.Lock()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, argv: list[str], env: dict[str, str], cwd: str, timeout: float | None) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory(prefix="cli-") as d, self.lock:
            out, err = Path(d) / "stdout", Path(d) / "stderr"
            out.touch()
            err.touch()
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write((json.dumps({"argv": argv, "env": env, "cwd": cwd, "stdout": str(out),
                                               "stderr": str(err)}) + "\n").encode())
            self.proc.stdin.flush()
            pid = json.loads(self.proc.stdout.readline())["pid"]
            fired: list[bool] = []
            timer = None
            if timeout is not None:
                timer = threading.Timer(timeout, lambda: fired.append(_kill(pid)))
                timer.start()
            try:
                line = self.proc.stdout.readline()
            finally:
                if timer is not None:
                    timer.cancel()
            if not line:
                raise RuntimeError("the command-line fork server died")
            code = json.loads(line)["code"]
            if fired:
                raise subprocess.TimeoutExpired(["dflash-convert", *argv], timeout)
            return subprocess.CompletedProcess(["dflash-convert", *argv], code, _text(out), _text(err))


def _text(path: Path) -> str:
    """What subprocess.run(text=True) gives: UTF-8 (the locale here), universal newlines."""
    return path.read_bytes().decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")


def _kill(pid: int) -> bool:
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass
    return True


_server: _Server | None = None


def run(*args: object, env: dict[str, str] | None = None, timeout: float | None = None,
        cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """``dflash-convert ARGS`` as ``subprocess.run([python, -m, dflash_convert.cli, ...], capture_output=True,
    text=True)`` would run it: a CompletedProcess with the exit code and the text of stdout and stderr."""
    global _server
    argv = [str(a) for a in args]
    full_env = dict(os.environ if env is None else env)
    where = os.fspath(cwd) if cwd is not None else os.getcwd()
    if full_env.get(_USE_SUBPROCESS, "") not in ("", "0") or os.environ.get(_USE_SUBPROCESS, "") not in ("", "0"):
        return subprocess.run([sys.executable, "-m", "dflash_convert.cli", *argv], capture_output=True, text=True,
                              timeout=timeout, env=full_env, cwd=where)
    if _server is None or not _server.alive():
        _server = _Server()
    return _server.run(argv, full_env, where, timeout)
