"""Values <-> bytes: deterministic msgpack with a fixed table of extension types.

Native msgpack carries None, bool, int (64-bit), float (always float64), str, bytes,
list and dict (any encodable keys, insertion order kept: two equal dicts built in a
different order encode differently). Everything else is one of these ext types::

    code  type                  payload
    1     int beyond 64 bits    two's complement big-endian, minimal length (<= 1 MiB)
    2     bytearray             the raw bytes
    3     tuple                 msgpack array
    4     set                   msgpack array, elements sorted by their encoded bytes
    5     frozenset             same as set
    6     datetime.datetime     [year, month, day, hour, minute, second, microsecond, fold, tz]
    7     datetime.date         [year, month, day]
    8     datetime.time         [hour, minute, second, microsecond, fold, tz]
    9     datetime.timedelta    [days, seconds, microseconds]
    10    uuid.UUID             the 16 raw bytes
    11    decimal.Decimal       ASCII str(d), e.g. "-0", "1.50", "sNaN", "-Infinity"
    12    Ref                   index, unsigned big-endian in 1, 2, 4 or 8 bytes (minimal)
    13    registered class      [name, state]: fields map (dataclass, pydantic model),
                                root value (pydantic RootModel) or value (Enum member)

    tz is nil, a str (zoneinfo.ZoneInfo key) or [utcoffset in microseconds, name or nil]
    (datetime.timezone).

Only exact types are accepted (subclasses of builtins, e.g. OrderedDict or a namedtuple,
are refused rather than silently converted), and classes are only ever rebuilt from a
:class:`TypeRegistry`: decoding never imports or looks anything up by a name from the data.
Payloads 3-9 and 13 hold nested msgpack; they nest at most ``MAX_EXT_DEPTH`` deep.
msgpack itself writes ``memoryview`` (as bytes), ``msgpack.ExtType`` and
``msgpack.Timestamp`` without asking this module: do not put them in a state. Its
reserved timestamp ext (-1) is never written here and decodes to an aware UTC datetime.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import decimal
import enum
import json
import re
import sys
import uuid
import zoneinfo
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

import msgpack

from .errors import FormatError, InvalidArgumentError, SerializationError

__all__ = ["MAX_EXT_DEPTH", "Ref", "TypeRegistry", "decode", "encode"]

MAX_EXT_DEPTH: Final = 64
"""Tuples, sets, datetimes and registered objects may nest inside each other this deep."""
_NATIVE_LIMIT: Final = 1023  # list/dict depth msgpack both writes and reads (we pack [value])
# msgpack packs lists/dicts by C recursion (~450 B of stack per level): bound the total by
# allowing full native depth only in the outer payloads and _DEEP_NATIVE_LIMIT below them.
_FREE_EXT_LEVELS: Final = 2
_DEEP_NATIVE_LIMIT: Final = 64
_UNPACKB_LEVELS: Final = 8  # deeper payloads use an Unpacker (its 40 KB state is on the heap)
_MAX_BIGINT_BYTES: Final = 1 << 20
_CORRUPT: Final = "the object is corrupt or was not written by cas_checkpoint"

_BIGINT, _BYTEARRAY, _TUPLE, _SET, _FROZENSET, _DATETIME = 1, 2, 3, 4, 5, 6
_DATE, _TIME, _TIMEDELTA, _UUID, _DECIMAL, _REF, _OBJECT = 7, 8, 9, 10, 11, 12, 13
_RAW_CODES: Final = frozenset({_BIGINT, _BYTEARRAY, _UUID, _DECIMAL, _REF})
_EXT_NAMES: Final = {
    _BIGINT: "int", _BYTEARRAY: "bytearray", _TUPLE: "tuple", _SET: "set",
    _FROZENSET: "frozenset", _DATETIME: "datetime", _DATE: "date", _TIME: "time",
    _TIMEDELTA: "timedelta", _UUID: "UUID", _DECIMAL: "Decimal", _REF: "Ref",
    _OBJECT: "registered object",
}  # fmt: skip
_ZONE_KEY_RE: Final = re.compile(r"[A-Za-z0-9_+\-]+(?:/[A-Za-z0-9_+\-]+)*")
_DECIMAL_RE: Final = re.compile(r"-?(?:[0-9]+(?:\.[0-9]+)?(?:E[+-][0-9]+)?|Infinity|s?NaN[0-9]*)")
_USEC: Final = _dt.timedelta(microseconds=1)
_DATACLASS, _MODEL, _ENUM = "dataclass", "pydantic model", "Enum"


@dataclasses.dataclass(frozen=True, slots=True)
class Ref:
    """Placeholder for a child node: encodes as ext 12 holding ``index`` (non-negative int)."""

    index: int

    def __post_init__(self) -> None:
        if type(self.index) is not int or not 0 <= self.index < 1 << 64:
            raise InvalidArgumentError(f"Ref index must be an int in [0, 2**64), got {self.index!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class _Entry:
    name: str
    kind: str
    fields: tuple[str, ...] = ()  # dataclass field names, in order
    no_init: frozenset[str] = frozenset()  # dataclass fields with init=False


def _qualname(cls: type) -> str:
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


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

    __slots__ = ("_by_class", "_by_name")

    def __init__(self, types: Iterable[type] = ()) -> None:
        self._by_name: dict[str, type] = {}
        self._by_class: dict[type, _Entry] = {}
        for cls in types:
            self.register(cls)

    def register(self, cls: type, name: str | None = None) -> None:
        """Allow ``cls``; it is stored under ``name`` (default ``module.QualName``)."""
        kind = _kind_of(cls) if isinstance(cls, type) else None
        if kind is None:
            raise InvalidArgumentError(
                f"cannot register {cls!r}: only dataclasses, pydantic BaseModel subclasses and "
                "enum.Enum subclasses can be stored; convert other objects to plain data first"
            )
        if name is None:
            name = f"{cls.__module__}.{cls.__qualname__}"
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"a type name must be a non-empty str, got {name!r}")
        other = self._by_name.get(name)
        if other is not None and other is not cls:
            raise InvalidArgumentError(
                f"cannot register {_qualname(cls)} as {name!r}: that name is already used by "
                f"{_qualname(other)}; pass another name, e.g. register(cls, name=...)"
            )
        old = self._by_class.get(cls)
        if old is not None and old.name != name:
            raise InvalidArgumentError(
                f"{_qualname(cls)} is already registered as {old.name!r}; a class has one name"
            )
        entry = _Entry(name, kind)
        if kind == _DATACLASS:
            fields = dataclasses.fields(cls)
            no_init = frozenset(f.name for f in fields if not f.init)
            entry = _Entry(name, kind, tuple(f.name for f in fields), no_init)
        self._by_name[name] = cls
        self._by_class[cls] = entry

    def __contains__(self, cls: object) -> bool:
        return isinstance(cls, type) and cls in self._by_class


_NO_TYPES: Final = TypeRegistry()


class _Unsupported(Exception):
    """Raised by _reduce: ``what`` cannot be stored; ``advice`` says what to do."""

    def __init__(self, what: str, advice: str) -> None:
        super().__init__(what)
        self.what, self.advice = what, advice


_BUILTINS: Final = (dict, list, tuple, str, bytes, bytearray, int, float, set, frozenset,
                    _dt.datetime, _dt.date, _dt.time, _dt.timedelta, uuid.UUID, decimal.Decimal)  # fmt: skip


def _refuse(obj: object) -> _Unsupported:
    cls = type(obj)
    kind = _kind_of(cls)
    if kind is not None:
        return _Unsupported(
            f"an instance of {_qualname(cls)} (a {kind} that is not registered)",
            f"register the class: pass types=[{cls.__name__}] to CheckpointStore.open(...)",
        )
    base = next((b for b in _BUILTINS if isinstance(obj, b)), None)
    if base is not None:
        return _Unsupported(
            f"a {_qualname(cls)} (a subclass of {base.__name__})",
            f"only exact types are stored, so that values come back unchanged; convert it with "
            f"{base.__name__}(...) or use a registered dataclass",
        )
    return _Unsupported(
        f"a value of type {_qualname(cls)}",
        "only None, bool, int, float, str, bytes, bytearray, list, tuple, dict, set, frozenset, "
        "datetime, date, time, timedelta, UUID, Decimal and registered dataclasses, pydantic "
        "models and Enums can be stored; convert it, or keep it out of the state",
    )


def _tz_state(tz: _dt.tzinfo | None, what: str) -> Any:
    if tz is None:
        return None
    if type(tz) is _dt.timezone:
        args = tz.__getinitargs__()  # (offset,) or (offset, name): keeps an explicit name
        return [args[0] // _USEC, args[1] if len(args) > 1 else None]
    if type(tz) is zoneinfo.ZoneInfo and tz.key is not None and _ZONE_KEY_RE.fullmatch(tz.key):
        return tz.key
    raise _Unsupported(
        f"a {what} with tzinfo {tz!r}",
        "only datetime.timezone and zoneinfo.ZoneInfo (built from an IANA key) are stored; "
        "convert it, e.g. with .astimezone(zoneinfo.ZoneInfo(...))",
    )


def _reduce(obj: Any, reg: TypeRegistry) -> tuple[int, Any]:
    """(ext code, payload) for a non-native value; raw codes have a bytes payload."""
    t = type(obj)
    if t is tuple:
        return _TUPLE, list(obj)
    if t is set or t is frozenset:
        return (_SET if t is set else _FROZENSET), list(obj)
    if t is int:
        size = (obj if obj >= 0 else ~obj).bit_length() // 8 + 1
        if size > _MAX_BIGINT_BYTES:
            raise _Unsupported("an int of more than 8 million bits", "store it as str or bytes")
        return _BIGINT, obj.to_bytes(size, "big", signed=True)
    if t is _dt.datetime:
        head = [obj.year, obj.month, obj.day, obj.hour, obj.minute, obj.second]
        return _DATETIME, [*head, obj.microsecond, obj.fold, _tz_state(obj.tzinfo, "datetime")]
    if t is _dt.date:
        return _DATE, [obj.year, obj.month, obj.day]
    if t is _dt.time:
        head = [obj.hour, obj.minute, obj.second, obj.microsecond, obj.fold]
        return _TIME, [*head, _tz_state(obj.tzinfo, "time")]
    if t is _dt.timedelta:
        return _TIMEDELTA, [obj.days, obj.seconds, obj.microseconds]
    if t is bytearray:
        return _BYTEARRAY, bytes(obj)
    if t is uuid.UUID:
        return _UUID, obj.bytes
    if t is decimal.Decimal:
        return _DECIMAL, str(obj).encode("ascii")
    if t is Ref:
        index = obj.index
        if type(index) is not int or not 0 <= index < 1 << 64:
            raise _Unsupported(f"Ref({index!r})", "a Ref index is an int in [0, 2**64)")
        return _REF, index.to_bytes(next(n for n in (1, 2, 4, 8) if index < 1 << 8 * n), "big")
    entry = reg._by_class.get(t)
    if entry is None:
        raise _refuse(obj)
    if entry.kind == _ENUM:
        return _OBJECT, [entry.name, obj.value]
    if entry.kind == _DATACLASS:
        return _OBJECT, [entry.name, {f: getattr(obj, f) for f in entry.fields}]
    if getattr(t, "__pydantic_root_model__", False):
        return _OBJECT, [entry.name, obj.root]
    state = {f: getattr(obj, f) for f in t.model_fields}
    state.update(obj.__pydantic_extra__ or {})
    return _OBJECT, [entry.name, state]


def _depth_ok(root: object, limit: int) -> bool:
    """True if no list/dict element of ``root`` (depth 0) sits deeper than ``limit``."""
    stack: list[tuple[Any, int]] = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        if node and depth >= limit:
            return False
        for child in node.items() if type(node) is dict else node:
            for c in child if type(node) is dict else (child,):
                if type(c) is list or type(c) is dict:
                    stack.append((c, depth + 1))
    return True


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    return b"\xdc" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xdd" + n.to_bytes(4, "big")


class _Encoder:
    __slots__ = ("depth", "reg")

    def __init__(self, reg: TypeRegistry) -> None:
        self.reg, self.depth = reg, 0

    def pack(self, value: object, wrap: int) -> bytes:
        # Packing inside [value] (or [[value]] for set elements, which decode one level
        # deeper) keeps the packer's depth limit within what the unpacker accepts.
        packer = msgpack.Packer(default=self.default, strict_types=True, buf_size=4096)
        data: bytes = packer.pack([[value]] if wrap == 2 else [value])
        return data[wrap:]

    def default(self, obj: Any) -> msgpack.ExtType:
        code, payload = _reduce(obj, self.reg)
        if code in _RAW_CODES:
            return msgpack.ExtType(code, payload)
        if self.depth >= MAX_EXT_DEPTH:
            raise ValueError("nested too deep")
        self.depth += 1
        try:
            if self.depth > _FREE_EXT_LEVELS and not _depth_ok(payload, _DEEP_NATIVE_LIMIT):
                raise ValueError("nested too deep")
            if code == _SET or code == _FROZENSET:
                items = sorted(self.pack(item, 2) for item in payload)
                return msgpack.ExtType(code, _array_header(len(items)) + b"".join(items))
            return msgpack.ExtType(code, self.pack(payload, 1))
        finally:
            self.depth -= 1


def _render(value: object, depth: int = 0) -> str:
    """Short Python-like rendering of a dict key or set element for error paths."""
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


def _children(code: int, obj: Any, payload: Any, path: str) -> tuple[Iterator[tuple[str, Any]], int]:
    """(labelled children, their depth in the payload) of an ext value, for error paths."""
    if code == _TUPLE:
        return ((f"{path}[{i}]", v) for i, v in enumerate(obj)), 1
    if code == _SET or code == _FROZENSET:
        return ((f"{path}{{{_render(v)}}}", v) for v in obj), 1
    if code == _OBJECT and type(payload[1]) is dict and not isinstance(obj, enum.Enum):
        return ((f"{path}.{k}", v) for k, v in payload[1].items()), 2
    if code == _OBJECT:
        return iter([(f"{path}.{'value' if isinstance(obj, enum.Enum) else 'root'}", payload[1])]), 1
    return iter(()), 1


def _find_error(value: object, reg: TypeRegistry) -> SerializationError | None:
    """Walk ``value`` like the packer does and describe the first thing it cannot store."""
    stack: list[tuple[Iterator[tuple[str, Any]], int, int, int]] = []  # children, depth, ext, id
    active: set[int] = set()  # containers on the current path, to name cycles

    def visit(obj: Any, path: str, depth: int, ext: int) -> SerializationError | None:
        if depth > (_NATIVE_LIMIT if ext <= _FREE_EXT_LEVELS else _DEEP_NATIVE_LIMIT):
            return SerializationError(
                f"cannot store the value at {path}: it is cyclic or nested too deep (lists and "
                f"dicts at most {_NATIVE_LIMIT} deep, or {_DEEP_NATIVE_LIMIT} inside tuples/sets/"
                f"objects nested {_FREE_EXT_LEVELS} deep); flatten it",
                path,
            )
        t = type(obj)
        if obj is None or t is bool or t is float or t is bytes:
            return None
        if t is str:
            try:
                obj.encode("utf-8")
            except UnicodeEncodeError as exc:
                return SerializationError(
                    f"cannot store the str at {path}: it is not valid Unicode ({exc.reason} at "
                    f"index {exc.start}); remove the lone surrogates",
                    path,
                )
            return None
        if t is int and -(1 << 63) <= obj < 1 << 64:
            return None
        if (t is list or t is dict) and id(obj) not in active:
            items: Iterator[tuple[str, Any]]
            if t is list:
                items = ((f"{path}[{i}]", v) for i, v in enumerate(obj))
            else:
                items = (kv for k, v in obj.items() for kv in (
                    (f"{path}<key {_render(k)}>", k), (f"{path}[{_render(k)}]", v)))  # fmt: skip
            stack.append((items, depth + 1, ext, id(obj)))
            active.add(id(obj))
            return None
        if id(obj) in active:
            return SerializationError(
                f"cannot store the value at {path}: it contains itself (a cyclic reference); "
                "break the cycle, e.g. store an id instead of the object",
                path,
            )
        try:
            code, payload = _reduce(obj, reg)
        except _Unsupported as exc:
            return SerializationError(f"cannot store {exc.what} at {path}: {exc.advice}", path)
        except Exception as exc:
            err = SerializationError(
                f"cannot store the {_qualname(t)} at {path}: reading it raised {exc!r}", path)
            err.__cause__ = exc
            return err
        if code in _RAW_CODES:
            return None
        if ext + 1 > MAX_EXT_DEPTH:
            return SerializationError(
                f"cannot store the value at {path}: it is cyclic or nested deeper than "
                f"{MAX_EXT_DEPTH} tuples/sets/datetimes/registered objects; flatten it",
                path,
            )
        children, child_depth = _children(code, obj, payload, path)
        stack.append((children, child_depth, ext + 1, id(obj)))
        active.add(id(obj))
        return None

    error = visit(value, "state", 0, 0)
    while error is None and stack:
        children, depth, ext, ident = stack[-1]
        item = next(children, None)
        if item is None:
            stack.pop()
            active.discard(ident)
        else:
            error = visit(item[1], item[0], depth, ext)
    return error


def encode(value: Any, *, types: TypeRegistry | None = None) -> bytes:
    """Encode ``value`` deterministically; raise SerializationError naming what and where."""
    reg = _NO_TYPES if types is None else types
    try:
        return _Encoder(reg).pack(value, 1)
    except MemoryError:
        raise
    except Exception as exc:  # TypeError, ValueError, OverflowError, RecursionError, user code
        error = _find_error(value, reg) or SerializationError(
            f"cannot store the value at state: {exc!r}", "state"
        )
    error.__suppress_context__ = True
    raise error


class _ResolveFailed(Exception):
    """Carries an exception raised by ``resolve`` through decode unchanged."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


