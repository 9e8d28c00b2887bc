"""DFlash GGUF dialects written for other runtimes, as data (see ../shared/spec/landscape.md §1.2, §2.1).

Each entry says how to recognise a dialect, how its keys (by the suffix after ``<file arch>.``;
DROP for keys upstream has no use for) and tensors (``{bid}`` for the layer) map onto upstream's,
and ``layer_offset`` to add to its layer ids, or None when the file cannot tell (then ``migrate``
demands ``--target-layers-offset`` and never guesses).
"""

from __future__ import annotations

from dataclasses import dataclass, field

DROP = ""
UPSTREAM_ARCH = "dflash"


@dataclass(frozen=True)
class Dialect:
    """One foreign DFlash dialect: how to recognise it, its key and tensor maps, and whether and how it migrates."""
    name: str
    title: str
    architectures: tuple[str, ...]  # general.architecture values that identify the dialect
    producer: str
    layer_ids_keys: tuple[str, ...]  # key suffixes (after "<arch>.") that may hold the tapped layer ids
    layer_offset: int | None  # upstream target_layers = file ids + layer_offset; None: the file cannot tell
    offset_evidence: str
    key_map: dict[str, str] = field(default_factory=dict)
    width_keys: tuple[str, ...] = ()  # key suffixes holding len(ids) * hidden: checked against fc, then dropped
    tensor_map: dict[str, str] = field(default_factory=dict)
    migratable: bool = True
    not_migratable_because: str = ""
    fix: str = ""


# generic hyper-parameter keys ("<arch>.block_count", ...) map by suffix onto "dflash.<suffix>"
# when format.keys.KEYS knows "{arch}.<suffix>"; these entries add the dialect-specific ones.
BUUN = Dialect(
    name="buun-dflash-draft",
    title="spiritbuun/buun-llama-cpp and BeeLlama 'dflash-draft'",
    architectures=("dflash-draft",),
    producer="buun-llama-cpp's convert_hf_to_gguf.py (DFlashDraftModel -> MODEL_ARCH.DFLASH_DRAFT)",
    layer_ids_keys=("dflash.target_layer_ids",),
    layer_offset=1,
    offset_evidence=("buun's converter writes the checkpoint's target_layer_ids unchanged and its runtime captures "
                     "'l_out-<id>', the output of layer <id>; upstream taps the input of layer <id>+1"),
    key_map={
        "dflash.block_size": "block_size",
        "dflash.mask_token_id": "mask_token_id",
        "dflash.target_layer_ids": "target_layers",
        "dflash.n_target_features": DROP,
    },
    width_keys=("dflash.n_target_features",),
    tensor_map={
        "dflash_fc.weight": "fc.weight",
        "dflash_hidden_norm.weight": "enc.output_norm.weight",
        # buun's graph applies attn_post_norm to the attention residual before the FFN: upstream's ffn_norm
        "blk.{bid}.post_attention_norm.weight": "blk.{bid}.ffn_norm.weight",
    },
    fix="dflash-convert migrate IN.gguf OUT.gguf (layer ids +1, keys and two tensors renamed, tensor data copied as is)",
)

