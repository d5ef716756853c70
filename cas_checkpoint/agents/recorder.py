"""``Recorder`` (over ``CheckpointStore``) and ``AsyncRecorder`` (over ``AsyncCheckpointStore``):
one agent run on one thread, checkpointed by a policy, with status and kind on each checkpoint.

What each call saves (``kind`` / ``status``):

=====================================  ================  ==========================================
call                                   kind              status
=====================================  ================  ==========================================
``event(name, state, ...)``            ``automatic``     ``in_progress``, when the policy wants it
``checkpoint(state, ...)``             ``manual``        ``in_progress`` (both can be changed)
``before(op, state)`` on entry         ``pre_operation``  ``in_progress``
``before(op, state)`` on an exception  ``recovery``      ``failed``, reason "op raised Error: ..."
``finish(state, status=...)``          ``automatic``     ``completed``, ``failed`` or ``halted``
``background()``, every interval       ``automatic``     ``in_progress``, only if the state changed
=====================================  ================  ==========================================

Every save also hashes the state's canonical encoding (BLAKE3), so that a background
checkpointer knows, without I/O, when the latest state is the one saved last and skips it.
Every save's metadata names what made it (``{"event": "tool_call", "tool": "search", "ok":
True}``, ``{"operation": "drop_table"}``, ``{"event": "interval"}``, ``{"event": "finish"}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import blake3

from cas_checkpoint.agents.policy import Clock, Event, Every, Interval, Policy, _event_name
from cas_checkpoint.aio import AsyncCheckpointStore
from cas_checkpoint.engine.model import CheckpointInfo
from cas_checkpoint.engine.refs import thread_key
from cas_checkpoint.errors import InvalidArgumentError
from cas_checkpoint.format import codec
from cas_checkpoint.format.objects import MAX_REASON
from cas_checkpoint.store import CheckpointStore

__all__ = ["AsyncBackground", "AsyncRecorder", "Background", "Operation", "Recorder"]

log = logging.getLogger("cas_checkpoint.agents")
_NOTHING: Any = object()
FINAL = ("completed", "failed", "halted")
_INTERVAL: dict[str, Any] = {"kind": "automatic", "status": "in_progress",
                             "metadata": {"event": "interval"}}


class Operation:
    """What ``with rec.before(name, state) as op`` gives: the ``pre_operation`` checkpoint
    (``op.checkpoint``) and, after an exception, the ``recovery`` one (``op.recovery``)."""

    def __init__(self, name: str, checkpoint: CheckpointInfo) -> None:
        self.name, self.checkpoint = name, checkpoint
        self.recovery: CheckpointInfo | None = None


class _Base:
    """What both recorders share: counting events, asking the policy, the arguments of each
    kind of save, and the last-saved marks a policy and a background checkpointer read."""

    def __init__(self, store: Any, thread_id: str, policy: Policy | None) -> None:
        thread_key(thread_id)  # InvalidArgumentError now, not at the first save
        policy = Every(1) if policy is None else policy
        if not isinstance(policy, Policy):
            raise InvalidArgumentError(f"policy must be a Policy (Every, AfterToolCall, "
                                       f"AfterLlmResponse, Interval, Never, or a | of them), "
                                       f"not {type(policy).__name__}")
        self.store, self.thread_id, self.policy = store, thread_id, policy
        self.last: CheckpointInfo | None = None  # the last checkpoint this recorder saved
        self.saves = 0  # how many it saved
        self._count = 0
        self._counts: dict[str, int] = {}
        self._marks: dict[Clock, float] = {c: c() for c in policy.clocks()}
        self._mutex = threading.Lock()  # counters and marks (a background thread reads them)
        self._latest: Any = _NOTHING
        self._digest: bytes | None = None  # content hash of the last state saved

    @property
    def latest(self) -> Any:
        """The last state given to this recorder (None before any)."""
        return None if self._latest is _NOTHING else self._latest

    def update(self, state: Any) -> None:
        """Give the latest state (what a background checkpointer saves) without an event."""
        self._latest = state

    def _event(self, name: str, state: Any, details: dict[str, Any]) -> dict[str, Any] | None:
        name = _event_name(name)
        with self._mutex:
            self._latest = state
            self._count += 1
            self._counts[name] = self._counts.get(name, 0) + 1
            event = Event(name, self._count, self._counts[name], details, dict(self._marks))
        if not self.policy.wants(event):
            return None
        meta: dict[str, Any] = {"event": name}
        if isinstance(details.get("tool"), str):
            meta["tool"] = _storable(details["tool"])[:200]  # (a model may name the tool)
        if isinstance(details.get("ok"), bool):
            meta["ok"] = details["ok"]
        return {"kind": "automatic", "status": "in_progress", "metadata": meta}

    @staticmethod
    def _recovery(operation: str, pre: CheckpointInfo, exc: BaseException) -> dict[str, Any]:
        reason = f"{operation} raised {type(exc).__name__}: {exc}"
        return {"kind": "recovery", "status": "failed",
                "reason": _storable(reason)[:MAX_REASON],
                "metadata": {"operation": operation, "pre_operation": pre.id}}

    @staticmethod
    def _finish(status: str, reason: str | None, kind: str) -> dict[str, Any]:
        if status not in FINAL:
            raise InvalidArgumentError(f"finish(status=) must be one of {', '.join(FINAL)}, not "
                                       f"{status!r} (a run still going saves with checkpoint())")
        return {"kind": kind, "status": status, "reason": reason, "metadata": {"event": "finish"}}

    def _digest_of(self, state: Any) -> bytes:
        """The state's content hash (its canonical encoding): equal exactly when a save would
        store the same state."""
        return blake3.blake3(codec.encode(state, types=self.store.types)).digest()

    def _saved(self, info: CheckpointInfo, digest: bytes) -> None:
        with self._mutex:
            self._marks = {c: c() for c in self._marks}
            self.last, self.saves, self._digest = info, self.saves + 1, digest

    def _interval(self, interval: Interval | None) -> Interval:
        if interval is None:
            found = self.policy.intervals()
            if not found:
                raise InvalidArgumentError("background() needs an Interval: pass one, e.g. "
                                           "background(Interval(seconds=300)), or give the "
                                           "recorder a policy that has one")
            interval = found[0]
        if not isinstance(interval, Interval):
            raise InvalidArgumentError(f"background() takes an Interval, not "
                                       f"{type(interval).__name__}")
        with self._mutex:
            self._marks.setdefault(interval.clock, interval.clock())
        return interval


class _Timer:
    """The schedule of a background checkpointer: due ``interval.seconds`` after the later of
    the recorder's last save and its own last look."""

    def __init__(self, rec: _Base, interval: Interval) -> None:
        self.rec, self.interval = rec, interval
        self.looked = interval.clock()
        self.error: BaseException | None = None  # the last error a background save met
        self.stopping = False
        self.looks = 0  # times it looked at the latest state

    def remaining(self) -> float:
        clock = self.interval.clock
        with self.rec._mutex:
            since = max(self.rec._marks.get(clock, self.looked), self.looked)
        return max(0.0, self.interval.seconds - (clock() - since))

    def pending(self) -> tuple[Any, bytes] | None:
        """The latest state and its digest if it differs from the last one saved, else None
        (content addressing: an unchanged state is never saved twice)."""
        self.looked = self.interval.clock()
        self.looks += 1
        state = self.rec._latest
        if state is _NOTHING:
            return None
        digest = self.rec._digest_of(state)
        return None if digest == self.rec._digest else (state, digest)

    def failed(self, exc: BaseException) -> None:
        log.warning("thread %r: background checkpoint failed: %s", self.rec.thread_id, exc)
        self.error = exc

    def raise_error(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error


class Recorder(_Base):
    """Checkpoints one agent run on ``thread_id`` of a ``CheckpointStore``, as ``policy`` says
    (``Every(1)``, every event, by default). Thread-safe: a background checkpointer may run
    while the agent records events."""

    def __init__(self, store: CheckpointStore, thread_id: str, *,
                 policy: Policy | None = None) -> None:
        super().__init__(store, thread_id, policy)
        self._save_lock = threading.Lock()
        self._background: Background | None = None

    def _save(self, state: Any, **kw: Any) -> CheckpointInfo:
        with self._save_lock:
            digest = self._digest_of(state)
            info: CheckpointInfo = self.store.save(self.thread_id, state, **kw)
            self._saved(info, digest)
            return info

    def event(self, name: str, state: Any, **details: Any) -> CheckpointInfo | None:
        """An event of the run (``"llm_response"``, ``"tool_call"`` with ``tool=``, ``args=``,
        ``result=``, ``ok=``, or a name of yours) and the state after it: saved if the policy
        wants (the checkpoint's info), else None. Details reach the policy; only ``tool``
        and ``ok`` are stored (in metadata)."""
        plan = self._event(name, state, details)
        return None if plan is None else self._save(state, **plan)

    def checkpoint(self, state: Any, *, kind: str = "manual", status: str = "in_progress",
                   label: str | None = None, tags: tuple[str, ...] | list[str] = (),
                   metadata: dict[str, Any] | None = None) -> CheckpointInfo:
        """Save ``state`` now, whatever the policy."""
        self._latest = state
        return self._save(state, kind=kind, status=status, label=label, tags=tags,
                          metadata=metadata)

    @contextlib.contextmanager
    def before(self, operation: str, state: Any) -> Iterator[Operation]:
        """``with rec.before("drop_table", state):`` saves a ``pre_operation`` checkpoint, then
        runs the block; if it raises an Exception, saves a ``recovery`` checkpoint of the latest
        state (``failed``, the error as reason, ``pre_operation`` id in metadata) and re-raises.
        (KeyboardInterrupt, cancellation and other BaseExceptions pass through unsaved.)"""
        operation = _event_name(operation, "operation")
        self._latest = state
        op = Operation(operation, self._save(state, kind="pre_operation", status="in_progress",
                                             metadata={"operation": operation}))
        try:
            yield op
        except Exception as exc:
            try:
                op.recovery = self._save(self._latest, **self._recovery(operation, op.checkpoint,
                                                                        exc))
            except Exception as save_error:
                exc.add_note(f"cas_checkpoint: the recovery checkpoint failed: {save_error!r}")
            raise

    def finish(self, state: Any, *, status: str = "completed", reason: str | None = None,
               kind: str = "automatic") -> CheckpointInfo:
        """The run's last checkpoint: ``completed``, or ``failed``/``halted`` with a reason.
        Stops a background checkpointer first (an error it met was logged when it happened;
        the final save goes ahead)."""
        plan = self._finish(status, reason, kind)
        if self._background is not None:
            with contextlib.suppress(Exception):
                self._background.stop()
        self._latest = state
        return self._save(state, **plan)

    def background(self, interval: Interval | None = None) -> Background:
        """Start checkpointing the latest state (from ``event``, ``checkpoint``, ``update``) in
        a thread, every ``interval.seconds`` (default: the Interval of the policy), skipping
        a state equal to the last one saved. Stop it with ``stop()`` or a ``with`` block."""
        if self._background is not None and self._background.running:
            raise InvalidArgumentError("a background checkpointer already runs for this "
                                       "recorder; stop() it first")
        self._background = Background(self, self._interval(interval))
        return self._background


class Background:
    """A thread that checkpoints a recorder's latest state on an interval (``rec.background``)."""

    def __init__(self, rec: Recorder, interval: Interval) -> None:
        self._rec, self._timer = rec, _Timer(rec, interval)
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"cas-checkpoint-interval-{rec.thread_id[:40]}")
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def looks(self) -> int:
        """How many times it has looked at the latest state (saving it or not)."""
        return self._timer.looks

    def _loop(self) -> None:
        timer = self._timer
        while True:
            self._wake.wait(min(timer.remaining(), timer.interval.seconds))
            self._wake.clear()
            if timer.stopping:
                return
            if timer.remaining() <= 0:
                self.tick()

    def tick(self) -> CheckpointInfo | None:
        """Check now: save the latest state if it changed since the last save (None if not).
        An error is logged and kept for ``stop()`` to raise."""
        try:
            with self._rec._save_lock:
                got = self._timer.pending()
                if got is None:
                    return None
                state, digest = got
                info: CheckpointInfo = self._rec.store.save(self._rec.thread_id, state,
                                                            **_INTERVAL)
                self._rec._saved(info, digest)
                return info
        except Exception as exc:
            self._timer.failed(exc)
            return None

    def wake(self) -> None:
        """Make the thread look at its clock now (for a clock that jumps, as in tests)."""
        self._wake.set()

    def stop(self, *, flush: bool = False) -> None:
        """Stop the thread (waiting for a save it is making); with ``flush``, then save the
        latest state if it changed. Raises the last error a background save met."""
        self._timer.stopping = True
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        if flush:
            self.tick()
        self._timer.raise_error()

    def __enter__(self) -> Background:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class AsyncRecorder(_Base):
    """``Recorder`` over an ``AsyncCheckpointStore``: the same calls, awaited; the background
    checkpointer is an asyncio task."""

    def __init__(self, store: AsyncCheckpointStore, thread_id: str, *,
                 policy: Policy | None = None) -> None:
        super().__init__(store, thread_id, policy)
        self._save_lock: asyncio.Lock | None = None  # made on the loop that first saves
        self._background: AsyncBackground | None = None

    def _lock(self) -> asyncio.Lock:
        if self._save_lock is None:
            self._save_lock = asyncio.Lock()
        return self._save_lock

    async def _save(self, state: Any, **kw: Any) -> CheckpointInfo:
        async with self._lock():
            digest = self._digest_of(state)
            info: CheckpointInfo = await self.store.save(self.thread_id, state, **kw)
            self._saved(info, digest)
            return info

    async def event(self, name: str, state: Any, **details: Any) -> CheckpointInfo | None:
        """See ``Recorder.event``."""
        plan = self._event(name, state, details)
        return None if plan is None else await self._save(state, **plan)

    async def checkpoint(self, state: Any, *, kind: str = "manual", status: str = "in_progress",
                         label: str | None = None, tags: tuple[str, ...] | list[str] = (),
                         metadata: dict[str, Any] | None = None) -> CheckpointInfo:
        """See ``Recorder.checkpoint``."""
        self._latest = state
        return await self._save(state, kind=kind, status=status, label=label, tags=tags,
                                metadata=metadata)

    @contextlib.asynccontextmanager
    async def before(self, operation: str, state: Any) -> AsyncIterator[Operation]:
        """``async with rec.before("drop_table", state):`` (see ``Recorder.before``)."""
        operation = _event_name(operation, "operation")
        self._latest = state
        op = Operation(operation, await self._save(state, kind="pre_operation",
                                                   status="in_progress",
                                                   metadata={"operation": operation}))
        try:
            yield op
        except Exception as exc:
            try:
                op.recovery = await self._save(self._latest,
                                               **self._recovery(operation, op.checkpoint, exc))
            except Exception as save_error:
                exc.add_note(f"cas_checkpoint: the recovery checkpoint failed: {save_error!r}")
            raise

    async def finish(self, state: Any, *, status: str = "completed", reason: str | None = None,
                     kind: str = "automatic") -> CheckpointInfo:
        """See ``Recorder.finish``."""
        plan = self._finish(status, reason, kind)
        if self._background is not None:
            with contextlib.suppress(Exception):
                await self._background.stop()
        self._latest = state
        return await self._save(state, **plan)

    def background(self, interval: Interval | None = None) -> AsyncBackground:
        """An asyncio task on the running loop that checkpoints the latest state every
        ``interval.seconds`` if it changed (see ``Recorder.background``); ``await bg.stop()``
        or ``async with``."""
        if self._background is not None and self._background.running:
            raise InvalidArgumentError("a background checkpointer already runs for this "
                                       "recorder; await stop() first")
        self._background = AsyncBackground(self, self._interval(interval))
        return self._background


