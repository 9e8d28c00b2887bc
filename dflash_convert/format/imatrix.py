"""The importance-matrix files ``llama-quantize --imatrix`` reads, as data: GGUF and legacy ``.dat``.

GGUF: ``general.type`` = ``"imatrix"``, the three ``imatrix.*`` keys below, and per weight
``<name>.in_sum2`` (F32 ``{n_in, n_mat}``, Σx² per input column) and ``<name>.counts`` (F32
``{1, n_mat}``, rows seen). Legacy ``.dat``: little-endian int32 sizes, per entry the name, ``ncall``
and the already averaged values. Specification: docs/quantize.md, "Importance matrix".
"""

from __future__ import annotations

GENERAL_TYPE = "imatrix"  # general.type of an imatrix GGUF (imatrix.cpp)
DATASETS = "imatrix.datasets"  # string array: the calibration data, earliest first
CHUNK_COUNT = "imatrix.chunk_count"  # u32: chunks processed
CHUNK_SIZE = "imatrix.chunk_size"  # u32: tokens per chunk
# llama-quantize refuses a GGUF imatrix without all three ("missing imatrix metadata")
REQUIRED_KEYS: tuple[str, ...] = (DATASETS, CHUNK_COUNT, CHUNK_SIZE)
# per weight name: the tensor-name suffixes (common/imatrix-loader.h)
IN_SUM2_SUFFIX = ".in_sum2"
COUNTS_SUFFIX = ".counts"

# keys llama-quantize writes into a file quantized with an imatrix (quantize.cpp)
QUANTIZE_FILE = "quantize.imatrix.file"  # str, at most MAX_FILE_CHARS characters
QUANTIZE_DATASET = "quantize.imatrix.dataset"  # str: the first dataset
QUANTIZE_ENTRIES = "quantize.imatrix.entries_count"  # u32
QUANTIZE_CHUNKS = "quantize.imatrix.chunks_count"  # u32, only when > 0
MAX_FILE_CHARS = 127

# llama-imatrix only collects a MUL_MAT whose input has at least this many rows
MIN_ROWS = 16

# llama-quantize ignores an entry of another length for these (tensor_name_match_token_embd): no imatrix then
LENGTH_MISMATCH_IGNORED: tuple[str, ...] = ("token_embd.weight", "per_layer_token_embd.weight")
