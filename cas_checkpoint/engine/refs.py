"""Per-thread refs: the head of each thread and the log of its checkpoints (the parent DAG).
Rule: only ``RefStore.update`` writes or deletes a ref (``WriteRef``, ``DeleteRef``), and only
by compare-and-swap."""

from __future__ import annotations

import base64
import logging
import random
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial

import blake3

from cas_checkpoint.backends import Backend, ObjectInfo, RefMismatch
from cas_checkpoint.backends.sealed import SealedBackend
from cas_checkpoint.engine import collect, staging
from cas_checkpoint.engine.archive import InArchive
from cas_checkpoint.engine.model import UNSET, Unset
from cas_checkpoint.engine.object_store import NeedPacks, ObjectStore, Pack, View, pack_key
from cas_checkpoint.engine.steps import (
    DeleteMany,
    DeleteRef,
    List,
    ReadRef,
    ReadRefs,
    Sleep,
    Step,
    WriteRef,
)
from cas_checkpoint.errors import (
    CasError,
    ConflictError,
    FormatError,
    IntegrityError,
    InvalidArgumentError,
    NotFoundError,
    StorageError,
)
from cas_checkpoint.format.heads import MAX_HEAD_BYTES, Head, Peak, named
from cas_checkpoint.format.objects import CheckpointId, LogEntry, ObjectId, Segment, object_id
from cas_checkpoint.format.sealing import is_sealed_key

log = logging.getLogger("cas_checkpoint")

LEAF = 16
FANOUT = 16
MAX_THREAD_ID_BYTES = 64 * 1024
SHORT_KEY_BYTES = 80  # ids up to this many UTF-8 bytes are spelled out in their key
HEADS = "refs/heads"
RETRIES = 64  # lost races in a row before giving up: 8 busy writers lose ~3 in 4
RACE_WAIT = 0.25  # cap of the random wait after a lost race, in seconds


_KEYS: dict[str, str] = {}  # recent short thread ids (exactly str) -> their keys
KEYS_MAX = 4096


def thread_key(thread_id: str) -> str:
    """The ref key of a thread: base32 of its UTF-8 bytes, so no id can leave ``refs/heads``
    (``/``, ``..``, unicode are just bytes here) and case-insensitive disks cannot mix ids up."""
    if type(thread_id) is str and len(thread_id) <= 256:
        got = _KEYS.get(thread_id)
        if got is None:
            got = _thread_key(thread_id)
            if len(_KEYS) >= KEYS_MAX:
                _KEYS.clear()
            _KEYS[thread_id] = got
        return got
    return _thread_key(thread_id)


def _thread_key(thread_id: str) -> str:
    if not isinstance(thread_id, str):
        raise InvalidArgumentError(f"thread id must be a str, not {type(thread_id).__name__}")
    try:
        raw = thread_id.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(
            f"thread id {thread_id[:80]!r} is not valid Unicode ({exc.reason} at index "
            f"{exc.start}); pass a str without lone surrogates") from None
    if not raw:
        raise InvalidArgumentError("thread id is empty; pass a non-empty string")
    if len(raw) > MAX_THREAD_ID_BYTES:
        raise InvalidArgumentError(
            f"thread id is {len(raw)} bytes in UTF-8, more than {MAX_THREAD_ID_BYTES}; use a "
            "shorter id (for instance a UUID or a hash of the long one)"
        )
    if len(raw) > SHORT_KEY_BYTES:
        return f"{HEADS}/h-{blake3.blake3(raw).hexdigest()}"
    return f"{HEADS}/" + _base32(raw)


_BASE32 = "abcdefghijklmnopqrstuvwxyz234567"


