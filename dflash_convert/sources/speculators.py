"""Reader for speculators-format DFlash drafters (speculators_model_type "dflash") -> Drafter.

The draft decoder's hyper-parameters sit under ``transformer_layer_config``, the DFlash ones at the
top. ``aux_hidden_state_layer_ids`` already are llama.cpp's layer-input indices (docs/layer-ids.md);
they are expressed as z-lab ``target_layer_ids`` (aux - 1) so one builder checks both formats.
"""

from __future__ import annotations

import logging

from ..drafter import Drafter
from ..format.family import SPECULATORS_DFLASH, SPECULATORS_DSPARK
from ..target import Target
from .checkpoint import Checkpoint
from .zlab import MAX_VOCAB, ConfigView, build_drafter

log = logging.getLogger("dflash_convert")


def read_speculators(ckpt: Checkpoint, target: Target | None) -> Drafter:
    """A speculators ``dflash`` checkpoint as a Drafter: the layer config flattened, aux layer ids as taps, d2t checked."""
    top = ConfigView(ckpt.config, ckpt.config_path)
    kind = top.get("speculators_model_type")
    if kind != SPECULATORS_DFLASH:
        raise top.error(f"speculators_model_type {kind!r} is not supported (only {SPECULATORS_DFLASH!r} and "
                        f"{SPECULATORS_DSPARK!r}; EAGLE-3 drafters convert with llama.cpp's own converter)")
    layer = top.get("transformer_layer_config")
    if layer is None:
        raise top.error("transformer_layer_config is missing: it holds the draft decoder's hyper-parameters")
    flat = {**layer, **{k: v for k, v in top.cfg.items() if k != "transformer_layer_config"}}
    cv = ConfigView(flat, ckpt.config_path)

    aux = top.get("aux_hidden_state_layer_ids")
    if not aux:
        raise cv.error("aux_hidden_state_layer_ids is missing: the tapped target layers are not guessed")
    if min(aux) < 1:
        raise cv.error(f"aux_hidden_state_layer_ids {aux} include 0 (the token embeddings), not a decoder layer")
    mask = top.get("mask_token_id")
    if mask is None:
        raise cv.error("mask_token_id is missing: the drafter fills its block with this token")
    if top.flag("sample_from_anchor"):
        raise cv.error("sample_from_anchor is true: llama.cpp's draft-dflash always keeps the anchor slot for the "
                       "verified token; this drafter predicts from the anchor (DSpark layout) and would draft wrong")
    target_hidden = top.get("target_hidden_size")
    if target_hidden is not None and target_hidden != cv.get("hidden_size"):
        raise cv.error(f"target_hidden_size {target_hidden} differs from the draft hidden_size {cv.get('hidden_size')}: "
                       "llama.cpp's dflash has no projection for that")
    vocab = cv.int_("vocab_size", maximum=MAX_VOCAB, written_as="the length of a GGUF token array (llama.cpp's limit)")
    draft_vocab = cv.int_("draft_vocab_size", top.get("draft_vocab_size", vocab))
    if draft_vocab > vocab:  # type: ignore[operator]
        raise cv.error(f"draft_vocab_size {draft_vocab} exceeds the target vocab_size {vocab}")
    dflash = ConfigView({"mask_token_id": mask, "block_size": top.get("block_size", 8),
                         "target_layer_ids": [i - 1 for i in aux]}, ckpt.config_path)
    if not top.flag("sliding_window_non_causal") and any(t == "sliding_attention" for t in cv.get("layer_types", [])):
        # speculators masks SWA layers causally and full layers bidirectionally; llama.cpp has one
        # flag for all layers (non-causal unless dflash.attention.causal is true)
        log.warning(
            "%s: sliding layers are causal in speculators but llama.cpp runs every layer non-causally; "
            "drafts of the sliding layers will differ from the reference", ckpt.config_path)
    return build_drafter(ckpt, cv, dflash, target, dialect="speculators",
                         draft_vocab_size=draft_vocab if draft_vocab < vocab else None)  # type: ignore[operator]
