"""Steps: the store's logic as generators that yield storage requests (``Op``) and receive their
results, run by a sync driver (``run``) or an async one (``arun``).
Rule: nothing in a step blocks or awaits."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterable
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from cas_checkpoint.backends.base import Backend
from cas_checkpoint.engine import telemetry

if TYPE_CHECKING:
    import asyncio

T = TypeVar("T")
log = logging.getLogger("cas_checkpoint")

Step = Generator["Op", Any, T]
"""An operation: yields requests, receives their results, returns a ``T``."""


class Op:
    """A request for storage. ``commit`` marks the requests that make an operation land."""

    __slots__ = ()
    commit = False
    # Its ``sync`` is what its ``run`` awaits on a backend whose async face is its sync one on
    # a thread pool (``Backend.pooled``): ``arun`` may then carry it out inside a step's
    # hand-off to that pool (``_Handoff``). An ``Op`` defined elsewhere (a request on another
    # backend) is awaited on the loop.
    pooled = False
    # Its outcome changes nothing the operation answers (a failure is only logged): made after
    # the operation's commit request, a driver may carry it out once the operation answered.
    after = False

    def sync(self, backend: Backend) -> Any:  # pragma: no cover - every Op overrides it
        raise NotImplementedError

    async def run(self, backend: Backend) -> Any:  # pragma: no cover
        raise NotImplementedError


@dataclass(slots=True)
class GetMany(Op):
    """Bytes of several keys, read concurrently: ``{key: bytes or None}``."""

    pooled = True

    keys: list[str]

    def sync(self, backend: Backend) -> dict[str, bytes | None]:
        return backend.get_many(self.keys)

    async def run(self, backend: Backend) -> dict[str, bytes | None]:
        return await backend.aget_many(self.keys)


@dataclass(slots=True)
class PutMany(Op):
    """Create keys that do not exist (immutable objects); refresh the modified time of those
    that do."""

    pooled = True

    items: dict[str, bytes]

    def sync(self, backend: Backend) -> None:
        backend.put_many(self.items)

    async def run(self, backend: Backend) -> None:
        await backend.aput_many(self.items)


@dataclass(slots=True)
class ReadRef(Op):
    """``(bytes, version)`` of a ref, or None."""

    pooled = True

    key: str

    def sync(self, backend: Backend) -> tuple[bytes, str] | None:
        return backend.read_ref(self.key)

    async def run(self, backend: Backend) -> tuple[bytes, str] | None:
        return await backend.aread_ref(self.key)


@dataclass(slots=True)
class ReadRefs(Op):
    """Several refs, read concurrently: a list of ``(bytes, version)`` or None."""

    pooled = True

    keys: list[str]

    def sync(self, backend: Backend) -> list[tuple[bytes, str] | None]:
        return backend.read_refs(self.keys)

    async def run(self, backend: Backend) -> list[tuple[bytes, str] | None]:
        return await backend.aread_refs(self.keys)


@dataclass(slots=True)
class WriteRef(Op):
    """Compare-and-swap a ref; returns its new version or raises RefMismatch."""

    pooled = True

    key: str
    data: bytes
    expected: str | None
    refresh: Callable[[], None] | None = None
    commit = True

    def sync(self, backend: Backend) -> str:
        return backend.write_ref(self.key, self.data, self.expected, refresh=self.refresh)

    async def run(self, backend: Backend) -> str:
        return await backend.awrite_ref(self.key, self.data, self.expected, self.refresh)


@dataclass(slots=True)
class DeleteRef(Op):
    """Delete a ref if it has the expected version; RefMismatch otherwise."""

    pooled = True

    key: str
    expected: str
    commit = True

    def sync(self, backend: Backend) -> None:
        backend.delete_ref(self.key, self.expected)

    async def run(self, backend: Backend) -> None:
        await backend.adelete_ref(self.key, self.expected)


@dataclass(slots=True)
class List(Op):
    """Every key under a prefix (``ObjectInfo``s)."""

    pooled = True

    prefix: str

    def sync(self, backend: Backend) -> Any:
        return backend.list(self.prefix)

    async def run(self, backend: Backend) -> Any:
        return await backend.alist(self.prefix)


@dataclass(slots=True)
class ListMany(Op):
    """Every key under each of several prefixes, listed concurrently."""

    pooled = True

    prefixes: list[str]

    def sync(self, backend: Backend) -> Any:
        return list(backend.list_many(self.prefixes))

    async def run(self, backend: Backend) -> Any:
        return await backend.alist_many(self.prefixes)


@dataclass(slots=True)
class DeleteMany(Op):
    """Delete keys; returns the keys the storage refused to delete. ``after``: see ``Op``
    (what a deferring driver answers the step is None)."""

    pooled = True

    keys: list[str]
    after: bool = False

    def sync(self, backend: Backend) -> list[str]:
        return backend.delete_many(self.keys)

    async def run(self, backend: Backend) -> list[str]:
        return await backend.adelete_many(self.keys)


@dataclass(slots=True)
class Sleep(Op):
    """Wait (between attempts after a lost race)."""

    pooled = True

    seconds: float

    def sync(self, backend: Backend) -> None:
        time.sleep(self.seconds)

    async def run(self, backend: Backend) -> None:
        import asyncio

        await asyncio.sleep(self.seconds)


@dataclass(slots=True)
class Blocking(Op):
    """A blocking call on local disk (gc's sweep of a local store): run as it is by the sync
    driver, on the backend's thread pool by the async one."""

    pooled = True

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()

    def sync(self, backend: Backend) -> Any:
        return self.fn(*self.args)

    async def run(self, backend: Backend) -> Any:
        return await backend.run_blocking(self.fn, *self.args)


# --- small helpers for generator code ---------------------------------------------------------


def get_many(keys: Iterable[str]) -> Step[dict[str, bytes | None]]:
    got: dict[str, bytes | None] = yield GetMany(list(keys))
    return got


def done(value: T) -> Step[T]:
    """A step that does no I/O (for a branch of generator code that needs none)."""
    return value
    yield  # pragma: no cover - makes this a generator


# --- drivers -----------------------------------------------------------------------------------


def run(step: Step[T], backend: Backend) -> T:
    """Carry ``step`` out with the backend's sync methods."""
    if telemetry.ENABLED:  # (a public operation runs in a span: telemetry.py)
        step = telemetry.traced(step)
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            op = step.send(value) if error is None else step.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        value = error = None
        try:
            value = op.sync(backend)
        except Exception as exc:
            error = exc


def landed(exc: BaseException) -> Any:
    """What an operation cancelled after its commit returned (a save: its ``CheckpointInfo``),
    or None if it was cancelled before it could land."""
    return getattr(exc, "cas_result", None)


def _start(step: Step[Any]) -> tuple[Op | None, Any]:
    """The step's first request (or its result when it makes none), computed where called."""
    try:
        return step.send(None), None
    except StopIteration as stop:
        return None, stop.value


class _Stop(Exception):
    """The caller of a step carried on in the pool was cancelled before its first commit
    request: the step stops there (``_Handoff``)."""


_UNANSWERED: Any = object()


class _Handoff:
    """A step carried on in one pool thread (``Backend.pooled``): its requests one after the
    other with the backend's sync methods and the step's own code between them, until it ends
    or makes a request the pool does not carry out (``Op.pooled``). So an operation costs one
    hand-off to the pool and one wake-up of the loop, not one of each per request (a group
    commit's packs, ref and collected packs; a read's ref and packs). The loop sets
    ``stopped`` when the caller is cancelled before the step's first commit request: the step
    is closed at its next request, as ``arun`` closes one awaited on the loop.

    The thread answers the loop as soon as the step has ended (``answer``), before it carries
    out the requests the step made ``after`` its commit (``Op.after``: the packs a commit's
    collector deletes, 3.4 ms each under load, measured), so they are off the caller's path."""

    __slots__ = ("committing", "later", "lock", "outcome", "stopped", "waiters")

    def __init__(self, committing: bool) -> None:
        import threading

        self.lock = threading.Lock()
        self.committing = committing
        self.stopped = False
        self.outcome: Any = _UNANSWERED  # (op or None, result), or the step's error
        self.waiters: list[tuple[Any, Any]] = []  # (loop, future) awaiting the outcome
        self.later: list[Op] = []

    def stop(self) -> bool:
        """Stop the step unless it is committing; whether it was stopped."""
        with self.lock:
            self.stopped = not self.committing
            return self.stopped

    def waiter(self) -> asyncio.Future[tuple[Op | None, Any]]:
        """A future of the running loop that gets the outcome (one wake-up of the loop from
        the pool thread; cancelling it leaves the step alone)."""
        import asyncio

        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[Op | None, Any]] = loop.create_future()
        with self.lock:
            outcome = self.outcome
            if outcome is _UNANSWERED:
                self.waiters.append((loop, fut))
                return fut
        _settle(fut, outcome)
        return fut

    def answer(self, outcome: Any) -> None:
        with self.lock:
            self.outcome = outcome
            waiters, self.waiters = self.waiters, []
        for loop, fut in waiters:
            with suppress(RuntimeError):  # (the loop closed meanwhile: nobody waits)
                loop.call_soon_threadsafe(_settle, fut, outcome)

    def drive(self, step: Step[Any], op: Op | None, backend: Backend) -> None:
        """In the pool: answers ``(None, result)`` once the step ended, or ``(op, None)`` for
        a request to await on the loop, or the step's error; then carries out the requests
        it deferred (``Op.after``). ``op`` None: the step has not started."""
        try:
            outcome: Any = self._steps(step, op, backend)
        except BaseException as exc:
            self.answer(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            self.answer(outcome)
        for later in self.later:
            try:
                later.sync(backend)
            except Exception as exc:  # (a deferred request is one whose failure is
                log.warning("%s after a commit failed (gc will see to it): %s",  # harmless)
                            type(later).__name__, exc)

    def _steps(self, step: Step[Any], op: Op | None, backend: Backend
               ) -> tuple[Op | None, Any]:
        try:
            if op is None:
                op = step.send(None)
            while True:
                if not op.pooled:
                    return op, None
                with self.lock:
                    if self.stopped:
                        raise _Stop
                    self.committing = self.committing or op.commit
                value: Any = None
                error: Exception | None = None
                if op.after and self.committing:
                    self.later.append(op)  # (its answer to the step is None)
                else:
                    try:
                        value = op.sync(backend)
                    except Exception as exc:
                        error = exc
                op = step.send(value) if error is None else step.throw(error)
        except StopIteration as stop:
            return None, stop.value
        except _Stop:
            step.close()
            return None, None


def _settle(fut: asyncio.Future[Any], outcome: Any) -> None:
    if fut.cancelled():
        return
    if isinstance(outcome, BaseException):
        fut.set_exception(outcome)
    else:
        fut.set_result(outcome)


async def arun(step: Step[T], backend: Backend, *, offload: bool = False) -> T:
    """Carry ``step`` out on the running event loop with the backend's async methods (see the
    module docstring for what cancellation does); on a backend whose async face is its sync
    one on a thread pool (``Backend.pooled``: local disk), each run of its requests in one
    hand-off to that pool (``_Handoff``). With ``offload``, the step's work before its first
    request (a save's encoding and hashing) runs on the backend's thread pool too (none for
    memory://), so a large state does not hold the loop."""
    import asyncio  # (here: a process that never awaits a store does not import asyncio)

    if telemetry.ENABLED:  # (a public operation runs in a span: telemetry.py)
        step = telemetry.traced(step)

    value: Any = None
    error: BaseException | None = None
    committing = False
    cancelled: asyncio.CancelledError | None = None
    first: Op | None = None
    pooled = backend.pooled
    if offload and pooled:
        first, result, cancelled, committing = await _handed(step, None, backend, False)
        if first is None:
            return _ended(result, cancelled)  # type: ignore[no-any-return]
    elif offload:
        first, result = await backend.run_blocking(_start, step)
        if first is None:
            return result  # type: ignore[no-any-return]
    while True:
        try:
            if first is not None:
                op, first = first, None
            else:
                op = step.send(value) if error is None else step.throw(error)
        except StopIteration as stop:
            if cancelled is not None:
                cancelled.cas_result = stop.value  # type: ignore[attr-defined]
                raise cancelled from None
            return stop.value  # type: ignore[no-any-return]
        except Exception:
            if cancelled is not None:
                raise cancelled from None
            raise
        value = error = None
        if pooled and op.pooled:
            first, result, stopped, committing = await _handed(step, op, backend, committing)
            cancelled = cancelled or stopped
            if first is None:
                return _ended(result, cancelled)  # type: ignore[no-any-return]
            continue
        committing = committing or op.commit
        if not committing:
            try:
                value = await op.run(backend)
            except asyncio.CancelledError:
                step.close()
                raise
            except Exception as exc:
                error = exc
            continue
        # Committing: this request and the rest of the operation finish even if the caller is
        # cancelled meanwhile; the cancellation is raised once they have.
        task = asyncio.ensure_future(op.run(backend))
        while True:
            try:
                value = await asyncio.shield(task)
                break
            except asyncio.CancelledError as exc:
                if task.done() and task.cancelled():
                    step.close()
                    raise
                cancelled = cancelled or exc
                if task.done():
                    try:
                        value = task.result()
                    except Exception as failure:
                        error = failure
                    break
            except Exception as exc:
                error = exc
                break


async def _outcome(handoff: _Handoff) -> Any:
    """The hand-off's outcome once the thread has answered, whatever cancels the wait."""
    import asyncio

    while handoff.outcome is _UNANSWERED:
        with suppress(asyncio.CancelledError, Exception):
            await asyncio.shield(handoff.waiter())
    return handoff.outcome


def _ended(result: T, cancelled: BaseException | None) -> T:
    """A step's result, or its caller's cancellation carrying it (``landed``)."""
    if cancelled is not None:
        cancelled.cas_result = result  # type: ignore[attr-defined]
        raise cancelled from None
    return result


async def _handed(step: Step[Any], op: Op | None, backend: Backend, committing: bool
                  ) -> tuple[Op | None, Any, Any, bool]:
    """``_Handoff.drive`` awaited: ``(request for the loop or None, result, the caller's
    cancellation or None, committing)``. Cancellation as ``arun``'s: before the step's first
    commit request it stops the step and is raised at once; after it the step goes on (the
    cancellation is returned, for ``arun`` to raise once the step has finished)."""
    import asyncio

    handoff = _Handoff(committing)
    backend.hand_off(handoff.drive, step, op, backend)  # (a cancel never reaches it)
    cancelled: asyncio.CancelledError | None = None
    while True:
        try:
            got = await handoff.waiter()
            return got[0], got[1], cancelled, handoff.committing
        except asyncio.CancelledError as exc:
            if handoff.stop():  # the thread closes the step at its next request: wait for
                outcome = await _outcome(handoff)  # that (the request it is in, at most), so
                if isinstance(outcome, tuple) and outcome[0] is not None:  # the step is
                    step.close()  # closed when the cancellation is raised, as on the loop
                raise  # (it handed back a request: the step is the loop's again)
            cancelled = cancelled or exc
        except Exception:
            if cancelled is not None:
                raise cancelled from None
            raise
