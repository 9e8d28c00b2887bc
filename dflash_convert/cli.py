"""The command layer: parse flags, call the API, print. Errors become one line and an exit code.

Exit codes, every command (README.md says it once): 0 success or every check passed; 1 refused, a
check failed, or the machine stopped the command (a full disk, out of memory); 2 an input cannot be
read; 64 the command line itself is wrong (EX_USAGE of sysexits.h: an unknown option, a missing
argument), so a CI gate tells its own typo from a bad file; 128 + N killed by signal N (130 SIGINT,
141 SIGPIPE: the reader of stdout went away, 143 SIGTERM).

Each command imports the API it calls when it runs: a command's start-up is Python, numpy and what
that command reads, not every other command's dependencies (the tests run this program hundreds of
times; a user runs validate in CI loops).
"""

from __future__ import annotations

import io
import json
import logging
import os
import shlex
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ._version import __version__
from .command_line import Command, HelpRequested, UsageError, argument, flag, multi, option, parse, render_help, render_program_help
from .errors import DFlashError, InputFileError, OptionValueError, printable
from .files import os_reason
from .format.quant_types import DEFAULT_RELEASE_TYPES, DEFAULT_SWEEP_TYPES
from .format.rules import EMBEDDING_TENSOR, OUTPUT_TENSOR
from .terminal import visible

PROG = "dflash-convert"
SUMMARY = "Convert, inspect and check DFlash drafter GGUF files for llama.cpp."


class _Exit(Exception):  # noqa: N818 - control flow, not an error
    """Ends a command with this exit code (after its line was printed)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _echo(text: str = "") -> None:
    sys.stdout.write(text + "\n")


def _say(line: str, err: bool = False) -> None:
    """Print one line that may quote a file (a path, a key or tensor name, a value): escaped, so it
    stays one line and no escape sequence from a file reaches the terminal (terminal.visible)."""
    if err:
        _err(line)
    else:
        _echo(visible(line))


class _VisibleFormatter(logging.Formatter):
    """Warnings quote files too (a tensor name, a key): the same escaping as every other line."""

    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record))


def _setup_logging() -> None:
    """Every command's warnings (a fallback type, a temporary file a killed run left) in one form."""
    logging.basicConfig(level=logging.WARNING, format="dflash-convert: warning: %(message)s", force=True)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(_VisibleFormatter("dflash-convert: warning: %(message)s"))


def _quiet(quiet: bool) -> None:
    """-q: no warnings (errors still print)."""
    if quiet:
        logging.getLogger().setLevel(logging.ERROR)


EXIT_REFUSED = 1  # the request was refused, a check failed, or the machine stopped it (disk full, out of memory)
EXIT_UNREADABLE = 2  # an input cannot be read (missing, corrupt, not what it should be)
EXIT_USAGE = 64  # the command line is wrong (sysexits.h EX_USAGE): not 2, which says an input is bad
EXIT_SIGPIPE = 128 + signal.SIGPIPE  # the reader of stdout went away (| head): the shell's status for it


def exit_code(e: DFlashError) -> int:
    """The one exit-code rule of every command."""
    if isinstance(e, OptionValueError):
        return EXIT_USAGE
    return EXIT_UNREADABLE if isinstance(e, InputFileError) else EXIT_REFUSED


def _err(line: str) -> None:
    """One line on stderr, escaped like every line that may quote a file (terminal.visible); a stderr that
    went away costs the line, never a traceback (the exit code stays)."""
    try:
        sys.stderr.write(visible(printable(line)) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _fail(e: DFlashError) -> None:
    _err(f"dflash-convert: error: {e}")
    raise _Exit(exit_code(e))


def _fail_os(e: OSError, output: str | os.PathLike | None) -> None:
    """An OSError no reader or writer turned into a DFlashError: named by its file, else by the output."""
    if e.filename is not None:
        _fail(DFlashError(os_reason(e), e.filename))
    _fail(DFlashError(f"cannot write the output: {os_reason(e)}" if output is not None else os_reason(e), output))


@contextmanager
def _command_errors(output: str | os.PathLike | None) -> Iterator[None]:
    """The failure rule of every command that writes: a DFlashError is its one line; a reader of stdout
    that went away is main()'s to end quietly; any other OSError is named by its file, else by the output."""
    try:
        yield
    except DFlashError as e:
        _fail(e)
    except BrokenPipeError:
        raise
    except OSError as e:
        _fail_os(e, output)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# --- the commands ----------------------------------------------------------------------------------

def convert(src_dir: Path, target_model_dir: Path | None, target_gguf: Path | None, outfile: str | None, outtype: str,
            force: bool, dry_run: bool, tokenizer_pre: str | None, keep_embeddings: bool, metadata: Path | None,
            no_cache: bool, quiet: bool) -> int:
    from .conversion import plan_conversion, write_plan  # tokenizers, gguf-py: only the commands that convert pay for them

    _quiet(quiet)
    with _command_errors(outfile):
        plan = plan_conversion(src_dir, target_model_dir, target_gguf=target_gguf, outfile=outfile,
                               outtype=outtype, tokenizer_pre=tokenizer_pre, keep_embeddings=keep_embeddings,
                               hash_sources=not dry_run, metadata=metadata, cache=not no_cache)
        if dry_run:
            _print_plan(plan)
            _echo("dry run: nothing written")
            return 0
        write_plan(plan, force=force, progress=not quiet)
    if not quiet:
        _say(f"wrote {plan.output} ({len(plan.tensors)} tensors, {_human(plan.total_bytes)} of data, "
             f"file type {plan.type_name})")
    return 0


def _print_plan(plan) -> None:
    # start-up: the parser and the help import nothing of what the commands run
    from .format.keys import key
    from .inspect_gguf import short

    _say(f"output: {plan.output}")
    _echo(f"file type: {plan.type_name}; vocabulary: {plan.n_tokens} tokens")
    _echo(f"keys ({len(plan.metadata)}):")
    late = key("source_files_sha256")
    for kv in plan.metadata:
        if kv.key == late:
            _say(f"  {kv.key:<48} {kv.vtype.name:<8} (computed when written)")
            continue
        value = kv.value
        if isinstance(value, list):
            value = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value]
        elif isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        _say(f"  {visible(kv.key):<48} {kv.vtype.name:<8} {short(value)}")
    _echo(f"tensors ({len(plan.tensors)}, {_human(plan.total_bytes)}):")
    for t in plan.tensors:
        ne = ", ".join(map(str, t.ne))
        _say(f"  {t.tensor.gguf_name:<32} {t.ggml_type.name:<5} {{{ne}}}  {_human(t.nbytes)}  <- {t.tensor.hf_name} {t.tensor.dtype}")


