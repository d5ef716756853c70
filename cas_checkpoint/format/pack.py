"""The pack object: many objects in one, with an index of id prefixes and lengths, optionally
zstd-compressed. Pure code."""

from __future__ import annotations

import collections
import itertools
import struct
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from cas_checkpoint.errors import FormatError
from cas_checkpoint.format.objects import _HEADERS, PACK, ObjectId, object_id, object_kind

PACK_PREFIX = 4  # bytes of each object's id in a pack's index: the rest is its hash
MAX_SAME_PREFIX = 16  # objects of one pack sharing a prefix, at most (a few, by chance)
SHORT, ZSTD, ENCRYPTED = 1, 2, 4  # flag bits
MAX_RATIO = 64  # a compressed body may expand to at most this many times its size...
SMALL_BODY = 1 << 20  # ...or to this many bytes, whichever is more
PAYS = 0.9  # compress a body only when that saves at least 10%
SAMPLE = 1 << 16  # bytes of each of the three pieces a big body is tried on first...
SAMPLED = 1 << 20  # ...a body over this size (a smaller one is compressed at once: its sample
# would cost half as much again as compressing it, and a wasted try costs ~1 ms at most)
LEVELS = range(1, 20)  # zstd levels a store may use
FAST = 1  # the level of a big pack of one save's new objects (Zstd.fast)
MAX_WINDOW = 1 << 23  # zstd window a reader allows: levels 1-19 never use more than 8 MB


def _bad(what: str) -> FormatError:
    return FormatError(f"damaged or foreign object: {what}")


