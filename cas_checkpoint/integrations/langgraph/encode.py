"""What a put encodes: only what changed since the last put of the same thread and namespace.

LangGraph stores a channel's value once per channel version: its own savers write a blob only
for the channels in ``new_versions`` and refer to the old blob otherwise, so a value must not
change without a new version (a node changes state by returning an update). CasSaver stores
the whole checkpoint as one state, split into shared nodes (``tree.py``), so it needs the whole
encoding each put; ``PutEncoder`` makes it from the encodings of the last put of that thread
and namespace:

* a channel not in ``new_versions``, at the version and the very value object (``is``) it had
  at the last put, reuses that value's encoding (a channel's ``checkpoint()`` hands out the
  value it holds; a new object, e.g. a snapshot, is encoded again);
* a list (the messages channel, ``add_messages`` or ``operator.add``) that changed is encoded
  item by item: an item that is the very object (``is``) of the last put's list and whose
  attributes are still the very objects they were (a LangChain message's fields, reassigned
  or not) reuses its encoding; the other items (new ones, replaced ones, plain dicts and
  strings) are encoded, each run of them in one codec call. An append encodes the new
  messages, not the list;
* everything else (ids, versions, versions_seen, small channels) is encoded each put.

The pieces are ``codec.encode_nested``'s bytes, joined under their maps' and lists' headers:
exactly ``codec.encode`` of the whole state (``tests/test_lg_encode_once.py`` compares them
over random sequences of puts), so the stored nodes are those of a fresh encoding. What this
cannot see: a value changed in place without a new version (LangGraph's own savers do not
store that change either), and a nested container changed in place inside a message that is
kept (``msg.additional_kwargs["k"] = v``, not ``msg.additional_kwargs = {...}``): the put
stores the message as it was when first saved. Reassigning a field, or returning a new
message (LangGraph's way), is seen.

Memory: a ``PutEncoder`` keeps, per (thread, namespace), the encodings of the last put and
the objects they are of (which the graph holds anyway), for at most ``KEYS`` of them and
``BUDGET`` bytes of encodings in all, the least recently used dropped first; a value encoding
to more than ``BUDGET // 4`` is not kept. Any change to the saver's type registry drops
everything (a class registered since encodes differently). Forgetting costs encoding again,
never correctness.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from operator import is_
from typing import Any

from ...codec import TypeRegistry, encode_nested
from ...errors import SerializationError
from ...scan import item_ends
from ...shapes import array_header, map_header
from ...tree import Encoded

KEYS = 1024  # (thread, namespace) pairs remembered
BUDGET = 64 * 1024 * 1024  # bytes of encodings remembered in all

_SCALARS = (str, int, float, bool, bytes, type(None))


def _snapshot(item: Any) -> tuple[Any, ...] | None:
    """The very objects an item's encoding was made of, for a later ``is`` check: its
    attributes (and a pydantic model's extra fields); None for an item that is never reused
    (plain data, objects without a ``__dict__``)."""
    if type(item) in _SCALARS or type(item) in (list, dict, tuple):
        return None
    attrs = getattr(item, "__dict__", None)
    if type(attrs) is not dict:
        return None
    extra = getattr(item, "__pydantic_extra__", None)
    if extra:
        return (len(attrs), *attrs.values(), *extra.keys(), *extra.values())
    return (len(attrs), *attrs.values())


def _same(now: tuple[Any, ...], snap: tuple[Any, ...] | None) -> bool:
    """Whether two snapshots hold the very same objects."""
    return snap is not None and len(now) == len(snap) and all(map(is_, now, snap))


@dataclass(slots=True)
class _Value:
    """A channel's value at a put, and its encoding; for a list, each item, its snapshot and
    where its bytes end (after the list's header)."""

    version: Any
    value: Any
    data: bytes
    items: list[Any] | None = None
    snaps: list[tuple[Any, ...] | None] | None = None
    ends: list[int] | None = None  # each item's end in data, from the start of data
    where: dict[int, int] | None = None  # id(item) -> its index (reusable items only)


@dataclass(slots=True)
class _Thread:
    values: dict[str, _Value]
    size: int


class PutEncoder:
    """A checkpoint's state and its encoding, from the encodings of the thread's last put (see
    the module docs). Counters: ``encoded`` items or values encoded, ``reused`` reused."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: OrderedDict[tuple[str, str], _Thread] = OrderedDict()
        self._bytes = 0
        self._types: tuple[Any, ...] = ()
        self.encoded = self.reused = 0

    def state(self, thread_id: str, ns: str, checkpoint: Mapping[str, Any],
              new_versions: Mapping[str, Any], types: TypeRegistry) -> Any:
        """What to save for ``checkpoint``: an ``Encoded`` state, or the plain dict when the
        pieces cannot be encoded (then the save encodes it whole, and raises the codec's
        error with the value's path)."""
        state = dict(checkpoint)
        values = state.get("channel_values")
        if type(values) is not dict:
            return state
        self._check_types(types)
        key = (thread_id, ns)
        with self._lock:
            old = self._threads.get(key)
        versions = state.get("channel_versions")
        if not isinstance(versions, Mapping):
            versions = {}
        kept: dict[str, _Value] = {}
        try:
            parts = [map_header(len(state))]
            for name, value in state.items():
                parts.append(encode_nested(name, 1, types=types))
                if name != "channel_values":
                    parts.append(encode_nested(value, 1, types=types))
                    continue
                parts.append(map_header(len(values)))
                for channel, cv in values.items():
                    parts.append(encode_nested(channel, 2, types=types))
                    was = old.values.get(channel) if old is not None else None
                    got = self._value(cv, versions.get(channel), channel in new_versions, was,
                                      types)
                    parts.append(got.data)
                    if type(channel) is str:
                        kept[channel] = got
        except SerializationError:
            return state
        self._remember(key, kept)
        return Encoded(state, b"".join(parts))

    def _check_types(self, types: TypeRegistry) -> None:
        """Drop everything when the registry is not the one the encodings were made with."""
        now = (types, types.stand_in, types.unknown, *types._by_class.values())
        if len(now) != len(self._types) or not all(map(is_, now, self._types)):
            with self._lock:
                self._threads.clear()
                self._bytes = 0
                self._types = now

    def _value(self, value: Any, version: Any, changed: bool, was: _Value | None,
               types: TypeRegistry) -> _Value:
        if (was is not None and not changed and version is not None and was.version == version
                and was.value is value and (was.items is None or len(was.items) == len(value))):
            self.reused += 1
            return was
        if type(value) is list:
            return self._list(value, version, was, types)
        self.encoded += 1
        return _Value(version, value, encode_nested(value, 2, types=types))

    def _list(self, value: list[Any], version: Any, was: _Value | None,
              types: TypeRegistry) -> _Value:
        """A list at depth 2 (a channel's value), reusing the items of ``was`` that are the
        same objects, unchanged."""
        head = array_header(len(value))
        parts: list[bytes | memoryview] = [head]
        ends: list[int] = []
        snaps: list[tuple[Any, ...] | None] = []
        where: dict[int, int] = {}
        pos = len(head)
        run: list[Any] = []  # items to encode, in one call

        def flush() -> None:
            nonlocal pos
            if not run:
                return
            data = encode_nested(run, 2, types=types)
            start = len(array_header(len(run)))
            got = item_ends(data, start, len(run))
            parts.append(memoryview(data)[start:])
            ends.extend(pos + e - start for e in got)
            pos += len(data) - start
            self.encoded += len(run)
            run.clear()

        old_where = was.where if was is not None and was.where is not None else {}
        old = was if old_where else None
        for i, item in enumerate(value):
            snap = _snapshot(item)
            j = old_where.get(id(item)) if snap is not None else None
            if snap is not None and j is not None and old is not None:
                assert old.items is not None and old.snaps is not None and old.ends is not None
                if old.items[j] is item and _same(snap, old.snaps[j]):
                    flush()
                    a = old.ends[j - 1] if j else len(array_header(len(old.items)))
                    parts.append(memoryview(old.data)[a:old.ends[j]])
                    pos += old.ends[j] - a
                    ends.append(pos)
                    self.reused += 1
                    snaps.append(snap)
                    where[id(item)] = i
                    continue
            run.append(item)
            snaps.append(snap)
            if snap is not None:
                where[id(item)] = i
        flush()
        return _Value(version, value, b"".join(parts), list(value), snaps, ends, where)

    def _remember(self, key: tuple[str, str], values: dict[str, _Value]) -> None:
        keep = {k: v for k, v in values.items() if len(v.data) <= BUDGET // 4}
        entry = _Thread(keep, sum(len(v.data) for v in keep.values()))
        with self._lock:
            old = self._threads.pop(key, None)
            if old is not None:
                self._bytes -= old.size
            self._threads[key] = entry
            self._bytes += entry.size
            while self._threads and (len(self._threads) > KEYS or self._bytes > BUDGET):
                self._bytes -= self._threads.popitem(last=False)[1].size