def _base32(raw: bytes) -> str:
    """``base64.b32encode(raw)``, lower case, without its ``=`` padding. (The first call of
    ``b32encode`` in a process builds a table of 1,024 pairs: ~0.1 ms of the first save or load;
    this costs ~2 us for a 20-byte id, and keys stay exactly what they were.)"""
    pad = -len(raw) % 5
    num = int.from_bytes(raw + bytes(pad), "big")
    bits = (len(raw) + pad) * 8
    chars = -(-len(raw) * 8 // 5)  # the ones b32encode writes before its padding
    return "".join([_BASE32[(num >> shift) & 31]
                    for shift in range(bits - 5, bits - 5 - 5 * chars, -5)])


def thread_from_key(key: str) -> str | None:
    """The thread id spelled in a key; None for a hashed key (its head holds the id) or a key
    that is not a thread's."""
    name = key.rsplit("/", 1)[-1].upper()
    try:
        return base64.b32decode(name + "=" * (-len(name) % 8)).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None


def is_thread_key(key: str) -> bool:
    """Whether a key under ``refs/heads`` is a thread's ref (not a lock or temp file); an
    encrypted store's are ``e-`` and a keyed hash (``sealing.py``)."""
    return is_hashed_key(key) or is_sealed_key(key) or thread_from_key(key) is not None


def is_hashed_key(key: str) -> bool:
    """Whether a key names a long thread id by ``h-`` and the id's BLAKE3 (64 hex digits)."""
    name = key.rsplit("/", 1)[-1]
    return (len(name) == 66 and name.startswith("h-")
            and all(c in "0123456789abcdef" for c in name[2:]))


def new_lineage() -> bytes:
    return secrets.token_bytes(8)


@dataclass(frozen=True, slots=True)
class Ref:
    head: Head
    version: str


Change = Callable[[Ref | None], Step[tuple[Head | None, dict[ObjectId, bytes]]]]
"""What ``RefStore.update`` applies: the current ref -> the new head and its new objects."""


HEAD_ROOM = 64 * 1024  # what a sealed (encrypted) ref adds to a head's bytes, and more


def check_size(thread_id: str, data: bytes) -> None:
    """Refuse to write a head that readers would refuse for its size (``MAX_HEAD_BYTES``, less
    room for sealing). The bounds on what a save records keep a head far below it: this is the
    last guard, whatever the inputs, before a ref no process could read is written."""
    if len(data) > MAX_HEAD_BYTES - HEAD_ROOM:
        raise InvalidArgumentError(
            f"thread {thread_id[:80]!r}: its new head would be {len(data)} bytes, more than a "
            f"reader accepts ({MAX_HEAD_BYTES - HEAD_ROOM}); nothing was saved. Keep labels, "
            "tags and metadata small (put large values in the state)")


_BUILT: dict[ObjectId, Segment] = {}  # segments this process encoded, by id (``segment``)
BUILT_MAX = 256


def segment(oid: ObjectId, data: bytes | memoryview) -> Segment:
    """The segment ``oid`` of ``data``, bytes read and hashed against ``oid`` (a view's
    ``get``): not decoded again when this process made it (``append``), since bytes of that
    id are the bytes it encoded; any other is decoded and checked (``Segment.decode``)."""
    got = _BUILT.get(oid)
    return got if got is not None else Segment.decode(data)


def _built(seg: Segment) -> tuple[ObjectId, bytes]:
    data = seg.encode()
    oid = object_id(data)
    if len(_BUILT) >= BUILT_MAX:
        _BUILT.clear()
    _BUILT[oid] = seg
    return oid, data


def append(head: Head, entry: LogEntry, new: dict[ObjectId, bytes]) -> Head:
    """``head`` with ``entry`` appended and made the head; new segments are added to ``new``."""
    tail = head.tail + (entry,)
    peaks = head.peaks
    if len(tail) >= LEAF:
        oid, data = _built(Segment(0, entries=tail))
        new[oid] = data
        peaks += (Peak(oid, 0, len(tail)),)
        tail = ()
        while len(peaks) >= FANOUT and len({p.level for p in peaks[-FANOUT:]}) == 1:
            group = peaks[-FANOUT:]
            oid, data = _built(Segment(group[0].level + 1, children=tuple(p.id for p in group)))
            new[oid] = data
            peaks = peaks[:-FANOUT] + (Peak(oid, group[0].level + 1,
                                            sum(p.count for p in group)),)
    return Head(head.thread_id, entry.id, entry.step, peaks, tail, head.packs, head.inline,
                head.lineage, head.archive, head.held)


def build(base: Head, entries: list[LogEntry], head_id: CheckpointId | None,
          new: dict[ObjectId, bytes]) -> Head:
    """A head holding exactly ``entries`` (in order), with ``head_id`` as its head, and the
    thread id, packs, inline objects, lineage, archive and held packs of ``base``."""
    head = Head(base.thread_id, None)
    for entry in entries:
        head = append(head, entry, new)
    step = next((e.step for e in entries if e.id == head_id), -1)
    return Head(base.thread_id, head_id if step >= 0 else None, step, head.peaks, head.tail,
                base.packs, base.inline, base.lineage, base.archive, base.held)


def _same(a: Ref | None, b: Ref | None) -> bool:
    """Whether two reads of a ref found the same ref (the same version of it)."""
    return a is b or (a is not None and b is not None and a.version == b.version)


class RefStore:
    """Reads and compare-and-swaps thread refs. Methods that touch storage are steps
    (``steps.py``): generators a sync or an async driver carries out."""

    def __init__(self, backend: Backend, objects: ObjectStore,
                 inline_max: int = staging.INLINE_MAX) -> None:
        self.backend = backend
        self.objects = objects
        self.inline_max = inline_max
        # seconds after which a writer deletes the packs its commits stopped naming (None:
        # never, gc does); collect.py
        self.collect_after: float | None = collect.GRACE
        # ... or sooner: after this many later commits of the thread (None: by time only)
        self.collect_commits: int | None = collect.COMMITS
        self.collector = collect.Collector()
        self._decoded: dict[str, tuple[bytes, Head]] = {}  # per ref key: last bytes and head

    def decode(self, thread_id: str, key: str, got: tuple[bytes, str] | None) -> Ref | None:
        """The ref read as ``got`` (bytes, version), checked."""
        if got is None:
            return None
        last = self._decoded.get(key)
        shared = self.objects.shared
        if last is not None and last[0] == got[0]:  # the same bytes: the same (checked) head
            head = last[1]
        elif shared is not None and (seen := shared.head(key, got[0])) is not None:
            head = seen  # decoded (and checked) from the same bytes by another store object
            if len(self._decoded) > 1024:
                self._decoded.clear()
            self._decoded[key] = (got[0], head)
        else:
            try:
                head = Head.decode(got[0], key)
            except FormatError as exc:
                raise FormatError(f"the ref {key} of thread {thread_id[:200]!r} is damaged: "
                                  f"{exc} (run `cas-checkpoint verify`)") from None
            if shared is not None:
                shared.keep_head(key, got[0], head)
            if len(self._decoded) > 1024:
                self._decoded.clear()
            self._decoded[key] = (got[0], head)
        if head.thread_id != thread_id:
            raise FormatError(
                f"ref {key} belongs to thread {head.thread_id!r}, not {thread_id!r}: the ref "
                "was copied or tampered with; run `cas-checkpoint verify`"
            )
        return Ref(head, got[1])

    def stored_key(self, thread_id: str) -> str:
        """The key a thread's ref is stored under (an encrypted store hides the id)."""
        key = thread_key(thread_id)
        return self.backend.ref_key(key) if isinstance(self.backend, SealedBackend) else key

    def read(self, thread_id: str) -> Step[Ref | None]:
        key = thread_key(thread_id)
        got = yield ReadRef(key)
        return self.decode(thread_id, key, got)

    def threads(self) -> Step[list[str]]:
        return sorted((yield from self.threads_in((yield List(HEADS)))))

    def threads_in(self, listed: list[ObjectInfo]) -> Step[list[str]]:
        """The threads of these listed refs (a page of ``refs/heads``), unsorted; a long or
        sealed id is read from its ref."""
        out = []
        hashed = []
        for info in listed:
            if not info.regular:
                log.warning("%s in %s is not a regular file: skipped (run `cas-checkpoint "
                            "verify`)", info.key, self.backend.url)
                continue
            if is_hashed_key(info.key) or is_sealed_key(info.key):  # its head holds the id
                hashed.append(info.key)
                continue
            thread = thread_from_key(info.key)
            if thread is not None and info.key == thread_key(thread):
                out.append(thread)
        if hashed:
            try:
                got = yield ReadRefs(hashed)
            except (FormatError, IntegrityError, StorageError):
                got = []  # one of them is bad (a broken seal, too): read one by one to name it
                for key in hashed:
                    try:
                        got.append((yield ReadRef(key)))
                    except (FormatError, IntegrityError, StorageError) as exc:
                        log.warning("%s in %s cannot be read, its thread is not listed: %s "
                                    "(run `cas-checkpoint verify`)", key, self.backend.url, exc)
                        got.append(None)
            for key, one in zip(hashed, got, strict=True):
                try:
                    long_id = None if one is None else Head.decode(one[0], key).thread_id
                except (FormatError, IntegrityError) as exc:
                    log.warning("%s in %s is damaged, its thread is not listed: %s (run "
                                "`cas-checkpoint verify`)", key, self.backend.url, exc)
                    continue
                if long_id is not None and key == self.stored_key(long_id):
                    out.append(long_id)
        return out

    def view(self, head: Head, recent: bool = False, newest: bool = False
             ) -> Step[View | None]:
        """The view a head's log needs (None when all of it is in the head); ``recent``,
        ``newest``: ``ObjectStore.view``'s."""
        if not head.peaks:
            return None
        view: View = yield from self.objects.view(head, recent, newest)
        return view

    def iter_newest_first(self, head: Head, view: View | None) -> Iterator[LogEntry]:
        """Entries newest first, decoding segments lazily (one peak tree at a time) from
        ``view`` (from ``view(head)``)."""
        yield from self.iter_tail(head)
        if head.peaks:
            assert view is not None, "a head with log segments needs its view"
            yield from self.iter_segments(head, view)

    @staticmethod
    def iter_tail(head: Head) -> Iterator[LogEntry]:
        """The entries of ``head``'s tail (the newest, in the head itself), newest first."""
        return reversed(head.tail)

    def iter_segments(self, head: Head, view: View) -> Iterator[LogEntry]:
        """The entries of ``head``'s log segments (all but its tail), newest first: what
        ``iter_newest_first`` yields after the tail."""
        seen: set[ObjectId] = set()
        for peak in reversed(head.peaks):
            yield from self._tree_newest_first(peak.id, view, seen)

    @staticmethod
    def _tree_newest_first(root: ObjectId, view: View, seen: set[ObjectId]
                           ) -> Iterator[LogEntry]:
        """The entries of a segment tree, newest first, read as they are reached: the newest
        k entries cost the segments on one path down the tree and ~k/LEAF leaves, not the
        whole tree (a reader that stops early reads what it needs). Iterative: a hostile
        tree cannot recurse; a segment that does not descend in level, or is named twice
        (``seen``), is a FormatError."""
        stack: list[tuple[Iterator[ObjectId], int]] = [(iter((root,)), 64)]
        while stack:
            children, above = stack[-1]
            oid = next(children, None)
            if oid is None:
                stack.pop()
                continue
            if oid in seen:
                raise FormatError(f"log segment {oid} is named twice; the thread's log is "
                                  "corrupt (run `cas-checkpoint verify`)")
            seen.add(oid)
            seg = segment(oid, view.get_view(oid))
            if seg.level >= above:
                raise FormatError(f"log segment {oid} does not descend in level; the thread's "
                                  "log is corrupt (run `cas-checkpoint verify`)")
            if seg.level == 0:
                yield from reversed(seg.entries)
            else:
                stack.append((reversed(seg.children), seg.level))

    def newest_first(self, head: Head, recent: bool = False, newest: bool = False
                     ) -> Step[Iterator[LogEntry]]:
        """The entries of ``head``'s log, newest first, read as they are reached (``recent``,
        ``newest``: from some of the head's packs, ``view``'s; reading past them raises
        ``InArchive``)."""
        view = yield from self.view(head, recent, newest)
        return self.iter_newest_first(head, view)

    def missing(self, head: Head, new: dict[ObjectId, bytes]) -> Step[dict[ObjectId, bytes]]:
        """The objects of ``new`` that ``head`` does not hold yet (a rebuilt log repeats most
        of its segments)."""
        if not new:
            return new
        view: View = yield from self.objects.view(head, recent=True)  # (what a long thread's
        have = view.frozen_ids()  # archive holds too is written again: a copy does no harm)
        return {k: v for k, v in new.items() if k not in have}

    def rebuilt(self, base: Head, entries: list[LogEntry], head_id: CheckpointId | None
                ) -> Step[tuple[Head, dict[ObjectId, bytes]]]:
        """``build``: a head of ``base`` holding exactly ``entries``, and the segments of it
        that ``base`` does not hold yet (unchanged leading segments come out the same)."""
        new: dict[ObjectId, bytes] = {}
        head = build(base, entries, head_id, new)
        return head, (yield from self.missing(base, new))

    def holds(self, head: Head, entry: LogEntry, base: CheckpointId | None = None
              ) -> Step[bool]:
        """Whether the log of ``head`` has ``entry``: read newest first, stopping at the entry's
        parent or at ``base``, the head the entry was appended to (it would come before
        either). Without them (an entry with no parents, on a new thread) the whole log is
        read. (The head's own packs first: a long thread's archive only if they end first.)"""
        for recent in (True, False):
            view = yield from self.view(head, recent)
            try:
                for seen in self.iter_newest_first(head, view):
                    if seen.id == entry.id:
                        return True
                    if seen.id == base or seen.id in entry.parents:
                        return False
            except InArchive:
                continue
            return False
        return False

    def entries(self, head: Head) -> Step[list[LogEntry]]:
        """Every entry, oldest first."""
        if not head.peaks:
            return list(head.tail)
        view: View = yield from self.objects.view(head)
        return self.log_entries(head, view)

    def log_entries(self, head: Head, view: View | None) -> list[LogEntry]:
        """Every entry, oldest first, from a view of the head."""
        if not head.peaks:
            return list(head.tail)
        assert view is not None
        return self._read_trees([p.id for p in head.peaks], view) + list(head.tail)

    def _read_trees(self, roots: list[ObjectId], view: View) -> list[LogEntry]:
        segs: dict[ObjectId, Segment] = {}
        pending = list(dict.fromkeys(roots))
        while pending:
            got = view.get_many(pending)
            children: list[ObjectId] = []
            for oid in pending:
                segs[oid] = seg = segment(oid, got[oid])
                children.extend(seg.children)
            pending = [c for c in dict.fromkeys(children) if c not in segs]

        seen: set[ObjectId] = set()  # a segment named twice is hostile (and would explode)

        def flatten(oid: ObjectId, depth: int) -> Iterator[LogEntry]:
            seg = segs[oid]
            if seg.level >= depth or oid in seen:
                raise FormatError(f"log segment {oid} does not descend in level or is named "
                                  "twice; the thread's log is corrupt")
            seen.add(oid)
            if seg.level == 0:
                yield from seg.entries
            for child in seg.children:
                yield from flatten(child, seg.level)

        return [e for root in roots for e in flatten(root, 64)]

    def update(
        self,
        thread_id: str,
        change: Change,
        *,
        expected_head: CheckpointId | None | Unset = UNSET,
        current: Ref | None | Unset = UNSET,
        done: Callable[[Ref], Step[bool]] | None = None,
        collect: bool = True,
    ) -> Step[Ref | None]:
        """Compare-and-swap loop. ``change`` maps the current ref to a new head (None deletes
        the ref) and the new segments it needs (a step: it may read); it is run again after a
        lost race. With ``expected_head``, a head that is not the expected one raises
        ConflictError. ``current`` is a ref the caller believes current (it may be stale: it is
        only a guess that saves a read). ``done(ref)``, asked after a lost race, says whether
        ``ref`` already holds the change (our write landed, its reply was lost, and another
        writer built on it): then the change is not applied twice. A change (or its staging)
        that finds missing what ``ref`` names is done again on the ref read anew when the ref
        moved meanwhile (a repack and a gc since: nothing is damaged), and raises only when the
        ref as it is now names it. The new objects go inline
        into the head or into packs (``packing.stage``), written before the ref that names
        them. ``collect=False``: this commit deletes none of the packs earlier commits stopped
        naming (gc's repack: gc deletes what no ref names, and its dry run predicts that only
        while nothing else deletes meanwhile). Returns the ref written (or the one found
        holding the change), or None when it was deleted."""
        key = thread_key(thread_id)
        fresh = current is UNSET
        ref = (yield from self.read(thread_id)) if current is UNSET else current
        for attempt in range(RETRIES):
            actual = ref.head.head if ref else None
            if expected_head is not UNSET and actual != expected_head:
                if not fresh:
                    ref, fresh = (yield from self.read(thread_id)), True
                    continue
                raise ConflictError(thread_id, expected_head, actual)
            packs: dict[ObjectId, bytes] = {}
            contents: dict[ObjectId, tuple[ObjectId, ...]] = {}
            opened: dict[ObjectId, bytes] = {}
            try:
                new_head, new_objects = yield from change(ref)
                if new_head is not None:
                    new_head, packs = yield from self._stage(new_head, new_objects, contents,
                                                             opened)
            except NotFoundError:
                # Something ``ref`` names is gone (a pack a merge or a repack replaced, which a
                # gc then deleted)? Only the ref as it is now can say the thread is damaged:
                # read it again, and redo the change on it when it moved.
                latest = yield from self.read(thread_id)
                if _same(latest, ref):
                    raise
                log.debug("ref %s moved while a change read what it named (attempt %d); "
                          "redoing it", key, attempt + 1)
                ref, fresh = latest, True
                continue
            yield from self.objects.put_packs(packs, contents, opened)  # before the ref naming
            del opened  # them
            try:
                if new_head is None:
                    if ref is not None:
                        yield DeleteRef(key, ref.version)
                    return None
                data = new_head.encode()
                check_size(thread_id, data)
                refresh = (partial(self.objects.put_packs_now, packs) if packs else None)
                version = yield WriteRef(key, data, ref.version if ref else None, refresh)
                if len(self._decoded) > 1024:
                    self._decoded.clear()
                self._decoded[key] = (data, new_head)  # a read of what we wrote: not decoded
                self.objects.cache.own(new_head)  # (what it replaced is let go of)
                if self.objects.shared is not None:  # nor by other objects of this store
                    self.objects.shared.keep_head(key, data, new_head)
                self.collector.committed(ref.head if ref else None, new_head,
                                         self.collect_after)
                ripe = self.collector.ripe(self.collect_after, thread_id,
                                             self.collect_commits) if collect else []
                if ripe:  # packs commits stopped naming a grace period ago: collect.py
                    yield from self._delete_packs(ripe)
                return Ref(new_head, version)
            except RefMismatch:
                log.debug("ref %s moved under us (attempt %d); re-reading", key, attempt + 1)
                if attempt:
                    yield Sleep(random.uniform(0, min(RACE_WAIT, 0.002 * 2 ** min(attempt, 8))))
                ref, fresh = (yield from self.read(thread_id)), True
                if done is not None and ref is not None and (yield from done(ref)):
                    log.debug("ref %s already holds our change (a lost reply)", key)
                    return ref
        raise StorageError(
            f"thread {thread_id!r}: gave up after {RETRIES} lost compare-and-swap races; too many "
            "writers on one thread at once. Retry later or spread the writers over threads."
        )

    def _delete_packs(self, pids: list[ObjectId]) -> Step[None]:
        """Delete packs no head of this thread names (its merges' parts); a failure leaves
        them to gc."""
        try:
            yield DeleteMany([pack_key(p) for p in pids], after=True)  # (after the ref:
            # its caller need not wait for it; steps.Op.after)
        except CasError as exc:
            log.warning("could not delete %d replaced packs (gc will): %s", len(pids), exc)
        self.objects.forget(pids)

    def hold(self, thread_id: str) -> Step[Ref]:
        """The thread's ref, its packs marked held (a fork, a copy or an import is about to
        name them too: its writers never delete them; collect.py)."""
        def missing() -> NotFoundError:
            return NotFoundError(f"thread {thread_id!r} does not exist; threads() lists the "
                                 "threads there are")

        ref = yield from self.read(thread_id)
        if ref is None or ref.head.head is None:
            raise missing()
        if named(ref.head) <= ref.head.held:
            return ref

        def change(cur: Ref | None) -> Step[tuple[Head | None, dict[ObjectId, bytes]]]:
            if cur is None or cur.head.head is None:
                raise missing()
            return replace(cur.head, held=cur.head.held | named(cur.head)), {}
            yield  # pragma: no cover - a step

        got = yield from self.update(thread_id, change, current=ref)
        assert got is not None
        return got

    def _stage(self, head: Head, new: dict[ObjectId, bytes],
               contents: dict[ObjectId, tuple[ObjectId, ...]] | None = None,
               opened: dict[ObjectId, bytes] | None = None
               ) -> Step[tuple[Head, dict[ObjectId, bytes]]]:
        """``packing.stage``, reading the packs a merge needs (those not cached) first."""
        fetched: dict[str, Pack] = {}
        compressor = yield from self.objects.settle()  # the store's settings, read once
        while True:
            try:  # (an encrypted store's compressor seals too: packfile.Sealing)
                return staging.stage(head, new, partial(self.objects.cached_objects, fetched),
                                     self.inline_max, compressor, contents=contents,
                                     opened=opened)
            except NeedPacks as need:
                got = yield from self.objects.packs(need.ids)
                fetched.update(got)