def inspect(path: Path, drafter: bool) -> int:
    # start-up: the parser and the help import nothing of what the commands run
    from .format.keys import ARCH
    from .inspect_gguf import block_size, chosen_line, file_name_warning, member_line, pairing_hint, read_summary, short, type_name
    from .sources.gguf_drafter import describe, read_drafter

    if drafter:
        try:
            d = read_drafter(path)
        except DFlashError as e:
            _fail(e)
        _echo(json.dumps(describe(d), indent=1))
        return 0
    try:
        g, d = read_summary(path)
    except DFlashError as e:
        _fail(e)
    _say(f"file: {g.path}")
    _say(f"architecture: {g.architecture}")
    _echo(f"keys ({len(g.metadata)}):")
    for k, v in g.metadata.items():
        _say(f"  {visible(k):<48} {type_name(v):<14} {short(v.value)}")
    total = sum(t.nbytes for t in g.tensors)
    _echo(f"tensors ({len(g.tensors)}, {_human(total)}):")
    for t in g.tensors:
        _say(f"  {visible(t.name):<32} {t.ggml_type.name:<6} {{{', '.join(map(str, t.ne))}}}  {_human(t.nbytes)}")
    if g.architecture == ARCH:
        _echo(f"target layers (llama.cpp layer inputs): {d.target_layers}; block size: {block_size(d)}")
        _say(member_line(d))
        if (problem := file_name_warning(d)) is not None:  # with the summary, as validate reports it: not on stderr
            _say(f"warning: {problem}")
        if (how := chosen_line(g)) is not None:
            _say(how)
        _echo("pair with the target in llama.cpp:")
        _say(f"  {pairing_hint(d)}")
    return 0


def validate(path: Path, target: Path | None, json_out: bool, deep: bool) -> int:
    from .validate import validate as run_validate  # gguf-py and the target readers: only when validating
    from .validate.report import render_json, render_text  # start-up: as above

    report = run_validate(path, target, deep=deep)
    if json_out:
        _echo(render_json(report))
    elif report.exit_code != 2:
        _echo(render_text(report))
    if report.exit_code == 2:
        _err(f"dflash-convert: error: {report.error_line()}")
    return report.exit_code


def migrate(src: Path, out: str, target_layers_offset: int | None, target_layers: str | None, target_gguf: Path | None,
            mask_token_id: int | None, force: bool) -> int:
    from .migrate import migrate as run_migrate  # the writers and gguf-py: only when migrating
    from .validate.report import render_text  # start-up: as above

    with _command_errors(out):
        layers = None
        if target_layers is not None:
            try:
                layers = [int(x) for x in target_layers.split(",")]
            except ValueError:
                raise DFlashError(f"--target-layers must be comma-separated integers, got {target_layers!r}") from None
        result = run_migrate(src, out, force=force, target_layers_offset=target_layers_offset, target_layers=layers,
                             target_gguf=target_gguf, mask_token_id=mask_token_id)
    plan = result.plan
    total = sum(t.nbytes for t, _ in plan.tensors)
    _say(f"wrote {result.output}: {plan.dialect.name} -> dflash, {len(plan.tensors)} tensors ({_human(total)}) "
         "copied byte for byte")
    for note in plan.notes:
        _say(f"  {note}")
    report = result.report
    if report.exit_code:
        _echo(render_text(report))
        _err("dflash-convert: error: the written file does not pass validate; see the failures above")
    else:
        n = report.counts()
        _echo(f"validate: PASS ({n['warn']} warn, {n['pass']} pass)")
    return report.exit_code


