"""Bytes -> values: the decoder of ``codec``'s format.
Rule: bad bytes raise FormatError, nothing else; nothing is imported or looked up by a name
read from the data."""

from __future__ import annotations

import datetime as _dt
import decimal
import os
import resource
import threading
import uuid
import zoneinfo
from collections.abc import Callable
from typing import Any, cast

import msgpack

from cas_checkpoint.errors import FormatError, InvalidArgumentError
from cas_checkpoint.format.extypes import (
    _BIGINT,
    _CORRUPT,
    _DATACLASS,
    _DATE,
    _DATETIME,
    _DECIMAL,
    _DECIMAL_RE,
    _ENUM,
    _EXT_NAMES,
    _FROZENSET,
    _MAX_BIGINT_BYTES,
    _MODEL,
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
    _UNPACKB_LEVELS,
    _UUID,
    _ZONE_KEY_RE,
    MAX_EXT_DEPTH,
    TypeRegistry,
    _brief,
    _render,
)
from cas_checkpoint.format.placeholders import counted_span_fields, span_fields
from cas_checkpoint.format.rebuilt import REBUILT, Kept


def _accelerator() -> Callable[..., Any] | None:
    if os.environ.get("CAS_CHECKPOINT_DECODER", "") == "msgpack":
        return None
    try:
        import ormsgpack
    except ImportError:  # pragma: no cover - optional
        return None
    return cast(Callable[..., Any], ormsgpack.unpackb)


FAST_UNPACKB = _accelerator()  # ormsgpack.unpackb, or None
FAST_MIN, FAST_MAX = 4096, 64 << 20  # input sizes worth the fast path (and its one copy)
FAST_STACK = 4 << 20  # the least stack of a thread it runs in (it needs ~0.6 MB at most)
_MAIN = threading.main_thread().ident
_HERE = threading.local()  # .stack: this thread's stack, fixed at its start (``stack_is``)


def stack_is(size: int) -> None:
    """Tell ``decode`` that the calling thread, not the main one, was started with a stack of
    ``size`` bytes (fixed at its start, unlike the main thread's): ormsgpack decodes there when
    that is at least FAST_STACK. The storage layer's thread pools call it in each of their
    threads, which they start with a stack of their own size (``backends.base``)."""
    if threading.get_ident() != _MAIN:
        _HERE.stack = size


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
    __slots__ = ("depth", "exts", "objects", "reg", "resolve", "span")

    def __init__(self, reg: TypeRegistry, resolve: Callable[[int], Any] | None,
                 span: Callable[..., Any] | None = None,
                 objects: Callable[[str, Any], Any] | None = None) -> None:
        self.reg, self.resolve, self.span, self.depth = reg, resolve, span, 0
        self.objects, self.exts = objects, 0

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
        self.exts += 1
        kept = None
        if code == _OBJECT and self.objects is None and type(data) is bytes:
            kept = REBUILT.get(data)
            if type(kept) is Kept and self.depth < MAX_EXT_DEPTH:  # (``unpack``'s own check)
                reg = self.reg  # the same class under that name, registered alike: a copy
                entry = reg._by_class.get(kept.cls)
                if reg._by_name.get(kept.entry.name) is kept.cls and (
                        entry is kept.entry or entry == kept.entry):
                    return kept.copy_out()
        if not 0 < code < len(_EXT_NAMES) or not _EXT_NAMES[code]:
            raise FormatError(f"unknown extension type {code}; {_CORRUPT}")
        try:
            if code != _OBJECT or self.objects is not None or type(data) is not bytes:
                return self.build(code, data if code in _RAW_CODES else self.unpack(data))
            exts = self.exts
            payload = self.unpack(data)
            obj = self.build(code, payload)
        except (FormatError, _ResolveFailed):
            raise
        except Exception as exc:
            raise FormatError(f"invalid {_EXT_NAMES[code]}: {_problem(exc)}; {_CORRUPT}") from None
        if self.exts == exts:  # (nothing nested: a copy is what decoding it at any depth gives)
            if kept is None:  # (the first time: noted only, see ``rebuilt``)
                REBUILT.saw(data)
            else:
                self.keep(data, payload[0], payload[1], obj)
        return obj

    def keep(self, data: bytes, name: str, state: Any, obj: Any) -> None:
        """Keep a copy of ``obj``, a pydantic model that its class built from ``state`` (see
        ``rebuilt``)."""
        cls = self.reg._by_name.get(name)
        entry = None if cls is None else self.reg._by_class.get(cls)
        if entry is not None and entry.kind == _MODEL and entry.from_data is None:
            REBUILT.keep(data, cast(type, cls), entry, obj, state)

    def build(self, code: int, data: Any) -> Any:
        if code == _OBJECT:  # first: the most frequent (a LangGraph state's messages)
            if type(data) is list and len(data) == 2 and type(data[0]) is str:
                return self.build_object(data[0], data[1])
            raise FormatError(f"invalid {_EXT_NAMES[code]} payload; {_CORRUPT}")
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
        raise FormatError(f"invalid {_EXT_NAMES[code]} payload; {_CORRUPT}")

    def build_object(self, name: str, state: Any) -> Any:
        if self.objects is not None:  # the caller looks at the stored data: nothing is built
            return self.objects(name, state)
        cls = self.reg._by_name.get(name)
        if cls is None and self.reg.unknown is not None:
            return self.reg.unknown(name, state)
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
                if getattr(cls, "__pydantic_custom_init__", False):  # (LangChain's messages)
                    # what model_validate does for a class with its own __init__ (its by_name
                    # is not passed on), without the validation call that only calls __init__
                    return cls(**state)
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
    if (FAST_UNPACKB is not None and FAST_MIN <= len(data) <= FAST_MAX and resolve is None
            and span is None and objects is None):
        main = threading.get_ident() == _MAIN
        if main or getattr(_HERE, "stack", 0) >= FAST_STACK:
            got = _fast(data, decoder, main)
            if got is not _FAILED:
                return got
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


_FAILED: Any = object()


def _fast(data: bytes | bytearray | memoryview, decoder: _Decoder, main: bool) -> Any:
    """ormsgpack's decoding of ``data``, or _FAILED where it might differ from msgpack's
    (see the module's docstring)."""
    # ormsgpack recurses in C per nesting level (up to its limit of 1,024) and calls
    # ``ext_hook`` at the bottom: ~0.6 MB of stack at most (a thread of 640 KB held every
    # hostile input of tests/test_fast_threads.py, one of 560 KB died), under FAST_STACK. The
    # main thread's limit is read at each call, not once: Linux grows its stack on demand up
    # to the limit in force at that moment, and setrlimit (or prlimit(1) from another process)
    # may lower it after import; a limit read once could send a deep input into a stack that
    # can no longer hold it (SIGSEGV). The call costs ~0.4 us, against >= ~4 us for the
    # smallest input decoded here (4 KB). Another thread's stack is fixed when it starts.
    if main:
        limit = resource.getrlimit(resource.RLIMIT_STACK)[0]
        if limit != resource.RLIM_INFINITY and limit < FAST_STACK:
            return _FAILED
    nonce = os.urandom(16)
    assert FAST_UNPACKB is not None
    try:
        got = FAST_UNPACKB(b"".join((b"\x92", data, b"\xc4\x10", nonce)),
                           ext_hook=decoder.ext_hook)
    except Exception:  # msgpack decodes it again and says what is wrong
        return _FAILED
    if type(got) is list and len(got) == 2 and got[1] == nonce:
        return got[0]
    return _FAILED
