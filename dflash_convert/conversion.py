"""convert(): a DFlash drafter checkpoint directory -> llama.cpp `dflash` GGUF."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._version import __version__
from .drafter import Drafter
from .errors import ConfigError, DFlashError, InputFileError, OptionValueError, printable
from .files import sha256_file
from .format.family import DSPARK, VOCAB_ROW_TENSORS, member_of
from .format.file_names import drafter_file_name
from .format.ggml import QUANTIZATION_VERSION
from .format.keys import ARCH, key
from .format.rules import EMBEDDING_TENSOR, OUTPUT_TENSOR
from .hparams import write_hparams, write_mask_token_id
from .metadata import Metadata
from .outputs import Inputs, check_output_path
from .pipeline import ChunkPipeline
from .plan import (
    OutType,
    PlannedTensor,
    QuantizeOptions,
    append_file_type,
    apply_kv_overrides,
    load_importance,
    plan_tensors,
    quantize_planned,
    resolve_outtype,
)
from .sources.checkpoint import read_checkpoint
from .sources.dispatch import read_checkpoint_drafter
from .sources.hub import DRAFTER, TARGET, ResolvedRepo, resolve_source
from .sources.model_card import parameter_count, read_model_card
from .sources.target import read_target_dir, read_target_gguf
from .target import Target
from .tensor_source import source_path
from .terminal import human_size, short, visible
from .tokenizer.borrow import borrow_from_dir, borrow_from_gguf
from .tokenizer.cache import TokenizerCache, open_cache
from .tokenizer.pre_hashes import KNOWN_PRE_NAMES
from .validate.gate import ValidationGate
from .write import string_array_item_offset, write_gguf

log = logging.getLogger("dflash_convert")

SHA256_HEX_LEN = 64
CONVERTER_NAME = "dflash-convert"


class SourceHasher:
    """SHA-256 of the source files, computed on a background thread from the moment they are known."""

    def __init__(self, files: list[Path]) -> None:
        self.files = files
        self.hashes: dict[int, str] = {}
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="hash-sources")
        self.thread.start()

    def _run(self) -> None:
        try:
            for i, p in enumerate(self.files):
                self.hashes[i] = sha256_file(p)
        except BaseException as e:  # reported by result()
            self.error = e

    def result(self) -> list[str]:
        """The SHA-256 of every source file, once the hashing thread is done."""
        self.thread.join()
        if self.error is not None:
            raise InputFileError(f"cannot hash source file: {self.error}")
        return [self.hashes[i] for i in range(len(self.files))]


@dataclass
class ConversionPlan:
    """Everything ``convert`` will write, computed before writing: the drafter, its keys, its tensors and the output."""
    drafter: Drafter
    metadata: Metadata
    tensors: list[PlannedTensor]
    outtype: OutType  # --outtype, resolved
    output: Path
    target: Target
    n_tokens: int
    hasher: SourceHasher | None = None
    inputs: Inputs | None = None  # every file and model directory the conversion reads
    fallbacks: int = 0
    tokenizer_cache: str = "off"  # the borrowed keys: "hit" (from the cache), "miss" (built, stored), ... (tokenizer/cache.py)
    source_card: dict[str, Any] = field(default_factory=dict)  # the checkpoint's README.md front matter, as read

    @property
    def type_name(self) -> str:
        """F16, BF16, Q4_K_M, ...: what the file is called after."""
        return self.outtype.name

    @property
    def file_type(self) -> int:
        """general.file_type (LLAMA_FTYPE_*)."""
        return self.outtype.file_type.value

    @property
    def total_bytes(self) -> int:
        """Bytes of tensor data the output will hold."""
        return sum(t.nbytes for t in self.tensors)

    def dry_run_lines(self) -> list[str]:
        """convert --dry-run: the output, every key with its value, every tensor with its size and source."""
        late = key("source_files_sha256")
        out = [f"output: {self.output}", f"file type: {self.type_name}; vocabulary: {self.n_tokens} tokens",
               f"keys ({len(self.metadata)}):"]
        for kv in self.metadata:
            value = kv.value
            if isinstance(value, list):
                value = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value]
            elif isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            shown = "(computed when written)" if kv.key == late else short(value)
            out.append(f"  {visible(kv.key):<48} {kv.vtype.name:<8} {shown}")
        out.append(f"tensors ({len(self.tensors)}, {human_size(self.total_bytes)}):")
        for t in self.tensors:
            out.append(f"  {t.tensor.gguf_name:<32} {t.ggml_type.name:<5} {{{', '.join(map(str, t.ne))}}}  "
                       f"{human_size(t.nbytes)}  <- {t.tensor.hf_name} {t.tensor.dtype}")
        return [*out, "dry run: nothing written"]

    def written(self) -> str:
        """The line convert prints once the file is in place."""
        return (f"wrote {self.output} ({len(self.tensors)} tensors, {human_size(self.total_bytes)} of data, "
                f"file type {self.type_name})")


def default_output(src: Path, type_name: str, name: str | None = None, *, dspark: bool = False) -> Path:
    """SRC_DIR/dflash-<Name>-<TYPE>.gguf (dspark- for DSpark), the name llama.cpp's -hf finds (format/file_names.py)."""
    if not name:
        name = Path(os.path.realpath(src)).name
    return src / drafter_file_name(name, type_name, dspark=dspark)


