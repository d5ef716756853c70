"""Structural diff of two checkpoints' states, by their trees of content-addressed nodes."""

from __future__ import annotations

import threading
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from cas_checkpoint.engine import locate
from cas_checkpoint.engine.core import Core
from cas_checkpoint.engine.model import CheckpointInfo, check_id
from cas_checkpoint.engine.object_store import View
from cas_checkpoint.engine.steps import Step
from cas_checkpoint.errors import FormatError
from cas_checkpoint.format.objects import CheckpointId, ObjectId, Record
from cas_checkpoint.query.textdiff import NoLengths, TextDiff, text_change
from cas_checkpoint.query.walk import (
    Joined,
    Link,
    Reader,
    Tally,
    budget_for,
    concat,
    fill,
    index_seg,
    key_seg,
    kind_of,
    same,
    slice_seg,
)
from cas_checkpoint.tree import load as join
from cas_checkpoint.tree.build import TEXT_SPLIT_MIN
from cas_checkpoint.tree.shapes import DICT, LIST, TUPLE, VALUE

__all__ = ["Change", "StateDiff", "diff"]

Op = Literal["added", "removed", "changed"]
COUNTS_MAX = 1 << 17  # item counts of list parts remembered per store object (by node id)


@dataclass(frozen=True, slots=True)
class Change:
    """One difference: ``path`` from the state's root (``'["messages"][41]["content"]'``,
    ``''`` for the whole state), ``op``, and the values before (None when added) and after
    (None when removed)."""

    path: str
    op: Op
    old: Any
    new: Any


@dataclass(frozen=True, slots=True)
class StateDiff:
    """What ``diff`` returns: the changes from ``a`` to ``b``, in document order, and what it
    read: ``nodes_read`` distinct tree nodes (both sides), of which ``nodes_counted`` were read
    only to count the items of a part of a list both sides share, and their ``bytes_read``."""

    a: CheckpointInfo
    b: CheckpointInfo
    changes: list[Change]
    nodes_read: int
    nodes_counted: int = 0
    bytes_read: int = 0


def info_of_record(cid: CheckpointId, record: Record) -> CheckpointInfo:
    return CheckpointInfo(cid, record.thread_id, record.step, record.parents,
                          datetime.fromtimestamp(record.created_at, UTC), record.size,
                          record.label, record.tags, record.metadata)


def node_getter(view: View, record: Record) -> Callable[[ObjectId], bytes]:
    """Verified bytes of the state nodes of ``record`` (its root may be inside the record,
    whose hash covers it)."""
    inline, root = record.root_node, record.root

    def get(oid: ObjectId) -> bytes:
        if inline is not None and oid == root:
            return inline
        return view.get(oid)

    return get


_COUNTS: weakref.WeakKeyDictionary[Core, OrderedDict[str, int]] = weakref.WeakKeyDictionary()
_COUNTS_LOCK = threading.Lock()


class _Counts:
    """Item counts of list parts by node id, kept per store object (bounded LRU)."""

    def __init__(self, core: Core | None) -> None:
        if core is None:
            self.memo: OrderedDict[str, int] = OrderedDict()
            return
        with _COUNTS_LOCK:
            self.memo = _COUNTS.setdefault(core, OrderedDict())

    def get(self, oid: str) -> int | None:
        with _COUNTS_LOCK:
            return self.memo.get(oid)

    def put(self, oid: str, count: int) -> None:
        with _COUNTS_LOCK:
            self.memo[oid] = count
            self.memo.move_to_end(oid)
            while len(self.memo) > COUNTS_MAX:
                self.memo.popitem(last=False)


def diff(core: Core, a_id: CheckpointId, b_id: CheckpointId) -> Step[StateDiff]:
    """The step behind ``CheckpointStore.diff``: checkpoints found as ``get`` finds them."""
    ids = [check_id(a_id, "a_id"), check_id(b_id, "b_id")]

    def read(refs: locate.Refs) -> Step[StateDiff]:
        views = yield from locate.locate(core, ids, refs)
        return _diff(core, ids, views)

    return (yield from locate.across_refs(core, read))


def _diff(core: Core, ids: list[CheckpointId], views: dict[CheckpointId, View]) -> StateDiff:
    records = [Record.decode(views[c].get(c)) for c in ids]
    tally = Tally(budget_for([r.size for r in records]))
    readers = (Reader(node_getter(views[ids[0]], records[0]), core.types, tally),
               Reader(node_getter(views[ids[1]], records[1]), core.types, tally))
    walker = Differ(readers, _Counts(core))
    changes = walker.run(Link(records[0].root), Link(records[1].root))
    return StateDiff(info_of_record(ids[0], records[0]), info_of_record(ids[1], records[1]),
                     changes, len(tally.seen), tally.counted, tally.bytes)


