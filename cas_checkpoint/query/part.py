"""Read one part of a checkpoint's state without loading the rest: ``store.read_part(thread,
checkpoint, ["messages", -1])`` follows the path down the state's node tree, reading only the
nodes on the way (a split list is entered at the leaf that holds the item, by its parts'
lengths), and returns the value there one node deep: a list or dict stored in nodes of its own
inside it stands as ``Unread(kind, length)``. A list is read ``start`` .. ``start + count``.
What a viewer opens, a subtree at a time. The step behind ``read_part``; pure but for the
storage requests it yields."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cas_checkpoint.engine.core import Core
from cas_checkpoint.engine.model import CheckpointInfo, check_id
from cas_checkpoint.engine.refs import Ref
from cas_checkpoint.engine.steps import Step
from cas_checkpoint.errors import FormatError, InvalidArgumentError, NotFoundError
from cas_checkpoint.format.objects import CheckpointId, ObjectId, Record
from cas_checkpoint.query.diff import info_of_record, node_getter
from cas_checkpoint.query.walk import Joined, Link, Reader, Tally, budget_for, fill, text
from cas_checkpoint.tree.shapes import BYTES, DICT, LIST, STR, TUPLE, VALUE

__all__ = ["StatePart", "Unread", "read_part"]

KIND = {LIST: "list", TUPLE: "tuple", DICT: "dict", STR: "str", BYTES: "bytes"}
LINKS_LOOKED_AT = 64  # nodes of their own a part's value names whose kind is read, at most
MAX_COUNT = 10_000  # items of a list read at most per call


@dataclass(frozen=True, slots=True)
class Unread:
    """A part of the state in nodes of its own, not read: ``kind`` ("list", "tuple", "dict",
    "str", "bytes", or "value" when telling would mean reading it) and ``length`` (its items,
    keys, characters or bytes; None when not known without reading it)."""

    kind: str
    length: int | None


@dataclass(frozen=True, slots=True)
class StatePart:
    """What ``read_part`` returns: the ``checkpoint`` (no state), the ``path`` read, its
    ``value`` (a list: the items from ``start`` on; parts in nodes of their own: ``Unread``),
    ``length`` (of the whole list, dict, str or bytes there; None for another value), and the
    distinct tree ``nodes_read`` and their ``bytes_read``."""

    checkpoint: CheckpointInfo
    path: tuple[Any, ...]
    value: Any
    length: int | None
    start: int
    nodes_read: int
    bytes_read: int


def _where(path: Sequence[Any], n: int) -> str:
    return "state" + "".join(f"[{s!r}]" for s in path[:n])


class _Walk:
    def __init__(self, reader: Reader) -> None:
        self.reader = reader
        self.looked = 0

    def open(self, value: Any, depth: int) -> Any:
        """A ``Link`` read (its value, or the ``Joined`` of a concatenation node); any other
        value as it is."""
        while type(value) is Link:  # (a node may hold one child alone: each is a level)
            node = self.reader.outline(value.oid, depth)
            depth += 1
            value = node.value if node.shape == VALUE else Joined(node.shape, node.children,
                                                                  node.lengths)
        return value

    def lengths(self, joined: Joined, depth: int) -> list[int]:
        if joined.lengths is not None:
            return list(joined.lengths)
        return [self.reader.count(oid, depth + 1) for oid in joined.oids]  # an older store

    def items(self, joined: Joined, start: int, stop: int, depth: int) -> list[Any]:
        """Items ``start`` .. ``stop`` of a split list, reading the leaves that hold them."""
        out: list[Any] = []
        todo: list[tuple[ObjectId, int, int, int]] = []  # (node, first item, items, depth)

        def push(oids: Sequence[ObjectId], counts: list[int], first: int, level: int) -> None:
            at = first
            spans = []
            for oid, n in zip(oids, counts, strict=True):
                spans.append((oid, at, n, level))
                at += n
            todo.extend(reversed(spans))

        push(joined.oids, self.lengths(joined, depth), 0, depth + 1)
        while todo:
            oid, first, n, level = todo.pop()
            if first + n <= start or first >= stop:
                continue
            node = self.reader.outline(oid, level)
            if node.shape == VALUE:
                if type(node.value) not in (list, tuple) or len(node.value) != n:
                    raise FormatError(f"state node {oid} is part of a list but does not hold "
                                      f"{n} items; the node is corrupt")
                out.extend(node.value[max(0, start - first):stop - first])
            elif node.shape in (LIST, TUPLE):
                inner = Joined(node.shape, node.children, node.lengths)
                counts = self.lengths(inner, level)
                if sum(counts) != n:
                    raise FormatError(f"state node {oid} holds {sum(counts)} items where its "
                                      f"parent says {n}; the node is corrupt")
                push(node.children, counts, first, level + 1)
            else:
                raise FormatError(f"state node {oid} is part of a list but is not one; the "
                                  "node is corrupt")
        return out

    def mapping(self, joined: Joined, depth: int) -> dict[Any, Any]:
        """A split dict's parts merged (values stored apart stay placeholders)."""
        out: dict[Any, Any] = {}
        todo: list[tuple[ObjectId, int]] = [(o, depth + 1) for o in reversed(joined.oids)]
        while todo:
            oid, level = todo.pop()
            node = self.reader.outline(oid, level)
            if node.shape == VALUE and type(node.value) is dict:
                out.update(node.value)
            elif node.shape == DICT:
                todo.extend((o, level + 1) for o in reversed(node.children))
            else:
                raise FormatError(f"state node {oid} is part of a dict but is not one; the "
                                  "node is corrupt")
        return out

    def unread(self, lazy: Link | Joined) -> Unread:
        if type(lazy) is Joined:
            return Unread(KIND[lazy.shape], None if lazy.lengths is None
                          else sum(lazy.lengths))
        if self.looked >= LINKS_LOOKED_AT:
            return Unread("value", None)
        self.looked += 1
        assert type(lazy) is Link
        node = self.reader.outline(lazy.oid)
        if node.shape != VALUE:
            return self.unread(Joined(node.shape, node.children, node.lengths))
        v = node.value
        kind = type(v).__name__ if type(v) in (list, tuple, dict, str, bytes) else "value"
        return Unread(kind, len(v) if kind != "value" else None)


