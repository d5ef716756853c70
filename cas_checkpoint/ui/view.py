"""What the pages show, as plain data for the templates: a state as a tree of ``Node``s whose
large parts are left for the browser to ask for (a subtree at a time, by a path of indexes),
a ``messages`` list as a conversation, and short one-line forms of values. Pure code: no
storage, no HTML (the templates escape every string they are given)."""

from __future__ import annotations

import dataclasses
import enum
import json
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..codec import TypeRegistry

EAGER_NODES = 150  # nodes of a state drawn with the page; deeper or larger parts load on expand
PAGE_ITEMS = 100  # items of a list or dict drawn per request
EAGER_ITEMS = 20  # a container with more items than this is drawn closed
TEXT_SHOWN = 2000  # characters of a str drawn before "show all"
MAX_TEXT = 1 << 20  # characters of one str drawn at most, even on "show all"


@dataclass(slots=True)
class Node:
    """One value of a state: ``key`` (its name in its parent), ``kind`` (``str``, ``list``,
    a class name...), ``text`` (a scalar's text, or None), ``summary`` (a container's size),
    ``children`` (drawn now), ``path`` (for a closed container: what to ask for on expand),
    ``more`` (a path and offset to ask for the next items)."""

    key: str
    kind: str
    text: str | None = None
    summary: str = ""
    children: list[Node] = field(default_factory=list)
    path: str | None = None
    more: tuple[str, int, int] | None = None  # (path, offset of the next items, items left)
    cut: int = 0  # characters of text not drawn
    open: bool = False


def fields_of(value: Any, types: TypeRegistry | None = None) -> tuple[str, Any] | None:
    """(class name, its stored data) of a registered object or a ``Stored`` stand-in, else
    None. Attributes are read; nothing is called but the adapter the store was given."""
    if type(value).__name__ == "Stored" and hasattr(value, "data") and hasattr(value, "name"):
        return str(value.name), value.data
    entry = types._by_class.get(type(value)) if types is not None else None  # noqa: SLF001
    if entry is not None and entry.to_data is not None:
        return type(value).__name__, entry.to_data(value)
    if isinstance(value, enum.Enum):
        return type(value).__name__, value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value).__name__, {f.name: getattr(value, f.name)
                                      for f in dataclasses.fields(value)}
    model_fields = getattr(type(value), "model_fields", None)
    if isinstance(model_fields, dict):
        data = {f: getattr(value, f) for f in model_fields}
        data.update(getattr(value, "__pydantic_extra__", None) or {})
        return type(value).__name__, data
    return None


