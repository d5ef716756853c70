"""A thread's writer deletes the packs its own commits stopped naming (issue 29, "garbage bounded
without anyone running gc"). Pure bookkeeping for ``RefStore.update``, which does the I/O.

A merge (``staging.stage``) replaces packs a head named by one pack that holds all their objects;
an archive replaces its list; a repack replaces every pack. Until now the packs replaced stayed
on storage until ``gc``. Now the writer whose compare-and-swap replaced head H by head H'
remembers the packs H named and H' does not (``replaced``), and deletes them once it has
committed ``COMMITS`` later heads of the thread and ``MIN_GRACE`` seconds have passed, or once
``grace`` seconds have passed, whichever comes first, on its own monotonic clock
(``Collector``): a fast writer collects within a fraction of a turn, a slow one as before.

Who may still need such a pack, and why deleting it then is safe:

* **a reader of the old head** read H before the commit (after it, the ref says H'). It gets
  its data, or re-reads the ref and gets a newer state: a thread's reads (load, history,
  find, read_part, load_many, the LangGraph saver's get_tuple and list) run in
  ``Core.at_ref``, which, when something its ref named is gone and the ref moved, reads the
  ref again and retries (as after a repack and a gc); only a ref that still names what is
  missing is damage. The grace bounds how often a reader retries, not whether it is right:
  ``COMMITS`` later commits are at least ``COMMITS`` compare-and-swaps, each a round trip to
  the storage (an fdatasync on local disk), while a reader needs two rounds (the ref, then
  its packs) whatever the storage; a reader slower than that, or than ``grace`` seconds, tries
  again on the newer head (up to ``locate.LOAD_RETRIES`` times, then a ``StorageError`` that
  says to read again). Only intervals on the writer's own clock and its own commits are
  counted, so clocks of other machines do not matter.
* **another writer of the thread** that read H and merges its packs: its compare-and-swap
  against H fails; a merge that finds a part gone reads the ref again and stages anew
  (``RefStore.update``).
* **a writer whose compare-and-swap lost**: its packs were never named by a committed head:
  never on the list (gc takes them).
* **another thread's ref naming the same pack** (packs are shared by forks, copies and
  imports): before such a ref is written, the source thread's newest head is marked to hold
  the packs it names (``RefStore.hold``, a compare-and-swap: ``held``), and the new head holds
  them too. A pack either head held is never put on the list: gc decides. (The mark is made on
  the source's newest head, so the new thread never names a pack already on a list.)
* **a later head naming the same pack again** (the same bytes): a pack is deleted only if the
  thread's newest head this writer committed does not name it.

A process that stops keeps its list in memory only: what it had not deleted yet is gc's, as
before. The list is bounded (``MAX_PENDING`` packs; more are left to gc).

``grace`` is ``RefStore.collect_after`` (seconds; ``None``: never delete, leave all to gc),
``commits`` ``RefStore.collect_commits`` (``None``: by time only).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from cas_checkpoint.engine.archive import ARCHIVE_LEVEL
from cas_checkpoint.engine.live import is_live
from cas_checkpoint.format.heads import Head, named
from cas_checkpoint.format.objects import ObjectId

GRACE = 10.0  # seconds after a commit by which the packs it stopped naming are deleted
COMMITS = 16  # ... or sooner: once this writer committed this many later heads of the thread
MIN_GRACE = 0.01  # (and at least this many seconds passed)
MAX_PENDING = 100_000  # packs a writer remembers to delete (more are left to gc)


def replaced(old: Head, new: Head) -> list[ObjectId]:
    """The packs ``old`` named that ``new`` (the head that replaced it) does not, and that
    neither marks held (shared with another thread's ref). When ``new`` has a new archive, the
    packs of archive level that ``old`` named may be listed there: not those (at worst, a
    merge's part left to gc)."""
    if old.packs == new.packs and old.archive == new.archive:
        return []  # (most commits: the same packs, new objects inline)
    gone = named(old) - named(new) - old.held - new.held
    if new.archive is not None and new.archive != old.archive:
        gone -= {p.id for p in old.packs if not is_live(p) and p.level >= ARCHIVE_LEVEL}
    return sorted(gone)


@dataclass(slots=True)
class _Dropped:
    """The packs one commit stopped naming: when (monotonic seconds), of which thread, after
    how many of this writer's commits of it; ``done`` once handed out."""

    at: float
    thread: str
    seq: int
    packs: list[ObjectId]
    done: bool = False


class Collector:
    """A store object's list of packs its commits stopped naming, and when."""

    def __init__(self, min_grace: float = MIN_GRACE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.min_grace, self.clock = min_grace, clock
        self.pending: deque[_Dropped] = deque()  # every thread's, oldest first
        self.per_thread: dict[str, deque[_Dropped]] = {}
        self.seq: dict[str, int] = {}  # thread -> this writer's commits of it (while pending)
        self.count = 0
        self.newest: dict[str, frozenset[ObjectId]] = {}  # thread -> packs its newest head names
        self.lock = threading.Lock()

    def committed(self, old: Head | None, new: Head, grace: float | None) -> None:
        """``new`` replaced ``old`` (this writer's compare-and-swap): remember what it dropped."""
        if grace is None:
            return
        thread = new.thread_id
        gone = [] if old is None else replaced(old, new)
        with self.lock:
            waiting = thread in self.per_thread
            if not gone and not waiting:
                return  # (nothing of this thread to count commits for)
            self.newest[thread] = named(new) | new.held
            seq = self.seq[thread] = self.seq.get(thread, 0) + 1
            if gone and self.count + len(gone) <= MAX_PENDING:
                entry = _Dropped(self.clock(), thread, seq, gone)
                self.pending.append(entry)
                self.per_thread.setdefault(thread, deque()).append(entry)
                self.count += len(gone)
            elif not waiting:
                self.newest.pop(thread, None)
                self.seq.pop(thread, None)

    def ripe(self, grace: float | None, thread: str | None = None,
             commits: int | None = COMMITS) -> list[ObjectId]:
        """The packs to delete now: dropped ``grace`` seconds ago or more, or (of ``thread``,
        the one just committed) dropped ``commits`` of its commits ago (None: by time only)
        and ``min_grace`` seconds ago or more; and not named (again) by their thread's newest
        head this writer committed."""
        if grace is None or not self.pending:
            return []
        out: list[ObjectId] = []
        now = self.clock()
        with self.lock:
            taken: list[_Dropped] = []
            while self.pending and (self.pending[0].done or now - self.pending[0].at >= grace):
                entry = self.pending.popleft()
                if not entry.done:
                    entry.done = True
                    taken.append(entry)
            mine = self.per_thread.get(thread) if thread is not None else None
            if mine and commits is not None:
                seq = self.seq.get(thread, 0)  # type: ignore[arg-type]
                for entry in mine:
                    if entry.done:
                        continue
                    if seq - entry.seq < commits or now - entry.at < self.min_grace:
                        break  # (in commit order: the later ones are younger still)
                    entry.done = True
                    taken.append(entry)
            for entry in taken:
                self.count -= len(entry.packs)
                keep = self.newest.get(entry.thread, frozenset())
                out.extend(p for p in entry.packs if p not in keep)
                entry.packs = []  # (a done entry waits in ``pending`` until it is the oldest)
            for name in {e.thread for e in taken}:
                queue = self.per_thread.get(name)
                while queue and queue[0].done:
                    queue.popleft()
                if not queue:  # (nothing left to check against)
                    self.per_thread.pop(name, None)
                    self.newest.pop(name, None)
                    self.seq.pop(name, None)
        return out
