"""Group commit for CasSaver's async face: the ``aput``/``aput_writes`` calls of one store
thread (a LangGraph thread and namespace) that are in flight together share one
compare-and-swap of its ref.

LangGraph's default durability ("async") issues a step's pending writes as concurrent tasks
and the checkpoint's put in the background while the next step runs, so several saves of one
thread are usually waiting at once. Each call prepares its save in its own task (parent
lookup, encoding, splitting and hashing the state: ``Core.prepare``), then joins the thread's
queue. One task per event loop and thread (the committer) takes everything queued and commits
it with ``Core.commit``: every part appended in arrival order, each ``check`` run on the head
the parts before it left, one pack at most, one ref write. Parts that arrive while a commit is
in flight wait for the next one. So a turn flushes once per group instead of once per call,
and the thread's saves still land in the order they were called, as the per-thread lock before
this made them.

Every caller returns only once the commit holding its part is durable (the ref written), with
its own result, or raises its own error when its part alone is refused (a ``ConflictError``
under ``conflicts="raise"``); an error of the whole commit (storage) is raised in each of its
callers. Between processes nothing changes: the compare-and-swap decides, and a group that
loses a race is rebuilt on the new head as one save would be.

What a commit flushes on local disk, and why none of it can go: the ref's new slot (one
``fdatasync``: the acknowledgement itself); when the group's objects outgrow the head
(``packing.INLINE_MAX``), its one new pack: the temp file's ``fsync`` (its bytes, before any
name points at them) and, after ``os.link``, its folder's (its name: without it, power loss
can keep the ref and lose the pack's entry, a ref to a missing object); a new ref file (a
subgraph's namespace, every turn) is a temp file, ``fsync``, rename and folder ``fsync``. The
pack folders' own names are flushed in at most 9 batches per store object
(``pack_folders.py``). So a LangGraph turn costs about one flush per ``aput`` (they are
chained: each waits for the one before, so two puts never share a commit; pending writes join
them) plus two per pack; fewer packs is what lowers it further: the saver lets a head hold
16 KB of new objects (``saver.INLINE_BYTES``), not the store's 4 KB, so about four commits
share a pack.

When a group holds pending writes alone (``lead=False``), it waits up to ``JOIN_ROUNDS`` rounds
of the event loop for a put to join before it commits: LangGraph issues a step's pending writes
just before the next checkpoint's put, and a writes-only commit flushed in between made that put
wait for its flush, then flush again. The wait is counted in loop rounds, not time: a graph
whose writes no put follows (an interrupt, an error, the end of a run) waits for 4 rounds of
whatever else the loop runs, and nothing when the loop is idle.

Cancellation: a call cancelled while its part is still queued is taken out (it did not land,
nothing was written for it); one cancelled once its part is in a commit waits for that commit
and raises ``CancelledError`` carrying the result in ``cas_checkpoint.aio.landed(exc)``, as every
async save does (``ops.arun``)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from cas_checkpoint.backends import Backend
from cas_checkpoint.engine.commit import Part
from cas_checkpoint.engine.core import Core
from cas_checkpoint.engine.model import CheckpointInfo
from cas_checkpoint.engine.steps import arun
from cas_checkpoint.format.objects import LogEntry

# Rounds of the event loop a group of pending writes alone waits for a put to join it before
# it commits (see the module docs). In the agent benchmark's turn a step's put follows its
# pending writes within 4 rounds: then every commit carries a put (21 commits a turn, one per
# aput; 24.3 without the wait, a writes-only commit ahead of a put delaying it by a flush).
JOIN_ROUNDS = 4


@dataclass(slots=True)
class _Call:
    """One caller's part, the future it awaits, and once its commit is over, that commit's
    future (``done``) and the part's outcome (what a caller cancelled meanwhile reads)."""

    part: Part
    fut: asyncio.Future[CheckpointInfo]
    lead: bool
    done: asyncio.Future[None] | None = None
    outcome: CheckpointInfo | BaseException | None = None


@dataclass(slots=True)
class _Queue:
    """One event loop's queued parts for one store thread, and its committer task."""

    loop: asyncio.AbstractEventLoop
    parts: list[_Call] = field(default_factory=list)
    leads: int = 0  # parts queued that wait for no other to join them (puts)
    task: asyncio.Task[None] | None = None


