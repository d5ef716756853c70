"""Contract tests for CheckpointStore, run against memory:// and a local directory: what they
assert is the store's logic, the same on every backend. S3's side of it -- objects, refs by
compare-and-swap, listings -- is ``test_backend_contract.py``'s (on moto); unreachable S3 URLs
are tested here by name. ``CAS_TEST_BACKENDS=memory,local,s3`` runs them all on S3 too."""

from __future__ import annotations

import dataclasses
import logging
import os
import uuid
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from builders import options

from cas_checkpoint import (
    CasError,
    CheckpointStore,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    SerializationError,
    StorageError,
)
from cas_checkpoint.format.objects import NODE, RECORD, object_kind


def objects_of(store: CheckpointStore, kind: bytes | None = None) -> list[str]:
    """Ids of the objects (inline or in packs) of every thread, of one kind or all."""
    out: list[str] = []
    for thread in store.threads():
        ref = store.refs.read(thread)
        assert ref is not None
        view = store.objects.view(ref.head)
        for oid in sorted(view.ids()):
            if kind is None or object_kind(view.get(oid)) == kind:
                out.append(oid)
    return out


def msgs(n: int) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": f"message {i}"} for i in range(n)],
            "step": n}


def test_save_load_roundtrip_and_fields(store: CheckpointStore) -> None:
    c1 = store.save("thread-1", msgs(1), label="after-search", tags=["tool"],
                    metadata={"phase": "execute"})
    c2 = store.save("thread-1", msgs(2))
    cp = store.load("thread-1")
    assert cp.id == c2.id and cp.state == msgs(2) and cp.thread_id == "thread-1"
    assert cp.parent_ids == (c1.id,) and cp.step == c1.step + 1
    old = store.load("thread-1", c1.id)
    assert old.state == msgs(1)
    assert (old.label, old.tags, old.metadata) == ("after-search", ("tool",), {"phase": "execute"})
    assert old.parent_ids == () and old.step == 0
    assert old.created_at.tzinfo is not None
    assert abs(old.created_at - datetime.now(UTC)) < timedelta(minutes=5)
    assert old.size > 0 and old.size < cp.size
    assert store.get(c1.id).state == msgs(1)
    assert store.get(c2.id).thread_id == "thread-1"


RICH = {
    "none": None, "t": True, "f": False, "int": -7, "big": 2**100, "neg": -(2**90),
    "float": 1.5, "str": "héllo ✓", "bytes": b"\x00\xff", "list": [1, [2, 3]],
    "tuple": (1, (2, "x")), "set": {1, 2, 3}, "fs": frozenset({"a", "b"}),
    (1, 2): "tuple key", 3: "int key",
    "dt": datetime(2026, 11, 22, 10, 30, 5, 123456, tzinfo=timezone(timedelta(hours=2))),
    "naive": datetime(2020, 1, 1, 0, 0, 0, 1), "date": date(2026, 1, 2),
    "time": time(12, 30, 1, 999), "td": timedelta(days=2, microseconds=5),
    "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"), "dec": Decimal("3.14159"),
}


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def test_every_value_type_roundtrips_through_the_store(store: CheckpointStore) -> None:
    store.save("types", RICH)
    assert _same(store.load("types").state, RICH)


@dataclasses.dataclass
class AgentState:
    messages: list[str]
    step: int


def test_registered_dataclass_and_unregistered_error(make_store: Any) -> None:
    typed = make_store(types=[AgentState])
    typed.save("t", {"s": AgentState(["hi"], 3)})
    got = typed.load("t").state["s"]
    assert type(got) is AgentState and got == AgentState(["hi"], 3)
    plain = make_store()
    before = objects_of(plain)
    with pytest.raises(SerializationError) as err:
        plain.save("t", {"s": AgentState(["hi"], 3)})
    assert 'state["s"]' in str(err.value)
    assert objects_of(plain) == before and plain.threads() == []


def test_unencodable_value_names_its_path_and_writes_nothing(store: CheckpointStore) -> None:
    store.save("t", msgs(1))
    before, head = sorted(objects_of(store)), store.head("t")
    with pytest.raises(SerializationError) as err:
        store.save("t", {"tools": ["a", "b", lambda: 1]})
    assert 'state["tools"][2]' in str(err.value)
    assert isinstance(err.value, TypeError) and isinstance(err.value, CasError)
    assert sorted(objects_of(store)) == before and store.head("t") == head


