"""Issue 29: loading an old checkpoint of a long thread by id reads O(log n) of its log, not the
log from its newest entry back (``engine/seek.py``); the answer is exact whatever the log."""

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


def test_load_by_id_is_exact_on_edited_logs() -> None:
    """Every checkpoint loads by id after deletes, a rewind and more saves; one that left the
    log (deleted, rewound past) is not in the thread, though its objects may remain."""
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
        else:
            assert fresh.load("t", cid).state == {"i": i}
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