def _general_name(md: Metadata) -> str | None:
    value = md.get(key("name"))
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value if isinstance(value, str) and value.strip() else None


def _default_output_for(src: ResolvedRepo, type_name: str, name: str | None = None, *, dspark: bool = False) -> Path:
    """Beside a local checkpoint; for a repo id, in the current directory under the repo's name."""
    if src.repo_id is None:
        return default_output(src.path, type_name, name, dspark=dspark)
    return Path.cwd() / default_output(Path(src.name), type_name, name, dspark=dspark).name


def write_hub_provenance(md: Metadata, src: ResolvedRepo, target: ResolvedRepo | None) -> None:
    """general.source.hf_* / general.target.hf_*: only for an input given as a repo id (a directory writes none)."""
    if src.repo_id is not None:
        md.set("source_hf_repo", src.repo_id)
        md.set("source_hf_commit", src.commit)
    if target is not None and target.repo_id is not None:
        md.set("target_hf_repo", target.repo_id)
        md.set("target_hf_commit", target.commit)


def plan_conversion(src_dir: str | os.PathLike, target_model_dir: str | os.PathLike | None = None, *,
                    target_gguf: str | os.PathLike | None = None, outfile: str | os.PathLike | None = None,
                    outtype: str = "auto", tokenizer_pre: str | None = None, keep_embeddings: bool = False,
                    hash_sources: bool = True, metadata: str | os.PathLike | None = None,
                    cache: bool | str | os.PathLike | TokenizerCache = True, imatrix: str | None = None) -> ConversionPlan:
    """Read and check everything, decide every key and tensor type; writes nothing (sources may be repo ids).
    ``imatrix``: an importance matrix for the quantizing pass (``--outtype TYPE --imatrix FILE``)."""
    if target_model_dir is None and target_gguf is None:
        raise DFlashError("--target-model-dir (or --target-gguf) is required: a drafter carries its target's tokenizer")
    if outfile is not None and not os.fspath(outfile).strip():
        raise DFlashError("the output path is empty (-o \"\")")
    if tokenizer_pre is not None and tokenizer_pre not in KNOWN_PRE_NAMES:
        raise ConfigError(f"--tokenizer-pre {tokenizer_pre!r} is not a pre-tokenizer llama.cpp 0c1e57098 knows (it would "
                          f"refuse to load the file); choose from: {', '.join(sorted(KNOWN_PRE_NAMES))}")
    source = resolve_source(src_dir, DRAFTER)
    target_source = resolve_source(target_model_dir, TARGET) if target_model_dir is not None else None
    src = source.path
    if target_source is not None:
        target_model_dir = target_source.path
    ckpt = read_checkpoint(src)
    first_matrix = next((t.dtype for t in ckpt.tensors if len(t.shape) >= 2), None)
    out_type = resolve_outtype(outtype, first_matrix)
    if imatrix is not None and not out_type.quantize:
        raise OptionValueError(f"--imatrix goes with a quantization --outtype (Q4_K_M, IQ4_XS, ...), not {outtype}")
    importance, imatrix_kv = load_importance(imatrix) if imatrix is not None else (None, ())
    hasher = SourceHasher(ckpt.files) if hash_sources else None

    tok_md = Metadata()
    tok_cache = open_cache(cache)
    if target_gguf is not None:
        gguf_target = read_target_gguf(target_gguf)
        n_tokens = borrow_from_gguf(tok_md, gguf_target)
        target = read_target_dir(target_model_dir) if target_model_dir is not None else gguf_target
        vocab_where = str(target_gguf)
    else:
        target = read_target_dir(target_model_dir)  # type: ignore[arg-type]
        n_tokens = -1
        vocab_where = str(target_model_dir)

    inputs = Inputs()  # what the output must not be; the model card's files join below
    inputs.add_directory(src)
    inputs.add_directory(target_model_dir)
    inputs.add_file(target_gguf)
    inputs.add_file(imatrix)
    inputs.add_files([ckpt.config_path, *ckpt.files])
    if hash_sources and outfile is not None and not os.path.isdir(outfile):
        # an -o that is (or is a link to) an input is refused before the tokenizer work, not after it;
        # write_plan checks again with every input (the model card's files too) and --force
        check_output_path(outfile, inputs, force=True)
    drafter = read_checkpoint_drafter(ckpt, target, keep_embeddings=keep_embeddings)
    # upstream's general.* from the model card (README.md, generation_config.json, the directory name,
    # the parameter count); read before the tokenizer work, so a bad card or --metadata file fails fast
    card = read_model_card(src, ckpt.config, parameter_count([t.shape for t in drafter.tensors]), metadata,
                           dir_name=source.name)  # a repo id is named by the repo, not its snapshot sha
    if target_gguf is None:
        n_tokens = borrow_from_dir(tok_md, Path(target_model_dir), target.architecture,  # type: ignore[arg-type]
                                   drafter.vocab_size, tokenizer_pre, cache=tok_cache)
    for t in drafter.tensors:
        rows = t.shape[0]
        if t.gguf_name in (EMBEDDING_TENSOR, *VOCAB_ROW_TENSORS) or (t.gguf_name == OUTPUT_TENSOR and drafter.draft_vocab_size is None):
            if rows != n_tokens:
                raise InputFileError(f"{t.hf_name} has {rows} rows but the vocabulary has {n_tokens} tokens",
                                     source_path(t.source))


    md = Metadata()
    md.set("architecture", ARCH)
    md.set("type", "model")
    for kv in card.metadata:  # where upstream writes them: after the type, before the hyper-parameters
        md.set_raw(kv.key, kv.vtype, kv.value, kv.sub)
    md.set("converter", CONVERTER_NAME)
    md.set("converter_version", __version__)
    md.set("source_config_sha256", sha256_file(ckpt.config_path))
    md.set("source_files", [printable(p.name) for p in ckpt.files])
    md.set("source_files_sha256", ["0" * SHA256_HEX_LEN for _ in ckpt.files])  # patched after the data
    write_hub_provenance(md, source, target_source)
    # general.file_type goes where upstream's converter puts it, or, when the same pass quantizes,
    # last (after the quantization version), where llama-quantize puts it
    file_type = out_type.file_type.value
    write_hparams(md, drafter, None if out_type.quantize else file_type)
    if not out_type.quantize:
        md.set("quantization_version", QUANTIZATION_VERSION)
    drafter.tokenizer = tok_md
    for kv in tok_md:
        md.set_raw(kv.key, kv.vtype, kv.value, kv.sub)
    write_mask_token_id(md, drafter, n_tokens, vocab_where)

    planned = plan_tensors(drafter, out_type.convert_to.matrix_type)
    fallbacks = 0
    if out_type.quantize:
        options = QuantizeOptions(imatrix=importance, kv_overrides=imatrix_kv)
        planned, fallbacks = quantize_planned(planned, drafter, out_type.file_type, where=ckpt.config_path, options=options)
        append_file_type(md, file_type)
        apply_kv_overrides(md, options, drafter.n_layers)  # the quantize.imatrix.* keys, last, as llama-quantize adds them
    if outfile is not None and os.fspath(outfile).endswith(os.sep) and not os.path.isdir(outfile):
        raise DFlashError("output folder does not exist (a path ending in / names a folder)", os.fspath(outfile))
    default = _default_output_for(source, out_type.name, _general_name(md),
                                  dspark=member_of({t.gguf_name for t in drafter.tensors}) == DSPARK)
    output = Path(outfile) if outfile is not None else default
    if output.is_dir():  # -o FOLDER: the default file name, in that folder
        output = output / default.name
    inputs.add_files(card.files)
    return ConversionPlan(drafter, md, planned, out_type, output, target, n_tokens, hasher=hasher,
                          fallbacks=fallbacks, inputs=inputs, tokenizer_cache=tok_cache.outcome, source_card=card.front_matter)