def test_history_newest_first_limit_before(store: CheckpointStore) -> None:
    ids = [store.save("h", msgs(i)).id for i in range(5)]
    assert [c.id for c in store.history("h")] == ids[::-1]
    assert [c.id for c in store.history("h", limit=2)] == ids[:-3:-1]
    assert [c.id for c in store.history("h", before=ids[3], limit=2)] == [ids[2], ids[1]]
    assert store.count("h") == 5
    with pytest.raises(NotFoundError):
        store.history("h", before="0" * 64)


def test_history_find_count_read_no_state_or_record(store: CheckpointStore,
                                                    monkeypatch: Any) -> None:
    for i in range(40):  # more than one log segment
        store.save("h", msgs(i), label="even" if i % 2 == 0 else None, tags=[f"t{i % 3}"],
                   metadata={"i": i})
    # count and recent history come from the ref alone; the whole log reads the packs once
    other = CheckpointStore.open(store.url, storage_options=options(store))
    reads: list[list[str]] = []
    real = other.backend.get_many

    def get_many(keys: Any) -> Any:
        keys = list(keys)
        reads.append(keys)
        return real(keys)

    monkeypatch.setattr(other.backend, "get_many", get_many)
    assert other.count("h") == 40 and len(other.history("h", limit=5)) == 5
    assert reads == [] or all(k.startswith("refs/") for r in reads for k in r)
    assert len(other.history("h")) == 40
    assert [c.metadata["i"] for c in other.find("h", label="even")] == list(range(38, -1, -2))
    assert len(other.find("h", tag="t1", metadata={"i": 4})) == 1
    assert other.find("h", tag="t1", metadata={"i": 5}) == []
    pack_rounds = [r for r in reads if any(k.startswith("packs/") for k in r)]
    assert len(pack_rounds) <= 1  # one round of pack reads, then the cache
    # without any pack the ref still answers count and recent history; a load cannot
    monkeypatch.undo()
    third = CheckpointStore.open(store.url, storage_options=options(store))
    third.backend.delete_many([i.key for i in third.backend.list("packs")])
    assert third.count("h") == 40 and len(third.history("h", limit=5)) == 5
    with pytest.raises(NotFoundError):
        third.load("h")


def test_long_thread_keeps_head_small_and_history_exact(store: CheckpointStore) -> None:
    n = 300 if not store.url.startswith("s3") else 120
    ids = [store.save("long", {"i": i}).id for i in range(n)]
    assert store.count("long") == n
    assert [c.id for c in store.history("long")] == ids[::-1]
    ref = store.backend.read_ref("refs/heads/" + _key("long"))
    assert ref is not None and len(ref[0]) < 8 * 1024
    assert store.load("long", ids[0]).state == {"i": 0}
    assert [c.step for c in store.history("long", limit=3)] == [n - 1, n - 2, n - 3]


def _key(thread: str) -> str:
    from cas_checkpoint.engine.refs import thread_key
    return thread_key(thread).rsplit("/", 1)[1]


def test_find_by_label_tag_metadata(store: CheckpointStore) -> None:
    a = store.save("f", msgs(1), label="after-search", tags=["tool"], metadata={"phase": "execute"})
    b = store.save("f", msgs(2), tags=["tool", "x"], metadata={"phase": "plan"})
    assert [c.id for c in store.find("f", label="after-search")] == [a.id]
    assert [c.id for c in store.find("f", tag="tool")] == [b.id, a.id]
    assert [c.id for c in store.find("f", tag="tool", metadata={"phase": "execute"})] == [a.id]
    assert store.find("f", label="nope") == []


def test_metadata_changed_after_a_save_does_not_change_what_was_saved(
        store: CheckpointStore) -> None:
    """A save keeps a copy of the metadata it was given: the caller's dict, changed after the
    save returns, changes neither the log this store object holds nor what it returned."""
    meta = {"phase": "plan", "steps": [1, 2]}
    info = store.save("m", msgs(1), metadata=meta)
    meta["phase"] = "changed"
    meta["steps"].append(3)  # type: ignore[attr-defined]
    store.save("m", msgs(2))
    assert info.metadata == {"phase": "plan", "steps": [1, 2]}
    assert store.history("m")[-1].metadata == {"phase": "plan", "steps": [1, 2]}
    assert store.load("m", info.id).metadata == {"phase": "plan", "steps": [1, 2]}


