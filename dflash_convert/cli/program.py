"""The program: ``main()`` runs one command line under the process guard; the exit-code table.

Exit codes (README.md says them once): 0 success; 1 refused, a check failed, or the machine stopped
the command; 2 an input cannot be read; 64 the command line is wrong (sysexits' EX_USAGE), so a CI
gate tells its own typo from a bad file; 128 + N killed by signal N. The guard: closed standard
streams reopened, SIGINT and SIGTERM unwound, every error one line.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from ..errors import DFlashError, InputFileError, OptionValueError
from ..files import os_reason
from ..terminal import visible
from .command_line import HelpRequested, UsageError, find_command, parse, render_help, render_program_help
from .commands import COMMANDS, PROG, SUMMARY
from .echo import err, error

EXIT_REFUSED = 1  # the request was refused, a check failed, or the machine stopped it (disk full, out of memory)
EXIT_UNREADABLE = 2  # an input cannot be read (missing, corrupt, not what it should be)
EXIT_USAGE = 64  # the command line is wrong (sysexits.h EX_USAGE): not 2, which says an input is bad
EXIT_SIGPIPE = 128 + signal.SIGPIPE  # the reader of stdout went away (| head): the shell's status for it


def main(argv: list[str] | None = None) -> None:
    """The console entry point: one command line, one error line and an exit code whatever happens."""
    guard(lambda: run(sys.argv[1:] if argv is None else argv))


def _internal(e: BaseException) -> str:
    """A bug of ours: still one line, and the way to see more."""
    return (f"internal error: {type(e).__name__}: {' '.join(str(e).split())[:300]} "
            "(DFLASH_CONVERT_TRACEBACK=1 shows where; please report it)")


# what a command raised -> its error line and exit code, first match wins
ERRORS: tuple[tuple[type[BaseException], Callable[[Any], str], int], ...] = (
    (OptionValueError, str, EXIT_USAGE),  # a value the parser could not judge alone (against a file, say)
    (InputFileError, str, EXIT_UNREADABLE),
    (DFlashError, str, EXIT_REFUSED),
    (MemoryError, lambda e: "out of memory; free memory or raise the limit and run again", EXIT_REFUSED),
    (OSError, lambda e: f"{e.filename}: {os_reason(e)}" if e.filename else os_reason(e), EXIT_REFUSED),
    (Exception, _internal, EXIT_REFUSED),
)
_FORESEEN = (DFlashError, MemoryError, OSError)


def exit_code(e: BaseException) -> int:
    """The one exit-code rule of every command (ERRORS)."""
    return next(code for kind, _, code in ERRORS if isinstance(e, kind))


def run(args: list[str]) -> int:
    """Parse and run one command line; usage errors are one line and EXIT_USAGE."""
    if not args:  # a bare program: its help, on stderr, and the usage status
        sys.stderr.write(render_program_help(PROG, SUMMARY, COMMANDS))
        return EXIT_USAGE
    if args[0] in ("-h", "--help"):
        sys.stdout.write(render_program_help(PROG, SUMMARY, COMMANDS))
        return 0
    if args[0] == "--version":
        return find_command(COMMANDS, "version").run() or 0
    try:
        command = find_command(COMMANDS, args[0])
        kwargs = parse(command, args[1:])
    except HelpRequested:
        sys.stdout.write(render_help(PROG, command))
        return 0
    except UsageError as e:
        error(f"{e} (see '{PROG}{'' if e.command is None else ' ' + e.command} -h')")
        return EXIT_USAGE
    _setup_logging()
    return command.run(**kwargs) or 0


class _VisibleFormatter(logging.Formatter):
    """Warnings quote files too (a tensor name, a key): the same escaping as every other line."""

    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record))


def _setup_logging() -> None:
    """Every command's warnings (a fallback type, a temporary file a killed run left) in one form."""
    logging.basicConfig(level=logging.WARNING, format="dflash-convert: warning: %(message)s", force=True)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(_VisibleFormatter("dflash-convert: warning: %(message)s"))


class Interrupted(BaseException):
    """SIGINT or SIGTERM: unwinds like KeyboardInterrupt, so every temporary file is removed on the way out."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


class _CountingNull(io.RawIOBase):
    """Where stdout goes when the command was started with it closed (``>&-``): counts what it discards."""

    def __init__(self) -> None:
        super().__init__()
        self.written = 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[override]
        n = len(memoryview(b))
        self.written += n
        return n


def _open_standard_streams() -> _CountingNull | None:
    """Reopen a closed stdin, stdout or stderr on /dev/null before anything opens a file (else a file would get fd 0-2)."""
    null = None
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        devnull = os.open(os.devnull, os.O_RDWR)
        if devnull != fd:
            os.dup2(devnull, fd)
            os.close(devnull)
        if fd == 1:
            null = _CountingNull()
            sys.stdout = io.TextIOWrapper(io.BufferedWriter(null), encoding="utf-8", errors="backslashreplace",
                                          line_buffering=True)
        elif fd == 2:
            sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                                          line_buffering=True)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    return null


def _exit_broken_pipe() -> None:
    """The reader of stdout went away: nothing more on stdout, no error line, the shell's SIGPIPE status."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(EXIT_SIGPIPE)  # no interpreter shutdown: it would flush stdout again and complain


def guard(command: Callable[[], int]) -> None:
    """Run ``command`` as the process: one error line and an exit code, whatever happens."""
    closed_stdout = _open_standard_streams()
    received: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _raise_interrupted)
    code = 0
    try:
        try:
            code = command()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda signum, frame: received.append(signum))
    except Interrupted as e:
        received.append(e.signum)
    except BrokenPipeError:
        _exit_broken_pipe()
    except KeyboardInterrupt:
        received.append(signal.SIGINT)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Exception as e:
        if os.environ.get("DFLASH_CONVERT_TRACEBACK") and not isinstance(e, _FORESEEN):
            raise
        line, code = next((line_of(e), c) for kind, line_of, c in ERRORS if isinstance(e, kind))
        error(line)
    if received:
        name = signal.Signals(received[0]).name
        err(f"dflash-convert: interrupted by {name}; no partial output was left")
        code = 128 + received[0]
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _exit_broken_pipe()
    except (OSError, ValueError):
        pass
    if closed_stdout is not None and closed_stdout.written:
        err("dflash-convert: warning: standard output is closed; what this command printed there was discarded")
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    if received:
        os._exit(code)  # no interpreter shutdown: nothing left that a late signal could interrupt
    sys.exit(code)
