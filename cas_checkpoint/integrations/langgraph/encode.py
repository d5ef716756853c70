"""What a put encodes: only what changed since the last put of the same thread and namespace.

LangGraph stores a channel's value once per channel version: its own savers write a blob only
for the channels in ``new_versions`` and refer to the old blob otherwise, so a value must not
change without a new version (a node changes state by returning an update). CasSaver stores
the whole checkpoint as one state, split into shared nodes (``build.py``), so it needs the whole
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

Each invoke starts with a ``get_tuple``, whose state is new objects decoded from storage; when
it is the checkpoint this encoder's last put of the thread made (``saved``, ``loaded``), its
lists' items are remembered as the objects of the bytes they were decoded from, those whose
bytes round trip (the object the load decoded, encoded again: the same bytes; a registered
class that rebuilds an object otherwise is encoded again). So an invoke's first put too
encodes only the input. An item's round trip is tried once, at the first load that would
reuse it, not at the put that encoded it: a put does not decode what it has just encoded.

A subgraph's namespace (``checkpoint_ns``, new for each task) starts from the root namespace's
lists: the messages a parent hands its subgraph are the same objects.

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
from itertools import accumulate, chain, compress, count, repeat
from operator import add, attrgetter, is_, is_not
from typing import Any

from cas_checkpoint.format.codec import TypeRegistry, encode_nested
from cas_checkpoint.tree.build import Encoded
from cas_checkpoint.tree.cuts import item_ends
from cas_checkpoint.tree.shapes import array_header, map_header

KEYS = 256  # (thread, namespace) pairs remembered
BUDGET = 16 * 1024 * 1024  # bytes of encodings remembered in all (the objects they are of
# are held too: the graph holds those of a live thread anyway)


def _attrs(items: list[Any]) -> tuple[list[int], list[Any]]:
    """What the encodings of ``items`` were made of, for a later ``is`` check: per item the
    number of its attributes (-1: an item never reused: plain data, an object without a
    ``__dict__`` or with pydantic extra fields), and all their values in one list. C loops
    when every item is such an object (a list of messages), else one Python step an item."""
    try:
        dicts: list[dict[str, Any]] = list(map(_DICT, items))
        if not any(map(getattr, items, repeat("__pydantic_extra__"), repeat(None))):
            return list(map(len, dicts)), list(chain.from_iterable(map(dict.values, dicts)))
    except (AttributeError, TypeError):  # (an item without a __dict__: a str, a dict...)
        pass
    lens: list[int] = []
    flat: list[Any] = []
    for item in items:
        attrs = None if type(item) in _PLAIN else getattr(item, "__dict__", None)
        if type(attrs) is dict and not getattr(item, "__pydantic_extra__", None):
            lens.append(len(attrs))
            flat += attrs.values()
        else:
            lens.append(-1)
    return lens, flat


def _offsets(lens: list[int]) -> list[int]:
    """Where each item's values start in ``flat`` (``_attrs``), and where the last ends: the
    running sum of ``lens``, an item never reused (-1) counting 0 (without a ``max`` call an
    item when there is none: a list of messages)."""
    if not lens or min(lens) >= 0:
        return list(accumulate(lens, initial=0))
    return list(accumulate(map(max, lens, repeat(0)), initial=0))


_KEYS: dict[str, bytes] = {}  # recent channel and field names (exactly str) -> their bytes
KEYS_KEPT = 4096


def _key(name: str) -> bytes:
    """``encode_nested(name, ...)`` of a str (the same at any depth, whatever the types)."""
    got = _KEYS.get(name)
    if got is None:
        got = encode_nested(name, 0)
        if len(name) <= 256:
            if len(_KEYS) >= KEYS_KEPT:
                _KEYS.clear()
            _KEYS[name] = got
    return got


_DICT = attrgetter("__dict__")
_PLAIN = frozenset({str, int, float, bool, bytes, type(None), list, dict, tuple})


@dataclass(slots=True)
class _Value:
    """A channel's value at a put, and its encoding; for a list, each item (``items``), where
    its bytes end in ``data`` (``ends``), whether they round trip (``exact``), and what they
    were made of (``lens`` and ``flat``, as ``_attrs`` gives them; ``offs``: where each item's
    values start in ``flat``)."""

    version: Any
    value: Any
    data: bytes
    items: list[Any] | None = None
    ends: list[int] | None = None
    exact: list[bool | None] | None = None  # None: its round trip is not tried yet
    lens: list[int] | None = None
    flat: list[Any] | None = None
    offs: list[int] | None = None
    where: dict[int, int] | None = None  # id(item) -> its index, built when first needed;
    # an append's value shares its list's (entries past ``items`` are another value's)

    def snap(self, j: int) -> list[Any] | None:
        """Item ``j``'s attribute values when it was encoded (None: it is never reused)."""
        assert self.lens is not None and self.flat is not None and self.offs is not None
        n = self.lens[j]
        return None if n < 0 else self.flat[self.offs[j]:self.offs[j] + n]


