"""convert(): a DFlash drafter checkpoint directory -> llama.cpp `dflash` GGUF."""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from . import __version__
from .drafter import Drafter
from .errors import ConfigError, DFlashError, InputFileError
from .files import Inputs, check_output_path, refuse_unless_valid
from .format.family import VOCAB_ROW_TENSORS
from .format.ggml import OUTTYPES, QUANTIZATION_VERSION, FileType
from .format.keys import ARCH, key
from .format.rules import EMBEDDING_TENSOR, OUTPUT_TENSOR
from .hparams import write_hparams, write_mask_token_id
from .metadata import Metadata
from .pipeline import ChunkPipeline, PlannedTensor
from .plan import choose_file_type, plan_tensors
from .sources.checkpoint import read_checkpoint
from .sources.family import is_family, read_family
from .sources.speculators import is_speculators, read_speculators
from .sources.vocabulary import resolve_vocabulary
from .sources.zlab import read_zlab
from .target import Target, read_target_dir, read_target_gguf
from .tensor_source import source_path
from .tokenizer import borrow_from_dir, borrow_from_gguf
from .write import string_array_item_offset, write_gguf

log = logging.getLogger("dflash_convert")

SHA256_HEX_LEN = 64
CONVERTER_NAME = "dflash-convert"


class SourceHasher:
    """SHA-256 of the source files, computed on a background thread from the moment they are known.

    Started right after the checkpoint is indexed, it overlaps tokenizer work and tensor
    streaming instead of adding to either (hashlib releases the GIL).
    """

    def __init__(self, files: list[Path]) -> None:
        self.files = files
        self.hashes: dict[int, str] = {}
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="hash-sources")
        self.thread.start()

    def _run(self) -> None:
        try:
            for i, p in enumerate(self.files):
                self.hashes[i] = _sha256_file(p)
        except BaseException as e:  # reported by result()
            self.error = e

    def result(self) -> list[str]:
        self.thread.join()
        if self.error is not None:
            raise InputFileError(f"cannot hash source file: {self.error}")
        return [self.hashes[i] for i in range(len(self.files))]


