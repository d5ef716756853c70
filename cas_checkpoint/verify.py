"""Integrity audit of a store: prove that every checkpoint a ref reaches is intact, and name what
is not. Used by :meth:`CheckpointStore.verify` and ``cas-checkpoint verify``.

Layout v3: a thread's head (its ref, with a checksum) names the packs that hold its objects and
holds its newest objects inline. The audit reads every ref and every pack a ref names (each pack
once, however many threads name it), then walks each thread: log segments -> log entries ->
checkpoint records -> state node trees.

* **quick** (``deep=False``): every entry under ``refs/heads`` is a regular file and a readable
  ref (its checksum holds, it belongs to its thread, its head is in its log: else
  ``dangling_ref``); every pack a ref names exists, hashes to its name and has a valid index;
  every segment, record and state node a checkpoint reaches is in its thread's packs or inline
  objects, and is re-hashed as it is taken out; each log entry agrees with its record; no state
  tree is deeper than a load follows (``too_deep``) or expands past what a load allows
  (``too_big``).
* **deep**: also re-hashes every object of every pack, reached or not (``sample=0.1``: a random
  10% of the packs), so damage in objects no checkpoint needs right now is found too.

A listing error propagates (StorageError): "could not look" is never reported as "nothing there".
A problem names the object, its storage path, and the threads and checkpoints it breaks: a node
shared by 30 checkpoints names those 30. Packs no ref names are garbage (counted, not errors).

``VerifyReport.to_dict()`` / ``to_json()`` keys (stable): ``ok``, ``url``, ``deep``, ``sample``,
``thread``, ``threads``, ``checkpoints``, ``objects``, ``objects_hashed``, ``bytes_hashed``,
``by_kind`` (``{"pack"|"record"|"segment"|"node": {"objects", "hashed", "bytes_hashed"}}``),
``unreachable_objects``, ``unreachable_bytes`` (packs no ref names; null when one thread was
checked), ``seconds``, ``problems`` (a list of ``{"kind", "what", "object", "path", "detail",
"threads", "checkpoints"}``). Problem kinds: ``missing``, ``corrupt`` (bytes do not hash to the
name, or a ref's checksum fails), ``undecodable``, ``unreadable`` (storage refused the read, or an
entry is not a regular file), ``dangling_ref`` (a head that is not in its thread's log),
``mismatch`` (a log entry, head or segment disagrees with what it names), ``too_deep`` and
``too_big`` (a state tree a load would refuse). ``what``: ``ref``, ``pack``, ``segment``,
``record``, ``node``.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ._fmt import human_bytes as _human
from .backend import Backend
from .errors import CasError, FormatError, IntegrityError, NotFoundError, StorageError
from .objects import Head, LogEntry, ObjectId, Record, Segment, decode_node
from .objstore import PREFIX, Pack, View, key_pack_id, pack_key, parse_pack
from .refs import HEADS, RefStore, is_thread_key, thread_from_key, thread_key
from .shapes import EXPANSION, LOAD_BUDGET, MAX_DEPTH

PACK_BATCH = 64  # packs read per round (bounds memory)

Progress = Callable[[int, int], None]
"""``progress(objects_done, objects_listed)``: called now and then during a run."""


@dataclass(frozen=True, slots=True)
class Problem:
    kind: str  # missing | corrupt | undecodable | unreadable | dangling_ref | mismatch | too_deep
    #            | too_big
    what: str  # ref | pack | segment | record | node
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
                               for k in ("pack", "record", "segment", "node")}
        self.up: dict[str, set[str]] = {}  # object -> objects naming it (node -> node/record)
        self.named_by: dict[str, set[str]] = {}  # object (or pack) -> threads naming it
        self.records: set[str] = set()
        self.reached: set[str] = set()
        self.packs: dict[str, Pack | None] = {}  # None: missing or damaged (reported)
        self.done = 0
        self.total = 0
        self.pending: dict[tuple[str, str, str], tuple[str, str, set[str]]] = {}

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

    def object_problem(self, kind: str, what: str, oid: str, path: str, detail: str,
                       thread: str) -> None:
        """A damaged or missing object: reported once, after every thread was walked, naming
        every thread and checkpoint that reaches it."""
        got = self.pending.setdefault((kind, what, oid), (path, detail, set()))
        got[2].add(thread)

    def flush_problems(self) -> None:
        for (kind, what, oid), (path, detail, threads) in self.pending.items():
            named, cps = self.affected(oid)
            self.problem(kind, what, oid, path, detail, (*named, *threads), cps)
        self.pending.clear()

    def link(self, child: str, parent: str) -> None:
        self.up.setdefault(child, set()).add(parent)

    def tick(self, n: int = 1) -> None:
        self.done += n
        if self.progress is not None and self.done % 256 < n:
            self.progress(self.done, max(self.done, self.total))

    def count(self, kind: str, hashed: int | None) -> None:
        stats = self.report.by_kind[kind]
        stats["objects"] += 1
        if hashed is not None:
            stats["hashed"] += 1
            stats["bytes_hashed"] += hashed

    # --- the walk ------------------------------------------------------------------------------

    def run(self) -> VerifyReport:
        t0 = time.perf_counter()
        heads = self.read_refs()
        self.read_packs(heads)
        for key, head in heads.items():
            self.walk(key, head)
        self.flush_problems()
        r = self.report
        r.threads = len(heads) + len({p.threads[0] for p in r.problems
                                      if p.what == "ref" and p.threads}
                                     - {h.thread_id for h in heads.values()})
        r.objects = len(self.reached)
        r.objects_hashed = sum(k["hashed"] for k in r.by_kind.values())
        r.bytes_hashed = sum(k["bytes_hashed"] for k in r.by_kind.values())
        r.checkpoints = len(self.records)
        if self.thread_id is None:
            garbage = [i.size for i in self.backend.list(PREFIX)
                       if (pid := key_pack_id(i.key)) is not None and pid not in self.packs]
            r.unreachable_objects, r.unreachable_bytes = len(garbage), sum(garbage)
        r.seconds = time.perf_counter() - t0
        if self.progress is not None:
            self.progress(self.done, self.done)
        return r

    def read_refs(self) -> dict[str, Head]:
        """Every ref (or the one asked for), decoded and checked; problems reported."""
        if self.thread_id is not None:
            keys = [thread_key(self.thread_id)]
        else:
            keys = []
            for info in self.backend.list(HEADS):  # a listing error propagates
                if not info.regular:
                    self.problem("unreadable", "ref", None, info.key,
                                 "not a regular file: a folder, link or device where a ref "
                                 "belongs; move it away (gc refuses to run while it is there)",
                                 _key_thread(info.key))
                elif is_thread_key(info.key):
                    keys.append(info.key)
        heads: dict[str, Head] = {}
        for key in keys:
            want = _key_thread(key)
            try:
                got = self.backend.read_ref(key)
            except CasError as exc:
                kind = "undecodable" if isinstance(exc, FormatError) else "unreadable"
                self.problem(kind, "ref", None, key, str(exc), want)
                continue
            if got is None:
                if self.thread_id is not None:
                    raise NotFoundError(f"thread {self.thread_id!r} does not exist in "
                                        f"{self.backend.url}")
                continue
            try:
                head = Head.decode(got[0], key)
            except IntegrityError as exc:
                self.problem("corrupt", "ref", None, key, f"its checksum does not hold: {exc}",
                             want)
                continue
            except FormatError as exc:
                self.problem("undecodable", "ref", None, key, str(exc), want)
                continue
            if thread_key(head.thread_id) != key if _valid_id(head.thread_id) else True:
                self.problem("mismatch", "ref", head.head, key,
                             f"the ref holds thread {head.thread_id[:200]!r}, which is not the "
                             "thread of its key: it was copied or tampered with", want)
                continue
            heads[key] = head
            for p in head.packs:
                self.named_by.setdefault(p.id, set()).add(head.thread_id)
        return heads

    def read_packs(self, heads: dict[str, Head]) -> None:
        """Every pack a ref names, once: exists, hashes to its name, has a valid index."""
        pids = list(dict.fromkeys(p.id for h in heads.values() for p in h.packs))
        if self.sample is not None and self.deep:
            self.chosen = {p for p in pids if self.rng.random() < self.sample}
        else:
            self.chosen = set(pids) if self.deep else set()
        self.total = len(pids)
        for i in range(0, len(pids), PACK_BATCH):
            batch = pids[i:i + PACK_BATCH]
            try:
                got = self.backend.get_many(pack_key(p) for p in batch)
            except StorageError as exc:
                for pid in batch:
                    self.packs[pid] = None
                    self.problem("unreadable", "pack", pid, pack_key(pid), str(exc),
                                 self.named_by.get(pid, ()))
                continue
            for pid in batch:
                self.packs[pid] = self.read_pack(pid, got[pack_key(pid)])
                self.tick()

    def read_pack(self, pid: str, data: bytes | None) -> Pack | None:
        threads = self.named_by.get(pid, ())
        if data is None:
            self.problem("missing", "pack", pid, pack_key(pid), "the pack does not exist",
                         threads)
            return None
        self.count("pack", len(data))
        try:
            pack = parse_pack(pid, data)
        except IntegrityError as exc:
            self.problem("corrupt", "pack", pid, pack_key(pid),
                         f"its bytes hash to {exc.actual}", threads)
            try:  # its index may be intact: then the walk finds which objects are damaged
                return parse_pack(pid, data, trusted=True)
            except FormatError:
                return None
        except FormatError as exc:
            self.problem("undecodable", "pack", pid, pack_key(pid), str(exc), threads)
            return None
        if pid in self.chosen:  # deep: every object of the pack, reached or not
            for locations in pack.index.values():
                for start, end in locations:
                    self.count("node", end - start)
            try:
                pack.objects  # noqa: B018  (hashes every object)
            except CasError as exc:
                self.problem("undecodable", "pack", pid, pack_key(pid), str(exc), threads)
        return pack

    def walk(self, key: str, head: Head) -> None:
        thread = head.thread_id
        missing_packs = [p.id for p in head.packs if self.packs.get(p.id) is None]
        view = View(head, [pk for p in head.packs if (pk := self.packs.get(p.id)) is not None],
                    self.refs.objects)

        def get(oid: str, what: str, parent: str | None) -> bytes | None:
            if parent is not None:
                self.link(oid, parent)
            self.reached.add(oid)
            try:
                data = view.get(oid)
            except IntegrityError as exc:
                self.object_problem("corrupt", what, oid, exc.path,
                                    f"its bytes hash to {exc.actual}", thread)
                return None
            except NotFoundError:
                where = (f"; {len(missing_packs)} of the thread's packs are missing or damaged"
                         if missing_packs else "")
                self.object_problem("missing", what, oid, key,
                                    f"in none of the thread's packs nor its ref{where}", thread)
                return None
            self.count(what, len(data) if oid not in view.inline else None)
            self.tick()
            return data

        # the log, oldest first; a segment named twice is hostile (and would explode)
        entries: list[LogEntry] = []
        seen: set[str] = set()
        todo = [(p.id, 64) for p in reversed(head.peaks)]
        while todo:
            oid, above = todo.pop()
            if oid in seen:
                self.problem("mismatch", "segment", oid, key, "a log segment is named twice: "
                             "the log is corrupt or hostile", [thread])
                break
            seen.add(oid)
            data = get(oid, "segment", None)
            if data is None:
                continue
            try:
                seg = Segment.decode(data)
            except FormatError as exc:
                self.problem("undecodable", "segment", oid, key, str(exc), [thread])
                continue
            if seg.level >= above:
                self.problem("mismatch", "segment", oid, key, "a log segment does not descend "
                             "in level: the log is corrupt", [thread])
                continue
            entries.extend(seg.entries)
            todo.extend((c, seg.level) for c in reversed(seg.children))
        entries.extend(head.tail)
        ids = {e.id for e in entries}
        if head.head is not None and head.head not in ids:
            self.problem("dangling_ref", "ref", head.head, key,
                         "the head is not in the thread's log", [thread], [head.head])
        # records, then state trees
        roots: list[tuple[str, Record]] = []
        for entry in entries:
            self.named_by.setdefault(entry.id, set()).add(thread)
            self.records.add(entry.id)
            data = get(entry.id, "record", None)
            if data is None:
                continue
            try:
                rec = Record.decode(data)
            except FormatError as exc:
                self.problem("undecodable", "record", entry.id, key, str(exc), [thread],
                             [entry.id])
                continue
            stored = rec.entry(entry.id)
            if not _same(stored, entry):
                self.problem("mismatch", "record", entry.id, key, "the log entry and the "
                             f"record disagree on {_diff(stored, entry)}", [thread], [entry.id])
            roots.append((entry.id, rec))
        self.nodes(key, roots, get)

    def nodes(self, key: str, roots: list[tuple[str, Record]],
              get: Callable[[str, str, str | None], bytes | None]) -> None:
        """Walk the state trees level by level (no recursion), checking depth and expansion."""
        sizes: dict[str, tuple[int, tuple[ObjectId, ...]]] = {}  # node -> (payload+ids, children)
        level = 0
        frontier: dict[str, None] = {}
        for cid, rec in roots:
            if rec.root_node is not None:
                sizes[rec.root] = (len(rec.root_node), rec.children())
            for child in rec.children():
                self.link(child, cid)
                frontier.setdefault(child)
        while frontier:
            level += 1
            nxt: dict[str, None] = {}
            for oid in frontier:
                if oid in sizes:
                    continue
                data = get(oid, "node", None)
                if data is None:
                    sizes[oid] = (0, ())
                    continue
                try:
                    children, payload = decode_node(data)
                except FormatError as exc:
                    threads, cps = self.affected(oid)
                    self.problem("undecodable", "node", oid, key, str(exc), threads, cps)
                    sizes[oid] = (0, ())
                    continue
                sizes[oid] = (len(payload) + 32 * len(children), children)
                for child in children:
                    self.link(child, oid)
                    if child not in sizes:
                        nxt.setdefault(child)
            if level > MAX_DEPTH:
                threads, cps = self.affected(next(iter(nxt or frontier)))
                self.problem("too_deep", "node", next(iter(frontier)), key,
                             f"a state tree is deeper than the {MAX_DEPTH} levels a load "
                             "follows", threads, cps)
                return
            frontier = nxt
        self.expansion(key, roots, sizes)

    def expansion(self, key: str, roots: list[tuple[str, Record]],
                  sizes: dict[str, tuple[int, tuple[ObjectId, ...]]]) -> None:
        """Bytes each state expands into (a shared node counts once per use), against what a
        load allows: flags the small hostile trees that would expand into gigabytes."""
        expanded: dict[str, int] = {}
        order: list[str] = []
        seen: set[str] = set()
        stack = [r.root for _, r in roots]
        while stack:  # post-order without recursion
            oid = stack[-1]
            if oid in seen:
                stack.pop()
                if oid not in expanded:
                    own, children = sizes.get(oid, (0, ()))
                    expanded[oid] = min(own + sum(expanded.get(c, 0) for c in children),
                                        LOAD_BUDGET + 1)
                    order.append(oid)
                continue
            seen.add(oid)
            stack.extend(c for c in sizes.get(oid, (0, ()))[1] if c not in seen)
        distinct = sum(size for size, _ in sizes.values())
        limit = min(LOAD_BUDGET, EXPANSION * distinct + (1 << 20))
        for cid, rec in roots:
            if expanded.get(rec.root, 0) > limit:
                threads, cps = self.affected(rec.root)
                self.problem("too_big", "node", rec.root, key,
                             f"the state expands into more than {limit} bytes of nodes, which a "
                             "load refuses (a hostile or corrupt tree)", threads, (*cps, cid))


def _key_thread(key: str) -> tuple[str, ...]:
    thread = thread_from_key(key)
    return (thread,) if thread is not None else ()


def _valid_id(thread: str) -> bool:
    try:
        thread_key(thread)
        return True
    except CasError:
        return False


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