def test_fork_shares_state_and_starts_at_checkpoint(store: CheckpointStore) -> None:
    c0 = store.save("t1", msgs(1))
    c1 = store.save("t1", msgs(2))
    store.save("t1", msgs(3))
    nodes = sorted(objects_of(store, NODE))
    info = store.fork("t1", c1.id, "t2")
    assert info.id == c1.id
    assert sorted(objects_of(store, NODE)) == nodes  # no state copied
    assert store.load("t2").id == c1.id and store.load("t2").state == msgs(2)
    assert [c.id for c in store.history("t2")] == [c1.id, c0.id]
    c3 = store.save("t2", msgs(5))
    assert c3.parent_ids == (c1.id,)
    assert store.count("t1") == 3 and store.count("t2") == 3
    with pytest.raises(InvalidArgumentError):
        store.fork("t1", c1.id, "t2")  # exists
    with pytest.raises(NotFoundError):
        store.fork("t1", "a" * 64, "t3")
    assert "t3" not in store.threads()


def test_rewind_drops_later_checkpoints(store: CheckpointStore) -> None:
    c1 = store.save("r", msgs(1))
    c2 = store.save("r", msgs(2))
    c3 = store.save("r", msgs(3))
    store.rewind("r", c1.id)
    assert store.load("r").id == c1.id and store.count("r") == 1
    for gone in (c2, c3):
        with pytest.raises(NotFoundError):
            store.load("r", gone.id)
    c4 = store.save("r", msgs(4))
    assert c4.parent_ids == (c1.id,)
    assert store.get(c2.id).state == msgs(2)  # objects stay until gc


def test_delete_checkpoint_and_thread(store: CheckpointStore) -> None:
    c1 = store.save("d", msgs(1))
    c2 = store.save("d", msgs(2))
    c3 = store.save("d", msgs(3))
    store.delete("d", c2.id)
    assert [c.id for c in store.history("d")] == [c3.id, c1.id]
    store.delete("d", c3.id)  # the head: back to its parent if still there, else newest
    assert store.head("d") == c1.id
    store.save("e", msgs(1))
    store.delete_thread("e")
    assert store.threads() == ["d"]
    with pytest.raises(NotFoundError):
        store.load("e")
    store.delete("d", c1.id)  # the last one deletes the thread
    assert store.threads() == []


def test_expected_head_conflict(store: CheckpointStore) -> None:
    c1 = store.save("c", msgs(1), expected_head=None)
    with pytest.raises(ConflictError) as err:
        store.save("c", msgs(2), expected_head=None)
    assert err.value.expected is None and err.value.actual == c1.id
    c2 = store.save("c", msgs(2), expected_head=c1.id)
    with pytest.raises(ConflictError) as err:
        store.save("c", msgs(3), expected_head=c1.id)
    assert (err.value.expected, err.value.actual) == (c1.id, c2.id)
    assert store.count("c") == 2
    # a second store instance moves the head; the first one's cache must not hide it
    other = CheckpointStore.open(store.url, storage_options=options(store))
    c3 = other.save("c", msgs(3))
    c4 = store.save("c", msgs(4), expected_head=c3.id)
    assert c4.parent_ids == (c3.id,)
    with pytest.raises(ConflictError):
        store.rewind("c", c1.id, expected_head=c3.id)


def test_identical_states_are_stored_once_per_lineage(store: CheckpointStore) -> None:
    """Within a thread and its forks a state is stored once; an unrelated thread stores its
    own copy (its objects live in its own packs)."""
    state = msgs(50)
    first = store.save("a", state)
    n = len(objects_of(store, NODE))
    assert n > 1
    store.save("a", state)
    store.save("a", dict(state))
    assert len(objects_of(store, NODE)) == n
    before = store.storage_bytes() - sum(i.size for i in store.backend.list("refs"))
    store.fork("a", first.id, "b")
    store.save("b", dict(state))
    assert store.storage_bytes() - sum(i.size for i in store.backend.list("refs")) == before
    assert len(set(objects_of(store, NODE))) == n


