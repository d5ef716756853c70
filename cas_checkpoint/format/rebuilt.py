"""Objects the decoder rebuilt, kept by the exact bytes they were rebuilt from, so that decoding
those bytes again copies the object instead of building it again. Pure code.

A LangGraph state's messages are decoded at every read of the thread (each ``get_tuple``, each
new saver): 400 messages at 200 turns, each one a class's ``__init__`` and pydantic's
validation (~4 us each). The same bytes always rebuild an equal object, so the second time
a copy does (pydantic's own ``__copy__``, ~1 us).

Rules, so that a copy is what a decode would have given:

* keyed by the object's whole stored payload (its class name and data), and used only by a
  registry that maps that name to the very class, with an equal entry;
* kept only for a pydantic model rebuilt by its class from its stored dict, whose attributes
  are exactly that dict (nothing a default factory made, nothing a validator changed), each
  an immutable scalar or plain data (dicts and lists of exactly str, bytes, int, float, bool,
  None: what msgpack gives back exactly, e.g. a message's ``tool_calls`` and
  ``response_metadata``), with no extra fields or private attributes holding anything: a copy
  shares only immutable values, and gets new containers (a container unpacked from its
  msgpack bytes, kept with the object: in C, as deep as the data);
* the object kept is never handed out (a miss returns the object built, and keeps a copy),
  so nothing a caller does to what it got changes what the next decode gives;
* kept the second time its bytes are decoded (the first only notes them: ~0.1 us, not the
  ~5 us that checking and copying an object costs), so a read of states this process never
  read before costs what it did, and one read again is copies.

Bounded: two generations of at most ``KEPT`` entries and ``KEPT_BYTES`` key bytes each;
a key found in the older one moves to the newer one, the older one is dropped when the newer
one is full. Forgetting costs building the object again, never correctness."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack

KEPT = 1 << 15  # entries per generation
KEPT_BYTES = 8 << 20  # key bytes per generation
MAX_KEY = 16 << 10  # a payload longer than this is not kept

_SCALARS = frozenset({str, int, float, bool, bytes, type(None)})


@dataclass(frozen=True, slots=True)
class Kept:
    """An object rebuilt from a payload (``obj``, never handed out), its class and registry
    entry, and its attributes that are containers (new ones in each copy): the empty dicts,
    the empty lists, and the others' msgpack bytes."""

    cls: type
    entry: Any
    obj: Any
    dicts: tuple[str, ...]
    lists: tuple[str, ...]
    plain: tuple[tuple[str, bytes], ...]
    copy: Callable[[Any], Any]

    def copy_out(self) -> Any:
        return _copy(self.copy, self.obj, self.dicts, self.lists, self.plain)


SEEN: Any = object()  # a payload decoded once (its object is kept the next time)