class AsyncBackground:
    """An asyncio task that checkpoints a recorder's latest state on an interval."""

    def __init__(self, rec: AsyncRecorder, interval: Interval) -> None:
        self._rec, self._timer = rec, _Timer(rec, interval)
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    @property
    def running(self) -> bool:
        return not self._task.done()

    @property
    def looks(self) -> int:
        """How many times it has looked at the latest state (saving it or not)."""
        return self._timer.looks

    async def _loop(self) -> None:
        timer = self._timer
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(),
                                       min(timer.remaining(), timer.interval.seconds))
            self._wake.clear()
            if timer.stopping:
                return
            if timer.remaining() <= 0:
                await self.tick()

    async def tick(self) -> CheckpointInfo | None:
        """See ``Background.tick``."""
        try:
            async with self._rec._lock():
                got = self._timer.pending()
                if got is None:
                    return None
                state, digest = got
                info: CheckpointInfo = await self._rec.store.save(self._rec.thread_id, state,
                                                                  **_INTERVAL)
                self._rec._saved(info, digest)
                return info
        except Exception as exc:
            self._timer.failed(exc)
            return None

    def wake(self) -> None:
        """Make the task look at its clock now."""
        self._wake.set()

    async def stop(self, *, flush: bool = False) -> None:
        """Stop the task (a save it is making finishes first); see ``Background.stop``."""
        self._timer.stopping = True
        self._wake.set()
        if self._task is not asyncio.current_task():
            await asyncio.shield(self._task)
        if flush:
            await self.tick()
        self._timer.raise_error()

    async def __aenter__(self) -> AsyncBackground:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def _storable(text: str) -> str:
    """Text the recorder makes from what others wrote (an exception's message, a tool's name),
    with any lone surrogate spelled out (``\\udc80``): a save refuses it as not UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
