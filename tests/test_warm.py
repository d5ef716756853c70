"""Warm loads (warm.py): a load of the head this store object saved, or loaded with every check,
decodes the state from memory without building a view of the thread's packs; anything else
(another writer's head, a damaged ref) is loaded as before."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from cas_checkpoint import CheckpointStore, IntegrityError
from cas_checkpoint.engine.object_store import ObjectStore
from cas_checkpoint.tree import build as tree


def _no_view(monkeypatch: pytest.MonkeyPatch) -> None:
    def view(self: ObjectStore, head: Any, recent: bool = False) -> Any:
        raise AssertionError("a warm load built a view")
        yield  # pragma: no cover - a step

    monkeypatch.setattr(ObjectStore, "view", view)


@pytest.fixture(params=["local", "memory"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "s")
    return f"memory://warm-{uuid.uuid4().hex}"


def test_a_warm_load_gives_what_a_cold_load_gives(url: str, monkeypatch: pytest.MonkeyPatch
                                                  ) -> None:
    store = CheckpointStore.open(url)
    for i in range(30):
        info = store.save("t", {"messages": [{"i": j, "x": "y" * 300} for j in range(i)],
                                "t": (i, {i}), "n": 2 ** 70 + i},
                          label=f"l{i}", tags=["a", str(i)], metadata={"i": [i, {"k": None}]})
        with monkeypatch.context() as patch:
            _no_view(patch)
            caches = store.load("t")
        cold = CheckpointStore.open(url).load("t")
        assert caches == cold and caches.id == info.id and caches.label == f"l{i}"
        assert store.load("t", info.id) == cold  # (by id: the usual path)


def test_a_warm_load_follows_the_ref(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store, other = CheckpointStore.open(url), CheckpointStore.open(url)
    store.save("t", {"mine": 1})
    moved = other.save("t", {"other": 1})
    _no_view(monkeypatch)
    with pytest.raises(AssertionError, match="built a view"):
        store.load("t")  # another writer's head: loaded (and checked) as before
    monkeypatch.undo()
    got = store.load("t")
    assert got.id == moved.id and got.state == {"other": 1}
    got.state["other"] = 2  # the caller's copy: the next load decodes a fresh one
    if url.startswith("memory://"):  # the other store object's encoding, checked by the load
        _no_view(monkeypatch)
    assert store.load("t").state == {"other": 1}
    monkeypatch.undo()
    store.rewind("t", store.history("t")[-1].id)  # an edit of the ref by this store object
    assert store.load("t").state == {"mine": 1}


def _damage_ref(root: Path) -> None:
    """Flip a byte of the live slot's head in the store's one ref file."""
    ref = next(p for p in (root / "refs" / "heads").iterdir() if not p.name.endswith(".lock"))
    data = bytearray(ref.read_bytes())
    data[60] ^= 1
    ref.write_bytes(bytes(data))


def test_a_damaged_ref_is_not_served_from_memory(tmp_path: Path) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    store.save("t", {"x": 1})
    assert store.load("t").state == {"x": 1}
    _damage_ref(tmp_path / "s")
    with pytest.raises(IntegrityError):
        store.load("t")


# --- a store object that loads a head it did not save (a new process resuming a thread) ---


def _thread(url: str, n: int = 40) -> CheckpointStore:
    writer = CheckpointStore.open(url)
    for i in range(1, n + 1):
        writer.save("t", {"messages": [{"i": j, "x": "y" * 300} for j in range(i)],
                          "t": (i, {i}), "n": 2 ** 70 + i})
    return writer


def test_a_second_load_of_a_head_loaded_cold_is_warm(url: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _thread(url)
    reader = CheckpointStore.open(url)
    cold = reader.load("t")
    expected = CheckpointStore.open(url).load("t")
    cold.state["messages"].append({"changed": True})  # the caller's copy, changed after
    cold.state["t"][1].add(-1)
    with monkeypatch.context() as patch:
        _no_view(patch)
        caches = reader.load("t")
        again = reader.load("t")
    assert caches == expected and again == expected and caches.state is not again.state


def test_a_head_loaded_cold_then_moved_by_another_writer_is_loaded_again(
        url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = _thread(url, 5)
    reader = CheckpointStore.open(url)
    first = reader.load("t")
    moved = writer.save("t", {"moved": 1})
    with monkeypatch.context() as patch:
        _no_view(patch)
        with pytest.raises(AssertionError, match="built a view"):
            reader.load("t")  # a new head: loaded (and checked) as before
    got = reader.load("t")
    assert got.id == moved.id and got.state == {"moved": 1}
    writer.rewind("t", first.id)  # a rewind by another writer: a new head object again
    with monkeypatch.context() as patch:
        _no_view(patch)
        with pytest.raises(AssertionError, match="built a view"):
            reader.load("t")
    assert reader.load("t") == first


def test_a_damaged_ref_after_a_cold_load_is_not_served_from_memory(tmp_path: Path) -> None:
    _thread(str(tmp_path / "s"), 3)
    reader = CheckpointStore.open(str(tmp_path / "s"))
    assert reader.load("t").state["n"] == 2 ** 70 + 3
    _damage_ref(tmp_path / "s")
    with pytest.raises(IntegrityError):
        reader.load("t")


# --- what a store object remembers per thread is bounded ---


def test_per_thread_memories_are_bounded_and_old_views_let_go_of_their_packs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long-lived process that touches many threads keeps at most ``THREADS_KEPT`` threads'
    refs and known objects, and the loaded views (the bytes of a thread's packs) of only the
    newest ``VIEWS_KEPT``. A thread whose view was let go still skips writing the state it
    loaded; one forgotten altogether still saves and loads right (it writes more, never
    less)."""
    from cas_checkpoint.engine import caches

    monkeypatch.setattr(caches, "THREADS_KEPT", 12)
    monkeypatch.setattr(caches, "VIEWS_KEPT", 3)
    root = str(tmp_path / "s")
    writer = CheckpointStore.open(root)
    states = {f"t{i}": {"messages": [{"i": i, "n": j, "text": "w" * 300} for j in range(150)]}
              for i in range(20)}
    for name, state in states.items():
        writer.save(name, state)
    reader = CheckpointStore.open(root)
    for name in states:
        assert reader.load(name).state == states[name]
    core = reader._core
    assert len(core._known) == 12 and len(core._have) == 12
    assert list(core._have) == [f"t{i}" for i in range(8, 20)]  # the least recent went first
    viewed = [t for t, k in core._have.items() if k.view is not None]
    assert viewed == ["t17", "t18", "t19"]
    asked: list[int] = []
    missing = caches.Known.missing

    def counting(self: caches.Known, nodes: dict[str, bytes]) -> dict[str, bytes]:
        got = missing(self, nodes)
        asked.append(len(got))
        return got

    monkeypatch.setattr(caches.Known, "missing", counting)
    shed = states["t9"]  # loaded, its view let go: the ids its load checked are kept
    assert core._have["t9"].view is None and core._have["t9"].ids
    shed["messages"].append({"i": 9, "n": 150, "text": "new"})
    reader.save("t9", shed)
    nodes = len(tree.build(shed).objects)
    assert asked and asked[-1] <= 6 < nodes, (asked, nodes)  # the new leaf and what is above
    gone = states["t0"]  # forgotten: its save writes its state's objects again
    gone["messages"].append({"i": 0, "n": 150, "text": "new"})
    reader.save("t0", gone)
    for name in ("t9", "t0"):
        assert CheckpointStore.open(root).load(name).state == states[name]


