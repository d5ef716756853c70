"""gc's and stats' summaries split into parts by key range (maintenance/summary_parts.py, issue
31): a run rewrites only the parts whose refs changed, reads the parts a few at a time, and a
part that is missing, damaged or forged costs the reading of its own refs (a forged one that
verifies: the audit's), never a reachable pack."""

from __future__ import annotations

import time
from itertools import pairwise
from typing import Any

import pytest
from builders import count_s3

from cas_checkpoint import CheckpointStore
from cas_checkpoint.engine.refs import HEADS
from cas_checkpoint.engine.steps import GetMany
from cas_checkpoint.maintenance import ref_summary, stats_summary, summary_parts
from tests.test_gc import gc0, named, pack_ids
from tests.test_gc_summary import fill, packed, summaries

N = 80


@pytest.fixture(autouse=True)
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parts of ~8 refs (at most 32), none inline: 80 threads make ~10 parts."""
    monkeypatch.setattr(summary_parts, "PART_REFS", 8)
    monkeypatch.setattr(summary_parts, "MAX_PART_REFS", 32)
    monkeypatch.setattr(summary_parts, "INLINE_REFS", 0)


def parts(store: CheckpointStore, folder: str = ref_summary.PARTS) -> set[str]:
    return {i.key for i in store.backend.list(folder)}


def table(store: CheckpointStore) -> list[Any]:
    """The part table of the store's gc summary: [first key, blake3, rows]."""
    (key,) = summaries(store)
    return summary_parts.read_root(key, store.backend.get(key), "gc", lambda r: True)[1]


def settled(store: CheckpointStore) -> CheckpointStore:
    packed(store)
    fill(store, N)
    time.sleep(ref_summary.RACY + 1)  # (a ref written just before a run is read by the next)
    first = gc0(store)
    assert first.summary == "none" and first.refs_read == N
    return store


def test_split_is_a_function_of_the_keys() -> None:
    keys = sorted(f"refs/heads/k{i}" for i in range(1000))
    got = list(summary_parts.split(keys))
    assert [k for p in got for k in p] == keys and 60 < len(got) < 250
    assert all(summary_parts.starts_part(p[0]) or len(q) == 32 for q, p in pairwise(got))
    # a new key changes the part it falls in and no other
    more = sorted([*keys, "refs/heads/k500x"])
    changed = [p for p in summary_parts.split(more) if p not in got]
    assert len(changed) <= 2 and any("refs/heads/k500x" in p for p in changed)


@pytest.mark.parametrize("backend_kind", ["local"])
def test_a_few_changes_write_a_delta_and_more_the_parts_they_touch(
        store: CheckpointStore, monkeypatch: pytest.MonkeyPatch) -> None:
    settled(store)
    before = parts(store)
    n = len(table(store))
    assert n >= 4 and len(before) == n
    again = gc0(store)
    # unchanged: the root and the parts are read, nothing is written (but the clock probe)
    assert again.summary == "used" and again.refs_read == 0
    assert again.requests["get"] == 1 + n and again.requests["put"] == 1
    assert parts(store) == before
    store.save("t7", {"changed": 1})
    store.delete_thread("t20")
    time.sleep(ref_summary.RACY + 1)
    third = gc0(store)
    assert third.refs_read == 1 + ref_summary.audit_size(N - 2)  # (t20's pack goes: audited)
    # a few changes: the parts stay, a delta holds t7's row and t20's leaving; a PUT for the
    # probe, the delta, the root
    delta = parts(store) - before
    assert len(delta) == 1 and before <= parts(store) and third.requests["put"] == 3
    fourth = gc0(store)  # (root, parts, delta read: t7 from the delta)
    assert fourth.refs_read == 0 and fourth.requests["get"] == 1 + n + 1
    assert fourth.threads == N - 1 and fourth.requests["put"] == 1
    # past the delta's share: the part t7 falls in is written again, the delta goes
    monkeypatch.setattr(summary_parts, "DELTA_SHARE", 0.0)
    store.save("t7", {"changed": 2})
    time.sleep(ref_summary.RACY + 1)
    fifth = gc0(store)
    assert fifth.refs_read == 1
    after = parts(store)
    # the parts of t7 and t20 (one or two), the probe, the root; the delta is gone
    new = len(after - before)
    assert new in (1, 2) and len(before - after) == new and not delta & after
    assert fifth.requests["put"] == 2 + new
    assert gc0(store).refs_read == 0
    assert named(store) <= pack_ids(store)


