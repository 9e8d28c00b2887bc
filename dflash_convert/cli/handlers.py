"""One handler per command: call the API, print what its result renders, return the exit code.

A handler's parameters are its command's (cli/commands.py); errors are raised, and the process guard
(cli/program.py) prints their one line with the table's exit code. Each handler imports the API it
calls when it runs: parsing, -h and a usage error import nothing a command runs.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .._version import __version__
from ..errors import DFlashError
from ..files import os_reason
from ..outputs import check_output_path
from .echo import echo, err, error, say


def quiet_logs(quiet: bool) -> None:
    """-q: no warnings (errors still print)."""
    if quiet:
        logging.getLogger().setLevel(logging.ERROR)


@contextmanager
def command_errors(output: str | os.PathLike | None) -> Iterator[None]:
    """Name an unnamed OSError by its file, else by the output (a closed stdout is the guard's to end quietly)."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as e:
        if e.filename is not None:
            raise DFlashError(os_reason(e), e.filename) from None
        raise DFlashError(f"cannot write the output: {os_reason(e)}" if output is not None else os_reason(e), output) from None


def convert(src_dir: Path, outfile: str | None, force: bool, dry_run: bool, no_cache: bool, quiet: bool, **options: Any) -> int:
    """convert: plan the file (printed with --dry-run), write it."""
    from ..conversion import plan_conversion, write_plan  # tokenizers, gguf-py: only the commands that convert pay for them

    quiet_logs(quiet)
    with command_errors(outfile):
        plan = plan_conversion(src_dir, outfile=outfile, hash_sources=not dry_run, cache=not no_cache, **options)
        if dry_run:
            say(plan.dry_run_lines())
            return 0
        write_plan(plan, force=force, progress=not quiet)
    if not quiet:
        say(plan.written())
    return 0


def inspect(path: Path, drafter: bool) -> int:
    """inspect: the keys and tensors as stored and how to pair the drafter, or (--drafter) its Drafter as JSON."""
    if drafter:
        from ..sources.gguf_drafter import describe, read_drafter  # start-up: parsing and -h import none of this

        echo(json.dumps(describe(read_drafter(path)), indent=1))
        return 0
    from ..inspect_gguf import read_summary  # start-up: as above

    say(read_summary(path).lines())
    return 0


def validate(path: Path, target: Path | None, json_out: bool, deep: bool) -> int:
    """validate: the report (text or JSON); an unreadable input is its one error line."""
    from ..validate import validate as run_validate  # gguf-py and the target readers: only when validating
    from ..validate.report import render_json, render_text

    report = run_validate(path, target, deep=deep)
    if json_out:
        echo(render_json(report))
    elif report.exit_code != 2:
        echo(render_text(report))
    if report.exit_code == 2:
        error(report.error_line())
    return report.exit_code


def migrate(src: Path, out: str, force: bool, **options: Any) -> int:
    """migrate: rewrite, validate once, print the file and validate's verdict."""
    from ..migrate import migrate as run_migrate  # the writers and gguf-py: only when migrating

    with command_errors(out):
        result = run_migrate(src, out, force=force, **options)
    say(result.lines())
    if result.report.exit_code:
        error("the written file does not pass validate; see the failures above")
    return result.report.exit_code


def quantize(src: Path, out: str, qtype: str, threads: int | None, dry_run: bool, skip_validation: bool, force: bool,
             quiet: bool, tensor_type_order: list[tuple[str, Any]], features: Path | None, min_acceptance: float | None,
             search: dict[str, Any], **per_tensor: Any) -> int:
    """quantize: plan the mix (printed with --dry-run), write it; with --min-acceptance, choose it by acceptance."""
    quiet_logs(quiet)
    if min_acceptance is not None:
        weights = {k: per_tensor.get(k) for k in ("imatrix", "include_weights", "exclude_weights")}
        return quantize_for_acceptance(src, out, qtype, features, min_acceptance, threads, dry_run, force, quiet,
                                       search | weights)
    from ..quantize import plan_quantize, quantize_options, write_quantize  # the encoders, gguf-py: only when quantizing

    with command_errors(out):
        # llama-quantize applies --tensor-type items and the file's in command-line order
        at = next((i for i, (dest, _) in enumerate(tensor_type_order) if dest == "tensor_type_file"), None)
        plan = plan_quantize(src, out, qtype, options=quantize_options(**per_tensor, file_position=at),
                             validate=not skip_validation)
        if dry_run:
            say(plan.dry_run_lines())
            return 0
        write_quantize(plan, force=force, progress=not quiet, threads=threads)
    if not quiet:
        say(plan.written_lines())
    return 0


def quantize_for_acceptance(src: Path, out: str, qtype: str, features: Path, min_acceptance: float, threads: int | None,
                            dry_run: bool, force: bool, quiet: bool, search: dict[str, Any]) -> int:
    """quantize --min-acceptance: the smallest mix that keeps that share of the input's acceptance, and its recipe."""
    from ..quantize import quantize_for_acceptance as choose  # torch and the encoders: only this command pays for them

    chosen = choose(src, out, qtype, features, min_acceptance, force=force, dry_run=dry_run, progress=not quiet,
                    threads=threads, log=None if quiet else say, **search)
    say(chosen.lines())
    if not dry_run and not quiet:
        say(chosen.written())
    return 0


def sweep(src: Path, features: Path, types: str, json_out: bool, plot: Path | None, force: bool, **options: Any) -> int:
    """sweep: every type's size against its acceptance (a table, JSON, or a plot)."""
    # torch and the encoders: only this command pays for them
    from ..quantize import plot_sweep, plot_sweep_ready
    from ..quantize import sweep as run_sweep

    if plot is not None:
        check_output_path(plot, [src, features], force=force)  # before minutes of measuring
        plot_sweep_ready()
    report = run_sweep(src, features, [t for t in types.split(",") if t.strip()], **options)
    if plot is not None:
        plot_sweep(report, plot, force=force)
    if json_out:
        echo(report.to_json())  # JSON escapes what it quotes
        return 0
    say(report.render_text().splitlines(), [f"wrote {plot}"] if plot is not None else [])
    return 0


def check(draft: Path, checkpoint: Path, json_out: bool, **options: Any) -> int:
    """check: run the GGUF and the checkpoint on the same inputs, print the verdict."""
    from ..check import check as run_check  # imports torch: only this command pays for it

    report = run_check(draft, checkpoint, **options)
    echo(report.to_json() if json_out else report.render_text())
    return report.exit_code


def capture(out: str, quiet: bool, **options: Any) -> int:
    """capture: run the target over the prompts, write the features file."""
    from ..capture import capture as run_capture  # imports torch and transformers: only this command pays for them

    quiet_logs(quiet)
    with command_errors(out):
        res = run_capture(out=out, progress=not quiet, **options)
    for note in res.notes:
        err(f"note: {note}")
    if not quiet:
        say(f"wrote {res.output}: {res.sequences} sequences, {res.tokens} tokens, layer inputs {res.layers}")
    return 0


def accept(drafts: list[Path], features: Path, json_out: bool, **options: Any) -> int:
    """accept: each file's accepted tokens on the captured sequences."""
    from ..accept import accept as run_accept  # imports torch: only this command pays for it

    report = run_accept(drafts, features, **options)
    echo(report.to_json() if json_out else report.render_text())
    return 0


def imatrix(draft: Path, features: Path, out: str, quiet: bool, **options: Any) -> int:
    """imatrix: run the drafter over the captured sequences, write its importance matrix."""
    from ..imatrix import imatrix as run_imatrix  # imports torch: only this command pays for it

    with command_errors(out):
        res = run_imatrix(draft, features, out, progress=not quiet, **options)
    say(res.lines())
    return 0


def publish(src_dir: Path, target_model_dir: Path, out_dir: str, upload: str | None, dry_run: bool, quiet: bool,
            **options: Any) -> int:
    """publish: convert, quantize and validate every type into a release directory (and upload it)."""
    from ..publish import publish as run_publish  # every command's dependencies: only a release pays for them

    quiet_logs(quiet)
    with command_errors(out_dir):
        release = run_publish(src_dir, target_model_dir, out_dir, upload=upload, dry_run=dry_run, progress=not quiet,
                              **options)
    say(release.dry_run_lines(upload) if dry_run else release.lines(upload))
    return 0


def version() -> int:
    """version: the package's version."""
    echo(f"dflash-convert {__version__}")
    return 0
