"""Integrity audit of a store: prove that every checkpoint a ref reaches is intact, and name what
is not. Used by :meth:`CheckpointStore.verify` and ``cas-checkpoint verify``.

Layout v3: a thread's head (its ref, with a checksum) names every pack holding its objects and
holds its newest objects inline. The audit reads every ref, then the packs they name (in rounds
of a few threads, each pack once however many threads name it, dropped once no thread left
needs it), and walks each thread: log segments -> log entries -> checkpoint records -> state
node trees, each object looked up where a load looks (the head's inline objects, then its packs).

* **quick** (``deep=False``): every entry under ``refs/heads`` is a thread's ref and a regular
  file; each ref's checksum holds, it belongs to the thread of its key, its head is in its log
  (else ``dangling_ref``) at the step it claims; every pack a ref names exists, hashes to its
  name, has a valid index and the size and count the ref says; every segment, record and state
  node a checkpoint reaches is in its thread and re-hashes to its id; each log entry agrees with
  its record and each log peak with its segments; no state tree is deeper than a load follows
  (``too_deep``) or expands past what a load allows (``too_big``).
* **deep**: also re-hashes every other object of every pack (``sample=0.1``: a random 10% of
  them), so an object whose bytes do not match the id its pack files it under is found even when
  no checkpoint needs it now. Reading a pack hashes all of its bytes either way.

A listing error propagates (StorageError): "could not look" is never reported as "nothing there".
A problem names the object, its storage path (for a missing object: the damaged pack it was
probably in, else the ref that should reach it), and the threads and checkpoints it breaks: a
node shared by 30 checkpoints names those 30; a node missing from a fork's packs only names the
fork. Packs no ref names are garbage for gc (counted, not errors).

``VerifyReport.to_dict()`` / ``to_json()`` keys (stable): ``ok``, ``url``, ``deep``, ``sample``,
``thread``, ``threads`` (refs read), ``checkpoints`` (distinct log entries), ``objects``
(distinct objects reached), ``objects_hashed``, ``bytes_hashed``, ``by_kind``
(``{"pack"|"record"|"segment"|"node": {"objects", "hashed", "bytes_hashed"}}``),
``unreachable_objects``, ``unreachable_bytes`` (packs no ref names; null when one thread was
checked), ``seconds``, ``problems`` (a list of ``{"kind", "what", "object", "path", "detail",
"threads", "checkpoints"}``). Problem kinds: ``missing``, ``corrupt`` (bytes do not hash to their
name, or a ref's checksum fails), ``undecodable``, ``unreadable`` (storage refused the read, or a
ref is not a regular file), ``stray`` (an entry under ``refs/heads`` that is not a thread's ref),
``dangling_ref`` (a head that is not in its thread's log), ``mismatch`` (a ref, log entry, log
peak or pack size disagrees with what it names), ``too_deep`` (a state tree deeper than the
``MAX_DEPTH`` levels a load follows; the object is the node where the bound is crossed) and
``too_big`` (a state that expands past a load's budget). ``what``: ``ref``, ``pack``,
``segment``, ``record``, ``node`` (or ``object``: an unreached pack object of no known kind).
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
from .errors import (
    CasError,
    FormatError,
    IntegrityError,
    InvalidArgumentError,
    NotFoundError,
    StorageError,
)
from .objects import Head, LogEntry, Record, Segment, decode_node, object_id, pack_prefix
from .objstore import PREFIX, Pack, key_pack_id, pack_key, parse_pack
from .refs import HEADS, RefStore, is_hashed_key, thread_from_key, thread_key
from .shapes import EXPANSION, LOAD_BUDGET, MAX_DEPTH

PACK_BATCH = 64  # packs read per round, at most
BATCH_BYTES = 256 << 20  # pack bytes read per round, about (a bigger thread gets its own round)
ID_COST = 32  # what a load charges per child id (join.ID_COST)
KINDS = {b"N": "node", b"C": "record", b"L": "segment"}

Progress = Callable[[int, int], None]
"""``progress(done, total)``: packs read and objects checked so far, of about ``total``."""


@dataclass(frozen=True, slots=True)
class Problem:
    kind: str  # missing | corrupt | undecodable | unreadable | stray | dangling_ref | mismatch
    #            | too_deep | too_big
    what: str  # ref | pack | segment | record | node | object
    object: str | None  # object or pack id, or the checkpoint id a ref names
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
    objects: int = 0  # distinct objects reached (segments, records, nodes)
    objects_hashed: int = 0
    bytes_hashed: int = 0
    by_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    unreachable_objects: int | None = None  # packs no ref names (garbage for gc)
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
        packs = self.by_kind.get("pack", {})
        lines.append(f"  {self.threads} threads, {self.checkpoints} checkpoints, {self.objects} "
                     f"objects reached in {packs.get('objects', 0)} packs; "
                     f"{self.objects_hashed} hashed ({_human(self.bytes_hashed)}) in "
                     f"{self.seconds:.2f} s")
        if self.unreachable_objects is not None:
            lines.append(f"  unreachable (garbage for gc, not an error): "
                         f"{self.unreachable_objects} packs, {_human(self.unreachable_bytes or 0)}")
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


Node = tuple[tuple[str, ...], int]  # (children, bytes a load charges for it)


class _Audit:
    def __init__(self, backend: Backend, *, deep: bool, sample: float | None,
                 thread_id: str | None, progress: Progress | None) -> None:
        self.backend, self.deep, self.sample = backend, deep, sample
        self.thread_id, self.progress = thread_id, progress
        self.rng = random.Random()
        self.report = r = VerifyReport(backend.url, deep, sample, thread_id)
        r.by_kind = {k: {"objects": 0, "hashed": 0, "bytes_hashed": 0}
                     for k in ("pack", "record", "segment", "node")}
        self.named_by: dict[str, set[str]] = {}  # pack -> threads whose head names it
        self.log_of: dict[str, set[str]] = {}  # checkpoint -> threads whose log holds it
        self.up: dict[str, set[str]] = {}  # node -> the nodes and records naming it
        self.decoded: dict[str, dict[str, Any]] = {  # kind -> object -> decoded, None if bad
            "segment": {}, "record": {}, "node": {}}
        self.errors: dict[str, str] = {}  # object -> why it does not decode
        self.reached: dict[str, str] = {}  # object -> its kind
        self.where: dict[str, str] = {}  # object -> where it was first found
        self.packs: dict[str, Pack | None] = {}  # read so far (None: missing or unreadable)
        self.located: dict[str, dict[int, str]] = {}  # pack -> {offset: hash of the bytes}
        self.flagged: set[tuple[str, int]] = set()  # damaged pack locations already reported
        self.bad_packs: dict[str, tuple[str, str]] = {}  # pack -> (kind, detail)
        self.pending: dict[tuple[str, str, str, str], tuple[str, set[str]]] = {}
        self.reach_memo: dict[str, frozenset[str]] = {}
        self.done = self.total = 0

    # --- problems ------------------------------------------------------------------------------

    def problem(self, kind: str, what: str, oid: str | None, path: str, detail: str,
                threads: Iterable[str] = (), checkpoints: Iterable[str] = ()) -> None:
        self.report.problems.append(Problem(kind, what, oid, path, detail,
                                            tuple(sorted(set(threads))),
                                            tuple(sorted(set(checkpoints)))))

    def defer(self, kind: str, what: str, oid: str, path: str, detail: str, thread: str) -> None:
        """An object problem met in ``thread``: reported once at the end, naming every thread
        it was met in and every checkpoint of those threads that reaches the object."""
        self.pending.setdefault((kind, what, oid, path), (detail, set()))[1].add(thread)

    def reaching(self, oid: str) -> frozenset[str]:
        """The checkpoints whose record or state tree holds ``oid`` (memoised, no recursion)."""
        memo, stack, opened = self.reach_memo, [oid], set()
        while stack:
            x = stack[-1]
            if x in memo:
                stack.pop()
                continue
            parents = self.up.get(x, ())
            todo = [p for p in parents if p not in memo and p not in opened]
            if todo and x not in opened:
                opened.add(x)
                stack.extend(todo)
                continue
            stack.pop()
            got = {x} if x in self.log_of else set()
            for p in parents:
                got |= memo.get(p, frozenset())
            memo[x] = frozenset(got)
        return memo[oid]

    def flush(self) -> None:
        """Object problems (each naming the checkpoints of the threads it was met in), then
        damaged packs, naming the checkpoints broken by what is missing from or damaged in
        them."""
        found: list[Problem] = []
        for (kind, what, oid, path), (detail, threads) in self.pending.items():
            cps = [c for c in self.reaching(oid) if self.log_of[c] & threads]
            found.append(Problem(kind, what, oid, path, detail, tuple(sorted(threads)),
                                 tuple(sorted(cps))))
        for pid, (kind, detail) in self.bad_packs.items():
            named, key = self.named_by.get(pid, set()), pack_key(pid)
            broken = {c for p in found for c in p.checkpoints if p.path.startswith(key)
                      or (p.kind == "missing" and named & set(p.threads))}
            self.problem(kind, "pack", pid, key, detail, named, broken)
        self.report.problems.extend(found)
        order = {w: i for i, w in enumerate(("ref", "pack", "segment", "record", "node"))}
        self.report.problems.sort(key=lambda p: (order.get(p.what, 9), p.path, p.kind,
                                                 p.object or ""))

    def tick(self, n: int = 1) -> None:
        self.done += n
        if self.progress is not None and self.done % 256 < n:
            self.progress(self.done, max(self.done, self.total))

    def hashed(self, what: str, n: int) -> None:
        stats = self.report.by_kind[what if what in self.report.by_kind else "node"]
        stats["hashed"] += 1
        stats["bytes_hashed"] += n

    # --- refs and packs ------------------------------------------------------------------------

    def read_refs(self) -> dict[str, Head]:
        """Every ref (or the one asked for), decoded and checked."""
        if self.thread_id is not None:
            keys = [thread_key(self.thread_id)]
        else:
            keys = []
            for info in self.backend.list(HEADS):  # a listing error propagates
                name = info.key.rsplit("/", 1)[-1]
                if ".tmp-" in name or name.endswith(".lock"):
                    continue  # a writer's temp or lock file
                if not info.regular:
                    self.problem("unreadable", "ref", None, info.key, "not a regular file: a "
                                 "folder, link or device where a ref belongs; move it away (gc "
                                 "refuses to run while it is there)", _key_thread(info.key))
                elif not _is_key(info.key):
                    self.problem("stray", "ref", None, info.key, "not a thread's ref (its name "
                                 "is no thread key): threads() ignores it and gc refuses to run "
                                 "while it is there; move it away")
                else:
                    keys.append(info.key)
        self.report.threads = len(keys)
        heads: dict[str, Head] = {}
        for key in sorted(keys):
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
                self.report.threads -= 1  # deleted since the listing
                continue
            try:
                head = Head.decode(got[0], key)
            except IntegrityError as exc:
                self.problem("corrupt", "ref", None, key, "its checksum does not hold (blake3 "
                             f"{exc.actual}, the ref says {exc.expected})", want)
                continue
            except FormatError as exc:
                self.problem("undecodable", "ref", None, key, str(exc), want)
                continue
            if not _belongs(head.thread_id, key):
                self.problem("mismatch", "ref", head.head, key, f"the ref holds thread "
                             f"{head.thread_id[:200]!r}, which is not the thread of its key: it "
                             "was copied or tampered with", want)
                continue
            heads[key] = head
            for p in head.packs:
                self.named_by.setdefault(p.id, set()).add(head.thread_id)
        return heads

    def rounds(self, heads: dict[str, Head]) -> list[list[tuple[str, Head]]]:
        """Threads grouped so that each group's new packs are read in one round."""
        out: list[list[tuple[str, Head]]] = [[]]
        planned: set[str] = set()
        count = size = 0
        for key, head in heads.items():
            new = {p.id: p.size for p in head.packs if p.id not in planned}
            if out[-1] and (count + len(new) > PACK_BATCH or size + sum(new.values())
                            > BATCH_BYTES):
                out.append([])
                count = size = 0
            out[-1].append((key, head))
            planned.update(new)
            count, size = count + len(new), size + sum(new.values())
        return out

    def read_packs(self, pids: list[str]) -> None:
        """Read packs: each exists, hashes to its name, has an index (else a pack problem)."""
        try:
            got = self.backend.get_many(pack_key(p) for p in pids)
        except StorageError:  # find which: one at a time
            got = {}
            for pid in pids:
                try:
                    got.update(self.backend.get_many([pack_key(pid)]))
                except StorageError as exc:
                    self.bad_packs[pid] = ("unreadable", str(exc))
                    self.packs[pid] = None
        for pid in pids:
            if pid in self.packs:
                continue
            data = got.get(pack_key(pid))
            self.tick()
            self.packs[pid] = None
            if data is None:
                self.bad_packs[pid] = ("missing", "the pack does not exist; the objects of its "
                                       "threads that are in no other pack are lost")
                continue
            stats = self.report.by_kind["pack"]
            stats["objects"] += 1
            self.hashed("pack", len(data))
            try:
                self.packs[pid] = parse_pack(pid, data)
            except IntegrityError as exc:
                self.bad_packs[pid] = ("corrupt", f"its bytes hash to {exc.actual}")
                try:  # its index may be intact: then the walk finds the damaged objects
                    self.packs[pid] = parse_pack(pid, data, trusted=True)
                except FormatError:
                    pass
            except FormatError as exc:
                self.bad_packs[pid] = ("undecodable", str(exc))

    def release(self, pid: str) -> None:
        """No thread left needs this pack: check its objects no walk took out (deep: all, or a
        ``sample`` of them), then drop it."""
        pack, seen = self.packs.get(pid), self.located.pop(pid, {})
        if pack is None:
            return
        self.packs[pid] = None
        for prefix, locations in pack.index.items():
            for start, end in locations:
                data = pack.data[start:end]
                actual = seen.get(start)
                if actual is None:
                    if not self.deep or (self.sample is not None
                                         and self.rng.random() >= self.sample):
                        continue
                    actual = object_id(data)
                    self.hashed(_what(data), end - start)
                if pack_prefix(actual) != prefix and (pid, start) not in self.flagged:
                    self.problem("corrupt", _what(data), None, f"{pack_key(pid)} (object at "
                                 f"byte {start})", f"the pack files it under id prefix "
                                 f"{prefix:08x}, but its bytes hash to {actual}",
                                 self.named_by.get(pid, ()))

    # --- the walk of one thread ----------------------------------------------------------------

    def walk(self, key: str, head: Head) -> None:
        thread = head.thread_id
        packs = [pk for p in head.packs if (pk := self.packs.get(p.id)) is not None]
        bad = [p.id for p in head.packs if p.id in self.bad_packs]
        inline: dict[str, bytes] = {object_id(d): d for d in head.inline}
        for p in head.packs:
            pack = self.packs.get(p.id)
            if pack is None:
                continue
            n = sum(map(len, pack.index.values()))
            if (p.size, p.count) != (pack.size, n):
                self.defer("mismatch", "pack", p.id, pack_key(p.id), f"the ref says {p.size} "
                           f"bytes and {p.count} objects; the pack has {pack.size} and {n}",
                           thread)
        lost = pack_key(bad[0]) if bad else key
        why = (f"in none of the thread's packs nor its ref ({len(bad)} of its packs are "
               "missing or damaged)" if bad else "in none of the thread's packs nor its ref")

        def find(oid: str, what: str, decode: Callable[[Any], Any]) -> Any:
            """The decoded object, looked up as a load does; None (and a problem) if absent,
            damaged or undecodable."""
            self.reached.setdefault(oid, what)
            self.tick()
            data: Any = inline.get(oid)
            damaged: list[tuple[str, int, IntegrityError]] = []
            if data is None:
                for pack in packs:
                    data = self.take(pack, oid, what, damaged)
                    if data is not None:
                        self.where.setdefault(oid, pack_key(pack.id))
                        break
            else:
                self.where.setdefault(oid, key)
            if data is None:
                if damaged:
                    self.flagged.update((pid, at) for pid, at, _ in damaged)
                    exc = damaged[0][2]
                    self.defer("corrupt", what, oid, exc.path, f"its bytes hash to {exc.actual}",
                               thread)
                else:
                    self.defer("missing", what, oid, lost, why, thread)
                return None
            return self.decode(what, oid, data, decode, thread)

        entries, complete = self.log(key, head, find)
        ids = {e.id for e in entries}
        if complete and head.head is not None:
            step = next((e.step for e in entries if e.id == head.head), None)
            if step is None:
                self.problem("dangling_ref", "ref", head.head, key, "the head is not in the "
                             "thread's log", [thread], [head.head])
            elif step != head.head_step:
                self.problem("mismatch", "ref", head.head, key, f"the ref says its head is at "
                             f"step {head.head_step}; its log entry says {step}", [thread])
        elif complete and ids:
            self.problem("dangling_ref", "ref", None, key, "the ref names no head but its log "
                         f"holds {len(ids)} checkpoints", [thread], ids)
        todo: list[str] = []
        for entry in entries:
            self.log_of.setdefault(entry.id, set()).add(thread)
            rec = find(entry.id, "record", Record.decode)
            if rec is None:
                continue
            stored = rec.entry(entry.id)
            if not _same(stored, entry):
                self.defer("mismatch", "record", entry.id, key, "the log entry and the record "
                           f"disagree on {_diff(stored, entry)}", thread)
            self.link(rec.root, entry.id)
            if rec.root_node is None:
                todo.append(rec.root)
                continue
            self.where.setdefault(rec.root, self.where[entry.id])  # the record's hash covers it
            root = self.decode("node", rec.root, rec.root_node, _node, thread)
            for child in root[0] if root else ():
                self.link(child, rec.root)
                todo.append(child)
        visited: set[str] = set()
        while todo:
            oid = todo.pop()
            if oid in visited:
                continue
            visited.add(oid)
            node = find(oid, "node", _node)
            for child in node[0] if node else ():
                self.link(child, oid)
                if child not in visited:
                    todo.append(child)

    def take(self, pack: Pack, oid: str, what: str,
             damaged: list[tuple[str, int, IntegrityError]]) -> memoryview | None:
        """Object ``oid`` out of ``pack``, each location hashed once per run; None if the pack
        does not hold it (damaged locations of its id prefix go into ``damaged``)."""
        prefix = pack_prefix(oid)
        seen = self.located.setdefault(pack.id, {})
        for start, end in pack.index.get(prefix, ()):
            actual = seen.get(start)
            if actual is None:
                actual = seen[start] = object_id(pack.data[start:end])
                self.hashed(what, end - start)
            if actual == oid:
                return pack.data[start:end]
            if pack_prefix(actual) != prefix:  # not another object of the same prefix
                damaged.append((pack.id, start, IntegrityError(
                    oid, actual, f"{pack_key(pack.id)} (object {oid})")))
        return None

    def decode(self, what: str, oid: str, data: Any, decode: Callable[[Any], Any],
               thread: str) -> Any:
        """An object decoded (once per run: its bytes are its id); None and a problem if it
        does not decode."""
        done = self.decoded[what]
        if oid not in done:
            try:
                done[oid] = decode(data)
            except FormatError as exc:
                done[oid], self.errors[oid] = None, str(exc)
        if done[oid] is None:
            self.defer("undecodable", what, oid, self.where[oid], self.errors[oid], thread)
        return done[oid]

    def link(self, child: str, parent: str) -> None:
        self.up.setdefault(child, set()).add(parent)

    def log(self, key: str, head: Head, find: Callable[..., Any]) -> tuple[list[LogEntry], bool]:
        """The thread's log entries, oldest first, and whether every segment was read."""
        thread, complete, seen = head.thread_id, True, set()
        entries: list[LogEntry] = []
        for peak in head.peaks:
            start, ok = len(entries), True
            todo = [(peak.id, 64)]
            while todo:
                oid, above = todo.pop()
                if oid in seen:  # hostile: would multiply the entries on every level
                    self.defer("mismatch", "segment", oid, key, "a log segment is named twice: "
                               "the log is corrupt or hostile", thread)
                    ok = False
                    continue
                seen.add(oid)
                seg = find(oid, "segment", Segment.decode)
                if seg is None:
                    ok = False
                elif seg.level >= above:
                    self.defer("mismatch", "segment", oid, key, "a log segment does not descend "
                               "in level: the log is corrupt", thread)
                    ok = False
                else:
                    entries.extend(seg.entries)
                    todo.extend((c, seg.level) for c in reversed(seg.children))
            top = self.decoded["segment"].get(peak.id)
            if top and ok and (len(entries) - start, top.level) != (peak.count, peak.level):
                self.defer("mismatch", "segment", peak.id, key, f"the ref says this log peak "
                           f"holds {peak.count} entries at level {peak.level}; it holds "
                           f"{len(entries) - start} at level {top.level}", thread)
            complete = complete and ok
        return entries + list(head.tail), complete

    # --- bounds a load applies -----------------------------------------------------------------

    def shapes(self) -> None:
        """Depth (longest path) and expansion (a shared node counts once per use) of every state
        tree, against what a load allows; measured bottom-up once for all trees."""
        nodes = self.decoded["node"]
        records = {c: r for c in self.log_of if (r := self.decoded["record"].get(c))}
        height: dict[str, int] = {}
        grown: dict[str, int] = {}
        for root in {r.root for r in records.values()}:
            stack, opened = [root], set()
            while stack:  # post-order, no recursion
                x = stack[-1]
                if x in height:
                    stack.pop()
                    continue
                node = nodes.get(x)
                kids = node[0] if node else ()
                if x not in opened and any(c not in height for c in kids):
                    opened.add(x)
                    stack.extend(c for c in kids if c not in height)
                    continue
                stack.pop()
                height[x] = 1 + max((height.get(c, 0) for c in kids), default=-1)
                grown[x] = min(LOAD_BUDGET + 1, (node[1] if node else 0)
                               + sum(grown.get(c, 0) for c in kids))
        crossed: set[str] = set()
        big: dict[str, list[str]] = {}
        for cid, rec in records.items():
            x = rec.root
            if height[x] > MAX_DEPTH:
                while height[x] > MAX_DEPTH + 1:  # down to where the bound is crossed
                    x = max(nodes[x][0], key=lambda c: height.get(c, 0))
                crossed.add(x)
            elif not self.fits(rec, grown[x]):
                big.setdefault(x, []).append(cid)
        for x, cps in big.items():
            self.problem("too_big", "node", x, self.where.get(x, ""), "the state expands into "
                         f"{grown[x]} or more bytes of nodes, more than a load of it allows: a "
                         "hostile or corrupt tree", {t for c in cps for t in self.log_of[c]}, cps)
        for x in crossed:
            cps = [c for c in self.reaching(x) if c in records]
            self.problem("too_deep", "node", x, self.where.get(x, ""), "a state tree goes "
                         f"deeper than the {MAX_DEPTH} levels a load follows, below here",
                         {t for c in cps for t in self.log_of[c]}, cps)

    def fits(self, rec: Record, grown: int) -> bool:
        """Whether a load's budget holds a state that expands into ``grown`` bytes: the least of
        LOAD_BUDGET, twice the record's size + 1 MB, and EXPANSION x its distinct node bytes +
        1 MB (counted only as far as needed)."""
        if grown > min(LOAD_BUDGET, 2 * rec.size + (1 << 20)):
            return False
        need = (grown - (1 << 20)) / EXPANSION
        distinct, seen, stack = 0, {rec.root}, [rec.root]
        while stack and distinct < need:
            node = self.decoded["node"].get(stack.pop())
            if node:
                distinct += node[1]
                fresh = [c for c in node[0] if c not in seen]
                seen.update(fresh)
                stack.extend(fresh)
        return distinct >= need

    # --- the run -------------------------------------------------------------------------------

    def run(self) -> VerifyReport:
        t0 = time.perf_counter()
        heads = self.read_refs()
        left: dict[str, int] = {}
        for head in heads.values():
            for pid in {p.id for p in head.packs}:
                left[pid] = left.get(pid, 0) + 1
            self.total += len(head.inline) + sum(p.count for p in head.packs)
        self.total += len(left)
        for group in self.rounds(heads) if heads else ():
            self.read_packs(list(dict.fromkeys(
                p.id for _, h in group for p in h.packs if p.id not in self.packs)))
            for key, head in group:
                self.walk(key, head)
                for pid in {p.id for p in head.packs}:
                    left[pid] -= 1
                    if not left[pid]:
                        self.release(pid)
        self.shapes()
        self.flush()
        r = self.report
        for what in self.reached.values():
            r.by_kind[what]["objects"] += 1
        r.objects = len(self.reached)
        r.objects_hashed = sum(k["hashed"] for k in r.by_kind.values())
        r.bytes_hashed = sum(k["bytes_hashed"] for k in r.by_kind.values())
        r.checkpoints = len(self.log_of)
        if self.thread_id is None:
            garbage = [i.size for i in self.backend.list(PREFIX)
                       if (k := key_pack_id(i.key)) is not None and k not in self.named_by]
            r.unreachable_objects, r.unreachable_bytes = len(garbage), sum(garbage)
        r.seconds = time.perf_counter() - t0
        if self.progress is not None:
            self.progress(self.done, self.done)
        return r


