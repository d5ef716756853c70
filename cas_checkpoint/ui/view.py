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

from cas_checkpoint.format.codec import TypeRegistry
from cas_checkpoint.query.part import Unread

EAGER_NODES = 150  # nodes of a state drawn with the page; deeper or larger parts load on expand
PAGE_ITEMS = 100  # items of a list or dict drawn per request
EAGER_ITEMS = 20  # a container with more items than this is drawn closed
TEXT_SHOWN = 2000  # characters of a str drawn before "show all"
MAX_TEXT = 1 << 20  # characters of one str drawn at most, even on "show all"


@dataclass(slots=True)
class Node:
    """One value of a state: ``key`` (its name in its parent), ``kind`` (``str``, ``list``,
    a class name...), ``text`` (a scalar's text, or None), ``summary`` (a container's size),
    ``children`` (drawn now), ``src`` (for a closed part: what to ask for on expand),
    ``more`` (what to ask for the next items)."""

    key: str
    kind: str
    text: str | None = None
    summary: str = ""
    children: list[Node] = field(default_factory=list)
    src: dict[str, Any] | None = None  # what draws it (closed, or a cut text)
    more: tuple[dict[str, Any], int] | None = None  # what draws the next items, items left
    cut: int = 0  # characters of text not drawn
    open: bool = False


def fields_of(value: Any, types: TypeRegistry | None = None) -> tuple[str, Any] | None:
    """(class name, its stored data) of a registered object or a ``Stored`` stand-in, else
    None. Attributes are read; nothing is called but the adapter the store was given."""
    if type(value).__name__ == "Stored" and hasattr(value, "data") and hasattr(value, "name"):
        return str(value.name), value.data
    adapted, data = types.adapted_data(value) if types is not None else (False, None)
    if adapted:
        return type(value).__name__, data
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


def encode(steps: Sequence[Any]) -> str:
    """Path steps (str keys, int keys and indexes) as the JSON the pages pass back."""
    return json.dumps(list(steps), ensure_ascii=False, separators=(",", ":"))


def decode(text: str) -> list[Any]:
    """A path from a page: a JSON list of str and int (``""``: the root); ValueError else."""
    if not text:
        return []
    steps = json.loads(text)
    if not isinstance(steps, list) or len(steps) > 4096 or not all(
            type(s) in (str, int) for s in steps):
        raise ValueError(f"the path {text[:100]!r} is not a JSON list of keys and indexes")
    return steps


def addressable(key: Any) -> bool:
    return type(key) in (str, int)


def follow(value: Any, sub: Sequence[Any], types: TypeRegistry | None = None) -> Any:
    """The value at ``sub`` inside ``value``, in memory (the fields of stored objects too)."""
    for key in sub:
        got = fields_of(value, types)
        if got is not None:
            value = got[1] if isinstance(got[1], dict) else {"value": got[1]}
        if isinstance(value, dict):
            value = value[key]
        elif isinstance(value, (list, tuple)) and type(key) is int:
            value = value[key]
        else:
            raise KeyError(key)
    return value


def path_name(path: Sequence[Any], sub: Sequence[Any] = ()) -> str:
    """A path as people read it: ``state["messages"][3].content`` (fields of objects with
    a dot)."""
    return "state" + "".join(f"[{json.dumps(k, ensure_ascii=False)}]" for k in path) + "".join(
        f".{k}" if type(k) is str else f"[{k}]" for k in sub)


def src(path: Sequence[Any], sub: Sequence[Any], **extra: Any) -> dict[str, Any]:
    """Query parameters of the fragment that draws the value at (``path``, ``sub``)."""
    return {"path": encode(path), "sub": encode(sub), **extra}


def _size(kind: str, length: int | None) -> str:
    if length is None:
        return ""
    unit = {"str": "character", "bytes": "byte", "dict": "key"}.get(kind, "item")
    return f"{length:,} {unit}" + ("s" if length != 1 else "")


