"""The features file ``capture`` writes and ``accept`` reads, as data: one safetensors file.

Per sequence ``i`` (``SEQUENCE.format(i=i)`` prefixes each name): ``tokens`` I64 [L],
``prompt_length`` I64 [1], ``layer_inputs`` F32/F16/BF16 [S, L, E] in llama.cpp's layer-input
convention; ``__metadata__`` holds the keys of ``METADATA`` (``layers``, ``eos_ids`` as JSON lists).
Specification: docs/acceptance.md.
"""

from __future__ import annotations

SCHEMA = "dflash-convert/features/v1"
SEQUENCE = "seq.{i:05d}."
TOKENS, PROMPT_LENGTH, LAYER_INPUTS = "tokens", "prompt_length", "layer_inputs"
SEQUENCE_TENSORS = (TOKENS, PROMPT_LENGTH, LAYER_INPUTS)

# metadata key -> what it says
METADATA: dict[str, str] = {
    "schema": f"always {SCHEMA!r}",
    "target": "the target directory (or repository) the features were captured from, or the target GGUF's absolute path",
    "target_config_sha256": "SHA-256 of that target's config.json (empty for a GGUF)",
    "target_gguf_sha256": "SHA-256 of the target GGUF (capture --target-gguf only)",
    "target_file_type": "the target GGUF's general.file_type, by name (capture --target-gguf only)",
    "target_architecture": "the target's architectures[0]",
    "layers": "JSON list: the stored layer-input indices, in the order of layer_inputs' first dimension",
    "dtype": "the layer_inputs element type: F32, F16 or BF16",
    "prompts_sha256": "SHA-256 of the prompts file as read",
    "sequences": "how many sequences the file holds",
    "new_tokens": "N: each continuation covers what llama-speculative-simple -n N verifies (N + 33 tokens, fewer at an end-of-generation token)",
    "eos_ids": "JSON list: the token ids that end a generation",
}

# tokens captured past ``new_tokens`` N: llama-speculative-simple -n N decodes N + 1, and once its budget
# is spent its last step still drafts a full block (up to 32 tokens) that the target verifies
LOOKAHEAD = 1 + 32
# metadata keys whose value is a plain decimal integer (ASCII digits), with the least value each may take
COUNTS: dict[str, int] = {"sequences": 1, "new_tokens": 1}
MAX_COUNT_DIGITS = 9

# --dtype name -> safetensors dtype of layer_inputs
FEATURE_DTYPES: dict[str, str] = {"f32": "F32", "f16": "F16", "bf16": "BF16"}

# how drafts are computed: "cpu" as llama.cpp's CPU backend (its default F16 KV cache, each matmul's
# activations rounded to the weight type's vec_dot type), "exact" the graph in float32
NUMERICS = ("cpu", "exact")