@pytest.mark.parametrize("backend_kind", ["local"])
def test_a_damaged_delta_leaves_the_parts_rows(store: CheckpointStore) -> None:
    """The delta's rows are lost: the parts' older rows stand, whose versions the changed refs
    no longer show, so those refs are read; nothing reachable goes."""
    settled(store)
    before = parts(store)
    for t in ("t3", "t40"):
        store.save(t, {"changed": t})
    time.sleep(ref_summary.RACY + 1)
    gc0(store)
    (delta,) = parts(store) - before
    store.backend.delete_many([delta])
    store.backend.put_many({delta: b"garbage"})
    store.delete_thread("t11")
    report = gc0(store)
    assert 2 <= report.refs_read <= 2 + ref_summary.AUDIT_MIN and report.deleted_objects >= 1
    assert named(store) <= pack_ids(store)
    assert store.load("t40").state == {"changed": "t40"}
    assert parts(store) != before | {delta}  # (rewritten whole: a bad part or delta)


@pytest.mark.s3_matters("request counts: a GET per part, a PUT for the changed part only")
@pytest.mark.parametrize("backend_kind", ["s3"])
def test_s3_parts_cost_what_changed(store: CheckpointStore) -> None:
    settled(store)
    n = len(table(store))
    calls = count_s3(store)
    assert gc0(store).refs_read == 0
    assert calls["get_object"] == 1 + n and calls["put_object"] == 1, calls
    store.save("t3", {"changed": 1})
    time.sleep(1.1)
    calls.clear()
    report = gc0(store)
    assert report.refs_read == 1
    # GET: root, parts, the changed ref; PUT: the probe, one part, the root
    assert calls["get_object"] == 1 + n + 1 and calls["put_object"] == 3, calls


@pytest.mark.parametrize("backend_kind", ["local"])
def test_parts_are_read_a_few_at_a_time(store: CheckpointStore) -> None:
    """A run holds the summary's rows and at most READ_BATCH parts' bytes, never the whole
    summary's bytes at once."""
    settled(store)
    sizes: list[int] = []
    real = GetMany.sync

    def counting(self: GetMany, backend: Any) -> Any:
        sizes.append(sum(k.startswith(ref_summary.PARTS) for k in self.keys))
        return real(self, backend)

    mp = pytest.MonkeyPatch()
    mp.setattr(GetMany, "sync", counting)
    try:
        gc0(store)
    finally:
        mp.undo()
    assert sum(sizes) == len(table(store)) and max(sizes) <= summary_parts.READ_BATCH


def _one_part(store: CheckpointStore) -> tuple[str, list[str]]:
    """A part of the summary (its key) and the refs it holds."""
    first, digest, count = table(store)[1]
    keys = sorted(i.key for i in store.backend.list(HEADS))
    at = keys.index(first)
    return f"{ref_summary.PARTS}/{digest}", keys[at:at + count]


@pytest.mark.parametrize("backend_kind", ["local"])
@pytest.mark.parametrize("attack", ["missing", "damaged", "another part's bytes"])
def test_a_bad_part_costs_its_own_refs(store: CheckpointStore, attack: str) -> None:
    settled(store)
    key, refs = _one_part(store)
    other = f"{ref_summary.PARTS}/{table(store)[2][1]}"
    if attack == "missing":
        store.backend.delete_many([key])
    else:
        data = (b"garbage" if attack == "damaged" else store.backend.get(other))
        store.backend.delete_many([key])
        store.backend.put_many({key: data})
    store.delete_thread("t11")  # garbage: gc deletes, so it audits the summary
    report = gc0(store)
    assert report.summary == "used"
    # its refs, and the audit's sample of the others (t11's ref is gone: not read)
    assert len(refs) <= report.refs_read <= len(refs) + ref_summary.AUDIT_MIN
    assert named(store) <= pack_ids(store) and report.deleted_objects >= 1
    # rebuilt: the next run reads no ref
    time.sleep(ref_summary.RACY + 1)
    gc0(store)
    assert gc0(store).refs_read == 0


