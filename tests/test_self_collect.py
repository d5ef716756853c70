"""Issue 29, "garbage bounded without anyone running gc": a writer deletes the packs its own
commits stopped naming, a grace period later (``collect.py``), and never a pack another ref may
still name: a fork's, a copy's, an import's, or the one a reader of an old head is reading."""

from __future__ import annotations

import io
from datetime import timedelta
from typing import Any

import pytest
from conftest import open_store

from cas_checkpoint import CheckpointStore
from cas_checkpoint.engine import collect
from cas_checkpoint.engine import steps as ops
from cas_checkpoint.engine.object_store import pack_key
from cas_checkpoint.format.heads import Head


def _save(store: CheckpointStore, thread: str, n: int, start: int = 0) -> list[str]:
    ids = []
    for i in range(start, start + n):
        ids.append(store.save(thread, {"m": [f"message {j} " * 8 for j in range(max(0, i - 9),
                                                                              i + 1)],
                                       "step": i}).id)
    return ids


def _quick(store: CheckpointStore, grace: float | None = 0.0) -> CheckpointStore:
    """Every save flushes a pack (merges all the time); replaced packs go at once."""
    store.refs.inline_max = 1
    store.refs.collect_after = grace
    return store


def _reopen(store: CheckpointStore, request: pytest.FixtureRequest, kind: str
            ) -> CheckpointStore:
    kw: dict[str, Any] = {}
    if kind == "s3":
        kw["storage_options"] = request.getfixturevalue("moto_server")["storage_options"]
    return CheckpointStore.open(store.url, **kw)


def _named(store: CheckpointStore, head: Head) -> set[str]:
    from cas_checkpoint.engine import archive

    got = ops.run(archive.named(store._core.objects, head), store.backend)
    return {p.id for p in got}


def _packs(store: CheckpointStore) -> dict[str, int]:
    return {i.key.replace("/", "")[5:]: i.size for i in store.backend.list("packs")}


@pytest.mark.parametrize("kind", ["local", "memory", "s3"])
def test_a_running_thread_stays_within_2x_of_its_compacted_size(
        tmp_path: Any, request: pytest.FixtureRequest, kind: str) -> None:
    """Every save merges; at every rung the packs on storage are those the head names, and the
    store is within 2x of what repack and gc leave. Old code (no writer deletes anything): the
    store held 5-8x the packs the head names."""
    store = _quick(open_store(kind, tmp_path, request))
    rungs = (50, 150, 300) if kind == "s3" else (100, 300, 600)
    done = 0
    for rung in rungs:
        _save(store, "t", rung - done, done)
        done = rung
        ref = store.refs.read("t")
        assert ref is not None
        on_storage, named = _packs(store), _named(store, ref.head)
        assert named <= set(on_storage)
        assert sum(on_storage.values()) <= 1.2 * sum(on_storage[p] for p in named), rung
    before = store.storage_bytes()
    store.gc(grace=timedelta(0), force=True, repack=True, min_garbage=0.0)
    assert before <= 2 * store.storage_bytes()
    assert _reopen(store, request, kind).load("t").state["step"] == done - 1


