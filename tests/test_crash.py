"""Crashes: a writer killed at any moment (SIGKILL) or failing between any two write steps
leaves garbage at most, never a ref to a missing object, and loses no acknowledged save."""

from __future__ import annotations

import errno
import fcntl
import os
import random
import signal
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from _soak import FULL, check_state, check_store, load_history, make_state, soak, spawn
from conftest import open_store

from cas_checkpoint import CheckpointStore, StorageError
from cas_checkpoint.backends import Backend
from cas_checkpoint.engine.object_store import key_pack_id, pack_key, parse_pack
from cas_checkpoint.engine.refs import thread_key
from cas_checkpoint.maintenance.repack import reachable

KILLS = soak(15, 200)


@pytest.mark.parametrize("inline_max", [None, 1])
def test_killed_writers_lose_nothing(tmp_path: Path, inline_max: int | None) -> None:
    """A child saves in a loop (two threads, states of a few KB) and is SIGKILLed at a random
    moment. After each kill a new store object (nothing cached) loads every checkpoint of
    every ref, every save the child reported as returned is in its thread, and every state is
    complete (from one read of its ref and packs: ``load`` by id walks the log, so a load of
    each after every kill was quadratic; ``check_store`` loads each by id once, at the end).
    With ``inline_max=1`` every save writes a pack and merges run all the time, so kills land
    in the middle of merges too (the child says when it has staged a merge: a kill before its
    next ``ok`` landed in one)."""
    rng = random.Random(5 if inline_max is None else 6)
    url = str(tmp_path / "store")
    acked: list[tuple[str, str]] = []
    attempted = in_merge = 0
    for kill in range(KILLS):
        proc = spawn({"url": url, "role": "writer", "writer": kill, "threads": ["a", "b"],
                      "n": None, "pad": rng.choice([0, 3000, 40000]), "inline_max": inline_max,
                      "trace_merges": inline_max is not None})
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", proc.stderr
        time.sleep(rng.uniform(0, 0.15))  # when to kill: random, not a timing assertion
        proc.send_signal(signal.SIGKILL)
        out, _err = proc.communicate()
        assert proc.returncode == -signal.SIGKILL
        lines = out.split("\n")[:-1]  # the kill may cut the last line short: not counted
        attempted += sum(1 for line in lines if line.startswith("attempt "))
        acked += [(p[1], p[2]) for p in (line.split() for line in lines)
                  if len(p) == 4 and p[0] == "ok"]
        in_merge += bool(lines) and lines[-1].startswith("merge ")
        store = CheckpointStore.open(url)
        present = set()
        for thread in store.threads():
            check_state(store.load(thread).state)  # the head is a complete checkpoint
            # every log entry's record and state are there
            for cid, state in load_history(store, thread).items():
                present.add((thread, cid))
                check_state(state)
        missing = set(acked) - present
        assert not missing, f"kill {kill}: acknowledged saves lost: {sorted(missing)[:3]}"
    found = check_store(CheckpointStore.open(url), acked)
    store = CheckpointStore.open(url)
    merges = sum(p.level > 0 for t in store.threads() for p in store.refs.read(t).head.packs)  # type: ignore[union-attr]
    print(f"\n[soak] crash (inline_max {inline_max}): kills {KILLS}, saves attempted "
          f"{attempted}, acknowledged {len(acked)}, found {found}, merged packs named {merges}, "
          f"kills inside a merge {in_merge}")
    assert found >= len(acked) > 0
    assert CheckpointStore.open(url).verify().ok
    if inline_max is not None:
        assert merges > 0  # merges did happen
        if FULL:
            assert in_merge > 0  # and some kills landed inside one


@pytest.mark.parametrize("kind,at", [("local", "before_pack"), ("local", "in_pack"),
                                     ("local", "before_ref"), ("s3", "before_ref")])
