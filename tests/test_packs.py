"""Packs (storage layout v3) through the store: every value type survives inline objects being
flushed into packs and packs being merged; a damaged or lying pack is an IntegrityError, never
state; a cold load on S3 costs a handful of requests whatever the thread's length; thread ids of
kilobytes save, load, list, fork and survive gc."""

from __future__ import annotations

import random
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pydantic
import pytest
from _hostile import plant_lying_pack
from builders import options
from conftest import open_store
from test_codec import EXAMPLES, REG, Color, Frozen, Level, Point, same

from cas_checkpoint import CheckpointStore, IntegrityError, InvalidArgumentError, NotFoundError
from cas_checkpoint.engine import staging
from cas_checkpoint.engine.object_store import key_pack_id, pack_key
from cas_checkpoint.engine.refs import MAX_THREAD_ID_BYTES, SHORT_KEY_BYTES, thread_key
from cas_checkpoint.format.heads import Head
from cas_checkpoint.format.objects import NODE, RECORD, SEGMENT, Record, object_id, object_kind
from cas_checkpoint.format.pack import read_pack_index


class Inner(pydantic.BaseModel):
    when: datetime
    tags: frozenset[str] = frozenset()


class Outer(pydantic.BaseModel):
    inner: Inner
    pair: tuple[int, str]
    points: list[int] = []


TYPES = [Point, Frozen, Color, Level, Inner, Outer]
assert {Point, Frozen, Color, Level} <= set(TYPES) and REG is not None


def reopen(store: CheckpointStore, **kw: Any) -> CheckpointStore:
    """A new store object on the same storage: empty caches, nothing known."""
    return CheckpointStore.open(store.url, storage_options=options(store), **kw)


def head_of(store: CheckpointStore, thread: str) -> Head:
    ref = store.refs.read(thread)
    assert ref is not None
    return ref.head


def stored_packs(store: CheckpointStore) -> set[str]:
    return {p for p in (key_pack_id(i.key) for i in store.backend.list("packs")) if p}


def named_packs(store: CheckpointStore) -> set[str]:
    return {p.id for t in store.threads() for p in head_of(store, t).packs}


def replace_file(store: CheckpointStore, key: str, data: bytes) -> None:
    """Overwrite a stored pack with other bytes (what a bad disk or a hostile writer does)."""
    store.backend.delete_many([key])
    store.backend.put_many({key: data})
    assert store.backend.get(key) == data


# --- every value type through flushes and merges -------------------------------------------------


