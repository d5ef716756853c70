"""Issue 29: a fast writer deletes the packs its merges replaced after ``collect.COMMITS`` later
commits of the thread (and ``collect.MIN_GRACE`` seconds), not 10 s later; a reader of an old
head then gets its data, or re-reads the ref and gets a newer state (``Core.at_ref``). These
tests attack that rule: readers mid-read across a collection, in threads and in processes, and
the garbage a fast writer leaves at a fixed number of saves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from cas_checkpoint import CheckpointStore
from cas_checkpoint.engine import steps as ops
from cas_checkpoint.engine.object_store import key_pack_id


def _save(store: CheckpointStore, thread: str, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        store.save(thread, {"m": [f"message {j} " * 8 for j in range(max(0, i - 9), i + 1)],
                            "step": i})


def _named_bytes(store: CheckpointStore, thread: str) -> int:
    from cas_checkpoint.engine import archive

    ref = store.refs.read(thread)
    assert ref is not None
    got = ops.run(archive.named(store._core.objects, ref.head), store.backend)
    return sum(p.size for p in got)


def _pack_bytes(store: CheckpointStore) -> int:
    return sum(i.size for i in store.backend.list("packs") if key_pack_id(i.key) is not None)


@pytest.mark.parametrize("saves", [200, 600])
def test_a_fast_writer_keeps_its_merge_garbage_small(store: CheckpointStore, saves: int) -> None:
    """Every save flushes a pack (merges all the time), saves come in far faster than one in
    10 s, and nobody runs gc: the packs on storage are within 1.5x of what the head names
    (what the last 16 commits replaced is all that waits; the time floor is set to none, so
    the count does not depend on the machine's speed). Old code (deleted 10 s after the
    commit): 4.2x at 200 saves, 4.4x at 600."""
    store.refs.inline_max = 1
    store.refs.collector.min_grace = 0.0
    _save(store, "t", saves)
    assert _pack_bytes(store) <= 1.5 * _named_bytes(store, "t")


def _options(request: pytest.FixtureRequest, kind: str) -> dict[str, Any]:
    """What opens another store object on the storage of ``kind`` (S3: the moto server's)."""
    if kind != "s3":
        return {}
    return {"storage_options": request.getfixturevalue("moto_server")["storage_options"]}


def _harsh(store: CheckpointStore) -> None:
    """Every save flushes a pack; what a commit replaced goes at the writer's next commit."""
    store.refs.inline_max = 1
    store.refs.collect_commits = 1
    store.refs.collector.min_grace = 0.0


def _stale_once(reader: CheckpointStore, got: tuple[bytes, str]) -> None:
    """The reader's next read of the ref returns ``got`` (an old read), then the real one."""
    real = reader.backend.read_ref
    calls = [0]

    def read_ref(key: str) -> tuple[bytes, str] | None:
        calls[0] += 1
        return got if calls[0] == 1 else real(key)

    reader.backend.read_ref = read_ref  # type: ignore[method-assign]


def test_a_reader_of_an_old_head_gets_its_data_or_a_newer_state(tmp_path: Any) -> None:
    """A reader reads the ref, then (slow) fetches its packs after the writer made more than
    ``COMMITS`` commits and deleted them: load, history, find and read_part read the ref again
    and answer from the newer head. (Local disk: store objects of one memory:// store share
    the packs they read, so there a reader may still get the old head's data, which is right
    too.) Old code,
    its writer set to delete at once (what 16 commits are to a reader that slow): history,
    find and read_part raised NotFoundError (a pack of the thread is missing)."""
    store = CheckpointStore.open(str(tmp_path / "s"))
    store.refs.inline_max = 1
    store.refs.collect_after = 0.0
    _save(store, "t", 60)
    key = store.refs.stored_key("t")
    old = store.backend.read_ref(key)
    assert old is not None
    _save(store, "t", 60, 60)  # merges replace, and then delete, what ``old`` named
    for read in ("load", "history", "find", "read_part"):
        reader = CheckpointStore.open(store.url)
        _stale_once(reader, old)
        if read == "load":
            assert reader.load("t").state["step"] == 119
        elif read == "find":
            assert len(reader.find("t")) == 120
        elif read == "read_part":
            assert reader.read_part("t", path=["step"]).value == 119
        else:
            got = reader.history("t", limit=40)  # (past the head's own entries: its packs)
            assert [reader.load("t", c.id).state["step"] for c in got[:3]] == [119, 118, 117]
            assert len(got) == 40


@pytest.mark.s3_matters("a reader's two rounds against the writer's 16 commits, each a round "
                        "trip to S3")
@pytest.mark.parametrize("readers", [3])
def test_readers_in_threads_across_collections(store: CheckpointStore, readers: int,
                                               backend_kind: str,
                                               request: pytest.FixtureRequest) -> None:
    """A writer saves fast (a pack a save, merges deleting what they replaced at its next
    commit: harsher than the default 16, so readers do find packs gone and read the ref again)
    while readers in threads, each on a store object of its own, load the head and list its
    newest checkpoints over and over: every read answers, and the steps they see never go
    back."""
    saves = 150 if backend_kind == "s3" else 250
    kw = _options(request, backend_kind)
    _harsh(store)
    _save(store, "t", 20)
    stop = threading.Event()
    errors: list[BaseException] = []
    seen: list[list[int]] = [[] for _ in range(readers)]

    def read(i: int) -> None:
        try:
            while not stop.is_set():
                reader = CheckpointStore.open(store.url, **kw)
                seen[i].append(reader.load("t").state["step"])
                assert len(reader.history("t", limit=5)) == 5
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    pool = [threading.Thread(target=read, args=(i,)) for i in range(readers)]
    for t in pool:
        t.start()
    try:
        _save(store, "t", saves, 20)
    finally:
        stop.set()
        for t in pool:
            t.join()
    assert not errors, errors[:3]
    for steps in seen:
        assert steps and steps == sorted(steps)
    assert store.load("t").state["step"] == saves + 19


_READER = r"""
import json, os, sys
from cas_checkpoint import CheckpointStore
from cas_checkpoint.errors import CasError
url, stop, ready = sys.argv[1], sys.argv[2], sys.argv[3]
steps, errors = [], []
CheckpointStore.open(url).load("t")
open(ready, "w").close()
while not os.path.exists(stop) or not steps:
    reader = CheckpointStore.open(url)
    try:
        steps.append(reader.load("t").state["step"])
        assert len(reader.history("t", limit=5)) == 5
    except CasError as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
print(json.dumps({"steps": steps, "errors": errors[:5]}))
"""


def test_readers_in_processes_across_collections(tmp_path: Any) -> None:
    """The same with two reader processes on local disk (each its own store object and
    caches), the writer as harsh: every read answers, with steps that never go back."""
    url = str(tmp_path / "s")
    store = CheckpointStore.open(url)
    _harsh(store)
    _save(store, "t", 20)
    stop = str(tmp_path / "stop")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    ready = [str(tmp_path / f"ready{i}") for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", _READER, url, stop, r], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in ready]
    try:
        deadline = time.monotonic() + 60
        while not all(map(os.path.exists, ready)) and time.monotonic() < deadline:
            time.sleep(0.02)
        _save(store, "t", 300, 20)
    finally:
        open(stop, "w").close()
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        got = json.loads(out.strip().splitlines()[-1])
        assert not got["errors"], got["errors"]
        assert got["steps"] and got["steps"] == sorted(got["steps"])
    assert store.load("t").state["step"] == 319


def test_a_langgraph_reader_of_an_old_head_gets_a_newer_state(tmp_path: Any) -> None:
    """The LangGraph saver's get_tuple and list, on a ref read before the writer's merges
    replaced and deleted its packs: get_tuple answers the old head's latest checkpoint (its
    entry is in the head; its state, gone with the packs, is loaded through the newer ref) or
    the newest; list, which reads log segments from the packs, reads the ref again and lists
    the newest 40, or the old head's 40 when the process still holds its packs (which of the
    two depends on the process's shared cache). Old code (its writer deleting at once): list
    raised NotFoundError."""
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    from cas_checkpoint.integrations.langgraph import CasSaver

    class State(TypedDict):
        n: int

    def bump(state: State) -> dict[str, int]:
        return {"n": state["n"] + 1}

    url = str(tmp_path / "s")
    saver = CasSaver(CheckpointStore.open(url))
    saver._core.refs.inline_max = 1  # every put flushes a pack: merges all the time
    saver._core.refs.collect_after = 0.0
    b = StateGraph(State)
    b.add_node("bump", bump)
    b.add_edge(START, "bump")
    b.add_edge("bump", END)
    graph = b.compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": "t"}}
    for i in range(20):
        graph.invoke({"n": i}, config)
    key = saver._core.refs.stored_key('lg:["t",""]')
    old = saver._core.backend.read_ref(key)
    assert old is not None
    from cas_checkpoint.engine.object_store import pack_key
    from cas_checkpoint.format.heads import Head

    newest = pack_key(Head.decode(old[0], key).packs[-1].id)  # (the old head's log tail)
    n = 20
    # The writer deletes what a commit's merges replaced after that commit answers, so under
    # load the old head's newest pack may outlive invoke 40 (a reader then reads the old head
    # whole, rightly): the case is set once it is gone (more invokes, 40 at most)
    while n < 40 or (n < 80 and saver._core.backend.get_many([newest])[newest] is not None):
        graph.invoke({"n": n}, config)
        n += 1
    assert saver._core.backend.get_many([newest])[newest] is None
    for read in ("get_tuple", "list"):
        reader = CasSaver(CheckpointStore.open(url))
        _stale_once_backend(reader._core.backend, old)
        if read == "get_tuple":
            got = reader.get_tuple(config)
            assert got is not None and got.checkpoint["channel_values"]["n"] in (20, n)
        else:
            listed = list(reader.list(config, limit=40))
            assert len(listed) == 40
            # The old head's 40 newest (its packs still held in the process's shared cache:
            # immutable bytes, a consistent snapshot as of the ref read) or the newest 40
            top = listed[0].checkpoint["channel_values"]["n"]
            assert top in (20, n)
            steps = [c.metadata["step"] for c in listed]
            assert steps == list(range(steps[0], steps[0] - 40, -1))


def _stale_once_backend(backend: Any, got: tuple[bytes, str]) -> None:
    real = backend.read_ref
    calls = [0]

    def read_ref(key: str) -> tuple[bytes, str] | None:
        calls[0] += 1
        return got if calls[0] == 1 else real(key)

    backend.read_ref = read_ref


def test_the_rule_counts_the_threads_commits_and_time() -> None:
    """Pure: what a commit of thread t dropped goes at t's 16th later commit by this writer (not
    at its 15th, nor at other threads' commits), or at any commit ``grace`` seconds later; a
    pack the newest head names again stays; ``commits=None`` waits for the time alone."""
    from cas_checkpoint.engine import collect
    from cas_checkpoint.format.heads import Head, PackRef
    from cas_checkpoint.format.objects import ObjectId

    now = [100.0]

    def head(thread: str, *packs: str) -> Head:
        return Head(thread, None, packs=tuple(PackRef(ObjectId(p), 0, 1, 1) for p in packs))

    c = collect.Collector(min_grace=0.0, clock=lambda: now[0])
    c.committed(head("t", "a", "b"), head("t", "ab"), 10.0)  # drops a, b
    c.committed(head("u", "x"), head("u", "y"), 10.0)  # drops x (another thread)
    for i in range(15):
        c.committed(head("t", "ab"), head("t", "ab", f"n{i}"), 10.0)
        assert c.ripe(10.0, "t") == []
    for i in range(20):
        c.committed(head("v", f"v{i}"), head("v", f"v{i}", "w"), 10.0)
        assert c.ripe(10.0, "v") == []  # (u's drop is counted in u's commits only)
    c.committed(head("t", "ab"), head("t", "ab", "n15"), 10.0)
    assert c.ripe(10.0, "t") == ["a", "b"]
    assert c.ripe(10.0, "t", None) == []
    now[0] += 10.0
    assert c.ripe(10.0, "v") == ["x"]  # (the time fallback, at any commit)
    c.committed(head("t", "p"), head("t", "q"), 10.0)
    c.committed(head("t", "q"), head("t", "p"), 10.0)  # p named again by the newest head
    for i in range(16):
        c.committed(head("t", "p"), head("t", "p", f"m{i}"), 10.0)
    assert c.ripe(10.0, "t") == ["q"]