def _items(value: Any, types: TypeRegistry | None) -> tuple[str, list[tuple[str, Any]]] | None:
    """(kind, [(key text, child)]) of a container, else None."""
    got = fields_of(value, types)
    if got is not None:
        name, data = got
        if isinstance(data, dict):
            return name, [(str(k), v) for k, v in data.items()]
        return name, [("value", data)]
    if isinstance(value, dict):
        return "dict", [(k if isinstance(k, str) else repr(k), v) for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        return type(value).__name__, [(str(i), v) for i, v in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        return type(value).__name__, [(str(i), v) for i, v in
                                      enumerate(sorted(value, key=repr))]
    return None


def scalar_text(value: Any, limit: int = TEXT_SHOWN) -> tuple[str, str, int]:
    """(kind, text, characters cut) of a value that is not a container."""
    if value is None or isinstance(value, bool):
        return "const", json.dumps(value), 0
    if isinstance(value, (int, float)):
        return "number", repr(value), 0
    if isinstance(value, str):
        return "str", value[:limit], max(0, len(value) - limit)
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        return "bytes", f"{len(data):,} bytes: {data[:64].hex()}" + (
            "..." if len(data) > 64 else ""), 0
    text = repr(value)
    return type(value).__name__, text[:limit], max(0, len(text) - limit)


def child(value: Any, steps: Sequence[int], types: TypeRegistry | None = None) -> Any:
    """The value at ``steps`` (indexes into each container's items, in order)."""
    for i in steps:
        got = _items(value, types)
        if got is None or not 0 <= i < len(got[1]):
            raise KeyError(i)
        value = got[1][i][1]
    return value


def path_name(value: Any, steps: Sequence[int], types: TypeRegistry | None = None) -> str:
    """The path of ``steps`` as people read it: ``state.messages[3].content``."""
    out = "state"
    for i in steps:
        got = _items(value, types)
        if got is None or not 0 <= i < len(got[1]):
            raise KeyError(i)
        kind, items = got
        key, value = items[i]
        out += f"[{key}]" if kind in ("list", "tuple", "set", "frozenset") else f".{key}"
    return out


def parse_steps(text: str) -> list[int]:
    """``"0.3.12"`` -> ``[0, 3, 12]`` (``""``: the root); ValueError if it is not that."""
    if not text:
        return []
    steps = [int(s) for s in text.split(".")]
    if any(s < 0 for s in steps) or len(steps) > 4096:
        raise ValueError(text)
    return steps


def _join(steps: Sequence[int]) -> str:
    return ".".join(str(s) for s in steps)


def tree(value: Any, steps: Sequence[int] = (), *, types: TypeRegistry | None = None,
         offset: int = 0, budget: int = EAGER_NODES, full_text: bool = False) -> Node:
    """``value`` (found at ``steps``) as a Node drawn to about ``budget`` nodes: containers
    past it, or with more than ``EAGER_ITEMS`` items, are closed with a path to expand; a
    container shows ``PAGE_ITEMS`` items from ``offset``. Iterative (breadth first), so a deep
    state costs no C stack."""
    root = Node(key="state" if not steps else "", kind="")
    left = [budget]
    queue: deque[tuple[Node, Any, list[int], int, bool]] = deque([(root, value, list(steps),
                                                                   offset, True)])
    while queue:
        node, val, path, start, top = queue.popleft()
        if not top and type(val) in (list, tuple, dict) and len(val) > EAGER_ITEMS:
            node.kind = "dict" if type(val) is dict else type(val).__name__
            node.summary = f"{len(val):,} {'keys' if type(val) is dict else 'items'}"
            node.path = _join(path)  # closed: its items are not even listed
            continue
        got = _items(val, types)
        if got is None:
            node.kind, node.text, node.cut = scalar_text(val, MAX_TEXT if full_text and top
                                                         else TEXT_SHOWN)
            if node.cut:
                node.path = _join(path)
            continue
        kind, items = got
        node.kind = kind
        keyed = kind == "dict" or kind[:1].isupper()  # a dict, or a stored object's fields
        node.summary = f"{len(items):,} {'key' if keyed else 'item'}" + (
            "s" if len(items) != 1 else "")
        if not items:
            continue
        if not top and (len(items) > EAGER_ITEMS or left[0] <= 0):
            node.path = _join(path)
            continue
        node.open = True
        shown = items[start:start + PAGE_ITEMS]
        left[0] -= len(shown)
        for n, (key, item) in enumerate(shown, start):
            kid = Node(key=key, kind="")
            node.children.append(kid)
            queue.append((kid, item, [*path, n], 0, False))
        if start + PAGE_ITEMS < len(items):
            node.more = (_join(path), start + PAGE_ITEMS, len(items) - start - PAGE_ITEMS)
    return root


# --- messages as a conversation ---

MESSAGES_SHOWN = 50


@dataclass(frozen=True, slots=True)
class Message:
    index: int
    role: str
    text: str  # content as text (parts joined); cut to TEXT_SHOWN
    cut: int
    tool_calls: tuple[str, ...]  # "name(args)" of each call
    name: str | None
    steps: str  # path (indexes) of the message, to open it in the tree


def messages_of(state: Any) -> tuple[list[int], list[Any]] | None:
    """(steps, the list) of a state's ``messages`` list: ``state["messages"]``, or LangGraph's
    ``state["channel_values"]["messages"]``; None if it has none."""
    if not isinstance(state, dict):
        return None
    keys = list(state)
    if isinstance(state.get("messages"), list):
        return [keys.index("messages")], state["messages"]
    values = state.get("channel_values")
    if isinstance(values, dict) and isinstance(values.get("messages"), list):
        inner = list(values)
        return [keys.index("channel_values"), inner.index("messages")], values["messages"]
    return None


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                parts.append(short(part, 200))
        return "\n".join(parts)
    return "" if content is None else short(content, TEXT_SHOWN)


def conversation(state: Any, *, types: TypeRegistry | None = None,
                 before: int | None = None) -> tuple[list[int], int, list[Message]] | None:
    """(steps of the list, its length, the ``MESSAGES_SHOWN`` messages before index ``before``
    (default: the last ones)) of a state's messages; None if it has none."""
    found = messages_of(state)
    if found is None:
        return None
    steps, msgs = found
    end = len(msgs) if before is None else max(0, min(before, len(msgs)))
    out = []
    for i in range(max(0, end - MESSAGES_SHOWN), end):
        m = msgs[i]
        got = fields_of(m, types)
        data = got[1] if got is not None else m
        cls = got[0] if got is not None else None
        if not isinstance(data, dict):
            data = {"content": data}
        role = data.get("role") or data.get("type") or cls or "message"
        text = _content(data.get("content"))
        calls = data.get("tool_calls") or ()
        names = []
        if isinstance(calls, list):
            for call in calls[:20]:
                c = fields_of(call, types)
                c_data = c[1] if c is not None else call
                if isinstance(c_data, dict):
                    fn = c_data["function"] if isinstance(c_data.get("function"), dict) \
                        else c_data
                    args = fn.get("args", fn.get("arguments", ""))
                    names.append(f"{fn.get('name', '?')}({short(args, 160)})")
                else:
                    names.append(short(c_data, 160))
        name = data.get("name") if isinstance(data.get("name"), str) else None
        out.append(Message(i, str(role), text[:TEXT_SHOWN], max(0, len(text) - TEXT_SHOWN),
                           tuple(names), name, _join([*steps, i])))
    return steps, len(msgs), out


def short(value: Any, n: int = 160) -> str:
    """A value on one line, at most ``n`` characters (for diffs, metadata and tool calls)."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, default=repr)
        except (ValueError, TypeError, RecursionError):
            text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n] + f"... ({len(text) - n:,} more characters)"
