"""gc's summary of what each ref named (maintenance/ref_summary.py, issue 31): a run re-reads
only the refs whose listed version changed, and gc's guarantees hold with the summary stale,
missing, damaged or lying."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from builders import count_s3

from cas_checkpoint import CheckpointStore
from cas_checkpoint.engine.refs import HEADS, thread_key
from cas_checkpoint.maintenance import ref_summary
from tests.conftest import open_store
from tests.test_gc import gc0, named, pack_ids


def packed(store: CheckpointStore) -> CheckpointStore:
    store.refs.inline_max = 1  # every save writes a pack
    return store


def fill(store: CheckpointStore, n: int, tag: str = "a") -> None:
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: store.save(f"t{i}", {"i": i, "tag": tag, "pad": "x" * 64}),
                      range(n)))


def summaries(store: CheckpointStore) -> list[str]:
    return [i.key for i in store.backend.list(ref_summary.FOLDER)]


def test_s3_gc_reads_only_the_refs_that_changed(tmp_path: Any,
                                                request: pytest.FixtureRequest) -> None:
    n = int(os.environ.get("CAS_SOAK_THREADS", "1000"))
    store = packed(open_store("s3", tmp_path, request))
    fill(store, n)
    time.sleep(ref_summary.RACY + 1)  # (refs written just before a run are read by the next)
    first = store.gc()
    assert first.summary == "none" and first.refs_read == n  # (before: 2 GETs per ref)
    calls = count_s3(store)
    again = store.gc()
    assert again.summary == "used" and again.refs_read == 0 and again.deleted_objects == 0
    # no ref GET: one GET, the summary; LIST: the clock probe, gc/summary, refs/heads (a page
    # per 1,000) twice (the round after listing the packs), and the packs (1 + a page per prefix
    # over 1,000 packs: 256 prefixes); PUT: the probe (the summary is unchanged)
    assert calls["get_object"] == 1, calls
    assert calls["put_object"] == 1, calls  # the clock probe: the summary read still holds
    ref_pages = 1 + n // 1000
    assert calls["list_objects_v2"] <= 2 + 2 * ref_pages + 1 + 256, calls
    assert again.requests["get"] == 1
    # 1% of the threads change: gc reads those refs (once; the round after the pack listing
    # finds them unchanged) and nothing else
    changed = [f"t{i}" for i in range(0, n, 100)]
    for t in changed:
        store.save(t, {"changed": t})
    calls.clear()
    third = store.gc()
    assert third.summary == "used" and third.refs_read == len(changed)
    assert calls["get_object"] == 1 + len(changed), calls
    assert third.deleted_objects == 0
    for t in changed:
        assert store.load(t).state == {"changed": t}


@pytest.mark.parametrize("backend_kind", ["local", "s3"])
def test_nothing_changed_reads_no_ref(store: CheckpointStore) -> None:
    packed(store)
    fill(store, 20)
    time.sleep(ref_summary.RACY + 1)
    assert store.gc().refs_read == 20 and len(summaries(store)) == 1
    report = store.gc()
    assert report.refs_read == 0 and report.summary == "used"
    assert len(summaries(store)) == 1  # the run's own replaced the one before


def test_memory_has_no_versions_and_reads_every_ref(store: CheckpointStore) -> None:
    if not store.url.startswith("memory://"):
        pytest.skip("memory:// only")
    fill(store, 5)
    store.gc()
    assert store.gc().refs_read == 10 and summaries(store) == []


def _old(store: CheckpointStore, thread: str, when: float) -> str:
    path = os.path.join(store.backend.root, *thread_key(thread).split("/"))  # type: ignore
    os.utime(path, (when, when))
    return path


@pytest.mark.parametrize("backend_kind", ["local"])
def test_local_ref_rewritten_with_the_same_size_and_mtime_is_read(
        store: CheckpointStore) -> None:
    """A slot write keeps the file's size; its modified time can be set back (os.utime), its
    change time cannot: the version gc keys its summary by holds the change time."""
    packed(store)
    fill(store, 3)
    store.save("t0", {"second": 1})  # a slotted ref: the next save writes in place
    old = time.time() - 3600
    path = _old(store, "t0", old)
    before = os.stat(path)
    gc0(store)
    store.save("t0", {"third": "new pack"})
    _old(store, "t0", old)
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    report = gc0(store)
    assert report.refs_read >= 1
    assert store.load("t0").state == {"third": "new pack"}
    assert named(store) <= pack_ids(store) and store.verify(deep=False).ok


def test_summary_from_before_a_save_is_not_trusted(store: CheckpointStore) -> None:
    if store.url.startswith("memory://"):
        pytest.skip("memory:// keeps no summary")
    packed(store)
    fill(store, 5)
    time.sleep(ref_summary.RACY + 1)
    gc0(store)
    (key,) = summaries(store)
    stale = store.backend.get(key)
    store.save("t1", {"after": "the summary"})
    gc0(store)
    # the summary from before the save comes back (the newer one is gone)
    store.backend.delete_many(summaries(store))
    store.backend.put_many({key: stale})
    report = gc0(store)
    assert report.summary == "used" and report.refs_read >= 1
    assert store.load("t1").state == {"after": "the summary"}
    assert named(store) <= pack_ids(store)


@pytest.mark.parametrize("garbage", [b"not a summary", b"\x78\x9c" + b"\0" * 40])
def test_damaged_summary_is_ignored_and_rebuilt(store: CheckpointStore, garbage: bytes) -> None:
    if store.url.startswith("memory://"):
        pytest.skip("memory:// keeps no summary")
    packed(store)
    fill(store, 5)
    time.sleep(ref_summary.RACY + 1)
    gc0(store)
    store.backend.delete_many(summaries(store))
    store.backend.put_many({ref_summary.key_of(garbage): garbage,  # hashes to its name
                            f"{ref_summary.FOLDER}/{'0' * 64}": b"wrong name"})
    for i in range(5):
        store.save(f"t{i}", {"new": i})
    report = gc0(store)
    assert report.summary == "rebuilt" and report.refs_read >= 5
    assert [store.load(f"t{i}").state for i in range(5)] == [{"new": i} for i in range(5)]
    assert named(store) <= pack_ids(store)
    assert len(summaries(store)) == 1 and gc0(store).summary == "used"


def _lying_summary(store: CheckpointStore, lie: dict[str, frozenset[str]] | None = None
                   ) -> None:
    """A summary that verifies (named by its hash, well formed, the refs' very versions) and
    says each ref names nothing (or what ``lie`` says)."""
    refs = {i.key: ref_summary.Entry(i.version, i.mtime, (lie or {}).get(i.key, frozenset()))
            for i in store.backend.list(HEADS)}
    data = ref_summary.encode(time.time() + 3600, refs)
    store.backend.delete_many(summaries(store))
    store.backend.put_many({ref_summary.key_of(data): data})


def test_summary_claiming_refs_name_nothing_deletes_nothing_reachable(
        store: CheckpointStore) -> None:
    if store.url.startswith("memory://"):
        pytest.skip("memory:// keeps no summary")
    packed(store)
    fill(store, 10)
    store.delete_thread("t9")  # garbage: something to delete, so gc audits the summary
    time.sleep(ref_summary.RACY + 1)
    _lying_summary(store)
    before = named(store)
    report = gc0(store)
    assert report.summary == "rebuilt"
    assert before <= pack_ids(store)
    assert all(store.load(f"t{i}") is not None for i in range(9))
    assert store.verify(deep=False).ok


def test_lie_about_one_ref_is_caught_before_deleting(store: CheckpointStore) -> None:
    """The audit re-reads a random sample before deleting anything: with up to AUDIT_MIN refs
    the sample is every ref, so one lying entry is caught. (Among more refs a forged entry is
    caught with the probability of being sampled: see ref_summary's docstring.)"""
    if store.url.startswith("memory://"):
        pytest.skip("memory:// keeps no summary")
    packed(store)
    n = ref_summary.AUDIT_MIN
    fill(store, n)
    store.save("t0", {"garbage": "its first pack stays named"})
    store.delete_thread("t1")  # garbage: gc has something to delete, so it audits
    time.sleep(ref_summary.RACY + 1)
    truth = {}
    for i in range(n):
        ref = store.refs.read(f"t{i}")
        if ref is not None:
            truth[thread_key(f"t{i}")] = frozenset(p.id for p in ref.head.packs)
    truth[thread_key("t3")] = frozenset()  # the lie
    _lying_summary(store, truth)
    report = gc0(store)
    assert report.summary == "rebuilt" and report.deleted_objects >= 1
    assert store.load("t3").state == {"i": 3, "tag": "a", "pad": "x" * 64}
    assert named(store) <= pack_ids(store)


# --- stats() from its own summary (maintenance/stats_summary.py) ------------------------------


def _top(s: Any) -> tuple[int, int, int, int, int]:
    return (s.threads, s.checkpoints, s.logical_bytes, s.physical_bytes, s.objects)


def test_s3_stats_reads_only_the_refs_that_changed(tmp_path: Any,
                                                   request: pytest.FixtureRequest) -> None:
    n = 300
    store = packed(open_store("s3", tmp_path, request))
    fill(store, n)
    for i in range(3):
        store.save("t0", {"more": i})
    store.fork("t0", store.history("t0")[1].id, "fork")  # shares 3 checkpoints with t0
    calls = count_s3(store)
    first = store.stats()
    assert calls["get_object"] == n + 1  # every ref (the summary did not exist)
    assert _top(first) == _top(store.stats(by_thread=True))  # the figures of the full read
    calls.clear()
    again = store.stats()
    assert calls["get_object"] == 1 and calls["put_object"] == 0, calls  # the summary alone
    assert _top(again) == _top(first)
    changed = [f"t{i}" for i in range(0, n, 100)]
    for t in changed:
        store.save(t, {"changed": t})
    store.delete_thread("t7")
    calls.clear()
    third = store.stats()
    assert calls["get_object"] == 1 + len(changed), calls
    assert _top(third) == _top(store.stats(by_thread=True))


def test_stats_with_a_damaged_summary_reads_every_ref(store: CheckpointStore) -> None:
    if store.url.startswith("memory://"):
        pytest.skip("memory:// keeps no summary")
    fill(store, 6)
    time.sleep(ref_summary.RACY + 1)
    full = _top(store.stats())
    (key,) = [i.key for i in store.backend.list("stats/summary")]
    store.backend.delete_many([key])
    store.backend.put_many({key: b"garbage under a summary's name"})
    assert _top(store.stats()) == full
    assert len(store.backend.list("stats/summary")) == 1
