"""What the encoder (``codec.py``) and the decoder (``decoding.py``) share: the table of
extension codes (described in ``codec.py``), the limits, and the registry of user classes."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import decimal
import enum
import json
import re
import sys
import uuid
from collections.abc import Callable, Iterable
from typing import Any, Final

from cas_checkpoint.errors import InvalidArgumentError

MAX_EXT_DEPTH: Final = 64  # tuples/sets/datetimes/registered objects inside each other
_NATIVE_LIMIT: Final = 1023  # list/dict depth that msgpack both writes and reads back
# msgpack packs lists/dicts by C recursion (~450 bytes of stack a level): to bound the total,
# payloads nested deeper than _FREE_EXT_LEVELS may only hold lists/dicts _DEEP_LIMIT deep.
_FREE_EXT_LEVELS: Final = 2
_DEEP_LIMIT: Final = 64
_UNPACKB_LEVELS: Final = 2  # deeper payloads use an Unpacker, whose 40 KB state is on the heap
_MAX_BIGINT_BYTES: Final = 1 << 20
_CORRUPT: Final = "the object is corrupt or was not written by cas_checkpoint"

_BIGINT, _TUPLE, _SET, _FROZENSET, _DATETIME, _DATE, _TIME = 1, 3, 4, 5, 6, 7, 8
_TIMEDELTA, _UUID, _DECIMAL, _REF, _OBJECT, _SPAN, _SPAN_LENGTHS = 9, 10, 11, 12, 13, 14, 16
# (15 is not used: tests pin it as an unknown code)
_EXT_NAMES: Final = ("", "int", "", "tuple", "set", "frozenset", "datetime", "date", "time",
                     "timedelta", "UUID", "Decimal", "Ref", "registered object",
                     "Span", "", "Span")  # fmt: skip
_RAW_CODES: Final = frozenset({_BIGINT, _UUID, _DECIMAL, _REF, _SPAN, _SPAN_LENGTHS})
_ZONE_KEY_RE: Final = re.compile(r"[A-Za-z0-9_+\-]+(?:/[A-Za-z0-9_+\-]+)*")
_DECIMAL_RE: Final = re.compile(r"-?(?:[0-9]+(?:\.[0-9]+)?(?:E[+-][0-9]+)?|Infinity|s?NaN[0-9]*)")
_USEC: Final = _dt.timedelta(microseconds=1)
_DATACLASS, _MODEL, _ENUM, _ADAPTED = "dataclass", "pydantic model", "Enum", "adapted"
_BUILTINS: Final = (dict, list, tuple, str, bytes, int, float, set, frozenset, _dt.datetime,
                    _dt.date, _dt.time, _dt.timedelta, uuid.UUID, decimal.Decimal)  # fmt: skip



@dataclasses.dataclass(frozen=True, slots=True)
class _Entry:
    name: str
    kind: str
    fields: tuple[str, ...] = ()  # dataclass fields, in order
    no_init: frozenset[str] = frozenset()  # dataclass fields with init=False
    to_data: Callable[[Any], Any] | None = None  # an adapted class: object -> plain data
    from_data: Callable[[Any], Any] | None = None  # and back


def _qualname(cls: type) -> str:
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def _kind_of(cls: type) -> str | None:
    if issubclass(cls, enum.Enum):
        return _ENUM
    pydantic = sys.modules.get("pydantic")  # a model class implies pydantic is imported
    if pydantic is not None and issubclass(cls, pydantic.BaseModel):
        return _MODEL
    return _DATACLASS if dataclasses.is_dataclass(cls) else None


class TypeRegistry:
    """User classes that may be stored: dataclasses, pydantic v2 models, enum.Enum subclasses.

    Only classes registered here are ever constructed on decode; nothing is imported by name.
    """

    __slots__ = ("_by_class", "_by_name", "stand_in", "unknown")

    def __init__(self, types: Iterable[type] = ()) -> None:
        self._by_name: dict[str, type] = {}
        self._by_class: dict[type, _Entry] = {}
        # Two hooks for an integration that must store what another serializer stores
        # (CasSaver, for LangGraph): ``stand_in(obj)`` gives what to store instead of a value of
        # a class that is not registered (a plain value, or an ObjectData), or NotImplemented
        # to refuse it; ``unknown(name, data)`` gives what a load returns for a stored object
        # whose class is not registered (without it: a FormatError). Neither is ever given a
        # class named by stored bytes.
        self.stand_in: Callable[[Any], Any] | None = None
        self.unknown: Callable[[str, Any], Any] | None = None
        for cls in types:
            self.register(cls)

    def register(self, cls: type, name: str | None = None, *,
                 to_data: Callable[[Any], Any] | None = None,
                 from_data: Callable[[Any], Any] | None = None) -> None:
        """Allow ``cls``, stored under ``name`` (default ``module.QualName``). A class of
        another kind is stored through an adapter: ``to_data(obj)`` gives storable data,
        ``from_data(data)`` rebuilds the object (both are the caller's code, not the data's)."""
        if (to_data is None) != (from_data is None):
            raise InvalidArgumentError("pass both to_data and from_data, or neither")
        adapted = to_data is not None and isinstance(cls, type)
        kind = _ADAPTED if adapted else _kind_of(cls) if isinstance(cls, type) else None
        if kind is None:
            raise InvalidArgumentError(
                f"cannot register {cls!r}: only dataclasses, pydantic BaseModel subclasses and "
                "enum.Enum subclasses can be stored; convert other objects to plain data first"
            )
        name = f"{cls.__module__}.{cls.__qualname__}" if name is None else name
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"a type name must be a non-empty str, got {name!r}")
        other, old = self._by_name.get(name), self._by_class.get(cls)
        if other is not None and other is not cls:
            raise InvalidArgumentError(
                f"cannot register {_qualname(cls)} as {name!r}: {_qualname(other)} already "
                "uses that name; pass another one with register(cls, name=...)"
            )
        if old is not None and old.name != name:
            raise InvalidArgumentError(f"{_qualname(cls)} is already registered as {old.name!r}")
        entry = _Entry(name, kind, to_data=to_data, from_data=from_data)
        if kind == _DATACLASS:
            fields = dataclasses.fields(cls)
            no_init = frozenset(f.name for f in fields if not f.init)
            entry = _Entry(name, kind, tuple(f.name for f in fields), no_init)
        self._by_name[name], self._by_class[cls] = cls, entry

    def __contains__(self, cls: object) -> bool:
        return isinstance(cls, type) and cls in self._by_class

    def classes(self) -> list[type]:
        """The classes registered, in the order they were."""
        return list(self._by_class)

    def adapted_data(self, value: object) -> tuple[bool, Any]:
        """(True, the data its adapter gives) for a value of a class registered with
        ``to_data``, else (False, None). Only the adapter the registry was given is called."""
        entry = self._by_class.get(type(value))
        if entry is None or entry.to_data is None:
            return False, None
        return True, entry.to_data(value)

    def copy(self) -> TypeRegistry:
        """A registry of the same classes, entries and hooks that registers on its own (the
        entries are immutable: shared, not rebuilt)."""
        out = TypeRegistry()
        out._by_name, out._by_class = dict(self._by_name), dict(self._by_class)
        out.stand_in, out.unknown = self.stand_in, self.unknown
        return out

    def update(self, other: TypeRegistry) -> None:
        """Register every class of ``other`` as it is registered there (name, adapter)."""
        for cls, entry in other._by_class.items():
            self.register(cls, entry.name, to_data=entry.to_data, from_data=entry.from_data)

    def entries(self) -> tuple[object, ...]:
        """What decides how values encode: the hooks and each class's entry (compare with
        ``is``: a change of any of them is a new object)."""
        return (self.stand_in, self.unknown, *self._by_class.values())

    def without_hooks(self) -> TypeRegistry:
        """A registry of the same classes (shared, not copied) without ``stand_in`` and
        ``unknown``: what only the registered classes rebuild."""
        strict = TypeRegistry()
        strict._by_class, strict._by_name = self._by_class, self._by_name
        return strict


@dataclasses.dataclass(frozen=True, slots=True)
class ObjectData:
    """What a ``stand_in`` hook stores for an object: stored as a registered class's object
    (``name``, ``data``), so a registry that has the class rebuilds it."""

    name: str
    data: Any


_NO_TYPES: Final = TypeRegistry()


def _brief(exc: BaseException) -> str:
    """``Type: message``, cut short: a repr could hold megabytes of hostile data."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 300 else text[:297] + "..."


def _render(value: object, depth: int = 0) -> str:
    """Short Python-like text of a dict key or set item, for error paths."""
    if type(value) is str:
        text = json.dumps(value, ensure_ascii=False)
    elif type(value) is tuple and depth < 3:
        inner = ", ".join(_render(v, depth + 1) for v in value[:8])
        text = f"({inner}{', ...' if len(value) > 8 else ',' if len(value) == 1 else ''})"
    else:
        try:
            text = repr(value)
        except Exception:
            text = f"<{_qualname(type(value))} object>"
    return text if len(text) <= 80 else text[:77] + "..."