# --- the walk ----------------------------------------------------------------------------------


class _Path:
    """A path, formatted only when a change is reported (a list index may need counting)."""

    __slots__ = ("parent", "seg")

    def __init__(self, parent: _Path | None, seg: str | _Pos) -> None:
        self.parent, self.seg = parent, seg

    def text(self) -> str:
        parts: list[str] = []
        node: _Path | None = self
        while node is not None:
            seg = node.seg
            parts.append(seg if isinstance(seg, str) else index_seg(seg.absolute()))
            node = node.parent
        return "".join(reversed(parts))


class _Pos:
    __slots__ = ("list", "rel")

    def __init__(self, lst: _ListState, rel: int) -> None:
        self.list, self.rel = lst, rel

    def absolute(self) -> int:
        return self.list.base() + self.rel


class _ListState:
    """Parts of a list both sides share, skipped: their item counts are read only if a change
    after them is reported."""

    __slots__ = ("differ", "known", "unknown")

    def __init__(self, differ: Differ) -> None:
        self.differ, self.known, self.unknown = differ, 0, list[tuple[ObjectId, int]]()

    def skip(self, oid: ObjectId, count: int | None, depth: int) -> None:
        if count is None:
            count = self.differ.counts.get(oid)
        if count is None:
            self.unknown.append((oid, depth))
        else:
            self.known += count

    def base(self) -> int:
        while self.unknown:
            oid, depth = self.unknown.pop()
            self.known += self.differ.count(oid, depth)
        return self.known


class _Seg:
    """A part of one side's list: an unread node (its item count, if its parent gives it), or
    items of a read node (from ``start``)."""

    __slots__ = ("count", "depth", "items", "oid", "start")

    def __init__(self, oid: ObjectId | None, items: list[Any] | tuple[Any, ...] | None,
                 depth: int, count: int | None = None) -> None:
        self.oid, self.items, self.start, self.depth = oid, items, 0, depth
        self.count = count


_LAZY = (Link, Joined)
_Part = tuple[str, "dict[Any, Any] | None", int]  # (node id, its entries once read, depth)
_DEEP = frozenset({list, tuple, dict, Link, Joined})


def _lazy_equal(a: Any, b: Any) -> bool:
    return type(a) is type(b) and type(a) in _LAZY and bool(a == b)