def quantize(src: Path, out: str, qtype: str, threads: int | None, dry_run: bool, keep_type: list[str], tensor_type: list[str],
             tensor_type_file: Path | None, output_tensor_type: str | None, token_embedding_type: str | None,
             leave_output_tensor: bool, pure: bool, override_kv: list[str], prune_layers: str | None, allow_requantize: bool,
             features: Path | None, min_acceptance: float | None, target_model_dir: Path | None, target_gguf: Path | None,
             device: str, skip_validation: bool, force: bool, quiet: bool) -> int:
    _quiet(quiet)
    if min_acceptance is not None or features is not None:
        per_tensor = {"--keep-type": keep_type, "--tensor-type": tensor_type, "--tensor-type-file": tensor_type_file,
                      "--output-tensor-type": output_tensor_type, "--token-embedding-type": token_embedding_type,
                      "--leave-output-tensor": leave_output_tensor, "--pure": pure, "--override-kv": override_kv,
                      "--prune-layers": prune_layers, "--allow-requantize": allow_requantize,
                      "--skip-validation": skip_validation}
        given = [flag for flag, v in per_tensor.items() if v]
        if min_acceptance is None or features is None or given:
            why = f"it chooses the per-tensor types itself, not with {given[0]}" if given else "each needs the other"
            _fail(DFlashError(f"--min-acceptance and --features go together ({why})"))
        _quantize_for_acceptance(src, out, qtype, features, min_acceptance, target_model_dir, target_gguf, device, force,
                                 dry_run, quiet, threads)
        return 0
    from .format.keys import key  # start-up: as above
    from .quantize import plan_quantize, quantize_options, write_quantize  # the encoders, gguf-py: only when quantizing

    with _command_errors(out):
        options = quantize_options(keep_types=keep_type, allow_requantize=allow_requantize, tensor_types=tensor_type,
                                   tensor_type_file=tensor_type_file, output_tensor_type=output_tensor_type,
                                   token_embedding_type=token_embedding_type, leave_output_tensor=leave_output_tensor,
                                   pure=pure, override_kv=override_kv, prune_layers=prune_layers,
                                   file_position=_tensor_types_before_file(_COMMAND_LINE))
        plan = plan_quantize(src, out, qtype, options=options, validate=not skip_validation)
        if dry_run:
            _say(f"{plan.source} -> {plan.output}: {plan.ftype} ({key('file_type')} {plan.file_type})")
            by_name = {t.gguf_name: t for t in plan.drafter.tensors}
            for p in plan.tensors:
                src_type = by_name[p.tensor.gguf_name].dtype
                shape = "x".join(map(str, p.ne))
                _say(f"  {p.tensor.gguf_name:<32} {shape:<14} {src_type:<5} -> {p.ggml_type.name:<6} {_human(p.nbytes):>10}"
                     + (f"  ({p.note})" if p.note and p.note.startswith(("fallback", "--")) else ""))
            for note in plan.notes:
                _say(f"  {note}")
            _echo(f"total {_human(plan.total_bytes)}; dry run: nothing written")
            return 0
        write_quantize(plan, force=force, progress=not quiet, threads=threads)
    if not quiet:
        for note in plan.notes:
            _say(f"note: {note}")
        _say(f"wrote {plan.output} ({len(plan.tensors)} tensors, {_human(plan.total_bytes)} of data, {plan.ftype})")
    return 0


def _quantize_for_acceptance(src: Path, out: str, qtype: str, features: Path, min_acceptance: float,
                             target_model_dir: Path | None, target_gguf: Path | None, device: str, force: bool,
                             dry_run: bool, quiet: bool, threads: int | None) -> None:
    from .quantize import quantize_for_acceptance  # torch and the encoders: only this command pays for them

    try:
        chosen = quantize_for_acceptance(src, out, qtype, features, min_acceptance, target_model_dir=target_model_dir,
                                         target_gguf=target_gguf, device=device, force=force, dry_run=dry_run,
                                         progress=not quiet, threads=threads, log=None if quiet else _say)
    except DFlashError as e:
        _fail(e)
    res, plan = chosen.search, chosen.plan
    _say(f"chosen: {plan.ftype} mix raised in {len(res.steps)} step(s): {res.result_bytes} tensor bytes "
         f"(plain {plan.ftype} {res.plain_bytes}, input {res.baseline_bytes}); held-out accept {res.result.accept:.4f} = "
         f"{res.relative:.4f} of the input's {res.baseline.accept:.4f} (plain {res.plain.accept:.4f})")
    _say(f"search: {res.evaluations} measurements, {res.quantized} tensors quantized, {res.seconds:.1f} s")
    _say("recipe: " + (" ".join(f"--tensor-type {shlex.quote(i)}" for i in chosen.tensor_types) or "(the plain mix)"))
    _say("llama-quantize writes the same file with: llama-quantize "
         + " ".join(shlex.quote(a) for a in chosen.llama_quantize_args()))
    if not dry_run and not quiet:
        _say(f"wrote {plan.output} ({len(plan.tensors)} tensors, {_human(plan.total_bytes)} of data)")


