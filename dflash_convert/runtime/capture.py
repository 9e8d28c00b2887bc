"""Hidden states captured from a target model, the features a drafter reads live.

The target runs through transformers' own class for ``architectures[0]`` (no remote code), from a
private folder holding the checked config and safetensors; the stream entering every layer comes
from forward hooks. Refuses a target whose weights or config fail those checks.

Specification: docs/acceptance.md, "Capturing from a Hugging Face directory".
"""

from __future__ import annotations

import inspect
import json
import os
import tempfile
from pathlib import Path

import torch

from ..errors import DFlashError, InputFileError
from ..sources.checkpoint import INDEX_NAME
from ..sources.safetensors import TensorRef
from ..sources.target import read_target_weights
from ..target import Target

# the fewest bits a stored parameter takes (MXFP4's 4-bit values, their scales aside): a config
# describing more parameters than the weights' bytes can hold at this rate does not fit them
MIN_BITS_PER_PARAMETER = 4


def _decoder_layers(model: torch.nn.Module, n_layers: int, where: Path) -> torch.nn.ModuleList:
    """The decoder's layer list: ``get_decoder().layers``, else the one ModuleList of ``num_hidden_layers`` entries."""
    dec = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(dec, "layers", None)
    if isinstance(layers, torch.nn.ModuleList) and len(layers) == n_layers:
        return layers
    found = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n_layers]
    if len(found) != 1:
        raise InputFileError(f"cannot find the {n_layers} decoder layers of {type(model).__name__}", where)
    return found[0]


def load_target_model(target: Target, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, *,
                      tensors: list[TensorRef] | None = None) -> tuple[torch.nn.Module, torch.nn.ModuleList]:
    """(model, decoder layers) of a Hugging Face target directory, with transformers' own class."""
    where = Path(target.source)
    try:
        import transformers  # optional, and heavy: only capturing target features needs it
    except ImportError:
        raise DFlashError("capturing target features needs transformers: pip install 'dflash-convert[capture]'") from None
    # the one-line error contract: no progress bars or fallback-kernel notices from transformers
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if tensors is None:
        tensors = read_target_weights(target)
    with tempfile.TemporaryDirectory(prefix="dflash-target-") as tmp:
        staged = _stage(target, tensors, Path(tmp))
        # transformers raises whatever its parsers raise on a broken directory (OSError, ValueError,
        # KeyError, TypeError, safetensors' own error): at this boundary each becomes one error line
        try:
            cfg = transformers.AutoConfig.from_pretrained(staged, local_files_only=True, trust_remote_code=False)
        except Exception as e:  # noqa: BLE001
            raise InputFileError(f"transformers cannot read the target config: {_first_line(e)}", where) from None
        arch = (getattr(cfg, "architectures", None) or [None])[0]
        cls = getattr(transformers, arch, None) if isinstance(arch, str) else None
        if cls is None or not hasattr(cls, "from_pretrained"):
            raise InputFileError(f"architecture {arch!r} is not a transformers class (remote code is never run)", where)
        text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        n_layers = int(text.num_hidden_layers)
        _check_size(cls, cfg, tensors, where)
        try:
            model, info = cls.from_pretrained(staged, config=cfg, dtype=dtype, local_files_only=True,
                                              trust_remote_code=False, use_safetensors=True, output_loading_info=True)
        except Exception as e:  # noqa: BLE001
            why = _first_line(e)
            if "ignore_mismatched_sizes" in why:  # its own report went to the (silenced) log
                why = "tensor shapes in the safetensors do not match config.json"
            raise InputFileError(f"transformers cannot load the target weights: {why}", where) from None
    # transformers fills a missing weight with random values and only warns: features from such a
    # model would be noise, so a target without all its weights is refused
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        raise InputFileError(f"the target's safetensors lack {len(missing)} weight(s) of {arch}, first {missing[0]}: "
                             "the model cannot run to capture features", where)
    model = model.to(device).eval()
    return model, _decoder_layers(model, n_layers, where)


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e).strip() else type(e).__name__


