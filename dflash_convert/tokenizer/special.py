"""Special tokens, merges, add-flags and chat template from a target's tokenizer files.

Reproduces what llama.cpp's converter writes after the token list (its SpecialVocab), read from
tokenizer.json, tokenizer_config.json, chat_template.{jinja,json} and config.json. Nothing here
executes or renders anything: the chat template is copied as text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputFileError
from ..files import read_regular_bytes
from ..format.keys import ADD_SPECIAL_TOKEN_KEYS, SPECIAL_TOKEN_ID_KEYS, ValueType, key
from ..metadata import Metadata
from ..sources.checkpoint import read_json
from ..sources.config import ConfigView

DEFAULT_KINDS: tuple[str, ...] = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
# A space inside a merge pair is stored as this character, as llama.cpp does (U+0120 'Ġ').
_SPACE_IN_MERGE = chr(ord(" ") + 256)


@dataclass
class SpecialTokens:
    """The special-token keys borrowed from a target: merges, ids, add-flags, chat template and normalizer flags."""
    merges: list[str] = field(default_factory=list)
    ids: dict[str, int] = field(default_factory=dict)
    add: dict[str, bool] = field(default_factory=dict)
    chat_template: str | list[dict[str, str]] | None = None
    normalizer_lowercase: bool | None = None
    normalizer_strip_accents: bool | None = None
    kinds: tuple[str, ...] = DEFAULT_KINDS

    def set_id(self, kind: str, tid: Any, where: Path) -> None:
        """Record a special token id read from ``where``; a negative id is refused, a non-integer ignored."""
        if not isinstance(tid, int) or isinstance(tid, bool):
            return
        if tid < 0:
            raise InputFileError(f"invalid {kind} token id {tid}", where)
        self.ids.setdefault(kind, tid)

    def write(self, md: Metadata) -> None:
        """Add the keys in llama.cpp's order: merges, ids, add-flags, template, normalizer."""
        if self.merges:
            md.set("tok_merges", self.merges)
        for kind, tid in self.ids.items():
            if kind in SPECIAL_TOKEN_ID_KEYS:
                md.set_raw(SPECIAL_TOKEN_ID_KEYS[kind], ValueType.UINT32, tid)
        for kind, flag in self.add.items():
            if kind in ADD_SPECIAL_TOKEN_KEYS:
                md.set_raw(ADD_SPECIAL_TOKEN_KEYS[kind], ValueType.BOOL, flag)
        _write_chat_template(md, self.chat_template)
        if self.normalizer_lowercase is not None:
            md.set("tok_normalizer_lowercase", self.normalizer_lowercase)
        if self.normalizer_strip_accents is not None:
            md.set("tok_normalizer_strip_accents", self.normalizer_strip_accents)


def _write_chat_template(md: Metadata, template: str | list[dict[str, str]] | None) -> None:
    if template is None:
        md.remove(key("tok_chat_template"))
        return
    if isinstance(template, list):
        default = None
        names: list[str] = []
        for choice in template:
            name = "".join(c if c.isascii() and c.isalnum() else "_" for c in str(choice.get("name", "")))
            text = choice.get("template")
            if not name or text is None:
                continue
            if name == "default":
                default = text
            else:
                if name not in names:
                    names.append(name)
                md.set_raw(f"{key('tok_chat_template')}.{name}", ValueType.STRING, text)
        if names:
            md.set("tok_chat_templates", sorted(names))
        if default is None:
            return
        template = default
    md.set("tok_chat_template", template)


def _merges(tokenizer_json: dict[str, Any], where: Path) -> list[str]:
    merges = (tokenizer_json.get("model") or {}).get("merges")
    if not isinstance(merges, list) or not merges:
        return []
    if isinstance(merges[0], str):
        return list(merges)
    if isinstance(merges[0], list) and len(merges[0]) == 2 and isinstance(merges[0][0], str):
        return [" ".join(part.replace(" ", _SPACE_IN_MERGE) for part in pair) for pair in merges]
    raise InputFileError("tokenizer.json has merges in an unknown format", where)


