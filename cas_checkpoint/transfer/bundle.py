"""Bundles: one portable file holding a thread's checkpoints and every object they reach (like
``git bundle``), written by ``export_thread`` and read by ``import_bundle``."""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable, Iterator
from typing import IO, Any

import blake3
import msgpack

from cas_checkpoint.engine.core import Core
from cas_checkpoint.engine.steps import Blocking, Step
from cas_checkpoint.errors import (
    CasError,
    FormatError,
    IntegrityError,
    InvalidArgumentError,
    StorageError,
)
from cas_checkpoint.format import untrusted
from cas_checkpoint.format.objects import CheckpointId, LogEntry, ObjectId
from cas_checkpoint.transfer.copy import ThreadSource
from cas_checkpoint.transfer.receive import BundleReport, Checker, Header, Progress, receive
from cas_checkpoint.tree.shapes import MAX_STATE_BYTES

MAGIC = b"\x89CAS-BUNDLE\r\n\x1a\n"
VERSION = 1
HEADER, ENTRIES, OBJECT, TRAILER = b"H", b"E", b"O", b"Z"
LIMITS = {  # the largest body each kind of record may claim
    HEADER: 16 << 20,
    ENTRIES: 64 << 20,
    OBJECT: 32 + MAX_STATE_BYTES + (1 << 20),
    TRAILER: 4096,
}
ENTRY_CHUNK = 1024  # log entries per E record, at most
MAX_COUNT = (1 << 62) - 1
CHUNK = 1 << 20  # bytes read from or written to the file per request
MAX_THREADS = 65536  # thread names a header may list
ITEMS = {  # the most msgpack values a record's body may hold (untrusted.count)
    HEADER: MAX_THREADS + 64,
    ENTRIES: 1 << 20,  # the writer closes a log record before it holds more than half
    TRAILER: 64,
}

Dest = str | os.PathLike[str] | IO[bytes]


def _bad(what: str) -> FormatError:
    return FormatError(f"not a valid cas_checkpoint bundle: {what}")


def _unpack(body: bytes, what: str, max_items: int) -> Any:
    """A record's body, decoded only if it holds at most ``max_items`` values (a hostile body
    of empty maps would grow the reader ~70 times its size before its shape is checked)."""
    try:
        return untrusted.unpack(body, f"its {what}", max_items)
    except FormatError as exc:
        raise _bad(str(exc)) from None


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


# --- writing -----------------------------------------------------------------------------------