def sweep(src: Path, features: Path, types: str, target_model_dir: Path | None, target_gguf: Path | None, device: str,
          numerics: str, json_out: bool, plot: Path | None, threads: int | None, force: bool) -> int:
    # torch and the encoders: only this command pays for them
    from .outputs import check_output_path
    from .quantize import plot_sweep, plot_sweep_ready
    from .quantize import sweep as run_sweep

    try:
        if plot is not None:
            check_output_path(plot, [src, features], force=force)  # before minutes of measuring
            plot_sweep_ready()
        report = run_sweep(src, features, [t for t in types.split(",") if t.strip()], target_model_dir=target_model_dir,
                           target_gguf=target_gguf, device=device, numerics=numerics, threads=threads)
        if plot is not None:
            plot_sweep(report, plot, force=force)
    except DFlashError as e:
        _fail(e)
    if json_out:
        _echo(report.to_json())  # JSON escapes what it quotes
    else:
        for line in report.render_text().splitlines():
            _say(line)
    if plot is not None and not json_out:
        _say(f"wrote {plot}")
    return 0


def check(draft: Path, checkpoint: Path, target_model_dir: Path | None, target_gguf: Path | None, device: str, context: int,
          seed: int, features: str, json_out: bool, save_io: str | None, reference_gguf: Path | None) -> int:
    from .check import check as run_check  # imports torch: only this command pays for it

    try:
        report = run_check(draft, checkpoint, target_model_dir=target_model_dir, target_gguf=target_gguf, device=device,
                           context=context, seed=seed, save_io=save_io, reference_gguf=reference_gguf,
                           features=features)
    except DFlashError as e:
        _fail(e)
    _echo(report.to_json() if json_out else report.render_text())
    return report.exit_code


def capture(target_model_dir: Path | None, target_gguf: Path | None, prompts: Path, out: str, new_tokens: int, layers: str | None,
            for_draft: Path | None, device: str, dtype: str, libllama: Path | None, n_gpu_layers: int, threads: int | None,
            ctx_size: int | None, force: bool, quiet: bool) -> int:
    from .capture import capture as run_capture  # a target directory imports torch and transformers when it runs

    _quiet(quiet)
    with _command_errors(out):
        res = run_capture(target_model_dir, prompts, out, new_tokens=new_tokens, layers=layers, for_draft=for_draft,
                          device=device, dtype=dtype, force=force, progress=not quiet, target_gguf=target_gguf,
                          libllama=libllama, n_gpu_layers=n_gpu_layers, threads=threads, ctx_size=ctx_size)
    for note in res.notes:
        _err(f"note: {note}")
    if not quiet:
        _say(f"wrote {res.output}: {res.sequences} sequences, {res.tokens} tokens, layer inputs {res.layers}")
    return 0


def accept(drafts: list[Path], features: Path, checkpoint: Path | None, n_max: int | None, target_model_dir: Path | None,
           target_gguf: Path | None, device: str, numerics: str, json_out: bool) -> int:
    from .accept import accept as run_accept  # imports torch: only this command pays for it

    try:
        report = run_accept(drafts, features, checkpoint=checkpoint, n_max=n_max, target_model_dir=target_model_dir,
                            target_gguf=target_gguf, device=device, numerics=numerics)
    except DFlashError as e:
        _fail(e)
    _echo(report.to_json() if json_out else report.render_text())
    return 0


def publish(src_dir: Path, target_model_dir: Path, out_dir: str, types: str, check: bool, upload: str | None,
            drafter_repo: str | None, target_repo: str | None, target_revision: str | None, tokenizer_pre: str | None,
            device: str, dry_run: bool, force: bool, quiet: bool) -> int:
    # every command's dependencies: only a release pays for them
    from .publish import publish as run_publish
    from .publish import summary_rows

    _quiet(quiet)
    with _command_errors(out_dir):
        release = run_publish(src_dir, target_model_dir, out_dir, types=types, check=check, upload=upload, dry_run=dry_run,
                              force=force, progress=not quiet, drafter_repo=drafter_repo, target_repo=target_repo,
                              target_revision=target_revision, tokenizer_pre=tokenizer_pre, device=device)
    if dry_run:
        _say(f"release: {release.out_dir}; every quantized type from {release.base_type}")
        for f in release.files:
            _say(f"  {f.type_name:<8} {f.name} (+ {f.report_name})")
        _say(f"  and {', '.join(n for n in release.names if n not in {f.name for f in release.files} | {f.report_name for f in release.files})}")
        if upload is not None:
            _say(f"then upload to {upload}")
        _echo("dry run: nothing written")
        return 0
    for line in summary_rows(release):
        _say(line)
    n = len(release.files)
    _say(f"wrote {release.out_dir}: {n} GGUF file{'s' if n != 1 else ''}, {'their' if n != 1 else 'its'} validate "
         "report, SHA256SUMS and README.md")
    if release.uploaded is not None:
        _say(f"uploaded to {upload}: {release.uploaded}")
    return 0


