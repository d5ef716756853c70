"""Sharded gc (maintenance/gc_marks.py, issue 31): workers read a share of the refs each and
write marks, one process deletes from them; it refuses marks missing, damaged, of another
split or older than the grace, and reads again every ref written since the marks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

import pytest
from builders import count_s3

from cas_checkpoint import CheckpointStore, InvalidArgumentError
from cas_checkpoint.engine.refs import thread_key
from cas_checkpoint.maintenance import gc_marks, ref_summary, summary_parts
from tests.test_gc import age, named, pack_ids
from tests.test_gc_summary import fill, packed

HOUR = timedelta(hours=1)


def marks(store: CheckpointStore) -> list[str]:
    return sorted(i.key for i in store.backend.list(gc_marks.FOLDER))


def garbage(store: CheckpointStore, n: int = 24, gone: int = 4) -> set[str]:
    """``n`` threads, the last ``gone`` deleted: their packs are garbage, aged past the hour."""
    packed(store)
    fill(store, n)
    for i in range(n - gone, n):
        store.delete_thread(f"t{i}")
    out = pack_ids(store) - named(store)
    assert out
    age(store, out, hours=2)
    if not store.url.startswith("memory://"):
        time.sleep(ref_summary.RACY + 1)  # (a ref written just before its mark is read again)
    return out


def mark_all(store: CheckpointStore, of: int) -> list[gc_marks.MarkReport]:
    return [store.gc_mark(shard=i, of=of) for i in range(1, of + 1)]


def test_marks_then_one_deleter_delete_what_gc_would(store: CheckpointStore) -> None:
    dead = garbage(store, 80)
    assert set(store.gc(grace=HOUR, dry_run=True).deleted) == dead
    reports = mark_all(store, 4)
    # every live ref read once, by exactly one worker
    assert sum(r.refs_read for r in reports) == 76 and len(marks(store)) == 4
    report = store.gc(grace=HOUR, from_marks=True)
    assert set(report.deleted) == dead
    assert named(store) <= pack_ids(store) and store.verify(deep=False).ok
    assert marks(store) == []  # used, then deleted
    if store.url.startswith("memory://"):  # (no versions listed: every ref read, as gc does)
        assert report.refs_read == 2 * 76
    else:  # the refs the audit samples before deleting, and no other
        assert report.summary == "marks"
        assert report.refs_read == ref_summary.audit_size(76) < 76
        time.sleep(ref_summary.RACY + 1)
        # the deleter wrote gc's summary: the next plain gc takes it
        store.gc(grace=HOUR)
        assert store.gc(grace=HOUR).summary == "used"


def test_shares_split_the_keys_evenly_and_for_good() -> None:
    keys = [thread_key(f"tenant-7/agent-{i}") for i in range(4000)]
    counts = [sum(gc_marks.share(k, 8) == s for k in keys) for s in range(1, 9)]
    assert sum(counts) == 4000 and min(counts) > 400 and max(counts) < 600


@pytest.mark.parametrize("backend_kind", ["local"])
def test_a_ref_written_after_the_marks_is_read_again(store: CheckpointStore) -> None:
    """After the marks, t0's ref is written back to bytes from before a repack: it names packs
    that are garbage and old. The deleter sees its version moved, reads it and keeps them; so
    for t9, deleted before the marks and written back after (no mark holds it)."""
    packed(store)
    fill(store, 12)
    key0, key9 = thread_key("t0"), thread_key("t9")
    before0 = store.backend.read_ref(key0)
    before9 = store.backend.read_ref(key9)
    assert before0 is not None and before9 is not None
    store.save("t0", {"more": 1})
    store.repack("t0", min_garbage=0.0)
    store.delete_thread("t9")
    old = pack_ids(store) - named(store)
    assert old
    age(store, old, hours=2)
    mark_all(store, 3)
    now0 = store.backend.read_ref(key0)
    assert now0 is not None
    store.backend.write_ref(key0, before0[0], now0[1])
    store.backend.write_ref(key9, before9[0], None)
    report = store.gc(grace=HOUR, from_marks=True)
    assert report.refs_read >= 2
    assert named(store) <= pack_ids(store)
    assert store.load("t0").state == {"i": 0, "tag": "a", "pad": "x" * 64}
    assert store.load("t9").state == {"i": 9, "tag": "a", "pad": "x" * 64}


@pytest.mark.parametrize("backend_kind", ["local"])
@pytest.mark.parametrize("case", ["missing share", "other split", "damaged", "other share's row",
                                  "none"])
def test_marks_that_do_not_make_one_set_are_refused(store: CheckpointStore, case: str) -> None:
    dead = garbage(store)
    if case == "other split":
        mark_all(store, 2)
        kept = {k: store.backend.get(k) for k in marks(store)}
        mark_all(store, 3)  # (replaces the marks of the split in 2)
        assert len(marks(store)) == 3
        store.backend.put_many({sorted(kept)[0]: kept[sorted(kept)[0]]})
    elif case != "none":
        mark_all(store, 4)
    if case == "missing share":
        store.backend.delete_many([marks(store)[1]])
    elif case == "damaged":
        key = marks(store)[0]
        store.backend.delete_many([key])
        store.backend.put_many({key: b"not a mark"})
    elif case == "other share's row":
        a, b = marks(store)[:2]
        da = summary_parts.unpack(summary_parts.name_of(gc_marks.FOLDER, store.backend.get(a)),
                                  store.backend.get(a), "mark")
        db = summary_parts.unpack(summary_parts.name_of(gc_marks.FOLDER, store.backend.get(b)),
                                  store.backend.get(b), "mark")
        da["rows"] = sorted([*da["rows"], db["rows"][0]])
        data = summary_parts.pack(da)
        store.backend.delete_many([a])
        store.backend.put_many({gc_marks._name(da["of"], da["shard"], data): data})
    with pytest.raises(InvalidArgumentError, match="gc_mark\\(shard=i, of=.*Nothing was del"):
        store.gc(grace=HOUR, from_marks=True)
    assert dead <= pack_ids(store)


@pytest.mark.parametrize("backend_kind", ["local"])
def test_a_mark_older_than_the_grace_is_refused(store: CheckpointStore) -> None:
    dead = garbage(store)
    mark_all(store, 2)
    time.sleep(1.5)
    with pytest.raises(InvalidArgumentError, match="more than the 1 s grace"):
        store.gc(grace=timedelta(seconds=1), from_marks=True)
    assert dead <= pack_ids(store)
    report = store.gc(grace=HOUR, from_marks=True)  # within the grace: used
    assert set(report.deleted) == dead


def test_arguments_are_checked(store: CheckpointStore) -> None:
    for shard, of in ((0, 4), (5, 4), (1, 0), (True, 2), ("1", 2)):
        with pytest.raises(InvalidArgumentError, match="shard|of"):
            store.gc_mark(shard=shard, of=of)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="repack=False"):
        store.gc(from_marks=True, repack=True)


@pytest.mark.s3_matters("request counts: each worker GETs its share of the refs only")
@pytest.mark.parametrize("backend_kind", ["s3"])
def test_s3_each_worker_reads_its_share(store: CheckpointStore) -> None:
    packed(store)
    fill(store, 30)
    for i in range(26, 30):
        store.delete_thread(f"t{i}")
    dead = pack_ids(store) - named(store)
    time.sleep(4.2)  # (S3's modified times are whole seconds: past the 3 s grace by a margin)
    calls = count_s3(store)
    got = 0
    for r in mark_all(store, 3):
        got += r.refs_read
    # GETs: the refs, each by one worker; no pack read (no long thread)
    assert got == 26 and calls["get_object"] == 26, calls
    assert calls["put_object"] == 3 * 2  # a clock probe and a mark each
    calls.clear()
    report = store.gc(grace=timedelta(seconds=3), from_marks=True)
    # GETs: the 3 marks, and the audit's sample before deleting
    assert calls["get_object"] == 3 + report.refs_read, calls
    assert report.requests["get"] == calls["get_object"]
    assert report.summary == "marks" and report.refs_read <= ref_summary.AUDIT_MIN
    assert set(report.deleted) == dead, report.to_dict()
    assert named(store) <= pack_ids(store)


@pytest.mark.parametrize("backend_kind", ["local"])
def test_cli_shard_and_from_marks(store: CheckpointStore) -> None:
    dead = garbage(store)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    cli = [sys.executable, "-m", "cas_checkpoint.cli", "gc", store.url]
    for i in (1, 2):
        out = subprocess.run([*cli, "--shard", f"{i}/2"], capture_output=True, text=True,
                             env=env, check=True).stdout
        assert f"gc mark {i}/2" in out and "--from-marks" in out
    bad = subprocess.run([*cli, "--shard", "3/2"], capture_output=True, text=True, env=env)
    assert bad.returncode != 0 and "--shard takes I/N" in bad.stderr
    subprocess.run([*cli, "--from-marks"], capture_output=True, text=True, env=env, check=True)
    assert dead.isdisjoint(pack_ids(store)) and marks(store) == []
    refused = subprocess.run([*cli, "--from-marks"], capture_output=True, text=True, env=env)
    assert refused.returncode != 0 and "--shard I/N" in refused.stderr, refused.stderr
    assert "gc_mark" not in refused.stderr


def test_async_face_marks_and_deletes(tmp_path: Any) -> None:
    """AsyncCheckpointStore.gc_mark and gc(from_marks=True): the same steps, awaited."""
    import asyncio

    from cas_checkpoint import AsyncCheckpointStore

    sync = CheckpointStore.open(str(tmp_path / "s"))
    dead = garbage(sync, 12, 2)

    async def main() -> set[str]:
        async with await AsyncCheckpointStore.open(str(tmp_path / "s")) as store:
            reports = [await store.gc_mark(shard=i, of=2) for i in (1, 2)]
            assert sum(r.refs_read for r in reports) == 10
            return set((await store.gc(grace=HOUR, from_marks=True)).deleted)

    assert asyncio.run(main()) == dead
    assert named(sync) <= pack_ids(sync) and marks(sync) == []
