"""Index nodes and concatenations of a tree: the nodes above the leaves. Pure code."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast
from zlib import crc32

from cas_checkpoint.format.objects import ObjectId, encode_node, node_bytes, object_id
from cas_checkpoint.format.placeholders import varint
from cas_checkpoint.tree.memo import Memo, _Level, _same_groups
from cas_checkpoint.tree.shapes import COUNTED, LIST, TUPLE

FANOUT = 4  # average children of an index node: a group closes after INDEX_MIN children at a
INDEX_MIN, INDEX_MAX = 3, 6  # child whose id passes a 1-in-2 test, or at INDEX_MAX children
_SHAPES = [bytes([shape]) for shape in range(256)]


class _Inline:
    """The top node of a split value, not written on its own: its parent names its children
    and joins them with a ``Span`` (one object and one 32-byte id fewer per save)."""

    __slots__ = ("_oid", "children", "lengths", "payload", "shape")

    def __init__(self, payload: bytes, shape: int, children: tuple[ObjectId, ...],
                 lengths: tuple[int, ...]) -> None:
        self.payload = payload  # the node's payload (shape byte and lengths)
        self.shape = shape
        self.children = children
        self.lengths = lengths  # of each child's part (items, pairs, characters or bytes)
        self._oid: ObjectId | None = None

    @property
    def oid(self) -> ObjectId:
        """The id the node would have (a list's boundaries are decided by it): hashed only
        when asked, as the value of a dict (the common case) never asks."""
        if self._oid is None:
            self._oid = object_id(encode_node(self.payload, self.children))
        return self._oid


class Nodes:
    """The nodes a build makes (``objects``) and each part's length (``lengths``: items, pairs,
    characters or bytes), with the memo of earlier builds, if any. ``tree._Builder`` sets the
    fields."""

    memo: Memo | None
    objects: dict[ObjectId, bytes]
    lengths: dict[ObjectId, int]
    counted: bool  # concatenations carry their children's lengths
    gen: int  # the memo's generation (-1 without one)

    def node(self, shape: int, body: bytes | memoryview,
             children: list[ObjectId] | tuple[ObjectId, ...] = ()) -> ObjectId:
        return self.node_of((_SHAPES[shape], body), children)

    def node_of(self, parts: tuple[bytes | memoryview, ...] | list[bytes | memoryview],
                children: list[ObjectId] | tuple[ObjectId, ...] = ()) -> ObjectId:
        data = node_bytes(parts, children)  # the payload: ``parts`` (shape byte first) joined
        oid = object_id(data)
        self.objects[oid] = data
        return oid

    def concat_payload(self, shape: int, children: Sequence[ObjectId]) -> tuple[bytes, int]:
        """A concatenation's payload (its shape byte and, counted, its children's lengths) and
        its own length."""
        lengths = [self.lengths[c] for c in children]
        if not self.counted:
            return _SHAPES[shape], sum(lengths)
        if max(lengths, default=0) < 0x80:  # one-byte varints (the common case)
            return bytes([shape | COUNTED, *lengths]), sum(lengths)
        return bytes([shape | COUNTED]) + b"".join(map(varint, lengths)), sum(lengths)

    def concat(self, shape: int, children: Sequence[ObjectId]) -> ObjectId:
        """A concatenation node of ``children`` (remembered by the memo, if any)."""
        return self._concat(shape, children)[0]

    def _concat(self, shape: int, children: Sequence[ObjectId]) -> tuple[ObjectId, bytes, int]:
        """(id, bytes, length) of ``concat``: one node at a time (an append makes a few)."""
        head = shape | COUNTED * self.counted
        key: tuple[int | ObjectId, ...] = (head, *children)  # (one tuple: less for the gc)
        memo = self.memo
        got = memo.index.get(key) if memo is not None else None
        if got is None:
            payload, total = self.concat_payload(shape, children)
            data = node_bytes((payload,), children)
            got = (object_id(data), data, total)
            if memo is not None:
                memo.index[key] = got
                if len(memo.index) > memo.INDEX:
                    memo.index.popitem(last=False)
        self.objects[got[0]] = got[1]
        self.lengths[got[0]] = got[2]
        return got

    def concats(self, shape: int, groups: Sequence[Sequence[ObjectId]]
                ) -> tuple[list[ObjectId], list[bytes], list[int]]:
        """``concat`` of each group: (ids, bytes, lengths) of the nodes, made by C loops (a
        comprehension for each step, over the groups the memo does not hold)."""
        if len(groups) < 8:  # (a few: one at a time costs less than setting up the loops)
            few = [self._concat(shape, g) for g in groups]
            return [e[0] for e in few], [e[1] for e in few], [e[2] for e in few]
        counted = self.counted
        head = shape | COUNTED * counted
        memo = self.memo
        keys: list[tuple[int | ObjectId, ...]] = [(head, *g) for g in groups]  # (one tuple
        # each: less for the garbage collector)
        got: list[tuple[ObjectId, bytes, int] | None] = (
            list(map(memo.index.get, keys)) if memo is not None else [None] * len(keys))
        todo = [i for i, entry in enumerate(got) if entry is None]
        if todo:
            lengths, hash_ = self.lengths, object_id
            made = [groups[i] for i in todo]
            parts = [[lengths[c] for c in g] for g in made]
            totals = list(map(sum, parts))
            payloads = ([bytes([head, *p]) if max(p) < 0x80 else
                         bytes([head]) + b"".join(map(varint, p)) for p in parts] if counted
                        else [_SHAPES[shape]] * len(parts))
            datas = [node_bytes((payload,), g) for g, payload in zip(made, payloads,
                                                                     strict=True)]
            entries = list(zip(map(hash_, datas), datas, totals, strict=True))
            for i, entry in zip(todo, entries, strict=True):
                got[i] = entry
            if memo is not None:
                memo.index.update(zip([keys[i] for i in todo], entries, strict=True))
                while len(memo.index) > memo.INDEX:
                    memo.index.popitem(last=False)
        done = cast("list[tuple[ObjectId, bytes, int]]", got)  # (every entry filled now)
        ids, datas, totals = ([e[0] for e in done], [e[1] for e in done],
                              [e[2] for e in done])
        self.objects.update(zip(ids, datas, strict=True))
        self.lengths.update(zip(ids, totals, strict=True))
        return ids, datas, totals

    def _index(self, level: list[ObjectId], shape: int) -> _Inline:
        """Index nodes over ``level``, up to one top node of ``shape``.

        At each level, children are grouped until one that closes a group (by its id); the
        closed groups become index nodes one level up. The last, still open group of a level
        holds the nodes closed since that level's last boundary. The lowest level's members go
        straight into the top node; everything older goes into one spine node: the top level's
        nodes, each higher open group as a node of its own, and the second level's open members.
        An append therefore rewrites the top node, and the spine (and perhaps an open group)
        only when a group closes, never a chain of half-full nodes. The top node is returned
        unwritten (``_Inline``): its parent, or ``build``, decides where it goes."""
        inner = LIST if shape in (LIST, TUPLE) else shape
        loose: list[list[ObjectId]] = []  # open groups, lowest level first
        depth = 0
        # With a memo: the closed groups of each level that the level last built there starts
        # with are the same nodes (a group's end depends only on its own children), so only
        # what follows them is grouped and made again (an append: a few nodes).
        memo = self.memo
        key = (inner, self.counted, level[0]) if memo is not None and level else None
        old = memo.levels.get(key) if memo is not None and key is not None else None
        built: list[_Level] = []
        while len(level) > 1:
            prev = old[depth] if old is not None and depth < len(old) else None
            k = _same_groups(level, prev) if prev is not None else 0
            if prev is not None and k:
                ends, ids = prev.ends[:k], prev.ids[:k]
                datas, totals = prev.datas[:k], prev.totals[:k]
                self.objects.update(zip(ids, datas, strict=True))
                if prev.gen != self.gen:
                    self.lengths.update(zip(ids, totals, strict=True))
            else:
                ends, ids, datas, totals = [], [], [], []
            first = ends[-1] if ends else 0
            new = _group_ends(level, first, depth)
            if new:  # (an append mostly closes no group)
                got = self.concats(inner, [level[a:b] for a, b in zip([first, *new], new,
                                                                      strict=False)])
                ends += new
                ids += got[0]
                datas += got[1]
                totals += got[2]
            loose.append(level[ends[-1] if ends else 0:])
            built.append(_Level(level, ends, ids, datas, totals, self.gen))
            if not ids:
                level = []
                break
            level = ids
            depth += 1
        if memo is not None and key is not None:
            memo.remember_levels(key, built)
        spine = list(level)
        for at in range(len(loose) - 1, 0, -1):
            if at > 1 and len(loose[at]) > 1:
                spine.append(self.concat(inner, loose[at]))
            else:
                spine.extend(loose[at])
        if len(spine) > 1 and loose and loose[0]:
            spine = [self.concat(inner, spine)]
        children = tuple(spine + (loose[0] if loose else []))
        payload, _ = self.concat_payload(shape, children)
        return _Inline(payload, shape, children,
                       tuple(map(self.lengths.__getitem__, children)))


def _closing(level: list[ObjectId], first: int, depth: int) -> list[bool]:
    """Whether each child of ``level[first:]`` closes its group when the group is long enough
    (a 1-in-2 test of its id, salted by the level's depth)."""
    raw = bytes.fromhex("".join(level[first:]))
    return [crc32(raw[at:at + 32], depth) & 1 == 0 for at in range(0, len(raw), 32)]


def _group_ends(level: list[ObjectId], first: int, depth: int) -> list[int]:
    """Where the groups of ``level[first:]`` close (exclusive ends): at a child that passes
    ``_closing`` once its group has ``INDEX_MIN`` children, or at ``INDEX_MAX`` children."""
    if len(level) - first < INDEX_MIN:
        return []
    closes = _closing(level, first, depth)  # (looked up here: tests count what it tests)
    out: list[int] = []
    start = first  # the open group's first child
    at = start + INDEX_MIN - 1
    while at < len(level):
        if at + 1 - start >= INDEX_MAX or closes[at - first]:
            out.append(at + 1)
            start = at + 1
            at = start + INDEX_MIN - 1
        else:
            at += 1
    return out