def _stage(target: Target, tensors: list[TensorRef], into: Path) -> Path:
    """``into`` holding all transformers may read: config.json as parsed, links to the checked safetensors, our own index."""
    (into / "config.json").write_text(json.dumps(target.config))
    for path in sorted({t.path for t in tensors}):
        os.symlink(os.path.realpath(path), into / path.name)
    (into / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": {t.name: t.path.name for t in tensors}}))
    return into


def _check_size(cls: type, cfg: object, tensors: list[TensorRef], where: Path) -> None:
    """Refuse a config with more parameters than the weights' bytes hold (counted on the meta device)."""
    try:
        with torch.device("meta"):
            skeleton = cls._from_config(cfg)
    except Exception as e:  # noqa: BLE001 - a config transformers cannot build a model from
        raise InputFileError(f"transformers cannot build the model config.json describes: {_first_line(e)}", where) from None
    n_params = sum(p.numel() for p in skeleton.parameters())
    stored = sum(t.nbytes for t in tensors)
    if n_params * MIN_BITS_PER_PARAMETER > stored * 8:
        raise InputFileError(f"config.json describes a {type(skeleton).__name__} of {n_params} parameters, but the "
                             f"safetensors hold {stored} bytes (under {MIN_BITS_PER_PARAMETER} bits a parameter): the "
                             "config does not fit its weights", where)


@torch.no_grad()
def run_target(model: torch.nn.Module, layers: torch.nn.ModuleList, token_ids: torch.Tensor,
               keep: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(layer inputs [n_layers + 1, n, hidden] float32, logits [n, vocab] float32) of one target pass."""
    streams: list[torch.Tensor | None] = [None] * (len(layers) + 1)
    wanted = set(range(len(layers) + 1)) if keep is None else set(keep)

    def stream_of(args: tuple, kwargs: dict) -> torch.Tensor:
        x = args[0] if args else kwargs.get("hidden_states")
        if not isinstance(x, torch.Tensor):
            raise DFlashError(f"a decoder layer of {type(model).__name__} got no hidden-state tensor")
        return x

    hooks = []
    for i, layer in enumerate(layers):
        def pre(_m, args, kwargs, i=i):
            streams[i] = stream_of(args, kwargs)[0].detach().float() if i in wanted else stream_of(args, kwargs)[:0]
        hooks.append(layer.register_forward_pre_hook(pre, with_kwargs=True))

    def post(_m, _args, out):
        x = out[0] if isinstance(out, (tuple, list)) else out
        streams[-1] = x[0].detach().float() if len(layers) in wanted else x[:0]
    hooks.append(layers[-1].register_forward_hook(post))
    try:
        dev = next(model.parameters()).device
        out = model(input_ids=token_ids.to(dev)[None], use_cache=False)
    except (RuntimeError, ValueError, IndexError) as e:  # a config the weights do not fit, an id past the table
        raise DFlashError(f"the target model failed to run: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    finally:
        for h in hooks:
            h.remove()
    missing = [i for i, s in enumerate(streams) if s is None]
    if missing:
        raise DFlashError(f"decoder layer {missing[0]} of {type(model).__name__} did not run")
    order = list(range(len(layers) + 1)) if keep is None else list(keep)
    return torch.stack([streams[i] for i in order]), out.logits[0].detach().float()


def capture_layer_inputs(target: Target, token_ids: torch.Tensor, *, device: torch.device | str = "cpu",
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Load the target, run it over ``token_ids`` and return its layer inputs (see ``run_target``)."""
    model, layers = load_target_model(target, device, dtype)
    return run_target(model, layers, token_ids)[0]




@torch.no_grad()
def greedy_continuation(model: torch.nn.Module, prompt: list[int], n_new: int, eos_ids: set[int]) -> list[int]:
    """The prompt then the target's greedy continuation of up to ``n_new`` tokens (ending at, and keeping, an EOS)."""
    dev = next(model.parameters()).device
    ids = torch.tensor([prompt], dtype=torch.int64, device=dev)
    out = list(prompt)
    past = None
    # the KV cache argument is ``cache`` in transformers 5.x, ``past_key_values`` before
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    try:
        for _ in range(n_new):
            res = model(input_ids=ids, use_cache=True, **({name: past} if past is not None else {}))
            past = getattr(res, name)
            nxt = int(res.logits[0, -1].argmax())
            out.append(nxt)
            if nxt in eos_ids:
                break
            ids = torch.tensor([[nxt]], dtype=torch.int64, device=dev)
    except (RuntimeError, ValueError, IndexError) as e:
        raise DFlashError(f"the target model failed to run: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return out


__all__ = ["capture_layer_inputs", "greedy_continuation", "load_target_model", "run_target"]
