"""Issue 29, "long threads stay flat": packs of ``archive.ARCHIVE_LEVEL`` leave the head for its
archive (``archive.py``), so a save's bytes stop growing with the thread, and a load of the head
and ``history(limit=10)`` read the head's own packs, not every pack of the thread."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from conftest import open_store

from cas_checkpoint import CheckpointStore
from cas_checkpoint.engine import archive
from cas_checkpoint.engine import staging as packing
from cas_checkpoint.engine.object_store import pack_key
from cas_checkpoint.errors import FormatError
from cas_checkpoint.format.heads import Head, PackRef
from cas_checkpoint.format.objects import ObjectId, object_id
from cas_checkpoint.format.pack import decode_pack


def _objects(save: int) -> dict[ObjectId, bytes]:
    """What one save adds: two objects of ~200 bytes, unique to the save."""
    out = {}
    for i in range(2):
        data = b"CASN\x03\x00" + save.to_bytes(4, "big") + bytes([i]) * 200
        out[object_id(data)] = data
    return out


def _grow(saves: int, marks: tuple[int, ...]) -> tuple[dict[int, tuple[int, int]], Head,
                                                       dict[ObjectId, bytes]]:
    """Stage ``saves`` saves that each flush a pack (uncompressed: the bytes are exact); at each
    of ``marks``, the bytes written so far (packs and head) and the most one save wrote."""
    store: dict[ObjectId, bytes] = {}

    def read(ids: list[ObjectId]) -> dict[ObjectId, dict[ObjectId, memoryview]]:
        return {i: decode_pack(store[i]) for i in ids}

    head, total, worst, out = Head("t", None), 0, 0, {}
    for n in range(1, saves + 1):
        head, packs = packing.stage(head, _objects(n), read, inline_max=0)
        store.update(packs)
        wrote = sum(map(len, packs.values())) + len(head.encode())
        total, worst = total + wrote, max(worst, wrote)
        if n in marks:
            out[n] = (total, worst)
    return out, head, store


def test_bytes_written_a_save_are_the_same_at_1000_and_at_20000_saves() -> None:
    """Exact bytes (packs and ref) of a thread whose every save flushes a pack: 2,003 a save
    over the first 1,000 saves, 2,133 over 20,000, and no save past 115 KB. Old code: 2,015
    and 3,107 (1.54x, a merge level more each 4x of the thread), and one save of 6.2 MB (a
    merge rewrote the whole thread): each object is rewritten at most ARCHIVE_LEVEL times."""
    got, head, _ = _grow(20000, (1000, 20000))
    assert got == {1000: (2002663, 110860), 20000: (42665572, 114164)}, got
    assert got[20000][0] / 20000 <= 1.1 * got[1000][0] / 1000
    assert head.archive is not None and len(head.packs) <= packing.MAX_PACKS


def test_the_head_names_its_newest_saves_and_the_archive_the_rest() -> None:
    """Every object of the thread is in the head's packs or in the archive's, none twice in the
    archive; the head's packs hold the newest saves and stay small."""
    saves = 3000
    _, head, store = _grow(saves, ())
    assert head.archive is not None
    listed = archive.of_pack(decode_pack(store[head.archive.id]))
    held: set[ObjectId] = set()
    for p in (*head.packs, *listed):
        objects = set(decode_pack(store[p.id]))
        assert not objects & held
        held |= objects
    assert held == {oid for n in range(1, saves + 1) for oid in _objects(n)}
    recent: set[ObjectId] = set()
    for p in head.packs:
        recent |= set(decode_pack(store[p.id]))
    assert {oid for n in range(saves - 60, saves + 1) for oid in _objects(n)} <= recent
    assert sum(p.size for p in head.packs) <= 4 ** archive.ARCHIVE_LEVEL * 2 * 430
    assert all(p.level >= archive.ARCHIVE_LEVEL for p in listed)


def test_an_archive_object_is_checked_like_any_untrusted_bytes() -> None:
    good = archive.encode([PackRef(ObjectId("ab" * 32), 4, 10, 2)])
    assert archive.decode(good) == (PackRef(ObjectId("ab" * 32), 4, 10, 2),)
    for bad in (good[:-3], good[:5] + b"\x81\xa1a\x01", b"CASN\x03\x90",
                good[:5] + b"\x91\x94\xc4\x20" + b"\x00" * 32 + b"\x40\x01\x01",
                good[:5] + b"\xdd\xff\xff\xff\xff"):
        with pytest.raises(FormatError):
            archive.decode(bad)