@dataclass(slots=True)
class _Thread:
    values: dict[str, _Value]
    size: int
    lg: Any = None  # the LangGraph checkpoint id of the put that made them
    saved: str | None = None  # the store checkpoint whose state these encodings make


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
        try:
            self._check_types(types)
        except RuntimeError:  # (a class registered meanwhile, from another thread)
            return state
        key = (thread_id, ns)
        with self._lock:
            old = self._threads.get(key)
            root = self._threads.get((thread_id, "")) if ns else None
        versions = state.get("channel_versions")
        if not isinstance(versions, Mapping):
            versions = {}
        kept: dict[str, _Value] = {}
        run: dict[Any, Any] = {}  # the items around channel_values, each run in one call

        def flush() -> None:
            if run:  # (a map's pairs are its keys' and values' bytes after its header)
                parts.append(encode_nested(run, 0, types=types)[len(map_header(len(run))):])
                run.clear()

        try:
            parts = [map_header(len(state))]
            for name, value in state.items():
                if name != "channel_values":
                    run[name] = value
                    continue
                flush()
                parts.append(_key(name) if type(name) is str
                             else encode_nested(name, 1, types=types))
                parts.append(map_header(len(values)))
                for channel, cv in values.items():
                    parts.append(_key(channel) if type(channel) is str
                                 else encode_nested(channel, 2, types=types))
                    was = old.values.get(channel) if old is not None else None
                    changed = was is None or channel in new_versions
                    if was is None and root is not None and type(cv) is list:
                        # a subgraph's first put: its messages are the parent's objects
                        was = root.values.get(channel)
                        was = was if was is not None and was.items is not None else None
                    got = self._value(cv, versions.get(channel), changed, was, types)
                    parts.append(got.data)
                    if type(channel) is str:
                        kept[channel] = got
            flush()
        except Exception:  # (SerializationError; or an object's __getattr__ that raised)
            return state  # the save encodes it whole: its error names the value's place
        self._remember(key, kept, state.get("id"))
        return Encoded(state, b"".join(parts))

    def saved(self, thread_id: str, ns: str, state: Any, cid: str) -> None:
        """``state`` (``state()``'s answer) was saved as store checkpoint ``cid``."""
        with self._lock:
            got = self._threads.get((thread_id, ns))
        if got is not None and type(state) is Encoded and got.lg == state.value.get("id"):
            got.saved = cid

    def loaded(self, thread_id: str, ns: str, cid: str, checkpoint: Any) -> None:
        """A load gave ``checkpoint``, the state of store checkpoint ``cid``, as new objects
        (LangGraph makes its channels of them): when that is the state this encoder's last
        put of the thread made, its lists' items are decoded from the bytes remembered, so
        they are remembered as those bytes' objects, each one whose bytes were seen to round
        trip (the object decoded, encoded again: the same bytes) at the first load of them.
        The next put then encodes only what the graph adds, not every message again."""
        try:
            self._seed(thread_id, ns, cid, checkpoint)
        except Exception:  # (an object's __getattr__ that raised: nothing is learned)
            return

    def _seed(self, thread_id: str, ns: str, cid: str, checkpoint: Any) -> None:
        with self._lock:
            got = self._threads.get((thread_id, ns))
        if got is None or got.saved != cid or type(checkpoint) is not dict:
            return
        values = checkpoint.get("channel_values")
        versions = checkpoint.get("channel_versions")
        if type(values) is not dict or not isinstance(versions, Mapping):
            return
        seeded: dict[str, _Value] = {}
        for channel, was in got.values.items():
            value = values.get(channel)
            if (type(value) is not list or was.items is None or was.exact is None
                    or len(value) != len(was.items) or versions.get(channel) != was.version):
                continue
            exact = self._exact(was, value)
            if exact is None:  # (the registry changed since: nothing is reused)
                return
            lens, flat = _attrs(value)
            if not all(exact):  # (an item whose bytes do not round trip: not reused)
                offs = _offsets(lens)
                keep = [n >= 0 and ok for n, ok in zip(lens, exact, strict=True)]
                flat = [v for ok, a, b in zip(keep, offs, offs[1:], strict=False) if ok
                        for v in flat[a:b]]
                lens = [n if ok else -1 for n, ok in zip(lens, keep, strict=True)]
            offs = _offsets(lens)
            seeded[channel] = _Value(was.version, value, was.data, list(value), was.ends,
                                     was.exact, lens, flat, offs)
        if seeded:
            with self._lock:
                if self._threads.get((thread_id, ns)) is got:
                    got.values = {**got.values, **seeded}

    def _exact(self, was: _Value, items: list[Any]) -> list[bool | None] | None:
        """``was.exact``, its items whose round trip was not tried yet tried now on ``items``
        (the objects a load decoded from those bytes: in one encoding of them all; each answer
        kept for the next load); None when the saver's type registry is not the one they
        were encoded with."""
        assert was.exact is not None and was.ends is not None and was.items is not None
        todo = [j for j, ok in enumerate(was.exact) if ok is None]
        if not todo:
            return was.exact
        now = self._types
        if not now or not self._same_types(now[0]):
            return None
        types: TypeRegistry = now[0]
        data = memoryview(was.data)
        bounds = [len(array_header(len(was.items))), *was.ends]
        head = array_header(len(todo))
        parts: list[bytes | memoryview] = [head]
        ends: list[int] = []
        pos = len(head)
        for j in todo:
            parts.append(data[bounds[j]:bounds[j + 1]])
            pos += bounds[j + 1] - bounds[j]
            ends.append(pos)
        got = self._round_trips([items[j] for j in todo], b"".join(parts), len(head), ends,
                                types)
        for j, ok in zip(todo, got, strict=True):
            was.exact[j] = ok
        return was.exact

    def _same_types(self, types: TypeRegistry) -> bool:
        now = (types, *types.entries())
        return len(now) == len(self._types) and all(map(is_, now, self._types))

    def _check_types(self, types: TypeRegistry) -> None:
        """Drop everything when the registry is not the one the encodings were made with."""
        if not self._same_types(types):
            now = (types, *types.entries())
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
        same objects with the same attributes: the prefix they share in C loops (an append),
        the other items one by one (an item moved, e.g. after a RemoveMessage)."""
        head = array_header(len(value))
        parts: list[bytes | memoryview] = [head]
        ends: list[int] = []
        exact: list[bool | None] = []
        pos = len(head)
        k = 0  # items of the common prefix reused at once
        if was is not None and was.items is not None and was.ends is not None:
            k = next(compress(count(), map(is_not, value, was.items)),
                     min(len(value), len(was.items)))
            if k:
                assert was.lens is not None and was.flat is not None
                lens, flat = _attrs(value[:k])
                if -1 in lens:  # (an item never reused: the prefix ends before it)
                    k = lens.index(-1)
                    del lens[k:], flat[sum(lens):]
                if lens != was.lens[:k] or not all(map(is_, flat, was.flat)):
                    k = 0
            if k:
                assert was.exact is not None
                a = len(array_header(len(was.items)))
                parts.append(memoryview(was.data)[a:was.ends[k - 1]])
                ends += was.ends[:k] if a == pos else map(add, was.ends[:k], repeat(pos - a))
                pos += was.ends[k - 1] - a
                exact += was.exact[:k]
                self.reused += k
        rest_lens, rest_flat = _attrs(value[k:])
        run: list[Any] = []  # items to encode, in one call
        where: dict[int, int] | None = None

        def flush() -> None:
            nonlocal pos
            if not run:
                return
            data = encode_nested(run, 2, types=types)
            start = len(array_header(len(run)))
            got = item_ends(data, start, len(run))
            parts.append(memoryview(data)[start:])
            ends.extend(pos + e - start for e in got)
            exact.extend(repeat(None, len(got)))  # (tried at a load that would reuse them)
            pos += len(data) - start
            self.encoded += len(run)
            run.clear()

        at = 0  # where item i's values start in rest_flat
        for item, n in zip(value[k:], rest_lens, strict=True):
            if n >= 0 and was is not None and was.items is not None:
                if where is None:  # (built only when an item is looked for)
                    where = was.where
                    if where is None:
                        where = was.where = dict(zip(map(id, was.items), count()))
                j = where.get(id(item))
                old = (None if j is None or j >= len(was.items) or was.items[j] is not item
                       else was.snap(j))
                if old is not None and len(old) == n and all(map(is_, rest_flat[at:at + n],
                                                                 old)):
                    assert j is not None and was.ends is not None and was.exact is not None
                    flush()
                    a = was.ends[j - 1] if j else len(array_header(len(was.items)))
                    parts.append(memoryview(was.data)[a:was.ends[j]])
                    pos += was.ends[j] - a
                    ends.append(pos)
                    exact.append(was.exact[j])
                    self.reused += 1
                    at += n
                    continue
            run.append(item)
            at += max(n, 0)
        flush()
        share = None
        if k:
            assert was is not None and was.offs is not None and was.items is not None
            lens += rest_lens
            flat += rest_flat
            # the prefix's offsets are the old value's (its items' lens are the same)
            offs = was.offs[:k + 1]
            offs += accumulate(map(max, rest_lens, repeat(0)), initial=offs[-1])
            del offs[k + 1]  # (accumulate repeats its initial value)
            if k == len(was.items) and was.where is not None:  # an append: its index too
                share = was.where
                for i in range(k, len(value)):
                    share.setdefault(id(value[i]), i)
        else:
            lens, flat = rest_lens, rest_flat
            offs = list(accumulate(map(max, lens, repeat(0)), initial=0))
        return _Value(version, value, b"".join(parts), list(value), ends, exact, lens, flat,
                      offs, share)

    def _round_trips(self, objects: list[Any], data: bytes, start: int, ends: list[int],
                     types: TypeRegistry) -> list[bool]:
        """Per item of the encoded list ``data`` (items from ``start``, each ending at
        ``ends``), which a load decoded as ``objects``: whether that object encodes to the same
        bytes (so a put may take those bytes for it while it and its attributes are the very
        objects they were). The load's own objects are encoded, not a second decoding of the
        bytes: what a put reuses the bytes for is those objects."""
        try:
            again = encode_nested(objects, 2, types=types)
        except Exception:  # (CasError, or a registered class's hook that raised)
            return [False] * len(ends)
        if again == data:
            return [True] * len(ends)
        if again[:start] != data[:start]:
            return [False] * len(ends)
        other = item_ends(again, start, len(ends))
        return [a == b and data[x:a] == again[x:a]
                for a, b, x in zip(ends, other, [start, *ends], strict=False)]

    def _remember(self, key: tuple[str, str], values: dict[str, _Value], lg: Any) -> None:
        keep = {k: v for k, v in values.items() if len(v.data) <= BUDGET // 4}
        entry = _Thread(keep, sum([len(v.data) for v in keep.values()]), lg)
        with self._lock:
            old = self._threads.pop(key, None)
            if old is not None:
                self._bytes -= old.size
            self._threads[key] = entry
            self._bytes += entry.size
            while self._threads and (len(self._threads) > KEYS or self._bytes > BUDGET):
                self._bytes -= self._threads.popitem(last=False)[1].size