def zoo_state(i: int) -> dict[str, Any]:
    """Checkpoint ``i``: every example value (shared by all checkpoints), one of them on its own
    (a different type each save), models, a growing message list, and big str and bytes values
    that change now and then (split into many stored nodes)."""
    rng = random.Random(i // 7)
    return {
        "i": i,
        "one": EXAMPLES[i % len(EXAMPLES)],
        "all": EXAMPLES,
        "models": [Outer(inner=Inner(when=datetime(2026, 1, 1 + i % 28, tzinfo=UTC),
                                     tags=frozenset({f"t{i % 3}"})),
                         pair=(i, "x" * (i % 5)), points=list(range(i % 9)))],
        "messages": [{"role": "user", "content": f"message {k} " * 6, "n": k}
                     for k in range(i + 1)],
        "blob": rng.randbytes(20_000),
        "text": "".join(rng.choice("abcdé✓ \n") for _ in range(6_000)),
        "nested": (Point(i, [Point(i + 1)]), {Color.RED: Level.HIGH}, Frozen(f"f{i}", ("y",))),
    }


@pytest.mark.parametrize("kind,inline_max", [("memory", 1), ("memory", None), ("local", 1),
                                             ("local", None), ("s3", 1)])
def test_every_value_type_roundtrips_through_packs_and_merges(
        kind: str, inline_max: int | None, tmp_path: Any, request: pytest.FixtureRequest) -> None:
    store = open_store(kind, tmp_path, request, types=TYPES)
    if inline_max is not None:
        store.refs.inline_max = inline_max  # every save flushes a pack: merges all the time
    n = len(EXAMPLES) + 3
    ids = [store.save("zoo", zoo_state(i), label=f"l{i}" if i % 10 == 0 else None,
                      tags=["z"] if i % 3 == 0 else (), metadata={"i": i}).id for i in range(n)]
    fork = store.fork("zoo", ids[n // 2], "zoo-fork")
    extra = store.save("zoo-fork", zoo_state(1000)).id
    head = head_of(store, "zoo")
    assert any(p.level > 0 for p in head.packs), [p.level for p in head.packs]  # merged
    assert 1 < len(head.packs) <= staging.MAX_PACKS
    assert sum(map(len, head.inline)) <= store.refs.inline_max

    fresh = reopen(store, types=TYPES)  # nothing cached: everything comes out of packs
    assert [c.id for c in fresh.history("zoo")] == ids[::-1]
    for i, cid in enumerate(ids):
        cp = fresh.load("zoo", cid)
        assert same(cp.state, zoo_state(i)), f"checkpoint {i} came back different"
        assert (cp.step, cp.metadata, cp.label) == (i, {"i": i},
                                                    f"l{i}" if i % 10 == 0 else None)
    assert same(fresh.load("zoo").state, zoo_state(n - 1))
    other = reopen(store, types=TYPES)
    assert same(other.load("zoo-fork", fork.id).state, zoo_state(n // 2))
    assert same(other.load("zoo-fork").state, zoo_state(1000)) and other.head("zoo-fork") == extra
    assert same(other.get(ids[1]).state, zoo_state(1))


def test_no_object_is_lost_across_thousands_of_merges(tmp_path: Any) -> None:
    """Many small saves, each flushed into its own pack: objects of the first checkpoints went
    through every level of merging and still load, from packs alone."""
    store = CheckpointStore.open(str(tmp_path / "s"))
    store.refs.inline_max = 1
    ids = [store.save("t", {"i": i, "msg": f"m{i} " * 50}).id for i in range(300)]
    head = head_of(store, "t")
    assert max(p.level for p in head.packs) >= 3 and head.inline == ()
    assert len(head.packs) <= staging.MAX_PACKS
    fresh = reopen(store)
    assert [fresh.load("t", c).state["i"] for c in ids] == list(range(300))
    held = set()
    for pid, objs in fresh.objects.pack_bytes([p.id for p in head.packs]).items():
        assert all(object_id(bytes(v)) == k for k, v in objs.items()), pid
        held |= set(objs)
    assert set(ids) <= held


# --- damaged and hostile packs ----------------------------------------------------------------


def _big(i: int) -> dict[str, Any]:
    """A state whose root fits in its record and whose messages are stored nodes."""
    return {"i": i, "messages": [f"message {i}-{k} " * 10 for k in range(30)]}


@pytest.mark.parametrize("kind", ["memory", "local"])
def test_a_flipped_byte_inside_a_packed_object_is_an_integrity_error_naming_the_pack(
        kind: str, tmp_path: Any, request: pytest.FixtureRequest) -> None:
    store = open_store(kind, tmp_path, request, compression="none")  # bytes where they lie
    store.refs.inline_max = 1
    ids = [store.save("t", _big(i)).id for i in range(6)]
    pack = head_of(store, "t").packs[0]  # holds the oldest checkpoints
    key = pack_key(pack.id)
    data = store.backend.get(key)
    [(start, end)] = next(iter(read_pack_index(data).values()))  # one object's bytes
    at = (start + end) // 2
    bad = data[:at] + bytes([data[at] ^ 0x40]) + data[at + 1:]
    replace_file(store, key, bad)
    fresh = reopen(store)
    assert fresh.load("t").state == _big(5)  # its objects are all in intact packs
    for call in (lambda: fresh.load("t", ids[0]), lambda: fresh.get(ids[0])):
        with pytest.raises(IntegrityError) as err:
            call()
        assert err.value.path == key  # names the pack: where to look
        assert (err.value.expected, err.value.actual) == (pack.id, object_id(bad))
        assert key in str(err.value)
    report = reopen(store).verify()
    assert not report.ok and any(p.path.startswith(key) for p in report.problems), \
        report.to_text()
    replace_file(store, key, data)  # restored from a backup: everything loads again
    assert [reopen(store).load("t", c).state for c in ids] == [_big(i) for i in range(6)]


def _target(head: Head, objects: dict[str, bytes], victim: bytes) -> str:
    """An object of the kind ``victim`` that loading the head (or its history) needs."""
    assert head.head is not None
    if victim == RECORD:
        return head.head
    if victim == SEGMENT:
        return head.peaks[0].id
    return Record.decode(objects[head.head]).children()[0]  # a stored node of the head's state


@pytest.mark.parametrize("victim", [RECORD, NODE, SEGMENT], ids=["record", "node", "segment"])
def test_a_pack_whose_index_lies_is_an_integrity_error_naming_the_object(
        victim: bytes, tmp_path: Any) -> None:
    """A pack that hashes to its name (a valid pack id) but whose index names an object by its
    id with the bytes of another object: the object is re-hashed when taken out, and the
    error names the object and the pack."""
    store = CheckpointStore.open(str(tmp_path / "s"))
    store.refs.inline_max = 1
    ids = [store.save("t", _big(i)).id for i in range(20)]  # 20 > 16 entries: a log segment
    ref = store.refs.read("t")
    assert ref is not None and ref.head.peaks
    view = store.objects.view(ref.head)
    objects = {oid: view.get(oid) for oid in sorted(view.ids())}
    target = _target(ref.head, objects, victim)
    assert object_kind(objects[target]) == victim
    others = sorted((object_kind(d) != victim, o) for o in objects if o != target
                    for d in [objects[o]])
    liar = objects[others[0][1]]  # another object, of the same kind when there is one
    pref = plant_lying_pack(store, "t", ref, objects, target, liar)
    fresh = CheckpointStore.open(store.url)
    call = fresh.history if victim == SEGMENT else fresh.load
    with pytest.raises(IntegrityError) as err:
        call("t")
    assert err.value.expected == target and err.value.actual == object_id(liar)
    assert err.value.path == f"{pack_key(pref.id)} (object {target})"
    if victim == SEGMENT:  # an old checkpoint is found through the segment
        with pytest.raises(IntegrityError):
            fresh.load("t", ids[0])
    else:  # objects are checked one by one: what does not need the lie still loads
        assert fresh.load("t", ids[0]).state == _big(0)
    assert not CheckpointStore.open(store.url).verify().ok


# --- requests on S3: a cold load, a steady save ------------------------------------------------


class S3Requests:
    """Counts the requests one store's botocore client sends (event hook ``before-send.s3``)."""

    def __init__(self, store: CheckpointStore) -> None:
        from fsspec.asyn import sync

        fs = store.backend.fs  # type: ignore[attr-defined]
        sync(fs.loop, fs.set_session)
        self.ops: list[str] = []
        self.events = fs.s3.meta.events
        self.events.register("before-send.s3", self._sent)

    def _sent(self, event_name: str = "", **_: Any) -> None:
        self.ops.append(event_name.rsplit(".", 1)[-1])

    def take(self) -> list[str]:
        out, self.ops = self.ops, []
        return out

    def close(self) -> None:
        self.events.unregister("before-send.s3", self._sent)


def _message(i: int) -> dict[str, Any]:
    rng = random.Random(i)
    return {"role": "user" if i % 2 else "assistant", "id": i,
            "content": " ".join("".join(rng.choice("abcdefghij") for _ in range(6))
                                for _ in range(56))}  # ~400 bytes


def test_cold_load_and_steady_save_request_counts_on_s3(moto_server: dict[str, Any]) -> None:
    """A thread of 1,000 saves, one message appended per save (built on memory:// and copied
    to S3 object by object: the layout is the same, and building it on moto would take the
    test's whole time budget). A new store object loads its head with one GET of the ref and
    one GET per pack; steady saves then cost the ref PUT, and a pack PUT now and then."""
    n = 1000
    msgs = [_message(i) for i in range(n + 40)]
    src = CheckpointStore.open(f"memory://cold-{uuid.uuid4().hex[:8]}")
    for i in range(1, n + 1):
        src.save("t", {"messages": msgs[:i]})
    url = f"s3://{moto_server['bucket']}/cold-{uuid.uuid4().hex[:8]}"
    opts = moto_server["storage_options"]
    dst = CheckpointStore.open(url, storage_options=opts)
    keys = [i.key for i in src.backend.list("packs")]
    dst.backend.put_many({k: src.backend.get(k) for k in keys})
    got = src.backend.read_ref(thread_key("t"))
    assert got is not None
    dst.backend.write_ref(thread_key("t"), got[0], None)
    packs = len(head_of(src, "t").packs)
    assert packs >= 2

    own = {**opts, "skip_instance_cache": True}  # its own client: nothing else is counted
    cold = CheckpointStore.open(url, storage_options=own)
    count = S3Requests(cold)
    try:
        assert cold.load("t").state == {"messages": msgs[:n]}
        ops = count.take()
        assert ops == ["GetObject"] * len(ops), ops  # no listing, no HEAD
        assert len(ops) == 1 + packs <= 16, ops  # the ref, then each pack once
        assert cold.count("t") == n and len(count.take()) == 1  # the ref alone
        assert len(cold.history("t")) == n and len(count.take()) == 1  # packs cached

        other = CheckpointStore.open(url, storage_options={**own, "skip_instance_cache": True})
        assert other.backend.fs is not cold.backend.fs  # type: ignore[attr-defined]
        count2 = S3Requests(other)
        try:
            assert len(other.history("t", limit=5)) == 5
            assert len(count2.take()) == 1  # recent history: the ref alone
        finally:
            count2.close()

        cold.save("t", {"messages": msgs[:n + 1]})  # the first write also probes the endpoint
        count.take()
        per_save = []
        for i in range(n + 2, n + 40):
            cold.save("t", {"messages": msgs[:i]})
            per_save.append(count.take())
        assert all(len(ops) <= 3 for ops in per_save), [len(o) for o in per_save]
        assert all(set(ops) <= {"PutObject"} for ops in per_save), per_save  # nothing read
        assert any(len(ops) == 2 for ops in per_save)  # some saves did flush a pack
    finally:
        count.close()
    assert CheckpointStore.open(url, storage_options=opts).load("t").state == {
        "messages": msgs[:n + 39]}


# --- thread ids of kilobytes -------------------------------------------------------------------


def langgraph_id(seed: int, nbytes: int = 4096) -> str:
    """A LangGraph-like checkpoint namespace: ``node:task-id|node:task-id|...`` of ``nbytes``
    UTF-8 bytes (non-ASCII included)."""
    rng = random.Random(seed)
    parts: list[str] = []
    while len("|".join(parts).encode()) < nbytes:
        parts.append(f"nœud_{rng.randrange(99)}:{uuid.UUID(int=rng.getrandbits(128))}")
    text = "|".join(parts)
    while len(text.encode()) > nbytes:
        text = text[:-1]
    return text + "x" * (nbytes - len(text.encode()))


def test_thread_ids_of_kilobytes_save_load_list_fork_and_gc(store: CheckpointStore) -> None:
    a = langgraph_id(1)
    b = a[:-1] + "y"  # differs from a in its last character only
    assert len(a.encode()) == len(b.encode()) == 4096
    assert thread_key(a) != thread_key(b) and len(thread_key(a)) < 100
    store.refs.inline_max = 1  # packs and merges
    ids = [store.save(a, _big(i), metadata={"i": i}).id for i in range(18)]
    store.save("short", {"x": 1})
    assert store.threads() == sorted([a, "short"])
    fork = store.fork(a, ids[9], b)
    assert fork.thread_id == b
    tip = store.save(b, _big(100)).id
    fresh = reopen(store)
    assert fresh.threads() == sorted([a, b, "short"])
    assert fresh.load(a).state == _big(17) and fresh.load(a).thread_id == a
    assert [c.id for c in fresh.history(b)] == [tip, *ids[9::-1]]
    assert fresh.load(b, ids[3]).state == _big(3)
    assert fresh.find(a, metadata={"i": 5})[0].id == ids[5]
    with pytest.raises(NotFoundError):
        fresh.load(a[:-1] + "z")  # a neighbouring id is another (absent) thread
    store.delete_thread(a)
    if store.url.startswith("s3://"):
        time.sleep(1.1)  # LastModified has a resolution of one second
    report = store.gc(grace=timedelta(0), force=True)
    assert report.deleted_objects > 0 and stored_packs(store) == named_packs(store)
    after = reopen(store)
    assert after.threads() == sorted([b, "short"])
    assert [after.load(b, c.id).id for c in after.history(b)] == [tip, *ids[9::-1]]
    assert after.load(b).state == _big(100)


def test_thread_id_length_limits(store: CheckpointStore) -> None:
    short = "é" * (SHORT_KEY_BYTES // 2)  # exactly 80 bytes: spelled out in its key
    long = short + "a"  # 81 bytes: a hashed key
    top = "a" * MAX_THREAD_ID_BYTES  # the longest id accepted
    assert not thread_key(short).rsplit("/", 1)[1].startswith("h-")
    assert thread_key(long).rsplit("/", 1)[1].startswith("h-")
    for i, t in enumerate((short, long, top)):
        store.save(t, {"i": i})
    assert store.threads() == sorted([short, long, top])
    fresh = reopen(store)
    assert [fresh.load(t).state for t in (short, long, top)] == [{"i": 0}, {"i": 1}, {"i": 2}]
    with pytest.raises(InvalidArgumentError, match="bytes"):
        store.save(top + "a", {"i": 3})
    assert store.threads() == sorted([short, long, top])


def test_a_pack_read_by_two_threads_at_once_lists_every_object(monkeypatch: Any) -> None:
    """``Pack.objects`` is filled while hashing: a second thread asking meanwhile must never get
    the part filled so far (a merge that read it dropped objects: a lost log segment, found by
    LangGraph's background writes racing its saves)."""
    import threading

    from cas_checkpoint.engine import object_store, pack_reads
    from cas_checkpoint.format.objects import object_id
    from cas_checkpoint.format.pack import encode_pack

    objs = {object_id(b"x" * i): b"x" * i for i in range(1, 40)}
    data = encode_pack(objs)  # type: ignore[arg-type]
    pack = object_store.parse_pack(object_id(data), data)
    started, release = threading.Event(), threading.Event()
    real = pack_reads.object_id
    calls = {"n": 0}

    def slow(obj: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 5 and threading.current_thread().name == "first":
            started.set()
            release.wait(5)  # the first reader stops part-way through
        return real(obj)

    monkeypatch.setattr(pack_reads, "object_id", slow)
    first = threading.Thread(target=lambda: pack.objects, name="first")
    first.start()
    assert started.wait(5)
    seen = len(pack.objects)  # the second reader, meanwhile
    release.set()
    first.join(5)
    assert seen == len(objs) == len(pack.objects)


@pytest.mark.parametrize("options", [{}, {"compression": "none"}, {"encryption": "key"}])
def test_the_writer_keeps_its_pack_as_a_reader_would_parse_it(
        tmp_path: Any, options: dict[str, Any]) -> None:
    """A writer keeps the packs it wrote from their plain bytes (not decompressed or decrypted
    again): the same index, bytes and size as parsing what it stored; and a new store object
    loads the state from the stored packs."""
    from cas_checkpoint import Key
    from cas_checkpoint.engine.object_store import parse_pack

    if "encryption" in options:
        options = {"encryption": Key.generate()}
    url = str(tmp_path / "s")
    store = CheckpointStore.open(url, **options)
    state = {"messages": [{"i": i, "text": f"message {i} " * 30} for i in range(300)]}
    store.save("t", state)
    objects = store._core.objects
    kept = dict(objects._cache)
    assert kept
    for pid, pack in kept.items():
        with open(tmp_path / "s" / pack_key(pid), "rb") as f:
            stored = f.read()
        parsed = parse_pack(pid, stored, keys=objects.keyring)
        assert (pack.size, bytes(pack.data), pack.index) == (
            parsed.size, bytes(parsed.data), parsed.index)
        assert set(pack.known) == set(parsed.objects)
        if "encryption" in options:
            assert objects.sealed_by[pid] == stored[6:14].hex()
    assert CheckpointStore.open(url, **options).load("t").state == state