class Rebuilt:
    """The kept objects by payload (see the module docs); safe to use from several threads."""

    def __init__(self, kept: int = KEPT, kept_bytes: int = KEPT_BYTES) -> None:
        self.limit, self.limit_bytes = kept, kept_bytes
        self._lock = threading.Lock()
        self._new: dict[bytes, Any] = {}  # payload -> its Kept, or SEEN
        self._old: dict[bytes, Any] = {}
        self._bytes = 0
        self.kept = 0  # objects kept (a counter)

    def get(self, data: bytes) -> Any:
        """The Kept of ``data``; SEEN when it was decoded once; else None."""
        got = self._new.get(data)
        if got is None:
            got = self._old.get(data)
            if got is not None:
                self._put(data, got)
        return got

    def saw(self, data: bytes) -> None:
        """``data`` was decoded (the first time): keep its object the next time. (Without the
        lock: a note lost to a race with another thread's ``_put`` costs a later build.)"""
        size, new = len(data), self._new
        if size > MAX_KEY:
            return
        if len(new) >= self.limit or self._bytes + size > self.limit_bytes:
            self._put(data, SEEN)
            return
        new[data] = SEEN
        self._bytes += size

    def _put(self, data: bytes, kept: Any) -> None:
        with self._lock:
            if self._new.get(data) is kept:
                return
            if len(self._new) >= self.limit or self._bytes + len(data) > self.limit_bytes:
                self._old, self._new, self._bytes = self._new, {}, 0
            self._new[data] = kept
            self._bytes += len(data)

    def keep(self, data: bytes, cls: type, entry: Any, obj: Any, state: Any) -> None:
        """Keep a copy of ``obj``, which ``cls`` built from ``state`` (the dict stored in
        ``data``), when a copy of it is what rebuilding it again would give."""
        if type(data) is not bytes or len(data) > MAX_KEY or type(obj) is not cls:
            return
        copier = _COPIERS.get(cls, SEEN)
        if copier is SEEN:
            copier = _COPIERS[cls] = _model_copy(cls)
        attrs = getattr(obj, "__dict__", None)
        if (copier is None or type(attrs) is not dict or type(state) is not dict
                or attrs.keys() != state.keys()
                or not _empty(getattr(obj, "__pydantic_extra__", None))
                or not _empty(getattr(obj, "__pydantic_private__", None))):
            return
        dicts, lists, plain = [], [], []
        try:
            for key, value in attrs.items():
                kind = type(value)
                if kind in _SCALARS:
                    continue
                if kind is dict and not value:
                    dicts.append(key)
                elif kind is list and not value:
                    lists.append(key)
                elif kind is dict or kind is list:
                    blob = _plain(value)
                    if blob is None:
                        return
                    plain.append((key, blob))
                else:
                    return
            if attrs != state:  # (a validator changed a value: not the data's own object)
                return
        except Exception:  # (a value whose __eq__ raised)
            return
        parts = (tuple(dicts), tuple(lists), tuple(plain))  # (a copy is kept: ``obj`` is the
        self._put(data, Kept(cls, entry, _copy(copier, obj, *parts), *parts, copier))  # caller's)
        self.kept += 1

    def clear(self) -> None:
        with self._lock:
            self._new, self._old, self._bytes, self.kept = {}, {}, 0, 0


def _copy(copier: Callable[[Any], Any], obj: Any, dicts: tuple[str, ...],
          lists: tuple[str, ...], plain: tuple[tuple[str, bytes], ...]) -> Any:
    """``copier(obj)`` with new containers: empty for the attributes ``dicts`` and ``lists``,
    unpacked from their bytes for those of ``plain``."""
    new = copier(obj)
    attrs = new.__dict__
    for key in dicts:
        attrs[key] = {}
    for key in lists:
        attrs[key] = []
    for key, blob in plain:
        attrs[key] = msgpack.unpackb(blob, strict_map_key=False)
    return new


def _plain(value: Any) -> bytes | None:
    """The msgpack bytes of ``value`` when unpacking them gives it back exactly (dicts and lists
    of exactly str, bytes, int, float, bool and None: ``strict_types`` refuses a subclass and
    a tuple, and the comparison anything else that would not come back as it was), else
    None."""
    try:
        blob: bytes = msgpack.packb(value, use_bin_type=True, strict_types=True)
        if len(blob) > MAX_KEY or msgpack.unpackb(blob, strict_map_key=False) != value:
            return None
    except Exception:  # (a type msgpack does not store, an int too big, a cycle, ...)
        return None
    return blob


def _empty(value: Any) -> bool:
    return value is None or (type(value) is dict and not value)


def _model_copy(cls: type) -> Callable[[Any], Any] | None:
    """pydantic's ``BaseModel.__copy__`` (a shallow copy of a model's state: its attributes,
    extra fields, fields set and private attributes), not an override of it; None for a
    class that is not a pydantic model."""
    import sys

    pydantic = sys.modules.get("pydantic")  # (a model class implies pydantic is imported)
    base = None if pydantic is None else getattr(pydantic, "BaseModel", None)
    if base is None or not issubclass(cls, base):
        return None
    return base.__copy__  # type: ignore[no-any-return]


_COPIERS: dict[type, Any] = {}  # (a class's copier, or None: classes do not go away)
REBUILT = Rebuilt()  # the process's (a payload's object is the same whatever store holds it)
