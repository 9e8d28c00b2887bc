"""The one checkpoint dispatcher: which reader turns a checkpoint directory into a Drafter.

Two tables, as llama.cpp's ``TEXT_MODEL_MAP``: by ``architectures`` entry or ``speculators_model_type``.
Every reader of checkpoints goes through ``read_checkpoint_drafter``. Precedence, as upstream's: a family
architecture, then ``speculators_model_type``, then ``DFlashDraftModel`` (read as DFlash2 with its keys).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..drafter import Drafter
from ..errors import ConfigError
from ..format.family import (
    DFLASH,
    DFLASH2,
    DFLASH2_ARCHITECTURES,
    DSPARK,
    DSPARK_ARCHITECTURES,
    DSV4_DSPARK_ARCHITECTURES,
    GEMMA4_DSPARK_ARCHITECTURES,
    SPECULATORS_DFLASH,
    SPECULATORS_DSPARK,
    ZLAB_ARCHITECTURES,
)
from ..target import Target
from .checkpoint import Checkpoint, merged_text_config
from .config import ConfigView
from .family import carries_dflash2_parts, read_dflash2, read_dspark, read_gemma4_dspark, refuse_dsv4
from .speculators import read_speculators
from .vocabulary import resolve_vocabulary
from .zlab import read_zlab

SPECULATORS_KIND = "speculators_model_type"


@dataclass(frozen=True)
class CheckpointReader:
    """One way a checkpoint becomes a Drafter."""

    member: str  # the family member it reads (format.family: DFlash, DFlash2, DSpark)
    layout: str  # how the checkpoint is laid out, for messages
    read: Callable[[Checkpoint, Target | None], Drafter]
    priority: int = 0  # among the architectures a config lists, the highest wins
    speculators_wins: bool = False  # a speculators_model_type in the config takes precedence over this name


ZLAB = CheckpointReader(DFLASH, "z-lab DFlash", read_zlab, priority=0, speculators_wins=True)
SPECULATORS = CheckpointReader(DFLASH, "speculators DFlash", read_speculators)
DFLASH2_READER = CheckpointReader(DFLASH2, "DFlash2", read_dflash2, priority=1)
DSPARK_READER = CheckpointReader(DSPARK, "DSpark", read_dspark, priority=2)
GEMMA4_DSPARK = CheckpointReader(DSPARK, "Gemma-4 DSpark", read_gemma4_dspark, priority=3)
DSV4_DSPARK = CheckpointReader(DSPARK, "DeepSeek-V4 DSpark", refuse_dsv4, priority=4)

# config.json "architectures" entry -> reader
ARCHITECTURE_READERS: dict[str, CheckpointReader] = {
    **{a: ZLAB for a in ZLAB_ARCHITECTURES},
    **{a: DFLASH2_READER for a in DFLASH2_ARCHITECTURES},
    **{a: DSPARK_READER for a in DSPARK_ARCHITECTURES},
    **{a: GEMMA4_DSPARK for a in GEMMA4_DSPARK_ARCHITECTURES},
    **{a: DSV4_DSPARK for a in DSV4_DSPARK_ARCHITECTURES},
}
# speculators_model_type -> reader; any other kind goes to the speculators reader, which names it
SPECULATORS_READERS: dict[str, CheckpointReader] = {SPECULATORS_DFLASH: SPECULATORS, SPECULATORS_DSPARK: DSPARK_READER}


def checkpoint_reader(ckpt: Checkpoint) -> CheckpointReader:
    """The reader for this checkpoint; one error line naming what the config says when none fits."""
    cv = ConfigView(merged_text_config(ckpt.config), ckpt.config_path)
    archs = cv.get("architectures", [])
    kind = cv.get(SPECULATORS_KIND)
    by_arch = max((ARCHITECTURE_READERS[a] for a in archs if a in ARCHITECTURE_READERS), key=lambda r: r.priority, default=None)
    if by_arch is not None and not (by_arch.speculators_wins and kind is not None):
        reader = by_arch
    elif kind is not None:
        reader = SPECULATORS_READERS.get(kind, SPECULATORS)
    else:
        known = ", ".join(ARCHITECTURE_READERS)
        raise ConfigError(f"not a DFlash drafter: architectures is {cv.get('architectures')!r}, expected one of {known} "
                          f"or {SPECULATORS_KIND} {SPECULATORS_DFLASH!r} or {SPECULATORS_DSPARK!r}", ckpt.config_path)
    if reader is ZLAB and carries_dflash2_parts(ckpt):
        reader = DFLASH2_READER
    return reader


def read_checkpoint_drafter(ckpt: Checkpoint, target: Target | None, *, keep_embeddings: bool = False) -> Drafter:
    """The Drafter of a checkpoint as convert writes it: its member's reading, then its vocabulary part settled."""
    d = checkpoint_reader(ckpt).read(ckpt, target)
    resolve_vocabulary(d, ckpt, target, keep_embeddings=keep_embeddings)
    return d
