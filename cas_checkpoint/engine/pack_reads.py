"""A pack as a store object holds it: read (and hashed as a whole) from storage, or made here;
its objects taken out by id, each hashed against it the first time (``object_store.py`` reads
and caches packs; this module is what one of them is)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from cas_checkpoint.engine.pack_folders import PREFIX
from cas_checkpoint.errors import FormatError, IntegrityError
from cas_checkpoint.format import sealing
from cas_checkpoint.format.objects import ObjectId, object_id, object_ids
from cas_checkpoint.format.pack import (
    ZSTD,
    PackIndex,
    open_indexed,
    open_pack,
    pack_index,
    pack_prefix,
    scratch_body,
)


def pack_key(pid: str) -> str:
    """``packs/ab/cdef...``: 256 folders, so no folder grows huge."""
    return f"{PREFIX}/{pid[:2]}/{pid[2:]}"


def key_pack_id(key: str) -> ObjectId | None:
    """The id named by a pack key, or None for a key that is not a pack."""
    parts = key.split("/")
    if len(parts) != 3 or parts[0] != PREFIX or len(parts[1]) != 2:
        return None
    pid = parts[1] + parts[2]
    if len(pid) != 64 or any(c not in "0123456789abcdef" for c in pid):
        return None
    return ObjectId(pid)


class PrefixMismatch(Exception):
    """Internal: a pack holds an object of the wanted id's prefix, not of the wanted id."""


@dataclass(slots=True)
class Pack:
    """A pack read (and hashed as a whole) from storage: its index by id prefix; each object is
    re-hashed the first time it is taken out. A compressed pack read from storage, or a big
    one this process made (``ObjectStore._remember_new``), is held as it was stored
    (``stored``): a read copies the objects it takes (``taken``) out of the body decompressed
    in a scratch buffer of its thread (``pack.scratch_body``; a cold read of a thread's
    newest state takes ~1/5 of the bodies of the packs it reads); the body is decompressed for
    good (``data``) when a caller needs all of it (merges, audits), or for a body too big for
    a scratch buffer."""

    id: ObjectId
    size: int
    _data: memoryview | None  # its bytes as a reader uses them (None: not decompressed yet)
    index: PackIndex
    verified: set[str] = field(default_factory=set)
    _all: dict[ObjectId, memoryview] | None = None
    known: tuple[ObjectId, ...] = ()  # its objects' ids in order, when this process packed it
    stored: bytes | memoryview | None = None  # the compressed pack, while _data is None
    plain: int = 0  # bytes counted for it while it is not decompressed, if more than stored
    # (a pack read from storage: a read may decompress it, the cache's bound counts that)
    taken: dict[str, memoryview] | None = None  # objects copied out while it stays stored
    took: int = 0  # the bytes of those copies

    @property
    def data(self) -> memoryview:
        """The pack's bytes with its body decompressed (done now, once, if it was not)."""
        got = self._data
        if got is None:
            stored = self.stored
            if stored is None:  # (another thread decompressed it meanwhile)
                got = self._data
                assert got is not None
                return got
            try:  # (its index was read from these bytes: the header is not read again)
                got = open_indexed(stored, self.index)
            except FormatError as exc:
                raise FormatError(f"pack {pack_key(self.id)}: {exc}") from None
            self._data = got
            self.stored = None
            self.taken = None  # (what was copied out is in there too)
        return got

    def _copies(self, starts: list[int], ends: list[int]) -> list[memoryview] | None:
        """Copies of the bytes at these spans, out of the body decompressed in this thread's
        scratch buffer (``pack.scratch_body``), while the pack is held as stored; None when it
        is decompressed (or its body is too big for a scratch buffer): the caller slices
        ``data``. The copies are one bytes object: a cold read keeps what it takes."""
        stored = self.stored
        if stored is None or self._data is not None:
            return None
        try:
            got = scratch_body(stored, self.index)
        except FormatError as exc:
            raise FormatError(f"pack {pack_key(self.id)}: {exc}") from None
        if got is None:
            return None
        body, base = got
        try:
            joined = memoryview(b"".join([body[s - base:e - base]
                                          for s, e in zip(starts, ends, strict=True)]))
        finally:
            body.release()
        out, at = [], 0
        for s, e in zip(starts, ends, strict=True):
            out.append(joined[at:at + e - s])
            at += e - s
        return out

    def _keep(self, oids: list[str], views: list[memoryview]) -> None:
        """Remember objects copied out and hashed (``_copies``)."""
        taken = self.taken
        if taken is None:
            taken = self.taken = {}
        taken.update(zip(oids, views, strict=True))
        self.took += sum(map(len, views))

    @property
    def held(self) -> int:
        """Bytes it holds in memory now: its stored bytes and the objects copied out of it
        while its body is not decompressed (at least ``plain``), else its plain bytes (a
        compressed pack's are bigger than the stored pack)."""
        got, stored = self._data, self.stored
        if got is None and stored is not None:
            return max(len(stored) + self.took, self.plain)
        return max(self.size, self.data.nbytes)

    def get(self, oid: str) -> bytes | None:
        got = self.get_view(oid)
        return None if got is None else bytes(got)

    def get_view(self, oid: str, prefix: int | None = None) -> memoryview | None:
        """``get`` without copying the object out of the pack (a read-only view of the pack's
        bytes, which it keeps alive); ``prefix``: ``pack_prefix(oid)``, when the caller has
        it."""
        locations = self.index.get(pack_prefix(oid) if prefix is None else prefix)
        if locations is None:
            return None
        taken = self.taken
        if taken is not None and (got := taken.get(oid)) is not None:
            return got
        copies = self._copies([s for s, _ in locations], [e for _, e in locations])
        actual = ""
        for i, (start, end) in enumerate(locations):
            data = self.data[start:end] if copies is None else copies[i]
            if oid in self.verified and len(locations) == 1:
                if copies is not None:
                    self._keep([oid], [data])
                return data
            actual = object_id(data)
            if actual == oid:
                self.verified.add(oid)
                if copies is not None:
                    self._keep([oid], [data])
                return data
        # An object of this id prefix whose bytes hash to another id: by chance another object
        # (then the wanted one is elsewhere), or a pack that lies. The caller decides.
        raise PrefixMismatch(IntegrityError(oid, actual, f"{pack_key(self.id)} (object {oid})"))

    def take_views(self, oids: list[str], out: dict[str, bytes | memoryview],
                   prefixes: Mapping[str, int] | None = None) -> list[str]:
        """``get_view`` of a batch: each of ``oids`` that this pack holds, hashed against its
        id (unless hashed before), goes into ``out``; returns the others (not here, a prefix
        that several objects share, or bytes of another id: ``get_view`` says which).
        ``prefixes``: each oid's ``pack_prefix`` (``PackIndex.find``)."""
        taken = self.taken
        if taken:  # (copied out by an earlier read, and hashed)
            rest = []
            for oid in oids:
                got = taken.get(oid)
                if got is None:
                    rest.append(oid)
                else:
                    out[oid] = got
            if not rest:
                return rest
            oids = rest
        ids, starts, ends, other = self.index.find(oids, prefixes)
        if not ids:
            return other
        verified = self.verified
        copies = self._copies(starts, ends)
        if copies is None:
            data = self.data
            views = list(map(data.__getitem__, map(slice, starts, ends)))
        else:
            views = copies
        fresh = [i for i, oid in enumerate(ids) if oid not in verified] if verified else None
        checked = ids if fresh is None else [ids[i] for i in fresh]
        names = object_ids(views if fresh is None else [views[i] for i in fresh])
        bad = {oid for oid, name in zip(checked, names, strict=True) if name != oid}
        verified.update([oid for oid in checked if oid not in bad] if bad else checked)
        other.extend(bad)
        if bad:
            good = [(oid, v) for oid, v in zip(ids, views, strict=True) if oid not in bad]
            ids, views = [oid for oid, _ in good], [v for _, v in good]
        out.update(zip(ids, views, strict=True))
        if copies is not None:
            self._keep(ids, views)
        return other

    def __contains__(self, oid: object) -> bool:
        try:
            return isinstance(oid, str) and self.get(oid) is not None
        except PrefixMismatch:
            return False

    @property
    def objects(self) -> dict[ObjectId, memoryview]:
        """Every object by its full id (each hashed once: for merges, repacks, audits)."""
        got = self._all
        if got is None:  # built whole, then published: another thread never sees a part of it
            got = {}
            spans = self.index.spans()  # (in the pack's order)
            index = self.index
            if self.known and len(self.known) == len(spans) and all(  # packed here, in order
                    span in index.get(pack_prefix(oid), ())
                    for oid, span in zip(self.known, spans, strict=True)):
                got = {oid: self.data[start:end] for oid, (start, end) in zip(
                    self.known, spans, strict=True)}
            else:
                for start, end in spans:
                    obj = self.data[start:end]
                    got[object_id(obj)] = obj
            self._all = got
        return got