def _check_output(plan: ConversionPlan, force: bool) -> None:
    inputs = plan.inputs or Inputs()
    inputs.add_files([plan.drafter.config_path, *plan.drafter.files])
    check_output_path(plan.output, inputs, force=force)


def write_plan(plan: ConversionPlan, *, force: bool = False, progress: bool = True) -> Path:
    """Write a planned conversion atomically; source files are hashed while the data streams."""
    _check_output(plan, force)
    hasher = plan.hasher or SourceHasher(plan.drafter.files)

    def finish(value_at: dict[str, int]) -> list[tuple[int, bytes]]:
        base = value_at[key("source_files_sha256")]
        return [(string_array_item_offset(base, i, SHA256_HEX_LEN), h.encode()) for i, h in enumerate(hasher.result())]

    try:
        with ChunkPipeline() as pipeline:
            write_gguf(plan.output, plan.metadata, pipeline.out_tensors(plan.tensors), progress=progress, finish=finish,
                       verify=ValidationGate(plan.output), replace=force)
    finally:
        hasher.thread.join()
    return plan.output


def convert(src_dir: str | os.PathLike, target_model_dir: str | os.PathLike | None = None, *,
            target_gguf: str | os.PathLike | None = None, outfile: str | os.PathLike | None = None,
            outtype: str = "auto", force: bool = False, dry_run: bool = False,
            tokenizer_pre: str | None = None, keep_embeddings: bool = False, progress: bool = False,
            metadata: str | os.PathLike | None = None, cache: bool | str | os.PathLike | TokenizerCache = True,
            imatrix: str | None = None) -> ConversionPlan:
    """Convert a DFlash drafter checkpoint to GGUF. Returns the plan; writes nothing if dry_run."""
    plan = plan_conversion(src_dir, target_model_dir, target_gguf=target_gguf, outfile=outfile,
                           outtype=outtype, tokenizer_pre=tokenizer_pre, keep_embeddings=keep_embeddings,
                           hash_sources=not dry_run, metadata=metadata, cache=cache, imatrix=imatrix)
    if not dry_run:
        write_plan(plan, force=force, progress=progress)
    return plan


__all__ = ["ConfigError", "ConversionPlan", "convert", "plan_conversion", "write_plan"]
