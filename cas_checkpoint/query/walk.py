"""A state tree read one node at a time, for operations that skip or reuse work by node id
(``diff``, ``search``). Pure code."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from cas_checkpoint.errors import FormatError
from cas_checkpoint.format import codec
from cas_checkpoint.format.objects import ObjectId, decode_node
from cas_checkpoint.tree.load import concat as join_parts
from cas_checkpoint.tree.shapes import (
    BYTES,
    DICT,
    LIST,
    LOAD_BUDGET,
    MAX_DEPTH,
    STR,
    TUPLE,
    VALUE,
    concat_lengths,
)

__all__ = ["Joined", "Link", "Outline", "Reader", "Stored", "Tally", "field_seg", "index_seg",
           "key_seg", "kind_of", "same", "slice_seg", "snippet"]

ID_COST = 32  # budget charged per child id of a visited node (as load.py does)
KINDS: dict[int, type] = {LIST: list, TUPLE: tuple, DICT: dict, STR: str, BYTES: bytes}


@dataclass(frozen=True, slots=True)
class Link:
    """Child node ``oid`` of a ``VALUE`` node: its value stands here."""

    oid: ObjectId


@dataclass(frozen=True, slots=True)
class Joined:
    """Children ``oids`` of a node joined into one value of ``shape`` (a split list, tuple,
    dict, str or bytes)."""

    shape: int
    oids: tuple[ObjectId, ...]
    lengths: tuple[int, ...] | None = None  # of each child's part; None in older nodes


Lazy = Link | Joined


@dataclass(frozen=True, slots=True)
class Stored:
    """A registered object as stored: its class ``name`` and its ``data`` (the fields of a
    dataclass or model as a dict, an Enum's value...), decoded without building the class."""

    name: str
    data: Any


@dataclass(frozen=True, slots=True)
class Outline:
    """One node decoded on its own: ``shape`` (``VALUE`` or a concatenation), its children,
    and (``VALUE``) its value with ``Link``/``Joined`` placeholders for the children."""

    oid: ObjectId
    shape: int
    children: tuple[ObjectId, ...]
    value: Any = None
    size: int = 0  # bytes of the node
    lengths: tuple[int, ...] | None = None  # a concatenation's children's parts, if given


def kind_of(value: Any) -> type:
    """The Python type a value (or a ``Joined`` placeholder) stands for."""
    if type(value) is Joined:
        return KINDS[value.shape]
    return type(value)


def same(a: Any, b: Any, types: codec.TypeRegistry | None = None) -> bool:
    """Whether two values without containers to walk are equal (same type; floats by bits, so
    NaN equals NaN and 0.0 differs from -0.0). Registered objects are equal when their stored
    data is (whatever their class's ``__eq__`` says: it may compare identity, or fail)."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b) or a != a and b != b
    if types is not None and type(a) in types:
        try:
            return codec.encode(a, types=types) == codec.encode(b, types=types)
        except Exception:  # noqa: S110 - cannot encode it now: compare as Python does
            pass
    try:
        return bool(a == b)
    except Exception:  # a registered class whose __eq__ fails
        return a is b


def key_seg(key: Any) -> str:
    """The path segment of a dict key: ``["name"]`` for a str, ``[repr(key)]`` otherwise."""
    if type(key) is str:
        return f"[{json.dumps(key, ensure_ascii=False)}]"
    return f"[{key!r}]"


def index_seg(index: int) -> str:
    return f"[{index}]"


def slice_seg(start: int, stop: int) -> str:
    return f"[{start}:{stop}]"


def field_seg(key: Any) -> str:
    """The path segment of a field of a registered object's stored data (module docstring)."""
    if type(key) is str:
        return f".{key}" if key.isidentifier() else f".{json.dumps(key, ensure_ascii=False)}"
    return f".[{key!r}]"


def snippet(text: str, start: int, end: int, context: int = 40) -> str:
    """``text[start:end]`` with about ``context`` characters either side, on one line."""
    lo, hi = max(0, start - context), min(len(text), end + context)
    piece = "".join(c if c.isprintable() else " " for c in text[lo:hi])
    return ("…" if lo else "") + piece + ("…" if hi < len(text) else "")


class Tally:
    """Distinct nodes read (and their bytes) by one operation, over every side it reads."""

    __slots__ = ("budget", "bytes", "counted", "counting", "seen")

    def __init__(self, budget: int = LOAD_BUDGET) -> None:
        self.seen: set[str] = set()
        self.bytes = 0
        self.budget = budget
        self.counting = False  # reads now are only to count a list part's items
        self.counted = 0  # distinct nodes first read while counting

    def charge(self, cost: int, oid: str) -> None:
        self.budget -= cost
        if self.budget < 0:
            raise FormatError(f"the state tree under {oid} expands too far beyond its distinct "
                              "bytes; the store is corrupt or hostile")


class Reader:
    """Nodes of one state, decoded one at a time. ``get`` returns a node's verified bytes (the
    store re-hashes every node it hands out); every read is counted in ``tally``."""

    def __init__(self, get: Callable[[ObjectId], bytes], types: codec.TypeRegistry | None,
                 tally: Tally, raw_objects: bool = False) -> None:
        self.get, self.types, self.tally = get, types, tally
        self.raw_objects = raw_objects

    def raw(self, oid: ObjectId, depth: int = 0) -> tuple[tuple[ObjectId, ...], memoryview]:
        if depth > MAX_DEPTH:
            raise FormatError(f"state tree under {oid} is deeper than {MAX_DEPTH} levels; the "
                              "store is corrupt or hostile")
        data = self.get(oid)
        if oid not in self.tally.seen:
            self.tally.seen.add(oid)
            self.tally.bytes += len(data)
            self.tally.counted += self.tally.counting
        children, payload = decode_node(data)
        if not payload:
            raise FormatError(f"state node {oid} has no shape byte; the node is corrupt")
        self.tally.charge(len(payload) + ID_COST * len(children), oid)
        return children, payload

    def outline(self, oid: ObjectId, depth: int = 0) -> Outline:
        children, payload = self.raw(oid, depth)
        return outline(oid, children, payload, self.types, self.raw_objects)

    def count(self, oid: ObjectId, depth: int = 0,
              memo: Callable[[str], int | None] = lambda _: None,
              remember: Callable[[str, int], None] = lambda _o, _n: None) -> int:
        """Items of a node that is part of a split list (a leaf, or an index node: the leaves
        under it are read, iteratively). ``memo`` answers counts known already; every count
        found, of each node under ``oid`` too, is passed to ``remember``."""
        got = memo(oid)
        if got is not None:
            return got
        # frames: [node, its children, next child, items so far]
        stack: list[list[Any]] = [[oid, self._count_children(oid, depth), 0, 0, depth]]
        while True:
            frame = stack[-1]
            node, children, at, total, level = frame
            if isinstance(children, int):  # a leaf
                total, at = children, 0
                children = ()
            if at < len(children):
                frame[2] += 1
                child = children[at]
                known = memo(child)
                if known is not None:
                    frame[3] += known
                else:
                    stack.append([child, self._count_children(child, level + 1), 0, 0,
                                  level + 1])
                continue
            stack.pop()
            remember(node, total)
            if not stack:
                return int(total)
            stack[-1][3] += total

    def _count_children(self, oid: ObjectId, depth: int) -> tuple[ObjectId, ...] | int:
        """A list part's children (an index node written before lengths), or its item count (a
        leaf, or an index node that gives its children's lengths)."""
        children, payload = self.raw(oid, depth)
        shape = payload[0]
        if shape == VALUE:
            got = array_count(payload)
            if got is None:
                value = outline(oid, children, payload, self.types).value
                if type(value) not in (list, tuple):
                    raise FormatError(f"state node {oid} is part of a list but holds a "
                                      f"{type(value).__name__}; the node is corrupt")
                got = len(value)
            return got
        shape, lengths = concat_lengths(oid, payload, len(children))
        if shape in (LIST, TUPLE):
            return children if lengths is None else sum(lengths)
        raise FormatError(f"state node {oid} (shape {shape}) is part of a list but is not "
                          "one; the node is corrupt")


def array_count(payload: memoryview) -> int | None:
    """Items of a ``VALUE`` node that encodes one array, checked by skipping over each item
    (no value is built); None if the payload is not an array."""
    if len(payload) < 2 or not (payload[1] & 0xF0 == 0x90 or payload[1] in (0xDC, 0xDD)):
        return None
    unpacker = msgpack.Unpacker(None, max_buffer_size=len(payload), strict_map_key=False)
    unpacker.feed(payload[1:])
    try:
        n = unpacker.read_array_header()
        for _ in range(n):
            unpacker.skip()
    except Exception as exc:
        raise FormatError(f"a list node does not decode ({exc}); the node is corrupt") from None
    if unpacker.tell() != len(payload) - 1:
        raise FormatError("trailing bytes after a list node's items; the node is corrupt")
    return int(n)


def _stored(name: str, data: Any) -> Stored:
    return Stored(name, data)


def outline(oid: ObjectId, children: tuple[ObjectId, ...], payload: memoryview,
            types: codec.TypeRegistry | None, raw_objects: bool = False) -> Outline:
    """One node decoded on its own (see the module docstring)."""
    shape = payload[0]
    if shape != VALUE:
        shape, lengths = concat_lengths(oid, payload, len(children))
        return Outline(oid, shape, children, None, len(payload), lengths)
    objects = _stored if raw_objects else None
    if not children:
        return Outline(oid, VALUE, children,
                       codec.decode(payload[1:], types=types, objects=objects), len(payload))
    used: set[int] = set()
    links = [0]

    def take(start: int, count: int) -> tuple[ObjectId, ...]:
        if not 0 <= start <= start + count <= len(children) or used.intersection(
                range(start, start + count)):
            raise FormatError(f"node {oid} names children {start}..{start + count - 1} of "
                              f"{len(children)}, or one of them twice; it is corrupt")
        used.update(range(start, start + count))
        links[0] += 1
        return children[start:start + count]

    def span(kind: int, start: int, count: int, lengths: tuple[int, ...] | None = None
             ) -> Joined:
        if not LIST <= kind <= BYTES:
            raise FormatError(f"node {oid} joins children into unknown shape {kind}")
        return Joined(kind, take(start, count), lengths)

    value = codec.decode(payload[1:], types=types, resolve=lambda i: Link(take(i, 1)[0]),
                         span=span, objects=objects)
    if count_lazy(value) != links[0]:
        raise FormatError(f"node {oid} places a child node inside a set, a dict key or an "
                          "object, where cas_checkpoint never does; it is corrupt or hostile")
    return Outline(oid, VALUE, children, value, len(payload))


def count_lazy(value: Any) -> int:
    """``Link``/``Joined`` placeholders reachable through lists, tuples and dict values."""
    found = 0
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is Link or kind is Joined:
            found += 1
        elif kind is list or kind is tuple:
            stack.extend(v for v in item if type(v) in _WALK)
        elif kind is dict:
            stack.extend(v for v in item.values() if type(v) in _WALK)
    return found


_WALK = frozenset({list, tuple, dict, Link, Joined})


def has_lazy(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is Link or kind is Joined:
            return True
        if kind is list or kind is tuple:
            stack.extend(v for v in item if type(v) in _WALK)
        elif kind is dict:
            stack.extend(v for v in item.values() if type(v) in _WALK)
    return False


def fill(value: Any, load: Callable[[Link | Joined], Any]) -> Any:
    """``value`` with each placeholder replaced by ``load(placeholder)`` (lists and dicts are
    filled in place, tuples rebuilt); iterative."""
    if type(value) in (Link, Joined):
        return load(value)
    if not has_lazy(value):
        return value
    root: list[Any] = [value]
    todo: list[tuple[Any, Any]] = [(root, 0)]  # (container, key) of values still to fill
    order: list[tuple[Any, Any]] = []  # tuples made lists while filled, outermost first
    while todo:
        parent, key = todo.pop()
        item = parent[key]
        kind = type(item)
        if kind is Link or kind is Joined:
            parent[key] = load(item)
            continue
        if kind is tuple:
            item = list(item)
            parent[key] = item
            order.append((parent, key))
        if kind in (list, tuple):
            todo.extend((item, i) for i, v in enumerate(item) if type(v) in _WALK)
        elif kind is dict:
            todo.extend((item, k) for k, v in item.items() if type(v) in _WALK)
    for parent, key in reversed(order):
        parent[key] = tuple(parent[key])
    return root[0]


def concat(oid: str, shape: int, parts: list[Any],
           lengths: tuple[int, ...] | None = None) -> Any:
    """The values of a split value's children joined as ``shape``, as a load joins them (the
    same function), each checked against its length when ``lengths`` are given."""
    return join_parts(ObjectId(oid), shape, parts, lengths)


def text(reader: Reader, joined: Joined, depth: int = 0) -> str | bytes:
    """A split str or bytes: its chunks read (iteratively) and joined, each length given
    checked against the text under its node."""
    want = str if joined.shape == STR else bytes
    parts: list[Any] = []
    done = 0  # characters (bytes) so far
    # (node, depth, its length or None), or (node, -1, where it must end) to check a length
    stack: list[tuple[ObjectId, int, int | None]] = []

    def push(oids: tuple[ObjectId, ...], level: int, lengths: tuple[int, ...] | None) -> None:
        for i in range(len(oids) - 1, -1, -1):
            stack.append((oids[i], level, None if lengths is None else lengths[i]))

    push(joined.oids, depth + 1, joined.lengths)
    while stack:
        oid, level, length = stack.pop()
        if level < 0:
            if done != length:
                raise FormatError(f"state node {oid} is said to hold a different length of "
                                  f"{want.__name__} than it does; the node is corrupt")
            continue
        if length is not None:
            stack.append((oid, -1, done + length))
        node = reader.outline(oid, level)
        if node.shape == VALUE:
            if type(node.value) is not want:
                raise FormatError(f"state node {oid} joins a {type(node.value).__name__} into "
                                  f"a {want.__name__}; the node is corrupt")
            parts.append(node.value)
            done += len(node.value)
        elif node.shape == joined.shape:
            push(node.children, level + 1, node.lengths)
        else:
            raise FormatError(f"state node {oid} (shape {node.shape}) is part of a "
                              f"{want.__name__} but is not one; the node is corrupt")
    return "".join(parts) if want is str else b"".join(parts)


def budget_for(sizes: list[int]) -> int:
    """Node bytes an operation over states of these encoded sizes may visit (what loading each
    of them may: see ``Core.decode``)."""
    return min(LOAD_BUDGET, sum(4 * s + (2 << 20) for s in sizes))
