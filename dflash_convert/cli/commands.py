"""The commands and what each takes: the table ``dflash-convert -h`` lists and the parser reads.

Only the table: each command's handler (cli/handlers.py), its one-line summary, its parameters with
their help, defaults, ranges and choices (cli/command_line.py), and the options commands share.
"""

from __future__ import annotations

from pathlib import Path

from ..format.features import NUMERICS
from ..format.keys import U32_MAX
from ..format.quant_types import DEFAULT_RELEASE_TYPES, DEFAULT_SWEEP_TYPES
from ..format.rules import EMBEDDING_TENSOR, OUTPUT_TENSOR
from . import handlers
from .command_line import Command, argument, flag, int_list, multi, option
from .values import layer_numbers, layers_or_all, outtype, quant_type, release_types, sweep_types

PROG = "dflash-convert"
SUMMARY = "Convert, inspect and check DFlash drafter GGUF files for llama.cpp."

_FORCE = flag("force", "--force", help="Replace an existing output file.")
_OTHER_TARGET_HELP = "Measure with a target whose config.json is not the one the features were captured from."
_ALLOW_OTHER_TARGET = flag("allow_other_target", "--allow-other-target", help=_OTHER_TARGET_HELP)
_DEVICE = option("device", "--device", default="auto", help="auto (CUDA when present), cpu or cuda.")
_JSON = flag("json_out", "--json", help="Print the report as JSON.")
_THREADS = option("threads", "--threads", type=int, minimum=1, help="Encoder threads (default: every core).")
_REPO = "org/name[@revision]"
# what quantize --min-acceptance chooses itself: none of these go with it
_PER_TENSOR = ("keep_types", "tensor_types", "tensor_type_file", "output_tensor_type", "token_embedding_type",
               "leave_output_tensor", "pure", "override_kv", "prune_layers", "allow_requantize", "skip_validation")