def test_killed_inside_a_merge(kind: str, at: str, tmp_path: Path,
                               request: pytest.FixtureRequest) -> None:
    """A child saves (every save flushes a pack) and stops for good inside the first save that
    merges packs: before the merged pack is written, with its temp file written but not linked
    (local disk), or with it written but the ref not yet moved; then it is SIGKILLed. Every
    save it reported stays and loads, the killed one is absent, the store verifies, the thread
    goes on saving and merging, and gc removes what the killed merge left."""
    store = open_store(kind, tmp_path, request)
    options = request.getfixturevalue("moto_server")["storage_options"] if kind == "s3" else None
    before = [store.save("t", make_state(0, i), metadata={"w": 0, "i": i}).id for i in range(2)]
    proc = spawn({"url": store.url, "storage_options": options, "role": "hang_in_merge",
                  "at": at, "thread": "t", "writer": 1, "inline_max": 1, "pad": 2000})
    assert proc.stdout is not None
    lines = []
    while not lines or not lines[-1].startswith("hung"):
        line = proc.stdout.readline()
        assert line, f"the child ended before it merged: {proc.communicate()[1][-2000:]}"
        lines.append(line.strip())
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    acked = [("t", cid) for cid in before] + [
        (p[1], p[2]) for p in map(str.split, lines) if p and p[0] == "ok"]
    assert len(acked) >= 5  # a merge needs four packs: at least three saves came first
    fresh = CheckpointStore.open(store.url, storage_options=options)
    assert fresh.head("t") == acked[-1][1]  # the killed save never landed
    assert check_store(fresh, acked, states=False) == len(acked)
    assert [fresh.load("t", c).id for _, c in acked] == [c for _, c in acked]
    assert fresh.verify().ok
    garbage = _all_objects_whole(fresh) - {p.id for p in fresh.refs.read("t").head.packs}  # type: ignore[union-attr]
    if at == "before_ref":
        assert garbage  # the merged pack (written, never named)
    if kind == "local":
        temps = list(Path(store.url).rglob("*.tmp-*"))
        assert bool(temps) == (at == "in_pack"), temps
    fresh.refs.inline_max = 1
    more = [fresh.save("t", make_state(2, i)).id for i in range(5)]  # merges again
    assert any(p.level > 0 for p in fresh.refs.read("t").head.packs)  # type: ignore[union-attr]
    if kind == "s3":
        time.sleep(1.1)  # LastModified has a resolution of one second
    report = fresh.gc(grace=timedelta(0), force=True)
    assert garbage <= set(report.deleted)
    if kind == "local":
        assert report.temp_files == (at == "in_pack")
        assert not list(Path(store.url).rglob("*.tmp-*"))
    last = CheckpointStore.open(store.url, storage_options=options)
    assert _all_objects_whole(last) == {p.id for p in last.refs.read("t").head.packs}  # type: ignore[union-attr]
    assert [h.id for h in last.history("t")] == more[::-1] + [c for _, c in acked][::-1]
    check_store(last, acked)


def test_lock_of_a_killed_writer_is_released(tmp_path: Path) -> None:
    """A writer killed while it holds a ref's lock (stopped inside the ref update) leaves no
    stale lock: the kernel drops its flock, and the next writer goes ahead."""
    url = str(tmp_path / "store")
    store = CheckpointStore.open(url)
    first = store.save("t", make_state(0, 0))
    proc = spawn({"url": url, "role": "hang_in_ref", "thread": "t"})
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    assert proc.stdout.readline().strip() == "locked", proc.stderr
    lock = os.path.join(url, *thread_key("t").split("/")) + ".lock"
    fd = os.open(lock, os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):  # the child really holds it
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released by the kernel
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    store = CheckpointStore.open(url)
    assert store.head("t") == first.id  # the killed save never landed
    second = store.save("t", make_state(0, 1))
    assert [h.id for h in store.history("t")] == [second.id, first.id]


# --- failures injected between the write steps, in-process ---------------------------------


class Injected(StorageError):
    pass


def _reachable(store: CheckpointStore) -> set[str]:
    """Every object a ref can reach: log segments, records, state nodes."""
    seen: set[str] = set()
    for thread in store.threads():
        ref = store.refs.read(thread)
        assert ref is not None
        seen |= reachable(ref.head, store.objects.view(ref.head))
    return seen


def _snapshot(store: CheckpointStore) -> tuple[Any, ...]:
    return tuple((t, store.refs.read(t).head) for t in store.threads())  # type: ignore[union-attr]


def _all_objects_whole(store: CheckpointStore) -> set[str]:
    """Every listed pack hashes to its name and decodes (no partial pack is ever visible)."""
    pids = set()
    for info in store.backend.list("packs"):
        pid = key_pack_id(info.key)
        assert pid is not None, f"stray file {info.key}"
        parse_pack(pid, store.backend.get(info.key))  # re-hashes
        pids.add(pid)
    return pids


STEPS = ["put_many", "write_ref"]


class FailAt:
    """Wraps the backend's write steps: the k-th call fails, before or after it is applied."""

    def __init__(self, k: int, when: str) -> None:
        self.k, self.when, self.calls = k, when, 0

    def wrap(self, name: str, real: Any) -> Any:
        def fn(*args: Any, **kw: Any) -> Any:
            self.calls += 1
            if self.calls == self.k and self.when == "before":
                raise Injected(f"injected before {name}")
            result = real(*args, **kw)
            if self.calls == self.k:
                raise Injected(f"injected after {name}")
            return result
        return fn