@pytest.mark.parametrize("kind", ["local", "memory", "s3"])
def test_forks_copies_and_imports_keep_their_packs_while_the_source_goes_on(
        tmp_path: Any, request: pytest.FixtureRequest, kind: str) -> None:
    """A fork, a copy and an import name packs of their source; the source's writer merges
    those away and deletes what it replaced at once, and each of them still loads every one of
    its checkpoints, in a new process, and writes on; the store verifies clean."""
    store = _quick(open_store(kind, tmp_path, request))
    n = 60 if kind == "s3" else 150
    ids = _save(store, "t", n)
    store.fork("t", ids[n // 2], "fork")
    store.fork("t", ids[-1], "tip")
    ops.run(store._core.copy("t", "copy"), store.backend)  # (Core.copy: all its packs)
    buf = io.BytesIO()
    store.export_thread("t", buf)
    buf.seek(0)
    store.import_bundle(buf, as_thread="imported")
    more = _save(store, "t", n, n)  # the source goes on: its merges replace shared packs
    _save(store, "fork", 20, 1000)
    fresh = _reopen(store, request, kind)
    assert [fresh.load("tip", c).state["step"] for c in ids] == list(range(n))
    assert [fresh.load("copy", c).state["step"] for c in ids] == list(range(n))
    assert [fresh.load("imported", c).state["step"] for c in ids] == list(range(n))
    assert [fresh.load("fork", c).state["step"] for c in ids[:n // 2 + 1]] == list(
        range(n // 2 + 1))
    assert fresh.load("fork").state["step"] == 1019
    assert [fresh.load("t", c).state["step"] for c in more] == list(range(n, 2 * n))
    report = fresh.verify()
    assert report.ok, report.to_text()


def test_a_reader_of_an_old_head_finds_its_packs_within_the_grace(tmp_path: Any) -> None:
    """A reader that read the head before a writer's merges replaced its packs reads them all
    while the grace lasts (here by time only: an hour); after it, a load reads the ref again
    and finds the newest packs."""
    store = _quick(CheckpointStore.open(str(tmp_path / "s")), grace=3600.0)
    store.refs.collect_commits = None
    _save(store, "t", 50)
    old = store.refs.read("t")
    assert old is not None
    _save(store, "t", 200, 50)
    on_storage = _packs(store)
    assert {p.id for p in old.head.packs} <= set(on_storage)  # (replaced: not yet deleted)
    reader = CheckpointStore.open(str(tmp_path / "s"))
    view = ops.run(reader._core.objects.view(old.head), reader.backend)
    assert old.head.head is not None
    view.check_checkpoint(old.head.head)
    # the grace over: the next commit deletes them; a new load reads the newest head
    store.refs.collect_after = 0.0
    store.refs.collect_commits = collect.COMMITS
    _save(store, "t", 1, 250)
    assert not {p.id for p in old.head.packs} & set(_packs(store)) - _named(
        store, store.refs.read("t").head)
    assert CheckpointStore.open(str(tmp_path / "s")).load("t").state["step"] == 250


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_two_writers_on_one_thread_lose_nothing(tmp_path: Any, request: pytest.FixtureRequest,
                                                kind: str) -> None:
    """Two store objects save on one thread in turn, each deleting what its commits replaced
    at once: each stages on packs the other may have deleted, loses races, and every
    checkpoint of both stays loadable."""
    a = _quick(open_store(kind, tmp_path, request))
    b = _quick(_reopen(a, request, kind))
    ids = []
    for i in range(40 if kind == "s3" else 120):
        ids += _save(a if i % 3 else b, "t", 1, i)
    fresh = _reopen(a, request, kind)
    got = {c.id for c in fresh.history("t")}
    assert set(ids) <= got
    assert sorted(fresh.load("t", c).state["step"] for c in ids) == list(range(len(ids)))
    assert fresh.verify().ok


def test_a_deletion_never_comes_before_its_commit(tmp_path: Any) -> None:
    """A writer whose compare-and-swap fails deletes nothing of the head it read: the packs it
    would have replaced are still named by the head that won."""
    store = _quick(CheckpointStore.open(str(tmp_path / "s")))
    _save(store, "t", 20)
    other = _quick(CheckpointStore.open(str(tmp_path / "s")))
    other.load("t")  # (its guess of the ref: soon stale)
    _save(store, "t", 30, 20)
    deleted: list[str] = []
    real = other.backend.delete_many

    def spy(keys: list[str]) -> list[str]:
        deleted.extend(keys)
        return real(keys)

    other.backend.delete_many = spy  # type: ignore[method-assign]
    _save(other, "t", 1, 50)  # stale: loses a race first, then commits on the newest head
    ref = store.refs.read("t")
    assert ref is not None
    assert not {pack_key(p) for p in _named(store, ref.head)} & set(deleted)
    assert CheckpointStore.open(str(tmp_path / "s")).load("t").state["step"] == 50
