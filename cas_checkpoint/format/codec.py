"""Values <-> bytes: deterministic msgpack with a fixed table of extension types.
Rule: equal values encode to equal bytes."""

from __future__ import annotations

import datetime as _dt
import decimal
import enum
import itertools
import uuid
import zoneinfo
from collections.abc import Iterator
from typing import Any, cast

import msgpack

from cas_checkpoint.errors import InvalidArgumentError, SerializationError
from cas_checkpoint.format.decoding import (
    _Decoder as _Decoder,  # (re-exported: tests patch its hook)
)
from cas_checkpoint.format.decoding import decode
from cas_checkpoint.format.extypes import (
    _BIGINT,
    _BUILTINS,
    _DATACLASS,
    _DATE,
    _DATETIME,
    _DECIMAL,
    _DEEP_LIMIT,
    _ENUM,
    _FREE_EXT_LEVELS,
    _FROZENSET,
    _MAX_BIGINT_BYTES,
    _NATIVE_LIMIT,
    _NO_TYPES,
    _OBJECT,
    _RAW_CODES,
    _REF,
    _SET,
    _SPAN,
    _SPAN_LENGTHS,
    _TIME,
    _TIMEDELTA,
    _TUPLE,
    _USEC,
    _UUID,
    _ZONE_KEY_RE,
    MAX_EXT_DEPTH,
    ObjectData,
    TypeRegistry,
    _brief,
    _kind_of,
    _qualname,
    _render,
)
from cas_checkpoint.format.extypes import (
    _UNPACKB_LEVELS as _UNPACKB_LEVELS,  # (re-exported, likewise)
)
from cas_checkpoint.format.placeholders import Ref, Span, varint

__all__ = ["MAX_EXT_DEPTH", "Ref", "Span", "TypeRegistry", "decode", "encode", "encode_link",
           "encode_nested", "encode_view"]

# ----------------------------------------------------------------------------- encoding


_STAND_IN = -1  # (not a stored code) _reduce's payload is stored in the value's place
_NATIVE = frozenset({type(None), bool, float, str, bytes, list, dict})


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
    if t is ObjectData:
        return _OBJECT, [obj.name, obj.data]
    entry = reg._by_class.get(t)
    if entry is None:
        if reg.stand_in is not None and (got := reg.stand_in(obj)) is not NotImplemented:
            if type(got) is t:
                raise _Unsupported(f"a {_qualname(t)}", "its stand-in is of its own type")
            return _STAND_IN, got
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
        for _ in range(wrap):  # (each wrapping list's header is one byte)
            value = [value]
        packer.pack(value)
        buf: memoryview = packer.getbuffer()
        return buf

    def default(self, obj: Any) -> Any:  # only called for non-native values: an ExtType
        code, payload = _reduce(obj, self.reg)
        if code == _STAND_IN:  # packed in the value's place (msgpack asks us only once)
            t = type(payload)
            if t in _NATIVE or (t is int and -(1 << 63) <= payload < 1 << 64):
                return payload
            code, payload = _reduce(payload, self.reg)
            if code == _STAND_IN:
                raise ValueError("a stand-in of a stand-in")
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
            if code == _STAND_IN:
                return visit(payload, path, depth, ext)
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


def encode_nested(value: Any, depth: int, *, types: TypeRegistry | None = None) -> bytes:
    """The bytes ``value`` has inside a value that ``encode`` encodes, where ``depth`` lists
    and dicts enclose it (the state itself is at depth 0): msgpack is concatenative, so a
    caller may join such pieces under the headers of their enclosing lists and dicts and get
    exactly ``encode``'s bytes of the whole; the packer's depth limit counts from ``depth``,
    so a piece that encodes here encodes in the whole. Raises SerializationError (naming the
    value's place as ``state``) where ``encode`` would raise."""
    reg = _NO_TYPES if types is None else types
    try:
        return bytes(_Encoder(reg).packed(value, depth + 1)[depth + 1:])
    except MemoryError:
        raise
    except Exception as exc:
        raise SerializationError(f"cannot store the value at state: {_brief(exc)}",
                                 "state") from None


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

