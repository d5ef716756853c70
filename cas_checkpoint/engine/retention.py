"""Retention: which checkpoints a policy keeps (last N, recent, labelled, tagged), for ``prune``
and for ``open(keep_last=N)`` on save.
Rule: retention edits refs only (by compare-and-swap) and deletes no object; gc reclaims bytes."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from cas_checkpoint.engine.model import check_id
from cas_checkpoint.engine.refs import LEAF, Ref, RefStore, build
from cas_checkpoint.engine.steps import Step
from cas_checkpoint.errors import InvalidArgumentError, NotFoundError
from cas_checkpoint.format.heads import Head
from cas_checkpoint.format.objects import CheckpointId, LogEntry, ObjectId
from cas_checkpoint.humanize import plural


@dataclass(frozen=True, slots=True)
class ThreadPrune:
    """What prune kept and removed in one thread (ids oldest first)."""

    thread_id: str
    kept: tuple[CheckpointId, ...]
    removed: tuple[CheckpointId, ...]
    reasons: dict[str, int] = field(default_factory=dict)  # kept checkpoints per rule


RULES = ("head", "last", "recent", "labeled", "tagged")
"""Why a checkpoint is kept, in the order rules are tried (each is counted under the first)."""


@dataclass(frozen=True, slots=True)
class PruneReport:
    dry_run: bool
    threads: dict[str, ThreadPrune] = field(default_factory=dict)

    @property
    def kept(self) -> int:
        return sum(len(t.kept) for t in self.threads.values())

    @property
    def removed(self) -> int:
        return sum(len(t.removed) for t in self.threads.values())

    @property
    def reasons(self) -> dict[str, int]:
        """Kept checkpoints per rule (``head``, ``last``, ``recent``, ``labeled``,
        ``tagged``), each counted under the first rule that keeps it."""
        out = dict.fromkeys(RULES, 0)
        for t in self.threads.values():
            for rule, n in t.reasons.items():
                out[rule] += n
        return out

    def to_text(self, *, by_thread: bool = True) -> str:
        """The total first; then, with ``by_thread``, a line per thread."""
        verb = "would remove" if self.dry_run else "removed"
        why = ", ".join(f"{n} {rule}" for rule, n in self.reasons.items() if n)
        lines = [f"total: kept {self.kept} ({why or 'none'}), {verb} {self.removed} "
                 f"{'checkpoint' if self.removed == 1 else 'checkpoints'} in "
                 f"{plural(len(self.threads), 'thread')} (objects stay until repack and gc)"]
        if by_thread:
            lines += [f"{t}: kept {len(p.kept)}, {verb} {len(p.removed)}"
                      for t, p in sorted(self.threads.items())]
        return "\n".join(lines)


def select(entries: list[LogEntry], head_id: CheckpointId | None, *, keep_last: int | None,
           older_than: timedelta | None, keep_labeled: bool, now: float,
           keep_tags: frozenset[str] = frozenset(), reasons: dict[str, int] | None = None,
           ) -> tuple[list[LogEntry], list[LogEntry]]:
    """(kept, removed), both in log order. A checkpoint is kept if any rule keeps it: it is the
    head; it is one of the last ``keep_last``; it was created less than ``older_than`` before
    ``now``; it has a label (with ``keep_labeled``); it has one of ``keep_tags``. ``reasons``
    collects how many each rule kept (counted under the first)."""
    cutoff = None if older_than is None else now - older_than.total_seconds()
    n = len(entries)
    kept: list[LogEntry] = []
    removed: list[LogEntry] = []
    for i, e in enumerate(entries):
        rule = ("head" if e.id == head_id
                else "last" if keep_last is not None and i >= n - keep_last
                else "recent" if cutoff is not None and e.created_at >= cutoff
                else "labeled" if keep_labeled and e.label is not None
                else "tagged" if keep_tags.intersection(e.tags)
                else None)
        if rule is None:
            removed.append(e)
        else:
            kept.append(e)
            if reasons is not None:
                reasons[rule] = reasons.get(rule, 0) + 1
    return kept, removed


def check_tags(keep_tags: object) -> frozenset[str]:
    if isinstance(keep_tags, str) or not isinstance(keep_tags, Iterable):
        raise InvalidArgumentError("keep_tags must be a list of tags, e.g. keep_tags=['milestone']")
    tags = frozenset(keep_tags)
    if not all(isinstance(t, str) for t in tags):
        raise InvalidArgumentError("every tag in keep_tags must be a str")
    return tags


def check_policy(keep_last: object, older_than: object) -> None:
    if keep_last is None and older_than is None:
        raise InvalidArgumentError("prune needs a policy: pass keep_last=N and/or "
                                   "older_than=timedelta(...)")
    if keep_last is not None and (not isinstance(keep_last, int) or isinstance(keep_last, bool)
                                  or keep_last < 0):
        raise InvalidArgumentError(f"keep_last must be a non-negative int, not {keep_last!r}")
    if older_than is not None and (not isinstance(older_than, timedelta)
                                   or older_than < timedelta(0)):
        raise InvalidArgumentError(f"older_than must be a non-negative timedelta, not "
                                   f"{older_than!r}")


class _Gone(Exception):
    pass


class _Unchanged(Exception):
    pass


def prune_thread(refs: RefStore, thread_id: str, *, keep_last: int | None,
                 older_than: timedelta | None, keep_labeled: bool, dry_run: bool,
                 now: float, keep_tags: frozenset[str] = frozenset()
                 ) -> Step[ThreadPrune | None]:
    """Prune one thread by compare-and-swap (None if the thread does not exist)."""
    ref = yield from refs.read(thread_id)
    if ref is None or ref.head.head is None:
        return None
    policy: dict[str, Any] = {"keep_last": keep_last, "older_than": older_than,
                              "keep_labeled": keep_labeled, "now": now, "keep_tags": keep_tags}
    reasons: dict[str, int] = {}
    kept, removed = select((yield from refs.entries(ref.head)), ref.head.head, reasons=reasons,
                           **policy)
    if not dry_run and removed:
        def change(cur: Ref | None) -> Step[tuple[Head | None, dict[ObjectId, bytes]]]:
            nonlocal kept, removed
            if cur is None or cur.head.head is None:
                raise _Gone
            reasons.clear()
            kept, removed = select((yield from refs.entries(cur.head)), cur.head.head,
                                   reasons=reasons, **policy)
            if not removed:
                raise _Unchanged
            return (yield from refs.rebuilt(cur.head, kept, cur.head.head))

        try:
            yield from refs.update(thread_id, change, current=ref)
        except _Gone:
            return None
        except _Unchanged:
            pass
    return ThreadPrune(thread_id, tuple(e.id for e in kept), tuple(e.id for e in removed),
                       dict(reasons))


def prune(refs: RefStore, threads: Iterable[str], *, keep_last: int | None,
          older_than: timedelta | None, keep_labeled: bool, dry_run: bool,
          keep_tags: Iterable[str] = ()) -> Step[PruneReport]:
    check_policy(keep_last, older_than)
    tags = check_tags(keep_tags)
    now = time.time()
    report = PruneReport(dry_run)
    for thread in threads:
        got = yield from prune_thread(refs, thread, keep_last=keep_last, older_than=older_than,
                           keep_labeled=keep_labeled, dry_run=dry_run, now=now, keep_tags=tags)
        if got is not None:
            report.threads[thread] = got
    return report


Retain = Callable[[list[LogEntry]], list[LogEntry]]
"""Which entries of a log (oldest first, the new head's last) a save keeps: an integration's
own rule (the LangGraph saver's shallow mode), applied in the save's compare-and-swap."""

KEEP_MODES = ("batch", "exact")


def check_mode(keep_mode: object) -> str:
    if keep_mode not in KEEP_MODES:
        raise InvalidArgumentError(f"keep_mode must be 'batch' (prune every few saves past "
                                   f"keep_last: cheaper) or 'exact' (never more than keep_last "
                                   f"checkpoints, and the labelled ones), not {keep_mode!r}")
    return str(keep_mode)


def save_slack(keep_last: int) -> int:
    """Prune-on-save runs when a thread reaches keep_last + a multiple of this."""
    return max(LEAF, keep_last // 4)


def prune_due(count: int, keep_last: int | None, exact: bool = False) -> bool:
    """Whether a save that brought a thread to ``count`` checkpoints should prune it: with
    ``exact``, whenever it holds more than ``keep_last``; else every ``save_slack`` saves past
    ``keep_last`` (so the log rebuild is amortised, even when labelled checkpoints keep the
    thread longer than keep_last)."""
    if keep_last is None or count <= keep_last:
        return False
    return exact or (count - keep_last) % save_slack(keep_last) == 0


def pruned_head(refs: RefStore, head: Head, entry: LogEntry, keep_last: int | None,
                new: dict[ObjectId, bytes], retain: Retain | None = None) -> Step[Head]:
    """``head`` plus ``entry`` (the new head), keeping what ``retain`` keeps of its log, then
    of those its last ``keep_last`` checkpoints and the labelled ones; new segments go into
    ``new``."""
    kept = (yield from refs.entries(head)) + [entry]
    if retain is not None:
        kept = [e for e in retain(kept) if e.id != entry.id] + [entry]
    if keep_last is not None:
        kept, _ = select(kept, entry.id, keep_last=keep_last, older_than=None,
                         keep_labeled=True, now=0.0)
    return build(head, kept, entry.id, new)


def check_ids(checkpoint_ids: tuple[object, ...]) -> frozenset[CheckpointId]:
    if not checkpoint_ids:
        raise InvalidArgumentError("delete needs the checkpoints to remove: "
                                   "delete(thread_id, checkpoint_id, ...)")
    return frozenset(check_id(c) for c in checkpoint_ids)


def removal(refs: RefStore, thread_id: str, ids: frozenset[CheckpointId]
            ) -> Callable[[Ref | None], Step[tuple[Head | None, dict[ObjectId, bytes]]]]:
    """The change that removes exactly ``ids`` from a thread's log, for one compare-and-swap
    (run again on the log a lost race finds, so entries saved meanwhile stay). Every id must be
    in the log, else NotFoundError and nothing changes. A removed head moves to its nearest
    ancestor that stays (through removed parents), else to the newest entry that stays; removing
    every entry deletes the thread."""
    def change(ref: Ref | None) -> Step[tuple[Head | None, dict[ObjectId, bytes]]]:
        if ref is None or ref.head.head is None:
            raise NotFoundError(f"thread {thread_id!r} does not exist; threads() lists the "
                                "threads there are")
        entries = yield from refs.entries(ref.head)
        by_id = {e.id: e for e in entries}
        missing = sorted(ids - by_id.keys())
        if missing:
            raise NotFoundError(
                f"checkpoint {missing[0]} is not in thread {thread_id!r}"
                + (f" (nor are {len(missing) - 1} more of those given)" if len(missing) > 1
                   else "")
                + f"; nothing was deleted; history({thread_id!r}) lists its checkpoints")
        kept = [e for e in entries if e.id not in ids]
        if not kept:
            return None, {}
        head_id = ref.head.head
        todo, seen = [head_id], set()
        while head_id in ids and todo:  # breadth first through the removed ancestors
            cid = todo.pop(0)
            if cid in seen or cid not in by_id:
                continue
            seen.add(cid)
            if cid not in ids:
                head_id = cid
                break
            todo.extend(by_id[cid].parents)
        if head_id in ids:
            head_id = kept[-1].id
        return (yield from refs.rebuilt(ref.head, kept, head_id))

    return change
