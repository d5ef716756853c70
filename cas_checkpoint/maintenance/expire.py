"""Thread expiry: delete the refs of threads nobody has saved to for a while (a time-to-live
per thread, as the Redis, MongoDB and DynamoDB savers and LangGraph's ``ThreadTTLConfig`` give).

Rule: expiry edits refs only, each by compare-and-swap on the version it judged (a thread saved
to meanwhile is kept); gc then reclaims what only the expired threads reached. A thread is idle
when neither its ref was written (a save, a fork, a prune) nor its newest checkpoint created
within ``idle_for``. Cost: one listing of the refs and the storage's clock (gc lists those too,
and the packs), one batched read of the refs that look idle by their modified time, and for a
thread whose newest entry is not in its head (or, with ``keep_labeled``/``keep_tags``, whose
log is not) the packs its log segments are in; then one conditional delete per expired thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from cas_checkpoint.backends import Backend, ObjectInfo
from cas_checkpoint.engine.refs import (
    HEADS,
    Ref,
    RefStore,
    is_hashed_key,
    is_thread_key,
    thread_from_key,
)
from cas_checkpoint.engine.retention import check_tags
from cas_checkpoint.engine.steps import List, ReadRefs, Step
from cas_checkpoint.errors import CasError, InvalidArgumentError
from cas_checkpoint.format.heads import Head
from cas_checkpoint.format.objects import LogEntry, ObjectId
from cas_checkpoint.format.sealing import is_sealed_key
from cas_checkpoint.humanize import plural
from cas_checkpoint.maintenance.gc import storage_now

BATCH = 1000  # refs read per ReadRefs
KEPT = ("recent", "saved_meanwhile", "labeled", "tagged", "grouped")
"""Why a thread was kept: its ref or newest checkpoint is recent, it was saved to while expire
ran, it has a labelled checkpoint (``keep_labeled``), a tag of ``keep_tags``, or it is idle but
another thread of its ``group`` stays."""


@dataclass(frozen=True, slots=True)
class ExpiredThread:
    thread_id: str
    newest: float  # created_at of its newest checkpoint (seconds since the epoch)
    checkpoints: int


@dataclass(slots=True)
class ExpireReport:
    """``expired``: thread id -> what it held; ``kept``: threads kept per reason (``KEPT``);
    ``requests``: storage requests by kind (list, get, put, delete)."""

    dry_run: bool
    idle_for: timedelta
    expired: dict[str, ExpiredThread] = field(default_factory=dict)
    kept: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KEPT, 0))
    requests: dict[str, int] = field(
        default_factory=lambda: {"list": 0, "get": 0, "put": 0, "delete": 0})

    @property
    def checkpoints(self) -> int:
        return sum(t.checkpoints for t in self.expired.values())

    def to_dict(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "idle_for_seconds": self.idle_for.total_seconds(),
                "expired": sorted(self.expired), "checkpoints": self.checkpoints,
                "kept": dict(self.kept), "requests": dict(self.requests)}

    def to_text(self, *, by_thread: bool = False) -> str:
        """The total first; then, with ``by_thread``, a line per expired thread."""
        verb = "would expire" if self.dry_run else "expired"
        why = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in self.kept.items() if n)
        lines = [f"total: {verb} {plural(len(self.expired), 'thread')} "
                 f"({plural(self.checkpoints, 'checkpoint')}) idle for "
                 f"{_span(self.idle_for)} or more; "
                 f"kept {sum(self.kept.values())} ({why or 'none'})"
                 + ("" if self.dry_run or not self.expired
                    else "; run gc to reclaim their bytes")]
        if by_thread:
            lines += [f"{t}: {plural(e.checkpoints, 'checkpoint')}, newest "
                      f"{datetime.fromtimestamp(e.newest, UTC).isoformat(timespec='seconds')}"
                      for t, e in sorted(self.expired.items())]
        return "\n".join(lines)


def _span(t: timedelta) -> str:
    """``30d``, ``12h``, ``1h30m``, ``45s``: as the command line's ``--idle`` takes it."""
    left, out = int(t.total_seconds()), ""
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= n:
            out += f"{left // n}{unit}"
            left %= n
    return out or "0s"


def check_idle(idle_for: object) -> timedelta:
    if not isinstance(idle_for, timedelta) or idle_for < timedelta(0):
        raise InvalidArgumentError(f"idle_for must be a non-negative timedelta, e.g. "
                                   f"idle_for=timedelta(days=30), not {idle_for!r}")
    return idle_for


class _Keep(Exception):
    pass


def _newest(refs: RefStore, head: Head) -> Step[LogEntry | None]:
    if head.tail:
        return head.tail[-1]
    if not head.peaks:
        return None
    return next(iter((yield from refs.newest_first(head))), None)