def tree(value: Any, path: Sequence[Any] = (), sub: Sequence[Any] = (), *,
         types: TypeRegistry | None = None, first: int = 0, length: int | None = None,
         budget: int = EAGER_NODES, full_text: bool = False) -> Node:
    """The value at (``path``: keys into the stored state, ``sub``: keys inside a stored
    object there) as a Node drawn to about ``budget`` values. A list ``value`` is the slice
    from item ``first`` of a list of ``length`` items; a dict shows ``PAGE_ITEMS`` keys from
    ``first``. Parts not read (``Unread``), containers past the budget or with more than
    ``EAGER_ITEMS`` items are closed with the parameters that draw them. Iterative (breadth
    first): a deep state costs no C stack."""
    root = Node(key=path_name(path, sub), kind="")
    left = [budget]
    queue: deque[tuple[Node, Any, list[Any], list[Any], bool]] = deque(
        [(root, value, list(path), list(sub), True)])
    while queue:
        node, val, at, inner, top = queue.popleft()
        if type(val) is Unread:
            node.kind, node.summary = val.kind, _size(val.kind, val.length)
            node.src = src(at, inner)
            continue
        if not top and type(val) in (list, tuple, dict) and len(val) > EAGER_ITEMS:
            node.kind = "dict" if type(val) is dict else type(val).__name__
            node.summary = _size(node.kind, len(val))
            node.src = src(at, inner)  # closed: its items are not even listed
            continue
        got = _items(val, types)
        if got is None:
            node.kind, node.text, node.cut = scalar_text(val, MAX_TEXT if full_text and top
                                                         else TEXT_SHOWN)
            if node.cut and not (full_text and top):
                node.src = src(at, inner, full="1")
            continue
        kind, items = got
        node.kind = kind
        keyed = kind == "dict" or kind[:1].isupper()  # a dict, or a stored object's fields
        listed = type(val) in (list, tuple) and top
        total = (length if length is not None else len(items)) if listed else len(items)
        node.summary = _size("dict" if keyed else "list", total)
        if not items:
            continue
        if not top and (len(items) > EAGER_ITEMS or left[0] <= 0):
            node.src = src(at, inner)
            continue
        node.open = True
        start = first if top else 0
        shown = items[:PAGE_ITEMS] if listed else items[start:start + PAGE_ITEMS]
        left[0] -= len(shown)
        in_object = bool(inner) or fields_of(val, types) is not None
        raw = _raw_keys(val, types)
        base = start
        for n, (key, item) in enumerate(shown):
            k = raw[n if listed else base + n]
            kid = Node(key=str(base + n) if type(val) in (list, tuple) else key, kind="")
            node.children.append(kid)
            if type(val) in (list, tuple):
                k = base + n
            if not addressable(k):
                kid.key += " (not addressable)"
            queue.append((kid, item, at if in_object else [*at, k],
                          [*inner, k] if in_object else [], False))
        end = base + len(shown)
        if end < total:
            node.more = (src(path, sub, offset=end) if top else src(at, inner, offset=end),
                         total - end)
    return root


def _raw_keys(value: Any, types: TypeRegistry | None) -> list[Any]:
    got = fields_of(value, types)
    if got is not None:
        return list(got[1]) if isinstance(got[1], dict) else ["value"]
    if isinstance(value, dict):
        return list(value)
    if isinstance(value, (list, tuple)):
        return list(range(len(value)))
    return list(range(len(value)))  # a set: by position (not addressable past this page)


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
    src: dict[str, Any]  # what draws the message (its fields)


def messages_path(root: Any) -> list[str] | None:
    """Where a state's messages list is, from its root read one node deep: ``["messages"]``,
    or LangGraph's ``["channel_values", "messages"]``; None if it has none."""
    if not isinstance(root, dict):
        return None

    def is_list(v: Any) -> bool:
        return isinstance(v, list) or (type(v) is Unread and v.kind == "list")

    if is_list(root.get("messages")):
        return ["messages"]
    values = root.get("channel_values")
    if (isinstance(values, dict) and is_list(values.get("messages"))) or (
            type(values) is Unread and values.kind == "dict"):
        return ["channel_values", "messages"]
    return None


def known_length(root: Any, path: Sequence[Any]) -> int | None:
    """The length of the list at ``path`` when the root read one node deep tells it."""
    value = root
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    if type(value) is Unread:
        return value.length
    return len(value) if isinstance(value, list) else None


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


def conversation(msgs: Sequence[Any], first: int, path: Sequence[Any], *,
                 types: TypeRegistry | None = None) -> list[Message]:
    """Messages ``msgs`` (items ``first`` on of the list at ``path``) for the page."""
    out = []
    for n, m in enumerate(msgs):
        i = first + n
        if type(m) is Unread:  # a message in a node of its own: opened on demand
            out.append(Message(i, "message", "", 0, (), None, src([*path, i], [])))
            continue
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
                           tuple(names), name, src([*path, i], [])))
    return out


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
