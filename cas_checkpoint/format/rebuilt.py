"""Objects the decoder rebuilt, kept by the exact bytes they were rebuilt from, so that decoding
those bytes again copies the object instead of building it again. Pure code.

A LangGraph state's messages are decoded at every read of the thread (each ``get_tuple``, each
new saver): 400 messages at 200 turns, each one a class's ``__init__`` and pydantic's
validation (~4 us each). The same bytes always rebuild an equal object, so the second time
a copy does (what pydantic's ``__copy__`` makes, with new containers: ~1 us).

Rules, so that a copy is what a decode would have given:

* keyed by the object's whole stored payload (its class name and data), and used only by a
  registry that maps that name to the very class, with an equal entry;
* kept only for a pydantic model rebuilt by its class from its stored dict, whose attributes
  are exactly that dict (nothing a default factory made, nothing a validator changed), each
  an immutable scalar or plain data (dicts and lists of exactly str, bytes, int, float, bool,
  None: what msgpack gives back exactly, e.g. a message's ``tool_calls`` and
  ``response_metadata``), with no extra fields or private attributes holding anything: a copy
  shares only immutable values, and gets new containers, unpacked from their msgpack bytes
  kept with the object (in C, as deep as the data). msgpack's ``strict_types`` packs exactly
  those types and refuses any other (a subclass, a tuple, an object), and they unpack as
  they were;
* what is kept is never handed out (its attributes, fields set, and which of extra and
  private are an empty dict), so nothing a caller does to what it got changes what the next
  decode gives;
* kept the second time its bytes are decoded (the first only notes them: ~0.5 us a message,
  not the ~3 us that checking and keeping one costs), so a read of states this process never
  read costs about what it did, and from the third read of the same bytes on, copies.

Bounded: two generations of at most ``KEPT`` entries and ``KEPT_BYTES`` key bytes each;
a key found in the older one moves to the newer one, the older one is dropped when the newer
one is full. Forgetting costs building the object again, never correctness."""

from __future__ import annotations

import sys
import threading
from typing import Any

import msgpack

KEPT = 1 << 14  # entries per generation (a kept message holds ~1 KB with its key: ~32 MB at
# most for both generations, a 200-turn agent thread being 400 entries)
KEPT_BYTES = 8 << 20  # key bytes per generation
MAX_KEY = 16 << 10  # a payload longer than this is not kept

_SCALARS = frozenset({str, int, float, bool, bytes, type(None)})


_new = object.__new__
_set = object.__setattr__


