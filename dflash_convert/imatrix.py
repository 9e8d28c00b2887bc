"""``dflash-convert imatrix``: a drafter's importance matrix, which llama-imatrix cannot make for a drafter.

Runs the drafter over the sequences ``capture`` stored (``runtime.imatrix``: llama.cpp's drafting,
llama-imatrix's counting) and writes llama.cpp's imatrix GGUF, or the legacy ``.dat``
(``write_imatrix``), for ``llama-quantize --imatrix``. Refuses an output that is an input, features
of another target or drafter, and a drafter whose decodes never reach 16 rows. Specification:
docs/quantize.md, "Importance matrix".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .errors import DFlashError
from .format.family import MARKOV_W1
from .outputs import Inputs, check_output_path
from .sources.features import open_measurement
from .sources.gguf_drafter import read_drafter
from .write_imatrix import FORMATS, ImatrixFile, write_imatrix

PROMPTS_HASH = "prompts_sha256"  # the features file's metadata key for the prompts' SHA-256


@dataclass
class ImatrixResult:
    """What was written: the file, its entries and the drafts that made them."""

    output: Path
    output_format: str
    size: int
    entries: dict[str, int] = field(default_factory=dict)  # weight name -> rows seen
    sequences: int = 0
    drafts: int = 0
    dataset: str = ""

    def lines(self) -> list[str]:
        """The summary a user reads."""
        return [f"wrote {self.output} ({self.output_format}, {self.size} bytes): {len(self.entries)} weights from "
                f"{self.drafts} drafts over {self.sequences} sequences; dataset {self.dataset}"]


def dataset_name(features: Path, metadata: dict[str, str]) -> str:
    """The imatrix.datasets entry: the prompts' SHA-256 the features record, else the features file's name."""
    digest = metadata.get(PROMPTS_HASH)
    return f"prompts-sha256:{digest}" if digest else features.name


def imatrix(draft: str | Path, features: str | Path, out: str | Path, *, every_anchor: bool = False,
            output_format: str = "gguf", target_model_dir: str | Path | None = None,
            target_gguf: str | Path | None = None, device: str = "auto", batch: int = 16, force: bool = False,
            progress: bool = True, allow_other_target: bool = False) -> ImatrixResult:
    """Collect ``draft``'s importance matrix on the captured sequences of ``features`` and write it to ``out``."""
    if output_format not in FORMATS:
        raise DFlashError(f"--output-format must be one of {', '.join(FORMATS)}, got {output_format!r}")
    inputs = Inputs()
    inputs.add_files([draft, features])
    inputs.add_file(target_gguf)
    inputs.add_directory(target_model_dir)
    out = check_output_path(out, inputs, force=force)
    d = read_drafter(draft)
    m = open_measurement(features, target_model_dir=target_model_dir, target_gguf=target_gguf,
                         allow_other_target=allow_other_target)
    if m.target is not None:  # the recorded target is read as well
        recorded = Inputs()
        (recorded.add_directory if Path(m.target.source).is_dir() else recorded.add_file)(m.target.source)
        check_output_path(out, recorded, force=force)
    dspark_from_anchor = d.tensor(MARKOV_W1) is not None and d.sample_from_anchor is not False
    n_max = d.block_size if dspark_from_anchor else d.block_size - 1
    slots = m.features.check_drafter(d, draft, n_max)
    # torch (seconds to import) only once every input has been read: a bad file is one line at once
    from .runtime.device import resolve_device
    from .runtime.imatrix import collect
    from .runtime.weights import load_weights

    w = load_weights(d, m.target, device=resolve_device(device))
    bar = None
    if progress:
        from tqdm import tqdm  # only a progress bar on a terminal needs it

        bar = tqdm(total=len(m.features.sequences), unit="seq", desc="imatrix", disable=None, leave=False)
    try:
        stats = collect(d, w, m.features, slots, every_anchor=every_anchor, like_cpu=m.like_cpu, batch=batch,
                        done=None if bar is None else lambda _: bar.update(1))
    finally:
        if bar is not None:
            bar.close()
    name = dataset_name(Path(features), m.features.metadata)
    data = ImatrixFile(stats.sums, stats.counts, [name], len(stats.lengths), max(stats.lengths))
    size = write_imatrix(out, data, output_format, replace=force)
    return ImatrixResult(out, output_format, size, dict(stats.counts), len(stats.lengths),
                         sum(len(a) for a in stats.drafts), name)


__all__ = ["ImatrixResult", "dataset_name", "imatrix"]