class Zstd:
    """Compresses pack bodies with zstd (the ``zstandard`` binding) at one level."""

    def __init__(self, level: int = 3) -> None:
        self.level = level
        self._mine = threading.local()  # a zstd context is not thread-safe: one per thread
        self._fast: Zstd | None = None

    def fast(self) -> Zstd:
        """The compressor for a big pack of one save's new objects: zstd at ``FAST`` (or the
        store's level, if lower). Measured in a save of 1,000 messages (a 432 KB body), level 3
        took 1.1-1.8 ms and level 1 0.9-1.2 ms, for 4% more bytes; such a pack is compressed
        again at the store's level when merges take it (staging.py)."""
        if self.level <= FAST:
            return self
        if self._fast is None:
            self._fast = Zstd(FAST)
        return self._fast

    @property
    def compresses(self) -> bool:
        """Whether ``compress`` may compress (else it always gives None)."""
        return True

    def compress(self, body: bytes | memoryview) -> bytes | None:
        """The compressed body, or None when it does not pay or would read as a bomb."""
        out = self.compress_parts([body], len(body))
        return None if out is None else b"".join(out)

    def _context(self) -> Any:
        """This thread's zstd context (zstd's worker threads were tried for big bodies: no
        faster on a busy 2-core machine, and ~58 MB more resident memory, outside Python)."""
        ctx = getattr(self._mine, "ctx", None)
        if ctx is None:
            import zstandard

            ctx = self._mine.ctx = zstandard.ZstdCompressor(level=self.level,
                                                            write_content_size=True)
        return ctx

    def compress_parts(self, parts: Sequence[bytes | memoryview], size: int
                       ) -> list[bytes] | None:
        """The body made of ``parts`` (``size`` bytes in all) compressed into one zstd frame
        as pieces to join (the parts are never joined first), or None when it does not pay
        or would read as a bomb."""
        if size < 64:
            return None
        ctx = self._context()
        if size > SAMPLED:  # try three pieces first: an incompressible body (a big random
            # value) costs neither the time nor a second copy of itself
            sample = b"".join((_slice(parts, 0, SAMPLE), _slice(parts, size // 2, SAMPLE),
                               _slice(parts, size - SAMPLE, SAMPLE)))
            if len(ctx.compress(sample)) > PAYS * len(sample):
                return None
        if len(parts) == 1 or size <= SAMPLED:  # (a small body is joined: one call is
            out = [ctx.compress(parts[0] if len(parts) == 1 else b"".join(parts))]  # cheaper)
        else:
            stream = ctx.compressobj(size=size)
            out = [piece for part in parts if (piece := stream.compress(part))]
            out.append(stream.flush())
        stored = sum(map(len, out))
        if stored > PAYS * size or size > max(SMALL_BODY, MAX_RATIO * stored):
            return None
        return out


def _slice(parts: Sequence[bytes | memoryview], start: int, n: int) -> bytes:
    """``n`` bytes from offset ``start`` of the concatenation of ``parts`` (not made)."""
    got: list[bytes | memoryview] = []
    for part in parts:
        if start >= len(part):
            start -= len(part)
            continue
        piece = memoryview(part)[start:start + n]
        got.append(piece)
        n -= len(piece)
        start = 0
        if n <= 0:
            break
    return b"".join(got)


class Sealing(Zstd):
    """An encrypted store's packer: compression as ``inner`` says (None: none), then sealing
    under ``key`` (``packing.make_pack`` seals; ``key`` None: a key-less store, which must not
    write). Every writer of packs gets it from ``ObjectStore.settle``, so none can forget."""

    def __init__(self, inner: Zstd | None, key: Any) -> None:
        super().__init__(inner.level if inner is not None else 3)
        self.inner = inner
        self.key = key

    def fast(self) -> Zstd:
        if self.inner is None or self.inner.fast() is self.inner:
            return self
        if self._fast is None:
            self._fast = Sealing(self.inner.fast(), self.key)
        return self._fast

    @property
    def compresses(self) -> bool:
        return self.inner is not None

    def compress_parts(self, parts: Sequence[bytes | memoryview], size: int
                       ) -> list[bytes] | None:
        return None if self.inner is None else self.inner.compress_parts(parts, size)


def encode_pack(objects: Mapping[ObjectId, bytes | memoryview],
                compressor: Zstd | None = None) -> bytes:
    """One pack holding ``objects`` (id -> bytes), in the order given (see the module's
    docstring); 6 or 8 bytes of index an object; a reader re-hashes an object to know its full
    id. With a ``compressor``, the body is compressed when that pays."""
    return encode_packs(objects, compressor)[0]


def encode_packs(objects: Mapping[ObjectId, bytes | memoryview],
                 compressor: Zstd | None = None) -> tuple[bytes, bytes]:
    """``encode_pack``'s bytes, and the same pack as a reader sees it once it is decompressed
    (``open_pack``): the very same bytes object when the body stays plain. The body is never
    joined on its own: it is compressed from the objects, and copied once into each pack (the
    compressed one first, so that a big body is not held three times over)."""
    parts = list(objects.values())
    lengths = list(map(len, parts))
    short = max(lengths, default=0) < 1 << 16
    prefixes = bytes.fromhex("".join([oid[:2 * PACK_PREFIX] for oid in objects]))
    sizes = struct.pack(f">{len(lengths)}{'H' if short else 'I'}", *lengths)
    count = struct.pack(">I", len(objects))
    plain = b"".join([_HEADERS[PACK], bytes([SHORT if short else 0]), count, prefixes, sizes,
                      *parts]) if compressor is None or not compressor.compresses else None
    if plain is not None:
        return plain, plain
    packed = compressor.compress_parts(parts, sum(lengths)) if compressor is not None else None
    stored = None
    if packed is not None:
        stored = b"".join([_HEADERS[PACK], bytes([(SHORT if short else 0) | ZSTD]), count,
                           prefixes, sizes, *packed])
        del packed
    plain = b"".join([_HEADERS[PACK], bytes([SHORT if short else 0]), count, prefixes, sizes,
                      *parts])
    return (plain if stored is None else stored), plain


_READING = threading.local()  # this thread's zstd decompression context (``_decompressor``)


def _decompressor(zstandard: Any) -> Any:
    """This thread's zstd decompression context, made once (a context is not thread-safe, and
    making one costs ~50 us, about what decompressing a small pack does; a stream reader
    resets it before each frame)."""
    dctx = getattr(_READING, "dctx", None)
    if dctx is None:
        dctx = _READING.dctx = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW)
    return dctx