LUCEBOX = Dialect(
    name="lucebox",
    title="Luce-Org/lucebox 'qwen35-dflash-draft' / 'gemma4-dflash-draft'",
    architectures=("qwen35-dflash-draft", "gemma4-dflash-draft"),
    producer="lucebox's convert_dflash_to_gguf.py / quantize_draft_q8.py",
    layer_ids_keys=("dflash.target_layer_ids",),
    layer_offset=None,
    offset_evidence=("lucebox files carry either no ids (only dflash.n_target_layers, the runtime hard-codes the "
                     "set) or ids whose convention its converter does not record"),
    key_map={
        "dflash.block_size": "block_size",
        "dflash.mask_token_id": "mask_token_id",
        "dflash.target_layer_ids": "target_layers",
        "dflash.n_target_layers": DROP,
        "dflash.n_target_features": DROP,
    },
    width_keys=("dflash.n_target_features",),
    tensor_map={
        "dflash.fc.weight": "fc.weight",
        "dflash.hidden_norm.weight": "enc.output_norm.weight",
        "dflash_fc.weight": "fc.weight",
        "dflash_hidden_norm.weight": "enc.output_norm.weight",
        "blk.{bid}.post_attention_norm.weight": "blk.{bid}.ffn_norm.weight",  # lucebox's loader fallback for ffn_norm
    },
    fix=("dflash-convert migrate IN.gguf OUT.gguf --target-layers-offset N (N=1 if the ids are the checkpoint's "
         "target_layer_ids, 0 if they already index layer inputs); or convert the checkpoint again"),
)

PRE_MERGE = Dialect(
    name="pre-merge-dflash",
    title="llama.cpp DFlash before the merge of #22105 (no dflash.target_layers)",
    architectures=(UPSTREAM_ARCH,),
    producer="the DFlash branch of llama.cpp's convert_hf_to_gguf.py before it was merged, or a fork of it",
    layer_ids_keys=("target_layer_ids", "dflash.target_layer_ids"),
    layer_offset=None,
    offset_evidence=("the pre-merge converter wrote the checkpoint's ids unchanged, but other tools wrote the same "
                     "key; the file does not say which convention it holds"),
    key_map={
        "dflash.block_size": "block_size",
        "dflash.mask_token_id": "mask_token_id",
        "mask_token_id": "mask_token_id",
        "target_layer_ids": "target_layers",
        "dflash.target_layer_ids": "target_layers",
        "target_hidden_size": DROP,
        "dflash.n_target_features": DROP,
        "n_target_features": DROP,
    },
    width_keys=("dflash.n_target_features", "n_target_features"),
    fix=("dflash-convert migrate IN.gguf OUT.gguf --target-layers-offset N (or --target-layers L1,L2,... when the "
         "file holds no ids at all); or convert the checkpoint again"),
)

PRISMML_DSPARK = Dialect(
    name="prismml-dspark",
    title="PrismML legacy 'dspark'",
    architectures=("dspark",),
    producer="PrismML-Eng/llama.cpp before its v7 line",
    layer_ids_keys=("target_layers", "dspark.target_layers"),
    layer_offset=1,
    offset_evidence="PrismML's gguf-dspark-to-dflash adds 1 to every target_layers entry",
    migratable=False,
    not_migratable_because=("its legacy tokenizer stubs, DSpark head tensors (markov_head_*, confidence_head, "
                            "log_snr_fc*) and double-prefixed keys are documented only second-hand"),
    fix="PrismML's gguf-dspark-to-dflash LEGACY.gguf TARGET.gguf OUT.gguf (the target donates the tokenizer)",
)

ROCMFPX = Dialect(
    name="rocmfpx-deepseek4",
    title="charlie12345/ROCmFPX 'deepseek4-dflash-draft'",
    architectures=("deepseek4-dflash-draft",),
    producer="ROCmFPX's DeepSeek-V4 DSpark/DFlash port",
    layer_ids_keys=("target_layers",),
    layer_offset=None,
    offset_evidence="not documented",
    migratable=False,
    not_migratable_because="it is the DeepSeek-V4 DSpark backbone, whose keys and tensors this tool does not check",
    fix="convert the checkpoint again with llama.cpp's convert_hf_to_gguf.py --dspark",
)

DIALECTS: tuple[Dialect, ...] = (BUUN, LUCEBOX, PRE_MERGE, PRISMML_DSPARK, ROCMFPX)


def dialect_for_arch(arch: str | None) -> Dialect | None:
    """The foreign dialect an architecture name belongs to (``dflash`` itself is not foreign)."""
    return next((d for d in DIALECTS if arch in d.architectures and arch != UPSTREAM_ARCH), None)
