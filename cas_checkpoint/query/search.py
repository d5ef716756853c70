"""Search the str values of checkpoints' states, reading each distinct tree node once."""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cas_checkpoint.engine import locate
from cas_checkpoint.engine.core import Core
from cas_checkpoint.engine.model import check_id
from cas_checkpoint.engine.steps import Step
from cas_checkpoint.errors import FormatError, InvalidArgumentError, NotFoundError
from cas_checkpoint.format.heads import Head
from cas_checkpoint.format.objects import CheckpointId, ObjectId, Record
from cas_checkpoint.query.diff import node_getter
from cas_checkpoint.query.walk import (
    Joined,
    Link,
    Reader,
    Stored,
    Tally,
    budget_for,
    field_seg,
    index_seg,
    key_seg,
    snippet,
    text,
)
from cas_checkpoint.tree.load import check_lengths
from cas_checkpoint.tree.shapes import BYTES, DICT, LIST, STR, TUPLE, VALUE

__all__ = ["MAX_PATTERN", "Match", "SearchResult", "search"]

MAX_PATTERN = 1000  # characters of a query (a regex is not run with a timeout: keep it short)
MAX_MATCHES = 100_000  # matches returned when no limit is given (then ``truncated`` says so)
MEMO_MAX = 1 << 16  # node results kept

Progress = Callable[[int, int], object]

_OTHER, _LIST, _DICT, _STR, _BYTES = range(5)
_KIND_OF_SHAPE = {LIST: _LIST, TUPLE: _LIST, DICT: _DICT, STR: _STR, BYTES: _BYTES}
_KIND_NAMES = ("value", "list", "dict", "str", "bytes")


@dataclass(frozen=True, slots=True)
class Match:
    """A str value that matched: where (``path`` from the state's root, as in ``diff``) and
    ``snippet``, about 40 characters of context either side, on one line."""

    thread_id: str
    checkpoint_id: CheckpointId
    path: str
    snippet: str


@dataclass(frozen=True, slots=True)
class SearchResult:
    """What ``search`` returns: ``matches`` in order (threads sorted; each thread's checkpoints
    newest first; within a state, document order), the distinct tree nodes read and their
    bytes, the checkpoints searched, and ``truncated``: it stopped at ``limit`` matches (or at
    ``MAX_MATCHES`` without one), so there may be more."""

    matches: list[Match]
    nodes_read: int
    bytes_read: int
    checkpoints_searched: int
    truncated: bool = False


# (first list index or None, the rest of the path, snippet), relative to a node
_Rel = tuple[int | None, str, str]


@dataclass(frozen=True, slots=True)
class _Res:
    kind: int  # what the node's value is: _LIST, _DICT...
    count: int  # items, for a list (part)
    matches: tuple[_Rel, ...]


def compile_query(query: object, regex: bool) -> re.Pattern[str]:
    if not isinstance(query, str) or not query:
        raise InvalidArgumentError(f"the query must be a non-empty str, not {query!r}")
    if len(query) > MAX_PATTERN:
        raise InvalidArgumentError(f"the query is {len(query)} characters long, more than "
                                   f"{MAX_PATTERN}; search for a shorter phrase")
    if not regex:
        return re.compile(re.escape(query), re.IGNORECASE)
    try:
        pattern = re.compile(query)
    except re.error as exc:
        raise InvalidArgumentError(f"the query is not a valid regular expression ({exc}); "
                                   "fix it, or pass regex=False to search for it as text"
                                   ) from None
    if pattern.search("") is not None:
        raise InvalidArgumentError(f"the regular expression {query!r} matches an empty string, "
                                   "so every value would match; make it match some text")
    return pattern


def _check_limit(limit: object) -> int | None:
    if limit is None:
        return None
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise InvalidArgumentError(f"limit must be a positive int or None, not {limit!r}")
    return limit


def search(core: Core, query: str, *, regex: bool = False, thread_id: str | None = None,
           all_history: bool = False, limit: int | None = None,
           progress: Progress | None = None, checkpoint_id: CheckpointId | None = None
           ) -> Step[SearchResult]:
    """The step behind ``CheckpointStore.search``."""
    if checkpoint_id is not None and (thread_id is None or all_history):
        raise InvalidArgumentError("checkpoint_id searches one checkpoint of one thread: pass "
                                   "thread_id= with it, and not all_history=True")
    pattern = compile_query(query, regex)
    limit = _check_limit(limit)
    if progress is not None and not callable(progress):
        raise InvalidArgumentError("progress must be a callable progress(done, total) or None")
    searcher = Searcher(pattern, limit if limit is not None else MAX_MATCHES, core.types)
    if thread_id is not None:  # (each retried when a writer deleted what it read: locate.py)
        return (yield from core.at_ref(thread_id, lambda ref: _search(
            core, searcher, [(thread_id, ref.head)], all_history, checkpoint_id, progress)))
    return (yield from locate.across_refs(core, lambda refs: _search(
        core, searcher, [(t, r.head) for t, r in refs if r is not None and r.head.head is not None],
        all_history, checkpoint_id, progress)))