def parse_pack(pid: str, data: bytes, *, trusted: bool = False,
               keys: sealing.Keyring | None = None, lazy: bool = False) -> Pack:
    """A pack from its stored bytes: hashed against its name (unless this process just built
    it: ``trusted``), decrypted if it is encrypted (with ``keys``), then its index decoded. A
    key-less keyring gets an encrypted pack with an empty index (its name checked, nothing
    else). ``lazy``: a compressed body is decompressed (and checked) when an object is first
    taken out of it (``Pack.data``: a FormatError naming the pack then), not now."""
    actual = pid if trusted else object_id(data)
    if actual != pid:
        raise IntegrityError(pid, actual, pack_key(pid))
    size = len(data)
    if keys is not None and sealing.is_sealed_pack(data):
        if keys.keyless and bytes(data[6:14]).hex() not in keys.keys:
            return Pack(ObjectId(pid), size, memoryview(b""), PackIndex())
        data = sealing.open_sealed_pack(data, keys, pack_key(pid))
    try:
        if lazy and len(data) > 5 and data[5] & ZSTD:  # its body decompressed when an
            index, plain = pack_index(data)  # object of it is first taken out, not before
            # (a cold read of a thread's newest state takes nothing from most of its packs)
            return Pack(ObjectId(pid), size, None, index, stored=data, plain=plain)
        view, index = open_pack(data)
    except FormatError as exc:
        raise FormatError(f"pack {pack_key(pid)}: {exc}") from None
    return Pack(ObjectId(pid), size, view, index)


