"""Where two long str (or bytes) values differ: the slice from their first to their last
differing character, found from their chunks. Pure code."""

from __future__ import annotations

from typing import Any

from cas_checkpoint.errors import FormatError
from cas_checkpoint.format.objects import ObjectId
from cas_checkpoint.query.walk import Joined, Reader, Tally
from cas_checkpoint.tree.shapes import STR, VALUE

__all__ = ["NoLengths", "TextDiff", "common_prefix", "text_change"]


class NoLengths(Exception):
    """A concatenation under the values does not give its children's lengths."""


def common_prefix(x: Any, y: Any) -> int:
    """Length of the longest common prefix of two str (or two bytes)."""
    n = min(len(x), len(y))
    if x[:n] == y[:n]:
        return n
    lo, hi = 0, n - 1  # x[:lo] == y[:lo]; x[:hi + 1] != y[:hi + 1]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if x[:mid] == y[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def text_change(old: Any, new: Any) -> tuple[int, Any, Any] | None:
    """(start, old part, new part) of the slice from the first to the last differing
    character of two whole str (bytes) values; None if they are equal."""
    p = common_prefix(old, new)
    if p == len(old) == len(new):
        return None
    s = common_prefix(old[p:][::-1], new[p:][::-1])
    return p, old[p:len(old) - s], new[p:len(new) - s]


class _Node:
    """An unread part: a node, the length its parent gives it, its depth."""

    __slots__ = ("depth", "length", "oid")

    def __init__(self, oid: ObjectId, length: int, depth: int) -> None:
        self.oid, self.length, self.depth = oid, length, depth


class _Side:
    """One side's split text: its nodes read once each, by id."""

    def __init__(self, reader: Reader, joined: Joined, depth: int) -> None:
        self.reader, self.shape = reader, joined.shape
        self.want: type = str if joined.shape == STR else bytes
        assert joined.lengths is not None
        self.top = [_Node(o, n, depth + 1) for o, n in zip(joined.oids, joined.lengths,
                                                          strict=True)]
        self.read: dict[str, Any] = {}  # a node's parts (list of _Node) or its text

    def open(self, node: _Node) -> Any:
        """A node's parts (a concatenation) or its text (a chunk), checked against its length."""
        got: Any = self.read.get(node.oid)
        if got is None:
            out = self.reader.outline(node.oid, node.depth)
            if out.shape == VALUE:
                if type(out.value) is not self.want:
                    raise FormatError(f"state node {node.oid} joins a "
                                      f"{type(out.value).__name__} into a "
                                      f"{self.want.__name__}; the node is corrupt")
                got = out.value
            elif out.shape == self.shape:
                if out.lengths is None:
                    raise NoLengths(node.oid)
                got = [_Node(c, n, node.depth + 1)
                       for c, n in zip(out.children, out.lengths, strict=True)]
            else:
                raise FormatError(f"state node {node.oid} (shape {out.shape}) is part of a "
                                  f"{self.want.__name__} but is not one; the node is corrupt")
            self.read[node.oid] = got
        found = sum(p.length for p in got) if type(got) is list else len(got)
        if found != node.length:
            raise FormatError(f"state node {node.oid} is said to hold {node.length} characters "
                              f"(or bytes) but holds {found}; a node is corrupt")
        return got

    def piece(self, lo: int, hi: int) -> Any:
        """The text from ``lo`` to ``hi``, reading only the nodes over that range."""
        parts: list[Any] = []
        stack: list[tuple[_Node, int]] = []
        at = 0
        for node in self.top:
            stack.append((node, at))
            at += node.length
        stack.reverse()
        while stack:
            node, at = stack.pop()
            if at + node.length <= lo or at >= hi:
                continue
            got = self.open(node)
            if type(got) is list:
                inner = []
                for part in got:
                    inner.append((part, at))
                    at += part.length
                stack.extend(reversed(inner))
            else:
                parts.append(got[max(0, lo - at):hi - at])
        return "".join(parts) if self.want is str else b"".join(parts)


class TextDiff:
    """The differing slice of two split texts given by their ``Joined`` placeholders."""

    def __init__(self, readers: tuple[Reader, Reader], tally: Tally) -> None:
        self.readers, self.tally = readers, tally

    def run(self, a: Joined, b: Joined, la: int, lb: int, da: int, db: int
            ) -> tuple[int, Any, Any] | None:
        """(start, old part, new part), or None if the texts are equal; ``NoLengths`` if a
        node under them does not give its children's lengths."""
        sides = (_Side(self.readers[0], a, da), _Side(self.readers[1], b, db))
        limit = min(la, lb)
        p = self.common(sides, limit, back=False)
        if p == la == lb:
            return None
        s = self.common(sides, limit - p, back=True)
        return p, sides[0].piece(p, la - s), sides[1].piece(p, lb - s)

    @staticmethod
    def common(sides: tuple[_Side, _Side], limit: int, back: bool) -> int:
        """Characters that the two texts share at their front (``back``: at their end), at
        most ``limit``."""
        # stacks of parts, the next one last: a _Node, or [text, characters of it used]
        stacks: list[list[Any]] = [list(s.top) if back else s.top[::-1] for s in sides]
        done = 0
        while stacks[0] and stacks[1] and done < limit:
            x, y = stacks[0][-1], stacks[1][-1]
            nx, ny = type(x) is _Node, type(y) is _Node
            if nx and ny and x.oid == y.oid:
                if x.length != y.length:
                    raise FormatError(f"state node {x.oid} is said to hold {x.length} "
                                      f"characters and {y.length}; a node is corrupt")
                done += x.length
                stacks[0].pop()
                stacks[1].pop()
                continue
            if nx or ny:  # read one level further: the longer node first (both if as long)
                for side, z, other in ((0, x, y), (1, y, x)):
                    if type(z) is _Node and (type(other) is not _Node
                                             or z.length >= other.length):
                        stacks[side].pop()
                        got = sides[side].open(z)
                        if type(got) is list:
                            stacks[side].extend(got if back else reversed(got))
                        elif got:
                            stacks[side].append([got, 0])
                continue
            tx, ty = x[0], y[0]
            n = min(len(tx) - x[1], len(ty) - y[1])
            if back:
                ex, ey = len(tx) - x[1], len(ty) - y[1]
                k = common_prefix(tx[ex - n:ex][::-1], ty[ey - n:ey][::-1])
            else:
                k = common_prefix(tx[x[1]:x[1] + n], ty[y[1]:y[1] + n])
            done += k
            if k < n:
                break
            for stack, item in ((stacks[0], x), (stacks[1], y)):
                item[1] += n
                if item[1] >= len(item[0]):
                    stack.pop()
        return min(done, limit)