def _decompress(data: memoryview, start: int, size: int, out: bytearray | memoryview) -> None:
    """Fill the last ``size`` bytes of ``out`` (made to its full size by the caller, after
    ``_check_ratio``) with what the zstd frame at ``data[start:]`` holds."""
    try:
        import zstandard
    except ImportError:  # pragma: no cover - a dependency of this package
        raise FormatError("this pack is zstd-compressed: pip install zstandard") from None
    # Streamed, never sized by the frame's header: output goes straight where it belongs (no
    # chunk made, then copied), and one byte past what the index says is asked for; the window
    # a frame may ask for is bounded. Damage cannot ask for more.
    dctx = _decompressor(zstandard)
    dest = memoryview(out)[len(out) - size:]
    got, extra = 0, bytearray(1)
    try:
        with dctx.stream_reader(data[start:], read_across_frames=False) as reader:
            while got < size:
                n = reader.readinto(dest[got:got + (1 << 20)])
                if not n:
                    break
                got += n
            if got == size:
                got += reader.readinto(extra)
    except (zstandard.ZstdError, MemoryError) as exc:
        _READING.dctx = None  # (a context a damaged frame stopped is not used again)
        raise _bad(f"its compressed body does not decompress ({exc or type(exc).__name__})"
                   ) from None
    finally:
        dest.release()
    if got != size:
        _READING.dctx = None
        raise _bad(f"its body decompresses to {got} bytes, not the {size} its index says")


def _check_ratio(stored: int, size: int) -> None:
    """FormatError for a body of ``stored`` bytes said to expand to ``size``: a bomb."""
    if size > max(SMALL_BODY, MAX_RATIO * stored):
        raise _bad(f"a compressed pack body of {stored} bytes claims to expand to {size} "
                   f"(more than {MAX_RATIO}x): a decompression bomb or a damaged index")


class PackIndex(Mapping[int, list[tuple[int, int]]]):
    """A pack's index: id prefix (as an int) -> the (start, end) of each object whose id starts
    so (one, but for the rare chance collision). Kept compact (a dict of ints to object numbers
    and one list of offsets, which the garbage collector need not walk), not as a list and a
    tuple per object."""

    __slots__ = ("_at", "_dups", "_ends")

    def __init__(self, prefixes: tuple[int, ...] = (), ends: list[int] | None = None) -> None:
        self._ends = ends if ends is not None else [0]  # object i is [_ends[i], _ends[i + 1])
        self._at = dict(zip(prefixes, range(len(prefixes)), strict=True))  # prefix -> i, or -1
        self._dups: dict[int, list[tuple[int, int]]] = {}
        if len(self._at) < len(prefixes):  # some prefixes repeat: gather every location of each
            times = collections.Counter(prefixes)
            if max(times.values()) > MAX_SAME_PREFIX:
                raise _bad(f"more than {MAX_SAME_PREFIX} objects of a pack share an id prefix")
            for i, p in enumerate(prefixes):
                if times[p] > 1:
                    self._dups.setdefault(p, []).append((self._ends[i], self._ends[i + 1]))
                    self._at[p] = -1

    def get(self, prefix: int, default: Any = None) -> Any:
        i = self._at.get(prefix)
        if i is None:
            return default
        if i < 0:
            return self._dups[prefix]
        return [(self._ends[i], self._ends[i + 1])]

    def find(self, oids: list[str], prefixes: Mapping[str, int] | None = None
             ) -> tuple[list[str], list[int], list[int], list[str]]:
        """(the oids of ``oids`` whose id prefix names one object here, the start and the end
        of each, the other oids): a batch of lookups (an oid whose prefix several objects
        share is among the others, for ``get`` to resolve). ``prefixes``: each oid's
        ``pack_prefix``, when the caller parsed them once for every pack it asks."""
        at, ends = self._at, self._ends
        if prefixes is None:
            where = [at.get(int(oid[:2 * PACK_PREFIX], 16), -1) for oid in oids]
        else:
            where = [at.get(prefixes[oid], -1) for oid in oids]
        if -1 not in where:  # (the common case: every one is here, once)
            return oids, [ends[i] for i in where], [ends[i + 1] for i in where], []
        here = [i >= 0 for i in where]
        found = list(itertools.compress(oids, here))
        at_ = [i for i in where if i >= 0]
        other = [oid for oid, i in zip(oids, where, strict=True) if i < 0]
        return found, [ends[i] for i in at_], [ends[i + 1] for i in at_], other

    def __getitem__(self, prefix: int) -> list[tuple[int, int]]:
        got: list[tuple[int, int]] | None = self.get(prefix)
        if got is None:
            raise KeyError(prefix)
        return got

    def __iter__(self) -> Iterator[int]:
        return iter(self._at)

    def __len__(self) -> int:
        return len(self._at)

    @property
    def count(self) -> int:
        """Objects in the pack."""
        return len(self._ends) - 1

    @property
    def size(self) -> int:
        """The plain bytes the objects span (where the last one ends)."""
        return self._ends[-1]

    @property
    def start(self) -> int:
        """Where the body starts (the first object's offset: the header's length)."""
        return self._ends[0]

    def spans(self) -> list[tuple[int, int]]:
        """(start, end) of every object, in the pack's order."""
        return list(zip(self._ends, self._ends[1:], strict=False))