class Groups:
    """The queues of one saver's store threads (per event loop; kept while a part waits)."""

    def __init__(self, core: Core) -> None:
        self._core = core
        self._queues: dict[tuple[int, str], _Queue] = {}
        self.commits = 0  # commits made (a test reads how many calls each one carried)

    async def save(self, name: str, part: Part, backend: Backend, *, lead: bool = True
                   ) -> CheckpointInfo:
        """Commit ``part`` to store thread ``name`` with the others queued there; its
        ``CheckpointInfo`` once durable, or its error. ``lead=False`` (pending writes): while
        only such parts are queued, the commit waits up to ``JOIN_ROUNDS`` rounds of the loop
        for one that leads (a put) to join them."""
        loop = asyncio.get_running_loop()
        key = (id(loop), name)
        queue = self._queues.get(key)
        if queue is None or queue.loop is not loop:  # (a loop closed with its queue left,
            queue = self._queues[key] = _Queue(loop)  # whose id a new loop has now)
        call = _Call(part, loop.create_future(), lead)
        queue.parts.append(call)
        queue.leads += lead
        if queue.task is None or queue.task.done():  # (it starts on the loop's next round:
            # the tasks that call now join this commit)
            queue.task = loop.create_task(self._drain(key, queue, backend))
        try:
            return await call.fut  # (not shielded: the commit keeps the outcome in ``call``)
        except asyncio.CancelledError as cancelled:
            if call.done is None and call in queue.parts:  # not in a commit: it does not land
                queue.parts.remove(call)
                queue.leads -= lead
                raise
            while call.outcome is None:  # in a commit: it finishes first (see the module docs)
                assert call.done is not None
                try:
                    await asyncio.shield(call.done)
                except asyncio.CancelledError:
                    if call.done.done():
                        break  # (the committer was cancelled with its loop)
                    continue  # (cancelled again: the commit still decides)
            if isinstance(call.outcome, CheckpointInfo):
                cancelled.cas_result = call.outcome  # type: ignore[attr-defined]
            raise cancelled from None

    async def _drain(self, key: tuple[int, str], queue: _Queue, backend: Backend) -> None:
        """Commit what is queued, group after group, until nothing is."""
        loop = asyncio.get_running_loop()
        try:
            while queue.parts:
                for _ in range(JOIN_ROUNDS):
                    if queue.leads:
                        break
                    await asyncio.sleep(0)
                batch, queue.parts, queue.leads = queue.parts, [], 0
                done: asyncio.Future[None] = loop.create_future()
                for call in batch:
                    call.done = done
                self.commits += 1
                try:
                    got: list[CheckpointInfo | Exception] = await arun(
                        self._core.commit(key[1], [c.part for c in batch]), backend)
                except Exception as exc:  # the whole commit failed: every caller's error
                    got = [exc] * len(batch)
                except BaseException as exc:  # (this task cancelled with its loop)
                    for call in batch:
                        call.outcome = exc
                        call.fut.cancel()
                    done.cancel()
                    raise
                for call, result in zip(batch, got, strict=True):
                    call.outcome = result
                    if call.fut.done():
                        continue
                    if isinstance(result, Exception):
                        call.fut.set_exception(result)
                    else:
                        call.fut.set_result(result)
                done.set_result(None)
        finally:
            queue.task = None
            if queue.parts and not loop.is_closed():
                # (left by a committer cancelled with its loop: nothing will commit them)
                for call in queue.parts:
                    if not call.fut.done():
                        call.fut.cancel()
                queue.parts.clear()
            if self._queues.get(key) is queue:
                del self._queues[key]


# --- the sync face -----------------------------------------------------------------------------


@dataclass(slots=True)
class _SyncCall:
    """One sync caller's part; its outcome once committed, or ``lead`` when it is handed the
    commit of its thread's queue. ``event``: what a caller that found a commit in flight waits
    on (None for one that leads at once: it never waits, so it makes none)."""

    part: Part
    event: threading.Event | None = None
    outcome: LogEntry | BaseException | None = None
    lead: bool = False


Commit = Callable[[str, list[Part]], list[LogEntry | Exception]]


class SyncGroups:
    """Group commit for the sync face: LangGraph's sync loop calls ``put`` and ``put_writes``
    from a thread pool, most of them (80% in the agent benchmark) while another save of the
    thread is being committed. A caller prepares its part under the thread's lock (so parts
    queue in call order), then either commits everything queued for the thread (the leader) or
    waits: a commit in flight, and each part that arrived meanwhile goes into the next, which
    the first of them commits (leadership is handed over; nobody commits for long). Every
    caller returns once the commit holding its part is durable, with its own result, or raises
    its own error (the whole commit's, when that failed), as with the async face."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[str, list[_SyncCall]] = {}
        self._busy: set[str] = set()  # store threads whose queue has a leader
        self.commits = 0

    def enqueue(self, name: str, part: Part) -> _SyncCall:
        """Queue ``part`` for store thread ``name`` (call it in call order: under the lock)."""
        call = _SyncCall(part)
        with self._lock:
            self._queues.setdefault(name, []).append(call)
            if name not in self._busy:
                self._busy.add(name)
                call.lead = True
            else:
                call.event = threading.Event()
        return call

    def wait(self, name: str, call: _SyncCall, commit: Commit) -> LogEntry:
        """``call``'s log entry once the commit holding it is durable, or its error;
        ``commit`` commits a store thread's parts together (``Core.commit``), when this caller
        leads. (The saver passes it with each call rather than this object keeping it: a bound
        method of the saver kept here made a reference cycle, so that a dropped saver, its
        store object and their caches lived on until the garbage collector's next full pass.)"""
        while call.outcome is None:
            if not call.lead:
                assert call.event is not None  # (a caller that did not lead at once)
                call.event.wait()
                call.event.clear()
                continue
            with self._lock:
                batch = self._queues.pop(name, [])
            self.commits += 1
            got: list[LogEntry | BaseException]
            try:
                got = list(commit(name, [c.part for c in batch]))
            except BaseException as exc:  # the whole commit's error, in each of its callers
                got = [exc] * len(batch)
            with self._lock:
                for c, result in zip(batch, got, strict=True):
                    c.outcome, c.lead = result, False
                    if c.event is not None:
                        c.event.set()
                after = self._queues.get(name)
                if after:  # the next commit is the first waiting caller's to make
                    after[0].lead = True
                    assert after[0].event is not None  # (it queued behind this commit)
                    after[0].event.set()
                else:
                    self._busy.discard(name)
        if isinstance(call.outcome, BaseException):
            raise call.outcome
        return call.outcome