@dataclass
class ConversionPlan:
    drafter: Drafter
    metadata: Metadata
    tensors: list[PlannedTensor]
    file_type: FileType | int  # a FileType for f32/f16/bf16/q8_0, the LLAMA_FTYPE value for a quantize type
    output: Path
    target: Target
    n_tokens: int
    hasher: SourceHasher | None = None
    inputs: Inputs | None = None  # every file and model directory the conversion reads
    type_name: str = ""  # F16, BF16, Q4_K_M, ...: what the file is called after
    fallbacks: int = 0

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def _sha256_file(path: Path) -> str:
    from .files import open_regular

    h = hashlib.sha256()
    buf = bytearray(8 << 20)
    view = memoryview(buf)
    with os.fdopen(open_regular(path), "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


_FILE_TYPE_NAMES = {FileType.ALL_F32: "F32", FileType.MOSTLY_F16: "F16", FileType.MOSTLY_BF16: "BF16", FileType.MOSTLY_Q8_0: "Q8_0"}


def default_output(src: Path, type_name: str) -> Path:
    return src / f"{src.resolve().name}-{type_name}.gguf"


def plan_conversion(src_dir: str | os.PathLike, target_model_dir: str | os.PathLike | None = None, *,
                    target_gguf: str | os.PathLike | None = None, outfile: str | os.PathLike | None = None,
                    outtype: str = "auto", tokenizer_pre: str | None = None, keep_embeddings: bool = False,
                    hash_sources: bool = True) -> ConversionPlan:
    """Read and check everything, decide every key and tensor type; writes nothing.

    With ``hash_sources`` the source files start being hashed in the background at once, for the
    provenance keys write_plan fills in (pass False for a dry run).
    """
    src = Path(src_dir)
    quant = None
    if outtype != "auto" and outtype not in OUTTYPES:
        from .quantize import QUANT_TYPES, parse_ftype

        try:
            quant = parse_ftype(outtype)
        except DFlashError:
            raise DFlashError(f"unknown --outtype {outtype!r} (choose from auto, {', '.join(OUTTYPES)}, "
                              f"or a quantization type: {', '.join(QUANT_TYPES)})") from None
    if target_model_dir is None and target_gguf is None:
        raise DFlashError("--target-model-dir (or --target-gguf) is required: a drafter carries its target's tokenizer")
    if outfile is not None and not os.fspath(outfile).strip():
        raise DFlashError("the output path is empty (-o \"\")")
    if tokenizer_pre is not None:
        from .tokenizer.pre_hashes import KNOWN_PRE_NAMES

        if tokenizer_pre not in KNOWN_PRE_NAMES:
            raise ConfigError(f"--tokenizer-pre {tokenizer_pre!r} is not a pre-tokenizer llama.cpp 0c1e57098 knows (it would "
                              f"refuse to load the file); choose from: {', '.join(sorted(KNOWN_PRE_NAMES))}")
    ckpt = read_checkpoint(src)
    hasher = SourceHasher(ckpt.files) if hash_sources else None

    tok_md = Metadata()
    if target_gguf is not None:
        gguf_target = read_target_gguf(target_gguf)
        n_tokens = borrow_from_gguf(tok_md, gguf_target)
        target = read_target_dir(target_model_dir) if target_model_dir is not None else gguf_target
        vocab_where = str(target_gguf)
    else:
        target = read_target_dir(target_model_dir)  # type: ignore[arg-type]
        n_tokens = -1
        vocab_where = str(target_model_dir)

    if is_family(ckpt):  # DFlash2, DSpark, Gemma-4 DSpark (sources/family.py)
        drafter = read_family(ckpt, target)
    else:
        drafter = read_speculators(ckpt, target) if is_speculators(ckpt.config) else read_zlab(ckpt, target)
    resolve_vocabulary(drafter, ckpt, target, keep_embeddings=keep_embeddings)
    if target_gguf is None:
        n_tokens = borrow_from_dir(tok_md, Path(target_model_dir), target.architecture,  # type: ignore[arg-type]
                                   drafter.vocab_size, tokenizer_pre)
    for t in drafter.tensors:
        rows = t.shape[0]
        if t.gguf_name in (EMBEDDING_TENSOR, *VOCAB_ROW_TENSORS) or (t.gguf_name == OUTPUT_TENSOR and drafter.draft_vocab_size is None):
            if rows != n_tokens:
                raise InputFileError(f"{t.hf_name} has {rows} rows but the vocabulary has {n_tokens} tokens",
                                     source_path(t.source))

    first_matrix = next((t.dtype for t in ckpt.tensors if len(t.shape) >= 2), None)
    # a quantization type converts as auto would (bf16 for a bf16 checkpoint, else f16), then
    # quantizes each tensor in the same pass: the bytes of `convert --outtype bf16` + `quantize`
    file_type, matrix_type = choose_file_type("auto" if quant else outtype, first_matrix)

    md = Metadata()
    md.set("architecture", ARCH)
    md.set("type", "model")
    md.set("name", src.resolve().name)
    md.set("converter", CONVERTER_NAME)
    md.set("converter_version", __version__)
    md.set("source_config_sha256", _sha256_file(ckpt.config_path))
    md.set("source_files", [p.name for p in ckpt.files])
    md.set("source_files_sha256", ["0" * SHA256_HEX_LEN for _ in ckpt.files])  # patched after the data
    write_hparams(md, drafter, file_type)
    md.set("quantization_version", QUANTIZATION_VERSION)
    for kv in tok_md:
        md.set_raw(kv.key, kv.vtype, kv.value, kv.sub)
    write_mask_token_id(md, drafter, n_tokens, vocab_where)

    planned = plan_tensors(drafter, matrix_type)
    type_name = _FILE_TYPE_NAMES[file_type]
    fallbacks = 0
    if quant is not None:
        from .quantize import quantize_planned, quantized_metadata

        file_type, planned, fallbacks = quantize_planned(planned, drafter, quant, where=ckpt.config_path)
        md = quantized_metadata(md, file_type)
        type_name = quant
    output = Path(outfile) if outfile is not None else default_output(src, type_name)
    if output.is_dir():  # -o FOLDER: the default file name, in that folder
        output = output / default_output(src, type_name).name
    inputs = Inputs()
    inputs.add_directory(src)
    inputs.add_directory(target_model_dir)
    inputs.add_file(target_gguf)
    inputs.add_files([ckpt.config_path, *ckpt.files])
    return ConversionPlan(drafter, md, planned, file_type, output, target, n_tokens, hasher=hasher,
                          type_name=type_name, fallbacks=fallbacks, inputs=inputs)


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
                       verify=refuse_unless_valid(plan.output))
    finally:
        hasher.thread.join()
    return plan.output


def convert(src_dir: str | os.PathLike, target_model_dir: str | os.PathLike | None = None, *,
            target_gguf: str | os.PathLike | None = None, outfile: str | os.PathLike | None = None,
            outtype: str = "auto", force: bool = False, dry_run: bool = False,
            tokenizer_pre: str | None = None, keep_embeddings: bool = False, progress: bool = False) -> ConversionPlan:
    """Convert a DFlash drafter checkpoint to GGUF. Returns the plan; writes nothing if dry_run."""
    plan = plan_conversion(src_dir, target_model_dir, target_gguf=target_gguf, outfile=outfile,
                           outtype=outtype, tokenizer_pre=tokenizer_pre, keep_embeddings=keep_embeddings,
                           hash_sources=not dry_run)
    if not dry_run:
        write_plan(plan, force=force, progress=progress)
    return plan


__all__ = ["ConfigError", "ConversionPlan", "convert", "plan_conversion", "write_plan"]