class Kept:
    """What an object rebuilt from a payload holds (never handed out): its class and registry
    entry, its attributes (``attrs``; those that are containers are None there, and new in
    each copy: unpacked from ``containers``, their msgpack bytes), its fields set, and whether
    its extra fields and private attributes are an empty dict (else None)."""

    __slots__ = ("attrs", "cls", "containers", "dicts", "entry", "extra", "fields_set", "lists",
                 "private")

    def __init__(self, cls: type, entry: Any, attrs: dict[str, Any], containers: bytes | None,
                 fields_set: frozenset[str], extra: bool, private: bool,
                 dicts: tuple[str, ...], lists: tuple[str, ...]) -> None:
        self.cls, self.entry, self.attrs, self.containers = cls, entry, attrs, containers
        self.fields_set, self.extra, self.private = fields_set, extra, private
        self.dicts, self.lists = dicts, lists  # (the empty ones: literals are quicker)

    def copy_out(self) -> Any:
        """A new object in the state of the one rebuilt: what pydantic's ``__copy__`` makes
        (its four slots set), with new containers."""
        attrs = self.attrs.copy()
        for key in self.dicts:
            attrs[key] = {}
        for key in self.lists:
            attrs[key] = []
        if self.containers is not None:
            attrs.update(msgpack.unpackb(self.containers, strict_map_key=False))
        new: Any = _new(self.cls)
        _set(new, "__dict__", attrs)
        _set(new, "__pydantic_fields_set__", set(self.fields_set))
        _set(new, "__pydantic_extra__", {} if self.extra else None)
        _set(new, "__pydantic_private__", {} if self.private else None)
        return new


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
        """``data`` was decoded (the first time): keep its object the next time."""
        if len(data) <= MAX_KEY:
            self._put(data, SEEN)

    def _put(self, data: bytes, kept: Any) -> None:
        """(The newer generation replaced under the lock; an entry put without it: one lost
        to a race costs a later build.)"""
        size = len(data)
        if len(self._new) >= self.limit or self._bytes + size > self.limit_bytes:
            with self._lock:
                if len(self._new) >= self.limit or self._bytes + size > self.limit_bytes:
                    self._old, self._new, self._bytes = self._new, {}, 0
        self._new[data] = kept
        self._bytes += size

    def keep(self, data: bytes, cls: type, entry: Any, obj: Any, state: Any) -> None:
        """Keep the state of ``obj``, which ``cls`` built from ``state`` (the dict stored in
        ``data``), when a copy of it is what rebuilding it again would give."""
        if type(data) is not bytes or len(data) > MAX_KEY or type(obj) is not cls:
            return
        copyable = _COPYABLE.get(cls)
        if copyable is None:
            copyable = _COPYABLE[cls] = _copyable(cls)
        if not copyable:
            return
        try:
            model: Any = obj  # (a pydantic model: ``_copyable``)
            attrs, extra = model.__dict__, model.__pydantic_extra__
            private, fields_set = model.__pydantic_private__, model.__pydantic_fields_set__
            if (type(attrs) is not dict or type(fields_set) is not set or not _empty(extra)
                    or not _empty(private) or type(state) is not dict or attrs != state):
                return  # (``attrs != state``: a default or a validator made a value)
            containers = {k: v for k, v in attrs.items() if type(v) not in _SCALARS}
            dicts = tuple(k for k, v in containers.items() if type(v) is dict and not v)
            lists = tuple(k for k, v in containers.items() if type(v) is list and not v)
            full = {k: v for k, v in containers.items() if k not in dicts and k not in lists}
            blob = None if not full else msgpack.packb(
                full, use_bin_type=True, strict_types=True)  # (raises for anything else
        except Exception:  # than plain data; an attribute missing; an __eq__ that raised)
            return
        if blob is not None and len(blob) > MAX_KEY:
            return
        template = attrs.copy()  # (nothing of ``obj``'s that a caller may change: it is theirs)
        template.update(dict.fromkeys(containers))
        names = frozenset(fields_set)  # (one object for the objects of one shape)
        names = _FIELDS.setdefault(names, names) if len(_FIELDS) < KEPT else names
        self._put(data, Kept(cls, entry, template, blob, names,
                             extra is not None, private is not None, dicts, lists))
        self.kept += 1

    def clear(self) -> None:
        with self._lock:
            self._new, self._old, self._bytes, self.kept = {}, {}, 0, 0


def _empty(value: Any) -> bool:
    return value is None or (type(value) is dict and not value)


_SLOTS = ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__")


def _copyable(cls: type) -> bool:
    """Whether ``cls`` is a pydantic model whose objects are ``object.__new__`` and the four
    slots of ``BaseModel`` (what its ``__copy__`` sets; no slots of its own): not a root
    model, whose data is not a dict of its attributes; and none whose building acts on the
    built object (``model_post_init``, a validator in mode ``after`` or ``wrap``), which a
    copy would skip. (A ``before`` or ``plain`` validator acts on the input: the object it
    made is checked against the stored data, ``keep``'s ``attrs != state``.)"""
    pydantic = sys.modules.get("pydantic")  # (a model class implies pydantic is imported)
    base = None if pydantic is None else getattr(pydantic, "BaseModel", None)
    if (base is None or not isinstance(cls, type) or not issubclass(cls, base)
            or getattr(base, "__slots__", None) != _SLOTS
            or getattr(cls, "__new__", None) is not _new
            or getattr(cls, "__pydantic_root_model__", False)
            or getattr(cls, "__pydantic_post_init__", None) is not None):
        return False
    try:
        found = cls.__pydantic_decorators__  # type: ignore[attr-defined]
        validators = [*found.model_validators.values(), *found.field_validators.values()]
        if any(v.info.mode in ("after", "wrap") for v in validators):
            return False
    except AttributeError:  # (a pydantic without these: do not keep)
        return False
    return all(not k.__dict__.get("__slots__") for k in cls.__mro__ if k is not base)


_FIELDS: dict[frozenset[str], frozenset[str]] = {}  # fields sets seen (a few shapes)
_COPYABLE: dict[type, bool] = {}  # (per class: classes do not go away)
REBUILT = Rebuilt()  # the process's (a payload's object is the same whatever store holds it)