def version() -> int:
    _echo(f"dflash-convert {__version__}")
    return 0


# --- what each command takes (help texts as the user reads them) -----------------------------------

_FORCE = flag("force", "--force", help="Replace an existing output file.")
_DEVICE = option("device", "--device", default="auto", help="auto (CUDA when present), cpu or cuda.")
_JSON = flag("json_out", "--json", help="Print the report as JSON.")
_THREADS = option("threads", "--threads", type=int, minimum=1, help="Encoder threads (default: every core).")
_REPO = "org/name[@revision]"

COMMANDS: tuple[Command, ...] = (
    Command("convert", convert, "Convert a DFlash drafter (z-lab or speculators format) to llama.cpp's dflash GGUF.", (
        argument("src_dir", "Drafter checkpoint directory (config.json + safetensors), or a Hugging Face repo id "
                 f"{_REPO} (from the cache first; downloaded unless HF_HUB_OFFLINE=1).", metavar="SRC_DIR"),
        option("target_model_dir", "--target-model-dir", type=Path, help="Target model dir: config.json + tokenizer files "
               f"(no weights read). Required, unless --target-gguf is given. A repo id {_REPO} also works."),
        option("target_gguf", "--target-gguf", type=Path, help="Converted target GGUF: copy its tokenizer.* keys verbatim."),
        option("outfile", "-o", "--outfile", metavar="PATH", help="Output file or folder (default: SRC_DIR/dflash-<Name>-<TYPE>.gguf, "
               "dspark- for DSpark: the names llama.cpp's -hf finds as a draft; in the current folder for a repo id)."),
        option("outtype", "--outtype", default="auto", help="f32, f16, bf16, q8_0, auto (bf16 for bf16 checkpoints, else f16), "
               "or any quantize TYPE (Q4_K_M, Q6_K, IQ4_XS, ...: converted and quantized in one pass)."),
        _FORCE,
        flag("dry_run", "--dry-run", help="Print the plan (keys, tensors, sizes) and write nothing."),
        option("tokenizer_pre", "--tokenizer-pre", help="llama.cpp pre-tokenizer name, when the probe hash is unknown."),
        flag("keep_embeddings", "--keep-embeddings", help="Write embed_tokens/lm_head even when they equal the target's."),
        option("metadata", "--metadata", type=Path, metavar="FILE.json", help="general.* keys over the model card's "
               "(README.md, generation_config.json), as upstream's --metadata."),
        flag("no_cache", "--no-cache", help="Neither read nor write the tokenizer cache ($DFLASH_CONVERT_CACHE/"
             "tokenizer, else $XDG_CACHE_HOME/dflash-convert/tokenizer, else ~/.cache/dflash-convert/tokenizer)."),
        flag("quiet", "-q", "--quiet", help="No progress bar, no warnings."),
    )),
    Command("inspect", inspect, "Show architecture, keys, tensors, and the llama-server line that pairs the drafter.", (
        argument("path", "A GGUF file.", metavar="PATH"),
        flag("drafter", "--drafter", help="Print the Drafter read_drafter makes of the file, as JSON."),
    )),
    Command("validate", validate, "Check that a drafter GGUF loads and pairs in llama.cpp: exit 0 pass, 1 findings, 2 unreadable input.", (
        argument("path", "The drafter GGUF to check.", metavar="PATH"),
        option("target", "--target", type=Path, help="Target GGUF or Hugging Face model directory: check the pairing too."),
        flag("json_out", "--json", help="Print the result as JSON (schema: dflash_convert/validate/validate.schema.json)."),
        flag("deep", "--deep", help="Also scan every tensor for NaN and Inf."),
    )),
    Command("migrate", migrate, "Rewrite another fork's DFlash GGUF as upstream dflash (tensor data copied byte for byte), "
            "then validate it.", (
        argument("src", "A DFlash GGUF written for another fork (dflash-draft, qwen35-dflash-draft, pre-merge dflash).", metavar="SRC"),
        argument("out", "The upstream dflash GGUF to write.", type=str, metavar="OUT"),
        option("target_layers_offset", "--target-layers-offset", type=int,
               help="0 or 1, added to the file's layer ids when its dialect cannot tell."),
        option("target_layers", "--target-layers", metavar="L1,L2,...", help="llama.cpp target_layers, when the file holds none."),
        option("target_gguf", "--target-gguf", type=Path, help="Copy every tokenizer.* key from this converted target GGUF."),
        option("mask_token_id", "--mask-token-id", type=int, help="The mask token id, when the file holds none."),
        _FORCE,
    )),
    Command("quantize", quantize, "Quantize a drafter GGUF, bit-identical to llama-quantize (no imatrix); no C build needed.\n\n"
            "An input that fails validate is refused, and so is an output that would (--skip-validation: neither is checked).", (
        argument("src", "A dflash drafter GGUF in F32, F16 or BF16.", metavar="SRC"),
        argument("out", "The GGUF to write, or a folder: dflash-<Name>-<TYPE>.gguf in it (the input's name with its type "
                 "tag replaced).", type=str, metavar="OUT"),
        argument("qtype", "F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K_S, Q3_K_M, Q3_K_L, Q4_K_S, Q4_K_M, Q5_K_S, "
                 "Q5_K_M, Q6_K, IQ4_NL or IQ4_XS.", type=str, metavar="TYPE"),
        _THREADS,
        flag("dry_run", "--dry-run", help="Print the per-tensor plan and write nothing."),
        multi("keep_type", "--keep-type", metavar="PATTERN=TYPE", help="Our glob shorthand: quantized tensors matching the "
              "glob get TYPE after llama-quantize's choice, e.g. 'blk.[01].attn_*=Q8_0' (repeatable)."),
        multi("tensor_type", "--tensor-type", metavar="PATTERN=TYPE", help="llama-quantize's: a regular expression searched in "
              "the tensor name; the first that matches gives the type (repeatable, in order)."),
        option("tensor_type_file", "--tensor-type-file", type=Path, help="PATTERN=TYPE items, whitespace-separated."),
        option("output_tensor_type", "--output-tensor-type", metavar="TYPE", help=f"The type of {OUTPUT_TENSOR}."),
        option("token_embedding_type", "--token-embedding-type", metavar="TYPE", help=f"The type of {EMBEDDING_TENSOR}."),
        flag("leave_output_tensor", "--leave-output-tensor", help=f"Do not quantize {OUTPUT_TENSOR}."),
        flag("pure", "--pure", help="No mix rules: every quantized tensor takes the type's default."),
        multi("override_kv", "--override-kv", metavar="KEY=TYPE:VALUE",
              help="Set a key in the output (int, float, bool, str), as llama-quantize does."),
        option("prune_layers", "--prune-layers", metavar="L0,L1,...", help="Drop these layers, renumber the rest."),
        flag("allow_requantize", "--allow-requantize", help="Accept an already quantized input (quality suffers)."),
        option("features", "--features", type=Path, help="With --min-acceptance: the features file capture wrote."),
        option("min_acceptance", "--min-acceptance", type=float, metavar="R", help="Raise tensor groups from TYPE's mix until "
               "the held-out acceptance is R times the input's (e.g. 0.98); prints the recipe."),
        option("target_model_dir", "--target-model-dir", type=Path, help=f"With --min-acceptance: the target dir or repo id {_REPO} "
               "(default: the one the features were captured from)."),
        option("target_gguf", "--target-gguf", type=Path, help="With --min-acceptance: the target GGUF."),
        option("device", "--device", default="auto", help="With --min-acceptance: auto (CUDA when present), cpu or cuda."),
        flag("skip_validation", "--skip-validation", help="Quantize an input that fails validate, and write the output "
             "unvalidated (a warning says so; llama.cpp may refuse or mis-run the file)."),
        _FORCE,
        flag("quiet", "-q", "--quiet", help="No progress bar, no notes, no warnings."),
    )),
    Command("sweep", sweep, "Quantize to each type (temporary files), measure each one's acceptance: size against accepted tokens.", (
        argument("src", "A dflash drafter GGUF in F32, F16 or BF16.", metavar="SRC"),
        option("features", "--features", type=Path, required=True, help="The features file capture wrote."),
        option("types", "--types", default=",".join(DEFAULT_SWEEP_TYPES), metavar="T1,T2,...", help="The types to measure."),
        option("target_model_dir", "--target-model-dir", type=Path, help=f"Target dir or repo id {_REPO} for the shared "
               "embedding and head (default: the one the features were captured from)."),
        option("target_gguf", "--target-gguf", type=Path, help="Target GGUF for the shared embedding and head."),
        _DEVICE,
        option("numerics", "--numerics", default="cpu", help="cpu: round as llama.cpp's CPU backend; exact: float32."),
        flag("json_out", "--json", help="Print the table as JSON."),
        option("plot", "--plot", type=Path, metavar="FILE.png", help="Draw acceptance against size (needs matplotlib)."),
        _THREADS,
        flag("force", "--force", help="Replace an existing plot file."),
    )),
    Command("check", check, "Run the GGUF in-process and the checkpoint's reference forward on the same inputs: "
            "0 pass, 1 fail, 2 unreadable.", (
        argument("draft", "The drafter GGUF to run.", metavar="DRAFT"),
        option("checkpoint", "--checkpoint", type=Path, required=True,
               help=f"The checkpoint directory it was converted from, or its repo id {_REPO}."),
        option("target_model_dir", "--target-model-dir", type=Path, help=f"Target dir or repo id {_REPO} (embedding and "
               "head from its safetensors)."),
        option("target_gguf", "--target-gguf", type=Path, help="Target GGUF (only token_embd and output are read)."),
        _DEVICE,
        option("context", "--context", type=int, default=64, minimum=1, help="Context tokens before the drafted block."),
        option("seed", "--seed", type=int, default=0, help="Seed of the synthetic target features (or of the context tokens)."),
        option("features", "--features", default="synthetic", help="synthetic (from the seed), target (run the model in "
               "--target-model-dir; each side taps its own target layers; needs transformers), or a features file from "
               "capture (also measures acceptance against the checkpoint's)."),
        _JSON,
        option("save_io", "--save-io", metavar="PATH", help="Write inputs and outputs of both forwards to this .npz."),
        option("reference_gguf", "--reference-gguf", type=Path, help="A full-precision sibling: also report agreement with it."),
    )),
    Command("capture", capture, "Run the target once over the prompts; keep its greedy continuations and the layer inputs "
            "drafters read.", (
        option("target_gguf", "--target-gguf", type=Path, help="The target GGUF (any type, as you serve it): run by "
               "llama.cpp's own library."),
        option("target_model_dir", "--target-model-dir", type=Path,
               help="Or the target's Hugging Face directory, with its safetensors: run by transformers in float32."),
        option("prompts", "--prompts", type=Path, required=True, help="One prompt per line, or JSONL (a string or "
               "{\"prompt\": ...} per line)."),
        option("out", "-o", "--output", required=True, metavar="PATH", help="The features file to write (.safetensors)."),
        option("new_tokens", "--new-tokens", type=int, default=64, minimum=1,
               help="N: each continuation is what llama-speculative-simple -n N decodes."),
        option("layers", "--layers", help="all (the default), or L1,L2,...: the layer inputs to store (llama.cpp's indices)."),
        option("for_draft", "--for", type=Path, help="Store only the layers this drafter GGUF taps."),
        _DEVICE,
        option("dtype", "--dtype", default="f32", help="f32, f16 or bf16: how the layer inputs are stored."),
        option("libllama", "--libllama", type=Path, help="With --target-gguf: the libllama to run (default: "
               "$DFLASH_CONVERT_LIBLLAMA, else llama-cpp-python's)."),
        option("n_gpu_layers", "--n-gpu-layers", type=int, default=-1, help="With --target-gguf: layers to offload to "
               "the GPU of a CUDA or Metal build (-1: all)."),
        option("threads", "--threads", type=int, minimum=1, help="With --target-gguf: CPU threads (default: every core)."),
        option("ctx_size", "--ctx-size", type=int, minimum=1, help="With --target-gguf: the context (default: the "
               "longest prompt and its new tokens)."),
        _FORCE,
        flag("quiet", "-q", "--quiet", help="No progress bar, no warnings."),
    )),
    Command("accept", accept, "How many drafted tokens each file gets accepted on the captured sequences, as "
            "llama-speculative-simple counts.", (
        argument("drafts", "Drafter GGUF files (any type).", metavar="DRAFT.gguf", variadic=True),
        option("features", "--features", type=Path, required=True, help="The features file capture wrote."),
        option("checkpoint", "--checkpoint", type=Path, help=f"Also run this checkpoint (a directory or a repo id {_REPO}; "
               "reference forward) as the baseline."),
        option("n_max", "--n-max", type=int, minimum=1, help="--spec-draft-n-max (default: block size - 1)."),
        option("target_model_dir", "--target-model-dir", type=Path, help=f"Target dir or repo id {_REPO} for the shared "
               "embedding and head (default: the one the features were captured from)."),
        option("target_gguf", "--target-gguf", type=Path, help="Target GGUF for the shared embedding and head."),
        _DEVICE,
        option("numerics", "--numerics", default="cpu", help="cpu: round as llama.cpp's CPU backend (F16 KV cache, "
               "quantized activations); exact: the graph in float32."),
        _JSON,
    )),
    Command("publish", publish, "Convert once, quantize each type, validate every file against the target; write the files, "
            "their validate reports, SHA256SUMS and a model card into a new RELEASE_DIR; optionally upload it. Nothing is "
            "released or uploaded when any file fails.", (
        argument("src_dir", f"Drafter checkpoint directory (config.json + safetensors), or a Hugging Face repo id {_REPO}.",
                 metavar="SRC_DIR"),
        option("target_model_dir", "--target-model-dir", type=Path, required=True, help=f"The target model dir (or {_REPO}) "
               "every file is converted for and validated against (with --check: its embedding safetensors too)."),
        option("out_dir", "-o", "--output", required=True, metavar="RELEASE_DIR", help="The release directory to create."),
        option("types", "--types", default=",".join(DEFAULT_RELEASE_TYPES), metavar="T1,T2,...", help="The files: float types "
               "are converted from the checkpoint, the others quantized from the first float type (else from a scratch "
               "auto conversion)."),
        flag("check", "--check", help="Also run check against the checkpoint; its fidelity goes in the card, and a file "
             "that fails stops the release (needs torch)."),
        option("upload", "--upload", metavar="ORG/NAME", help="Push the release with huggingface_hub once every file passed "
               "(token: HF_TOKEN or the login cache; HF_ENDPOINT honoured)."),
        option("drafter_repo", "--drafter-repo", metavar="ORG/NAME",
               help="The drafter's hub repo for the card (default: the file's provenance, else the directory name)."),
        option("target_repo", "--target-repo", metavar="ORG/NAME",
               help="The target's hub repo for the card (default: the file's provenance, else the directory name)."),
        option("target_revision", "--target-revision", metavar="REV", help="The target's revision for the card."),
        option("tokenizer_pre", "--tokenizer-pre", help="As convert's: the llama.cpp pre-tokenizer name."),
        option("device", "--device", default="auto", help="With --check: auto (CUDA when present), cpu or cuda."),
        flag("dry_run", "--dry-run", help="Print the files and types and write nothing."),
        flag("force", "--force", help="Replace an existing release directory (swapped in at the end)."),
        flag("quiet", "-q", "--quiet", help="No progress bars, no warnings (the summary table stays)."),
    )),
    Command("version", version, "Print the version."),
)
_BY_NAME = {c.name: c for c in COMMANDS}