@pytest.mark.parametrize("backend_kind", ["local"])
@pytest.mark.parametrize("lie", ["names nothing", "rows out of its range"])
def test_a_forged_part_that_verifies_deletes_nothing_reachable(
        store: CheckpointStore, monkeypatch: pytest.MonkeyPatch, lie: str) -> None:
    """A part written by the attacker, named by its hash and by a new root: either it says its
    refs name no pack (gc's audit, here sampling every trusted ref, catches it and reads every
    ref) or it holds rows of another range (refused when read: its refs are read)."""
    settled(store)
    monkeypatch.setattr(ref_summary, "audit_sample", lambda keys: list(keys))
    (root_key,) = summaries(store)
    root = summary_parts.unpack(root_key, store.backend.get(root_key), "gc summary")
    victim = root["parts"][1]
    old = summary_parts.unpack(f"{ref_summary.PARTS}/{victim[1]}",
                               store.backend.get(f"{ref_summary.PARTS}/{victim[1]}"), "part")
    if lie == "names nothing":
        rows = [[r[0], r[1], r[2], b""] for r in old["rows"]]
    else:  # the rows of the next part, under this one's first key and count
        nxt = root["parts"][2]
        other = summary_parts.unpack(f"{ref_summary.PARTS}/{nxt[1]}",
                                     store.backend.get(f"{ref_summary.PARTS}/{nxt[1]}"), "p")
        rows = [[r[0], r[1], r[2], b""] for r in other["rows"]]
        rows = [[victim[0], *rows[0][1:]], *rows[1:]][:victim[2]]
    data = summary_parts.pack({"v": 2, "kind": "gc", "rows": rows})
    name = summary_parts.name_of(ref_summary.PARTS, data)
    victim[1] = name.rsplit("/", 1)[1]
    root["taken"] = time.time() + 3600
    forged = summary_parts.pack(root)
    store.backend.delete_many([root_key])
    store.backend.put_many({name: data, summary_parts.name_of(ref_summary.FOLDER, forged): forged})
    store.delete_thread("t11")
    before = named(store)
    report = gc0(store)
    assert report.deleted_objects >= 1
    assert before <= pack_ids(store)
    assert all(store.load(f"t{i}") is not None for i in range(N) if i != 11)
    assert store.verify(deep=False).ok


@pytest.mark.parametrize("backend_kind", ["local"])
def test_a_summary_of_format_1_is_read_and_replaced(store: CheckpointStore) -> None:
    settled(store)
    cur = gc0(store)
    assert cur.summary == "used"
    # write the gc summary in the format of before the split, from the current one
    loaded, _ = _load(store)
    assert loaded is not None
    data = ref_summary.encode(loaded.taken, loaded.refs)
    store.backend.delete_many(summaries(store))
    store.backend.put_many({ref_summary.key_of(data): data})
    report = gc0(store)
    assert report.summary == "used" and report.refs_read == 0
    (root,) = summaries(store)
    assert root != ref_summary.key_of(data) and table(store)  # replaced by a split one


def _load(store: CheckpointStore) -> tuple[Any, list[str]]:
    from cas_checkpoint.engine.steps import run

    req = {"list": 0, "get": 0, "put": 0, "delete": 0}
    return run(ref_summary.load(req), store.backend)  # type: ignore[no-any-return]


@pytest.mark.parametrize("backend_kind", ["local"])
def test_stats_summary_in_parts_and_a_damaged_part(store: CheckpointStore) -> None:
    packed(store)
    fill(store, N)
    time.sleep(ref_summary.RACY + 1)
    full = store.stats(by_thread=True)
    first = store.stats()
    assert (first.threads, first.checkpoints, first.logical_bytes) == (
        full.threads, full.checkpoints, full.logical_bytes)
    got = parts(store, stats_summary.PARTS)
    assert len(got) >= 4
    victim = sorted(got)[0]
    store.backend.delete_many([victim])
    store.backend.put_many({victim: b"garbage"})
    again = store.stats()
    assert (again.threads, again.checkpoints, again.logical_bytes) == (
        full.threads, full.checkpoints, full.logical_bytes)
    assert len(parts(store, stats_summary.PARTS)) == len(got) and victim in parts(
        store, stats_summary.PARTS)
