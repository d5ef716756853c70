"""Garbage collection, safe while agents write.
Rule: gc deletes only packs no ref names and whose storage mtime is older than the grace; it
never deletes refs. A long thread's head names its archive's pack, which lists the
others (engine/archive.py): marking reads those archives too."""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any

from cas_checkpoint.backends import Backend, ObjectInfo
from cas_checkpoint.backends.sealed import unwrap
from cas_checkpoint.engine import archive
from cas_checkpoint.engine.object_store import PREFIX, key_pack_id, pack_key, parse_pack
from cas_checkpoint.engine.refs import HEADS, is_thread_key
from cas_checkpoint.engine.retention import (
    PruneReport as PruneReport,  # re-exported: callers look in gc
)
from cas_checkpoint.engine.retention import ThreadPrune as ThreadPrune
from cas_checkpoint.engine.retention import check_policy as check_policy
from cas_checkpoint.engine.retention import prune as prune
from cas_checkpoint.engine.retention import prune_due as prune_due
from cas_checkpoint.engine.retention import pruned_head as pruned_head
from cas_checkpoint.engine.retention import save_slack as save_slack
from cas_checkpoint.engine.steps import (
    Blocking,
    DeleteMany,
    GetMany,
    List,
    ListMany,
    PutMany,
    ReadRefs,
    Step,
    run,
)
from cas_checkpoint.errors import CasError, InvalidArgumentError, NotFoundError, StorageError
from cas_checkpoint.format.heads import Head
from cas_checkpoint.format.objects import ObjectId
from cas_checkpoint.humanize import plural
from cas_checkpoint.maintenance import ref_summary
from cas_checkpoint.maintenance.repack import RepackReport
from cas_checkpoint.maintenance.verify_checks import key_thread, read_each

log = logging.getLogger("cas_checkpoint")

GCProgress = Callable[[str, int, int], None]
"""``progress(phase, done, total)``; phase is ``"mark"``, ``"list"`` or ``"sweep"``."""

PREFIXES = [f"{PREFIX}/{i:02x}" for i in range(256)]
DELETE_BATCH = 1000  # S3 DeleteObjects takes up to 1,000 keys
REF_ROUNDS = 4  # re-reads of the refs after listing, until no ref changed
MIN_S3_GRACE = 1.0  # S3 LastModified has a resolution of one second


# --- garbage collection ------------------------------------------------------------------------
# ``collect`` is a step (``steps.py``): it yields its storage requests; the parts that must be
# atomic on one kind of storage (local disk's trash sweep, memory://'s check-and-delete under
# the writers' lock) run whole inside a ``Blocking`` request.