class Differ:
    """The diff of two values given by ``readers`` (side 0, side 1)."""

    def __init__(self, readers: tuple[Reader, Reader], counts: _Counts) -> None:
        self.readers = readers
        self.tally = readers[0].tally
        self.types = readers[0].types
        self.counts = counts
        self.changes: list[Change] = []

    def run(self, a: Any, b: Any) -> list[Change]:
        stack: list[Iterator[Any]] = [self.compare(a, b, None, 0, 0)]
        while stack:
            try:
                task = next(stack[-1])
            except StopIteration:
                stack.pop()
                continue
            stack.append(task)  # a nested comparison: it finishes before its parent resumes
        return self.changes

    def emit(self, path: _Path | None, op: Op, old: Any, new: Any) -> None:
        self.changes.append(Change("" if path is None else path.text(), op, old, new))

    # --- reading ---

    def resolve(self, side: int, value: Any, depth: int) -> tuple[Any, int]:
        """A ``Link`` followed to the value of its node (a concatenation node as ``Joined``)."""
        while type(value) is Link:
            node = self.readers[side].outline(value.oid, depth)
            depth += 1
            value = node.value if node.shape == VALUE else Joined(node.shape, node.children,
                                                                  node.lengths)
        return value, depth

    def value(self, side: int, value: Any, depth: int) -> Any:
        """The whole value, its placeholders loaded (for a change's old/new)."""
        return fill(value, lambda lazy: self._load(side, lazy))

    def _load(self, side: int, lazy: Link | Joined) -> Any:
        reader, tally = self.readers[side], self.tally

        def fetch(oids: list[ObjectId]) -> Mapping[str, bytes]:
            out: dict[str, bytes] = {o: reader.get(o) for o in oids}
            for o, data in out.items():
                if o not in tally.seen:
                    tally.seen.add(o)
                    tally.bytes += len(data)
            return out

        def load(oid: ObjectId) -> Any:
            got = join.load(oid, fetch, reader.types, max_bytes=max(1, tally.budget))
            tally.charge(0, oid)
            return got

        if isinstance(lazy, Link):
            return load(lazy.oid)
        return concat(lazy.oids[0] if lazy.oids else "?", lazy.shape,
                      [load(o) for o in lazy.oids], lazy.lengths)

    def count(self, oid: ObjectId, depth: int) -> int:
        got = self.counts.get(oid)
        if got is None:
            self.tally.counting = True
            try:
                got = self.readers[0].count(oid, depth, self.counts.get, self.counts.put)
            finally:
                self.tally.counting = False
            self.counts.put(oid, got)
        return got

    # --- comparing ---

    def compare(self, a: Any, b: Any, path: _Path | None, da: int, db: int) -> Iterator[Any]:
        if _lazy_equal(a, b):
            return
        a, da = self.resolve(0, a, da)
        b, db = self.resolve(1, b, db)
        if _lazy_equal(a, b):
            return
        kind = kind_of(a)
        if kind is not kind_of(b):
            self.emit(path, "changed", self.value(0, a, da), self.value(1, b, db))
        elif kind is dict:
            yield self.dicts(a, b, path, da, db)
        elif kind is list or kind is tuple:
            yield self.lists(a, b, path, da, db)
        elif kind is str or kind is bytes:
            self.texts(a, b, path, da, db)
        elif not same(a, b, self.types):
            self.emit(path, "changed", a, b)

    def texts(self, a: Any, b: Any, path: _Path | None, da: int, db: int) -> None:
        """Two str (or bytes) values: a long pair as the slice that differs (module
        docstring), split ones by their chunks when their lengths are known."""
        got: tuple[int, Any, Any] | None
        la, lb = _text_length(a), _text_length(b)
        if la is not None and lb is not None and min(la, lb) <= TEXT_SPLIT_MIN:
            old, new = self.value(0, a, da), self.value(1, b, db)
            if not same(old, new):
                self.emit(path, "changed", old, new)
            return
        try:
            if type(a) is not Joined or type(b) is not Joined or la is None or lb is None:
                raise NoLengths()
            got = TextDiff(self.readers, self.tally).run(a, b, la, lb, da, db)
        except NoLengths:  # written before lengths existed, or only one side is split
            old, new = self.value(0, a, da), self.value(1, b, db)
            if min(len(old), len(new)) <= TEXT_SPLIT_MIN:
                if not same(old, new):
                    self.emit(path, "changed", old, new)
                return
            got = text_change(old, new)
        if got is not None:
            start, old_part, new_part = got
            self.emit(_Path(path, slice_seg(start, start + len(old_part))), "changed",
                      old_part, new_part)

    def pair(self, x: Any, y: Any, path: _Path, da: int, db: int) -> Iterator[Any] | None:
        """A nested comparison to run, or None when ``x`` and ``y`` were settled here."""
        if type(x) not in _DEEP and type(y) not in _DEEP:
            if type(x) in _TEXT and type(x) is type(y) and min(len(x), len(y)) > TEXT_SPLIT_MIN:
                self.texts(x, y, path, da, db)
            elif not same(x, y, self.types):
                self.emit(path, "changed", x, y)
            return None
        if _lazy_equal(x, y):
            return None
        return self.compare(x, y, path, da, db)

    def dicts(self, a: Any, b: Any, path: _Path | None, da: int, db: int) -> Iterator[Any]:
        parts = [self._dict_parts(0, a, da), self._dict_parts(1, b, db)]
        if type(a) is Joined and type(b) is Joined:
            while True:  # drop the subtrees both hold; read the rest one level further
                common = Counter(p[0] for p in parts[0]) & Counter(p[0] for p in parts[1])
                for side in (0, 1):
                    drop = Counter(common)
                    kept = []
                    for part in parts[side]:
                        if drop[part[0]] > 0:
                            drop[part[0]] -= 1
                        else:
                            kept.append(part)
                    parts[side] = kept
                if all(p[1] is not None for side in parts for p in side):
                    break
                parts = [self._expand_dict(0, parts[0]), self._expand_dict(1, parts[1])]
        else:
            for side in (0, 1):
                while any(p[1] is None for p in parts[side]):
                    parts[side] = self._expand_dict(side, parts[side])
        old: dict[Any, Any] = {}
        new: dict[Any, Any] = {}
        for target, side_parts in ((old, parts[0]), (new, parts[1])):
            for _, entries, _ in side_parts:
                assert entries is not None
                target.update(entries)
        for key, x in old.items():
            sub = _Path(path, key_seg(key))
            if key in new:
                task = self.pair(x, new[key], sub, da, db)
                if task is not None:
                    yield task
            else:
                self.emit(sub, "removed", self.value(0, x, da), None)
        for key, y in new.items():
            if key not in old:
                self.emit(_Path(path, key_seg(key)), "added", None, self.value(1, y, db))

    def _dict_parts(self, side: int, value: Any, depth: int) -> list[_Part]:
        if type(value) is Joined:
            return [(o, None, depth + 1) for o in value.oids]
        return [("", value, depth)]

    def _expand_dict(self, side: int, parts: list[_Part]) -> list[_Part]:
        out: list[_Part] = []
        for oid, entries, depth in parts:
            if entries is not None:
                out.append((oid, entries, depth))
                continue
            node = self.readers[side].outline(ObjectId(oid), depth)
            if node.shape == VALUE and type(node.value) is dict:
                out.append((oid, node.value, depth))
            elif node.shape == DICT:
                out.extend((c, None, depth + 1) for c in node.children)
            else:
                raise FormatError(f"state node {oid} is part of a dict but holds no dict; the "
                                  "node is corrupt")
        return out

    def lists(self, a: Any, b: Any, path: _Path | None, da: int, db: int) -> Iterator[Any]:
        state = _ListState(self)
        cursors = (_segs(a, da), _segs(b, db))  # stacks of parts: the front is last
        done = 0  # items passed on each side (the sides move in step)
        while cursors[0] and cursors[1]:
            fa, fb = cursors[0][-1], cursors[1][-1]
            if fa.start == 0 and fb.start == 0 and fa.oid is not None and fa.oid == fb.oid:
                read = fa if fa.items is not None else fb
                known = len(read.items) if read.items is not None else (
                    fa.count if fa.count is not None else fb.count)
                if None not in (fa.count, fb.count) and fa.count != fb.count:
                    raise FormatError(f"state node {fa.oid} is said to hold {fa.count} items "
                                      f"and {fb.count}; a node is corrupt")
                state.skip(fa.oid, known, fa.depth)
                cursors[0].pop()
                cursors[1].pop()
                continue
            if fa.items is None or fb.items is None:  # read one level further on each side
                for side, front, other in ((0, fa, fb), (1, fb, fa)):  # with a node in front:
                    if front.items is None and (  # the longer one first (both if as long)
                            other.items is not None or front.count is None
                            or other.count is None or front.count >= other.count):
                        self._expand_list(side, cursors[side])
                continue
            n = min(len(fa.items) - fa.start, len(fb.items) - fb.start)
            for j in range(n):
                x, y = fa.items[fa.start + j], fb.items[fb.start + j]
                if x is y or _lazy_equal(x, y):
                    continue
                task = self.pair(x, y, _Path(path, _Pos(state, done + j)), fa.depth, fb.depth)
                if task is not None:
                    yield task
            fa.start += n
            fb.start += n
            done += n
            for cur in cursors:
                if cur[-1].items is not None and cur[-1].start >= len(cur[-1].items or ()):
                    self._remember(cur.pop())
        for side, op in ((0, "removed"), (1, "added")):
            cur = cursors[side]
            while cur:
                seg = cur[-1]
                if seg.items is None:
                    self._expand_list(side, cur)
                    continue
                for x in seg.items[seg.start:]:
                    value = self.value(side, x, seg.depth)
                    self.emit(_Path(path, _Pos(state, done)), op,  # type: ignore[arg-type]
                              value if side == 0 else None, value if side == 1 else None)
                    done += 1
                cur.pop()

    def _remember(self, seg: _Seg) -> None:
        if seg.oid is not None and seg.items is not None:
            self.counts.put(seg.oid, len(seg.items))

    def _expand_list(self, side: int, cur: list[_Seg]) -> None:
        seg = cur.pop()
        assert seg.oid is not None
        node = self.readers[side].outline(seg.oid, seg.depth)
        if node.shape == VALUE:
            if type(node.value) not in (list, tuple):
                raise FormatError(f"state node {seg.oid} is part of a list but holds a "
                                  f"{type(node.value).__name__}; the node is corrupt")
            _check_count(seg, len(node.value))
            cur.append(_Seg(seg.oid, node.value, seg.depth))
        elif node.shape in (LIST, TUPLE):
            lengths = node.lengths
            if lengths is not None:
                _check_count(seg, sum(lengths))
            cur.extend(_Seg(c, None, seg.depth + 1, None if lengths is None else lengths[i])
                       for i, c in reversed(list(enumerate(node.children))))
        else:
            raise FormatError(f"state node {seg.oid} (shape {node.shape}) is part of a list "
                              "but is not one; the node is corrupt")


def _check_count(seg: _Seg, found: int) -> None:
    if seg.count is not None and seg.count != found:
        raise FormatError(f"state node {seg.oid} is said to hold {seg.count} items but holds "
                          f"{found}; a node is corrupt")


def _segs(value: Any, depth: int) -> list[_Seg]:
    """One side's list as a stack of parts, its front last."""
    if type(value) is Joined:
        lengths = value.lengths
        return [_Seg(o, None, depth + 1, None if lengths is None else lengths[i])
                for i, o in reversed(list(enumerate(value.oids)))]
    return [_Seg(None, value, depth)]


_TEXT = (str, bytes)


def _text_length(value: Any) -> int | None:
    """Characters (bytes) of a str/bytes value or of a split one that gives its lengths."""
    if type(value) is Joined:
        return None if value.lengths is None else sum(value.lengths)
    return len(value)
