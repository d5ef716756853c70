"""Local refs as two slots in one file (backends/slots.py): one flush per steady update, old
one-piece refs still read and converted, torn and damaged slots never read as heads."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import cas_checkpoint.backends.local as local
from cas_checkpoint import CheckpointStore, FormatError, IntegrityError
from cas_checkpoint.backends import ref_slots
from cas_checkpoint.engine.refs import thread_key


def _path(store: CheckpointStore, thread: str) -> str:
    return os.path.join(store.url, *thread_key(thread).split("/"))


def _flushes(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    counts = {"fsync": 0, "fdatasync": 0}

    def fsync(fd: int) -> None:
        counts["fsync"] += 1
        real_fsync(fd)

    def fdatasync(fd: int) -> None:
        counts["fdatasync"] += 1
        real_datasync(fd)

    real_fsync, real_datasync = os.fsync, local._datasync
    monkeypatch.setattr(local.os, "fsync", fsync)
    monkeypatch.setattr(local, "_datasync", fdatasync)
    return counts


def test_a_steady_save_flushes_once_and_a_new_ref_as_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    store.save("warm", {"a": 0})  # the folders exist
    counts = _flushes(monkeypatch)
    store.save("t", {"a": 1})  # a new ref: temp file, fsync, rename, folder fsync
    assert counts == {"fsync": 2, "fdatasync": 0}
    for i in range(2, 12):
        counts.update(fsync=0, fdatasync=0)
        store.save("t", {"a": i})  # fits in the ref: its free slot, one flush
        assert counts == {"fsync": 0, "fdatasync": 1}
    assert CheckpointStore.open(store.url).load("t").state == {"a": 11}
    assert len(store.history("t")) == 11


def test_a_ref_at_rest_has_one_valid_slot_and_slots_alternate(tmp_path: Path) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    seen = []
    for i in range(4):
        store.save("t", {"a": i})
        data = Path(_path(store, "t")).read_bytes()
        live = ref_slots.live(data)
        assert live is not None
        seen.append(live.index)
        other = data[(1 - live.index) * live.slot:][:ref_slots.HEADER]
        assert other[ref_slots.CHECKSUM_AT:ref_slots.NEXT_AT] == bytes(32)  # retired
    assert seen == [0, 1, 0, 1]


def test_a_one_piece_ref_of_an_older_version_is_read_and_converted(tmp_path: Path) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    store.save("t", {"a": 1})
    path = _path(store, "t")
    got = store.backend.read_ref(thread_key("t"))
    assert got is not None
    Path(path).write_bytes(got[0])  # what every version before slotted refs wrote
    fresh = CheckpointStore.open(store.url)
    assert fresh.load("t").state == {"a": 1}
    assert fresh.backend.read_ref(thread_key("t")) == got  # the same version token
    fresh.save("t", {"a": 2})
    assert ref_slots.is_slotted(Path(path).read_bytes())
    assert [h.step for h in CheckpointStore.open(store.url).history("t")] == [1, 0]


def test_a_torn_free_slot_is_never_read_and_is_overwritten(tmp_path: Path) -> None:
    """What a writer killed (or a power loss) in the middle of a slot write leaves."""
    store = CheckpointStore.open(str(tmp_path / "s"))
    first = store.save("t", {"a": 1})
    path = _path(store, "t")
    data = bytearray(Path(path).read_bytes())
    live = ref_slots.live(bytes(data))
    assert live is not None
    torn = ref_slots.encode_slot(live.seq + 1, b"CASH" + os.urandom(500))[:300]  # a part of one
    at = (1 - live.index) * live.slot
    data[at:at + len(torn)] = torn
    Path(path).write_bytes(bytes(data))
    fresh = CheckpointStore.open(store.url)
    assert fresh.head("t") == first.id
    second = fresh.save("t", {"a": 2})
    assert [h.id for h in CheckpointStore.open(store.url).history("t")] == [second.id, first.id]


def test_a_higher_seq_wins_when_the_retire_was_lost(tmp_path: Path) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    store.save("t", {"a": 1})
    old = Path(_path(store, "t")).read_bytes()
    second = store.save("t", {"a": 2})
    data = bytearray(Path(_path(store, "t")).read_bytes())
    live = ref_slots.live(bytes(data))
    assert live is not None
    stale = 1 - live.index
    data[stale * live.slot:(stale + 1) * live.slot] = old[:live.slot]  # un-retired
    Path(_path(store, "t")).write_bytes(bytes(data))
    assert CheckpointStore.open(store.url).head("t") == second.id


def test_a_damaged_slotted_ref_is_an_error_not_an_older_head(tmp_path: Path) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    store.save("t", {"a": 1})
    store.save("t", {"a": 2})
    path = _path(store, "t")
    data = bytearray(Path(path).read_bytes())
    live = ref_slots.live(bytes(data))
    assert live is not None
    data[live.index * live.slot + ref_slots.HEADER + 10] ^= 1
    Path(path).write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="both slots"):
        CheckpointStore.open(store.url).load("t")
    with pytest.raises(IntegrityError):  # and a writer does not write over it
        CheckpointStore.open(store.url).save("t", {"a": 3})
    Path(path).write_bytes(bytes(data[:5000]))  # a slotted file cut short
    with pytest.raises(FormatError, match="damaged"):
        CheckpointStore.open(store.url).load("t")


def test_a_head_that_outgrows_its_slot_is_written_whole(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    store.save("t", {"a": 1})
    size = os.path.getsize(_path(store, "t"))
    counts = _flushes(monkeypatch)
    labels = []
    for i in range(40):  # long labels, kept in the head's recent log entries
        labels.append("x" * 900 + str(i))
        store.save("t", {"a": i}, label=labels[-1])
    assert os.path.getsize(_path(store, "t")) > size
    assert counts["fsync"] >= 2  # rewritten whole at least once
    fresh = CheckpointStore.open(store.url)
    assert [h.label for h in fresh.history("t")][:40] == labels[::-1]


def test_slots_unit() -> None:
    head = b"CASH" + bytes(range(256)) * 3
    data = ref_slots.new_file(7, head)
    assert len(data) % (2 * ref_slots.BLOCK) == 0 and ref_slots.is_slotted(data)
    live = ref_slots.live(data)
    assert live is not None and (live.index, live.seq, live.head) == (0, 7, head)
    assert ref_slots.live(bytes(len(data))) is None
    with pytest.raises(ValueError):
        ref_slots.live(data[:-1])
    broken: Any = bytearray(data)
    broken[ref_slots.CHECKSUM_AT + 31] ^= 1  # the checksum
    assert ref_slots.live(bytes(broken)) is None
    assert not ref_slots.fits(ref_slots.BLOCK, ref_slots.BLOCK)
    assert ref_slots.fits(ref_slots.BLOCK, 100) and not ref_slots.fits(64 * ref_slots.BLOCK, 100)


def test_the_head_a_save_remembers_is_the_one_a_read_decodes(tmp_path: Path) -> None:
    """A save keeps the head it wrote as the decoded form of the bytes it wrote (a load that
    follows does not decode them again): it must be exactly what decoding them gives."""
    from cas_checkpoint.format.heads import Head

    store = CheckpointStore.open(str(tmp_path / "s"))
    key = thread_key("t")
    for i in range(40):  # inline objects, flushes into packs, log segments, labels, metadata
        store.save("t", {"messages": [{"i": j, "x": "y" * 300} for j in range(i * 3)]},
                   label=f"l{i}" if i % 5 == 0 else None, tags=["a"] if i % 2 else (),
                   metadata={"i": i})
        data, head = store.refs._decoded[key]
        assert head == Head.decode(data, key), i
        got = store.backend.read_ref(key)
        assert got is not None and got[0] == data


def test_an_empty_ref_file_is_a_format_error(tmp_path: Path) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    store.save("t", {"a": 1})
    Path(_path(store, "t")).write_bytes(b"")
    with pytest.raises(FormatError):
        CheckpointStore.open(store.url).load("t")


def _spy_folder_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The folders the local backend fsyncs from now on, in order (each still fsynced)."""
    from cas_checkpoint.backends.local import LocalBackend

    synced: list[str] = []
    real = LocalBackend._fsync_dir

    def spy(folder: str) -> None:
        synced.append(folder)
        real(folder)

    monkeypatch.setattr(LocalBackend, "_fsync_dir", staticmethod(spy))
    return synced


