"""Text the commands print: a checkpoint's line, a state as JSON-like text with large values
elided, a path into a state (``messages[-1].content``), and the parent DAG drawn like
``git log --graph``. Pure code."""

from __future__ import annotations

import ast
import dataclasses
import enum
import json
import re
from collections.abc import Sequence
from typing import Any

from cas_checkpoint.cli.common import CliError
from cas_checkpoint.engine.model import CheckpointInfo
from cas_checkpoint.format.extypes import TypeRegistry
from cas_checkpoint.humanize import human_bytes, plural
from cas_checkpoint.query.lanes import graph as graph  # (re-exported: log --graph)
from cas_checkpoint.query.walk import Stored

# --- one checkpoint per line ---


def info_line(info: CheckpointInfo, *, head: bool = False, extra: str = "") -> str:
    parts = [info.id[:12], f"step {info.step:>3}", info.created_at.strftime("%Y-%m-%d %H:%M:%S"),
             human_bytes(info.size).rjust(8)]
    for name in ("status", "kind"):
        value = getattr(info, name, None)
        if value:
            parts.append(f"{name}={value}")
    reason = getattr(info, "reason", None)
    if reason:
        parts.append(f"reason={reason!r}")
    if info.label:
        parts.append(f"label={info.label}")
    if info.tags:
        parts.append("tags=" + ",".join(info.tags))
    if info.metadata:
        parts.append(" ".join(f"{k}={_short(v, 60)}" for k, v in info.metadata.items()))
    if len(info.parent_ids) > 1:
        parts.append("merge " + " ".join(p[:12] for p in info.parent_ids))
    if head:
        parts.append("(head)")
    if extra:
        parts.append(extra)
    return "  ".join(parts)


def _short(value: Any, n: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=repr)
    return text if len(text) <= n else text[:n] + "..."


# --- states ---

MAX_TEXT, MAX_ITEMS, MAX_DEPTH = 400, 20, 24


def render(value: Any, *, full: bool = False) -> str:
    """A state as indented JSON-like text. Unless ``full``: strings past ``MAX_TEXT`` characters
    and lists past ``MAX_ITEMS`` items are cut with a count of what was left out, and nesting
    deeper than ``MAX_DEPTH`` is shown as a count."""
    out: list[str] = []
    _render(value, 0, out, full, "")
    return "".join(out)


def _scalar(value: Any, full: bool) -> str | None:
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        if not full and len(value) > MAX_TEXT:
            return json.dumps(value[:MAX_TEXT], ensure_ascii=False) + \
                f" ... ({plural(len(value) - MAX_TEXT, 'more character', fmt=',')})"
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (bytes, bytearray)):
        head = bytes(value[:32]).hex()
        return f"<{plural(len(value), 'byte', fmt=',')}: {head}{'...' if len(value) > 32 else ''}>"
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        return None
    return repr(value) if full else _short(repr(value), MAX_TEXT)


def _render(value: Any, depth: int, out: list[str], full: bool, pad: str) -> None:
    while type(value) is Stored:  # an object of a class the store was not given
        out.append(f"<{value.name}> ")
        value = value.data
    text = _scalar(value, full)
    if text is not None:
        out.append(text)
        return
    items: list[Any] = (list(value.items()) if isinstance(value, dict) else
                        sorted(value, key=repr) if isinstance(value, (set, frozenset)) else
                        list(value))
    is_map = isinstance(value, dict)
    opening, closing = ("{", "}") if is_map else ("(", ")") if isinstance(value, tuple) else \
        ("[", "]")
    if not items:
        out.append(opening + closing)
        return
    if depth >= MAX_DEPTH:
        out.append(f"{opening} ... {plural(len(items), 'key' if is_map else 'item', fmt=',')} "
                   f"{closing}")
        return
    shown: list[tuple[int, Any]] = list(enumerate(items))
    cut = 0
    if not full and not is_map and len(items) > MAX_ITEMS:
        keep_head, keep_tail = MAX_ITEMS // 2, MAX_ITEMS // 4
        cut = len(items) - keep_head - keep_tail
        shown = shown[:keep_head] + [(-1, None)] + shown[len(items) - keep_tail:]
    inner = pad + "  "
    out.append(opening + "\n")
    for n, (i, item) in enumerate(shown):
        out.append(inner)
        if i < 0:
            out.append(f"... {cut:,} more items ...")
        elif is_map:
            key, val = item
            out.append((json.dumps(key, ensure_ascii=False) if isinstance(key, str)
                        else repr(key)) + ": ")
            _render(val, depth + 1, out, full, inner)
        else:
            if not full and len(items) > MAX_ITEMS:
                out.append(f"[{i}] ")
            _render(item, depth + 1, out, full, inner)
        out.append(",\n" if n < len(shown) - 1 else "\n")
    out.append(pad + closing)


