"""A thread's writer deletes the packs its own commits stopped naming (issue 29, "garbage bounded
without anyone running gc"). Pure bookkeeping for ``RefStore.update``, which does the I/O.

A merge (``staging.stage``) replaces packs a head named by one pack that holds all their objects;
an archive replaces its list; a repack replaces every pack. Until now the packs replaced stayed
on storage until ``gc``. Now the writer whose compare-and-swap replaced head H by head H'
remembers the packs H named and H' does not (``replaced``), and deletes them once ``grace``
seconds have passed on its own monotonic clock since that commit (``Collector``).

Who may still need such a pack, and why deleting it then is safe:

* **a reader of the old head** read H before the commit (after it, the ref says H'), so it has
  had ``grace`` seconds to fetch H's packs. One slower than that finds a pack gone and reads
  the ref again (``Core.load`` retries, as after a repack and a gc). Only an interval on the
  writer's own clock is measured, so clocks of other machines do not matter; this is gc's
  rule (``maintenance/gc.py``: unreachable and older than a grace period), with the moment the pack
  became unreachable known exactly instead of bounded by its modified time.
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

``grace`` is ``RefStore.collect_after`` (seconds; ``None``: never delete, leave all to gc).
"""

from __future__ import annotations

import threading
import time
from collections import deque

from cas_checkpoint.engine.archive import ARCHIVE_LEVEL
from cas_checkpoint.engine.live import is_live
from cas_checkpoint.format.heads import Head, named
from cas_checkpoint.format.objects import ObjectId

GRACE = 10.0  # seconds between a commit and the deletion of the packs it stopped naming
MAX_PENDING = 100_000  # packs a writer remembers to delete (more are left to gc)


def replaced(old: Head, new: Head) -> list[ObjectId]:
    """The packs ``old`` named that ``new`` (the head that replaced it) does not, and that
    neither marks held (shared with another thread's ref). When ``new`` has a new archive, the
    packs of archive level that ``old`` named may be listed there: not those (at worst, a
    merge's part left to gc)."""
    gone = named(old) - named(new) - old.held - new.held
    if new.archive is not None and new.archive != old.archive:
        gone -= {p.id for p in old.packs if not is_live(p) and p.level >= ARCHIVE_LEVEL}
    return sorted(gone)


class Collector:
    """A store object's list of packs its commits stopped naming, and when."""

    def __init__(self) -> None:
        self.pending: deque[tuple[float, str, list[ObjectId]]] = deque()
        self.count = 0
        self.newest: dict[str, frozenset[ObjectId]] = {}  # thread -> packs its newest head names
        self.lock = threading.Lock()

    def committed(self, old: Head | None, new: Head, grace: float | None) -> None:
        """``new`` replaced ``old`` (this writer's compare-and-swap): remember what it dropped."""
        if grace is None:
            return
        with self.lock:
            self.newest[new.thread_id] = named(new) | new.held
            if old is None:
                return
            gone = replaced(old, new)
            if gone and self.count + len(gone) <= MAX_PENDING:
                self.pending.append((time.monotonic(), new.thread_id, gone))
                self.count += len(gone)

    def ripe(self, grace: float | None) -> list[ObjectId]:
        """The packs to delete now: dropped ``grace`` seconds ago or more, and not named
        (again) by their thread's newest head this writer committed."""
        if grace is None or not self.pending:
            return []
        out: list[ObjectId] = []
        now = time.monotonic()
        with self.lock:
            while self.pending and now - self.pending[0][0] >= grace:
                _, thread, gone = self.pending.popleft()
                self.count -= len(gone)
                keep = self.newest.get(thread, frozenset())
                out.extend(p for p in gone if p not in keep)
            if not self.pending:
                self.newest.clear()  # (nothing left to check against)
        return out