def _header(data: bytes | memoryview
            ) -> tuple[memoryview, int, tuple[int, ...], tuple[int, ...], int]:
    """(the pack's bytes, where its body starts, its objects' id prefixes and lengths, their
    sum) from its header, with every check that needs no byte of the body (a compressed
    body's ratio is checked before anything is allocated)."""
    if object_kind(data) != PACK:
        raise _bad("expected a pack")
    view = memoryview(data)
    if len(view) > 5 and view[5] & ENCRYPTED:
        raise FormatError("this pack is encrypted: open its store with its key "
                          "(encryption=Key.from_env('CAS_KEY'))")
    if len(view) < 10 or view[5] & ~(SHORT | ZSTD):
        raise _bad("pack flags name a feature this version does not read (upgrade "
                   "cas_checkpoint)")
    width = 2 if view[5] & SHORT else 4
    (count,) = struct.unpack_from(">I", view, 6)
    body = 10 + count * (PACK_PREFIX + width)
    if body > len(view):
        raise _bad(f"pack claims {count} objects but is only {len(view)} bytes long")
    prefixes = struct.unpack_from(f">{count}I", view, 10)
    lengths = struct.unpack_from(f">{count}{'H' if width == 2 else 'I'}", view,
                                 10 + count * PACK_PREFIX)
    total = sum(lengths)
    if view[5] & ZSTD:
        _check_ratio(len(view) - body, total)  # (before anything is allocated)
    return view, body, prefixes, lengths, total


def open_pack(data: bytes | memoryview) -> tuple[memoryview, PackIndex]:
    """A pack's bytes as a reader uses them (the body decompressed, if it was) and its index
    (``PackIndex``). Checks the shape only: the caller re-hashes each object it takes out to
    find the one it wants."""
    view, body, prefixes, lengths, total = _header(data)
    return _opened(view, body, total), PackIndex(
        prefixes, list(itertools.accumulate(lengths, initial=body)))


def open_indexed(data: bytes | memoryview, index: PackIndex) -> memoryview:
    """``open_pack(data)[0]`` for a pack whose index ``pack_index`` read from these very
    bytes (every check of the header made): the header is not read again."""
    return _opened(memoryview(data), index.start, index.size - index.start)


def _opened(view: memoryview, body: int, total: int) -> memoryview:
    """The pack ``view`` with its body decompressed, if it was (``open_pack``)."""
    if view[5] & ZSTD:
        plain = bytearray(body + total)
        plain[:body] = view[:body]
        plain[5] &= ~ZSTD
        _decompress(view, body, total, plain)
        view = memoryview(plain).toreadonly()  # (nothing writes to it once it is filled)
    if body + total != len(view):
        raise _bad("pack index does not add up to the pack's length")
    return view


SCRATCH_MIN = 1 << 16  # a compressed body of this many plain bytes...
SCRATCH_MAX = 1 << 19  # ...up to this many is read through one of a thread's scratch buffers
# (a smaller one is decompressed and kept: memory the process reuses, and little of it); each
# thread keeps the bodies of the last SCRATCH_KEPT packs
SCRATCH_KEPT = 16  # it read there (more than the 14 a head names), in SCRATCH_BYTES at most
SCRATCH_BYTES = 1 << 21
_SCRATCH = threading.local()  # this thread's [(stored pack, buffer, body size, body start)]