@dataclass(slots=True)
class GCReport:
    """What a gc run found and did. ``requests`` counts storage requests by kind (on S3 these
    are HTTP requests: ``list`` pages of up to 1,000 keys, ``get``, ``put``, ``delete``
    batches of up to 1,000 keys; on local disk and memory:// they are the matching calls)."""

    url: str
    dry_run: bool
    grace_seconds: float
    storage_now: float = 0.0  # t0, by the storage's clock (seconds since the epoch)
    threads: int = 0
    scanned_objects: int = 0
    scanned_bytes: int = 0
    reachable_objects: int = 0  # kept: a ref reaches them
    reachable_bytes: int = 0
    young_objects: int = 0  # kept: unreachable but modified within the grace period
    young_bytes: int = 0
    deleted_objects: int = 0  # (with dry_run: would be deleted)
    deleted_bytes: int = 0
    refreshed_objects: int = 0  # candidates a writer reused during the sweep: kept
    temp_files: int = 0  # local disk: temp files of writers that died, older than the grace
    ref_rounds: int = 0  # times the refs were listed (1 + re-reads after listing)
    refs_read: int = 0  # refs read (the others: as the last run's summary recorded them)
    # the last run's summary: "used", "none" (missing: every ref read), "rebuilt" (damaged or
    # wrong: ignored, every ref read), "marks" (a sharded run's marks stood in: gc_marks.py)
    summary: str = "none"
    seconds: float = 0.0
    requests: dict[str, int] = field(default_factory=lambda: {
        "list": 0, "get": 0, "put": 0, "delete": 0})
    deleted: list[ObjectId] = field(default_factory=list)
    repack: RepackReport | None = None  # gc(repack=True): what its repack did (or would do)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name not in ("deleted", "repack")}
        out["requests"] = dict(self.requests)
        if self.repack is not None:
            out["repacked_threads"] = sum(t.new_pack is not None for t in self.repack.threads)
            out["repack_freed_bytes"] = self.repack.freed_bytes
        return out

    def to_text(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        return (
            f"gc {self.url}: scanned {plural(self.scanned_objects, 'object')} "
            f"({_mb(self.scanned_bytes)}) in {plural(self.threads, 'thread')}; kept "
            f"{self.reachable_objects} reachable "
            f"({_mb(self.reachable_bytes)}) and {self.young_objects} younger than the "
            f"{self.grace_seconds:g} s grace ({_mb(self.young_bytes)}); {verb} "
            f"{self.deleted_objects} ({_mb(self.deleted_bytes)}); {self.refreshed_objects} "
            f"reused by writers meanwhile; {verb} {plural(self.temp_files, 'stale temp file')}; "
            f"{self.seconds:.2f} s; requests "
            + ", ".join(f"{k} {v}" for k, v in self.requests.items())
        )


def _unreadable(key: str | None, exc: CasError) -> CasError:
    """``exc`` (its kind kept), saying that gc stopped, whose ref, and the way forward."""
    thread = key_thread(key) if key is not None else ()
    arg = repr(thread[0]) if thread else (key or "THREAD")
    exc.args = (f"gc stopped before deleting anything: the ref of thread "
                f"{arg if thread else '(ref ' + str(key) + ')'} cannot be read, and its "
                f"checkpoints would be lost ({exc}). Run `cas-checkpoint verify STORE` to see "
                f"what it holds, then `cas-checkpoint repair-ref STORE {arg} --use-slot N` "
                f"(local disk: keep a whole slot) or `cas-checkpoint repair-ref STORE {arg} "
                "--remove` (drop the ref; its objects go at the next gc), and run gc again",)
    return exc


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _chunks(items: list[Any], n: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


class _Collector:
    def __init__(self, backend: Backend, report: GCReport, progress: GCProgress | None,
                 repacked: RepackReport | None = None) -> None:
        self.backend = backend
        self.report = report
        self.req = report.requests
        self.progress = progress or (lambda phase, done, total: None)
        self.marked: set[str] = set()
        self.versions: dict[str, str] = {}  # ref key -> the version its read returned
        # ref key -> what it names, as a summary of this run records it; the refs of the last
        # listing; the last run's summary (None: read every ref)
        self.entries: dict[str, ref_summary.Entry] = {}
        self.listed: dict[str, ObjectInfo] = {}
        self.summary: ref_summary.Summary | None = None
        self.trusted: dict[str, ref_summary.Entry] = {}  # the entries used instead of a read
        # a dry run after a dry-run repack: thread -> (the packs its head names, the new packs
        # that a run would name instead); and the new packs marked so far (id -> size)
        self.swaps = {t.thread_id: (frozenset(t.old_packs), t.new_packs) for t in (
            repacked.threads if repacked is not None else ()) if t.new_pack is not None}
        self.new_packs: dict[str, int] = {}
        # archive pack id -> the packs it lists (read once a run); long threads' refs read
        # whose archive is not read yet: key -> (listing, head)
        self.archives: dict[str, frozenset[str]] = {}
        self.pending: dict[str, tuple[ObjectInfo, Head]] = {}

    def names(self, head: Head) -> frozenset[str]:
        """Every pack ``head`` names: its own, and a long thread's archive pack and the packs
        that lists (read by ``read_archives``)."""
        names: frozenset[str] = frozenset(p.id for p in head.packs)
        if head.archive is not None:
            names = names | {head.archive.id} | self.archives[head.archive.id]
        return names

    # marking: a ref reaches exactly the packs its head names (and its inline objects, which
    # live in the ref itself), so marking reads the refs and nothing else

    def read_refs(self) -> Step[dict[str, Head]]:
        """Every ref whose version changed since this run last read it (the first time: every
        ref the summary of the last run cannot stand in for; see ``ref_summary.py``). Refs
        the summary stands in for are marked here and not returned."""
        listed: list[ObjectInfo] = yield List(HEADS)  # a listing error propagates: never "no refs"
        odd = [i.key for i in listed if not i.regular or (
            not is_thread_key(i.key) and i.key.count("/") == 2 and ".tmp-" not in i.key)]
        if odd:
            raise StorageError(
                f"gc stopped before deleting anything: {len(odd)} entries under {HEADS} in "
                f"{self.backend.url} are not refs gc can read ({', '.join(odd[:3])}); a thread "
                "whose ref cannot be read would lose its checkpoints. Run `cas-checkpoint "
                "verify`, then move those entries away")
        infos = [i for i in listed if is_thread_key(i.key)]
        self.req["list"] += 1 + len(infos) // 1000
        first = not self.listed
        self.listed = {i.key: i for i in infos}
        summary, self.summary = self.summary, None  # (the first round only)
        todo: list[ObjectInfo] = []
        trusted: dict[str, ref_summary.Entry] = {}
        # (S3's ETag is the content's: a version of times, local disk's, is not trusted for a
        # ref written in the clock tick of the run's start, RACY; see ref_summary.py)
        racy = 0.0 if self.backend.ref_version_listed else ref_summary.RACY
        for info in infos:
            seen = self.entries.get(info.key)
            if (seen is not None and not first and info.version
                    and seen.version == info.version and seen.mtime == info.mtime
                    and (not racy or info.mtime < self.report.storage_now - racy)):
                continue  # as this run saw it, and not written in the same clock tick
            entry = summary.trusted(info, racy) if summary is not None else None
            if entry is not None:
                trusted[info.key] = entry
            else:
                todo.append(info)
        heads = yield from self._read(todo)
        for key, entry in trusted.items():
            self.entries[key] = entry
            self.marked.update(entry.packs)
        self.trusted.update(trusted)
        if summary is not None:
            self.report.summary = "used"
        self.report.threads = len(self.listed)
        self.report.ref_rounds += 1
        return heads

    def _read(self, todo: list[ObjectInfo]) -> Step[dict[str, Head]]:
        """Read these refs: the heads of those that changed since this run last read them."""
        keys = [i.key for i in todo]
        self.req["get"] += len(keys)
        self.report.refs_read += len(keys)
        try:
            got: list[tuple[bytes, str] | None] = (yield ReadRefs(keys)) if keys else []
        except CasError as exc:
            each = yield from read_each(keys)  # which one(s): each on its own
            raise _unreadable(next((k for k, g in zip(keys, each, strict=True)
                                    if isinstance(g, CasError)), None), exc) from None
        changed: dict[str, Head] = {}
        for info, ref in zip(todo, got, strict=True):
            key = info.key
            if ref is None:  # deleted since it was listed
                self.entries.pop(key, None)
                continue
            try:
                head = Head.decode(ref[0], key)
            except CasError as exc:
                raise _unreadable(key, exc) from None
            # The listing came before the read, so the entry may name newer packs than the
            # version listed; a ref written since shows another version next run (local disk:
            # a newer change time; S3: the ETag, which must then be the one read, as a ref
            # written back to bytes listed before would show the old ETag again)
            self.pending.pop(key, None)
            if self.backend.ref_version_listed and ref[1] != info.version:
                self.entries.pop(key, None)
            elif head.archive is not None and head.archive.id not in self.archives:
                # a long thread names packs through its archive too: its entry waits for the
                # archive's list (mark_heads reads it); until then the summary cannot stand in
                self.entries.pop(key, None)
                self.pending[key] = (info, head)
            else:
                self.entries[key] = ref_summary.Entry(info.version, info.mtime,
                                                      self.names(head))
            if self.versions.get(key) != ref[1]:
                self.versions[key] = ref[1]
                changed[key] = head
        return changed

    def audit(self, candidates: list[ObjectInfo]) -> Step[list[ObjectInfo]]:
        """Before deleting what the summary let through: re-read a random sample of the refs it
        stood in for; one it is wrong about and every such ref is read. A run with nothing to
        delete needs no audit (a wrong entry can only make gc delete). The candidates still
        unreachable are returned."""
        trusted = {k: e for k, e in self.trusted.items() if k in self.listed}
        if not candidates or not trusted:
            return candidates
        sample = ref_summary.audit_sample(sorted(trusted))
        heads = yield from self._read([self.listed[k] for k in sample])
        yield from self.mark_heads(heads)
        wrong = [k for k in sample if k in self.entries and k in heads
                 and self.names(heads[k]) != trusted[k].packs]
        if wrong:
            log.warning("gc: the summary of the last run is wrong about %s: it is ignored and "
                        "every ref is read", wrong[0])
            self.report.summary = "rebuilt"
            rest = [self.listed[k] for k in sorted(set(trusted) - set(sample))]
            yield from self.mark_heads((yield from self._read(rest)))
            self.trusted.clear()
        return [i for i in candidates if key_pack_id(i.key) not in self.marked]

    def mark_heads(self, heads: dict[str, Head]) -> Step[None]:
        yield from self.read_archives([h for h in heads.values() if h.archive])
        for key, (info, head) in list(self.pending.items()):  # their archives are read now
            if head.archive is not None and head.archive.id in self.archives:
                del self.pending[key]
                self.entries[key] = ref_summary.Entry(info.version, info.mtime,
                                                      self.names(head))
        for head in heads.values():
            names = self.names(head)  # (a long thread's: its archive and the packs it lists)
            swap = self.swaps.get(head.thread_id)
            if swap is not None and swap[0] == names:  # (a head that moved since: as it is)
                for pack in swap[1]:
                    self.marked.add(pack.id)
                    self.new_packs[pack.id] = pack.size
            else:
                self.marked.update(names)
        self.progress("mark", len(heads), len(heads))

    def read_archives(self, heads: list[Head]) -> Step[dict[str, frozenset[str]]]:
        """The packs each archive of ``heads`` lists (archive.py; into ``self.archives``), those
        not read yet in one round. One that cannot be read stops gc before it deletes anything:
        what it lists is not known."""
        ids = list(dict.fromkeys(h.archive.id for h in heads if h.archive is not None
                                 and h.archive.id not in self.archives))
        if not ids:
            return {}
        self.req["get"] += len(ids)
        got = yield GetMany([pack_key(i) for i in ids])
        out: dict[str, frozenset[str]] = {}
        for aid in ids:
            try:
                data = got[pack_key(aid)]
                if data is None:
                    raise NotFoundError(f"{pack_key(aid)} is missing")
                listed = archive.of_pack(parse_pack(aid, data).objects)
            except CasError as exc:
                raise StorageError(
                    f"gc stopped before deleting anything: the archive {pack_key(aid)} of a "
                    f"long thread cannot be read ({exc}), so the packs it names are not "
                    f"known. Run `cas-checkpoint verify`, and restore or remove that thread"
                    ) from None
            out[aid] = self.archives[aid] = frozenset(p.id for p in listed)
        return out

    # listing

    def list_objects(self) -> Step[list[tuple[ObjectId, ObjectInfo]]]:
        infos: list[ObjectInfo] = yield ListMany(PREFIXES)
        per_prefix: dict[str, int] = {}
        out = []
        for info in infos:
            oid = key_pack_id(info.key)
            if oid is not None:
                out.append((oid, info))
                per_prefix[oid[:2]] = per_prefix.get(oid[:2], 0) + 1
        # S3: one request when under 1,000 objects, else one paginator per prefix
        self.req["list"] += 1 if len(out) < 1000 else 1 + sum(
            max(1, math.ceil(per_prefix.get(p[-2:], 0) / 1000)) for p in PREFIXES)
        self.progress("list", len(out), len(out))
        return out


def storage_now(backend: Backend, requests: dict[str, int] | None = None) -> Step[float]:
    """The storage's clock: the modified time of a tiny probe written under ``gc/``. When the
    probe cannot be written (a full disk, say: the moment gc is most needed), the newest modified
    time of anything in the store: an earlier "now" only makes gc keep more."""
    key = f"gc/probe-{secrets.token_hex(8)}"
    try:
        yield PutMany({key: b"gc clock probe\n"})
    except StorageError as exc:
        infos: list[ObjectInfo] = [*(yield List(HEADS)), *(yield List(PREFIX))]
        if requests is not None:
            requests["list"] += 2
        if not infos:
            raise StorageError(f"gc cannot write its clock probe {key} on {backend.url} "
                               f"({exc}) and the store holds nothing to date by; free some "
                               "space or fix the permissions, then run gc again") from exc
        return max(i.mtime for i in infos)
    try:
        listed: list[ObjectInfo] = yield List("gc")
    except Exception:
        yield DeleteMany([key])  # (not on GeneratorExit: a step closed early yields nothing)
        raise
    yield DeleteMany([key])
    found = [i.mtime for i in listed if i.key == key]
    if requests is not None:
        for kind in ("put", "list", "delete"):
            requests[kind] += 1
    if not found:
        raise StorageError(f"cannot read the modified time of {key} on {backend.url}: the "
                           "storage did not list it; check that the store is writable")
    return found[0]


def check_grace(backend: Backend, grace: object, force: object) -> float:
    """``grace`` in seconds, checked against the storage's safety rules (before any change)."""
    if not isinstance(grace, timedelta) or grace < timedelta(0):
        raise InvalidArgumentError(f"grace must be a non-negative timedelta (--grace AGE on the "
                                   f"command line), not {grace!r}")
    if not isinstance(force, bool):
        raise InvalidArgumentError(f"force must be True or False, not {force!r}")
    g = grace.total_seconds()
    backend = unwrap(backend)
    if not backend.exact_mtimes and g < MIN_S3_GRACE and not force:
        raise InvalidArgumentError(
            f"grace={g:g} s is below the 1-second resolution of modified times on {backend.url}, "
            "so gc could delete an object a writer is about to commit; use a grace of at least "
            "1 second (grace=timedelta(seconds=1), --grace 1s; the default is 1 hour), or pass "
            "force=True (--force) if no writer is active. Nothing was changed")
    return g


def collect(backend: Backend, *, grace: timedelta, dry_run: bool = False,
            progress: GCProgress | None = None, force: bool = False,
            repacked: RepackReport | None = None,
            marks: ref_summary.Marks | None = None) -> Step[GCReport]:
    """Delete unreachable objects older than ``grace`` (see the module docstring): a step for
    ``ops.run(step, backend)`` or ``await ops.arun(step, backend)``; the arguments are checked
    now, before any I/O. ``progress`` is called from the step (on the event loop's thread
    under ``arun``). A dry run given the report of a dry-run ``repack`` just before counts as
    if that repack had been done: each thread it would repack names its new pack instead of
    its old ones (the run's numbers, predicted)."""
    g = check_grace(backend, grace, force)
    inner = unwrap(backend)  # an encrypted store's storage: its refs still read sealed
    # (no summary for an encrypted store: it would show which packs each hidden ref names)
    return _collect(inner, g, dry_run, progress, repacked if dry_run else None,
                    summary=inner is backend, marks=marks)


def _collect(backend: Backend, g: float, dry_run: bool, progress: GCProgress | None,
             repacked: RepackReport | None = None, *, summary: bool = True,
             marks: ref_summary.Marks | None = None) -> Step[GCReport]:
    started = time.perf_counter()
    report = GCReport(backend.url, dry_run, g)
    c = _Collector(backend, report, progress, repacked)
    if backend.housekeeping:
        yield Blocking(backend.restore_trash)
    t0 = report.storage_now = yield from storage_now(backend, report.requests)
    summaries: list[str] = []
    c.summary = None
    if marks is not None:  # a sharded run's marks stand in for the summary (gc_marks.py)
        marks.check_age(t0, g)
        for kind, n in marks.requests.items():  # (reading the marks)
            report.requests[kind] = report.requests.get(kind, 0) + n
        c.summary = marks.summary
        summaries = [i.key for i in (yield List(ref_summary.FOLDER))]
        report.requests["list"] += 1
    elif summary and not c.swaps:  # (a dry run after a dry repack marks by thread: read all)
        c.summary, summaries = yield from ref_summary.load(report.requests)
        if summaries and c.summary is None:
            report.summary = "rebuilt"
    loaded = c.summary
    yield from c.mark_heads((yield from c.read_refs()))
    listed = yield from c.list_objects()
    for _ in range(REF_ROUNDS):
        changed = yield from c.read_refs()
        if not changed:
            break
        yield from c.mark_heads(changed)
    there = {oid for oid, _ in listed}
    listed += [(ObjectId(oid), ObjectInfo(pack_key(oid), size, t0))  # a dry repack's packs
               for oid, size in sorted(c.new_packs.items()) if oid not in there]
    cutoff = t0 - g
    candidates: list[ObjectInfo] = []
    for oid, info in listed:
        report.scanned_objects += 1
        report.scanned_bytes += info.size
        if oid in c.marked:
            report.reachable_objects += 1
            report.reachable_bytes += info.size
        elif info.mtime >= cutoff:
            report.young_objects += 1
            report.young_bytes += info.size
        else:
            candidates.append(info)
    candidates = yield from c.audit(candidates)
    if marks is not None:
        report.summary = "marks" if report.summary == "used" else report.summary
    if dry_run:
        deleted = candidates
    elif backend.atomic_delete:
        deleted = yield from sweep_atomic(backend, candidates, cutoff, c)
    else:
        deleted = yield from sweep_listed(backend, candidates, cutoff, c)
    if backend.housekeeping:
        report.temp_files = yield Blocking(backend.delete_stale_temps, (cutoff, dry_run))
    if summary and not dry_run and any(i.version for i in c.listed.values()):
        entries = {k: c.entries[k] for k in c.listed if k in c.entries}
        racy = 0.0 if backend.ref_version_listed else ref_summary.RACY
        if loaded is None or loaded.refs != entries or len(summaries) > 1 or (
                loaded.root is not None and loaded.root.stale) or any(
                e.mtime >= loaded.taken - racy for e in entries.values()):
            try:  # (best effort: a full disk must not fail the gc that frees it)
                yield from ref_summary.store(t0, entries, summaries, report.requests, loaded)
            except StorageError as exc:
                log.warning("gc: could not write its summary (%s): the next run reads every "
                            "ref again", exc)
        # (else the summary read stands as it is: nothing changed, no entry waits to settle)
    if marks is not None and not dry_run:
        try:  # (used: the next sharded run marks again)
            yield DeleteMany(marks.keys)
            report.requests["delete"] += 1
        except StorageError as exc:
            log.warning("gc: could not delete the marks it used (%s)", exc)
    report.refreshed_objects = len(candidates) - len(deleted)
    report.deleted_objects = len(deleted)
    report.deleted_bytes = sum(i.size for i in deleted)
    report.deleted = [ObjectId(o) for o in (key_pack_id(i.key) for i in deleted) if o]
    report.seconds = time.perf_counter() - started
    return report


# --- the final check, per storage --------------------------------------------------------------


def sweep_atomic(backend: Backend, candidates: list[ObjectInfo], cutoff: float,
                 c: _Collector) -> Step[list[ObjectInfo]]:
    """Storage that deletes atomically against writers (``Backend.atomic_delete``: local,
    memory://): ``delete_unless_touched`` a batch at a time, each one ``Blocking`` request."""
    deleted: list[ObjectInfo] = []
    for n, batch in enumerate(_chunks(candidates, DELETE_BATCH)):
        gone = yield Blocking(backend.delete_unless_touched, (batch, cutoff))
        deleted += [i for i, ok in zip(batch, gone, strict=True) if ok]
        c.req["delete"] += len(batch)
        c.progress("sweep", n * DELETE_BATCH + len(batch), len(candidates))
    return deleted


def sweep_listed(backend: Backend, candidates: list[ObjectInfo], cutoff: float,
                 c: _Collector) -> Step[list[ObjectInfo]]:
    """S3 (and any other storage): before each batch of up to 1,000 keys, list the candidates'
    prefixes again and drop every candidate whose modified time moved or that is gone; then one
    DeleteObjects. Candidates are sorted, so a batch spans few prefixes."""
    deleted: list[ObjectInfo] = []
    candidates = sorted(candidates, key=lambda i: i.key)
    for n, batch in enumerate(_chunks(candidates, DELETE_BATCH)):
        prefixes = sorted({i.key.rsplit("/", 1)[0] for i in batch})
        now = {i.key: i.mtime for i in (yield ListMany(prefixes))}
        per: dict[str, int] = {}
        for key in now:
            per[key.rsplit("/", 1)[0]] = per.get(key.rsplit("/", 1)[0], 0) + 1
        # as list_many lists them: one request for a small store, else a paginator a prefix
        c.req["list"] += 1 if len(prefixes) > 8 and len(now) < 1000 else sum(
            max(1, math.ceil(per.get(p, 0) / 1000)) for p in prefixes)
        ok = [i for i in batch if i.key in now and now[i.key] == i.mtime < cutoff]
        if ok:
            refused = set((yield DeleteMany([i.key for i in ok])))
            ok = [i for i in ok if i.key not in refused]
            c.req["delete"] += 1
        deleted += ok
        c.progress("sweep", n * DELETE_BATCH + len(batch), len(candidates))
    return deleted


# The final checks run by the sync driver, for tests and tools that drive one by hand.


def _sweep_atomic(backend: Backend, candidates: list[ObjectInfo], cutoff: float,
                  c: _Collector) -> list[ObjectInfo]:
    return run(sweep_atomic(backend, candidates, cutoff, c), backend)


def _sweep_listed(backend: Backend, candidates: list[ObjectInfo], cutoff: float,
                  c: _Collector) -> list[ObjectInfo]:
    return run(sweep_listed(backend, candidates, cutoff, c), backend)
