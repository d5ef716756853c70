"""Retention (prune) and garbage collection, on memory:// and a local directory; gc on S3
(moto) too, where it judges age by S3's whole-second LastModified, deletes by its own
strategy and counts requests (``s3_matters``). Prune is ref logic: no backend changes it."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cas_checkpoint import (
    CheckpointStore,
    InvalidArgumentError,
    NotFoundError,
)
from cas_checkpoint.backends import Backend, LocalBackend, MemoryBackend, ObjectInfo
from cas_checkpoint.engine.object_store import key_pack_id
from cas_checkpoint.maintenance import gc as gcmod

GC_ON_S3 = pytest.mark.s3_matters("gc on S3: 1-second LastModified, its delete strategy, requests")


def is_s3(store: CheckpointStore) -> bool:
    return store.url.startswith("s3://")


def gc0(store: CheckpointStore, **kw: Any) -> gcmod.GCReport:
    """gc with no grace; on S3 (1-second LastModified) first let a second pass."""
    if is_s3(store):
        time.sleep(1.1)
        kw["force"] = True
    return store.gc(grace=timedelta(0), **kw)


def pack_ids(store: CheckpointStore) -> set[str]:
    """Every pack stored."""
    return {p for p in (key_pack_id(i.key) for i in store.backend.list("packs")) if p}


def named(store: CheckpointStore) -> set[str]:
    """Every pack some ref names."""
    out: set[str] = set()
    for thread in store.threads():
        ref = store.refs.read(thread)
        assert ref is not None
        out |= {p.id for p in ref.head.packs}
    return out


def packed(store: CheckpointStore, **kw: Any) -> CheckpointStore:
    """Objects flushed into a pack on every save: many packs, many merges."""
    store.refs.inline_max = 1
    return store


def fresh(store: CheckpointStore) -> CheckpointStore:
    """Another store on the same storage, with an empty cache."""
    return CheckpointStore.from_backend(store.backend, types=store.types)


def all_load(store: CheckpointStore) -> int:
    """Load every checkpoint of every thread from an uncached store; returns how many."""
    s, n = fresh(store), 0
    for thread in s.threads():
        for info in s.history(thread):
            assert s.load(thread, info.id).id == info.id
            n += 1
    return n


def state(i: int, n: int = 12) -> dict[str, Any]:
    """A state whose messages list (over 1 KB) is split into stored nodes under a root small
    enough to live inside its record."""
    return {"step": i, "messages": [f"message {i}-{k} " * 8 for k in range(n)]}


# --- prune -------------------------------------------------------------------------------------


def test_prune_keep_last_keeps_head_and_last_n(store: CheckpointStore) -> None:
    ids = [store.save("t", state(i)).id for i in range(10)]
    report = store.prune("t", keep_last=3)
    assert [c.id for c in store.history("t")] == ids[:-4:-1]
    p = report.threads["t"]
    assert p.kept == tuple(ids[-3:]) and p.removed == tuple(ids[:-3])
    assert (report.kept, report.removed, report.dry_run) == (3, 7, False)
    assert store.load("t").state == state(9) and store.load("t", ids[7]).state == state(7)
    assert store.get(ids[0]).state == state(0)  # objects stay until repack and gc
    assert store.save("t", state(10)).parent_ids == (ids[-1],)


def test_prune_keeps_labeled_unless_told_and_always_the_head(store: CheckpointStore) -> None:
    ids = [store.save("t", state(i), label="x" if i == 1 else None,
                      tags=["keep"] if i == 3 else ()).id for i in range(6)]
    report = store.prune("t", keep_last=1)  # labelled ones stay; a tag alone keeps nothing
    assert {c.id for c in store.history("t")} == {ids[1], ids[5]}
    assert report.reasons == {"head": 1, "last": 0, "recent": 0, "labeled": 1, "tagged": 0}
    assert "1 head, 1 labeled" in report.to_text()
    store.prune("t", keep_last=0, keep_labeled=False)
    assert [c.id for c in store.history("t")] == [ids[5]]  # the head stays, whatever the policy
    assert store.count("t") == 1


def test_prune_keeps_tags_only_when_asked(store: CheckpointStore) -> None:
    """A loop that tags every step (as the README's example does) still prunes with keep_last;
    keep_tags lists the tags that keep a checkpoint."""
    ids = [store.save("t", state(i), tags=["tool", "milestone" if i in (2, 5) else "step"]).id
           for i in range(12)]
    dry = store.prune("t", keep_last=3, keep_tags=["milestone"], dry_run=True)
    assert dry.reasons["tagged"] == 2 and dry.reasons["head"] + dry.reasons["last"] == 3
    report = store.prune("t", keep_last=3)
    assert report.removed == 9 and [c.id for c in store.history("t")] == ids[:-4:-1]
    with pytest.raises(InvalidArgumentError, match="keep_tags"):
        store.prune("t", keep_last=1, keep_tags="milestone")


def test_prune_head_kept_after_rewind(store: CheckpointStore) -> None:
    ids = [store.save("t", state(i)).id for i in range(5)]
    store.rewind("t", ids[2])
    report = store.prune("t", keep_last=0)
    assert [c.id for c in store.history("t")] == [ids[2]] and report.removed == 2


def test_prune_older_than(store: CheckpointStore) -> None:
    old = [store.save("t", state(i)).id for i in range(3)]
    time.sleep(1.6)  # the old ones are older than 1.5 s; the new ones have 1.5 s to be saved
    new = [store.save("t", state(i)).id for i in range(3, 5)]
    report = store.prune("t", older_than=timedelta(seconds=1.5))
    assert [c.id for c in store.history("t")] == new[::-1]
    assert report.threads["t"].removed == tuple(old)
    # with keep_last as well, a checkpoint is kept if any rule keeps it
    store.prune("t", keep_last=1, older_than=timedelta(hours=1))
    assert store.count("t") == 2


def test_prune_dry_run_changes_nothing(store: CheckpointStore) -> None:
    for i in range(6):
        store.save("t", state(i))
    before = store.refs.read("t")
    report = store.prune(keep_last=2, dry_run=True)
    assert report.dry_run and report.removed == 4 and report.threads["t"].kept
    assert store.refs.read("t") == before and store.count("t") == 6
    assert "would remove 4" in report.to_text()


def test_prune_every_thread_and_errors(store: CheckpointStore) -> None:
    for t in ("a", "b"):
        for i in range(4):
            store.save(t, state(i))
    report = store.prune(keep_last=1)
    assert set(report.threads) == {"a", "b"} and report.removed == 6
    assert store.count("a") == store.count("b") == 1
    with pytest.raises(InvalidArgumentError, match="keep_last"):
        store.prune("a")
    with pytest.raises(InvalidArgumentError):
        store.prune("a", keep_last=-1)
    with pytest.raises(NotFoundError):
        store.prune("nope", keep_last=1)


def test_prune_never_loses_a_concurrent_save(store: CheckpointStore) -> None:
    ids = [store.save("t", state(i)).id for i in range(5)]
    other = fresh(store)
    real = store._core.refs.entries  # a step (ops.py): wrapped as one
    calls = {"n": 0, "id": ""}

    def entries(head: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:  # inside prune's compare-and-swap: another writer saves first
            calls["id"] = other.save("t", state(99)).id
        return (yield from real(head))

    store._core.refs.entries = entries  # type: ignore[method-assign]
    store.prune("t", keep_last=2)
    assert [c.id for c in store.history("t")] == [calls["id"], ids[4]]
    assert store.load("t").state == state(99)


def test_prune_on_save_keep_last(make_store: Any) -> None:
    store = make_store(keep_last=5)
    ids = [store.save("t", state(i), label="L" if i == 2 else None).id for i in range(60)]
    count = store.count("t")
    assert 5 + 1 <= count <= 5 + 1 + gcmod.save_slack(5)
    kept = [c.id for c in store.history("t")]
    assert kept[:5] == ids[:-6:-1] and ids[2] in kept and ids[0] not in kept
    assert all(store.load("t", c).id == c for c in kept)
    assert store.load("t").state == state(59)
    with pytest.raises(InvalidArgumentError):
        make_store(keep_last=-2)


def test_prune_due_is_amortised() -> None:
    due = [n for n in range(1, 200) if gcmod.prune_due(n, 40)]
    assert due == [40 + 16 * k for k in range(1, 10)]
    assert gcmod.save_slack(400) == 100


# --- gc ----------------------------------------------------------------------------------------


@GC_ON_S3
def test_gc_deletes_exactly_the_packs_no_ref_names(store: CheckpointStore) -> None:
    packed(store)
    ids = [store.save("t", state(i)).id for i in range(12)]  # merges leave packs unnamed
    store.save("u", state(1))
    store.rewind("t", ids[5])
    before = pack_ids(store)
    garbage = before - named(store)
    assert garbage  # merged-away packs
    report = gc0(store)
    assert set(report.deleted) == garbage and report.deleted_objects == len(garbage)
    assert pack_ids(store) == before - garbage == named(store)
    assert report.scanned_objects == len(before)
    assert report.reachable_objects == len(before) - len(garbage)
    assert report.young_objects == 0 and report.refreshed_objects == 0
    assert report.deleted_bytes > 0 and report.threads == 2 and report.seconds > 0
    assert report.requests["list"] >= 1
    # the two refs (read again in the round after listing where the listing gives no version
    # or they were written within the last clock tick), no object
    assert report.requests["get"] == report.refs_read and report.refs_read in (2, 4)
    assert all_load(store) == 7
    assert gc0(store).deleted_objects == 0


@GC_ON_S3
def test_gc_of_a_store_whose_objects_are_all_inline(store: CheckpointStore) -> None:
    ids = [store.save("t", {"step": i}).id for i in range(3)]
    assert pack_ids(store) == set()  # small states live inside the ref
    report = gc0(store)
    assert report.deleted_objects == 0 and report.scanned_objects == 0
    assert [fresh(store).load("t", c).state for c in ids] == [{"step": i} for i in range(3)]


@GC_ON_S3
def test_gc_keeps_young_garbage_and_dry_run_deletes_nothing(store: CheckpointStore) -> None:
    packed(store)
    for i in range(8):
        store.save("t", state(i))
    before = pack_ids(store)
    young = store.gc()  # default grace: 1 hour
    assert young.deleted_objects == 0 and young.young_objects > 0
    dry = gc0(store, dry_run=True)
    assert dry.dry_run and dry.deleted_objects == young.young_objects
    assert pack_ids(store) == before
    real = gc0(store)
    assert set(real.deleted) == set(dry.deleted)
    assert "deleted" in real.to_text() and real.to_dict()["deleted_objects"] == len(real.deleted)


@GC_ON_S3
def test_gc_after_delete_thread_removes_all_its_packs(store: CheckpointStore) -> None:
    packed(store)
    for i in range(20):  # more than 16: log segments too
        store.save("t", state(i))
    store.fork("t", store.history("t")[5].id, "f")
    store.delete_thread("t")
    assert pack_ids(store) - named(store)
    store.delete_thread("f")
    gc0(store)
    assert pack_ids(store) == set()
    assert store.threads() == []


@GC_ON_S3
def test_gc_keeps_what_a_fork_names(store: CheckpointStore) -> None:
    packed(store)
    ids = [store.save("t", state(i, 40)).id for i in range(20)]
    store.fork("t", ids[12], "f")
    store.save("f", state(100, 40))
    store.delete_thread("t")
    report = gc0(store)
    assert report.deleted_objects > 0 and pack_ids(store) == named(store)
    s = fresh(store)
    assert s.load("f", ids[12]).state == state(12, 40)
    assert [c.id for c in s.history("f")][1:] == ids[12::-1]
    assert all_load(store) == 14


def test_prune_then_repack_then_gc_frees_the_pruned(store: CheckpointStore) -> None:
    packed(store)
    ids = [store.save("t", {"step": i, "doc": f"{i}" * 3000}).id for i in range(6)]
    store.prune("t", keep_last=1)
    assert store.repack("t").threads[0].repacked
    gc0(store)
    assert pack_ids(store) == named(store) and len(pack_ids(store)) == 1
    cp = fresh(store).load("t")
    assert cp.parent_ids == (ids[4],) and cp.state["step"] == 5  # parents are not followed
    with pytest.raises(NotFoundError):
        fresh(store).get(ids[4])


def test_gc_storage_mtime_decides(make_store: Any, backend_kind: str) -> None:
    if backend_kind == "s3":
        pytest.skip("S3 LastModified cannot be set; covered by the refresh test")
    store = packed(make_store())
    for i in range(8):
        store.save("t", state(i))
    garbage = pack_ids(store) - named(store)
    assert garbage
    age(store, garbage, hours=2)
    report = store.gc(grace=timedelta(hours=1))
    assert set(report.deleted) == garbage


def age(store: CheckpointStore, pids: set[str], hours: float) -> None:
    when = time.time() - hours * 3600
    for pid in pids:
        key = f"packs/{pid[:2]}/{pid[2:]}"
        if isinstance(store.backend, LocalBackend):
            os.utime(os.path.join(store.backend.root, *key.split("/")), (when, when))
        else:
            assert isinstance(store.backend, MemoryBackend)
            f = store.backend.fs.store[f"{store.backend.root}/{key}"]
            f.modified = datetime.fromtimestamp(when, UTC)


@GC_ON_S3
def test_putting_an_existing_pack_refreshes_it(make_store: Any, backend_kind: str) -> None:
    """A writer that puts a pack which exists (a retried save, an identical repack) moves its
    modified time, so a gc judging it by age keeps it."""
    store = packed(make_store())
    for i in range(8):
        store.save("t", state(i))
    orphan = sorted(pack_ids(store) - named(store))[0]
    key = f"packs/{orphan[:2]}/{orphan[2:]}"
    data = store.backend.get(key)
    if backend_kind == "s3":
        time.sleep(2.2)
        grace = timedelta(seconds=2)
    else:
        age(store, {orphan}, hours=2)
        grace = timedelta(hours=1)
    store.backend.put_many({key: data})  # reused: refreshed, not rewritten
    report = store.gc(grace=grace)
    assert orphan not in set(report.deleted) and orphan in pack_ids(store)


@GC_ON_S3
def test_gc_refuses_subsecond_grace_on_s3_and_bad_grace(store: CheckpointStore) -> None:
    with pytest.raises(InvalidArgumentError):
        store.gc(grace=timedelta(seconds=-1))
    if is_s3(store):
        with pytest.raises(InvalidArgumentError, match="1 second"):
            store.gc(grace=timedelta(seconds=0.5))
        store.gc(grace=timedelta(seconds=0.5), force=True)


def test_gc_progress_reports_phases(store: CheckpointStore) -> None:
    packed(store)
    for i in range(8):
        store.save("t", state(i))
    seen: list[tuple[str, int, int]] = []
    gc0(store, progress=lambda phase, done, total: seen.append((phase, done, total)))
    phases = {p for p, _, _ in seen}
    assert {"mark", "list", "sweep"} <= phases
    assert all(0 <= d <= t for _, d, t in seen)


# --- the final check of each storage, driven by hand -------------------------------------------


def _candidates(store: CheckpointStore) -> tuple[list[ObjectInfo], set[str]]:
    packed(store)
    for i in range(8):
        store.save("t", state(i))
    garbage = pack_ids(store) - named(store)
    infos = [i for i in store.backend.list("packs") if key_pack_id(i.key) in garbage]
    assert len(infos) >= 2
    return infos, garbage


def _collector(store: CheckpointStore) -> Any:
    return gcmod._Collector(store.backend, gcmod.GCReport(store.url, False, 0.0), None)


def test_local_sweep_puts_back_what_a_writer_refreshed(tmp_path: Any) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    infos, garbage = _candidates(store)
    assert isinstance(store.backend, LocalBackend)
    cutoff = time.time() + 100  # every candidate looks old...
    refreshed = infos[0]
    os.utime(os.path.join(store.backend.root, *refreshed.key.split("/")),
             (cutoff + 1, cutoff + 1))  # ...but a writer refreshed this one after the listing
    deleted = gcmod._sweep_atomic(store.backend, infos, cutoff, _collector(store))
    assert refreshed not in deleted and len(deleted) == len(infos) - 1
    assert pack_ids(store) & garbage == {key_pack_id(refreshed.key)}
    assert os.listdir(os.path.join(store.backend.root, "gc")) == []  # no trash left


def test_local_put_rewrites_an_object_gc_took_meanwhile(tmp_path: Any,
                                                        monkeypatch: Any) -> None:
    store = packed(CheckpointStore.open(str(tmp_path / "s")))
    store.save("t", state(1))
    key = next(i.key for i in store.backend.list("packs"))
    data = store.backend.get(key)
    path = os.path.join(store.backend.root, *key.split("/"))
    real = os.utime

    def utime(p: str, *a: Any, **k: Any) -> None:
        if p == path:  # gc renamed it between the writer's exists() and utime()
            os.unlink(path)
            monkeypatch.setattr(os, "utime", real)
        real(p, *a, **k)

    monkeypatch.setattr(os, "utime", utime)
    store.backend.put_many({key: data})
    assert store.backend.get(key) == data


def test_local_gc_recovers_a_dead_gcs_trash(tmp_path: Any) -> None:
    store = packed(CheckpointStore.open(str(tmp_path / "s")))
    store.save("t", state(1))
    info = next(iter(store.backend.list("packs")))
    assert isinstance(store.backend, LocalBackend)
    trash = os.path.join(store.backend.root, "gc", "trash-1-dead")
    os.makedirs(trash)
    src = os.path.join(store.backend.root, *info.key.split("/"))
    os.rename(src, os.path.join(trash, info.key.split("/", 1)[1].replace("/", "")))
    os.utime(trash, (time.time() - 3600, time.time() - 3600))
    store.gc(grace=timedelta(0))
    assert os.path.exists(src) and not os.path.exists(trash)
    assert all_load(store) == 1


def test_local_gc_removes_temp_files_of_dead_writers_after_the_grace(tmp_path: Any) -> None:
    store = packed(CheckpointStore.open(str(tmp_path / "s")))
    store.save("t", state(1))
    assert isinstance(store.backend, LocalBackend)
    root = store.backend.root
    info = next(iter(store.backend.list("packs")))
    obj = os.path.join(root, *info.key.split("/"))
    head = os.path.join(root, *next(iter(store.backend.list("refs"))).key.split("/"))
    old = [obj + ".tmp-1-dead", head + ".tmp-1-dead"]
    young = obj + ".tmp-2-busy"
    for path in [*old, young]:
        with open(path, "wb") as f:
            f.write(b"half written")
    for path in old:
        os.utime(path, (time.time() - 7200, time.time() - 7200))
    dry = store.gc(grace=timedelta(hours=1), dry_run=True)
    assert dry.temp_files == 2 and all(os.path.exists(p) for p in [*old, young])
    report = store.gc(grace=timedelta(hours=1))
    assert report.temp_files == 2 and "2 stale temp files" in report.to_text()
    assert not any(os.path.exists(p) for p in old) and os.path.exists(young)
    assert os.path.exists(obj) and all_load(store) == 1


def test_memory_sweep_checks_under_the_lock(tmp_path: Any) -> None:
    store = CheckpointStore.open("memory://gc-sweep-" + os.urandom(4).hex())
    infos, garbage = _candidates(store)
    cutoff = time.time() + 100
    assert isinstance(store.backend, MemoryBackend)
    f = store.backend.fs.store[f"{store.backend.root}/{infos[0].key}"]
    f.modified = datetime.fromtimestamp(cutoff + 1, UTC)  # refreshed after the listing
    deleted = gcmod._sweep_atomic(store.backend, infos, cutoff, _collector(store))
    assert infos[0] not in deleted and len(deleted) == len(infos) - 1


def test_s3_sweep_drops_candidates_whose_lastmodified_moved(tmp_path: Any,
                                                            request: Any) -> None:
    from conftest import open_store

    store = open_store("s3", tmp_path, request)
    infos, garbage = _candidates(store)
    cutoff = time.time() + 100
    moved = ObjectInfo(infos[0].key, infos[0].size, infos[0].mtime - 5)  # listed before a refresh
    gone = ObjectInfo("packs/00/" + "0" * 62, 1, 0.0)  # listed, then deleted by another gc
    deleted = gcmod._sweep_listed(store.backend, [moved, gone, *infos[1:]], cutoff,
                                  _collector(store))
    assert moved not in deleted and gone not in deleted and deleted == sorted(
        infos[1:], key=lambda i: i.key)
    assert pack_ids(store) & garbage == {key_pack_id(moved.key)}


class _Wrapped(Backend):
    """A third-party backend (no subclass of ours) over memory://, declaring what it can do."""

    def __init__(self, inner: MemoryBackend, atomic: bool) -> None:
        self.inner, self.url = inner, inner.url + "#wrapped"
        self.exact_mtimes = self.atomic_delete = atomic
        self.calls: list[int] = []

    def get(self, key: str) -> bytes:
        return self.inner.get(key)

    def put_many(self, items: dict[str, bytes]) -> None:
        self.inner.put_many(items)

    def read_ref(self, key: str) -> tuple[bytes, str] | None:
        return self.inner.read_ref(key)

    def write_ref(self, key: str, data: bytes, expected: str | None,
                  **kw: Any) -> str:
        return self.inner.write_ref(key, data, expected, **kw)

    def delete_ref(self, key: str, expected: str) -> None:
        self.inner.delete_ref(key, expected)

    def list(self, prefix: str) -> list[ObjectInfo]:
        return self.inner.list(prefix)

    def delete_many(self, keys: Iterable[str]) -> list[str]:
        return self.inner.delete_many(keys)

    def delete_unless_touched(self, infos: list[ObjectInfo], cutoff: float) -> list[bool]:
        self.calls.append(len(infos))
        return self.inner.delete_unless_touched(infos, cutoff)


@pytest.mark.parametrize("atomic", [True, False])
def test_gc_asks_the_backend_what_it_can_do_not_its_class(atomic: bool) -> None:
    """gc takes a grace under a second, and deletes through ``delete_unless_touched``, on any
    backend that says it can (``exact_mtimes``, ``atomic_delete``), not only on ours; one that
    does not say so gets the re-listing sweep and the one-second rule."""
    inner = CheckpointStore.open("memory://gc-caps-" + os.urandom(4).hex()).backend
    assert isinstance(inner, MemoryBackend)
    backend = _Wrapped(inner, atomic)
    store = CheckpointStore.from_backend(backend)
    infos, garbage = _candidates(store)
    if not atomic:
        with pytest.raises(InvalidArgumentError, match="--grace 1s"):
            store.gc(grace=timedelta(0))
        report = store.gc(grace=timedelta(0), force=True)
    else:
        report = store.gc(grace=timedelta(0))
    assert report.deleted_objects == len(infos) and not pack_ids(store) & garbage
    assert backend.calls == ([len(infos)] if atomic else [])
