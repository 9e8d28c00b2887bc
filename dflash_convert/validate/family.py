"""validate's ``family`` check: which dflash member a file is, and llama.cpp's load-time rules for it.

Names the member and the speculative type llama.cpp runs it with, and fails every file llama.cpp
refuses or runs without its draft (some tools only log a draft that fails to load, so these are
failures, not warnings). Specification (every rule, with llama.cpp's message): docs/family.md.
"""

from __future__ import annotations

from ..format.family import (
    CONF_PROJ,
    CONF_PROJ_BIAS,
    CONV_BASE_TYPE,
    CONV_BASES,
    CONV_SELECTOR_KEYS,
    CONV_TENSORS,
    DFLASH2,
    DSPARK,
    FAMILY_HF_SHAPES,
    MARKOV_TENSORS,
    MARKOV_W1,
    MARKOV_W2,
    SELECTOR_HIDDEN,
    SELECTOR_NEXT,
    SELECTOR_PREV,
    SELECTOR_TENSORS,
    SPEC_TYPES,
    draft_tokens_per_block,
    member_of,
)
from ..format.keys import key
from ..format.quant_types import n_dims
from ..format.rules import DEFAULT_BLOCK_SIZE, VECTOR_TYPE, WEIGHT_SUFFIX
from ..format.tensors import generic_name, layer_name, layer_of
from .report import Check, check_from


def _trimmed(ne: tuple[int, ...]) -> tuple[int, ...]:
    """A ggml shape without trailing 1s: llama-quantize writes conf_proj {E+R, 1} as {E+R}, the loader accepts both."""
    return ne[:n_dims(ne)]


def _shape(ne: tuple[int, ...]) -> str:
    return "{" + ", ".join(map(str, ne)) + "}"


def family_member(names: set[str]) -> tuple[str, str]:
    """(member, the --spec-type llama.cpp uses for it) from a file's tensor names."""
    member = member_of(names)
    return member, SPEC_TYPES[member]


def _ne(t) -> tuple[int, ...]:
    return tuple(reversed(t.shape))


