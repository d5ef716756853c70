"""AsyncCheckpointStore under load and under cancellation: many tasks on one store object, saves
cancelled at every await they make, writers in several processes, and the threads it starts."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import threading
import uuid
from typing import Any

import pytest
from builders import msg

from cas_checkpoint import CheckpointStore
from cas_checkpoint.aio import AsyncCheckpointStore, landed
from cas_checkpoint.backends import Backend

SOAK = os.environ.get("CAS_SOAK", "small") == "full"


def _msg(task: int, i: int) -> dict[str, Any]:
    return msg(i, "lorem ipsum ", 30, prefix=f"task {task} message")


def _url(kind: str, tmp_path: Any, request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    name = uuid.uuid4().hex[:12]
    if kind == "memory":
        return f"memory://cas-async-{name}", {}
    if kind == "local":
        return str(tmp_path / f"store-{name}"), {}
    server = request.getfixturevalue("moto_server")
    return f"s3://{server['bucket']}/{name}", {"storage_options": server["storage_options"]}


@pytest.mark.parametrize("kind", ["memory", "local", "s3"])
def test_200_tasks_saving_to_50_threads_on_one_store_all_land(
        kind: str, tmp_path: Any, request: pytest.FixtureRequest) -> None:
    url, kw = _url(kind, tmp_path, request)
    tasks, saves = 200, (10 if SOAK else 3)

    async def main() -> dict[str, list[tuple[str, Any]]]:
        store = await AsyncCheckpointStore.open(url, **kw)
        acked: dict[str, list[tuple[str, Any]]] = {}

        async def agent(n: int) -> None:
            thread = f"thread-{n % 50}"
            state: dict[str, Any] = {"agent": n, "messages": []}
            for i in range(saves):
                state["messages"].append(_msg(n, i))
                info = await store.save(thread, state, metadata={"agent": n, "i": i})
                copy = {**state, "messages": list(state["messages"])}
                acked.setdefault(thread, []).append((info.id, copy))

        await asyncio.gather(*(agent(n) for n in range(tasks)))
        # every acknowledged save is in its thread's history and loads to what was saved
        for thread, got in acked.items():
            history = await store.history(thread)
            assert sorted(h.id for h in history) == sorted(cid for cid, _ in got)
            for cid, state in got:
                assert (await store.load(thread, cid)).state == state
        report = await store.verify()
        assert report.ok, report.to_text()
        await store.aclose()
        return acked

    acked = asyncio.run(main())
    assert sum(len(v) for v in acked.values()) == tasks * saves
    # and a sync store over the same storage agrees (one format, two faces)
    if kind != "memory":
        sync = CheckpointStore.open(url, **kw)
        assert sorted(sync.threads()) == sorted(acked)
        assert sum(sync.count(t) for t in acked) == tasks * saves


_NAMES = ("get_many", "put_many", "read_ref", "read_refs", "write_ref", "delete_ref", "list",
          "list_many", "delete_many")


class _Canceller:
    """Wraps a backend's requests: the ``at``-th cancels the task that made the save (then lets
    the request run), so the cancellation arrives at that very request. Its async face
    (awaited on the loop); on a ``pooled`` backend (local disk) its sync face, which a step's
    hand-off to the pool calls: the request waits there until the loop has delivered the
    cancellation to the task."""

    def __init__(self, backend: Backend, at: int) -> None:
        self.backend, self.at, self.calls, self.victim = backend, at, 0, None
        self.names: list[str] = []
        self.loop = asyncio.get_running_loop()
        for name in _NAMES:
            if backend.pooled:
                setattr(backend, name, self._wrap_sync(name, getattr(backend, name)))
            else:
                setattr(backend, "a" + name, self._wrap(name, getattr(backend, "a" + name)))

    def _wrap(self, name: str, real: Any) -> Any:
        async def call(*args: Any, **kw: Any) -> Any:
            self.calls += 1
            self.names.append(name)
            if self.calls == self.at and self.victim is not None:
                self.victim.cancel()
            await asyncio.sleep(0)  # the cancellation lands here if this task is the victim
            return await real(*args, **kw)
        return call

    def _wrap_sync(self, name: str, real: Any) -> Any:
        def call(*args: Any, **kw: Any) -> Any:
            self.calls += 1
            self.names.append(name)
            if self.calls == self.at and self.victim is not None:
                delivered = threading.Event()
                self.loop.call_soon_threadsafe(self.victim.cancel)
                # (queued behind the victim's own wake-up with the cancellation)
                self.loop.call_soon_threadsafe(self.loop.call_soon, delivered.set)
                assert delivered.wait(10)
            return real(*args, **kw)
        return call


@pytest.mark.parametrize("kind", ["memory", "local", "s3"])
def test_a_save_cancelled_at_each_of_its_awaits_lands_whole_or_not_at_all(
        kind: str, tmp_path: Any, request: pytest.FixtureRequest) -> None:
    """Cancel the k-th await of a save, for every k: the caller gets CancelledError; ``landed``
    says whether the checkpoint is in the thread (then it loads), and the store stays whole."""
    url, kw = _url(kind, tmp_path, request)

    async def main() -> tuple[int, int]:
        store = await AsyncCheckpointStore.open(url, **kw)
        base = {"messages": [_msg(0, i) for i in range(40)]}
        await store.save("t", base)
        # how many awaits one save makes (a pack write, then the ref)
        probe = _Canceller(store.backend, at=0)
        big = {"messages": base["messages"] + [_msg(1, i) for i in range(40)]}
        await store.save("t", big)
        steps = probe.calls
        _restore(store.backend)
        assert steps >= 2, probe.names
        landed_n = cancelled_n = 0
        for k in range(1, steps + 1):
            expected = await store.count("t")
            c = _Canceller(store.backend, at=k)
            state = {"messages": base["messages"] + [_msg(100 + k, i) for i in range(40)]}

            async def one(state: dict[str, Any] = state) -> Any:
                return await store.save("t", state)

            task = asyncio.ensure_future(one())
            c.victim = task
            try:
                await task
                raise AssertionError(f"the save was not cancelled at await {k} of {steps}")
            except asyncio.CancelledError as exc:
                info = landed(exc)
            _restore(store.backend)
            count = await store.count("t")
            if info is None:
                cancelled_n += 1
                assert count == expected, f"await {k}: a save said not landed, but it is there"
            else:
                landed_n += 1
                assert count == expected + 1
                assert (await store.load("t")).id == info.id
                assert (await store.load("t", info.id)).state == state
            # the thread still takes saves, and everything it names is there
            await store.save("t", {"messages": base["messages"] + [_msg(99, k)]})
        report = await store.verify()
        assert report.ok, report.to_text()
        await store.aclose()
        return landed_n, cancelled_n

    landed_n, cancelled_n = asyncio.run(main())
    # cancelled before the commit (not landed) and during it (landed)
    assert cancelled_n >= 1 and landed_n >= 1, (cancelled_n, landed_n)


def _restore(backend: Backend) -> None:
    for name in _NAMES:
        backend.__dict__.pop(name, None)
        backend.__dict__.pop("a" + name, None)


@pytest.mark.parametrize("kind", ["memory", "local"])
def test_saves_cancelled_at_random_points_never_break_a_ref(
        kind: str, tmp_path: Any, request: pytest.FixtureRequest) -> None:
    url, kw = _url(kind, tmp_path, request)
    rng = random.Random(7)
    rounds = 400 if SOAK else 60

    async def main() -> None:
        store = await AsyncCheckpointStore.open(url, **kw)
        acked: dict[str, set[str]] = {}
        counts: dict[str, int] = {}

        async def save(thread: str, n: int) -> None:
            state = {"n": n, "messages": [_msg(n, i) for i in range(n % 30)]}
            try:
                info = await store.save(thread, state)
            except asyncio.CancelledError as exc:
                info = landed(exc)
                if info is None:
                    return
            acked.setdefault(thread, set()).add(info.id)
            counts[thread] = counts.get(thread, 0) + 1

        for r in range(rounds):
            tasks = [asyncio.ensure_future(save(f"t{i % 4}", r * 10 + i)) for i in range(8)]
            await asyncio.sleep(rng.random() * 0.003)
            for t in tasks:
                if rng.random() < 0.5:
                    t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for thread, ids in acked.items():
            history = {h.id for h in await store.history(thread)}
            assert history == ids  # nothing acknowledged lost, nothing unacknowledged in
            for cid in ids:
                await store.load(thread, cid)
        report = await store.verify()
        assert report.ok, report.to_text()
        await store.aclose()

    asyncio.run(main())


def test_memory_starts_no_thread_and_local_a_bounded_pool(tmp_path: Any) -> None:
    async def run(url: str) -> int:
        before = threading.active_count()
        store = await AsyncCheckpointStore.open(url)
        peak = 0

        async def agent(n: int) -> None:
            nonlocal peak
            for i in range(5):
                await store.save(f"t{n % 7}", {"m": [_msg(n, j) for j in range(i + 1)]})
                await store.load(f"t{n % 7}")
                peak = max(peak, threading.active_count() - before)

        await asyncio.gather(*(agent(n) for n in range(50)))
        await store.aclose()
        return peak

    assert asyncio.run(run(f"memory://cas-threads-{uuid.uuid4().hex[:8]}")) == 0
    local = asyncio.run(run(str(tmp_path / "local")))
    assert local <= Backend.async_threads  # (the process's pool: it may have been started)
    from cas_checkpoint.backends import base

    pool = base._POOLS[(Backend.async_threads, os.stat(tmp_path).st_dev)]._threads
    assert 1 <= len(pool) <= Backend.async_threads


class _Counting:
    """Counts the requests a store makes, through either face (memory's async methods call its
    sync ones: those inner calls are not counted again)."""

    def __init__(self, backend: Backend) -> None:
        self.calls: list[str] = []
        self.inside = False
        for name in ("get_many", "put_many", "read_ref", "read_refs", "write_ref", "list"):
            real = getattr(backend, name)
            setattr(backend, name, self._wrap(name, real))
            areal = getattr(backend, "a" + name)
            setattr(backend, "a" + name, self._awrap(name, areal))

    def _wrap(self, name: str, real: Any) -> Any:
        def call(*a: Any, **kw: Any) -> Any:
            if not self.inside:
                self.calls.append(name)
            return real(*a, **kw)
        return call

    def _awrap(self, name: str, real: Any) -> Any:
        async def call(*a: Any, **kw: Any) -> Any:
            self.calls.append(name)
            self.inside = True
            try:
                return await real(*a, **kw)
            finally:
                self.inside = False
        return call


def test_both_faces_make_the_same_requests() -> None:
    """One implementation: the same work through either face asks storage the same things."""
    def work_sync(url: str) -> list[str]:
        store = CheckpointStore.open(url)
        counter = _Counting(store.backend)
        state: dict[str, Any] = {"messages": []}
        for i in range(30):
            state["messages"].append(_msg(0, i))
            store.save("t", state)
        store.load("t")
        store.history("t")
        return counter.calls

    async def work_async(url: str) -> list[str]:
        store = await AsyncCheckpointStore.open(url)
        counter = _Counting(store.backend)
        state: dict[str, Any] = {"messages": []}
        for i in range(30):
            state["messages"].append(_msg(0, i))
            await store.save("t", state)
        await store.load("t")
        await store.history("t")
        return counter.calls

    sync_calls = work_sync(f"memory://cas-faces-{uuid.uuid4().hex[:8]}")
    async_calls = asyncio.run(work_async(f"memory://cas-faces-{uuid.uuid4().hex[:8]}"))
    assert len(sync_calls) > 30
    assert async_calls == sync_calls


WORKER = r"""
import asyncio, json, sys
from cas_checkpoint.aio import AsyncCheckpointStore

