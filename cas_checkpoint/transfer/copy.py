"""Copying threads between stores, and the sending end that reads a thread out of a store."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from cas_checkpoint.backends import Backend
from cas_checkpoint.engine.core import Core
from cas_checkpoint.engine.object_store import View
from cas_checkpoint.engine.refs import Ref, thread_key
from cas_checkpoint.engine.steps import Op, Step
from cas_checkpoint.errors import InvalidArgumentError
from cas_checkpoint.format.heads import Head
from cas_checkpoint.format.objects import LogEntry, ObjectId, Record, decode_node
from cas_checkpoint.transfer.receive import BundleReport, Checker, Header, Progress, Refs, receive

log = logging.getLogger("cas_checkpoint")
T = TypeVar("T")


@dataclass(slots=True)
class CopyReport:
    """What ``copy_threads`` did: the threads copied, and the sums over them."""

    threads: list[str]
    checkpoints: int = 0
    objects: int = 0
    objects_written: int = 0
    bytes_written: int = 0
    reports: list[BundleReport] = field(default_factory=list)


# --- requests on another store ----------------------------------------------------------------


class _On(Op):
    """A request carried out on another backend than the driver's (the source store's)."""

    __slots__ = ("backend", "commit", "op")

    def __init__(self, backend: Backend, op: Op) -> None:
        self.backend, self.op, self.commit = backend, op, op.commit

    def sync(self, backend: Backend) -> Any:
        return self.op.sync(self.backend)

    async def run(self, backend: Backend) -> Any:
        return await self.op.run(self.backend)


def on(backend: Backend | None, step: Step[T]) -> Step[T]:
    """``step`` with each of its requests sent to ``backend`` (None: the driver's own)."""
    if backend is None:
        return (yield from step)
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            op = step.send(value) if error is None else step.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        try:
            value, error = (yield _On(backend, op)), None
        except Exception as exc:
            value, error = None, exc


# --- the sending end: a thread read out of a store --------------------------------------------


class ThreadSource:
    """A thread of a store, as a source: its log from its ref, its objects from its packs
    (every read re-hashed), records first and each state node after the first that names it."""

    trusted = True  # read from a store: an unchanged thread need not be read through

    def __init__(self, core: Core, thread_id: str, via: Backend | None = None) -> None:
        self.core, self.thread_id, self.via = core, thread_id, via
        self._head: Head | None = None
        self._view: View | None = None
        self._entries: list[LogEntry] = []
        self._order: list[ObjectId] | None = None
        self._at = 0
        self.size = 0

    def _step(self, step: Step[T]) -> Step[T]:
        return (yield from on(self.via, step))

    def header(self) -> Step[Header]:
        """The thread's ref, its log and its packs, read together: when a pack is gone and the
        ref moved meanwhile (its writer's merges: ``collect.py``), read again from the ref
        (``Core.at_ref``); every object the walk and the copy take is then in memory."""

        def read(ref: Ref) -> Step[tuple[Head, list[LogEntry], View]]:
            entries = yield from self.core.refs.entries(ref.head)
            view = yield from self.core.objects.view(ref.head)
            return ref.head, entries, view.whole()  # (a pack missing or damaged: raises)

        head, self._entries, self._view = yield from self._step(
            self.core.at_ref(self.thread_id, read))
        self._head = head
        assert head.head is not None
        return Header(self.thread_id, head.head, head.head_step, len(self._entries), None, None)

    def entries(self) -> Step[list[LogEntry]]:
        return self._entries
        yield  # pragma: no cover - a step

    def view(self) -> Step[View]:
        if self._view is None:
            assert self._head is not None
            self._view = yield from self._step(self.core.objects.view(self._head))
        return self._view

    def record_threads(self) -> Step[set[str]]:
        view = yield from self.view()
        return {Record.decode(view.get(e.id)).thread_id for e in self._entries}

    def walk(self) -> Step[list[ObjectId]]:
        """The ids to send, in order (each read and hashed once here)."""
        if self._order is None:
            view = yield from self.view()
            order: list[ObjectId] = []
            seen: set[str] = set()
            size = 0
            for entry in self._entries:
                if entry.id in seen:
                    continue
                seen.add(entry.id)
                data = view.get(entry.id)
                order.append(ObjectId(entry.id))
                size += len(data)
                todo = list(reversed(Record.decode(data).children()))
                while todo:
                    oid = todo.pop()
                    if oid in seen:
                        continue
                    seen.add(oid)
                    node = view.get(oid)
                    order.append(oid)
                    size += len(node)
                    todo.extend(reversed(decode_node(node)[0]))
            self._order, self.size = order, size
        return self._order

    @property
    def total(self) -> int | None:
        return None if self._order is None else len(self._order)

    def next_object(self) -> Step[tuple[ObjectId, bytes] | None]:
        order = yield from self.walk()
        if self._at >= len(order):
            return None
        oid = order[self._at]
        self._at += 1
        view = yield from self.view()
        return oid, view.get(oid)

    def finish(self, checker: Checker) -> Step[None]:
        self._view = None  # the packs may go
        return
        yield  # pragma: no cover - a step


# --- copy between stores -----------------------------------------------------------------------


def copy_step(src: Core, dst: Core, threads: Iterable[str] | None,
              progress: Progress | None) -> Step[CopyReport]:
    """``copy_threads`` as a step driven with the destination's backend (the source's requests
    go to the source's backend)."""
    names = None if threads is None else list(threads)
    if names is not None:
        if isinstance(threads, str) or not all(isinstance(t, str) for t in names):
            raise InvalidArgumentError("threads must be a list of thread ids (or None: all)")
        for t in names:
            thread_key(t)
    via = src.backend
    if names is None:
        names = yield from on(via, src.threads())
    refs = yield from Refs.read(dst)
    out = CopyReport(list(names))
    done = 0

    def tick(n: int, total: int | None) -> None:
        if progress is not None:
            progress(done + n, None)

    for thread in names:
        source = ThreadSource(src, thread, via)
        got = yield from receive(dst, source, None, tick, refs)
        done += got.objects
        out.reports.append(got)
        out.checkpoints += got.checkpoints
        out.objects += got.objects
        out.objects_written += got.objects_written
        out.bytes_written += got.bytes_written
    log.info("copy %s -> %s: %d threads, %d of %d objects written", src.url, dst.url,
             len(names), out.objects_written, out.objects)
    return out


def cores(src: Any, dst: Any, face: type) -> tuple[Core, Core]:
    """The engines of ``src`` and ``dst``, two store objects of the class ``face``;
    InvalidArgumentError otherwise, naming the copy function of the other face when a store is
    of that one (each face names its own in ``_copy``)."""
    for store, what in ((src, "src"), (dst, "dst")):
        if not isinstance(store, face):
            other = getattr(type(store), "_copy", None)
            raise InvalidArgumentError(
                f"{what} must be a {face.__name__}, not {type(store).__name__}"
                + (f" (use {other} for that kind)" if isinstance(other, str) else ""))
    return src._core, dst._core
