"""Issue 29: loading an old checkpoint of a long thread by id, and a page of its history before
one, read O(log n) of its log, not the log from its newest entry back (``engine/seek.py``);
the answer is exact whatever the log."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest

from cas_checkpoint import CheckpointStore
from cas_checkpoint.engine import seek
from cas_checkpoint.engine.refs import build
from cas_checkpoint.format.heads import Head
from cas_checkpoint.format.objects import CheckpointId, LogEntry, ObjectId, Segment


class Reads:
    """Log entries decoded from segments (the head's own are decoded with it)."""

    entries = 0

    @classmethod
    def take(cls) -> int:
        got, cls.entries = cls.entries, 0
        return got


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> type[Reads]:
    decode = Segment.decode

    def seg_decode(data: Any) -> Segment:
        seg = decode(data)
        Reads.entries += len(seg.entries)
        return seg

    monkeypatch.setattr(Segment, "decode", staticmethod(seg_decode))
    Reads.take()
    return Reads


def _thread(saves: int) -> tuple[CheckpointStore, list[CheckpointId]]:
    store = CheckpointStore.open(f"memory://load-by-id-{uuid.uuid4().hex[:8]}")
    ids = [store.save("t", {"i": i}).id for i in range(saves)]
    return store, ids


def test_load_by_id_reads_log_n_entries(counted: type[Reads]) -> None:
    """An early checkpoint of a 2,000-checkpoint thread costs about what one of a 200-checkpoint
    thread does (the old walk decoded ~1,990 entries against ~190)."""
    got = {}
    for saves in (200, 2000):
        store, ids = _thread(saves)
        store2 = CheckpointStore.open(store.url)  # a new store object: nothing decoded yet
        Reads.take()
        cp = store2.load("t", ids[3])
        got[saves] = Reads.take()
        assert cp.id == ids[3] and cp.state == {"i": 3}
    assert got[2000] <= 2 * got[200] and got[2000] <= 16 * 8, got


def test_get_by_id_alone_reads_log_n_entries(counted: type[Reads]) -> None:
    """``get(id)`` (no thread named) finds an early checkpoint by the same search in each
    thread's log, not by walking the logs (the walk decoded ~2,000 entries at 2,000)."""
    got = {}
    for saves in (200, 2000):
        store, ids = _thread(saves)
        store.save("other", {"x": 1})
        store2 = CheckpointStore.open(store.url)
        Reads.take()
        assert store2.get(ids[3]).state == {"i": 3}
        got[saves] = Reads.take()
    assert got[2000] <= 2 * got[200] and got[2000] <= 16 * 8, got


def test_history_before_reads_its_page(counted: type[Reads]) -> None:
    """A page of history before an early checkpoint costs its own entries and a search, not the
    walk from the newest entry down to it (the walk decoded ~1,990 entries at 2,000)."""
    got = {}
    for saves in (200, 2000):
        store, ids = _thread(saves)
        store2 = CheckpointStore.open(store.url)
        Reads.take()
        page = store2.history("t", before=ids[40], limit=10)
        got[saves] = Reads.take()
        assert [i.id for i in page] == ids[30:40][::-1]
    assert got[2000] <= 2 * got[200] and got[2000] <= 16 * 10, got


def test_history_pages_are_exact() -> None:
    """Paging through a whole edited history with ``before`` gives the history, page by page;
    filters and an id that is not in the log behave as without the search."""
    store, ids = _thread(400)
    store.delete("t", *random.Random(5).sample(ids[:390], 50))
    whole = [i.id for i in store.history("t")]
    fresh = CheckpointStore.open(store.url)
    pages: list[CheckpointId] = []
    before = None
    while True:
        page = fresh.history("t", before=before, limit=23)
        if not page:
            break
        pages += [i.id for i in page]
        before = page[-1].id
    assert pages == whole
    for cid in whole[::37]:
        assert [i.id for i in fresh.history("t", before=cid)] == whole[whole.index(cid) + 1:]
    gone = next(c for c in ids if c not in whole)
    with pytest.raises(KeyError, match="is not in thread"):
        fresh.history("t", before=gone)


def test_load_by_id_is_exact_on_edited_logs() -> None:
    """Every checkpoint loads by id after deletes, a rewind and more saves; one that left the
    log (deleted, rewound past) is not in the thread, though its objects may remain (``get``
    finds it there, as before)."""
    store, ids = _thread(300)
    rng = random.Random(7)
    gone = set(rng.sample(ids[:250], 40))
    store.delete("t", *gone)
    store.rewind("t", ids[270])
    gone.update(ids[271:])
    more = [store.save("t", {"i": 1000 + i}).id for i in range(40)]
    fresh = CheckpointStore.open(store.url)
    for i, cid in enumerate(ids):
        if cid in gone:
            with pytest.raises(KeyError, match="is not in thread"):
                fresh.load("t", cid)
            assert fresh.get(cid).state == {"i": i}
        else:
            assert fresh.load("t", cid).state == {"i": i}
            assert fresh.get(cid).state == {"i": i}
    for i, cid in enumerate(more):
        assert fresh.load("t", cid).state == {"i": 1000 + i}


def _entry(n: int, step: int) -> LogEntry:
    return LogEntry(CheckpointId(f"{n:064x}"), (), step, 0.0, 1)


class _View:
    """What seek.find reads of a view: segments by id."""

    def __init__(self, objects: dict[ObjectId, bytes]) -> None:
        self.objects = objects

    def get(self, oid: str) -> bytes:
        return self.objects[ObjectId(oid)]


def test_seek_never_names_another_entry() -> None:
    """On a log whose steps do not increase (not one a save writes), the search finds an entry
    or gives None (the caller then walks), never a wrong one; on increasing steps, every
    entry."""
    for steps in (list(range(700)), random.Random(3).sample(range(700), 700)):
        entries = [_entry(n, s) for n, s in enumerate(steps)]
        new: dict[ObjectId, bytes] = {}
        head = build(Head("t", None), entries, entries[-1].id, new)
        view: Any = _View(new)
        found = [seek.find(head, view, e.id, e.step) for e in entries]
        assert all(f is None or f == e for f, e in zip(found, entries, strict=True))
        if steps == sorted(steps):
            assert found == entries
        assert seek.find(head, view, CheckpointId("ab" * 32), 5) is None


def test_a_recent_checkpoint_reads_one_leaf(counted: type[Reads]) -> None:
    """The head's checkpoint, or one just before the tail, is found in the newest leaf: one leaf
    read, as the walk from the newest entry read, not a binary search's several."""
    store, ids = _thread(2000 + 16 - 2000 % 16)  # (the tail is empty: the head is in a leaf)
    fresh = CheckpointStore.open(store.url)
    Reads.take()
    assert fresh.load("t", ids[-3]).state == {"i": len(ids) - 3}
    assert Reads.take() == 16