def _node(data: Any) -> tuple[tuple[str, ...], int]:
    children, payload = decode_node(data)
    if not payload:
        raise FormatError("the state node has no shape byte")
    return children, len(payload) + ID_COST * len(children)


def _what(data: memoryview) -> str:
    return KINDS.get(bytes(data[3:4]), "object") if bytes(data[:3]) == b"CAS" else "object"


def _is_key(key: str) -> bool:
    """A thread key (spelled as ``thread_key`` spells it, or hashed) right under refs/heads."""
    if key.count("/") != 2:
        return False
    if is_hashed_key(key):
        return all(c in "0123456789abcdef" for c in key[-64:])
    thread = thread_from_key(key)
    return thread is not None and _belongs(thread, key)


def _belongs(thread: str, key: str) -> bool:
    try:
        return thread_key(thread) == key
    except CasError:
        return False


def _key_thread(key: str) -> tuple[str, ...]:
    thread = thread_from_key(key)
    return (thread,) if thread is not None and not is_hashed_key(key) else ()


def _same(a: LogEntry, b: LogEntry) -> bool:
    """Equal as stored (so a NaN in metadata equals itself)."""
    return a == b or bool(msgpack.packb(a.pack()) == msgpack.packb(b.pack()))


def _diff(a: LogEntry, b: LogEntry) -> str:
    names = ("parents", "step", "created_at", "size", "label", "tags", "metadata")
    return ", ".join(n for n in names if getattr(a, n) != getattr(b, n)) or "its fields"


def verify(backend: Backend, refs: RefStore, *, deep: bool = True, sample: float | None = None,
           thread_id: str | None = None, progress: Progress | None = None) -> VerifyReport:
    """Audit the store behind ``backend`` (see the module docstring). ``refs`` is the store's
    RefStore; the audit reads refs and packs from storage itself, never from a cache."""
    del refs  # kept for the signature: nothing cached may stand in for storage here
    if sample is not None and (isinstance(sample, bool) or not isinstance(sample, int | float)
                               or not 0 < sample <= 1):
        raise InvalidArgumentError(f"sample must be a fraction in (0, 1], not {sample!r}")
    if sample is not None and not deep:
        raise InvalidArgumentError("sample= chooses the unreached objects a deep verify "
                                   "re-hashes; pass deep=True with it (quick checks every "
                                   "object a checkpoint reaches anyway)")
    if thread_id is not None:
        thread_key(thread_id)
    return _Audit(backend, deep=deep, sample=sample, thread_id=thread_id,
                  progress=progress).run()


__all__ = ["Problem", "VerifyReport", "verify"]