def _ints(payload: Any, count: int, what: str) -> list[int]:
    """The first ``count`` items of a list payload, checked to be exact ints."""
    if type(payload) is not list or any(type(v) is not int for v in payload[:count]):
        raise FormatError(f"a {what} payload is not a list of ints; {_CORRUPT}")
    return payload[:count]


def _tz_from(state: Any) -> _dt.tzinfo | None:
    if state is None:
        return None
    if type(state) is str:
        if len(state) > 255 or not _ZONE_KEY_RE.fullmatch(state):
            raise FormatError(f"invalid time zone key {_render(state)}; {_CORRUPT}")
        try:
            return zoneinfo.ZoneInfo(state)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError) as exc:
            raise FormatError(
                f"time zone {state!r} is not available here ({exc}); install the tzdata "
                f"package if it is missing, otherwise {_CORRUPT}"
            ) from None
    if type(state) is list and len(state) == 2 and type(state[0]) is int:
        if state[1] is None:
            return _dt.timezone(_dt.timedelta(microseconds=state[0]))
        if type(state[1]) is str:
            return _dt.timezone(_dt.timedelta(microseconds=state[0]), state[1])
    raise FormatError(f"invalid tzinfo payload; {_CORRUPT}")


class _Decoder:
    __slots__ = ("depth", "reg", "resolve")

    def __init__(self, reg: TypeRegistry, resolve: Callable[[int], Any] | None) -> None:
        self.reg, self.resolve, self.depth = reg, resolve, 0

    def unpack(self, data: bytes) -> Any:
        if self.depth >= MAX_EXT_DEPTH:
            raise FormatError(f"extension types are nested deeper than {MAX_EXT_DEPTH}; {_CORRUPT}")
        self.depth += 1
        try:
            options: dict[str, Any] = {"ext_hook": self.ext_hook, "strict_map_key": False,
                                       "timestamp": 3}  # fmt: skip
            if self.depth <= _UNPACKB_LEVELS:
                return msgpack.unpackb(data, **options)
            unpacker = msgpack.Unpacker(None, max_buffer_size=max(1, len(data)), **options)
            unpacker.feed(data)
            value = unpacker.unpack()
            if unpacker.tell() != len(data):
                raise FormatError(f"trailing bytes in an extension payload; {_CORRUPT}")
            return value
        finally:
            self.depth -= 1

    def ext_hook(self, code: int, data: bytes) -> Any:
        name = _EXT_NAMES.get(code)
        if name is None:
            raise FormatError(f"unknown extension type {code}; {_CORRUPT}")
        try:
            return self.build(code, data if code in _RAW_CODES else self.unpack(data))
        except (FormatError, _ResolveFailed):
            raise
        except Exception as exc:
            raise FormatError(f"invalid {name} payload ({exc}); {_CORRUPT}") from None

    def build(self, code: int, data: Any) -> Any:
        if code == _TUPLE and type(data) is list:
            return tuple(data)
        if (code == _SET or code == _FROZENSET) and type(data) is list:
            return set(data) if code == _SET else frozenset(data)
        if code == _DATETIME and len(ints := _ints(data, 8, "datetime")) == 8 and len(data) == 9:
            return _dt.datetime(*ints[:7], tzinfo=_tz_from(data[8]), fold=ints[7])
        if code == _DATE and len(ints := _ints(data, 3, "date")) == 3 == len(data):
            return _dt.date(*ints)
        if code == _TIME and len(ints := _ints(data, 5, "time")) == 5 and len(data) == 6:
            return _dt.time(*ints[:4], tzinfo=_tz_from(data[5]), fold=ints[4])
        if code == _TIMEDELTA and len(ints := _ints(data, 3, "timedelta")) == 3 == len(data):
            return _dt.timedelta(*ints)
        if code == _BYTEARRAY:
            return bytearray(data)
        if code == _UUID and len(data) == 16:
            return uuid.UUID(bytes=data)
        if code == _DECIMAL and _DECIMAL_RE.fullmatch(text := data.decode("ascii")):
            return decimal.Decimal(text)
        if code == _BIGINT and 0 < len(data) <= _MAX_BIGINT_BYTES:
            value = int.from_bytes(data, "big", signed=True)
            if (value if value >= 0 else ~value).bit_length() // 8 + 1 == len(data) and not (
                -(1 << 63) <= value < 1 << 64
            ):
                return value
        if code == _REF and len(data) in (1, 2, 4, 8):
            index = int.from_bytes(data, "big")
            if len(data) == 1 or index >= 1 << 4 * len(data):
                if self.resolve is None:
                    raise FormatError(f"found Ref({index}) but no resolve function was given")
                try:
                    return self.resolve(index)
                except BaseException as exc:
                    raise _ResolveFailed(exc) from None
        if code == _OBJECT and type(data) is list and len(data) == 2 and type(data[0]) is str:
            return self.build_object(data[0], data[1])
        raise FormatError(f"invalid {_EXT_NAMES[code]} payload; {_CORRUPT}")

    def build_object(self, name: str, state: Any) -> Any:
        cls = self.reg._by_name.get(name)
        if cls is None:
            short = _render(name.rsplit(".", 1)[-1])[1:-1]
            raise FormatError(
                f"the data holds an object of class {_render(name)}, which is not registered: "
                f"pass types=[{short}] to CheckpointStore.open(...) so it can be rebuilt"
            )
        entry = self.reg._by_class[cls]
        try:
            if entry.kind == _ENUM:
                return cls(state)
            if entry.kind == _MODEL:
                if getattr(cls, "__pydantic_root_model__", False):
                    return cls.model_validate(state)  # type: ignore[attr-defined]
                if type(state) is dict:
                    return cls.model_validate(state, by_alias=False, by_name=True)  # type: ignore[attr-defined]
            elif type(state) is dict and all(type(k) is str for k in state):
                obj = cls(**{k: v for k, v in state.items() if k not in entry.no_init})
                for key in entry.no_init.intersection(state):
                    object.__setattr__(obj, key, state[key])
                return obj
        except Exception as exc:
            raise FormatError(
                f"cannot rebuild {entry.name} from the stored data ({exc!r}); the class changed "
                f"since it was saved, or {_CORRUPT}"
            ) from None
        raise FormatError(f"invalid state for {entry.name}; {_CORRUPT}")


def decode(
    data: bytes | memoryview,
    *,
    types: TypeRegistry | None = None,
    resolve: Callable[[int], Any] | None = None,
) -> Any:
    """Decode bytes written by :func:`encode`; anything wrong raises FormatError.

    Each Ref is replaced by ``resolve(index)``; exceptions from ``resolve`` pass unchanged.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidArgumentError(f"decode() needs bytes, got {type(data).__name__}")
    decoder = _Decoder(_NO_TYPES if types is None else types, resolve)
    try:
        return msgpack.unpackb(data, ext_hook=decoder.ext_hook, strict_map_key=False, timestamp=3)
    except FormatError:
        raise
    except _ResolveFailed as exc:
        raise exc.error from None
    except msgpack.ExtraData:
        problem = "trailing bytes after the value"
    except msgpack.StackError:
        problem = "lists/dicts are nested too deep"
    except RecursionError:
        problem = "the value is nested too deep"
    except MemoryError:
        raise
    except Exception as exc:  # OutOfData, msgpack FormatError, ValueError, TypeError, ...
        problem = "truncated data" if "incomplete" in str(exc) else f"invalid data ({exc!r})"
    raise FormatError(f"cannot decode: {problem}; {_CORRUPT}") from None
