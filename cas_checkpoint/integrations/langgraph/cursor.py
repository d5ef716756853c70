"""A LangGraph namespace's log read newest first, only as far as a question needs.

LangGraph's "latest" checkpoint is the one with the greatest id (uuid6: time-ordered), which
need not be the newest entry (a copied thread, a put that names an older parent). So that the
answer is exact without reading the whole log, every checkpoint entry records ``lgm``: the
greatest LangGraph id of the log up to and including itself, computed inside the
compare-and-swap on the very head it extends (``Steps._stamp``), so it is exact whatever other
writers do. Deleting entries (prune, delete_for_runs) can only make it an overstatement: an
upper bound. Reading newest first, after a checkpoint entry the ids of every older entry are at
most its ``lgm``; a question stops as soon as what it found beats that bound:

* the latest checkpoint: at the entry holding it (normally the newest checkpoint entry, after
  the pending writes of the current step);
* a checkpoint by id: at it, or when the bound falls below the id;
* the k greatest ids (``list(limit=k)``): when the k-th beats the bound.

A checkpoint's pending writes are mostly entries after it, so among the entries read to reach
it. Not all: LangGraph's loop runs ``put(M)`` in the background while the next step's tasks run,
so a task's ``put_writes`` for M can land before M's entry ("early"). Each save therefore
carries, in the newest entry, ``lge``: the checkpoints with early writes not yet put, each with
the store id of the entry before its first early write; ``put(M)`` takes M's out of it and
records it in M's entry as ``lgw``, and a reader of M's writes goes on back to that entry.

Entries written before ``lgm`` existed give no bound: a read over them goes on to the end of
the log (the full walk of old), and the first put on such a thread walks it once to record an
exact ``lgm``; from then on reads stop early.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator

from cas_checkpoint.format.objects import LogEntry

MAX_KEY = "lgm"  # a checkpoint entry's running max of LangGraph ids
EARLY = "lge"  # the newest entry's map: checkpoint with early writes -> the entry before them
WRITES_FROM = "lgw"  # a checkpoint entry's: its writes start after this entry ("": anywhere)
MAX_EARLY = 16  # checkpoints an EARLY map follows (more: the oldest, a put that never came,
#                 is dropped; the map is carried in every entry, so it stays small)


def lg_of(entry: LogEntry) -> str | None:
    """The LangGraph id of a checkpoint entry (None for a pending-writes entry)."""
    lg = entry.metadata.get("lg")
    return None if lg is None else str(lg)


class Short(Exception):
    """A cursor over the first entries of a log (``Cursor(short=True)``) read them all, and
    the log goes on: give it the rest (``Cursor.more``) and ask again."""


class Cursor:
    """Entries of one store thread, newest first, read lazily from ``entries``. ``short``:
    ``entries`` are the newest of the log only (a head's tail: ``Steps._ask``), and reading
    past them raises ``Short``; ``more`` then gives the cursor the rest. Every question
    (``newest``, ``first_checkpoint``, ``latest``, ``find``...) goes over what was read first,
    so one asked again after ``Short`` reads each entry once and answers as over the whole log."""

    def __init__(self, entries: Iterator[LogEntry], short: bool = False) -> None:
        self._entries = entries
        self._short = short
        self.seen: list[LogEntry] = []  # newest first
        self.ids: set[str] = set()  # their store ids
        self.by_lg: dict[str, LogEntry] = {}  # the newest entry of each LangGraph id seen
        self.bound: str | None = None  # every unread entry's id is <= this (None: unknown)
        self.done = False

    def step(self) -> LogEntry | None:
        """The next older entry (None at the start of the log)."""
        entry = next(self._entries, None)
        if entry is None:
            if self._short:
                raise Short
            self.done = True
            return None
        self.seen.append(entry)
        self.ids.add(entry.id)
        lg = lg_of(entry)
        if lg is not None:
            self.by_lg.setdefault(lg, entry)
            top = entry.metadata.get(MAX_KEY)
            if isinstance(top, str) and (self.bound is None or top < self.bound):
                self.bound = top
        return entry

    def more(self, entries: Iterator[LogEntry]) -> None:
        """The entries after those a short cursor was made with (its ``Short``)."""
        self._entries, self._short = entries, False

    def newest(self) -> LogEntry | None:
        """The newest entry of the log (None when it is empty)."""
        return self.seen[0] if self.seen else self.step()

    def _beaten(self, lg: str) -> bool:
        """Whether no unread entry can have an id above ``lg`` (nor equal: older ties lose)."""
        return self.done or (self.bound is not None and lg >= self.bound)

    def first_checkpoint(self) -> LogEntry | None:
        """The newest checkpoint entry."""
        for old in self.seen:
            if lg_of(old) is not None:
                return old
        while (entry := self.step()) is not None:
            if lg_of(entry) is not None:
                return entry
        return None

    def latest(self) -> LogEntry | None:
        """The checkpoint with the greatest LangGraph id (the newest entry of it)."""
        best: LogEntry | None = None
        best_lg = ""
        for old in self.seen:
            lg = lg_of(old)
            if lg is not None and (best is None or lg > best_lg):
                best, best_lg = old, lg
        while best is None or not self._beaten(best_lg):
            entry = self.step()
            if entry is None:
                break
            lg = lg_of(entry)
            if lg is not None and (best is None or lg > best_lg):
                best, best_lg = entry, lg
        return best

    def find(self, lg: str) -> LogEntry | None:
        """The (newest) checkpoint entry of LangGraph id ``lg``; None if the log has none."""
        while lg not in self.by_lg:
            if self.done or (self.bound is not None and lg > self.bound):
                return None
            self.step()
        return self.by_lg[lg]

    def top(self, limit: int | None, accept: Callable[[LogEntry, str], bool]
            ) -> list[LogEntry]:
        """The checkpoint entries ``accept`` takes with the ``limit`` greatest ids (all when
        None), greatest first (ties: the newer first)."""
        if limit is not None and limit <= 0:
            return []
        taken: list[tuple[str, int, LogEntry]] = []  # ascending: (id, -position, entry)

        def take(n: int, entry: LogEntry) -> None:
            lg = lg_of(entry)
            if lg is not None and accept(entry, lg):
                bisect.insort(taken, (lg, -n, entry), key=lambda t: (t[0], t[1]))

        for n, old in enumerate(self.seen):
            take(n, old)
        while not (limit is not None and len(taken) >= limit
                   and self._beaten(taken[-limit][0])):
            entry = self.step()
            if entry is None:
                break
            take(len(self.seen) - 1, entry)
        got = [e for *_, e in reversed(taken)]
        return got if limit is None else got[:limit]

    def reach(self, chosen: list[LogEntry]) -> None:
        """Read back far enough that every pending write of these checkpoint entries has been
        read: to the entry before their first early write, or to the start of the log for an
        entry written before ``lgm`` existed (its writes may be anywhere)."""
        for entry in chosen:
            if not isinstance(entry.metadata.get(MAX_KEY), str):
                while self.step() is not None:
                    pass
                return
            anchor = entry.metadata.get(WRITES_FROM)
            if isinstance(anchor, str):
                while anchor not in self.ids and self.step() is not None:
                    pass

    def writes(self, lgs: set[str]) -> list[LogEntry]:
        """The pending-writes entries read so far for these checkpoints, newest first (all
        of theirs once ``reach`` has read back far enough)."""
        return [e for e in self.seen if "w" in e.metadata and str(e.metadata["w"]) in lgs]