class _Writer:
    """Records into a binary file, in chunks (each a blocking call: the async driver runs it on
    the backend's thread pool), with the running digest the trailer carries."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.buf = bytearray()
        self.digest = blake3.blake3()
        self.size = 0

    def raw(self, data: bytes) -> Step[None]:
        self.buf += data
        self.digest.update(data)
        self.size += len(data)
        if len(self.buf) >= CHUNK:
            yield from self.flush()

    def record(self, kind: bytes, *parts: bytes) -> Step[None]:
        yield from self.raw(kind + struct.pack(">I", sum(map(len, parts))))
        for part in parts:
            yield from self.raw(part)

    def flush(self) -> Step[None]:
        if self.buf:
            data, self.buf = bytes(self.buf), bytearray()
            yield Blocking(self.out.write, (data,))


def _pack(value: Any) -> bytes:
    packed: bytes = msgpack.packb(value, use_bin_type=True)
    return packed


def _log_records(entries: list[LogEntry]) -> Iterator[bytes]:
    """The bodies of the log's E records: each a msgpack list of at most ENTRY_CHUNK entries,
    closed early so that it holds at most half the values (``ITEMS``) and bytes (``LIMITS``) a
    reader accepts (big metadata makes big entries)."""
    max_items, max_bytes = ITEMS[ENTRIES] // 2, LIMITS[ENTRIES] // 2
    parts: list[bytes] = []
    items = size = 0
    prev: CheckpointId | None = None
    for e in entries:
        packed = _pack(e.pack(prev if parts else None))
        n = untrusted.count(packed, ITEMS[ENTRIES])
        if parts and (len(parts) >= ENTRY_CHUNK or items + n > max_items
                      or size + len(packed) > max_bytes):
            yield _array(len(parts)) + b"".join(parts)
            parts, items, size = [], 0, 0
            packed = _pack(e.pack(None))  # the first entry of a record names its parents
            n = untrusted.count(packed, ITEMS[ENTRIES])
        parts.append(packed)
        items, size, prev = items + n, size + len(packed), e.id
    if parts:
        yield _array(len(parts)) + b"".join(parts)


def _array(n: int) -> bytes:
    """msgpack's header of an array of ``n`` items."""
    return bytes([0x90 | n]) if n < 16 else (
        b"\xdc" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xdd" + n.to_bytes(4, "big"))


def _open_dest(dest: object) -> tuple[IO[bytes], Callable[[bool], None]]:
    """A binary file to write and ``close(ok)``: a path is written beside itself and renamed
    into place when complete, so a killed export never leaves a partial bundle there."""
    if hasattr(dest, "write"):
        return dest, lambda ok: None  # type: ignore[return-value]
    assert isinstance(dest, (str, os.PathLike))
    path = os.fspath(dest)
    tmp = f"{path}.tmp-{os.getpid()}-{time.monotonic_ns()}"
    try:
        f = open(tmp, "wb")  # noqa: SIM115 - closed by close()
    except OSError as exc:
        raise StorageError(f"cannot write the bundle {path!r}: {exc}") from exc

    def close(ok: bool) -> None:
        try:
            if ok:
                f.flush()
                os.fsync(f.fileno())
            f.close()
            if ok:
                os.replace(tmp, path)
        except OSError as exc:
            raise StorageError(f"cannot write the bundle {path!r}: {exc}") from exc
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    return f, close


def export_step(core: Core, thread_id: str, dest: Dest,
                progress: Progress | None = None) -> Step[BundleReport]:
    """Write ``thread_id`` of the store of ``core`` into the bundle ``dest`` (see above)."""
    if not hasattr(dest, "write") and not isinstance(dest, (str, os.PathLike)):
        raise InvalidArgumentError(f"dest must be a path or a binary file object open for "
                                   f"writing, not {type(dest).__name__}")
    source = ThreadSource(core, thread_id)
    header = yield from source.header()
    entries = yield from source.entries()
    threads = yield from source.record_threads()
    order = yield from source.walk()
    total, size = len(order), source.size
    out, close = yield Blocking(_open_dest, (dest,))
    try:
        w = _Writer(out)
        yield from w.raw(MAGIC + bytes([VERSION]))
        yield from w.record(HEADER, _pack({
            "v": VERSION, "thread": thread_id, "head": bytes.fromhex(header.head),
            "step": header.head_step, "entries": len(entries), "objects": total, "bytes": size,
            "threads": sorted(threads), "created": time.time(), "by": "cas_checkpoint",
        }))
        for chunk in _log_records(entries):
            yield from w.record(ENTRIES, chunk)
        done = 0
        while (item := (yield from source.next_object())) is not None:
            oid, data = item
            yield from w.record(OBJECT, bytes.fromhex(oid), data)
            done += 1
            if progress is not None:
                progress(done, total)
        digest = w.digest.digest()
        yield from w.record(TRAILER, _pack({"entries": len(entries), "objects": total,
                                            "bytes": size, "digest": digest}))
        yield from w.flush()
        yield from source.finish(Checker({}))
    except BaseException:
        close(False)  # (not a request: this may run as the step is closed)
        raise
    yield Blocking(close, (True,))
    return BundleReport(thread_id, len(entries), total, total, w.size, status="exported",
                        head=header.head)


# --- reading -----------------------------------------------------------------------------------


class FileSource:
    """A bundle file as a source for ``receive.receive``: every record checked as read."""

    trusted = False  # an unchanged thread is still read through, to check the bundle

    def __init__(self, src: object) -> None:
        if hasattr(src, "read"):
            self.name = str(getattr(src, "name", "<file>"))
        elif isinstance(src, (str, os.PathLike)):
            self.name = os.fspath(src)
        else:
            raise InvalidArgumentError(f"src must be a path or a binary file object open for "
                                       f"reading, not {type(src).__name__}")
        self.src = src
        self.f: IO[bytes] | None = None
        self.buf = bytearray()
        self.eof = False
        self.digest = blake3.blake3()
        self.size = 0
        self.head: Header | None = None
        self.threads: set[str] = set()
        self._entries: list[LogEntry] = []
        self.total: int | None = None
        self.kind = b""  # of the record read next, once peeked

    # framing

    def _open(self) -> Step[None]:
        if self.f is None:
            if hasattr(self.src, "read"):
                self.f = self.src  # type: ignore[assignment]
            else:
                self.f = yield Blocking(_open_src, (self.name,))

    def _fill(self, n: int) -> Step[None]:
        """At least ``n`` bytes buffered, or all there are."""
        while len(self.buf) < n and not self.eof:
            assert self.f is not None
            try:
                chunk = yield Blocking(self.f.read, (max(CHUNK, min(n - len(self.buf),
                                                                     16 * CHUNK)),))
            except OSError as exc:
                raise StorageError(f"cannot read the bundle {self.name!r}: {exc}") from exc
            if not isinstance(chunk, bytes | bytearray):
                raise InvalidArgumentError(f"{self.name!r} is not open in binary mode")
            if not chunk:
                self.eof = True
            self.buf += chunk

    def _take(self, n: int, what: str) -> Step[bytes]:
        yield from self._fill(n)
        if len(self.buf) < n:
            raise _bad(f"it ends inside {what} ({self.size + len(self.buf)} bytes; "
                       f"{n - len(self.buf)} more were expected): it is truncated")
        data = bytes(self.buf[:n])
        del self.buf[:n]
        self.digest.update(data)
        self.size += n
        return data

    def _peek(self) -> Step[bytes]:
        """The kind of the next record (b"" at the end of the file)."""
        yield from self._fill(1)
        return bytes(self.buf[:1])

    def _record(self, kind: bytes, what: str) -> Step[bytes]:
        got = yield from self._take(5, what)
        if got[:1] != kind:
            raise _bad(f"{what} was expected, found a record of kind {got[:1]!r}")
        (length,) = struct.unpack(">I", got[1:])
        if length > LIMITS[kind]:
            raise _bad(f"{what} claims {length} bytes, more than any valid one "
                       f"({LIMITS[kind]})")
        return (yield from self._take(length, what))

    # the source protocol

    def header(self) -> Step[Header]:
        yield from self._open()
        magic = yield from self._take(len(MAGIC) + 1, "its magic number")
        if magic[:-1] != MAGIC:
            raise _bad(f"{self.name!r} does not start with the bundle magic number (it starts "
                       f"{magic[:8]!r})")
        if magic[-1] != VERSION:
            raise FormatError(f"{self.name!r} is a bundle of format version {magic[-1]}; this "
                              f"version of cas_checkpoint reads version {VERSION}"
                              + ("; upgrade the package" if magic[-1] > VERSION else ""))
        raw = _unpack((yield from self._record(HEADER, "the header")), "header",
                      ITEMS[HEADER])
        if not isinstance(raw, dict):
            raise _bad("its header is not a map")
        thread, head, step = raw.get("thread"), raw.get("head"), raw.get("step")
        entries, objects, size = raw.get("entries"), raw.get("objects"), raw.get("bytes")
        threads = raw.get("threads")
        if raw.get("v") != VERSION:
            raise _bad("its header has the wrong version")
        if not isinstance(thread, str) or not thread:
            raise _bad("its header names no thread")
        if not isinstance(head, bytes) or len(head) != 32:
            raise _bad("its header's head is not a 32-byte id")
        if not all(_count(v) for v in (step, entries, objects, size)):
            raise _bad("its header's step and counts must be non-negative ints")
        if (not isinstance(threads, list) or len(threads) > MAX_THREADS
                or not all(isinstance(t, str) for t in threads)):
            raise _bad(f"its header's threads must be a list of at most {MAX_THREADS} names")
        self.threads = set(threads)
        self.total = objects
        assert isinstance(step, int) and isinstance(entries, int)
        self.head = Header(thread, CheckpointId(head.hex()), step, entries, objects, size)
        return self.head

    def entries(self) -> Step[list[LogEntry]]:
        assert self.head is not None
        out = self._entries
        while len(out) < self.head.entries:
            raw = _unpack((yield from self._record(ENTRIES, "the log")), "log", ITEMS[ENTRIES])
            if not isinstance(raw, list) or not raw:
                raise _bad("a log record is not a non-empty list")
            if len(out) + len(raw) > self.head.entries:
                raise _bad(f"its log holds more checkpoints than the {self.head.entries} its "
                           "header says")
            prev: CheckpointId | None = None
            for item in raw:
                try:
                    entry = LogEntry.unpack(item, prev)
                except FormatError as exc:
                    raise _bad(f"a log entry is malformed: {exc}") from None
                out.append(entry)
                prev = entry.id
        return out

    def record_threads(self) -> Step[set[str]]:
        return self.threads
        yield  # pragma: no cover - a step

    def next_object(self) -> Step[tuple[ObjectId, bytes] | None]:
        kind = yield from self._peek()
        if kind != OBJECT:
            return None
        body = yield from self._record(OBJECT, "an object")
        if len(body) < 32 + 5:
            raise _bad("an object record is too short to hold an id and an object")
        return ObjectId(body[:32].hex()), body[32:]

    def finish(self, checker: Checker) -> Step[None]:
        assert self.head is not None
        want = self.digest.hexdigest()
        raw = _unpack((yield from self._record(TRAILER, "the trailer")), "trailer",
                      ITEMS[TRAILER])
        if not isinstance(raw, dict) or not isinstance(raw.get("digest"), bytes):
            raise _bad("its trailer is not a map with a digest")
        if raw["digest"].hex() != want:
            raise IntegrityError(raw["digest"].hex(), want, f"bundle {self.name}")
        counts = (raw.get("entries"), raw.get("objects"), raw.get("bytes"))
        mine = (self.head.entries, len(checker.seen), checker.bytes)
        if counts != mine or (self.head.objects, self.head.bytes) != mine[1:]:
            raise _bad(f"its trailer and header count {counts} and "
                       f"{(self.head.entries, self.head.objects, self.head.bytes)} (entries, "
                       f"objects, bytes) but it holds {mine}")
        if self.threads != checker.threads:
            raise _bad("the threads its header names are not those its checkpoints were saved "
                       "in")
        if (yield from self._peek()):
            raise _bad("there are bytes after its trailer")
        yield from self._close()

    def _close(self) -> Step[None]:
        if self.f is not None and self.f is not self.src:
            f, self.f = self.f, None
            yield Blocking(f.close)

    def close_now(self) -> None:
        if self.f is not None and self.f is not self.src:
            f, self.f = self.f, None
            f.close()


def _open_src(path: str) -> IO[bytes]:
    try:
        return open(path, "rb")  # noqa: SIM115 - closed by FileSource
    except FileNotFoundError:
        raise InvalidArgumentError(f"no bundle at {path!r}: the file does not exist") from None
    except OSError as exc:
        raise StorageError(f"cannot read the bundle {path!r}: {exc}") from exc


def import_step(core: Core, src: object, as_thread: str | None = None,
                progress: Progress | None = None) -> Step[BundleReport]:
    """Read the bundle ``src`` into the store of ``core`` (see ``copy.receive``)."""
    if as_thread is not None and not isinstance(as_thread, str):
        raise InvalidArgumentError(f"as_thread must be a thread id (str) or None, not "
                                   f"{type(as_thread).__name__}")
    source = FileSource(src)
    try:
        return (yield from receive(core, source, as_thread, progress))
    except (CasError, GeneratorExit):
        raise
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError,
            UnicodeError, struct.error) as exc:  # a bug's last net: never a bare crash
        raise FormatError(f"the bundle {source.name!r} could not be read: "
                          f"{type(exc).__name__}: {exc}") from exc
    finally:
        source.close_now()


__all__ = ["MAGIC", "VERSION", "BundleReport", "Dest", "FileSource", "Progress", "export_step",
           "import_step"]