WEIRD = ["../../etc/passwd", "a/b/c", "..", ".", " spaced id ", "ünïcødé ✓ 🧵", "UPPER",
         "upper", "x" * 128, "with\nnewline", "C:\\windows", "%2e%2e"]


def test_thread_ids_are_arbitrary_strings(store: CheckpointStore, tmp_path: Any) -> None:
    for t in WEIRD:
        store.save(t, {"t": t})
    assert store.threads() == sorted(WEIRD)
    for t in WEIRD:
        assert store.load(t).state == {"t": t}
    if store.url.startswith("/"):
        root = os.path.realpath(store.url)
        for folder, _, files in os.walk(tmp_path):
            for f in files:
                assert os.path.realpath(os.path.join(folder, f)).startswith(root)


@pytest.mark.parametrize("bad", ["", "x" * (64 * 1024 + 1), "\udcff", 42, None])
def test_bad_thread_ids(store: CheckpointStore, bad: Any) -> None:
    with pytest.raises(InvalidArgumentError):
        store.save(bad, {})
    assert store.threads() == []


def test_bad_and_unknown_checkpoint_ids(store: CheckpointStore) -> None:
    c1 = store.save("a", msgs(1))
    other = store.save("b", msgs(2))
    head = store.head("a")
    with pytest.raises(InvalidArgumentError):
        store.load("a", "not-an-id")
    with pytest.raises(NotFoundError) as err:
        store.get("f" * 64)
    assert isinstance(err.value, KeyError) and "f" * 64 in str(err.value)
    with pytest.raises(NotFoundError):
        store.load("a", other.id)  # another thread's checkpoint
    with pytest.raises(NotFoundError):
        store.rewind("a", other.id)
    with pytest.raises(NotFoundError):
        store.delete("a", other.id)
    with pytest.raises(NotFoundError):
        store.load("missing-thread")
    with pytest.raises(NotFoundError):
        store.count("missing-thread")
    assert store.head("a") == head == c1.id and store.count("a") == 1
    for bad_meta in ({"x": object()}, {1: "int key"}):
        with pytest.raises((SerializationError, InvalidArgumentError)):
            store.save("a", {}, metadata=bad_meta)
    with pytest.raises(InvalidArgumentError):
        store.save("a", {}, tags="tool")
    assert store.head("a") == c1.id


def test_operations_log(store: CheckpointStore, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="cas_checkpoint"):
        c = store.save("log", msgs(1))
        store.load("log")
        store.fork("log", c.id, "log2")
    text = caplog.text
    assert f"save thread='log' id={c.id}" in text and "load thread='log'" in text
    assert "fork 'log'" in text


def test_unreachable_and_bad_urls(tmp_path: Any, moto_server: dict[str, Any]) -> None:
    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(StorageError):
        CheckpointStore.open(str(afile))
    with pytest.raises(InvalidArgumentError):
        CheckpointStore.open("")
    with pytest.raises(InvalidArgumentError):
        CheckpointStore.open("nosuchproto://x")
    opts = dict(moto_server["storage_options"])
    missing = CheckpointStore.open("s3://no-such-bucket-here/x", storage_options=opts)
    with pytest.raises(StorageError) as err:
        missing.save("t", {})
    assert "NoSuchBucket" in str(err.value)
    dead = dict(opts, client_kwargs={"endpoint_url": "http://127.0.0.1:9"},
                config_kwargs={"retries": {"max_attempts": 1}, "connect_timeout": 1})
    with pytest.raises(StorageError):
        CheckpointStore.open("s3://cas-test/x", storage_options=dead).threads()


def test_a_store_at_the_root_of_memory_works() -> None:
    """``memory://`` (the whole in-memory filesystem) is a store like ``memory://name``: its
    keys were once written under ``//`` and read back under ``/``, so the first save failed."""
    import uuid

    tid = "root-" + uuid.uuid4().hex
    big = {"a": list(range(50_000))}  # a pack, not only a ref
    for url in ("memory://", "memory:///"):
        store = CheckpointStore.open(url)
        store.save(tid, {"a": 1})
        store.save(tid, big)
        again = CheckpointStore.open(url)
        assert again.load(tid).state == big and tid in again.threads()
        assert again.verify(deep=True).ok
        assert again.gc().deleted_objects == 0
    named = CheckpointStore.open("memory://" + tid)
    named.save("n", {"b": 2})
    assert "n" not in CheckpointStore.open("memory://").threads()  # another store's refs