def _normalizer_flags(st: SpecialTokens, norm: dict[str, Any]) -> None:
    kind = norm.get("type")
    if kind == "Lowercase":
        st.normalizer_lowercase = True
    elif kind == "StripAccents":
        st.normalizer_strip_accents = True
    elif kind == "BertNormalizer":
        if "lowercase" in norm:
            st.normalizer_lowercase = norm["lowercase"]
        if "strip_accents" in norm:
            st.normalizer_strip_accents = norm["strip_accents"]
    elif kind == "Sequence":
        for sub in norm.get("normalizers", []):
            _normalizer_flags(st, sub)


def _special_id(processor_entry: dict[str, Any]) -> Any:
    return processor_entry.get("SpecialToken", {}).get("id")


def _from_post_processor(st: SpecialTokens, post: dict[str, Any], tc: dict[str, Any] | None) -> None:
    """Infer add_bos/add_eos/add_sep from the post-processor, the way llama.cpp does."""
    bos = (tc or {}).get("bos_token")
    cls = (tc or {}).get("cls_token")
    eos = (tc or {}).get("eos_token")
    sep = (tc or {}).get("sep_token")
    if not bos and cls and tc:
        tc["bos_token"] = bos = cls
    if not eos and sep and tc:
        tc["eos_token"] = eos = sep
    for proc in post.get("processors", [post]):
        kind = proc.get("type")
        if kind == "ByteLevel":
            st.add.setdefault("bos", False)
            st.add.setdefault("eos", False)
        elif kind == "RobertaProcessing":
            st.add.update(bos=True, eos=True, sep=True)
            if not cls and tc:
                tc["cls_token"] = cls = proc.get("cls", [bos])[0]
            if not sep and tc:
                tc["sep_token"] = sep = proc.get("sep", [eos])[0]
        elif kind == "TemplateProcessing":
            single, pair = proc.get("single", []), proc.get("pair", [])
            first = last = None
            if len(single) > 1:
                first = _special_id(single[0])
                if first:
                    if not tc:
                        bos = first
                    elif first not in (bos, cls):
                        if not bos:
                            tc["bos_token"] = bos = first
                        if not cls:
                            tc["cls_token"] = cls = first
                    st.add["bos"] = first in (bos, cls)
                last = _special_id(single[-1])
                if last:
                    if not tc:
                        eos = last
                    elif last != eos:
                        if "eot" not in st.kinds:
                            st.kinds = (*st.kinds, "eot")
                            tc["eot_token"] = eos
                        elif "eom" not in st.kinds:
                            st.kinds = (*st.kinds, "eom")
                            tc["eom_token"] = eos
                        tc["eos_token"] = eos = last
                    st.add["eos"] = last == eos
            if pair:
                start = 1 if first and _special_id(pair[0]) == first else 0
                stop = -1 if last and _special_id(pair[-1]) == last else None
                middle = pair[start:stop]
                if middle and middle[0].get("Sequence", {}).get("id") == "A" and middle[-1].get("Sequence", {}).get("id") == "B":
                    middle = middle[1:-1]
                    if middle:
                        add_sep = False
                        entry = _special_id(middle[0])
                        if entry and entry in (sep, eos) and not last:
                            add_sep = True
                        if len(middle) == 2:
                            entry2 = _special_id(middle[1])
                            if entry2 and entry2 in (sep, eos):
                                add_sep = True
                        st.add["sep"] = add_sep
                        if add_sep and not sep and tc:
                            tc["sep_token"] = eos


def _text(path: Path) -> str:
    """A template file's text (never rendered), refusing FIFOs and devices."""
    try:
        return read_regular_bytes(path, path.name).decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputFileError(f"{path.name} is not UTF-8 text", path) from e