def scratch_body(stored: bytes | memoryview, index: PackIndex | None = None
                 ) -> tuple[memoryview, int] | None:
    """The decompressed body of the compressed pack ``stored`` (the very bytes object), and
    where the body starts in the plain pack (an index offset less that is an offset in the
    body), in one of this thread's scratch buffers; None for a pack that is not compressed or
    whose body is under ``SCRATCH_MIN`` or over ``SCRATCH_MAX`` bytes. The buffers are
    reused: a cold read of a pack whose body the caches do not keep decompressed copies out
    the objects it takes (a kept body would be ~5x the bytes a read of the newest state
    takes, in memory fresh to the process each time). The view is valid until this thread's
    next call: the caller copies what it needs, then releases it. The bodies of the thread's
    last ``SCRATCH_KEPT`` packs stay decompressed: a read that takes a tree level at a time
    decompresses each pack once. ``index``: the pack's, as ``pack_index`` read it from these
    very bytes (every check of the header made): the header is not read again."""
    kept: list[list[Any]] | None = getattr(_SCRATCH, "kept", None)
    if kept is None:
        kept = _SCRATCH.kept = []
    for i, entry in enumerate(kept):
        if entry[0] is stored:
            if i != len(kept) - 1:
                kept.append(kept.pop(i))
            return memoryview(entry[1])[:entry[2]].toreadonly(), entry[3]
    if index is None:
        view, body, _, _, total = _header(stored)
    else:  # (where pack_index found the body, and its plain size, after its checks)
        view, body = memoryview(stored), index.start
        total = index.size - body
    if not view[5] & ZSTD or not SCRATCH_MIN <= total <= SCRATCH_MAX:
        return None
    spare = bytearray()  # (the biggest buffer let go of, for this body if it is big enough:
    held = sum([len(entry[1]) for entry in kept])  # a thread's buffers settle at the sizes of
    while kept and (len(kept) >= SCRATCH_KEPT or held + total > SCRATCH_BYTES):  # the bodies
        buf = kept.pop(0)[1]  # it reads, and their memory stays the process's)
        held -= len(buf)
        if len(buf) > len(spare):
            spare = buf
    buf = spare if len(spare) >= total else bytearray(total)
    _decompress(view, body, total, memoryview(buf)[:total])
    kept.append([stored, buf, total, body])
    return memoryview(buf)[:total].toreadonly(), body


def pack_index(data: bytes | memoryview) -> tuple[PackIndex, int]:
    """A pack's index and its size with its body decompressed, read from its header only
    (nothing is decompressed or allocated for the body; ``open_pack`` of the same bytes
    checks the body and gives the objects)."""
    view, body, prefixes, lengths, total = _header(data)
    if not view[5] & ZSTD and body + total != len(view):
        raise _bad("pack index does not add up to the pack's length")
    return PackIndex(prefixes, list(itertools.accumulate(lengths, initial=body))), body + total


def read_pack_index(data: bytes | memoryview) -> PackIndex:
    """The index of a plain (uncompressed) pack's bytes; ``open_pack`` for any pack."""
    view, index = open_pack(data)
    if len(view) != len(data):
        raise _bad("a compressed pack: read it with open_pack")
    return index


def pack_prefix(oid: str) -> int:
    return int(oid[:2 * PACK_PREFIX], 16)


def decode_pack(data: bytes | memoryview) -> dict[ObjectId, memoryview]:
    """Every object of a pack by its full id (each one hashed: tools and audits)."""
    view, index = open_pack(data)
    out: dict[ObjectId, memoryview] = {}
    for start, end in index.spans():
        obj = view[start:end]
        out[object_id(obj)] = obj
    return out


def compressor(name: Any, level: Any) -> Zstd | None:
    """The compressor for a store setting: ``None``/``"none"`` or ``"zstd"`` (with a level).
    One per level in the process, shared by its store objects: a zstd context (one per
    thread) costs ~0.2 ms to make and warm on its first pack, which a store object opened
    per request (a new saver) paid on its first flush."""
    if name in (None, "none"):
        return None
    if name == "zstd":
        if level is None:
            level = 3
        if not isinstance(level, int) or isinstance(level, bool) or level not in LEVELS:
            raise ValueError(f"zstd level must be an int from {LEVELS.start} to "
                             f"{LEVELS.stop - 1}, not {level!r}")
        got = _BY_LEVEL.get(level)
        if got is None:
            got = _BY_LEVEL.setdefault(level, Zstd(level))
        return got
    raise ValueError(f"compression must be None, 'none' or 'zstd', not {name!r}")


_BY_LEVEL: dict[int, Zstd] = {}  # (a Zstd holds no state but each thread's zstd context)
