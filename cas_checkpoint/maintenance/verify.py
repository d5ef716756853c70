"""Integrity audit of a store: prove that every checkpoint a ref reaches is intact, and name what
is not."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from typing import Any

from cas_checkpoint.backends import Backend
from cas_checkpoint.backends.sealed import unwrap
from cas_checkpoint.engine import archive
from cas_checkpoint.engine.object_store import PREFIX, Pack, key_pack_id, pack_key, parse_pack
from cas_checkpoint.engine.refs import HEADS, RefStore, thread_key
from cas_checkpoint.engine.steps import GetMany, List, ListMany, Step
from cas_checkpoint.errors import (
    CasError,
    FormatError,
    IntegrityError,
    InvalidArgumentError,
    NotFoundError,
    StorageError,
)
from cas_checkpoint.format.heads import Head
from cas_checkpoint.format.objects import LogEntry, Record, Segment, object_id
from cas_checkpoint.format.pack import pack_prefix
from cas_checkpoint.format.sealing import Keyring, is_sealed_key
from cas_checkpoint.maintenance import verify_checks
from cas_checkpoint.maintenance.verify_report import Problem, Progress, VerifyReport
from cas_checkpoint.tree.shapes import EXPANSION, LOAD_BUDGET, MAX_DEPTH

PACK_BATCH = 64  # packs read per round, at most
BATCH_BYTES = 256 << 20  # pack bytes read per round, about (a bigger thread gets its own round)


class _Audit:
    def __init__(self, backend: Backend, *, deep: bool, sample: float | None,
                 thread_id: str | None, progress: Progress | None,
                 keys: Keyring | None = None) -> None:
        self.backend, self.deep, self.sample = backend, deep, sample
        self.keys = keys  # an encrypted store's (key-less: refs' pack lists and pack names)
        self.thread_id, self.progress = thread_id, progress
        self.rng = random.Random()
        self.report = r = VerifyReport(backend.url, deep, sample, thread_id)
        r.by_kind = {k: {"objects": 0, "hashed": 0, "bytes_hashed": 0}
                     for k in ("pack", "record", "segment", "node")}
        self.named_by: dict[str, set[str]] = {}  # pack -> threads whose head names it
        self.log_of: dict[str, set[str]] = {}  # checkpoint -> threads whose log holds it
        self.up: dict[str, set[str]] = {}  # node -> the nodes and records naming it
        self.decoded: dict[str, dict[str, Any]] = {"segment": {}, "record": {}, "node": {}}
        self.errors: dict[str, str] = {}  # object -> why it does not decode
        self.reached: dict[str, str] = {}  # object -> its kind
        self.where: dict[str, str] = {}  # object -> where it was first found
        self.packs: dict[str, Pack | None] = {}  # read so far (None: bad, or done with)
        self.located: dict[str, dict[int, str]] = {}  # pack -> {offset: hash of the bytes}
        self.flagged: set[tuple[str, int]] = set()  # damaged pack locations already reported
        self.bad_packs: dict[str, tuple[str, str]] = {}  # pack -> (kind, detail)
        self.pending: dict[tuple[str, str, str, str], tuple[str, set[str]]] = {}
        self.reach_memo: dict[str, frozenset[str]] = {}
        self.done = self.total = 0


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
            parents = self.up.get(x, ())
            todo = [p for p in parents if p not in memo and p not in opened]
            if x in memo:
                stack.pop()
            elif todo and x not in opened:
                opened.add(x)
                stack.extend(todo)
            else:
                stack.pop()
                got = {x} if x in self.log_of else set()
                memo[x] = frozenset(got.union(*(memo.get(p, ()) for p in parents)))
        return memo[oid]

    def flush(self) -> None:
        """The object problems, then the damaged packs (naming the checkpoints broken by what
        is missing from their threads or damaged in them); sorted."""
        found: list[Problem] = []
        for (kind, what, oid, path), (detail, threads) in self.pending.items():
            cps = [c for c in self.reaching(oid) if self.log_of[c] & threads]
            found.append(Problem(kind, what, oid, path, detail, tuple(sorted(threads)),
                                 tuple(sorted(cps))))
        for pid, (kind, detail) in self.bad_packs.items():
            named, key = self.named_by.get(pid, set()), pack_key(pid)
            self.problem(kind, "pack", pid, key, detail, named, {
                c for p in found for c in p.checkpoints if p.path.startswith(key)
                or (p.kind == "missing" and named & set(p.threads))})
        self.report.problems.extend(found)
        order = {w: i for i, w in enumerate(("ref", "pack", "segment", "record", "node"))}
        self.report.problems.sort(key=lambda p: (order.get(p.what, 9), p.path, p.kind,
                                                 p.object or ""))

    def tick(self) -> None:
        self.done += 1
        if self.progress is not None and self.done % 256 == 0:
            self.progress(self.done, max(self.done, self.total))

    def hashed(self, what: str, n: int) -> None:
        stats = self.report.by_kind[what if what in self.report.by_kind else "node"]
        stats["hashed"] += 1
        stats["bytes_hashed"] += n


    def slots(self, key: str, want: tuple[str, ...]) -> None:
        """What the slots of a local ref just read hold, when they are not at rest as a
        finished update leaves them: a damaged slot is a problem (the head reads from the
        other), two valid slots a note (a writer stopped before it retired the older)."""
        reading = getattr(unwrap(self.backend), "ref_notes", {}).get(key)
        if reading is None or reading.live is None:
            return

        def name(head: bytes) -> str:
            try:
                return f"head {Head.decode(head, key).head}"
            except CasError:
                return f"a head of {len(head)} bytes"

        text = reading.describe(name)
        thread = repr(want[0]) if want else "THREAD"
        if reading.damaged:
            self.problem("corrupt", "ref", None, key, f"{text}. Loads read slot "
                         f"{reading.live.index}; the next save to the thread rewrites the "
                         f"damaged slot (or `cas-checkpoint repair-ref STORE {thread} "
                         f"--use-slot {reading.live.index}` now)", want)
        elif any(s.state == "valid" for s in reading.slots if s is not reading.slots[
                reading.live.index]):
            self.report.notes.append(
                f"ref {key}: {text}: a writer was stopped after writing the newer slot and "
                "before retiring the older; loads read the newer, and raise (not step back) if "
                "it is damaged before the next save to the thread, which settles it")

    def read_refs(self) -> Step[dict[str, Head]]:
        """Every ref (or the one asked for), read in parallel, decoded and checked."""
        keys = [] if self.thread_id is None else [thread_key(self.thread_id)]
        listed = (yield List(HEADS)) if self.thread_id is None else ()  # may raise
        for info in listed:
            name = info.key.rsplit("/", 1)[-1]
            if ".tmp-" in name or name.endswith(".lock"):
                continue  # a writer's temp or lock file
            if not info.regular:
                self.problem("unreadable", "ref", None, info.key, "not a regular file: a folder, "
                             "link or device where a ref belongs; move it away (gc refuses to "
                             "run while it is there)", verify_checks.key_thread(info.key))
            elif not verify_checks.is_key(info.key) and not (self.keys and is_sealed_key(info.key)):
                self.problem("stray", "ref", None, info.key, "named as no thread's ref: threads() "
                             "ignores it and gc refuses to run while it is there; move it away")
            else:
                keys.append(info.key)

        got = dict(zip(keys, (yield from verify_checks.read_each(keys)), strict=True))
        heads: dict[str, Head] = {}
        for key in sorted(keys):
            ref, want = got[key], verify_checks.key_thread(key)
            if ref is not None and not isinstance(ref, CasError):
                self.slots(key, want)
            if ref is None and self.thread_id is not None:
                raise NotFoundError(f"thread {self.thread_id!r} does not exist in "
                                    f"{self.backend.url}")
            if ref is None:  # deleted since the listing
                continue
            self.report.threads += 1
            if isinstance(ref, CasError):
                kind = ("undecodable" if isinstance(ref, FormatError) else
                        "corrupt" if isinstance(ref, IntegrityError) else "unreadable")
                self.problem(kind, "ref", None, key, str(ref), want)
                continue
            try:
                head = Head.decode(ref[0], key)
            except IntegrityError as exc:
                self.problem("corrupt", "ref", None, key, "its checksum does not hold (blake3 "
                             f"{exc.actual}, the ref says {exc.expected})", want)
                continue
            except FormatError as exc:
                self.problem("undecodable", "ref", None, key, str(exc), want)
                continue
            except InvalidArgumentError:  # sealed-head bytes in a store that has no key
                if self.keys is not None:
                    raise
                self.problem("undecodable", "ref", None, key, "its bytes begin as a sealed "
                             "(encrypted) ref's, in a store created without a key", want)
                continue
            if self.keys is not None and self.keys.keyless:
                pass  # a key-less audit cannot read whose thread a sealed ref is
            elif not verify_checks.belongs(head.thread_id, key, self.backend):
                self.problem("mismatch", "ref", head.head, key, f"it holds thread "
                             f"{head.thread_id[:200]!r}, not the thread of its key: it was "
                             "copied or tampered with", want)
                continue
            heads[key] = head
            for p in head.packs:
                self.named_by.setdefault(p.id, set()).add(head.thread_id)
        return heads

    def rounds(self, heads: dict[str, Head]) -> Iterable[list[tuple[str, Head]]]:
        """Threads in groups whose new packs are read in one round."""
        group: list[tuple[str, Head]] = []
        planned: set[str] = set()
        count = size = 0
        for key, head in heads.items():
            new = {p.id: p.size for p in head.packs if p.id not in planned}
            if group and (count + len(new) > PACK_BATCH or size + sum(new.values())
                          > BATCH_BYTES):
                yield group
                group, count, size = [], 0, 0
            group.append((key, head))
            planned.update(new)
            count, size = count + len(new), size + sum(new.values())
        if group:
            yield group

    def read_packs(self, pids: list[str]) -> Step[None]:
        """Each pack exists, hashes to its name and has an index (else a pack problem)."""
        if not pids:
            return
        try:
            got = yield GetMany([pack_key(p) for p in pids])
        except StorageError:  # which one? one at a time
            got = {}
            for pid in pids:
                try:
                    got.update((yield GetMany([pack_key(pid)])))
                except StorageError as exc:
                    self.bad_packs[pid] = ("unreadable", str(exc))
        for pid in pids:
            data = got.get(pack_key(pid))
            self.tick()
            self.packs[pid] = None
            if data is None:
                self.bad_packs.setdefault(pid, ("missing", "the pack does not exist; what its "
                                                "threads hold in no other pack is lost"))
                continue
            self.report.by_kind["pack"]["objects"] += 1
            self.hashed("pack", len(data))
            try:
                self.packs[pid] = parse_pack(pid, data, keys=self.keys)
            except IntegrityError as exc:
                self.bad_packs[pid] = ("corrupt", f"its bytes hash to {exc.actual}")
                try:  # its index may be intact: then the walk finds the damaged objects
                    self.packs[pid] = parse_pack(pid, data, trusted=True, keys=self.keys)
                except (FormatError, IntegrityError):
                    pass
            except FormatError as exc:
                self.bad_packs[pid] = ("undecodable", str(exc))

    def release(self, pid: str) -> None:
        """No thread left needs this pack: check the objects no walk took out of it (deep: all
        of them, or a ``sample``), then drop it."""
        pack, seen = self.packs.get(pid), self.located.pop(pid, {})
        if pack is None:
            return
        self.packs[pid] = None
        for prefix, locations in pack.index.items():
            for start, end in locations:
                data, actual = pack.data[start:end], seen.get(start)
                if actual is None:
                    if not self.deep or (self.sample is not None
                                         and self.rng.random() >= self.sample):
                        continue
                    actual = object_id(data)
                    self.hashed(verify_checks.what(data), end - start)
                if pack_prefix(actual) != prefix and (pid, start) not in self.flagged:
                    self.problem("corrupt", verify_checks.what(data), None,
                                 f"{pack_key(pid)} (object at "
                                 f"byte {start})", f"the pack files it under id prefix "
                                 f"{prefix:08x}, but its bytes hash to {actual}",
                                 self.named_by.get(pid, ()))


    def walk(self, key: str, head: Head) -> None:
        thread = head.thread_id
        packs = [pk for p in head.packs if (pk := self.packs.get(p.id)) is not None]
        inline: dict[str, bytes] = {object_id(d): d for d in head.inline}
        for p in head.packs:
            if (pack := self.packs.get(p.id)) is None:
                continue
            n = sum(map(len, pack.index.values()))
            if (p.size, p.count) != (pack.size, n):
                self.defer("mismatch", "pack", p.id, pack_key(p.id), f"the ref says {p.size} "
                           f"bytes and {p.count} objects; the pack has {pack.size} and {n}",
                           thread)
        bad = [p.id for p in head.packs if p.id in self.bad_packs]
        lost = pack_key(bad[0]) if bad else key
        why = "in none of the thread's packs nor its ref" + (
            f" ({len(bad)} of its packs are missing or damaged)" if bad else "")

        def find(oid: str, what: str, decode: Callable[[Any], Any]) -> Any:
            """The object decoded, taken where a load takes it; None (and a problem) if it is
            absent, damaged or undecodable."""
            self.reached.setdefault(oid, what)
            self.tick()
            data: Any = inline.get(oid)
            damaged: list[tuple[str, int, IntegrityError]] = []
            if data is not None:
                self.where.setdefault(oid, key)
            for pack in packs if data is None else ():
                if (data := self.take(pack, oid, what, damaged)) is not None:
                    self.where.setdefault(oid, pack_key(pack.id))
                    break
            if data is not None:
                return self.decode(what, oid, data, decode, thread)
            if damaged:  # named (by prefix) where it should be, with other bytes
                self.flagged.update((pid, at) for pid, at, _ in damaged)
                exc = damaged[0][2]
                self.defer("corrupt", what, oid, exc.path, f"its bytes hash to {exc.actual}",
                           thread)
            else:
                self.defer("missing", what, oid, lost, why, thread)
            return None

        entries, complete = self.log(key, head, find)
        ids = {e.id for e in entries}
        step = next((e.step for e in entries if e.id == head.head), None)
        if complete and head.head is not None and step is None:
            self.problem("dangling_ref", "ref", head.head, key, "the head is not in the "
                         "thread's log", [thread], [head.head])
        elif complete and head.head is not None and step != head.head_step:
            self.problem("mismatch", "ref", head.head, key, f"the ref says its head is at step "
                         f"{head.head_step}, its log entry says {step}", [thread])
        elif complete and head.head is None and ids:
            self.problem("dangling_ref", "ref", None, key, "the ref names no head but its log "
                         f"holds {len(ids)} checkpoints", [thread], ids)
        todo: list[str] = []
        for entry in entries:
            self.log_of.setdefault(entry.id, set()).add(thread)
            rec = find(entry.id, "record", Record.decode)
            if rec is None:
                continue
            if not verify_checks.same(stored := rec.entry(entry.id), entry):
                self.defer("mismatch", "record", entry.id, key, "the log entry and the record "
                           f"disagree on {verify_checks.diff(stored, entry)}", thread)
            self.link(rec.root, entry.id)
            if rec.root_node is None:
                todo.append(rec.root)
                continue
            self.where.setdefault(rec.root, self.where[entry.id])  # the record's hash covers it
            root = self.decode("node", rec.root, rec.root_node, verify_checks.node, thread)
            for child in root[0] if root else ():
                self.link(child, rec.root)
                todo.append(child)
        visited: set[str] = set()
        while todo:
            oid = todo.pop()
            if oid in visited:
                continue
            visited.add(oid)
            node = find(oid, "node", verify_checks.node)
            for child in node[0] if node else ():
                self.link(child, oid)
                if child not in visited:
                    todo.append(child)

    def take(self, pack: Pack, oid: str, what: str,
             damaged: list[tuple[str, int, IntegrityError]]) -> memoryview | None:
        """Object ``oid`` out of ``pack``, each location hashed once per run; None if the pack
        does not hold it (damaged locations under its id prefix go into ``damaged``)."""
        prefix = pack_prefix(oid)
        seen = self.located.setdefault(pack.id, {})
        for start, end in pack.index.get(prefix, ()):
            actual = seen.get(start)
            if actual is None:
                actual = seen[start] = object_id(pack.data[start:end])
                self.hashed(what, end - start)
            if actual == oid:
                return pack.data[start:end]
            if pack_prefix(actual) != prefix:  # not just another object of the same prefix
                damaged.append((pack.id, start, IntegrityError(
                    oid, actual, f"{pack_key(pack.id)} (object {oid})")))
        return None

    def decode(self, what: str, oid: str, data: Any, decode: Callable[[Any], Any],
               thread: str) -> Any:
        """An object decoded once per run (its bytes are its id); None and a problem if it does
        not decode."""
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
            start, ok, todo = len(entries), True, [(peak.id, 64)]
            while todo:
                oid, above = todo.pop()
                if oid in seen:  # hostile: would multiply the entries on every level
                    self.defer("mismatch", "segment", oid, key, "a log segment is named twice: "
                               "the log is corrupt or hostile", thread)
                    ok = False
                    continue
                seen.add(oid)
                seg = find(oid, "segment", Segment.decode)
                if seg is not None and seg.level >= above:
                    self.defer("mismatch", "segment", oid, key, "a log segment does not descend "
                               "in level: the log is corrupt", thread)
                    seg = None
                if seg is None:
                    ok = False
                    continue
                entries.extend(seg.entries)
                todo.extend((c, seg.level) for c in reversed(seg.children))
            top = self.decoded["segment"].get(peak.id)
            if top and ok and (len(entries) - start, top.level) != (peak.count, peak.level):
                self.defer("mismatch", "segment", peak.id, key, f"the ref says this log peak "
                           f"holds {peak.count} entries at level {peak.level}; it holds "
                           f"{len(entries) - start} at level {top.level}", thread)
            complete = complete and ok
        return entries + list(head.tail), complete


    def shapes(self) -> None:
        """Depth (longest path) and expansion (a shared node counts once per use) of every state
        tree against what a load allows, measured bottom-up once for all trees."""
        nodes = self.decoded["node"]
        records = {c: r for c in self.log_of if (r := self.decoded["record"].get(c))}
        height: dict[str, int] = {}
        grown: dict[str, int] = {}
        for root in {r.root for r in records.values()}:
            stack, opened = [root], set()
            while stack:  # post-order, no recursion
                x = stack[-1]
                node = nodes.get(x)
                kids = node[0] if node else ()
                if x in height:
                    stack.pop()
                elif x not in opened and any(c not in height for c in kids):
                    opened.add(x)
                    stack.extend(c for c in kids if c not in height)
                else:
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
        1 MB (those counted only as far as needed)."""
        if grown > min(LOAD_BUDGET, 2 * rec.size + (1 << 20)):
            return False
        need = (grown - (1 << 20)) / EXPANSION
        distinct, seen, stack = 0, {rec.root}, [rec.root]
        while stack and distinct < need:
            if node := self.decoded["node"].get(stack.pop()):
                distinct += node[1]
                fresh = [c for c in node[0] if c not in seen]
                seen.update(fresh)
                stack.extend(fresh)
        return distinct >= need


    def run(self) -> Step[VerifyReport]:
        t0 = time.perf_counter()
        heads = yield from self.read_refs()
        archived = list(dict.fromkeys(pack_key(h.archive.id) for h in heads.values() if h.archive))
        got = (yield GetMany(archived)) if archived else {}
        for key, head in heads.items():  # a long thread's archived packs: as named by its head
            if head.archive is not None:
                heads[key], bad = archive.flattened(head, got.get(pack_key(head.archive.id)),
                                                    parse_pack)
                for p in heads[key].packs:
                    self.named_by.setdefault(p.id, set()).add(head.thread_id)
                if bad is not None:
                    self.problem("unreadable", "archive", head.archive.id,
                                 pack_key(head.archive.id), bad, (head.thread_id,))
        if not self.deep:
            return (yield from self.quick(heads, t0))
        left: dict[str, int] = {}
        for head in heads.values():
            for pid in {p.id for p in head.packs}:
                left[pid] = left.get(pid, 0) + 1
            self.total += len(head.inline) + sum(p.count for p in head.packs)
        self.total += len(left)
        for group in self.rounds(heads):
            yield from self.read_packs(list(dict.fromkeys(
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
        r.objects, r.checkpoints = len(self.reached), len(self.log_of)
        r.objects_hashed = sum(k["hashed"] for k in r.by_kind.values())
        r.bytes_hashed = sum(k["bytes_hashed"] for k in r.by_kind.values())
        if self.thread_id is None:  # 256 prefixes listed at once (one request when small)
            listed = yield ListMany([f"{PREFIX}/{n:02x}" for n in range(256)])
            garbage = [i.size for i in listed
                       if (k := key_pack_id(i.key)) is not None and k not in self.named_by]
            r.unreachable_objects, r.unreachable_bytes = len(garbage), sum(garbage)
        r.seconds = time.perf_counter() - t0
        if self.progress is not None:
            self.progress(self.done, self.done)
        return r


    def quick(self, heads: dict[str, Head], t0: float) -> Step[VerifyReport]:
        """The quick audit: the refs (read, decoded, checked above) and, from a listing of the
        packs (a LIST page per 1,000 packs, no pack read), each pack they name present with the
        size its ref records."""
        r = self.report
        named = {p.id: p.size for head in heads.values() for p in head.packs}
        prefixes = sorted({f"{PREFIX}/{pid[:2]}" for pid in named})
        if self.thread_id is None:
            prefixes = [f"{PREFIX}/{n:02x}" for n in range(256)]
        listed = (yield ListMany(prefixes)) if prefixes else []
        sizes = {k: i.size for i in listed if (k := key_pack_id(i.key)) is not None}
        for head in heads.values():
            for p in head.packs:
                if p.id not in sizes:
                    self.bad_packs[p.id] = ("missing", "the pack does not exist; what its "
                                            "threads hold in no other pack is lost")
                elif sizes[p.id] != p.size:
                    self.bad_packs[p.id] = ("mismatch", f"the ref says {p.size} bytes; the "
                                            f"pack has {sizes[p.id]}")
        for pid, (kind, detail) in sorted(self.bad_packs.items()):
            self.problem(kind, "pack", pid, pack_key(pid), detail, self.named_by.get(pid, ()))
        r.by_kind["pack"]["objects"] = len(named)
        r.checkpoints = sum(head.count for head in heads.values())
        if self.thread_id is None:
            garbage = [i.size for i in listed
                       if (k := key_pack_id(i.key)) is not None and k not in self.named_by]
            r.unreachable_objects, r.unreachable_bytes = len(garbage), sum(garbage)
        r.seconds = time.perf_counter() - t0
        if self.progress is not None:
            self.progress(len(heads), len(heads))
        return r


def verify(backend: Backend, refs: RefStore, *, deep: bool = True, sample: float | None = None,
           thread_id: str | None = None, progress: Progress | None = None
           ) -> Step[VerifyReport]:
    """The audit of the store behind ``backend`` (see the module docstring), as a step for
    ``ops.run(step, backend)`` or ``await ops.arun(step, backend)``; the arguments are checked
    now, before any I/O. ``refs`` is the store's RefStore: only its keys are used (an encrypted
    store's), the audit reads refs and packs from storage, never from a cache. Key-less
    (``encryption='keyless'``), the audit checks what needs no key: every ref under
    ``refs/heads`` is a regular file with a readable clear part, and every pack it names
    exists and hashes to its name; it cannot check a ref's seal, thread id or log, nor any
    object inside a pack. ``progress`` is called from the step (on the event
    loop's thread under ``arun``)."""
    keys = refs.objects.keyring
    if deep and keys is not None and keys.keyless:
        raise InvalidArgumentError(
            "a deep verify decrypts every object: open the store with its key "
            "(encryption=Key.from_env('CAS_KEY')); key-less, verify(deep=False) checks the "
            "refs' pack lists and the packs' names")
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
                  progress=progress, keys=keys).run()


__all__ = ["Problem", "Progress", "VerifyReport", "verify"]
