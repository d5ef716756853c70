"""Integrity audit of a store: prove that every checkpoint a ref reaches is intact, and name what
is not. Used by :meth:`CheckpointStore.verify` and ``cas-checkpoint verify``.

* **quick** (``deep=False``): every ref decodes and belongs to its thread; its head is in the
  thread's log; every log segment, checkpoint record and state node it reaches exists (one listing
  of ``objects/``, read beside the refs); segments and records are read, re-hashed and decoded,
  and each log entry must agree with its record (parents, step, time, size, label, tags,
  metadata). State nodes are only decoded as far as needed to find their children (on a local
  disk, a node over 64 KB by a prefix read), not re-hashed. A small root node stored inside its
  record is checked with the record (an invalid one makes the record ``undecodable``); the walk
  goes on from its children.
* **deep**: additionally every state node (or a random ``sample`` fraction of them) is read in
  full and re-hashed against its name. So ``deep=False`` proves the structure, ``deep=True`` the
  content.

A problem names the object, its storage path, and the threads and checkpoints it breaks: a node
shared by 30 checkpoints names those 30. Objects no ref reaches are garbage (counted, not errors).

``VerifyReport.to_dict()`` / ``to_json()`` keys (stable): ``ok``, ``url``, ``deep``, ``sample``,
``thread``, ``threads``, ``checkpoints``, ``objects``, ``objects_hashed``, ``bytes_hashed``,
``by_kind`` (``{"record"|"segment"|"node": {"objects", "hashed", "bytes_hashed"}}``),
``unreachable_objects``, ``unreachable_bytes`` (null when one thread was checked), ``seconds``,
``problems`` (a list of ``{"kind", "what", "object", "path", "detail", "threads",
"checkpoints"}``). Problem kinds: ``missing``, ``corrupt`` (bytes do not hash to the name),
``undecodable``, ``unreadable`` (storage refused the read), ``dangling_ref`` (a head that is not
in its thread's log), ``mismatch`` (a log entry, head or segment disagrees with what it names).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ._fmt import human_bytes as _human
from .backend import Backend, LocalBackend
from .errors import CasError, NotFoundError, StorageError
from .objects import (
    Head,
    LogEntry,
    ObjectId,
    Record,
    Segment,
    decode_node,
    object_id,
)
from .objstore import PREFIX
from .objstore import key_pack_id as key_object_id
from .objstore import pack_key as object_key
from .refs import FANOUT, LEAF, RefStore, thread_key

PREFIX_BYTES = 64 * 1024  # nodes larger than this are read by a prefix in quick mode (local)
CHUNK = 32  # objects per worker task (one get_many each)
WORKERS = max(2, min(8, (os.cpu_count() or 2) * 2))

Progress = Callable[[int, int], None]
"""``progress(objects_done, objects_listed)``: called now and then during a run."""


@dataclass(frozen=True, slots=True)
class Problem:
    kind: str  # missing | corrupt | undecodable | unreadable | dangling_ref | mismatch
    what: str  # ref | segment | record | node
    object: str | None  # object id, or the checkpoint id a ref names
    path: str  # storage key under the store's root
    detail: str
    threads: tuple[str, ...] = ()  # threads this breaks
    checkpoints: tuple[str, ...] = ()  # checkpoints whose record or state this breaks

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "what": self.what, "object": self.object, "path": self.path,
                "detail": self.detail, "threads": list(self.threads),
                "checkpoints": list(self.checkpoints)}


@dataclass(slots=True)
class VerifyReport:
    url: str
    deep: bool
    sample: float | None
    thread: str | None
    problems: list[Problem] = field(default_factory=list)
    threads: int = 0
    checkpoints: int = 0
    objects: int = 0  # reachable objects whose existence was checked
    objects_hashed: int = 0
    bytes_hashed: int = 0
    by_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    unreachable_objects: int | None = None
    unreachable_bytes: int | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def broken_checkpoints(self) -> set[str]:
        return {c for p in self.problems for c in p.checkpoints}

    def broken_threads(self) -> set[str]:
        return {t for p in self.problems for t in p.threads}

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "url": self.url, "deep": self.deep, "sample": self.sample,
                "thread": self.thread, "threads": self.threads, "checkpoints": self.checkpoints,
                "objects": self.objects, "objects_hashed": self.objects_hashed,
                "bytes_hashed": self.bytes_hashed, "by_kind": self.by_kind,
                "unreachable_objects": self.unreachable_objects,
                "unreachable_bytes": self.unreachable_bytes, "seconds": round(self.seconds, 3),
                "problems": [p.to_dict() for p in self.problems]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def to_text(self) -> str:
        mode = "deep" if self.deep else "quick"
        if self.deep and self.sample is not None:
            mode += f" (sample {self.sample:g})"
        lines = [f"verify {self.url} ({mode}"
                 + (f", thread {self.thread!r})" if self.thread is not None else ")")]
        lines.append(f"  {self.threads} threads, {self.checkpoints} checkpoints, {self.objects} "
                     f"objects reachable; {self.objects_hashed} objects "
                     f"({_human(self.bytes_hashed)}) re-hashed in {self.seconds:.2f} s")
        if self.unreachable_objects is not None:
            lines.append(f"  unreachable (garbage, not an error): {self.unreachable_objects} "
                         f"objects, {_human(self.unreachable_bytes or 0)}")
        if self.ok:
            lines.append("OK: no problems found")
            return "\n".join(lines)
        lines.append(f"{len(self.problems)} PROBLEMS, breaking {len(self.broken_checkpoints())} "
                     f"checkpoints in {len(self.broken_threads())} threads:")
        for p in self.problems:
            lines.append(f"  {p.kind} {p.what} {p.path}: {p.detail}")
            if p.threads:
                lines.append("    threads: " + ", ".join(repr(t) for t in p.threads))
            if p.checkpoints:
                lines.append(f"    checkpoints ({len(p.checkpoints)}): "
                             + ", ".join(p.checkpoints))
        return "\n".join(lines)


@dataclass(slots=True)
class _Got:
    """What reading one object found: ``parsed`` is the decoded value when all went well."""

    status: str = "ok"  # ok | missing | corrupt | undecodable | unreadable
    parsed: Any = None
    detail: str = ""
    hashed: int = -1  # bytes re-hashed, -1 if not hashed


class _Audit:
    def __init__(self, backend: Backend, refs: RefStore, *, deep: bool, sample: float | None,
                 thread_id: str | None, progress: Progress | None) -> None:
        self.backend = backend
        self.refs = refs
        self.deep = deep
        self.sample = sample
        self.rng = random.Random()
        self.thread_id = thread_id
        self.progress = progress
        self.report = VerifyReport(backend.url, deep, sample, thread_id)
        self.report.by_kind = {k: {"objects": 0, "hashed": 0, "bytes_hashed": 0}
                               for k in ("record", "segment", "node")}
        self.sizes: dict[str, int] = {}
        self.up: dict[str, set[str]] = {}  # object -> objects naming it (node -> node/record)
        self.named_by: dict[str, set[str]] = {}  # object -> threads whose ref/log names it
        self.records: set[str] = set()
        self.reached: set[str] = set()
        self.partial: set[str] = set()  # threads whose log could not be read whole
        self.done = 0
        self.local = isinstance(backend, LocalBackend)
        self.pool = ThreadPoolExecutor(WORKERS)

    # --- reading -------------------------------------------------------------------------------

    def _prefix(self, key: str) -> bytes:
        assert isinstance(self.backend, LocalBackend)
        try:
            with open(os.path.join(self.backend.root, *key.split("/")), "rb") as f:
                return f.read(PREFIX_BYTES)
        except FileNotFoundError:
            raise NotFoundError(key) from None
        except OSError as exc:
            raise StorageError(f"cannot read {key}: {exc}") from exc

    def _check(self, oid: str, data: bytes | None, rehash: bool,
               decode: Callable[[bytes], Any], prefix: bool = False) -> _Got:
        if data is None:
            return _Got("missing", detail="the object does not exist")
        got = _Got()
        if rehash:
            got.hashed = len(data)
            actual = object_id(data)
            if actual != oid:
                got.status, got.detail = "corrupt", f"its bytes hash to {actual}"
                return got
        try:
            got.parsed = decode(data)
        except CasError as exc:
            got.status, got.detail = "undecodable", str(exc)
        except Exception as exc:  # a decoder bug must not stop the audit
            got.status, got.detail = "undecodable", f"{type(exc).__name__}: {exc}"
        if got.status != "ok" and not rehash and not prefix:  # damaged, or hostile?
            return self._check(oid, data, True, decode)
        return got

    def _one(self, oid: str, rehash: bool, decode: Callable[[bytes], Any]) -> _Got:
        """Read one object (a prefix of a large node when it is not re-hashed), re-hash it if
        asked, and decode it."""
        key = object_key(oid)
        size = self.sizes.get(oid)
        try:
            if not rehash and self.local and size is not None and size > PREFIX_BYTES:
                got = self._check(oid, self._prefix(key), False, decode, prefix=True)
                if got.status == "ok":
                    return got
            return self._check(oid, self.backend.get(key), rehash, decode)
        except NotFoundError:
            return self._check(oid, None, True, decode)
        except StorageError as exc:
            return _Got("unreadable", detail=str(exc))

    def _chunk(self, chunk: list[str], full: Callable[[str], bool],
               decode: Callable[[bytes], Any]) -> list[_Got]:
        """One worker's share: read a few objects with one ``get_many`` (concurrent on S3),
        then re-hash and decode them here, so hashing runs in parallel too."""
        by_prefix = {o for o in chunk if self.local and not full(o)
                     and self.sizes.get(o, 0) > PREFIX_BYTES}
        try:
            got: dict[str, bytes | None] | None = self.backend.get_many(
                [object_key(o) for o in chunk if o not in by_prefix])
        except StorageError:  # one unreadable object: find it one by one
            got = None
        return [self._one(o, full(o), decode) if got is None or o in by_prefix
                else self._check(o, got[object_key(o)], full(o), decode) for o in chunk]

    def read(self, oids: list[str], kind: str, full: Callable[[str], bool],
             decode: Callable[[bytes], Any]) -> dict[str, _Got]:
        """Read, re-hash (where ``full``) and decode objects, chunks in parallel."""
        out: dict[str, _Got] = {}
        stats = self.report.by_kind[kind]
        chunks = [oids[i:i + CHUNK] for i in range(0, len(oids), CHUNK)]
        for chunk, results in zip(chunks, self.pool.map(lambda c: self._chunk(c, full, decode),
                                                        chunks), strict=True):
            for oid, res in zip(chunk, results, strict=True):
                out[oid] = res
                stats["objects"] += 1
                if res.hashed >= 0:
                    stats["hashed"] += 1
                    stats["bytes_hashed"] += res.hashed
            self.done += len(chunk)
            if self.progress is not None:
                self.progress(self.done, max(self.done, len(self.sizes)))
        return out

    # --- problems ------------------------------------------------------------------------------

    def affected(self, oid: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(threads, checkpoints) an object's damage breaks: walk up to records and refs."""
        threads: set[str] = set()
        cps: set[str] = set()
        todo, seen = [oid], {oid}
        while todo:
            o = todo.pop()
            if o in self.records:
                cps.add(o)
            threads |= self.named_by.get(o, set())
            for parent in self.up.get(o, ()):
                if parent not in seen:
                    seen.add(parent)
                    todo.append(parent)
        return tuple(sorted(threads)), tuple(sorted(cps))

    def problem(self, kind: str, what: str, oid: str | None, path: str, detail: str,
                threads: Iterable[str] = (), checkpoints: Iterable[str] = ()) -> None:
        self.report.problems.append(Problem(kind, what, oid, path, detail,
                                            tuple(sorted(set(threads))),
                                            tuple(sorted(set(checkpoints)))))

    def object_problem(self, oid: str, what: str, got: _Got) -> None:
        threads, cps = self.affected(oid)
        self.problem(got.status, what, oid, object_key(oid), got.detail, threads, cps)

    def link(self, child: str, parent: str) -> None:
        self.up.setdefault(child, set()).add(parent)

    def name(self, oid: str, thread: str) -> None:
        self.named_by.setdefault(oid, set()).add(thread)

    # --- the walk ------------------------------------------------------------------------------

    def run(self) -> VerifyReport:
        t0 = time.perf_counter()
        listing: Future[dict[str, int]] = self.pool.submit(self._list)
        try:
            heads = self.read_refs()
            entries = self.read_logs(heads)  # logs and records are read while listing
            roots = self.read_records(heads, entries)
            self.sizes = listing.result()
            self.read_nodes(roots)
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)
        r = self.report
        r.objects = len(self.reached)
        r.objects_hashed = sum(k["hashed"] for k in r.by_kind.values())
        r.bytes_hashed = sum(k["bytes_hashed"] for k in r.by_kind.values())
        r.checkpoints = len(self.records)
        if self.thread_id is None:
            garbage = [s for o, s in self.sizes.items() if o not in self.reached]
            r.unreachable_objects, r.unreachable_bytes = len(garbage), sum(garbage)
        r.seconds = time.perf_counter() - t0
        if self.progress is not None:
            self.progress(self.done, self.done)
        return r

    def _list(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for info in self.backend.list(PREFIX):
            oid = key_object_id(info.key)
            if oid is not None:
                out[oid] = info.size
        return out

    def read_refs(self) -> dict[str, Head]:
        threads = self.refs.threads() if self.thread_id is None else [self.thread_id]
        self.report.threads = len(threads)
        raws = list(self.pool.map(lambda t: self.backend.read_ref(thread_key(t)), threads))
        heads: dict[str, Head] = {}
        for thread, raw in zip(threads, raws, strict=True):
            key = thread_key(thread)
            if raw is None:  # deleted since the listing, or never there
                if self.thread_id is None:
                    continue
                raise NotFoundError(f"thread {thread!r} does not exist in {self.backend.url}")
            try:
                head = Head.decode(raw[0])
            except CasError as exc:
                self.problem("undecodable", "ref", None, key, str(exc), [thread])
                continue
            if head.thread_id != thread:
                self.problem("mismatch", "ref", head.head, key,
                             f"the ref of thread {thread!r} holds the head of thread "
                             f"{head.thread_id!r} (copied or tampered with)", [thread])
                continue
            if head.head is not None:
                heads[thread] = head
        return heads

    def read_logs(self, heads: dict[str, Head]) -> dict[str, list[LogEntry]]:
        """Read every segment tree; returns each thread's entries (threads with a broken log
        get the entries that could be read)."""
        segs: dict[str, Segment | None] = {}
        failed: dict[str, _Got] = {}
        pending: list[str] = []
        for thread, head in heads.items():
            for peak in head.peaks:
                self.name(peak.id, thread)
                pending.append(peak.id)
        while pending:
            pending = list(dict.fromkeys(o for o in pending if o not in segs))
            self.reached.update(pending)
            got = self.read(pending, "segment", lambda o: True, Segment.decode)
            nxt = []
            for oid in pending:
                seg = got[oid].parsed if got[oid].status == "ok" else None
                segs[oid] = seg
                if seg is None:
                    failed[oid] = got[oid]
                for child in seg.children if seg else ():
                    self.link(child, oid)
                    nxt.append(child)
            pending = nxt
        for oid, res in failed.items():  # after all links exist, so threads are complete
            self.object_problem(oid, "segment", res)
        out: dict[str, list[LogEntry]] = {}
        for thread, head in heads.items():
            entries: list[LogEntry] = []
            seen: set[str] = set()
            for peak in head.peaks:
                found = self.flatten(peak.id, 64, segs, thread, seen)
                top = segs.get(peak.id)
                if found is None or top is None:
                    self.partial.add(thread)
                elif (len(found), top.level) != (peak.count, peak.level):
                    self.problem("mismatch", "segment", peak.id, object_key(peak.id),
                                 f"the head says a level {peak.level} tree of {peak.count} "
                                 f"entries, it is level {top.level} with {len(found)}", [thread])
                entries.extend(found or ())
            entries.extend(head.tail)
            out[thread] = entries
        return out

    def flatten(self, oid: str, above: int, segs: dict[str, Segment | None], thread: str,
                seen: set[str]) -> list[LogEntry] | None:
        seg = segs.get(oid)
        if seg is None:
            return None
        bad = ""
        if oid in seen:
            bad = "the segment is named twice in the thread's log"
        elif seg.level >= above:
            bad = f"level {seg.level} under a level {above} segment"
        elif len(seg.entries) > LEAF or len(seg.children) > FANOUT:
            bad = "more entries or children than a segment may hold"
        if bad:
            self.problem("mismatch", "segment", oid, object_key(oid), bad, [thread])
            return None
        seen.add(oid)
        out = list(seg.entries)
        for child in seg.children:
            got = self.flatten(child, seg.level, segs, thread, seen)
            if got is None:
                return None
            out.extend(got)
        return out

    def read_records(self, heads: dict[str, Head],
                     logs: dict[str, list[LogEntry]]) -> list[tuple[str, str]]:
        wanted: dict[str, None] = {}
        for thread, entries in logs.items():
            head = heads[thread]
            ids = {}
            for e in entries:
                self.name(e.id, thread)
                self.records.add(e.id)
                wanted[e.id] = None
                ids[e.id] = e
            assert head.head is not None
            if head.head not in ids and thread in self.partial:  # may be in the lost part
                self.name(head.head, thread)
                self.records.add(head.head)
                wanted[head.head] = None
            elif head.head not in ids:
                exists = self.backend.get_many([object_key(head.head)])[object_key(head.head)]
                self.problem("dangling_ref", "ref", head.head, thread_key(thread),
                             f"the head {head.head} is not in thread {thread!r}'s log"
                             + ("" if exists is not None else " and does not exist"), [thread])
            elif head.head in ids and ids[head.head].step != head.head_step:
                self.problem("mismatch", "ref", head.head, thread_key(thread),
                             f"the ref says step {head.head_step}, the log says "
                             f"{ids[head.head].step}", [thread])
        oids = list(wanted)
        self.reached.update(oids)
        got = self.read(oids, "record", lambda o: True, Record.decode)
        roots: list[tuple[str, str]] = []  # (stored node, record naming it)
        for oid in oids:
            res = got[oid]
            if res.status != "ok":  # incl. an inline root that is not a valid node
                self.object_problem(oid, "record", res)
            else:  # an inline root is part of its record: walk on from its children
                roots.extend((child, oid) for child in res.parsed.children())
        for thread, entries in logs.items():
            for e in entries:
                res = got[e.id]
                if res.status == "ok" and not _same(res.parsed.entry(e.id), e):
                    diff = _diff(res.parsed.entry(e.id), e)
                    self.problem("mismatch", "record", e.id, thread_key(thread),
                                 f"thread {thread!r}'s log disagrees with the record on {diff}",
                                 [thread], [e.id])
        return roots

    def read_nodes(self, roots: list[tuple[str, str]]) -> None:
        pending: list[str] = []
        for root, cid in roots:
            self.link(root, cid)
            pending.append(root)
        seen: set[str] = set()
        problems: list[tuple[str, _Got]] = []
        while pending:
            pending = [o for o in dict.fromkeys(pending) if o not in seen]
            seen.update(pending)
            self.reached.update(pending)
            chosen = {o for o in pending if self._deep_pick()}
            got = self.read(pending, "node", chosen.__contains__, _node_children)
            nxt = []
            for oid in pending:
                res = got[oid]
                if res.status != "ok":
                    problems.append((oid, res))
                    continue
                for child in res.parsed:
                    self.link(child, oid)
                    nxt.append(child)
            pending = nxt
        for oid, res in problems:
            self.object_problem(oid, "node", res)

    def _deep_pick(self) -> bool:
        return self.deep and (self.sample is None or self.rng.random() < self.sample)


def _node_children(data: bytes) -> tuple[ObjectId, ...]:
    return decode_node(data)[0]


def _same(a: LogEntry, b: LogEntry) -> bool:
    """Equal as stored (so a NaN in metadata equals itself)."""
    return a == b or bool(msgpack.packb(a.pack()) == msgpack.packb(b.pack()))


def _diff(a: LogEntry, b: LogEntry) -> str:
    names = ("parents", "step", "created_at", "size", "label", "tags", "metadata")
    return ", ".join(n for n in names if getattr(a, n) != getattr(b, n)) or "its fields"


def verify(backend: Backend, refs: RefStore, *, deep: bool = True, sample: float | None = None,
           thread_id: str | None = None, progress: Progress | None = None) -> VerifyReport:
    """Audit the store behind ``backend``/``refs``: see the module docstring."""
    from .errors import InvalidArgumentError

    if sample is not None and (isinstance(sample, bool) or not isinstance(sample, int | float)
                               or not 0 < sample <= 1):
        raise InvalidArgumentError(f"sample must be a fraction in (0, 1], not {sample!r}")
    if sample is not None and not deep:
        raise InvalidArgumentError("sample= chooses the nodes a deep verify re-hashes; pass "
                                   "deep=True with it (quick checks cover every node anyway)")
    if thread_id is not None:
        thread_key(thread_id)
    return _Audit(backend, refs, deep=deep, sample=sample, thread_id=thread_id,
                  progress=progress).run()


__all__ = ["Problem", "VerifyReport", "verify"]