def _search(core: Core, searcher: Searcher, pairs: list[tuple[str, Head]], all_history: bool,
            checkpoint_id: CheckpointId | None, progress: Progress | None
            ) -> Step[SearchResult]:
    jobs: list[tuple[str, Head, CheckpointId]] = []
    if all_history:  # a checkpoint that forked threads share is searched once, in the first
        seen: set[str] = set()
        for t, head in pairs:
            view = yield from core.objects.view(head)
            for entry in core.refs.iter_newest_first(head, view):
                if entry.id not in seen:
                    seen.add(entry.id)
                    jobs.append((t, head, entry.id))
    elif checkpoint_id is not None:
        cid = check_id(checkpoint_id)
        t, head = pairs[0]
        view = yield from core.objects.view(head)
        if not any(e.id == cid for e in core.refs.iter_newest_first(head, view)):
            raise NotFoundError(f"checkpoint {cid} is not in thread {t!r}; history({t!r}) "
                                "lists its checkpoints")
        jobs = [(t, head, cid)]
    else:
        jobs = [(t, head, head.head) for t, head in pairs if head.head is not None]
    cap = searcher.cap
    out: list[Match] = []
    truncated = False
    searched = 0
    for t, head, cid in jobs:
        view = yield from core.objects.view(head)
        record = Record.decode(view.get(cid))
        searcher.tally.budget = budget_for([record.size])
        reader = Reader(node_getter(view, record), core.types, searcher.tally, raw_objects=True)
        got = searcher.result(reader, record.root)
        searched += 1
        for first, rest, snip in got.matches[:cap - len(out)]:
            out.append(Match(t, cid, ("" if first is None else index_seg(first)) + rest, snip))
        if progress is not None:
            progress(searched, len(jobs))
        if len(out) >= cap:  # (there may be more)
            truncated = True
            break
    return SearchResult(out, len(searcher.tally.seen), searcher.tally.bytes, searched,
                        truncated)


class _Frame:
    __slots__ = ("depth", "got", "node", "pending")

    def __init__(self, node: Any, depth: int, pending: list[ObjectId]) -> None:
        self.node, self.depth, self.pending = node, depth, pending
        self.got: dict[str, _Res] = {}


