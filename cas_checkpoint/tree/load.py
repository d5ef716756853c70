"""A state joined back from its nodes: the inverse of ``build``. Pure code.
Rule: no C-stack recursion per tree level."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cas_checkpoint.errors import FormatError
from cas_checkpoint.format import codec
from cas_checkpoint.format.objects import ObjectId, decode_nodes
from cas_checkpoint.tree.shapes import (
    BYTES,
    DICT,
    EXPANSION,
    LIST,
    LOAD_BUDGET,
    MAX_DEPTH,
    STR,
    TUPLE,
    VALUE,
    array_header,
    concat_lengths,
    map_header,
)

ID_COST = 32  # budget charged per child id a visited node names

Fetch = Callable[[list[ObjectId]], Mapping[str, bytes | memoryview]]


def load(root: ObjectId, fetch: Fetch, types: codec.TypeRegistry | None = None,
         seen: set[str] | None = None, max_bytes: int | None = None) -> Any:
    """Read a state back from its root node; ``fetch`` returns verified bytes by id, a batch
    per tree level. ``seen`` collects the node ids read. ``max_bytes`` lowers the expansion
    budget further (it can never raise it)."""
    nodes: dict[str, tuple[tuple[ObjectId, ...], memoryview]] = {}
    frontier: list[ObjectId] = [root]
    distinct = 0
    while frontier:  # a level at a time, each node decoded in one pass over the level
        got = fetch(frontier)
        level = decode_nodes([got[oid] for oid in frontier])
        nodes.update(zip(frontier, level, strict=True))
        distinct += sum([len(payload) + ID_COST * len(kids) for kids, payload in level])
        if distinct > LOAD_BUDGET:
            raise FormatError(f"the state under {root} has more than {LOAD_BUDGET} bytes of "
                              "distinct nodes; the store is corrupt or hostile")
        nxt = [c for kids, _ in level for c in kids]
        frontier = [c for c in dict.fromkeys(nxt) if c not in nodes]
    if seen is not None:
        seen.update(nodes)
    budget = min(LOAD_BUDGET, EXPANSION * distinct + (1 << 20))
    if max_bytes is not None:
        budget = min(budget, max_bytes)
    return _Joiner(nodes, types, budget).run(root)


def concat(oid: ObjectId, shape: int, parts: list[Any],
           lengths: tuple[int, ...] | None = None) -> Any:
    """``parts`` (the values of a node's children) joined as ``shape``, each checked
    against its length when ``lengths`` are given."""
    want = {LIST: list, TUPLE: list, DICT: dict, STR: str, BYTES: bytes}[shape]
    for part in parts:
        if type(part) is not want and not (want is list and type(part) is tuple):
            raise FormatError(f"state node {oid} joins a {type(part).__name__} into a "
                              f"{want.__name__}; the node is corrupt")
    if lengths is not None:
        check_lengths(oid, lengths, [len(p) for p in parts])
    if shape in (LIST, TUPLE):
        out: list[Any] = []
        for part in parts:
            out.extend(part)
        return tuple(out) if shape == TUPLE else out
    if shape == DICT:
        merged: dict[Any, Any] = {}
        for part in parts:
            merged.update(part)
        return merged
    return "".join(parts) if shape == STR else b"".join(parts)


class _Frame:
    __slots__ = ("children", "depth", "lengths", "oid", "payload", "shape", "vals")

    def __init__(self, oid: ObjectId, depth: int, children: tuple[ObjectId, ...],
                 payload: memoryview, shape: int, lengths: tuple[int, ...] | None = None
                 ) -> None:
        self.oid, self.depth, self.children = oid, depth, children
        self.payload, self.shape, self.lengths = payload, shape, lengths
        self.vals: list[Any] = []


_PENDING = object()


class _Joiner:
    def __init__(self, nodes: dict[str, tuple[tuple[ObjectId, ...], memoryview]],
                 types: codec.TypeRegistry | None, budget: int) -> None:
        self.nodes, self.types, self.budget = nodes, types, budget

    def visit(self, oid: ObjectId, depth: int) -> tuple[tuple[ObjectId, ...], memoryview]:
        children, payload = self.nodes[oid]
        self.budget -= len(payload) + ID_COST * len(children)
        if depth > MAX_DEPTH or self.budget < 0:
            raise FormatError(f"state tree under {oid} is deeper than {MAX_DEPTH} levels or "
                              "expands too far beyond its distinct bytes; the store is corrupt "
                              "or hostile")
        if not payload:
            raise FormatError(f"state node {oid} has no shape byte; the node is corrupt")
        return children, payload

    def run(self, root: ObjectId) -> Any:
        first = self.start(root, 0)
        if not isinstance(first, _Frame):
            return first
        stack = [first]
        while stack:
            frame = stack[-1]
            if len(frame.vals) < len(frame.children):
                got = self.start(frame.children[len(frame.vals)], frame.depth + 1)
                if isinstance(got, _Frame):
                    stack.append(got)
                else:
                    frame.vals.append(got)
                continue
            stack.pop()
            value = self.finish(frame)
            if not stack:
                return value
            stack[-1].vals.append(value)
        raise AssertionError("unreachable")

    def start(self, oid: ObjectId, depth: int) -> Any:
        """The value of a node that needs no child values, else a frame to evaluate it."""
        children, payload = self.visit(oid, depth)
        shape = payload[0]
        if shape == VALUE:
            if not children:
                return codec.decode(payload[1:], types=self.types)
            return _Frame(oid, depth, children, payload, shape)
        shape, lengths = concat_lengths(oid, payload, len(children))
        if shape in (LIST, TUPLE, DICT):
            fast = self.flat_join(shape, children, lengths, depth)
            if fast is not _PENDING:
                return fast
        elif shape in (STR, BYTES):
            fast = self.flat_text(shape, children, lengths, depth)
            if fast is not _PENDING:
                return fast
        return _Frame(oid, depth, children, payload, shape, lengths)

    def finish(self, frame: _Frame) -> Any:
        if frame.shape != VALUE:
            return self.concat(frame.oid, frame.shape, frame.vals, frame.lengths)
        vals, used, oid = frame.vals, set[int](), frame.oid

        def take(start: int, count: int) -> list[Any]:
            if not 0 <= start <= start + count <= len(vals) or used.intersection(
                    range(start, start + count)):
                raise FormatError(f"node {oid} names children {start}..{start + count - 1} of "
                                  f"{len(vals)}, or one of them twice; it is corrupt")
            used.update(range(start, start + count))
            return vals[start:start + count]

        def span(kind: int, start: int, count: int, lengths: tuple[int, ...] | None = None
                 ) -> Any:
            if not LIST <= kind <= BYTES:
                raise FormatError(f"node {oid} joins children into unknown shape {kind}")
            return self.concat(oid, kind, take(start, count), lengths)

        return codec.decode(frame.payload[1:], types=self.types,
                            resolve=lambda i: take(i, 1)[0], span=span)

    concat = staticmethod(concat)

    def flat_join(self, shape: int, children: tuple[ObjectId, ...],
                  lengths: tuple[int, ...] | None, depth: int) -> Any:
        """A list/tuple/dict whose leaves hold no placeholders: their item bytes joined and
        decoded in one pass; ``_PENDING`` when a leaf has children (the caller evaluates the
        children one by one instead). Each length given is checked against the items found
        under its child (the decode checks that the leaves' headers add up)."""
        is_map = shape == DICT
        small, b16, b32 = (0x80, 0xDE, 0xDF) if is_map else (0x90, 0xDC, 0xDD)

        def leaf(payload: memoryview) -> tuple[memoryview, int] | None:
            first = payload[1]
            if first & 0xF0 == small:
                return payload[2:], first & 0x0F
            if first == b16 and len(payload) >= 4:
                return payload[4:], int.from_bytes(payload[2:4], "big")
            if first == b32 and len(payload) >= 6:
                return payload[6:], int.from_bytes(payload[2:6], "big")
            return None

        items = self.flat_parts(DICT if is_map else LIST, children, lengths, depth, leaf)
        if items is _PENDING:
            return _PENDING
        count, parts = items
        parts.insert(0, map_header(count) if is_map else array_header(count))
        joined = codec.decode(b"".join(parts), types=self.types)
        return tuple(joined) if shape == TUPLE else joined

    def flat_text(self, shape: int, children: tuple[ObjectId, ...],
                  lengths: tuple[int, ...] | None, depth: int) -> Any:
        """A str/bytes split over leaves that are each a plain str/bytes: joined once (not
        once per index level), each length checked as ``concat`` checks it; ``_PENDING``
        when a leaf is anything else (the caller's slow path says what is wrong)."""
        is_str = shape == STR

        def leaf(payload: memoryview) -> tuple[str | memoryview, int] | None:
            got = _text_payload(payload[1:], is_str)
            if got is None:
                return None
            if not is_str:
                return got, len(got)
            try:
                text = str(got, "utf-8")
            except UnicodeDecodeError:
                return None
            return text, len(text)

        items = self.flat_parts(shape, children, lengths, depth, leaf)
        if items is _PENDING:
            return _PENDING
        parts = items[1]
        return "".join(parts) if is_str else b"".join(parts)

    def flat_parts(self, inner: int, children: tuple[ObjectId, ...],
                   lengths: tuple[int, ...] | None, depth: int,
                   leaf: Callable[[memoryview], tuple[Any, int] | None]) -> Any:
        """(count, parts) of the leaves under ``children`` (concatenations of shape ``inner``
        down to leaves without children, each taken apart by ``leaf``: its part and how many
        items, pairs, characters or bytes it holds), or ``_PENDING``. Each length given is
        checked against what its child holds. Each node is charged to the budget and checked
        as ``visit`` does, in one loop over its parent's children (a leaf that is a short
        array or map, the common case, is cut in place)."""
        nodes, parts = self.nodes, list[Any]()
        append = parts.append
        small = {LIST: 0x90, DICT: 0x80}.get(inner, -1)
        count, budget = 0, self.budget
        # (siblings, their depth, their lengths or None) or, to check a length, (node id,
        # -1, the count expected when it ends): a node's check is popped after its children
        stack: list[tuple[Any, int, Any]] = [(children, depth + 1, lengths)]
        while stack:
            kids, level, want = stack.pop()
            if level < 0:
                if count != want:
                    raise _miscount(kids)
                continue
            for i, oid in enumerate(kids):
                sub, payload = nodes[oid]
                budget -= len(payload) + ID_COST * len(sub)
                if level > MAX_DEPTH or budget < 0 or not payload:
                    self.budget = budget
                    self.visit(oid, level)  # raises
                kind = payload[0]
                if kind != VALUE:
                    if kind & 0x0F != inner:
                        self.budget = budget
                        return _PENDING
                    if i + 1 < len(kids):  # the siblings after it, once it is done
                        stack.append((kids[i + 1:], level, None if want is None else
                                      want[i + 1:]))
                    if want is not None:
                        stack.append((oid, -1, count + want[i]))
                    stack.append((sub, level + 1, concat_lengths(oid, payload, len(sub))[1]))
                    break
                if sub or len(payload) < 2:
                    self.budget = budget
                    return _PENDING
                first = payload[1]
                if first & 0xF0 == small:
                    append(payload[2:])
                    n = first & 0x0F
                else:
                    got = leaf(payload)
                    if got is None:
                        self.budget = budget
                        return _PENDING
                    append(got[0])
                    n = got[1]
                if want is not None and n != want[i]:
                    raise _miscount(oid)
                count += n
        self.budget = budget
        return count, parts


def _miscount(oid: str) -> FormatError:
    return FormatError(f"state node {oid} is said to hold a different number of items than it "
                       "does; the node is corrupt")


def _text_payload(data: memoryview, is_str: bool) -> memoryview | None:
    """The bytes of a msgpack str (or bin) that is exactly ``data``, else None."""
    if not data:
        return None
    first = data[0]
    if is_str and 0xA0 <= first <= 0xBF:
        skip, size = 1, first & 0x1F
    else:
        width = ({0xD9: 1, 0xDA: 2, 0xDB: 4} if is_str else {0xC4: 1, 0xC5: 2, 0xC6: 4}
                 ).get(first)
        if width is None or len(data) < 1 + width:
            return None
        skip, size = 1 + width, int.from_bytes(data[1:1 + width], "big")
    return data[skip:] if len(data) == skip + size else None


def check_lengths(oid: str, lengths: tuple[int, ...], found: list[int]) -> None:
    """FormatError unless the lengths a node gives are those of the parts found."""
    if list(lengths) != found:
        raise FormatError(f"state node {oid} says its children's parts hold {list(lengths)[:8]} "
                          f"items, they hold {found[:8]}; the node is corrupt")