def _why_kept(refs: RefStore, head: Head, cutoff: float, keep_labeled: bool,
              keep_tags: frozenset[str]) -> Step[tuple[str | None, LogEntry | None]]:
    """(None, the newest entry) if the thread may go, else (the reason it stays, None)."""
    newest = yield from _newest(refs, head)
    if newest is not None and newest.created_at >= cutoff:
        return "recent", None
    if keep_labeled or keep_tags:
        for e in (yield from refs.entries(head)):
            if keep_labeled and e.label is not None:
                return "labeled", None
            if keep_tags.intersection(e.tags):
                return "tagged", None
    return None, newest


def expire(backend: Backend, refs: RefStore, *, idle_for: timedelta, dry_run: bool = False,
           keep_labeled: bool = False, keep_tags: Iterable[str] = (),
           thread_id: str | None = None, only: Callable[[str], bool] | None = None,
           group: Callable[[str], str | None] | None = None) -> Step[ExpireReport]:
    """Delete the refs of idle threads (every thread, or ``thread_id`` alone, or those whose
    id ``only`` accepts: an integration's own threads). Threads ``group`` maps to one key (not
    None) go together: only when every one of them is idle (a LangGraph thread's namespaces)."""
    idle = check_idle(idle_for)
    tags = check_tags(keep_tags)
    if not isinstance(dry_run, bool) or not isinstance(keep_labeled, bool):
        raise InvalidArgumentError(f"dry_run and keep_labeled must be True or False, not "
                                   f"{dry_run!r} and {keep_labeled!r}")
    report = ExpireReport(dry_run, idle)
    req = report.requests
    now = yield from storage_now(backend, req)
    cutoff = now - idle.total_seconds()
    listed: list[ObjectInfo] = yield List(HEADS)  # an error propagates: never "nothing idle"
    req["list"] += 1 + len(listed) // 1000
    keys: list[str] = []
    recent: list[str] = []
    for info in listed:
        if info.regular and is_thread_key(info.key):
            (recent if info.mtime >= cutoff else keys).append(info.key)
    if thread_id is not None:
        wanted = refs.stored_key(thread_id)
        keys, recent = [k for k in keys if k == wanted], []
    busy: set[str] = set()  # groups with a thread that stays
    if group is not None:  # the groups of recent refs: named in their keys, else in their heads
        unnamed = []
        for key in recent:
            name = None if is_hashed_key(key) or is_sealed_key(key) else thread_from_key(key)
            if name is None:
                unnamed.append(key)
            elif (only is None or only(name)) and (g := group(name)) is not None:
                busy.add(g)
        for _key, head, _version in (yield from _refs(unnamed, req)):
            if (only is None or only(head.thread_id)) and (g := group(head.thread_id)):
                busy.add(g)
    report.kept["recent"] += len(recent)
    judged: list[tuple[Ref, LogEntry]] = []
    for _key, head, version in (yield from _refs(keys, req)):
        if head.head is None or (only is not None and not only(head.thread_id)):
            continue
        why, newest = yield from _why_kept(refs, head, cutoff, keep_labeled, tags)
        if why is not None or newest is None:
            report.kept[why or "recent"] += 1
            if group is not None and (g := group(head.thread_id)) is not None:
                busy.add(g)
        else:
            judged.append((Ref(head, version), newest))
    for ref, newest in judged:
        g = None if group is None else group(ref.head.thread_id)
        if g is not None and g in busy:
            report.kept["grouped"] += 1
        else:
            yield from _expire_one(refs, ref, newest, report)
    return report


def _refs(keys: list[str], req: dict[str, int]) -> Step[list[tuple[str, Head, str]]]:
    """(key, head, version) of the refs under ``keys`` that exist and decode, read in batches
    (a damaged ref is left alone: verify names it)."""
    out = []
    for start in range(0, len(keys), BATCH):
        batch = keys[start:start + BATCH]
        got: list[tuple[bytes, str] | None] = yield ReadRefs(batch)
        req["get"] += len(batch)
        for key, one in zip(batch, got, strict=True):
            if one is None:
                continue  # deleted meanwhile
            try:
                out.append((key, Head.decode(one[0], key), one[1]))
            except CasError:
                continue
    return out


def _expire_one(refs: RefStore, ref: Ref, newest: LogEntry, report: ExpireReport
                ) -> Step[None]:
    thread = ref.head.thread_id
    if not report.dry_run:
        def change(cur: Ref | None) -> Step[tuple[Head | None, dict[ObjectId, bytes]]]:
            if cur is None or cur.version != ref.version:  # saved to (or edited) meanwhile
                raise _Keep
            return None, {}
            yield  # pragma: no cover - a step

        try:
            yield from refs.update(thread, change, current=ref)
        except _Keep:
            report.kept["saved_meanwhile"] += 1
            return
        finally:
            report.requests["delete"] += 1
    report.expired[thread] = ExpiredThread(thread, newest.created_at, ref.head.count)