COMMANDS: tuple[Command, ...] = (
    Command("convert", handlers.convert, "Convert a DFlash drafter (z-lab or speculators format) to llama.cpp's dflash GGUF.", (
        argument("src_dir", "Drafter checkpoint directory (config.json + safetensors), or a Hugging Face repo id "
                 f"{_REPO} (from the cache first; downloaded unless HF_HUB_OFFLINE=1).", metavar="SRC_DIR"),
        option("target_model_dir", "--target-model-dir", type=Path, help="Target model dir: config.json + tokenizer files "
               f"(no weights read). Required, unless --target-gguf is given. A repo id {_REPO} also works.",
               unless=("target_gguf",)),
        option("target_gguf", "--target-gguf", type=Path, help="Converted target GGUF: copy its tokenizer.* keys verbatim."),
        option("outfile", "-o", "--outfile", metavar="PATH", help="Output file or folder (default: SRC_DIR/dflash-<Name>-<TYPE>.gguf, "
               "dspark- for DSpark: the names llama.cpp's -hf finds as a draft; in the current folder for a repo id)."),
        option("outtype", "--outtype", type=outtype, default="auto", help="f32, f16, bf16, q8_0, auto (bf16 for bf16 checkpoints, else f16), "
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
        option("imatrix", "--imatrix", metavar="FILE", help="With a quantization --outtype: an importance matrix (GGUF or "
               "legacy .dat), as quantize --imatrix."),
    )),
    Command("inspect", handlers.inspect, "Show architecture, keys, tensors, and the llama-server line that pairs the drafter.", (
        argument("path", "A GGUF file.", metavar="PATH"),
        flag("drafter", "--drafter", help="Print the Drafter read_drafter makes of the file, as JSON."),
    )),
    Command("validate", handlers.validate, "Check that a drafter GGUF loads and pairs in llama.cpp: exit 0 pass, 1 findings, 2 unreadable input.", (
        argument("path", "The drafter GGUF to check.", metavar="PATH"),
        option("target", "--target", type=Path, help="Target GGUF or Hugging Face model directory: check the pairing too."),
        flag("json_out", "--json", help="Print the result as JSON (schema: dflash_convert/validate/validate.schema.json)."),
        flag("deep", "--deep", help="Also scan every tensor for NaN and Inf."),
    )),
    Command("migrate", handlers.migrate, "Rewrite another fork's DFlash GGUF as upstream dflash (tensor data copied byte for byte), "
            "then validate it.", (
        argument("src", "A DFlash GGUF written for another fork (dflash-draft, qwen35-dflash-draft, pre-merge dflash).", metavar="SRC"),
        argument("out", "The upstream dflash GGUF to write.", type=str, metavar="OUT"),
        option("target_layers_offset", "--target-layers-offset", type=int, minimum=0, maximum=1,
               help="0 or 1, added to the file's layer ids when its dialect cannot tell."),
        option("target_layers", "--target-layers", type=int_list, metavar="L1,L2,...",
               help="llama.cpp target_layers, when the file holds none."),
        option("target_gguf", "--target-gguf", type=Path, help="Copy every tokenizer.* key from this converted target GGUF."),
        option("mask_token_id", "--mask-token-id", type=int, minimum=0, maximum=U32_MAX,
               help="The mask token id, when the file holds none."),
        _FORCE,
    )),
    Command("quantize", handlers.quantize, "Quantize a drafter GGUF, bit-identical to llama-quantize (with or without --imatrix); no C build needed.\n\n"
            "An input that fails validate is refused, and so is an output that would (--skip-validation: neither is checked).", (
        argument("src", "A dflash drafter GGUF in F32, F16 or BF16.", metavar="SRC"),
        argument("out", "The GGUF to write, or a folder: dflash-<Name>-<TYPE>.gguf in it (the input's name with its type "
                 "tag replaced).", type=str, metavar="OUT"),
        argument("qtype", "F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K_S, Q3_K_M, Q3_K_L, Q4_K_S, Q4_K_M, Q5_K_S, "
                 "Q5_K_M, Q6_K, IQ4_NL, IQ4_XS, IQ3_S, IQ3_M, TQ1_0, TQ2_0, Q1_0, Q2_0 (IQ3_XXS, IQ3_XS, Q2_K_S, "
                 "IQ2_XXS, IQ2_XS, IQ2_S, IQ2_M, IQ1_S and IQ1_M need an importance matrix: --imatrix).", type=quant_type, metavar="TYPE"),
        _THREADS,
        flag("dry_run", "--dry-run", help="Print the per-tensor plan and write nothing."),
        multi("keep_types", "--keep-type", metavar="PATTERN=TYPE", help="Our glob shorthand: quantized tensors matching the "
              "glob get TYPE after llama-quantize's choice, e.g. 'blk.[01].attn_*=Q8_0' (repeatable)."),
        multi("tensor_types", "--tensor-type", metavar="PATTERN=TYPE", help="llama-quantize's: a regular expression searched in "
              "the tensor name; the first that matches gives the type (repeatable, in order).", in_order="tensor_type_order"),
        option("tensor_type_file", "--tensor-type-file", type=Path, help="PATTERN=TYPE items, whitespace-separated.",
               in_order="tensor_type_order"),
        option("output_tensor_type", "--output-tensor-type", metavar="TYPE", help=f"The type of {OUTPUT_TENSOR}."),
        option("token_embedding_type", "--token-embedding-type", metavar="TYPE", help=f"The type of {EMBEDDING_TENSOR}."),
        flag("leave_output_tensor", "--leave-output-tensor", help=f"Do not quantize {OUTPUT_TENSOR}."),
        flag("pure", "--pure", help="No mix rules: every quantized tensor takes the type's default."),
        multi("override_kv", "--override-kv", metavar="KEY=TYPE:VALUE",
              help="Set a key in the output (int, float, bool, str), as llama-quantize does."),
        option("prune_layers", "--prune-layers", type=layer_numbers, metavar="L0,L1,...", help="Drop these layers, renumber the rest."),
        flag("allow_requantize", "--allow-requantize", help="Accept an already quantized input (quality suffers)."),
        option("imatrix", "--imatrix", metavar="FILE", help="An importance matrix (llama-imatrix's GGUF or legacy .dat): the "
               "weighted quantizers and mix rules llama-quantize --imatrix uses; required by IQ3_XXS, IQ3_XS and Q2_K_S."),
        multi("include_weights", "--include-weights", metavar="NAME", help="Use only the imatrix entries whose name "
              "contains NAME (repeatable; not with --exclude-weights)."),
        multi("exclude_weights", "--exclude-weights", metavar="NAME", help="Drop the imatrix entries whose name contains "
              "NAME (repeatable)."),
        option("features", "--features", type=Path, help="With --min-acceptance: the features file capture wrote.",
               needs=("min_acceptance",)),
        option("min_acceptance", "--min-acceptance", type=float, metavar="R", help="Raise tensor groups from TYPE's mix until "
               "the held-out acceptance is R times the input's (e.g. 0.98); prints the recipe.", minimum=0, min_open=True,
               maximum=1, needs=("features",), excludes=_PER_TENSOR, why="it chooses the per-tensor types itself"),
        option("target_model_dir", "--target-model-dir", type=Path, help=f"With --min-acceptance: the target dir or repo id {_REPO} "
               "(default: the one the features were captured from).", group="search"),
        option("target_gguf", "--target-gguf", type=Path, help="With --min-acceptance: the target GGUF.", group="search"),
        option("device", "--device", default="auto", help="With --min-acceptance: auto (CUDA when present), cpu or cuda.",
               group="search"),
        flag("allow_other_target", "--allow-other-target", help=f"With --min-acceptance: {_OTHER_TARGET_HELP[0].lower()}"
             f"{_OTHER_TARGET_HELP[1:]}", group="search"),
        option("max_steps", "--max-steps", type=int, minimum=1, metavar="N", help="With --min-acceptance: stop after N "
               "search steps (each raises one tensor group); refused as not reached if the mix still falls short.",
               needs=("min_acceptance",), group="search"),
        flag("skip_validation", "--skip-validation", help="Quantize an input that fails validate, and write the output "
             "unvalidated (a warning says so; llama.cpp may refuse or mis-run the file)."),
        _FORCE,
        flag("quiet", "-q", "--quiet", help="No progress bar, no notes, no warnings."),
    )),
    Command("sweep", handlers.sweep, "Quantize to each type (temporary files), measure each one's acceptance: size against accepted tokens.", (
        argument("src", "A dflash drafter GGUF in F32, F16 or BF16.", metavar="SRC"),
        option("features", "--features", type=Path, required=True, help="The features file capture wrote."),
        option("types", "--types", type=sweep_types, default=",".join(DEFAULT_SWEEP_TYPES), metavar="T1,T2,...", help="The types to measure."),
        option("target_model_dir", "--target-model-dir", type=Path, help=f"Target dir or repo id {_REPO} for the shared "
               "embedding and head (default: the one the features were captured from)."),
        option("target_gguf", "--target-gguf", type=Path, help="Target GGUF for the shared embedding and head."),
        _DEVICE,
        option("numerics", "--numerics", default="cpu", choices=NUMERICS,
               help="cpu: round as llama.cpp's CPU backend; exact: float32."),
        flag("json_out", "--json", help="Print the table as JSON."),
        option("plot", "--plot", type=Path, metavar="FILE.png", help="Draw acceptance against size (needs matplotlib)."),
        option("imatrix", "--imatrix", metavar="FILE", help="Also measure each type quantized with this importance matrix "
               "(a second column and curve; the types that need one only there)."),
        _THREADS,
        flag("force", "--force", help="Replace an existing plot file."),
        _ALLOW_OTHER_TARGET,
    )),
    Command("check", handlers.check, "Run the GGUF in-process and the checkpoint's reference forward on the same inputs: "
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
        _ALLOW_OTHER_TARGET,
    )),
    Command("capture", handlers.capture, "Run the target once over the prompts; keep its greedy continuations and the layer inputs "
            "drafters read.", (
        option("target_gguf", "--target-gguf", type=Path, help="The target GGUF (any type, as you serve it): run by "
               "llama.cpp's own library.", excludes=("target_model_dir",)),
        option("target_model_dir", "--target-model-dir", type=Path, unless=("target_gguf",),
               help="Or the target's Hugging Face directory, with its safetensors: run by transformers in float32."),
        option("prompts_file", "--prompts", type=Path, required=True, help="One prompt per line, or JSONL (a string or "
               "{\"prompt\": ...} per line)."),
        option("out", "-o", "--output", required=True, metavar="PATH", help="The features file to write (.safetensors)."),
        option("new_tokens", "--new-tokens", type=int, default=64, minimum=1,
               help="N: each continuation is what llama-speculative-simple -n N decodes."),
        option("layers", "--layers", type=layers_or_all, help="all (the default), or L1,L2,...: the layer inputs to store "
               "(llama.cpp's indices)."),
        option("for_draft", "--for", type=Path, help="Store only the layers this drafter GGUF taps."),
        _DEVICE,
        option("dtype", "--dtype", default="f32", choices=("f32", "f16", "bf16"), help="How the layer inputs are stored."),
        option("libllama", "--libllama", type=Path, help="With --target-gguf: the libllama to run (default: "
               "$DFLASH_CONVERT_LIBLLAMA, else llama-cpp-python's).", needs=("target_gguf",)),
        option("n_gpu_layers", "--n-gpu-layers", type=int, default=-1, minimum=-1, help="With --target-gguf: layers to "
               "offload to the GPU of a CUDA or Metal build (-1: all)."),
        option("threads", "--threads", type=int, minimum=1, help="With --target-gguf: CPU threads (default: every core).",
               needs=("target_gguf",)),
        option("ctx_size", "--ctx-size", type=int, minimum=1, help="With --target-gguf: the context (default: the longest "
               "prompt and its new tokens).", needs=("target_gguf",)),
        _FORCE,
        flag("quiet", "-q", "--quiet", help="No progress bar, no warnings."),
    )),
    Command("accept", handlers.accept, "How many drafted tokens each file gets accepted on the captured sequences, as "
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
        option("numerics", "--numerics", default="cpu", choices=NUMERICS, help="cpu: round as llama.cpp's CPU backend "
               "(F16 KV cache, quantized activations); exact: the graph in float32."),
        _JSON,
        _ALLOW_OTHER_TARGET,
    )),
    Command("imatrix", handlers.imatrix, "A drafter's importance matrix for llama-quantize --imatrix, from the captured "
            "sequences (llama-imatrix cannot run a drafter).", (
        argument("draft", "The drafter GGUF (any type).", metavar="DRAFT.gguf"),
        option("features", "--features", type=Path, required=True, help="The features file capture wrote (calibration "
               "prompts, not the ones you measure acceptance on)."),
        option("out", "-o", "--output", required=True, metavar="PATH", help="The imatrix file to write."),
        flag("every_anchor", "--every-anchor", help="Draft from every position of each continuation, not only where "
             "llama-speculative-simple's loop drafts."),
        option("output_format", "--output-format", default="gguf", choices=("gguf", "dat"), help="gguf (llama-imatrix's "
               "default) or dat (its legacy format)."),
        option("target_model_dir", "--target-model-dir", type=Path, help=f"Target dir or repo id {_REPO} for the shared "
               "embedding and head (default: the one the features were captured from)."),
        option("target_gguf", "--target-gguf", type=Path, help="Target GGUF for the shared embedding and head."),
        _DEVICE,
        _FORCE,
        _ALLOW_OTHER_TARGET,
        flag("quiet", "-q", "--quiet", help="No progress bar."),
    )),
    Command("publish", handlers.publish, "Convert once, quantize each type, validate every file against the target; write the files, "
            "their validate reports, SHA256SUMS and a model card into a new RELEASE_DIR; optionally upload it. Nothing is "
            "released or uploaded when any file fails.", (
        argument("src_dir", f"Drafter checkpoint directory (config.json + safetensors), or a Hugging Face repo id {_REPO}.",
                 metavar="SRC_DIR"),
        option("target_model_dir", "--target-model-dir", type=Path, required=True, help=f"The target model dir (or {_REPO}) "
               "every file is converted for and validated against (with --check: its embedding safetensors too)."),
        option("out_dir", "-o", "--output", required=True, metavar="RELEASE_DIR", help="The release directory to create."),
        option("types", "--types", type=release_types, default=",".join(DEFAULT_RELEASE_TYPES), metavar="T1,T2,...", help="The files: float types "
               "are converted from the checkpoint, the others quantized from the first float type (else from a scratch "
               "auto conversion)."),
        flag("check", "--check", help="Also run check against the checkpoint; its fidelity goes in the card, and a file "
             "that fails stops the release (needs torch)."),
        option("upload", "--upload", metavar="ORG/NAME", help="Push the release with huggingface_hub once every file passed "
               "(token: HF_TOKEN or the login cache; HF_ENDPOINT honoured)."),
        option("upload_timeout", "--upload-timeout", type=float, default=120.0, minimum=0, min_open=True, maximum=86400,
               metavar="SECONDS", help="With --upload: how long one request may wait for the hub (connect: at most 30 s).",
               needs=("upload",)),
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
    Command("version", handlers.version, "Print the version."),
)