def _window(store: CheckpointStore, saves: int, start: int = 0) -> list[str]:
    ids = []
    window: list[str] = []
    for i in range(start, start + saves):
        window = (window + [f"message {i} " * 12])[-20:]
        ids.append(store.save("t", {"messages": window, "step": i}).id)
    return ids


class _Counting:
    """Counts the pack keys a backend is asked for."""

    def __init__(self, store: CheckpointStore) -> None:
        self.keys: list[str] = []
        backend = store.backend
        real = backend.get_many

        def get_many(keys: list[str]) -> dict[str, bytes | None]:
            self.keys.extend(k for k in keys if k.startswith("packs/"))
            return real(keys)

        backend.get_many = get_many  # type: ignore[method-assign]


@pytest.mark.parametrize("backend_kind", ["local", "memory", "s3"])
def test_a_cold_load_and_history_read_the_heads_packs_only(
        tmp_path: Any, request: pytest.FixtureRequest, backend_kind: str) -> None:
    """A long thread (every save flushes): a new store object loads the head and lists the
    newest 10 checkpoints reading the head's own packs, not the archive's (old code: every
    pack of the thread); an old checkpoint, the whole history, gc and verify see all of it."""
    store = open_store(backend_kind, tmp_path, request)
    store.refs.inline_max = 1
    saves = 1400 if backend_kind != "s3" else 700
    ids = _window(store, saves)
    ref = store.refs.read("t")
    assert ref is not None and ref.head.archive is not None
    own = {pack_key(p.id) for p in ref.head.packs}
    cold = type(store).open(store.url, **({} if backend_kind != "s3" else {
        "storage_options": request.getfixturevalue("moto_server")["storage_options"]}))
    seen = _Counting(cold)
    assert cold.load("t").state["step"] == saves - 1
    assert [c.id for c in cold.history("t", limit=10)] == ids[::-1][:10]
    assert set(seen.keys) <= own, set(seen.keys) - own
    # an old checkpoint is in the archive: its load reads it
    assert cold.load("t", ids[3]).state["step"] == 3
    assert [c.id for c in cold.history("t")] == ids[::-1]
    store.gc(grace=timedelta(0), force=True)  # (what merges replaced: the writer deleted it
    # all but its last commits' share, which gc may find; it must not take what the head needs)
    fresh = type(store).open(store.url, **({} if backend_kind != "s3" else {
        "storage_options": request.getfixturevalue("moto_server")["storage_options"]}))
    assert [fresh.load("t", c).state["step"] for c in ids[::97]] == list(range(saves))[::97]
    report = fresh.verify()
    assert report.ok, report


def test_a_head_whose_state_needs_the_archive_loads_it(tmp_path: Any) -> None:
    """A state that keeps an old value (saved once, long ago: in an archived pack) loads from a
    new store object: the head's packs do not hold it, so the load reads the archive too."""
    store = CheckpointStore.open(str(tmp_path / "s"))
    store.refs.inline_max = 1
    first = "system prompt " * 200
    for i in range(1200):
        store.save("t", {"system": first, "step": i, "m": f"message {i} " * 10})
    cold = CheckpointStore.open(str(tmp_path / "s"))
    got = cold.load("t").state
    assert got["system"] == first and got["step"] == 1199


def test_fork_and_copy_of_a_long_thread_keep_its_archive(tmp_path: Any) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    store.refs.inline_max = 1
    ids = _window(store, 1100)
    store.fork("t", ids[5], "f")
    _window(store, 600, start=1100)  # the source goes on (and archives more)
    time.sleep(0.01)
    store.gc(grace=timedelta(0))
    fresh = CheckpointStore.open(str(tmp_path / "s"))
    assert fresh.load("f").state["step"] == 5
    assert [c.id for c in fresh.history("f")] == ids[:6][::-1]
    assert fresh.load("t", ids[1]).state["step"] == 1
    assert fresh.verify().ok