class Searcher:
    """Node results by id (see the module docstring), shared by every checkpoint searched."""

    def __init__(self, pattern: re.Pattern[str], cap: int, types: Any) -> None:
        self.pattern, self.cap, self.types = pattern, cap, types
        self.memo: OrderedDict[str, _Res] = OrderedDict()
        self.tally = Tally()

    def _remember(self, oid: str, res: _Res) -> None:
        self.memo[oid] = res
        self.memo.move_to_end(oid)
        while len(self.memo) > MEMO_MAX:
            self.memo.popitem(last=False)

    def result(self, reader: Reader, root: ObjectId) -> _Res:
        hit = self.memo.get(root)
        if hit is not None:
            self.memo.move_to_end(root)
            return hit
        stack = [self._frame(reader, root, 0)]
        while True:
            frame = stack[-1]
            if frame.pending:
                child = frame.pending.pop()
                if child in frame.got:
                    continue
                hit = self.memo.get(child)
                if hit is not None:
                    self.memo.move_to_end(child)
                    frame.got[child] = hit
                else:
                    stack.append(self._frame(reader, child, frame.depth + 1))
                continue
            stack.pop()
            res = self._finish(reader, frame)
            self._remember(frame.node.oid, res)
            if not stack:
                return res
            stack[-1].got[frame.node.oid] = res

    def _frame(self, reader: Reader, oid: ObjectId, depth: int) -> _Frame:
        node = reader.outline(oid, depth)
        if node.shape in (LIST, TUPLE, DICT):
            pending = list(node.children)
        elif node.shape == VALUE and node.children:
            pending = [o for lazy in _lazies(node.value) for o in _needs(lazy)]
        else:
            pending = []
        return _Frame(node, depth, pending[::-1])

    def _text(self, reader: Reader, joined: Joined, depth: int) -> _Res:
        if joined.shape == BYTES:  # bytes are not searched: no need to read them
            return _Res(_BYTES, 0, ())
        return self._in_str(str(text(reader, joined, depth)))

    def _in_str(self, value: str) -> _Res:
        m = self.pattern.search(value)
        found: tuple[_Rel, ...] = () if m is None else (
            (None, "", snippet(value, m.start(), m.end())),)
        return _Res(_STR, 0, found)

    def _combine(self, oid: str, shape: int, parts: list[_Res],
                 lengths: tuple[int, ...] | None = None) -> _Res:
        """The result of children joined into one value of ``shape`` (a list's parts checked
        against their lengths, if given)."""
        want = _KIND_OF_SHAPE[shape]
        matches: list[_Rel] = []
        count = 0
        for part in parts:
            if part.kind != want:
                raise FormatError(f"state node {oid} joins a {_KIND_NAMES[part.kind]} into a "
                                  f"{_KIND_NAMES[want]}; the node is corrupt")
            for first, rest, snip in part.matches:
                if len(matches) >= self.cap:
                    break
                matches.append((None if first is None else first + count, rest, snip))
            count += part.count
        if lengths is not None and want == _LIST:
            check_lengths(oid, lengths, [part.count for part in parts])
        return _Res(want, count, tuple(matches))

    def _lazy(self, reader: Reader, frame: _Frame, lazy: Link | Joined) -> _Res:
        if isinstance(lazy, Link):
            return frame.got[lazy.oid]
        if lazy.shape in (STR, BYTES):
            return self._text(reader, lazy, frame.depth)
        return self._combine(frame.node.oid, lazy.shape, [frame.got[o] for o in lazy.oids],
                             lazy.lengths)

    def _finish(self, reader: Reader, frame: _Frame) -> _Res:
        node = frame.node
        if node.shape != VALUE:
            joined = Joined(node.shape, node.children, node.lengths)
            if node.shape in (STR, BYTES):
                return self._text(reader, joined, frame.depth)
            return self._combine(node.oid, node.shape, [frame.got[o] for o in node.children],
                                 node.lengths)
        value = node.value
        kind = type(value)
        if kind is Link or kind is Joined:
            return self._lazy(reader, frame, value)
        if kind is str:
            return self._in_str(value)
        matches: list[_Rel] = []
        # (value, first index, path so far as a chain of (parent, segment))
        stack: list[tuple[Any, int | None, Any]] = []
        if kind is list or kind is tuple:
            stack.extend((v, i, None) for i, v in _reversed_items(value))
        elif kind is dict:
            stack.extend((v, None, (None, key_seg(k))) for k, v in reversed(value.items()))
        elif kind is Stored:
            stack.extend(_fields(value, None, None))
        while stack and len(matches) < self.cap:
            item, first, chain = stack.pop()
            t = type(item)
            if t is str:
                m = self.pattern.search(item)
                if m is not None:
                    matches.append((first, _chain(chain),
                                    snippet(item, m.start(), m.end())))
            elif t is list or t is tuple:
                stack.extend((v, first, (chain, index_seg(i))) for i, v in _reversed_items(item))
            elif t is dict:
                stack.extend((v, first, (chain, key_seg(k))) for k, v in reversed(item.items()))
            elif t is Stored:
                stack.extend(_fields(item, first, chain))
            elif t is Link or t is Joined:
                sub = self._lazy(reader, frame, item)
                where = _chain(chain)
                for cfirst, rest, snip in sub.matches:
                    if len(matches) >= self.cap:
                        break
                    seg = "" if cfirst is None else index_seg(cfirst)
                    matches.append((first, where + seg + rest, snip))
        out_kind = _LIST if kind in (list, tuple) else _DICT if kind is dict else (
            _BYTES if kind is bytes else _OTHER)
        count = len(value) if out_kind == _LIST else 0
        return _Res(out_kind, count, tuple(matches))


def _fields(obj: Stored, first: int | None, chain: Any) -> list[tuple[Any, int | None, Any]]:
    """Stack entries for a registered object's stored data, last field first."""
    data = obj.data
    if type(data) is dict:
        return [(v, first, (chain, field_seg(k))) for k, v in reversed(data.items())]
    return [(data, first, (chain, ".value"))]


def _reversed_items(seq: list[Any] | tuple[Any, ...]) -> Any:
    return ((i, seq[i]) for i in range(len(seq) - 1, -1, -1))


def _chain(chain: Any) -> str:
    parts: list[str] = []
    while chain is not None:
        chain, seg = chain
        parts.append(seg)
    return "".join(reversed(parts))


def _lazies(value: Any) -> list[Link | Joined]:
    """The placeholders in a decoded node's value, in document order."""
    out: list[Link | Joined] = []
    stack = [value]
    while stack:
        item = stack.pop()
        t = type(item)
        if t is Link or t is Joined:
            out.append(item)
        elif t is list or t is tuple:
            stack.extend(reversed(item))
        elif t is dict:
            stack.extend(reversed(item.values()))
    return out


def _needs(lazy: Link | Joined) -> tuple[ObjectId, ...]:
    """Children whose results a placeholder needs (a split str is read as text instead)."""
    if isinstance(lazy, Link):
        return (lazy.oid,)
    return () if lazy.shape in (STR, BYTES) else lazy.oids