def test_new_folders_are_made_durable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pack in a new packs/ab folder, and the ref naming it, survive power loss only if the
    folders' own entries do: the first time a process uses a folder, each folder between the
    root and it is fsynced (also when another process made it): its parent the first time a
    process uses it, each folder above once per process. Pack folders are made in batches that
    double (pack_folders.py), each covered by one flush of packs/: the first pack makes its own
    folder only, and 40 saves flush packs/ at most 9 times (old code: all 256 folders before
    the first pack; older code: a flush of packs/ the first time each folder was used)."""

    synced = _spy_folder_fsyncs(monkeypatch)
    events: list[tuple[str, str]] = []  # ("mkdir" | "fsync", folder), in order
    real_mkdir, real_sync = os.mkdir, local.LocalBackend._fsync_dir

    def spy_mkdir(path: Any, *a: Any, **k: Any) -> None:
        real_mkdir(path, *a, **k)
        events.append(("mkdir", os.fspath(path)))

    def spy_sync(folder: str) -> None:
        events.append(("fsync", folder))
        real_sync(folder)  # (the spy above: into synced too)

    monkeypatch.setattr(os, "mkdir", spy_mkdir)
    monkeypatch.setattr(local.LocalBackend, "_fsync_dir", staticmethod(spy_sync))
    root = str(tmp_path / "new" / "store")
    packs = os.path.join(root, "packs")
    store = CheckpointStore.open(root, compression="none")
    assert str(tmp_path / "new") in synced  # the root's own name
    store.save("t", {"blob": "x" * 20_000})  # a pack: packs/ab/... and then refs/heads/t
    for folder in (root, packs, os.path.join(root, "refs")):
        assert folder in synced, folder

    def durable() -> set[str]:
        """The folders holding packs, each made before a flush of packs/."""
        dirs = {os.path.dirname(os.path.join(root, i.key)) for i in store.backend.list("packs")}
        for d in dirs:
            at = events.index(("mkdir", d))
            assert ("fsync", packs) in events[at:], d
        return dirs

    first = durable()
    assert sorted(os.listdir(packs)) == sorted(os.path.basename(d) for d in first)
    flushes = synced.count(packs)
    for i in range(40):
        synced.clear()
        store.save("t", {"blob": f"{i}" * 20_000})
        assert root not in synced  # packs/ itself: its name was made durable already
        flushes += synced.count(packs)
    seen = durable()
    assert len(seen) > len(first) + 10  # (packs went into folders not used before)
    assert flushes <= 9, flushes  # batches of 1, 2, 4, ... 256 folders
    assert len(os.listdir(packs)) <= 256
    synced.clear()
    other = CheckpointStore.open(root)  # another process: its first use syncs again
    other.save("u", {"blob": "z" * 20_000})
    assert packs in synced and root in synced


def test_reading_back_a_ref_this_object_wrote_hashes_nothing_but_checks_its_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The slot a backend wrote is read back without hashing (its exact bytes are compared with
    what it wrote, checksum included); any other bytes are hashed as before."""
    from cas_checkpoint.backends import base

    store = CheckpointStore.open(str(tmp_path / "s"))
    backend, key = store.backend, thread_key("t")
    assert isinstance(backend, local.LocalBackend)
    hashed: list[int] = []
    real_checksum, real_version = ref_slots._checksum, base._version
    monkeypatch.setattr(ref_slots, "_checksum", lambda seq, head: hashed.append(1)
                        or real_checksum(seq, head))
    monkeypatch.setattr(local, "_version", lambda data: hashed.append(2) or real_version(data))
    for i in range(12):  # a new file, then slots in turn, then a bigger file
        store.save("t", {"x": "y" * (40 * i * i)})
        hashed.clear()
        got = backend.read_ref(key)
        assert got is not None and hashed == [], i
        assert got == (store.refs._decoded[key][0], real_version(got[0]))
        other = local.LocalBackend(backend.root).read_ref(key)  # knows nothing: hashes
        assert other == got and hashed.count(1) == 1 and hashed.count(2) == 1
    path = _path(store, "t")
    data = bytearray(Path(path).read_bytes())
    live = ref_slots.live(bytes(data))
    assert live is not None
    at = live.index * live.slot + ref_slots.HEADER + len(live.head) // 2
    data[at] ^= 1  # a byte of the live head: no longer what this object wrote
    Path(path).write_bytes(bytes(data))
    with pytest.raises(IntegrityError):
        backend.read_ref(key)


def test_a_reused_object_has_its_folder_fsynced(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """An object another process wrote (same name, same size: a merge two writers both made, a
    pack written again after a lost race) is reused, not written again. Its bytes were fsynced
    before it was linked, but if that writer was killed between its link and its folder fsync,
    its name may not be durable: the reusing put fsyncs the folder, as after a write of its own,
    before it returns (and so before a ref may name the object)."""

    root = str(tmp_path / "s")
    store = CheckpointStore.open(root, compression="none")
    store.save("a", {"blob": "y" * 20_000})
    keys = [i.key for i in store.backend.list("packs")]
    assert keys
    items = {k: Path(root, k).read_bytes() for k in keys}
    synced = _spy_folder_fsyncs(monkeypatch)
    other = CheckpointStore.open(root, compression="none").backend  # another process's
    inodes = {k: os.stat(Path(root, k)).st_ino for k in keys}
    other.put_many(items)
    assert {k: os.stat(Path(root, k)).st_ino for k in keys} == inodes  # reused, not rewritten
    for k in keys:
        assert os.path.dirname(os.path.join(root, k)) in synced, (k, synced)
    assert os.path.join(root, "packs") in synced  # the pack's folder's own name, too
