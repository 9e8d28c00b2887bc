"""The JSON type of every config value dflash-convert reads, as a plain table (gguf-py style).

One table keyed by the key's name serves a drafter's config.json (every dialect and nested object),
a target's config.json and the tokenizer_config.json fields the vocabulary uses.
``sources/config.py`` looks every value up here and refuses another type with one line; a key not
in the table is a bug of ours (an assertion). JSON rules (null, bool, int vs float):
docs/conversion.md.
"""

from __future__ import annotations

# JSON types, as named in messages
BOOL = "bool"
INT = "int"
FLOAT = "float"  # any JSON number: an integer is fine where a float is expected
STRING = "string"
OBJECT = "object"
LIST = "list"  # a list of anything (its entries are checked where they are used)
LIST_INT = "list[int]"
LIST_STRING = "list[string]"
LIST_OBJECT = "list[object]"

# the types of a list's entries
LIST_ENTRY: dict[str, str] = {LIST_INT: INT, LIST_STRING: STRING, LIST_OBJECT: OBJECT}

# how a message names a type
TYPE_NAMES: dict[str, str] = {
    BOOL: "a bool (true/false)", INT: "an integer", FLOAT: "a number", STRING: "a string", OBJECT: "an object",
    LIST: "a list", LIST_INT: "a list of integers", LIST_STRING: "a list of strings", LIST_OBJECT: "a list of objects",
}

# special token kinds a tokenizer_config.json / config.json may name (tokenizer/special.py's kinds)
SPECIAL_TOKEN_KINDS: tuple[str, ...] = ("bos", "eos", "unk", "sep", "pad", "cls", "mask", "eot", "eom")

# key name -> accepted type(s)
CONFIG_KEYS: dict[str, str | tuple[str, ...]] = {
    # --- what kind of checkpoint, and its nested objects
    "architectures": LIST_STRING,
    "model_type": STRING,
    "speculators_model_type": STRING,
    "text_config": OBJECT,
    "dflash_config": OBJECT,
    "transformer_layer_config": OBJECT,
    # --- geometry (drafter and target config.json)
    "num_hidden_layers": INT, "n_layers": INT, "n_layer": INT, "num_layers": INT,
    "hidden_size": INT, "n_embd": INT, "dim": INT,
    "intermediate_size": INT, "prefix_dense_intermediate_size": INT, "dense_intermediate_size": INT,
    "n_inner": INT, "hidden_dim": INT,
    "num_attention_heads": INT, "n_head": INT, "n_heads": INT,
    "num_key_value_heads": INT, "n_kv_heads": INT,
    "head_dim": INT,
    "global_head_dim": INT, "num_global_key_value_heads": INT,
    "max_position_embeddings": INT, "n_ctx": INT, "n_positions": INT, "max_length": INT,
    "max_sequence_length": INT, "model_max_length": INT,
    "rms_norm_eps": FLOAT, "norm_eps": FLOAT,
    "vocab_size": INT, "draft_vocab_size": INT,
    "target_hidden_size": INT,
    "tie_word_embeddings": BOOL,
    "has_embed_tokens": BOOL,
    "hidden_act": STRING, "hidden_activation": STRING,
    "attention_k_eq_v": BOOL, "attention_bias": BOOL, "enable_moe_block": BOOL,
    # --- the drafter's own (dflash_config, or the top level)
    "target_layer_ids": LIST_INT,
    "aux_hidden_state_layer_ids": LIST_INT,
    "mask_token_id": INT,
    "block_size": INT,
    "is_causal": BOOL, "causal": BOOL,
    "attention_value_scale": FLOAT, "input_embedding_scale": FLOAT, "output_multiplier": FLOAT,
    "final_logit_softcapping": FLOAT,
    "conv_kernel_size": INT, "conv_group_size": INT, "selector_rank": INT, "selector_top_k": INT,
    "sample_from_anchor": BOOL,
    "sliding_window_non_causal": BOOL,
    "markov_head_type": STRING,
    # --- sliding-window attention
    "use_sliding_window": BOOL, "use_swa": BOOL,
    "sliding_window": INT, "swa_window_size": INT,
    "layer_types": LIST_STRING,
    # --- RoPE (top level, rope_parameters / rope_scaling, and their per-layer-type objects)
    "rope_parameters": OBJECT, "rope_scaling": OBJECT,
    "full_attention": OBJECT, "sliding_attention": OBJECT,
    "rope_theta": FLOAT, "global_rope_theta": FLOAT, "rope_global_theta": FLOAT, "rope_theta_global": FLOAT,
    "rotary_emb_base": FLOAT,
    "local_rope_theta": FLOAT, "rope_local_theta": FLOAT, "rope_theta_local": FLOAT, "swa_rope_theta": FLOAT,
    "rope_local_base_freq": FLOAT,
    "rope_type": STRING, "type": STRING,
    "factor": FLOAT,
    "original_max_position_embeddings": INT,
    "extrapolation_factor": FLOAT, "attention_factor": FLOAT, "attn_factor": FLOAT,
    "beta_fast": FLOAT, "beta_slow": FLOAT,
    "mrope_section": LIST_INT,
    "partial_rotary_factor": FLOAT, "rope_pct": FLOAT, "rope_percent": FLOAT,
    "rope_is_neox_style": BOOL,
    # --- tokenizer_config.json (and the special ids of config.json)
    "chat_template": (STRING, LIST_OBJECT),
    "clean_up_tokenization_spaces": BOOL,
    "extra_special_tokens": (LIST, OBJECT),
    "additional_special_tokens": LIST,
    **{f"add_{kind}_token": BOOL for kind in SPECIAL_TOKEN_KINDS},
    # a token is its text, or an AddedToken object with a "content" string
    **{f"{kind}_token": (STRING, OBJECT) for kind in SPECIAL_TOKEN_KINDS},
    "content": STRING,
    # config.json special ids: eos_token_id is often a list (several end-of-generation ids)
    # (mask_token_id, the drafter's, is one integer: above)
    **{f"{kind}_token_id": (INT, LIST_INT) for kind in SPECIAL_TOKEN_KINDS if kind != "mask"},
}