def test_store_from_fs_object(tmp_path: Any) -> None:
    import fsspec

    store = CheckpointStore(fsspec.filesystem("file"), str(tmp_path / "s"))
    store.save("t", {"a": 1})
    assert CheckpointStore.open(tmp_path / "s").load("t").state == {"a": 1}


def test_a_save_that_loses_a_race_writes_its_pack_again(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Any) -> None:
    """Every compare-and-swap attempt builds its record and packs again on the new head and
    writes them before the ref, so a pack a long contended save names is never older than its
    last attempt (a gc's grace counts from there); the lost attempt's pack is garbage."""
    from cas_checkpoint.backends import RefMismatch

    store = CheckpointStore.open(str(tmp_path / "s"))
    store.save("t", msgs(10))
    written: list[list[str]] = []
    real_put, real_ref = store.backend.put_many, store.backend.write_ref
    fails = [1]

    def put(items: dict[str, bytes]) -> None:
        written.append(sorted(k for k in items if k.startswith("packs/")))
        real_put(items)

    def ref(key: str, data: bytes, expected: str | None, refresh: Any = None) -> str:
        if fails:
            fails.pop()
            raise RefMismatch(key)  # lose one race
        return real_ref(key, data, expected, refresh)

    monkeypatch.setattr(store.backend, "put_many", put)
    monkeypatch.setattr(store.backend, "write_ref", ref)
    state = msgs(300)  # too big to stay inside the ref: one pack
    store.save("t", state)
    assert len(written) == 2 and all(len(w) == 1 for w in written)
    ref = store.refs.read("t")
    assert ref is not None and [p.id for p in ref.head.packs] == [
        written[1][0].replace("packs/", "").replace("/", "")]
    assert store.load("t").state == state and store.count("t") == 2


# --- small roots live inside their records -----------------------------------------------------


def test_a_small_state_writes_only_its_record(store: CheckpointStore) -> None:
    from cas_checkpoint.format.objects import Record

    states = [msgs(i) for i in range(1, 4)]
    ids = [store.save("t", s).id for s in states]
    assert objects_of(store, NODE) == []  # no state node objects at all
    assert sorted(objects_of(store, RECORD)) == sorted(objects_of(store)) == sorted(ids)
    assert store.backend.list("packs") == []  # they all live inside the ref
    ref = store.refs.read("t")
    assert ref is not None
    rec = Record.decode(store.objects.view(ref.head).get(ids[-1]))
    assert rec.root_node is not None and rec.children() == ()
    fresh = CheckpointStore.open(store.url, storage_options=options(store))
    for cid, state in zip(ids, states, strict=True):
        assert fresh.load("t", cid).state == state
        assert fresh.get(cid).state == state


def test_an_inline_root_is_no_object_of_its_own(store: CheckpointStore) -> None:
    from cas_checkpoint.format.objects import Record

    state = {"doc": "y" * 1500, "step": 1}  # the 1.5 KB doc is a node under a small root
    cid = store.save("t", state).id
    ref = store.refs.read("t")
    assert ref is not None
    view = store.objects.view(ref.head)
    rec = Record.decode(view.get(cid))
    assert rec.root_node is not None and len(rec.children()) == 1
    assert view.ids() == {cid, *rec.children()}  # the record and the node under its root
    assert CheckpointStore.open(store.url, storage_options=options(store)).load(
        "t").state == state


@pytest.mark.parametrize("via_load", [False, True])
def test_an_inline_root_reused_as_a_stored_node_is_written(store: CheckpointStore,
                                                           via_load: bool) -> None:
    """A root kept inside its record is no object: when a later state holds the same value
    below its root, that node must be written (the save cache must not think it exists)."""
    inner = {"doc": "y" * 1500, "k": 1}
    store.save("t", inner)
    if via_load:
        store = CheckpointStore.open(store.url, storage_options=options(store))
        assert store.load("t").state == inner
    outer = {"wrap": inner, "n": 2}
    cid = store.save("t", outer).id
    fresh = CheckpointStore.open(store.url, storage_options=options(store))
    assert fresh.get(cid).state == outer
    assert store.verify().ok
