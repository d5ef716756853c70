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
from pathlib import Path
from typing import Any

import pytest
from _soak import check_state, check_store, make_state, soak, spawn
from conftest import open_store

from cas_checkpoint import CheckpointStore, StorageError
from cas_checkpoint.backend import Backend
from cas_checkpoint.objects import Record, Segment, decode_node
from cas_checkpoint.objstore import key_object_id, object_key
from cas_checkpoint.refs import thread_key

KILLS = soak(15, 200)


def test_killed_writers_lose_nothing(tmp_path: Path) -> None:
    """A child saves in a loop (two threads, states of a few KB) and is SIGKILLed at a random
    moment; after each kill the store opens, each head loads, every save the child reported as
    returned is in its thread, and every checkpoint the refs name is complete."""
    rng = random.Random(5)
    url = str(tmp_path / "store")
    acked: list[tuple[str, str]] = []
    checked: set[str] = set()
    attempted = 0
    for kill in range(KILLS):
        proc = spawn({"url": url, "role": "writer", "writer": kill, "threads": ["a", "b"],
                      "n": None, "pad": rng.choice([0, 3000, 40000])})
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
        store = CheckpointStore.open(url)
        present = set()
        for thread in store.threads():
            check_state(store.load(thread).state)  # the head is a complete checkpoint
            for h in store.history(thread):  # every log entry's record and state are there
                present.add((thread, h.id))
                if h.id not in checked:
                    check_state(store.get(h.id).state)
                    checked.add(h.id)
        missing = set(acked) - present
        assert not missing, f"kill {kill}: acknowledged saves lost: {sorted(missing)[:3]}"
    found = check_store(CheckpointStore.open(url), acked)
    print(f"\n[soak] crash: kills {KILLS}, saves attempted {attempted}, acknowledged "
          f"{len(acked)}, found {found}")
    assert found >= len(acked) > 0


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
    todo: list[str] = []
    for thread in store.threads():
        ref = store.refs.read(thread)
        assert ref is not None
        todo += [p.id for p in ref.head.peaks] + [e.id for e in ref.head.tail]
    while todo:
        oid = todo.pop()
        if oid in seen:
            continue
        seen.add(oid)
        data = store.objects.get(oid)
        kind = data[3:4]
        if kind == b"L":
            seg = Segment.decode(data)
            todo += list(seg.children) + [e.id for e in seg.entries]
        elif kind == b"C":
            rec = Record.decode(data)
            todo += [*rec.children(), *rec.parents]  # a small root is inside the record
        elif kind == b"N":
            todo += list(decode_node(data)[0])
    return seen


def _snapshot(store: CheckpointStore) -> tuple[Any, ...]:
    return tuple((t, store.refs.read(t).head) for t in store.threads())  # type: ignore[union-attr]


def _all_objects_whole(store: CheckpointStore) -> set[str]:
    """Every listed object hashes to its name (no partial object is ever visible)."""
    oids = set()
    for info in store.backend.list("objects"):
        oid = key_object_id(info.key)
        assert oid is not None, f"stray file {info.key}"
        store.objects.forget([oid])
        store.objects.get(oid)  # re-hashes
        oids.add(oid)
    return oids


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
    """Fail the k-th storage write of a save (state nodes, record, log segment, ref), before or
    after it is applied, for every k: the store stays consistent, a save that raised before its
    ref moved left only unreachable garbage, one that raised after landed whole, and the next
    save works."""
    store = open_store(kind, tmp_path, request)
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
            assert k == 5  # nodes, record, segment, ref
    assert landed == 1  # only a failure after the ref write lands
    after_all = store.save("t", make_state(0, 99))
    assert store.head("t") == after_all.id
    print(f"\n[soak] step failures {kind}: {injected} injected, store consistent after each")


def test_failure_inside_local_writes_leaves_no_partial_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On disk, fail inside the object write (link) and inside the ref update (replace): the
    temp files left behind are never listed or read as objects or refs."""
    store = CheckpointStore.open(str(tmp_path / "store"))
    first = store.save("t", make_state(0, 0))
    import cas_checkpoint.backend as backend

    for target in ("link", "replace"):
        real = getattr(os, target)

        def boom(*args: Any, **kw: Any) -> None:
            raise OSError(errno.EIO, "injected")

        with monkeypatch.context() as m:
            m.setattr(backend.os, target, boom)
            with pytest.raises(StorageError):
                store.save("t", make_state(0, 1, pad=10000))
        assert getattr(os, target) is real
        fresh = CheckpointStore.open(store.url)
        assert fresh.head("t") == first.id
        _all_objects_whole(fresh)
        check_store(fresh, [("t", first.id)])
    leftovers = [p.name for p in Path(store.url).rglob("*.tmp-*")]
    assert leftovers  # the failed writes did leave temp files, and nothing read them
    assert store.save("t", make_state(0, 2)).id == CheckpointStore.open(store.url).head("t")


def test_object_key_roundtrip() -> None:
    oid = uuid.uuid4().hex * 2
    assert key_object_id(object_key(oid)) == oid


def test_backend_has_the_steps_we_patch() -> None:
    for name in STEPS:
        assert callable(getattr(Backend, name))