def test_gc_with_its_summary_keeps_a_long_threads_archived_packs(
        tmp_path: Any, monkeypatch: Any) -> None:
    """A long thread names packs through its archive too: gc's summary records them all (its
    archive pack and the packs that lists), so it stands in for the ref like any other: a
    second gc (the summary in use, the ref unchanged) reads no ref and no archive, deletes
    none of the archived packs, and a new store object loads every checkpoint (a version that
    recorded only the head's own packs deleted them all)."""
    import time
    from datetime import timedelta

    from cas_checkpoint.maintenance import ref_summary

    store = CheckpointStore.open(str(tmp_path / "s"))
    store.refs.inline_max = 1
    store.refs.collect_after = None  # (merge garbage left to gc: this is gc's test)
    ids = _window(store, 1200)
    time.sleep(ref_summary.RACY + 1)  # (a ref written in the run's clock tick is read again)
    # gc audits a random sample of the refs its summary stood in for; in a big store the
    # sample misses most refs: here it misses all of them
    monkeypatch.setattr(ref_summary, "audit_sample", lambda keys: [])
    first = store.gc(grace=timedelta(0), force=True)
    again = store.gc(grace=timedelta(0), force=True)
    assert first.summary in ("none", "rebuilt") and again.summary == "used"
    assert again.refs_read == 0 and again.requests["get"] == 1  # (the summary alone)
    assert again.deleted_objects == 0
    cold = CheckpointStore.open(str(tmp_path / "s"))
    for cid in ids[::97] + ids[-3:]:
        assert cold.load("t", cid).id == cid


def test_stats_count_a_long_threads_archived_packs(tmp_path: Any) -> None:
    """stats(by_thread=True): a long thread's physical bytes and packs are those of every pack
    it names, its archive's and the archived ones too, so with gc done and no pack shared the
    threads' figures add up to the store's, which equal the listing's (old code: the head's
    own packs only, 93 KB of the thread's 1.3 MB)."""
    store = CheckpointStore.open(str(tmp_path / "s"))
    store.refs.inline_max = 1
    _window(store, 1100)
    store.save("u", {"short": 1})
    time.sleep(0.01)
    store.gc(grace=timedelta(0))
    packs = store.backend.list("packs")
    refs = store.backend.list("refs")
    listed = sum(i.size for i in packs) + sum(i.size for i in refs)
    fresh = CheckpointStore.open(str(tmp_path / "s"))
    head = fresh.refs.read("t")
    assert head is not None and head.head.archive is not None
    for stats in (fresh.stats(by_thread=True), fresh.stats()):
        assert (stats.physical_bytes, stats.objects) == (listed, len(packs))
        assert stats.checkpoints == 1101
    per = fresh.stats(by_thread=True).by_thread
    assert per["t"].checkpoints == 1100
    assert sum(t.physical_bytes for t in per.values()) == listed
    assert sum(t.packs for t in per.values()) == len(packs)
    assert per["t"].packs > len(head.head.packs) + 1


def test_a_summary_leaving_out_a_long_threads_archive_is_caught(tmp_path: Any) -> None:
    """A summary (of the format before the split: still read) that records only the long
    thread's own packs, as gc's summary once did: the audit before deleting compares every pack
    the ref names, its archive's included, finds the entry wrong, reads every ref, and deletes
    none of the archived packs."""
    from cas_checkpoint.engine.refs import HEADS
    from cas_checkpoint.maintenance import ref_summary

    store = CheckpointStore.open(str(tmp_path / "s"))
    store.refs.inline_max = 1
    ids = _window(store, 1100)
    store.save("short", {"x": 1})
    store.gc(grace=timedelta(0))
    store.delete_thread("short")  # garbage: gc deletes, so it audits
    time.sleep(ref_summary.RACY + 1)
    head = store.refs.read("t")
    assert head is not None and head.head.archive is not None
    lie = {i.key: ref_summary.Entry(i.version, i.mtime, frozenset(p.id for p in head.head.packs))
           for i in store.backend.list(HEADS)}
    data = ref_summary.encode(time.time() + 3600, lie)
    store.backend.delete_many([i.key for i in store.backend.list(ref_summary.FOLDER)])
    store.backend.put_many({ref_summary.key_of(data): data})
    report = store.gc(grace=timedelta(0))
    assert report.summary == "rebuilt" and report.deleted_objects >= 1
    cold = CheckpointStore.open(str(tmp_path / "s"))
    for cid in ids[::97]:
        assert cold.load("t", cid).id == cid
