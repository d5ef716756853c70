"""Immutable objects by id, in packs and in thread heads.
Rule: every read re-hashes; wrong bytes are never returned."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TypeVar

from cas_checkpoint.backends import Backend, sealed
from cas_checkpoint.engine import archive, encryption, live
from cas_checkpoint.engine import settings as marker
from cas_checkpoint.engine.pack_cache import PackCache
from cas_checkpoint.engine.pack_folders import PREFIX as PREFIX  # (gc, verify)
from cas_checkpoint.engine.pack_folders import PackFolders
from cas_checkpoint.engine.pack_reads import Pack as Pack  # (refs, verify)
from cas_checkpoint.engine.pack_reads import PrefixMismatch as PrefixMismatch
from cas_checkpoint.engine.pack_reads import key_pack_id as key_pack_id  # (gc, stats, verify)
from cas_checkpoint.engine.pack_reads import pack_key as pack_key
from cas_checkpoint.engine.pack_reads import parse_pack as parse_pack  # (gc, verify)
from cas_checkpoint.engine.process_caches import Shared, for_store
from cas_checkpoint.engine.steps import Blocking, GetMany, PutMany, Sleep, Step
from cas_checkpoint.errors import (
    CasError,
    FormatError,
    IntegrityError,
    InvalidArgumentError,
    NotFoundError,
)
from cas_checkpoint.format import sealing
from cas_checkpoint.format.heads import Head
from cas_checkpoint.format.ids import inline_ids
from cas_checkpoint.format.objects import (
    ObjectId,
    Record,
    decode_node,
)
from cas_checkpoint.format.pack import (
    ZSTD,
    Sealing,
    Zstd,
    open_pack,
    pack_index,
    pack_prefix,
)

_Id = TypeVar("_Id", bound=str)  # an id, or an ObjectId

SETTLE_WAIT = 30.0  # seconds a step waits for another that reads the settings
VIEWS_KEPT = 64  # threads whose newest view is kept (for the next read of the same head)
LAZY_BYTES = 64 * 1024  # a compressed pack made here this big (plain) is cached compressed:
# a merge's big pack is seldom read again by the process that wrote it (a thread it writes
# loads warm, from the states it saved), so its plain bytes (~10x) would only be held


class NeedPacks(Exception):
    """Internal: a merge needs packs that are not at hand (their ids in ``ids``)."""

    def __init__(self, ids: list[ObjectId]) -> None:
        super().__init__(ids)
        self.ids = ids


class View:
    """The objects one head holds: its inline objects and those of its packs. The packs of
    the head that could not be read (missing, or damaged: not one of their bytes is used) are
    in ``unreadable`` with their errors: an object found in none of the others raises the
    error of the first of them (it may be in there), never a plain "not found"."""

    def __init__(self, head: Head, packs: list[Pack], store: ObjectStore,
                 unreadable: dict[str, CasError] | None = None, recent: bool = False,
                 newest: bool = False) -> None:
        self.head = head
        self.newest = newest  # the history packs a live pack follows are not here either
        self.recent = (recent and head.archive is not None) or newest  # (some packs are not
        # here: an object none of them holds raises InArchive)
        self.packs = packs
        # (the store's URL for messages, not the store: the store keeps its views, and a view
        # holding it back made a cycle that kept a dropped store object alive until gc)
        self.url = store.backend.url if store is not None else "?"
        self.unreadable: dict[str, CasError] = unreadable or {}
        self._inline: dict[str, bytes] | None = None
        self._ids: frozenset[str] | None = None

    @property
    def inline(self) -> dict[str, bytes]:
        """The head's inline objects by id (named by their hash: nothing to check), found
        when first asked for: a reader that stays in the head's log tail (a save's checks of
        the newest entries) names none."""
        got = self._inline
        if got is None:
            inline = self.head.inline  # (hashed in one pass, those not hashed before)
            got = self._inline = dict(zip(inline_ids(inline), inline, strict=True))
        return got

    def whole(self) -> View:
        """This view, when every pack of its head could be read; else the error of the first
        that could not (for work that rewrites a thread's packs: ``repack``)."""
        if self.unreadable:
            raise _again(next(iter(self.unreadable.values())))
        return self

    def get(self, oid: str) -> bytes:
        return bytes(self.get_view(oid))

    def get_view(self, oid: str) -> bytes | memoryview:
        """``get`` without copying an object out of its pack."""
        data = self.inline.get(oid)
        if data is not None:
            return data
        mismatch: PrefixMismatch | None = None
        prefix = pack_prefix(oid) if self.packs else None  # (once, not once a pack)
        for pack in self.packs:
            try:
                got = pack.get_view(oid, prefix)
            except PrefixMismatch as exc:
                mismatch = exc
                continue
            if got is not None:
                return got
        if mismatch is not None:  # named (by prefix) where it should be, with other bytes
            raise mismatch.args[0]
        if self.unreadable:  # perhaps in a pack that cannot be read: say which, and why
            raise _again(next(iter(self.unreadable.values())))
        if self.recent:
            raise archive.InArchive(f"object {oid} is not in the newest packs of thread "
                                    f"{self.head.thread_id!r}; read its history and archive "
                                    "too (ObjectStore.view(head))")
        raise NotFoundError(
            f"object {oid} is not in thread {self.head.thread_id!r} (in none of its "
            f"{len(self.packs)} packs or its ref) in {self.url}; a checkpoint that "
            "needs it cannot be loaded. Run `cas-checkpoint verify` to list what is affected."
        )

    def get_many(self, oids: Iterable[str]) -> dict[str, bytes]:
        return {oid: self.get(oid) for oid in dict.fromkeys(oids)}

    def check(self, oids: frozenset[str]) -> None:
        """Raise (NotFoundError, IntegrityError) unless the head holds every object of
        ``oids`` with bytes that hash to its id; only those not hashed yet in this process are
        hashed now."""
        for oid in oids.difference(self.inline, *(p.verified for p in self.packs)):
            self.get(oid)

    def check_checkpoint(self, cid: str) -> None:
        """Raise (IntegrityError, NotFoundError, FormatError) unless the head holds the record
        of ``cid`` and every node of its state, each hashing to its id (of the nodes, only
        their lists of children are decoded)."""
        seen: set[str] = set()
        todo = list(Record.decode(self.get(cid)).children())
        while todo:
            got = self.get_views([n for n in dict.fromkeys(todo) if n not in seen])
            seen.update(got)
            todo = [c for data in got.values() for c in decode_node(data)[0] if c not in seen]

    def get_views(self, oids: Iterable[str]) -> dict[str, bytes | memoryview]:
        """``get_many`` without copying objects out of their packs: looked up and hashed a
        batch a pack (what the batch cannot settle, ``get_view`` settles or refuses)."""
        out: dict[str, bytes | memoryview] = {}
        todo = list(dict.fromkeys(oids))
        if self.inline:
            inline, rest = self.inline, []
            for oid in todo:
                data = inline.get(oid)
                if data is None:
                    rest.append(oid)
                else:
                    out[oid] = data
            todo = rest
        prefixes = {oid: pack_prefix(oid) for oid in todo} if len(self.packs) > 1 else None
        for pack in self.packs:  # (each oid's prefix parsed once, not once a pack it is
            if not todo:  # looked up in)
                break
            todo = pack.take_views(todo, out, prefixes)
        for oid in todo:
            out[oid] = self.get_view(oid)
        return out

    def fetch(self, root: ObjectId, inline: bytes | None
              ) -> Callable[[list[ObjectId]], dict[str, bytes | memoryview]]:
        """A state's nodes by id, each hashed against it (``tree.load``'s fetch): the state
        under ``root``, whose root node is ``inline`` when its record holds it (the record's
        hash covers it: only the nodes under it are read)."""

        def fetch(oids: list[ObjectId]) -> dict[str, bytes | memoryview]:
            if inline is None:
                return self.get_views(oids)
            out = self.get_views(o for o in oids if o != root)
            if root in oids:
                out[root] = inline
            return out

        return fetch

    def ids(self) -> set[str]:
        """The ids of every object the head holds (a new set each call)."""
        return set(self.frozen_ids())

    def lacks(self, oids: Iterable[_Id]) -> set[_Id]:
        """Those of ``oids`` the head does not hold with bytes that hash to their id (what
        ``frozen_ids`` says), hashing only the objects looked up that are not hashed yet (not
        every object of every pack, as ``frozen_ids`` does the first time)."""
        if self._ids is not None:
            return set(oids).difference(self._ids)
        out: set[_Id] = set()
        for oid in set(oids).difference(self.inline, *(p.verified for p in self.packs)):
            try:
                self.get_view(oid)
            except (NotFoundError, IntegrityError, FormatError):  # absent, other bytes under
                # its name, or perhaps in a pack that does not decode
                out.add(oid)
        return out

    def frozen_ids(self) -> frozenset[str]:
        if self._ids is None:
            ids = set(self.inline)
            for pack in self.packs:
                ids.update(pack.objects)
            self._ids = frozenset(ids)
        return self._ids


def _again(exc: CasError) -> CasError:
    """A new error like ``exc`` (an unreadable pack's, raised again for each object it may
    hold: a fresh exception each time, not one whose traceback keeps growing)."""
    if isinstance(exc, IntegrityError):
        return IntegrityError(exc.expected, exc.actual, exc.path)
    return type(exc)(*exc.args)


class ObjectStore:
    """Packs by id, with a bounded LRU cache (and an optional on-disk cache)."""

    def __init__(self, backend: Backend, cache_bytes: int = 256 * 1024 * 1024,
                 cache_dir: str | None = None) -> None:
        self.backend = backend
        self._lock = threading.Lock()
        self.cache_dir = cache_dir
        self.hits = 0
        self.misses = 0
        self._views: OrderedDict[str, View] = OrderedDict()  # by thread (its head's identity)
        self.wanted: marker.Settings | None = None  # what the opener asked for (None: any)
        self.settings: marker.Settings | None = None  # the store's, once read (first write)
        self.compressor: Zstd | None = None  # by the settings (None until they are read)
        self.keyring: sealing.Keyring | None = (  # an encrypted store's keys (sealing.py)
            backend.ring if isinstance(backend, sealed.SealedBackend) else None)
        self.sealed_by: dict[str, str] = {}  # pack id -> the key id it was sealed with
        # packs shared by the store objects of one memory:// store or local folder
        # (process_caches.py); never for an encrypted store (a store object without the key
        # must not read what another opened), nor for one asked to cache nothing (its process
        # then holds nothing for it after it is gone)
        scope = backend.shared_scope
        self.shared: Shared | None = (
            for_store(*scope) if scope is not None and self.keyring is None and cache_bytes > 0
            else None)
        self._settling = False  # a step is reading the settings now (see settle)
        self._folders = PackFolders(backend.has_folders)  # the pack folders made (durably)
        self.cache: PackCache[Pack] = PackCache(cache_bytes, None if self.shared is None else
                               self.shared.drop_packs)  # (memory://: the shared ones too)
        self._cache = self.cache.packs  # (the packs by id, least recently used first)
        if cache_dir is not None:
            os.makedirs(cache_dir, exist_ok=True)

    def settle(self) -> Step[Zstd | None]:
        """How new packs are compressed: by the store's settings, read once (before the first
        write of this object; a store without them gets them written); InvalidArgumentError if
        they differ from ``wanted``."""
        waited = 0.0
        while self.settings is None and self._settling and waited < SETTLE_WAIT:
            yield Sleep(0.002)  # another task or thread of this object is reading them: one
            waited += 0.002  # settles, the others wait (a store's first saves are concurrent)
        if self.settings is None:
            self._settling = True
            try:
                settings = yield from self._settings(write=True)
                if self.keyring is not None and isinstance(self.backend, sealed.SealedBackend):
                    yield from encryption.record_writer(self.keyring, settings, self.backend.names)
                self.adopt(settings)
            finally:  # (also when the step fails or is closed: the next caller tries again)
                self._settling = False
        return self.compressor

    def current(self) -> Step[marker.Settings]:
        """The store's settings (or, for a store without them, what a first write would
        give it), writing nothing."""
        if self.settings is not None:
            return self.settings
        return (yield from self._settings(write=False))

    def _settings(self, write: bool) -> Step[marker.Settings]:
        # A new store on local disk: its refs/heads folder is made with its root object, so
        # that one flush of the root makes both names durable (the first ref's write flushes
        # refs/ with its own folder: a first save flushes the root once, not twice)
        skeleton = (Blocking(self.backend.prepare_folders, ([sealing.HEADS], False))
                    if write and self.backend.has_folders else None)
        settings = yield from marker.settle(self.backend.url, self.wanted, write=write,
                                            skeleton=skeleton)
        if (settings.encryption is None) != (self.keyring is None):
            if settings.encryption:
                raise marker.encrypted(self.backend.url, settings)
            raise InvalidArgumentError(f"the store at {self.backend.url!r} is not encrypted; "
                                       "open it without encryption=")
        return settings

    def adopt(self, settings: marker.Settings) -> None:
        """Write by ``settings`` from now on (an encrypted store's packer also seals)."""
        self.compressor = self.packer(settings)
        self.settings = settings

    def packer(self, settings: marker.Settings) -> Zstd | None:
        """How packs are compressed (and, in an encrypted store, sealed) by ``settings``."""
        compressor = settings.compressor()
        if self.keyring is not None:
            compressor = Sealing(compressor, self.keyring.writer)
        return compressor

    def would_settle(self) -> Step[Zstd | None]:
        """What ``settle`` returns, writing nothing (for a dry run)."""
        if self.settings is not None:
            return self.compressor
        return self.packer((yield from self.current()))

    def sealer(self) -> sealing.Key | None:
        """The key new packs are sealed with (None: a plain store)."""
        return None if self.keyring is None else self.keyring.write_key()

    def parse(self, pid: str, data: bytes, *, trusted: bool = False, lazy: bool = False
              ) -> Pack:
        """``parse_pack`` with this store's keys (remembering which key sealed the pack)."""
        pack = parse_pack(pid, data, trusted=trusted, keys=self.keyring, lazy=lazy)
        if self.keyring is not None and sealing.is_sealed_pack(data):
            self.sealed_by[pid] = bytes(data[6:14]).hex()
        return pack

    # --- cache (pack_cache.py) ---

    def _remember(self, pack: Pack) -> None:
        self.cache.remember(pack)

    def _cached(self, pid: str) -> Pack | None:
        pack = self.cache.get(pid)
        if pack is not None:
            with self._lock:
                self.hits += 1
        return pack

    def forget(self, pids: Iterable[str]) -> None:
        self.cache.forget(pids)

    def held(self) -> int:
        """Bytes the pack cache holds now (each pack at its plain size)."""
        return self.cache.bytes

    def _disk_path(self, pid: str) -> str:
        assert self.cache_dir is not None
        return os.path.join(self.cache_dir, pid)

    def _from_disk(self, pid: str) -> Pack | None:
        if self.cache_dir is None:
            return None
        try:
            with open(self._disk_path(pid), "rb") as f:
                data = f.read()
        except OSError:
            return None
        try:
            pack = self.parse(pid, data, lazy=True)  # re-hashed: a damaged cache file is
            # just a miss
        except (IntegrityError, FormatError):
            return None
        with self._lock:
            self.hits += 1
        return pack

    def _to_disk(self, pid: str, data: bytes) -> None:
        if self.cache_dir is None:
            return
        tmp = f"{self._disk_path(pid)}.tmp-{os.getpid()}-{threading.get_ident()}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, self._disk_path(pid))
        except OSError:
            pass  # the disk cache is only a cache

    # --- packs (steps: see steps.py) ---

    def put_packs(self, packs: dict[ObjectId, bytes],
                  contents: dict[ObjectId, tuple[ObjectId, ...]] | None = None,
                  opened: dict[ObjectId, bytes] | None = None) -> Step[None]:
        """Write packs that are not there yet (each completely or not at all); writing one that
        exists refreshes its modified time, for gc. ``contents``: the ids of each pack's objects,
        as this process hashed them when it made the pack (they need no hashing again);
        ``opened``: each pack as this process made it before compressing and sealing it (it
        is not decompressed or decrypted again to be cached)."""
        if not packs:
            return
        keyed = {pack_key(k): v for k, v in packs.items()}
        folders = self._folders.batch(keyed)
        if folders:  # local disk: the folders these packs go into (and a few more) made and
            # their names made durable in one flush (pack_folders.py)
            yield Blocking(self.backend.prepare_folders, (folders,))
            self._folders.made(folders)
        yield PutMany(keyed)
        self._remember_new(packs, contents or {}, opened or {})

    def put_packs_now(self, packs: dict[ObjectId, bytes]) -> None:
        """``put_packs`` with the sync primitives (a local ref update's refresh, which runs
        inside the backend's own call)."""
        self.backend.put_many({pack_key(k): v for k, v in packs.items()})

    def _remember_new(self, packs: dict[ObjectId, bytes],
                      contents: dict[ObjectId, tuple[ObjectId, ...]],
                      opened: dict[ObjectId, bytes]) -> None:
        for pid, data in packs.items():
            plain = opened.get(pid)
            if plain is None:
                pack = self.parse(pid, data, trusted=True)
            elif (len(plain) >= LAZY_BYTES and self.keyring is None and len(data) > 5
                  and data[5] & ZSTD):  # made here, big and compressed: kept as stored
                index, _ = pack_index(data)
                pack = Pack(ObjectId(pid), len(data), None, index, stored=data)
            else:  # made here: its index is read, nothing is undone (the stored bytes are
                view, index = open_pack(plain)  # the same pack compressed, or sealed)
                pack = Pack(ObjectId(pid), len(data), view, index)
                if self.keyring is not None and sealing.is_sealed_pack(data):
                    self.sealed_by[pid] = bytes(data[6:14]).hex()
            pack.known = contents.get(pid, ())
            pack.verified.update(pack.known)
            self._remember(pack)
            if self.shared is not None:
                self.shared.keep_pack(pid, data, pack)

    def _parse_read(self, pid: str, data: bytes) -> Pack:
        """A pack read from storage: the one parsed from the very same bytes in this process
        (process_caches.py), or parsed (and hashed) now."""
        shared = self.shared
        if shared is None:
            return self.parse(pid, data, lazy=True)
        pack: Pack | None = shared.pack(pid, data)
        if pack is None:
            pack = self.parse(pid, data, lazy=True)
            shared.keep_pack(pid, data, pack)
        return pack

    def packs(self, pids: Iterable[str], unreadable: dict[str, CasError] | None = None
              ) -> Step[dict[str, Pack]]:
        """Packs by id, verified; the ones not cached are read in one parallel round. With
        ``unreadable``, a pack that is missing or damaged (it does not hash to its name, or
        does not decode) goes there with its error instead of raising it."""
        out: dict[str, Pack] = {}
        missing = []
        for pid in dict.fromkeys(pids):
            pack = self._cached(pid) or self._from_disk(pid)
            if pack is None:
                missing.append(pid)
            else:
                out[pid] = pack
                self._remember(pack)
        if missing:
            with self._lock:
                self.misses += len(missing)
            got = yield GetMany([pack_key(p) for p in missing])
            for pid in missing:
                data = got[pack_key(pid)]
                try:
                    if data is None:
                        raise NotFoundError(
                            f"pack {pack_key(pid)} is missing from {self.backend.url}; the "
                            "checkpoints stored in it cannot be loaded. Run `cas-checkpoint "
                            "verify` to list the checkpoints affected."
                        )
                    pack = self._parse_read(pid, data)
                except (NotFoundError, IntegrityError, FormatError) as exc:
                    if unreadable is None:
                        raise
                    unreadable[pid] = exc
                    continue
                out[pid] = pack
                # (a pack another store object made here and holds compressed: a reader
                # decompresses it, so its plain bytes count, as for a pack parsed now)
                self.cache.remember(pack, None if pack.held >= pack.index.size else
                                    pack.index.size)
                self._to_disk(pid, data)
        return out

    def pack_bytes(self, pids: Iterable[str]) -> Step[dict[ObjectId, dict[ObjectId, memoryview]]]:
        """The objects of each pack (for merging)."""
        got = yield from self.packs(pids)
        return {ObjectId(k): v.objects for k, v in got.items()}

    def cached_objects(self, fetched: dict[str, Pack], pids: list[ObjectId]
                       ) -> dict[ObjectId, dict[ObjectId, memoryview]]:
        """The objects of packs at hand (``fetched``, or cached); NeedPacks names the others
        (``RefStore._stage`` reads them and asks again)."""
        out: dict[ObjectId, dict[ObjectId, memoryview]] = {}
        need = []
        for pid in pids:
            pack = fetched.get(pid) or self._cached(pid)
            if pack is None:
                need.append(pid)
            else:
                out[pid] = pack.objects
        if need:
            raise NeedPacks(need)
        return out

    def view(self, head: Head, recent: bool = False, newest: bool = False) -> Step[View]:
        """Reads of the objects ``head`` holds (its packs are fetched now, in one round; a
        long thread's archived packs in a second: ``archive.py``). A pack that is missing or
        damaged does not stop it: the view reads the others, and raises that pack's error
        for an object it cannot find in them (``View``). ``recent``: the head's own packs
        only (not its archive's), for reads of the newest state and log entries; such a view
        raises ``archive.InArchive`` (a NotFoundError) for an object it does not hold, and
        the reader asks again for the whole view. ``newest``: ``recent``, less the history
        packs that a live pack follows (``live.py``: what the head's newest entries reach is
        in the others), for a cold read of the newest state; it raises ``InArchive`` too."""
        recent = recent or newest
        with self._lock:
            last = self._views.get(head.thread_id)
        if last is not None and last.head is head and (
                not last.recent or (recent and not last.newest) or newest):
            return last
        unreadable: dict[str, CasError] = {}
        named = head.packs if recent or newest else (yield from archive.named(self, head))
        if newest:
            named = live.newest(named)
        got = (yield from self.packs([p.id for p in named], unreadable)) if named else {}
        if head.archive is not None and not recent and not newest:
            named = tuple(p for p in named if p.id != head.archive.id)  # (the list alone)
        view = View(head, [got[p.id] for p in named if p.id in got], self, unreadable, recent,
                    newest and len(named) < len(head.packs))
        with self._lock:  # one per thread, its newest: an older head's view would keep the
            self._views[head.thread_id] = view  # packs a merge replaced since alive
            self._views.move_to_end(head.thread_id)
            while len(self._views) > VIEWS_KEPT:
                self._views.popitem(last=False)
        self.cache.own(head)
        return view