def check_family(r) -> Check:  # r: semantics.Reading (not imported: semantics imports this module)
    """The ``family`` check: the member and its spec type, and every load-time rule of its DFlash2/DSpark parts."""
    d, f = r.d, r.f
    names = r.names
    member, spec = family_member(names)
    E, V, VD = r.dims.get("E"), r.dims.get("V"), r.dims.get("VD")
    n_layer = r.n_layer or 0
    problems: list[str] = []
    warnings: list[str] = []
    has_block = f.has("block_size")
    block = d.block_size if has_block else None

    # --- DFlash2
    values = {s: f.int_value(s) for s in CONV_SELECTOR_KEYS}
    present = [s for s in CONV_SELECTOR_KEYS if f.has(s)]
    if present and len(present) != len(CONV_SELECTOR_KEYS):
        absent = [key(s) for s in CONV_SELECTOR_KEYS if s not in present]
        problems.append(f"{', '.join(absent)} missing next to {', '.join(key(s) for s in present)}: the DFlash2 conv/selector "
                        "keys come together (llama.cpp's converter writes all four)")
    dflash2_tensors = sorted(n for n in names if n in SELECTOR_TENSORS or generic_name(n) in CONV_TENSORS)
    K, G = values["conv_kernel_size"], values["conv_group_size"]
    SR, top_k = values["selector_rank"], values["selector_top_k"]
    if SELECTOR_HIDDEN in names:
        bad = [key(s) for s in CONV_SELECTOR_KEYS if not values[s] or values[s] <= 0]
        if has_block and (block is None or block <= 0):
            bad.append(key("block_size"))
        elif not has_block:
            bad.append(f"{key('block_size')} (the loader reads 0 when it is missing)")
        if bad:
            problems.append(f"{', '.join(bad)} missing or not positive with {SELECTOR_HIDDEN}: llama.cpp refuses the file "
                            "(\"DFlash2 model is missing conv/selector metadata\")")
        if E and G and G > 0 and E % G:
            problems.append(f"embedding_length {E} is not divisible by conv_group_size {G}: llama.cpp refuses the file "
                            "(\"DFlash2 hidden size must be divisible by conv_group_size\")")
        if E and top_k and top_k > 0 and E < top_k * (top_k + 1):
            problems.append(f"embedding_length {E} < selector_top_k * (selector_top_k + 1) = {top_k * (top_k + 1)}: llama.cpp "
                            "refuses the file (\"DFlash2 hidden size is too small for the selector lattice\")")
        need = [n for n in (SELECTOR_PREV, SELECTOR_NEXT) if n not in names]
        need += [layer_name(i, s) for i in range(n_layer) for s in CONV_TENSORS if layer_name(i, s) not in names]
        problems += [f"{n} is missing (required with {SELECTOR_HIDDEN})" for n in need]
    elif dflash2_tensors:
        problems.append(f"{', '.join(dflash2_tensors[:4])}{' ...' if len(dflash2_tensors) > 4 else ''}: llama.cpp claims DFlash2 "
                        f"tensors only with {SELECTOR_HIDDEN} (\"wrong number of tensors\")")

    # --- DSpark
    w1, w2, conf = r.tensor(MARKOV_W1), r.tensor(MARKOV_W2), r.tensor(CONF_PROJ)
    R = _ne(w1)[0] if w1 is not None else None
    has_conf = d.has_confidence_head
    sfa = d.sample_from_anchor
    if w1 is not None:
        if w2 is None:
            problems.append(f"{MARKOV_W2} is missing: llama.cpp requires it with {MARKOV_W1}")
        elif _ne(w2)[0] != R:
            problems.append(f"the Markov ranks disagree: {MARKOV_W1} has {R} columns, {MARKOV_W2} {_ne(w2)[0]} (llama.cpp "
                            "loads both with markov_w1's rank: \"tensor has wrong shape\")")
        if conf is not None and E is not None and _ne(conf)[0] != E + R:  # type: ignore[operator]
            problems.append(f"{CONF_PROJ} takes {_ne(conf)[0]} inputs, but hidden + Markov rank is {E} + {R} = {E + R} "  # type: ignore[operator]
                            "(the Markov ranks of markov_w1 and conf_proj disagree)")
        if not has_block:
            problems.append(f"{key('block_size')} is missing: the DSpark Markov head asserts it "
                            f"(\"DSpark draft requires '{key('block_size')}' in GGUF metadata\")")
        if has_conf is True and conf is None:
            problems.append(f"{key('has_confidence_head')} is true but there is no {CONF_PROJ}: with --spec-draft-p-min > 0 the "
                            "driver reads a confidence nothing computes")
        elif has_conf is False and conf is not None:
            problems.append(f"{key('has_confidence_head')} is false but {CONF_PROJ} is present: the driver refuses "
                            "--spec-draft-p-min > 0 for a head the file has")
        elif has_conf is None and conf is None:
            warnings.append(f"no {key('has_confidence_head')} and no {CONF_PROJ}: the driver assumes a confidence head when "
                            "the key is missing, so --spec-draft-p-min > 0 reads one nothing computes")
        if r.tensor(CONF_PROJ_BIAS) is not None and conf is None:
            warnings.append(f"{CONF_PROJ_BIAS} without {CONF_PROJ}: loaded, never used")
    else:
        stray = [n for n in MARKOV_TENSORS if n in names]
        if stray:
            problems.append(f"{', '.join(stray)}: llama.cpp claims DSpark tensors only with {MARKOV_W1} (\"wrong number of "
                            "tensors\")")
        extra = [key(s) for s in ("sample_from_anchor", "has_confidence_head") if f.has(s)]
        if extra:
            warnings.append(f"{', '.join(extra)} without a Markov head: read only by draft-dspark, this file runs as {spec}")

    # --- shapes and types
    dims = {"E": E, "V": V, "VD": VD, "R": R, "ER": None if R is None or E is None else E + R, "SR": SR, "CK": K,
            "CP": 2 * K * (E // G) if K and G and E and G > 0 else None}
    for t in d.tensors:
        name, ne = t.gguf_name, _ne(t)
        spec_shape = FAMILY_HF_SHAPES.get(generic_name(name))
        if spec_shape is None or (layer_of(name) is not None and generic_name(name) not in CONV_TENSORS):
            continue
        want = tuple(int(s) if s.isdigit() else dims.get(s) for s in reversed(spec_shape))
        rank_reported = (name == MARKOV_W2 and w1 is not None and ne[0] != R) or (
            name == CONF_PROJ and dims["ER"] is not None and ne[0] != dims["ER"])  # said above, once
        if None not in want and _trimmed(ne) != _trimmed(want) and not rank_reported:  # type: ignore[arg-type]
            problems.append(f"{name} has shape {_shape(ne)}, llama.cpp expects {_shape(want)} (\"tensor has wrong shape\")")  # type: ignore[arg-type]
        if generic_name(name) in CONV_BASES and t.dtype != CONV_BASE_TYPE:
            problems.append(f"{name} is {t.dtype}, must be {CONV_BASE_TYPE} (the graph adds it to F32 "
                            "coefficients; upstream writes it F32 and llama-quantize keeps it)")
        elif not name.endswith(WEIGHT_SUFFIX) and t.dtype != VECTOR_TYPE:  # conf_proj.bias, markov_w2.scale
            problems.append(f"{name} is {t.dtype}, must be {VECTOR_TYPE}")

    summary = _summary(member, spec, R, conf is not None, K, G, SR, top_k, block if has_block else DEFAULT_BLOCK_SIZE, sfa)
    return check_from("family", problems, warnings, summary, f"{member} parts llama.cpp refuses or mis-runs", summary)


def _summary(member: str, spec: str, R: int | None, conf: bool, K: int | None, G: int | None, SR: int | None,
             top_k: int | None, block: int | None, sfa: bool | None) -> str:
    if member == DSPARK:
        parts = f"Markov head rank {R}, {'with' if conf else 'without'} confidence head, sample_from_anchor {str(sfa is not False).lower()}"
    elif member == DFLASH2:
        parts = f"conv kernel {K}, group {G}; selector rank {SR}, top-k {top_k}"
    else:
        parts = "no DFlash2 or DSpark parts"
    n_max = draft_tokens_per_block(member, block, sfa) if block else None
    return f"{member}: {parts}; llama.cpp runs it as --spec-type {spec}" + (f" (--spec-draft-n-max {n_max})" if n_max else "")