@pytest.mark.parametrize("kind", ["memory", "local", "s3"])
def test_failure_between_write_steps_leaves_only_garbage(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the k-th storage write of a save (its pack, then its ref), before or after it is
    applied, for every k: the store stays consistent, a save that raised before its ref moved
    left only unreachable garbage, one that raised after landed whole, and the next save
    works."""
    store = open_store(kind, tmp_path, request)
    store.refs.inline_max = 1  # every save writes a pack, then its ref
    for i in range(15):  # the 16th entry closes a log segment: one more write step
        store.save("t", make_state(0, i), metadata={"w": 0, "i": i})
    injected = landed = 0
    for when in ("before", "after"):
        k = 1
        while True:
            before = _snapshot(store)
            reach_before = _reachable(store)
            objs_before = _all_objects_whole(store)
            fail = FailAt(k, when)
            with monkeypatch.context() as m:
                for name in STEPS:
                    m.setattr(store.backend, name, fail.wrap(name, getattr(store.backend, name)))
                try:
                    store.save("t", make_state(1, 1000 * k + (when == "after"), pad=500 * k))
                    raised = False
                except Injected:
                    raised = True
                    injected += 1
            if not raised:
                break
            objs_after = _all_objects_whole(store)
            if _snapshot(store) == before:  # the save did not land: what it wrote is garbage
                assert _reachable(store) == reach_before
                assert objs_before <= objs_after
            else:  # it failed after its ref moved: it landed whole
                landed += 1
                check_state(store.load("t").state)
            check_store(CheckpointStore.open(store.url) if kind == "local" else store, [])
            k += 1
        if when == "before":
            assert k == 3  # the pack (merged ones with it), the ref
    assert landed == 1  # only a failure after the ref write lands
    after_all = store.save("t", make_state(0, 99))
    assert store.head("t") == after_all.id
    print(f"\n[soak] step failures {kind}: {injected} injected, store consistent after each")


def test_failure_inside_local_writes_leaves_no_partial_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On disk, fail inside the object write (link) and inside the ref update (the write of
    the ref's free slot or its flush; the rename of a new ref): the temp files and the torn
    slots left behind are never listed or read as objects or refs."""
    store = CheckpointStore.open(str(tmp_path / "store"))
    first = store.save("t", make_state(0, 0))
    import cas_checkpoint.backends.local as backend

    for target in ("link", "replace", "pwrite", "_datasync"):
        owner = backend if target.startswith("_") else backend.os
        real = getattr(owner, target)

        def boom(*args: Any, **kw: Any) -> None:
            raise OSError(errno.EIO, "injected")

        # a steady save updates its ref in place; a new thread's ref is renamed into place
        thread = "new" if target == "replace" else "t"
        with monkeypatch.context() as m:
            m.setattr(owner, target, boom)
            with pytest.raises(StorageError):
                store.save(thread, make_state(0, 1, pad=10000))
        assert getattr(owner, target) is real
        fresh = CheckpointStore.open(store.url)
        assert fresh.head("t") == first.id
        assert fresh.threads() == ["t"]
        _all_objects_whole(fresh)
        check_store(fresh, [("t", first.id)])
    leftovers = [p.name for p in Path(store.url).rglob("*.tmp-*")]
    assert leftovers  # the failed writes did leave temp files, and nothing read them
    assert store.save("t", make_state(0, 2)).id == CheckpointStore.open(store.url).head("t")


def test_pack_key_roundtrip() -> None:
    oid = uuid.uuid4().hex * 2
    assert key_pack_id(pack_key(oid)) == oid


def test_backend_has_the_steps_we_patch() -> None:
    for name in STEPS:
        assert callable(getattr(Backend, name))


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_killed_async_writers_lose_nothing(kind: str, tmp_path: Path,
                                           request: pytest.FixtureRequest) -> None:
    """A process of 12 asyncio tasks on one AsyncCheckpointStore saves to 3 shared threads
    (every save writes a pack, merges run) and is SIGKILLed at a random moment, again and
    again: every save it reported stays and loads, the logs are linear, the store verifies."""
    rng = random.Random(11)
    store = open_store(kind, tmp_path, request)
    options = request.getfixturevalue("moto_server")["storage_options"] if kind == "s3" else None
    acked: list[tuple[str, str]] = []
    for kill in range(soak(4, 40)):
        proc = spawn({"url": store.url, "storage_options": options, "role": "async_writer",
                      "writer": kill, "tasks": 12, "threads": ["a", "b", "c"],
                      "inline_max": rng.choice([None, 1]), "pad": rng.choice([0, 3000])})
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", proc.communicate()[1][-3000:]
        time.sleep(rng.uniform(0.05, 0.4 if kind == "local" else 1.0))
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate()
        assert proc.returncode == -signal.SIGKILL, err[-3000:]
        acked += [(p[1], p[2]) for p in (line.split() for line in out.split("\n")[:-1])
                  if len(p) == 4 and p[0] == "ok"]
    assert acked, "no save was acknowledged before the kills"
    found = check_store(CheckpointStore.open(store.url, storage_options=options), acked)
    assert found >= len(acked)
    report = CheckpointStore.open(store.url, storage_options=options).verify()
    assert report.ok, report.to_text()
