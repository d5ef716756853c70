"""Values <-> bytes: deterministic msgpack with a fixed table of extension types.

Native msgpack carries None, bool, int (64-bit), float (always float64), str, bytes, list
and dict (any encodable keys; insertion order is kept, so two equal dicts built in a
different order encode differently). Everything else is one of these ext types::

    code  type                  payload
    1     int beyond 64 bits    two's complement big-endian, minimal length (<= 1 MiB)
    2     (reserved: bytearray) never written: msgpack packs an exact bytearray as bin
                                without asking us, so a bytearray comes back as bytes
    3     tuple                 msgpack array
    4     set                   msgpack array, items sorted by their encoded bytes
    5     frozenset             same as set
    6     datetime.datetime     [year, month, day, hour, minute, second, microsecond, fold, tz]
    7     datetime.date         [year, month, day]
    8     datetime.time         [hour, minute, second, microsecond, fold, tz]
    9     datetime.timedelta    [days, seconds, microseconds]
    10    uuid.UUID             the 16 raw bytes
    11    decimal.Decimal       ASCII str(d), e.g. "-0", "1.50", "sNaN", "-Infinity"
    12    Ref                   index, unsigned big-endian in 1, 2, 4 or 8 bytes (minimal)
    13    registered class      [name, state]: state is the fields map (dataclass, pydantic
                                model), the root value (RootModel) or the value (Enum member)
    14    Span                  shape (1 byte), start and count (LEB128 varints, minimal):
                                children start..start+count-1 joined into one value
    16    Span with lengths     as 14, then ``count`` varints: the length of each child's
                                part (items, pairs, characters or bytes: see links.Span)

    tz: nil, a str (zoneinfo.ZoneInfo key) or [utcoffset in microseconds, name or nil]
    (datetime.timezone; the name only if one was given).

Only exact types are stored (subclasses of builtins such as OrderedDict or a namedtuple
are refused, not silently converted) and classes are rebuilt only from a TypeRegistry:
decoding never imports or looks anything up by a name read from the data. Payloads 3-9
and 13 hold nested msgpack, nested at most MAX_EXT_DEPTH deep. msgpack packs memoryview
(as bytes), msgpack.ExtType and msgpack.Timestamp without asking this module: keep them
out of a state. msgpack's timestamp ext (-1) is never written; it decodes to a UTC datetime.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import decimal
import enum
import itertools
import json
import re
import sys
import uuid
import zoneinfo
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final, cast

import msgpack

from .errors import FormatError, InvalidArgumentError, SerializationError
from .links import Ref, Span, counted_span_fields, span_fields, varint

__all__ = ["MAX_EXT_DEPTH", "Ref", "Span", "TypeRegistry", "decode", "encode", "encode_link",
           "encode_view"]

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

    __slots__ = ("_by_class", "_by_name")

    def __init__(self, types: Iterable[type] = ()) -> None:
        self._by_name: dict[str, type] = {}
        self._by_class: dict[type, _Entry] = {}
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


# ----------------------------------------------------------------------------- encoding


class _Unsupported(Exception):
    """args: (what cannot be stored, what to do about it)."""


def _refuse(obj: object) -> _Unsupported:
    cls = type(obj)
    kind = _kind_of(cls)
    if kind is not None:
        return _Unsupported(
            f"an instance of {_qualname(cls)} (a {kind} that is not registered)",
            f"register the class: pass types=[{cls.__name__}] when opening the store "
            "(CheckpointStore.open, AsyncCheckpointStore.open, CasSaver.from_url)",
        )
    base = next((b for b in _BUILTINS if isinstance(obj, b)), None)
    if base is not None:
        return _Unsupported(
            f"a {_qualname(cls)} (a subclass of {base.__name__})",
            "only exact types are stored, so that values come back unchanged; convert it "
            f"with {base.__name__}(...) or use a registered dataclass",
        )
    return _Unsupported(
        f"a value of type {_qualname(cls)}",
        "only None, bool, int, float, str, bytes, list, tuple, dict, set, frozenset, datetime, "
        "date, time, timedelta, UUID, Decimal and registered dataclasses, pydantic models and "
        "Enums can be stored; convert it, or keep it out of the state",
    )


def _tz_state(tz: _dt.tzinfo | None, what: str) -> Any:
    if tz is None:
        return None
    if type(tz) is _dt.timezone:
        args = cast(tuple[Any, ...], tz.__reduce__()[1])  # (offset,) or (offset, name)
        return [args[0] // _USEC, args[1] if len(args) > 1 else None]
    if type(tz) is zoneinfo.ZoneInfo and tz.key is not None and _ZONE_KEY_RE.fullmatch(tz.key):
        return tz.key
    raise _Unsupported(
        f"a {what} with tzinfo {tz!r}",
        "only datetime.timezone and zoneinfo.ZoneInfo (built from an IANA key) are stored; "
        "convert it, e.g. with .astimezone(zoneinfo.ZoneInfo(...))",
    )


def _reduce(obj: Any, reg: TypeRegistry) -> tuple[int, Any]:
    """(ext code, payload) of a value msgpack cannot pack; raw codes have a bytes payload."""
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
    if t is uuid.UUID:
        return _UUID, obj.bytes
    if t is decimal.Decimal:
        return _DECIMAL, str(obj).encode("ascii")
    if t is Ref or t is Span:  # reserved for the links between nodes: see encode_link
        raise _Unsupported(f"a {t.__name__} placeholder", "it is reserved for the links between "
                           "cas_checkpoint's own state nodes; keep it out of the state")
    entry = reg._by_class.get(t)
    if entry is None:
        raise _refuse(obj)
    if entry.kind == _ENUM:
        return _OBJECT, [entry.name, obj.value]
    if entry.to_data is not None:
        return _OBJECT, [entry.name, entry.to_data(obj)]
    if entry.kind == _DATACLASS:
        return _OBJECT, [entry.name, {f: getattr(obj, f) for f in entry.fields}]
    if getattr(t, "__pydantic_root_model__", False):
        return _OBJECT, [entry.name, obj.root]
    state = {f: getattr(obj, f) for f in t.model_fields}
    state.update(obj.__pydantic_extra__ or {})
    return _OBJECT, [entry.name, state]


def _depth_ok(root: object, limit: int) -> bool:
    """True if no list/dict item under ``root`` (depth 0) is deeper than ``limit``."""
    stack: list[tuple[Any, int]] = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        if node and depth >= limit:
            return False
        for child in itertools.chain(node.keys(), node.values()) if type(node) is dict else node:
            if type(child) is list or type(child) is dict:
                stack.append((child, depth + 1))
    return True


class _Encoder:
    __slots__ = ("depth", "reg")

    def __init__(self, reg: TypeRegistry) -> None:
        self.reg, self.depth = reg, 0

    def pack(self, value: object, wrap: int) -> bytes:
        # Packed inside [value] ([[value]] for set items, which decode one level deeper) so
        # that the packer's depth limit stays within what the unpacker accepts. The result is
        # copied once out of the packer's buffer (no intermediate bytes: a big state is not
        # held three times over).
        with self.packed(value, wrap) as buf:
            return bytes(buf[wrap:])

    def packed(self, value: object, wrap: int, size: int = 0) -> memoryview:
        """The packer's own buffer (``wrap`` bytes of wrapping first), not copied; ``size``:
        the bytes expected (the buffer starts that big, so it need not grow)."""
        packer = msgpack.Packer(default=self.default, strict_types=True,
                                buf_size=max(4096, size + wrap + 16), autoreset=False)
        packer.pack([[value]] if wrap == 2 else [value])
        buf: memoryview = packer.getbuffer()
        return buf

    def default(self, obj: Any) -> msgpack.ExtType:  # only called for non-native values
        code, payload = _reduce(obj, self.reg)
        if code in _RAW_CODES:
            return msgpack.ExtType(code, payload)
        if self.depth >= MAX_EXT_DEPTH:
            raise ValueError("nested too deep")
        self.depth += 1
        try:
            if self.depth > _FREE_EXT_LEVELS and not _depth_ok(payload, _DEEP_LIMIT):
                raise ValueError("nested too deep")
            if code == _SET or code == _FROZENSET:
                items = sorted(self.pack(item, 2) for item in payload)
                head = msgpack.Packer(buf_size=16).pack_array_header(len(items))
                return msgpack.ExtType(code, head + b"".join(items))
            return msgpack.ExtType(code, self.pack(payload, 1))
        finally:
            self.depth -= 1


def _find_error(value: object, reg: TypeRegistry) -> SerializationError | None:
    """Walk ``value`` as the packer does and describe the first thing it cannot store."""
    stack: list[tuple[Iterator[tuple[str, Any]], int, int, int]] = []  # items, depth, ext, id
    active: set[int] = set()  # containers on the current path, to name cycles

    def visit(obj: Any, path: str, depth: int, ext: int) -> None:  # raises _Unsupported
        limit = _NATIVE_LIMIT if ext <= _FREE_EXT_LEVELS else _DEEP_LIMIT
        if depth > limit:
            raise _Unsupported("a value", f"it is cyclic or nested too deep (at most "
                               f"{MAX_EXT_DEPTH} tuples/sets/datetimes/objects inside each other,"
                               f" lists and dicts {limit} deep there); flatten it")  # fmt: skip
        t = type(obj)
        if obj is None or t is bool or t is float or t is bytes or t is bytearray:
            return
        if t is str:
            try:
                obj.encode("utf-8")
            except UnicodeEncodeError as exc:
                what = f"a str that is not valid Unicode ({exc.reason} at index {exc.start})"
                raise _Unsupported(what, "remove the lone surrogates") from None
            return
        if t is int and -(1 << 63) <= obj < 1 << 64:
            return
        if id(obj) in active:
            raise _Unsupported("a value that contains itself", "a cyclic reference; break the "
                               "cycle, e.g. store an id instead of the object")  # fmt: skip
        items: Iterator[tuple[str, Any]]
        child_depth, child_ext = depth + 1, ext
        if t is list:
            items = ((f"{path}[{i}]", v) for i, v in enumerate(obj))
        elif t is dict:
            items = (kv for k, v in obj.items() for kv in (
                (f"{path}<key {_render(k)}>", k), (f"{path}[{_render(k)}]", v)))  # fmt: skip
        else:
            try:
                code, payload = _reduce(obj, reg)
            except _Unsupported:
                raise
            except Exception as exc:
                what, advice = f"the {_qualname(t)}", f"reading it raised {_brief(exc)}"
                raise _Unsupported(what, advice) from exc
            if code in _RAW_CODES:
                return
            if ext >= MAX_EXT_DEPTH:
                return visit(obj, path, _NATIVE_LIMIT + 1, ext)  # "nested too deep"
            child_depth, child_ext = 1, ext + 1
            if code == _TUPLE:
                items = ((f"{path}[{i}]", v) for i, v in enumerate(obj))
            elif code == _SET or code == _FROZENSET:
                items = ((f"{path}{{{_render(v)}}}", v) for v in obj)
            elif code == _OBJECT and isinstance(obj, enum.Enum):
                items = iter([(f"{path}.value", payload[1])])
            elif code == _OBJECT and type(payload[1]) is dict:  # [name, {field: value}]
                items, child_depth = ((f"{path}.{k}", v) for k, v in payload[1].items()), 2
            else:
                items = iter([(f"{path}.root", payload[1])] if code == _OBJECT else [])
        stack.append((items, child_depth, child_ext, id(obj)))
        active.add(id(obj))

    path = "state"
    try:
        visit(value, path, 0, 0)
        while stack:
            items, depth, ext, ident = stack[-1]
            item = next(items, None)
            if item is None:
                stack.pop()
                active.discard(ident)
            else:
                path = item[0]
                visit(item[1], path, depth, ext)
    except _Unsupported as exc:
        error = SerializationError(f"cannot store {exc.args[0]} at {path}: {exc.args[1]}", path)
        error.__cause__ = exc.__cause__
        return error
    return None


def encode_link(link: Ref | Span) -> bytes:
    """The bytes of a Ref or Span placeholder (``encode`` refuses them in a state)."""
    if type(link) is Ref:  # the index was checked by Ref.__post_init__
        size = next(n for n in (1, 2, 4, 8) if link.index >> 8 * n == 0)
        ext = msgpack.ExtType(_REF, link.index.to_bytes(size))
    elif type(link) is Span:
        head = bytes([link.shape]) + varint(link.start) + varint(link.count)
        if link.lengths is None:
            ext = msgpack.ExtType(_SPAN, head)
        else:
            ext = msgpack.ExtType(_SPAN_LENGTHS, head + b"".join(map(varint, link.lengths)))
    else:
        raise InvalidArgumentError(f"encode_link() needs a Ref or Span, got {type(link).__name__}")
    data: bytes = msgpack.packb(ext)
    return data


def encode(value: Any, *, types: TypeRegistry | None = None) -> bytes:
    """Encode ``value`` deterministically; raise SerializationError naming what and where."""
    return bytes(encode_view(value, types=types))  # copied once out of the packer's buffer


def encode_view(value: Any, *, types: TypeRegistry | None = None, size: int = 0
                ) -> memoryview:
    """``encode``'s bytes as a view of the encoder's own buffer: no copy of a big state (the
    view holds the buffer, which may be up to twice as long, until it is released, unless
    ``size`` says how long the encoding is: the length of an earlier encoding of ``value``)."""
    reg = _NO_TYPES if types is None else types
    try:  # C speed: Python runs only for non-native values
        return _Encoder(reg).packed(value, 1, size)[1:]
    except MemoryError:
        raise
    except Exception as exc:  # TypeError, ValueError, OverflowError, RecursionError, user code
        try:
            found = _find_error(value, reg)
        except Exception:  # e.g. a dict changed size while we walked it
            found = None
        message = f"cannot store the value at state: {_brief(exc)}"
        error = found or SerializationError(message, "state")
    error.__suppress_context__ = True
    raise error


# ----------------------------------------------------------------------------- decoding


class _ResolveFailed(Exception):
    """args[0]: an exception raised by ``resolve``, carried through decode unchanged."""


def _problem(exc: Exception) -> str:
    if isinstance(exc, msgpack.ExtraData):
        return "trailing bytes after the value"
    if isinstance(exc, msgpack.StackError | RecursionError):
        return "nested too deep"
    if isinstance(exc, msgpack.OutOfData) or "incomplete input" in str(exc):
        return "truncated data"
    return f"invalid data ({_brief(exc)})"


def _ints(payload: Any, count: int, size: int, what: str) -> list[int]:
    """The first ``count`` items of a list payload of ``size`` items, checked to be ints."""
    if type(payload) is not list or len(payload) != size:
        raise FormatError(f"a {what} payload is not a list of {size} items; {_CORRUPT}")
    if any(type(v) is not int for v in payload[:count]):
        raise FormatError(f"a {what} payload holds a non-int where an int belongs; {_CORRUPT}")
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
                f"time zone {state!r} is not available here ({_brief(exc)}); install the "
                f"tzdata package if it is missing, otherwise {_CORRUPT}"
            ) from None
    if type(state) is list and len(state) == 2 and type(state[0]) is int:
        offset = _dt.timedelta(microseconds=state[0])
        if state[1] is None:
            return _dt.timezone(offset)
        if type(state[1]) is str:
            return _dt.timezone(offset, state[1])
    raise FormatError(f"invalid tzinfo in a datetime or time; {_CORRUPT}")


class _Decoder:
    __slots__ = ("depth", "objects", "reg", "resolve", "span")

    def __init__(self, reg: TypeRegistry, resolve: Callable[[int], Any] | None,
                 span: Callable[..., Any] | None = None,
                 objects: Callable[[str, Any], Any] | None = None) -> None:
        self.reg, self.resolve, self.span, self.depth = reg, resolve, span, 0
        self.objects = objects

    def unpack(self, data: bytes) -> Any:
        if self.depth >= MAX_EXT_DEPTH:
            raise FormatError(f"extension types nest deeper than {MAX_EXT_DEPTH}; {_CORRUPT}")
        self.depth += 1
        try:
            hook = self.ext_hook
            if self.depth <= _UNPACKB_LEVELS:
                return msgpack.unpackb(data, ext_hook=hook, strict_map_key=False, timestamp=3)
            unpacker = msgpack.Unpacker(None, max_buffer_size=max(1, len(data)), ext_hook=hook,
                                        strict_map_key=False, timestamp=3)  # fmt: skip
            unpacker.feed(data)
            value = unpacker.unpack()
            if unpacker.tell() != len(data):
                raise FormatError(f"trailing bytes in an extension payload; {_CORRUPT}")
            return value
        finally:
            self.depth -= 1

    def ext_hook(self, code: int, data: bytes) -> Any:
        if not 0 < code < len(_EXT_NAMES) or not _EXT_NAMES[code]:
            raise FormatError(f"unknown extension type {code}; {_CORRUPT}")
        try:
            return self.build(code, data if code in _RAW_CODES else self.unpack(data))
        except (FormatError, _ResolveFailed):
            raise
        except Exception as exc:
            raise FormatError(f"invalid {_EXT_NAMES[code]}: {_problem(exc)}; {_CORRUPT}") from None

    def build(self, code: int, data: Any) -> Any:
        if code == _TUPLE and type(data) is list:
            return tuple(data)
        if (code == _SET or code == _FROZENSET) and type(data) is list:
            return set(data) if code == _SET else frozenset(data)
        if code == _DATETIME:
            y, mo, d, h, mi, s, us, fold = _ints(data, 8, 9, "datetime")
            return _dt.datetime(y, mo, d, h, mi, s, us, tzinfo=_tz_from(data[8]), fold=fold)
        if code == _DATE:
            return _dt.date(*_ints(data, 3, 3, "date"))
        if code == _TIME:
            h, mi, s, us, fold = _ints(data, 5, 6, "time")
            return _dt.time(h, mi, s, us, tzinfo=_tz_from(data[5]), fold=fold)
        if code == _TIMEDELTA:
            return _dt.timedelta(*_ints(data, 3, 3, "timedelta"))
        if code == _UUID and len(data) == 16:
            return uuid.UUID(bytes=data)
        if code == _DECIMAL and _DECIMAL_RE.fullmatch(text := data.decode("ascii")):
            return decimal.Decimal(text)
        if code == _BIGINT and 0 < len(data) <= _MAX_BIGINT_BYTES:
            value = int.from_bytes(data, signed=True)
            minimal = (value if value >= 0 else ~value).bit_length() // 8 + 1 == len(data)
            if minimal and not -(1 << 63) <= value < 1 << 64:
                return value
        if code == _REF and len(data) in (1, 2, 4, 8):
            index = int.from_bytes(data)
            if len(data) == 1 or index >> 4 * len(data):  # minimal: it needs more than half
                if self.resolve is None:
                    raise FormatError(f"found Ref({index}) but no resolve function was given")
                try:
                    return self.resolve(index)
                except BaseException as exc:
                    raise _ResolveFailed(exc) from None
        if code == _SPAN_LENGTHS and (counted := counted_span_fields(data)) is not None:
            if self.span is None:
                raise FormatError("found a Span but no span function was given")
            try:
                return self.span(*counted)
            except BaseException as exc:
                raise _ResolveFailed(exc) from None
        if code == _SPAN and (fields := span_fields(data)) is not None:
            if self.span is None:
                raise FormatError("found a Span but no span function was given")
            try:
                return self.span(*fields)
            except BaseException as exc:
                raise _ResolveFailed(exc) from None
        if code == _OBJECT and type(data) is list and len(data) == 2 and type(data[0]) is str:
            return self.build_object(data[0], data[1])
        raise FormatError(f"invalid {_EXT_NAMES[code]} payload; {_CORRUPT}")

    def build_object(self, name: str, state: Any) -> Any:
        if self.objects is not None:  # the caller looks at the stored data: nothing is built
            return self.objects(name, state)
        cls = self.reg._by_name.get(name)
        if cls is None:
            short = _render(name.rsplit(".", 1)[-1])[1:-1]
            raise FormatError(
                f"the data holds an object of class {_render(name)}, which is not registered: "
                f"pass types=[{short}] when opening the store (CheckpointStore.open, "
                "AsyncCheckpointStore.open, CasSaver.from_url) so it can be rebuilt"
            )
        entry, model = self.reg._by_class[cls], cast(Any, cls)
        try:
            if entry.kind == _ENUM:
                return cls(state)
            if entry.from_data is not None:
                return entry.from_data(state)
            if entry.kind == _MODEL and getattr(cls, "__pydantic_root_model__", False):
                return model.model_validate(state)
            if entry.kind == _MODEL and type(state) is dict:
                return model.model_validate(state, by_alias=False, by_name=True)
            if entry.kind == _DATACLASS and type(state) is dict:
                obj = cls(**{k: v for k, v in state.items() if k not in entry.no_init})
                for key in entry.no_init.intersection(state):
                    object.__setattr__(obj, key, state[key])
                return obj
        except Exception as exc:
            raise FormatError(
                f"cannot rebuild {entry.name} from the stored data ({_brief(exc)}): the class "
                f"changed since it was saved, or {_CORRUPT}"
            ) from None
        raise FormatError(f"invalid state for {entry.name}; {_CORRUPT}")


def decode(
    data: bytes | memoryview,
    *,
    types: TypeRegistry | None = None,
    resolve: Callable[[int], Any] | None = None,
    span: Callable[..., Any] | None = None,
    objects: Callable[[str, Any], Any] | None = None,
) -> Any:
    """Decode bytes written by :func:`encode`; bad bytes raise FormatError, nothing else.

    Each Ref is replaced by ``resolve(index)``, each Span by ``span(shape, start, count)``
    (``span(shape, start, count, lengths)`` for a Span with lengths); exceptions from either
    pass unchanged. With ``objects``, a registered object is replaced by ``objects(name,
    state)`` (its stored data; no class is looked up or built).
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidArgumentError(f"decode() needs bytes, got {type(data).__name__}")
    decoder = _Decoder(_NO_TYPES if types is None else types, resolve, span, objects)
    try:
        return msgpack.unpackb(data, ext_hook=decoder.ext_hook, strict_map_key=False, timestamp=3)
    except FormatError:
        raise
    except _ResolveFailed as exc:
        raise exc.args[0] from None
    except MemoryError:
        raise
    except Exception as exc:  # msgpack's errors, ValueError, TypeError, UnicodeDecodeError, ...
        problem = _problem(exc)
    raise FormatError(f"cannot decode: {problem}; {_CORRUPT}") from None