class Interrupted(BaseException):
    """SIGINT or SIGTERM: unwinds like KeyboardInterrupt, so every temporary file is removed on the way out."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


_COMMAND_LINE: list[str] = []  # the command line being run (main's argv), for the order of --tensor-type items


def _tensor_types_before_file(argv: list[str]) -> int | None:
    """How many --tensor-type items precede --tensor-type-file on the command line (llama-quantize
    applies them in that order); None when the file is not named there (the API's default order)."""
    seen = 0
    for arg in argv[1:]:
        if arg == "--tensor-type-file" or arg.startswith("--tensor-type-file="):
            return seen
        if arg == "--tensor-type" or arg.startswith("--tensor-type="):
            seen += 1
    return None


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
    """Reopen a closed stdin, stdout or stderr on /dev/null, before anything opens a file.

    Otherwise the first file opened would get descriptor 0, 1 or 2, and whatever writes to stdout (a
    child, a library) would write into it. A closed stdout returns the counter its text now goes to.
    Names that are not UTF-8 are printed escaped, never raise.
    """
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


def _invoke(args: list[str]) -> int:
    """Parse and run one command line; usage errors are one line and EXIT_USAGE."""
    _COMMAND_LINE[:] = [PROG, *args]
    if not args:  # a bare program: its help, on stderr, and the usage status
        sys.stderr.write(render_program_help(PROG, SUMMARY, COMMANDS))
        return EXIT_USAGE
    first = args[0]
    if first in ("-h", "--help"):
        sys.stdout.write(render_program_help(PROG, SUMMARY, COMMANDS))
        return 0
    if first == "--version":
        return version()
    command = _BY_NAME.get(first)
    if command is None:
        what = f"No such option: {first}" if first.startswith("-") else f"No such command {first!r}."
        _err(f"dflash-convert: error: {what} (see '{PROG} -h')")
        return EXIT_USAGE
    try:
        kwargs = parse(command, args[1:])
    except HelpRequested:
        sys.stdout.write(render_help(PROG, command))
        return 0
    except UsageError as e:
        _err(f"dflash-convert: error: {e} (see '{PROG} {command.name} -h')")
        return EXIT_USAGE
    _setup_logging()
    try:
        code = command.run(**kwargs)
    except _Exit as e:
        return e.code
    return code or 0


def main(argv: list[str] | None = None) -> None:
    """The console entry point: one error line and an exit code, whatever happens.

    SIGINT and SIGTERM raise Interrupted while a command runs (the writer removes its temporary
    file as it unwinds) and exit 130 / 143 without a traceback. Once the command is over, a late
    signal is only recorded: the process still exits 128 + signal, and nothing is left half done.
    A reader of stdout that goes away exits 141 (SIGPIPE's status) with nothing more printed; a
    stdout closed from the start swallows the output (one warning says so) and changes no exit code.
    Anything unforeseen is still one line ("internal error"; DFLASH_CONVERT_TRACEBACK=1 shows it).
    """
    closed_stdout = _open_standard_streams()
    received: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _raise_interrupted)
    code = 0
    try:
        try:
            code = _invoke(sys.argv[1:] if argv is None else argv)
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
    except DFlashError as e:
        _err(f"dflash-convert: error: {e}")
        code = exit_code(e)
    except MemoryError:
        _err("dflash-convert: error: out of memory; free memory or raise the limit and run again")
        code = EXIT_REFUSED
    except OSError as e:
        _err(f"dflash-convert: error: {e.filename}: {os_reason(e)}" if e.filename else f"dflash-convert: error: {os_reason(e)}")
        code = EXIT_REFUSED
    except Exception as e:  # a bug of ours: still one line, and the way to see more
        if os.environ.get("DFLASH_CONVERT_TRACEBACK"):
            raise
        text = " ".join(str(e).split())[:300]
        _err(f"dflash-convert: error: internal error: {type(e).__name__}: {text} "
             "(DFLASH_CONVERT_TRACEBACK=1 shows where; please report it)")
        code = EXIT_REFUSED
    if received:
        name = signal.Signals(received[0]).name
        _err(f"dflash-convert: interrupted by {name}; no partial output was left")
        code = 128 + received[0]
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _exit_broken_pipe()
    except (OSError, ValueError):
        pass
    if closed_stdout is not None and closed_stdout.written:
        _err("dflash-convert: warning: standard output is closed; what this command printed there was discarded")
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    if received:
        os._exit(code)  # no interpreter shutdown: nothing left that a late signal could interrupt
    sys.exit(code)


if __name__ == "__main__":
    main()