def _chat_template_files(target_dir: Path) -> str | list[dict[str, str]] | None:
    jinja = target_dir / "chat_template.jinja"
    if jinja.exists():
        text = _text(jinja)
        extra = sorted((target_dir / "additional_chat_templates").glob("*.jinja"))
        if not extra:
            return text
        return [{"name": "default", "template": text}] + [{"name": p.stem, "template": _text(p)} for p in extra]
    as_json = target_dir / "chat_template.json"
    if as_json.exists():
        data = read_json(as_json, "chat_template.json")
        return ConfigView(data, as_json).get("chat_template") if isinstance(data, dict) else None
    return None


def load_tokenizer_file(target_dir: Path, name: str) -> dict[str, Any] | None:
    """One of a target directory's tokenizer files (tokenizer.json, tokenizer_config.json), None where absent."""
    path = target_dir / name
    data = read_json(path, name) if path.exists() else None
    if data is not None and not isinstance(data, dict):
        raise InputFileError(f"{name} must hold a JSON object", path)
    return data


def load_tokenizer_files(target_dir: Path) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """tokenizer.json and tokenizer_config.json of a target directory (None where absent)."""
    return load_tokenizer_file(target_dir, "tokenizer.json"), load_tokenizer_file(target_dir, "tokenizer_config.json")


def check_tokenizer_config(tc: dict[str, Any], tc_path: Path) -> None:
    """Raise ConfigError for a tokenizer_config.json field read_special_tokens uses whose JSON type is wrong."""
    tcv = ConfigView(tc, tc_path)
    for kind in DEFAULT_KINDS + ("eot", "eom"):
        tcv.get(f"add_{kind}_token")
        tcv.get(f"{kind}_token")
    tcv.get("chat_template")


def read_special_tokens(target_dir: Path, tj: dict[str, Any] | None, tc: dict[str, Any] | None) -> SpecialTokens:
    """Everything llama.cpp writes after the token list; ``tc`` is filled in with the special tokens the post-processor implies."""
    st = SpecialTokens()
    tj_path = target_dir / "tokenizer.json"
    tc_path = target_dir / "tokenizer_config.json"
    added: list[dict[str, Any]] = []
    if tj is not None:
        st.merges = _merges(tj, tj_path)
        if isinstance(tj.get("normalizer"), dict):
            _normalizer_flags(st, tj["normalizer"])
        added = [a for a in tj.get("added_tokens") or [] if isinstance(a, dict)]
    tc = None if tc is None else dict(tc)
    if tc is not None:  # the fields used below, typed before the post-processor fills in the ones it implies
        check_tokenizer_config(tc, tc_path)
    if tj is not None and isinstance(tj.get("post_processor"), dict):
        _from_post_processor(st, tj["post_processor"], tc)
    if tc:
        tcv = ConfigView(tc, tc_path)
        template = tcv.get("chat_template", _chat_template_files(target_dir))
        if template is None or isinstance(template, (str, list)):
            st.chat_template = template
        for kind in st.kinds:
            flag = tcv.get(f"add_{kind}_token")
            if flag is not None:
                st.add.setdefault(kind, flag)
            entry = tcv.get(f"{kind}_token")
            content = ConfigView(entry, tc_path, f"{kind}_token.").get("content") if isinstance(entry, dict) else entry
            if not isinstance(content, str):
                continue
            tid = next((a.get("id") for a in added if a.get("content") == content), None)
            st.set_id(kind, tid, tc_path)
    cfg_path = target_dir / "config.json"
    if cfg_path.exists():
        cfg = read_json(cfg_path, "config.json")
        if isinstance(cfg, dict):
            top = ConfigView(cfg, cfg_path)
            text_cfg = top.sub("text_config")
            for kind in st.kinds:
                tid = top.get(f"{kind}_token_id")
                if tid is None:
                    tid = text_cfg.get(f"{kind}_token_id")
                st.set_id(kind, tid, cfg_path)
    return st
