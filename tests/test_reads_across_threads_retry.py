"""Issue 29: a writer deletes the packs its merges replaced a few commits later. Reads over
every thread (``get`` by id, ``diff``, ``search`` of the whole store) and ``search`` of one
thread read the refs again and run again when something they fetched is gone and a ref moved
meanwhile (``engine/locate.py``), as the reads of one thread do (``Core.at_ref``); only a ref
that still names what is missing is damage."""

from __future__ import annotations

from typing import Any

import pytest

from cas_checkpoint import CheckpointStore
from cas_checkpoint.engine.object_store import pack_key
from cas_checkpoint.errors import NotFoundError


def _save(store: CheckpointStore, thread: str, n: int, start: int = 0) -> list[str]:
    return [store.save(thread, {"m": [f"message {j} " * 8 for j in range(max(0, i - 9), i + 1)],
                                "step": i}).id for i in range(start, start + n)]


def _stale_once(reader: CheckpointStore, key: str, got: tuple[bytes, str]) -> None:
    """The reader's first read of ref ``key`` (alone or among others) returns ``got`` (an old
    read of it); every later read the real one."""
    backend = reader.backend
    real_one, real_many = backend.read_ref, backend.read_refs
    served = [False]

    def serve(k: str, real: tuple[bytes, str] | None) -> tuple[bytes, str] | None:
        if k == key and not served[0]:
            served[0] = True
            return got
        return real

    def read_ref(k: str) -> tuple[bytes, str] | None:
        return serve(k, real_one(k))

    def read_refs(keys: list[str]) -> list[tuple[bytes, str] | None]:
        return [serve(k, g) for k, g in zip(keys, real_many(keys), strict=True)]

    backend.read_ref = read_ref  # type: ignore[method-assign]
    backend.read_refs = read_refs  # type: ignore[method-assign]


@pytest.fixture
def moved(tmp_path: Any) -> tuple[CheckpointStore, tuple[bytes, str], list[str]]:
    """A store whose thread "t" moved on after ``old`` (an old read of its ref) was taken,
    its writer having deleted the packs ``old`` named; and thread "u" beside it."""
    store = CheckpointStore.open(str(tmp_path / "s"))
    store.refs.inline_max = 1  # a pack a save, merges all the time
    store.refs.collect_after = 0.0  # what a merge replaced goes at the next commit
    ids = _save(store, "t", 20)
    _save(store, "u", 3)
    old = store.backend.read_ref(store.refs.stored_key("t"))
    assert old is not None
    ids += _save(store, "t", 20, 20)
    return store, old, ids


def _reader(store: CheckpointStore, old: tuple[bytes, str]) -> CheckpointStore:
    reader = CheckpointStore.open(store.url)
    _stale_once(reader, store.refs.stored_key("t"), old)
    return reader


def test_get_and_diff_read_the_refs_again(moved: Any) -> None:
    """Old code: NotFoundError (a pack of thread "t" is missing) from both."""
    store, old, ids = moved
    assert _reader(store, old).get(ids[19]).state["step"] == 19
    got = _reader(store, old).diff(ids[18], ids[19])
    assert [(c.path, c.old, c.new) for c in got.changes if c.path == '["step"]'] == [
        ('["step"]', 18, 19)]


@pytest.mark.parametrize("one_thread", [False, True])
def test_search_reads_the_refs_again(moved: Any, one_thread: bool) -> None:
    """Old code: NotFoundError from a search of the store and of the thread alike."""
    store, old, _ids = moved
    got = _reader(store, old).search("message 39", thread_id="t" if one_thread else None)
    assert {m.thread_id for m in got.matches} == {"t"}


def test_a_ref_that_still_names_what_is_gone_is_damage(moved: Any) -> None:
    """Nothing moved since the refs were read: the missing pack is reported, not retried."""
    store, _old, ids = moved
    view_ref = store.refs.read("t")
    assert view_ref is not None
    named = {pack_key(p.id) for p in view_ref.head.packs}
    store.backend.delete_many(sorted(named))  # (damage: the ref still names them)
    assert set(store.backend.get_many(named).values()) == {None}
    reader = CheckpointStore.open(store.url)
    with pytest.raises(NotFoundError):
        reader.get(ids[19])


@pytest.mark.parametrize("how", ["export", "copy"])
def test_export_and_copy_read_the_ref_again(moved: Any, tmp_path: Any, how: str) -> None:
    """A bundle export and a copy between stores read the thread's ref, log and packs in one
    retried read (``Core.at_ref``). Old code: NotFoundError (a pack of thread "t" is
    missing)."""
    from cas_checkpoint import copy_threads

    store, old, _ids = moved
    reader = _reader(store, old)
    other = CheckpointStore.open(str(tmp_path / "other"))
    if how == "export":
        reader.export_thread("t", str(tmp_path / "t.bundle"))
        other.import_bundle(str(tmp_path / "t.bundle"))
    else:
        copy_threads(reader, other, ["t"])
    assert other.load("t").state["step"] == 39
    assert len(other.history("t")) == 40