# --- paths into a state ---

_TOKEN = re.compile(r"""\.?([A-Za-z_][\w-]*)"""  # .name (or name, first)
                    r"""|\.?\[\s*(-?\d+)\s*\]"""  # [3], [-1] (.[3]: a field named 3)
                    r"""|\.?\[\s*("(?:[^"\\]|\\.)*"|'[^']*')\s*\]"""  # ["key"], ['key']
                    r"""|\.("(?:[^"\\]|\\.)*")"""  # ."a field"
                    r"""|\.?\[([^\[\]]+)\]""")  # [1.5], [(1, 2)], [b'k']: a key's repr


def parse_path(text: str) -> list[Any]:
    """``messages[-1].content`` or ``["messages"][-1]["content"]`` -> ``["messages", -1,
    "content"]``; every form ``search`` and ``diff`` print is read back: ``.name`` and
    ``."a name"`` (a field of a stored object), ``[3]``, ``["key"]``, ``[repr]`` of another key
    (``[1.5]``, ``[(1, 2)]``, read as a Python literal, never run)."""
    steps: list[Any] = []
    pos = 0
    text = text.strip()
    if text.startswith("state"):
        text = text[len("state"):]
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or (m.group(1) and pos and not text.startswith(".", pos)):
            raise CliError(f"cannot read the path {text!r} at {text[pos:]!r}; write it like "
                           "messages[-1].content or ['messages'][0] (as search prints them)")
        name, index, quoted, field, literal = m.groups()
        if name is not None:
            steps.append(name)
        elif index is not None:
            steps.append(int(index))
        elif quoted is not None:
            steps.append(json.loads(quoted) if quoted.startswith('"') else quoted[1:-1])
        elif field is not None:
            steps.append(json.loads(field))
        else:
            try:
                steps.append(ast.literal_eval(literal.strip()))
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                raise CliError(f"cannot read the key [{literal}] in the path {text!r}: write a "
                               "key as [3], [\"name\"] or a Python literal such as [(1, 2)]"
                               ) from None
        pos = m.end()
    return steps


def path_text(steps: Sequence[Any]) -> str:
    """Steps as a path, the way ``search`` prints dict keys: ``["messages"][3]["content"]``."""
    return "".join(f"[{json.dumps(s, ensure_ascii=False)}]" if isinstance(s, str)
                   else f"[{s!r}]" for s in steps)


def stored_fields(value: Any, types: TypeRegistry | None = None) -> Any:
    """A registered object's stored data, as the codec writes it and as ``search`` names its
    fields (``.content``): a dataclass's or pydantic model's fields, an Enum's value, an
    adapted class's data; None for anything else. Attributes are read, nothing is called but
    the adapter the store was given for that class."""
    if type(value) is Stored:  # a class the store was not given: its data as stored
        return value.data
    entry = types._by_class.get(type(value)) if types is not None else None  # noqa: SLF001
    if entry is not None and entry.to_data is not None:
        return entry.to_data(value)
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    model_fields = getattr(type(value), "model_fields", None)
    if isinstance(model_fields, dict):
        if getattr(type(value), "__pydantic_root_model__", False):
            return value.root
        data = {f: getattr(value, f) for f in model_fields}
        data.update(getattr(value, "__pydantic_extra__", None) or {})
        return data
    return None


def follow(state: Any, steps: Sequence[Any], types: TypeRegistry | None = None) -> Any:
    value = state
    done = ""
    for step in steps:
        try:
            data = None if isinstance(value, (dict, list, tuple, str, bytes)) else \
                stored_fields(value, types)
            if data is not None:  # a stored object: its fields (search's .name)
                value = data[step] if isinstance(data, dict) else {"value": data}[step]
            elif isinstance(value, dict):
                value = value[step]
            elif isinstance(value, (list, tuple, str, bytes)) and isinstance(step, int):
                value = value[step]
            else:
                raise CliError(f"state{done} is a {type(value).__name__}; it has no "
                               f"{'index' if isinstance(step, int) else 'key'} {step!r}")
        except (KeyError, IndexError, TypeError):
            raise CliError(f"state{done} has no {'item' if isinstance(step, int) else 'key'} "
                           f"{step!r}") from None
        done += path_text([step])
    return value


# --- the parent DAG ---