async def main(url, opts, proc, tasks, saves):
    store = await AsyncCheckpointStore.open(url, storage_options=opts or None)
    acked = []
    async def agent(n):
        state = {"proc": proc, "n": n, "messages": []}
        for i in range(saves):
            state["messages"].append({"i": i, "text": "x" * 300})
            info = await store.save(f"shared-{n % 3}", state)
            acked.append([f"shared-{n % 3}", info.id])
    await asyncio.gather(*(agent(n) for n in range(tasks)))
    await store.aclose()
    print(json.dumps(acked))

url, opts, proc, tasks, saves = sys.argv[1], json.loads(sys.argv[2]), *map(int, sys.argv[3:6])
asyncio.run(main(url, opts, proc, tasks, saves))
"""


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_async_writers_in_several_processes_on_shared_threads_all_land(
        kind: str, tmp_path: Any, request: pytest.FixtureRequest) -> None:
    import json

    url, kw = _url(kind, tmp_path, request)
    opts = kw.get("storage_options") or {}
    procs, tasks, saves = 3, (10 if SOAK else 6), (8 if SOAK else 3)
    running = [subprocess.Popen([sys.executable, "-c", WORKER, url, json.dumps(opts), str(p),
                                 str(tasks), str(saves)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for p in range(procs)]
    acked: list[list[str]] = []
    for p in running:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        acked += json.loads(out)
    assert len(acked) == procs * tasks * saves
    store = CheckpointStore.open(url, **kw)
    for thread in {t for t, _ in acked}:
        ids = {h.id for h in store.history(thread)}
        assert ids == {cid for t, cid in acked if t == thread}
        for cid in ids:
            store.load(thread, cid)


@pytest.mark.parametrize("kind", ["memory", "local"])
def test_gc_rounds_while_async_tasks_save_lose_nothing(
        kind: str, tmp_path: Any, request: pytest.FixtureRequest) -> None:
    """8 tasks save to 4 threads (a pack every save, so merges leave garbage all the time)
    while another store object on the same loop runs gc rounds with a short grace: after every
    round, every checkpoint of every ref loads through a third, fresh store object; at the end
    every acknowledged save is in its thread, a gc with the writers stopped deletes what is
    left, and everything still loads."""
    from datetime import timedelta

    url, kw = _url(kind, tmp_path, request)
    rounds, per_task = (30, 60) if SOAK else (6, 12)

    async def main() -> tuple[int, int]:
        store = await AsyncCheckpointStore.open(url, **kw)
        store._core.refs.inline_max = 1  # every save writes a pack: merges, garbage
        collector = await AsyncCheckpointStore.open(url, **kw)
        acked: list[tuple[str, str]] = []
        stop = asyncio.Event()

        async def writer(n: int) -> None:
            i = 0
            while not stop.is_set() and i < per_task:
                state = {"n": n, "i": i, "messages": [_msg(n, j) for j in range(i % 6 + 1)]}
                info = await store.save(f"t{n % 4}", state)
                acked.append((f"t{n % 4}", info.id))
                i += 1
                await asyncio.sleep(0.03)  # spread the saves over the gc rounds

        tasks = [asyncio.ensure_future(writer(n)) for n in range(8)]
        deleted = loaded = 0
        try:
            for _ in range(rounds):
                await asyncio.sleep(0.05)
                deleted += (await collector.gc(grace=timedelta(seconds=0.25))).deleted_objects
                reader = await AsyncCheckpointStore.open(url, **kw)
                for thread in await reader.threads():
                    for info in await reader.history(thread):
                        await reader.load(thread, info.id)
                        loaded += 1
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        await asyncio.sleep(0.3)
        deleted += (await collector.gc(grace=timedelta(0), force=True)).deleted_objects
        reader = await AsyncCheckpointStore.open(url, **kw)
        for thread in {t for t, _ in acked}:
            ids = {h.id for h in await reader.history(thread)}
            assert {cid for t, cid in acked if t == thread} <= ids
            for cid in ids:
                await reader.load(thread, cid)
        report = await reader.verify()
        assert report.ok, report.to_text()
        return deleted, loaded

    deleted, loaded = asyncio.run(main())
    assert deleted > 0 and loaded > 0  # gc did delete merged-away packs; readers did read