def test_the_pack_cache_counts_the_bytes_it_holds_not_the_stored_ones(tmp_path: Path) -> None:
    """A compressed pack is held in memory decompressed: the LRU bound (``cache_bytes``)
    counts those bytes, so a store of very compressible states cannot hold many times its
    bound (it held every pack before: their stored sizes were ~40x smaller)."""
    root = str(tmp_path / "s")
    writer = CheckpointStore.open(root)
    for i in range(40):
        writer.save(f"t{i}", {"messages": [{"i": i, "n": j, "text": "z" * 400}
                                           for j in range(200)]})
    reader = CheckpointStore.open(root, cache_bytes=1 << 20)
    for i in range(40):
        assert reader.load(f"t{i}").state["messages"][-1]["n"] == 199
    cached = list(reader._core.objects._cache.values())
    held = [max(p.size, p.data.nbytes) for p in cached]
    assert sum(p.size for p in cached) < sum(held) // 10  # (the stored packs are small)
    assert sum(held) <= (1 << 20) + max(held), (len(cached), sum(held))


def test_bounded_memories_under_threads_that_save_and_load_many_threads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python threads sharing one store object save and load more store threads than it keeps
    (views let go and threads forgotten while other saves use them): every save lands, no ref
    names a missing object (a deep verify of a new store object finds nothing), and each
    thread's head holds the state its last save gave."""
    import random
    import threading

    from cas_checkpoint.engine import caches

    monkeypatch.setattr(caches, "THREADS_KEPT", 5)
    monkeypatch.setattr(caches, "VIEWS_KEPT", 2)
    root = str(tmp_path / "s")
    CheckpointStore.open(root).save("warm", {"x": 1})
    store = CheckpointStore.open(root)
    last: dict[str, int] = {}
    locks = {f"t{i}": threading.Lock() for i in range(12)}
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for step in range(40):
                name = f"t{rng.randrange(12)}"
                with locks[name]:  # one writer per store thread: its last save is known
                    try:
                        messages = store.load(name).state["messages"]
                    except Exception:  # (a thread not saved yet)
                        messages = []
                    messages.append({"by": seed, "step": step, "text": "q" * 300})
                    store.save(name, {"messages": messages})
                    last[name] = len(messages)
                CheckpointStore.open(root).load(name)  # a reader beside the writers
                other = f"t{rng.randrange(12)}"
                if other in last:  # a load of another thread beside its writer
                    store.load(other)
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors, errors
    assert len(store._core._have) <= 5
    assert sum(k.view is not None for k in store._core._have.values()) <= 2
    fresh = CheckpointStore.open(root)
    report = fresh.verify()
    assert report.ok, report.to_text()
    for name, count in last.items():
        assert len(fresh.load(name).state["messages"]) == count