def walk_to(walk: _Walk, root: ObjectId, path: Sequence[Any], start: int,
            count: int) -> tuple[Any, int | None, int]:
    """(value, length, first item) at ``path`` in the tree under ``root``: what
    ``read_part`` returns, read through ``walk`` alone (pure: its reader fetches the nodes)."""
    value: Any = Link(root)
    for n, step in enumerate(path):
        value = walk.open(value, n)
        where = _where(path, n)
        if type(value) is Joined and value.shape in (LIST, TUPLE) or type(value) in (list, tuple):
            if isinstance(step, bool) or not isinstance(step, int):
                raise InvalidArgumentError(f"{where} is a list; index it with an int, not "
                                           f"{step!r}")
            size = sum(walk.lengths(value, n)) if type(value) is Joined else len(value)
            i = step + size if step < 0 else step
            if not 0 <= i < size:
                raise NotFoundError(f"{where} has {size} items; [{step}] is not one of them")
            if type(value) is Joined:
                got_items = walk.items(value, i, i + 1, n)
                if len(got_items) != 1:
                    raise FormatError(f"{where}[{i}] is not in the nodes its list names; the "
                                      "state is corrupt")
                value = got_items[0]
            else:
                value = value[i]
        elif type(value) is Joined and value.shape == DICT or type(value) is dict:
            got: Any = walk.mapping(value, n) if type(value) is Joined else value
            try:
                value = got[step]
            except (KeyError, TypeError):
                raise NotFoundError(f"{where} has no key {step!r}") from None
        else:
            kind = KIND.get(value.shape, "value") if type(value) is Joined else \
                type(value).__name__
            raise InvalidArgumentError(f"{where} is a {kind}: it has no parts to read by "
                                       f"[{step!r}]; read it with path={list(path[:n])!r}")
    value = walk.open(value, len(path))
    length: int | None = None
    first = 0
    if type(value) is Joined:
        if value.shape in (LIST, TUPLE):
            length = sum(walk.lengths(value, len(path)))
            first = min(start, length)
            items = walk.items(value, first, first + count, len(path))
            value = tuple(items) if value.shape == TUPLE else items
        elif value.shape == DICT:
            value = walk.mapping(value, len(path))
            length = len(value)
        else:
            value = text(walk.reader, value, len(path))
            length = len(value)
    elif type(value) in (list, tuple):
        length = len(value)
        first = min(start, length)
        value = value[first:first + count]
    elif type(value) in (dict, str, bytes):
        length = len(value)
    return fill(value, walk.unread), length, first


def read_part(core: Core, thread_id: str, checkpoint_id: CheckpointId | None,
              path: Sequence[Any], start: int, count: int) -> Step[StatePart]:
    """The step behind ``CheckpointStore.read_part``."""
    if isinstance(path, (str, bytes)) or not isinstance(path, Sequence):
        raise InvalidArgumentError(f"path must be a list of keys and list indexes, such as "
                                   f"['messages', -1], not {path!r}")
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise InvalidArgumentError(f"start must be an int >= 0, not {start!r}")
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_COUNT:
        raise InvalidArgumentError(f"count must be an int from 0 to {MAX_COUNT}, not {count!r}")
    wanted = None if checkpoint_id is None else check_id(checkpoint_id)

    def read(ref: Ref) -> Step[StatePart]:
        head = ref.head
        cid = wanted or head.head
        assert cid is not None
        view = yield from core.objects.view(head)
        entry = core._entry(thread_id, head, view, cid)  # noqa: SLF001 - (in this thread)
        record = Record.decode(view.get(entry.id))
        tally = Tally(budget_for([record.size]))
        walk = _Walk(Reader(node_getter(view, record), core.types, tally))
        value, length, first = walk_to(walk, record.root, path, start, count)
        info = info_of_record(entry.id, record)
        info = CheckpointInfo(info.id, thread_id, info.step, info.parent_ids, info.created_at,
                              info.size, info.label, info.tags, info.metadata, record.status,
                              record.kind, record.reason)
        return StatePart(info, tuple(path), value, length, first, len(tally.seen), tally.bytes)

    return (yield from core.at_ref(thread_id, read))  # (again when a pack went meanwhile)
