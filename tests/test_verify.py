"""store.verify() on layout v3: an intact store verifies clean; every kind of damage is found and
names exactly the threads and checkpoints it breaks (and where); load refuses damaged data; the
CLI's exit codes. Damaged stores are built by writing raw bytes through the backend."""

from __future__ import annotations

import io
import json
import os
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

import pytest

from cas_checkpoint import CasError, CheckpointStore, IntegrityError, StorageError
from cas_checkpoint.cli import main
from cas_checkpoint.engine.object_store import key_pack_id, pack_key
from cas_checkpoint.engine.refs import HEADS, thread_key
from cas_checkpoint.engine.staging import make_pack
from cas_checkpoint.format import codec
from cas_checkpoint.format.heads import Head, PackRef, Peak
from cas_checkpoint.format.objects import (
    LogEntry,
    ObjectId,
    Record,
    decode_node,
    encode_node,
    object_id,
)
from cas_checkpoint.format.pack import decode_pack, encode_pack
from cas_checkpoint.tree import build as tree
from cas_checkpoint.tree.shapes import MAX_DEPTH

NO_S3 = ["memory", "local"]
KEYS = {"ok", "url", "deep", "sample", "thread", "threads", "checkpoints", "objects",
        "objects_hashed", "bytes_hashed", "by_kind", "unreachable_objects", "unreachable_bytes",
        "seconds", "problems", "notes"}

# --- helpers -----------------------------------------------------------------------------------


def state(i: int) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": f"message {i} " + "x" * 300}
                         for _ in range(3)], "step": i}


SHARED = {"shared": True, "doc": "a document shared by several checkpoints " * 100}


def options(store: CheckpointStore) -> dict[str, Any] | None:
    fs = getattr(store.backend, "fs", None)
    return dict(fs.storage_options) if fs is not None and store.url.startswith("s3") else None


def fresh(store: CheckpointStore) -> CheckpointStore:
    return CheckpointStore.open(store.url, storage_options=options(store))


def head_of(store: CheckpointStore, thread: str) -> Head:
    ref = store.refs.read(thread)
    assert ref is not None
    return ref.head


def put_head(store: CheckpointStore, head: Head, key: str | None = None) -> None:
    key = key or thread_key(head.thread_id)
    got = store.backend.read_ref(key)
    store.backend.write_ref(key, head.encode(), got[1] if got else None)


def with_packs(head: Head, packs: Any) -> Head:
    return Head(head.thread_id, head.head, head.head_step, head.peaks, head.tail, tuple(packs),
                head.inline, head.lineage)


def objects_of(store: CheckpointStore, pid: str) -> dict[ObjectId, bytes]:
    return {k: bytes(v) for k, v in decode_pack(store.backend.get(pack_key(pid))).items()}


def build(store: CheckpointStore) -> dict[str, Any]:
    """Thread a (30 saves, SHARED at 10..14, so its doc nodes are shared), b forked from a[12]
    plus one save of SHARED, c independent (3 saves, one level-0 pack each). A tiny inline_max:
    every object is in a pack."""
    store.refs.inline_max = 1
    a = [store.save("a", SHARED if 10 <= i <= 14 else state(i)).id for i in range(30)]
    store.fork("a", a[12], "b")
    b = [*a[:13], store.save("b", SHARED).id]
    c = [store.save("c", state(100 + i)).id for i in range(3)]
    shared = {*a[10:15], b[-1]}
    return {"a": a, "b": b, "c": c, "shared": shared}


def holding(store: CheckpointStore, thread: str, text: bytes) -> dict[str, set[str]]:
    """State nodes of ``thread`` whose bytes contain ``text``: node id -> ids of the thread's
    packs holding it."""
    out: dict[str, set[str]] = {}
    for p in head_of(store, thread).packs:
        for oid, data in objects_of(store, p.id).items():
            if data[:4] == b"CASN" and text in data:
                out.setdefault(oid, set()).add(p.id)
    assert out, "no such node"
    return out


def pack_of(store: CheckpointStore, thread: str, oid: str) -> str:
    return next(p.id for p in head_of(store, thread).packs if oid in objects_of(store, p.id))


def replace_pack(store: CheckpointStore, thread: str, pid: str,
                 objs: dict[ObjectId, bytes]) -> str:
    """Write a pack of ``objs`` (a valid name) and make ``thread``'s head name it instead of
    ``pid``."""
    ref, data = make_pack(objs, 0)
    store.backend.put_many({pack_key(ref.id): data})
    head = head_of(store, thread)
    put_head(store, with_packs(head, [ref if p.id == pid else p for p in head.packs]))
    return ref.id


def flip(store: CheckpointStore, key: str, at: int) -> None:
    """Flip one byte of an immutable key, in place (its name stays)."""
    data = bytearray(store.backend.get(key))
    data[at] ^= 0x01
    store.backend.delete_many([key])
    store.backend.put_many({key: bytes(data)})


def problems(store: CheckpointStore, deep: bool = True) -> list[tuple[str, str, str]]:
    report = fresh(store).verify(deep=deep)
    return [(p.kind, p.what, p.path) for p in report.problems]


def only(store: CheckpointStore, *, deep: bool = True) -> Any:
    """The one problem the deep audit finds (a quick one reads no pack: it sees those of refs
    and of packs missing or of another size only)."""
    reports = [fresh(store).verify(deep=True)]
    for report in reports:
        assert len(report.problems) == 1, report.to_text()
        assert report.problems == reports[0].problems
    return reports[0].problems[0]


# --- an intact store ---------------------------------------------------------------------------


def test_intact_store_verifies_clean_quick_and_deep(store: CheckpointStore) -> None:
    lay = build(store)
    store.rewind("a", lay["a"][20])  # a[21:] stay in the packs, reached by no checkpoint
    packs = {p.id for t in "abc" for p in head_of(store, t).packs}
    quick, deep = fresh(store).verify(deep=False), fresh(store).verify(deep=True)
    for report in (quick, deep):
        assert report.ok and report.problems == [], report.to_text()
        assert report.threads == 3
        assert "OK: no problems found" in report.to_text()
        assert report.by_kind["pack"]["objects"] == len(packs)
    assert deep.checkpoints == len(set(lay["a"][:21] + lay["b"] + lay["c"]))
    assert deep.by_kind["pack"]["hashed"] == len(packs)
    assert deep.by_kind["record"]["objects"] == deep.checkpoints
    # quick reads the refs and lists the packs: it hashes nothing; deep every object
    assert quick.objects_hashed == quick.by_kind["pack"]["hashed"] == 0
    assert deep.by_kind["record"]["hashed"] == len(set(lay["a"] + lay["b"] + lay["c"]))


def test_json_keys_and_text(tmp_path: Any) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    lay = build(store)
    data = json.loads(fresh(store).verify().to_json())
    assert set(data) == KEYS and data["ok"] is True and data["problems"] == []
    assert set(data["by_kind"]) == {"pack", "record", "segment", "node"}
    assert all(set(v) == {"objects", "hashed", "bytes_hashed"} for v in data["by_kind"].values())
    store.backend.delete_many([pack_key(p.id) for p in head_of(store, "c").packs])
    report = fresh(store).verify(deep=True)
    data = json.loads(report.to_json())
    assert data["ok"] is False and data["deep"] is True and data == report.to_dict()
    assert {tuple(sorted(p)) for p in data["problems"]} == {tuple(sorted(
        ["kind", "what", "object", "path", "detail", "threads", "checkpoints"]))}
    assert "PROBLEMS" in report.to_text() and lay["c"][0] in report.to_text()


def test_long_thread_ids_use_hashed_keys_and_verify_clean(store: CheckpointStore) -> None:
    store.refs.inline_max = 1
    long_ids = ["|".join(f"node{i}:task-{i}" for i in range(400)), "é" * 41]  # > 80 bytes
    for tid in long_ids:
        for i in range(5):
            store.save(tid, state(i))
        assert thread_key(tid).startswith(f"{HEADS}/h-")
    report = fresh(store).verify()
    assert report.ok and report.threads == 2 and report.checkpoints == 10, report.to_text()
    # a long thread's ref copied under another hashed key belongs to no thread there
    other = f"{HEADS}/h-{'0' * 64}"
    put_head(store, head_of(store, long_ids[0]), other)
    p = only(store)
    assert (p.kind, p.what, p.path, p.threads) == ("mismatch", "ref", other, ())


@pytest.mark.parametrize("backend_kind", NO_S3)
def test_one_thread_only_and_a_missing_thread(store: CheckpointStore) -> None:
    build(store)
    store.backend.delete_many([pack_key(p.id) for p in head_of(store, "c").packs])
    report = store.verify(thread_id="a")
    assert report.ok and report.threads == 1 and report.checkpoints == 30
    assert report.unreachable_objects is None and report.unreachable_bytes is None
    assert not store.verify(thread_id="c").ok
    with pytest.raises(CasError):
        store.verify(thread_id="nope")


def test_unreachable_packs_are_counted_not_problems(store: CheckpointStore) -> None:
    build(store)
    store.delete_thread("c")
    named = {p.id for t in "ab" for p in head_of(store, t).packs}
    garbage = [i.size for i in store.backend.list("packs") if key_pack_id(i.key) not in named]
    report = fresh(store).verify()
    assert report.ok, report.to_text()
    assert report.unreachable_objects == len(garbage) >= 3  # c's 3 packs and merged-away ones
    assert report.unreachable_bytes == sum(garbage)
    assert f"{len(garbage)} packs" in report.to_text()


# --- damaged refs --------------------------------------------------------------------------------


def test_a_flipped_byte_in_a_ref_fails_its_checksum(store: CheckpointStore) -> None:
    build(store)
    key = thread_key("c")
    got = store.backend.read_ref(key)
    assert got is not None
    data = bytearray(got[0])
    data[len(data) // 2] ^= 0x01
    store.backend.write_ref(key, bytes(data), got[1])
    p = only(store)
    assert (p.kind, p.what, p.path, p.threads, p.checkpoints) == ("corrupt", "ref", key,
                                                                 ("c",), ())
    assert "checksum" in p.detail


def test_a_ref_naming_a_checkpoint_outside_its_log_dangles(store: CheckpointStore) -> None:
    lay = build(store)
    head = head_of(store, "c")
    put_head(store, Head(head.thread_id, lay["a"][3], head.head_step, head.peaks, head.tail,
                         head.packs, head.inline, head.lineage))
    p = only(store)
    assert (p.kind, p.what, p.path, p.object) == ("dangling_ref", "ref", thread_key("c"),
                                                  lay["a"][3])
    assert p.threads == ("c",) and p.checkpoints == (lay["a"][3],)
    with pytest.raises(CasError):
        fresh(store).load("c")


@pytest.mark.parametrize("backend_kind", NO_S3)
def test_refs_that_misstate_what_they_name(store: CheckpointStore) -> None:
    lay = build(store)
    head = head_of(store, "c")
    put_head(store, Head(head.thread_id, head.head, 7, head.peaks, head.tail, head.packs,
                         head.inline, head.lineage))  # its head is at step 2
    p = only(store)
    assert (p.kind, p.what, p.object, p.threads) == ("mismatch", "ref", lay["c"][-1], ("c",))
    first = head.packs[0]
    put_head(store, with_packs(head, [PackRef(first.id, 0, first.size + 1, first.count),
                                      *head.packs[1:]]))
    p = only(store)
    assert (p.kind, p.what, p.path, p.threads) == ("mismatch", "pack", pack_key(first.id),
                                                   ("c",))
    ha = head_of(store, "a")
    first = ha.peaks[0]  # 30 saves: one segment of 16 entries
    put_head(store, Head("a", ha.head, ha.head_step, (Peak(first.id, 0, first.count + 1),),
                         ha.tail, ha.packs, ha.inline, ha.lineage))
    assert ("mismatch", "segment", thread_key("a")) in problems(store)


def test_a_stray_entry_under_refs_heads(store: CheckpointStore) -> None:
    build(store)
    key = f"{HEADS}/not-a-thread!"
    store.backend.put_many({key: b"hello"})
    p = only(store)
    assert (p.kind, p.what, p.path, p.threads) == ("stray", "ref", key, ())
    assert store.threads() == ["a", "b", "c"]


@pytest.mark.parametrize("backend_kind", ["local"])
def test_a_folder_where_a_ref_belongs_is_reported(store: CheckpointStore, tmp_path: Any) -> None:
    build(store)
    path = os.path.join(store.url, *thread_key("c").split("/"))
    os.rename(path, str(tmp_path / "moved-away"))
    os.mkdir(path)
    p = only(store)
    assert (p.kind, p.what, p.path, p.threads) == ("unreadable", "ref", thread_key("c"), ("c",))


@pytest.mark.parametrize("backend_kind", NO_S3)
def test_a_listing_error_propagates(store: CheckpointStore, monkeypatch: Any) -> None:
    build(store)
    backend = store.backend
    real = backend.list

    def failing(prefix: str) -> Any:
        if prefix.startswith("refs"):
            raise StorageError("listing refused")
        return real(prefix)

    monkeypatch.setattr(backend, "list", failing)
    with pytest.raises(StorageError):
        store.verify()


# --- damaged packs ------------------------------------------------------------------------------


def test_a_missing_pack(store: CheckpointStore) -> None:
    lay = build(store)
    pid = pack_of(store, "c", lay["c"][1])
    store.backend.delete_many([pack_key(pid)])
    report = fresh(store).verify()
    assert [(p.kind, p.what, p.path, p.object) for p in report.problems] == [
        ("missing", "pack", pack_key(pid), pid),
        ("missing", "record", pack_key(pid), lay["c"][1])], report.to_text()
    for p in report.problems:
        assert p.threads == ("c",) and p.checkpoints == (lay["c"][1],)
    assert report.broken_checkpoints() == {lay["c"][1]}


def test_a_flipped_byte_in_a_shared_node_names_every_checkpoint(make_store: Any) -> None:
    store = make_store(compression="none")  # plain packs: an object's bytes are in the pack
    lay = build(store)
    nodes = holding(store, "b", b"a document shared")
    oid = next(iter(nodes))
    for pid in nodes[oid]:  # every copy b could read
        data = store.backend.get(pack_key(pid))
        flip(store, pack_key(pid), data.index(objects_of(store, pid)[ObjectId(oid)]) + 40)
    report = fresh(store).verify()
    node = [p for p in report.problems if p.what == "node"]
    assert [(p.kind, p.object) for p in node] == [("corrupt", oid)], report.to_text()
    assert node[0].path in {f"{pack_key(pid)} (object {oid})" for pid in nodes[oid]}
    assert set(node[0].checkpoints) == lay["shared"] and node[0].threads == ("a", "b")
    packs = [p for p in report.problems if p.what == "pack"]
    assert {(p.kind, p.path) for p in packs} == {("corrupt", pack_key(pid)) for pid in nodes[oid]}
    for p in packs:
        assert set(p.threads) <= {"a", "b"} and "b" in p.threads
        assert set(p.checkpoints) <= lay["shared"] and p.checkpoints
    assert report.broken_checkpoints() == lay["shared"]
    with pytest.raises(IntegrityError):
        fresh(store).load("b")  # the load refuses it too


def test_a_truncated_pack_index_is_undecodable(store: CheckpointStore) -> None:
    lay = build(store)
    head = head_of(store, "c")
    objs = {k: v for p in head.packs for k, v in objects_of(store, p.id).items()}
    data = encode_pack(objs)[:20]  # the index cut short
    pid = object_id(data)
    store.backend.put_many({pack_key(pid): data})
    put_head(store, with_packs(head, [PackRef(pid, 0, len(data), len(objs))]))
    report = fresh(store).verify()
    pack = report.problems[0]
    assert (pack.kind, pack.what, pack.path, pack.threads) == ("undecodable", "pack",
                                                               pack_key(pid), ("c",))
    assert set(pack.checkpoints) == set(lay["c"])
    assert {(p.kind, p.what, p.path) for p in report.problems[1:]} == {
        ("missing", "record", pack_key(pid))}
    assert report.broken_threads() == {"c"}


def test_a_hostile_pack_whose_object_is_not_what_its_index_says(store: CheckpointStore) -> None:
    """A pack with a valid name (the hash of its bytes) whose object bytes were swapped."""
    lay = build(store)
    oid, pids = next(iter(holding(store, "c", b"message 102").items()))
    (pid,) = pids
    objs = objects_of(store, pid)
    objs[ObjectId(oid)] = objs[ObjectId(oid)].replace(b"message 102", b"message 666")
    new = replace_pack(store, "c", pid, objs)
    p = only(store)
    assert (p.kind, p.what, p.object, p.path) == ("corrupt", "node", oid,
                                                  f"{pack_key(new)} (object {oid})")
    assert p.checkpoints == (lay["c"][2],) and p.threads == ("c",)
    with pytest.raises(IntegrityError):
        fresh(store).load("c")


def test_a_node_missing_from_every_pack(store: CheckpointStore) -> None:
    lay = build(store)
    oid, pids = next(iter(holding(store, "c", b"message 101").items()))
    (pid,) = pids
    replace_pack(store, "c", pid, {k: v for k, v in objects_of(store, pid).items() if k != oid})
    p = only(store)
    assert (p.kind, p.what, p.object, p.path) == ("missing", "node", oid, thread_key("c"))
    assert p.checkpoints == (lay["c"][1],) and p.threads == ("c",)


@pytest.mark.parametrize("backend_kind", NO_S3)
def test_a_node_missing_from_a_fork_only_names_the_fork(store: CheckpointStore) -> None:
    lay = build(store)
    nodes = holding(store, "b", b"a document shared")
    for pid in {p for ps in nodes.values() for p in ps}:
        replace_pack(store, "b", pid, {k: v for k, v in objects_of(store, pid).items()
                                       if k not in nodes})
    report = fresh(store).verify()
    assert {(p.kind, p.what, p.object) for p in report.problems} == {
        ("missing", "node", oid) for oid in nodes}, report.to_text()
    for p in report.problems:  # a still holds them: only b's checkpoints that need them
        assert p.threads == ("b",) and set(p.checkpoints) == {*lay["a"][10:13], lay["b"][-1]}
    assert fresh(store).load("a", lay["a"][12]).state == SHARED


@pytest.mark.parametrize("backend_kind", NO_S3)
def test_a_log_entry_that_disagrees_with_its_record(store: CheckpointStore) -> None:
    lay = build(store)
    head = head_of(store, "c")
    last = head.tail[-1]
    wrong = LogEntry(last.id, last.parents, last.step, last.created_at, last.size, "forged",
                     last.tags, last.metadata)
    put_head(store, Head(head.thread_id, head.head, head.head_step, head.peaks,
                         (*head.tail[:-1], wrong), head.packs, head.inline, head.lineage))
    p = only(store)
    assert (p.kind, p.what, p.object, p.path) == ("mismatch", "record", lay["c"][-1],
                                                  thread_key("c"))
    assert "label" in p.detail and p.checkpoints == (lay["c"][-1],) and p.threads == ("c",)


@pytest.mark.parametrize("backend_kind", NO_S3)
def test_deep_rehashes_objects_no_checkpoint_reaches(store: CheckpointStore) -> None:
    build(store)
    pid = head_of(store, "c").packs[0].id
    objs = objects_of(store, pid)
    objs[ObjectId("ab" * 32)] = encode_node(b"\x00\xc0")  # filed under an id it does not have
    new = replace_pack(store, "c", pid, objs)
    assert fresh(store).verify(deep=False).ok  # no checkpoint reaches it
    p = only(store, deep=True)
    assert (p.kind, p.what, p.threads, p.checkpoints) == ("corrupt", "node", ("c",), ())
    assert p.path.startswith(f"{pack_key(new)} (object at byte") and "abababab" in p.detail


# --- state trees a load would refuse -----------------------------------------------------------


def _hostile_thread(store: CheckpointStore, nodes: dict[str, bytes], root: str) -> str:
    rec = Record("h", (), ObjectId(root), 0, 1.0, 10)
    data = rec.encode()
    cid = object_id(data)
    ref, pack = make_pack({**nodes, cid: data}, 0)  # type: ignore[dict-item]
    store.backend.put_many({pack_key(ref.id): pack})
    entry = rec.entry(cid)  # type: ignore[arg-type]
    put_head(store, Head("h", entry.id, 0, (), (entry,), (ref,), (), b"12345678"))
    return cid


def _chain(b: tree._Builder, n: int) -> str:
    child = b.node(tree.VALUE, codec.encode(1))
    for _ in range(n):
        child = b.node(tree.VALUE, b"\x91" + codec.encode_link(codec.Ref(0)), [child])
    return child


@pytest.mark.parametrize("backend_kind", NO_S3)
def test_a_tree_deeper_than_a_load_follows(store: CheckpointStore) -> None:
    b = tree._Builder(None)
    top = _chain(b, MAX_DEPTH + 1)
    cid = _hostile_thread(store, dict(b.objects), top)
    p = only(store)
    assert (p.kind, p.what, p.object) == ("too_deep", "node", top)
    assert p.threads == ("h",) and p.checkpoints == (cid,)
    with pytest.raises(CasError):
        fresh(store).load("h")
    b = tree._Builder(None)  # MAX_DEPTH levels below the root exactly: a load follows them
    top = _chain(b, MAX_DEPTH)
    _hostile_thread(store, dict(b.objects), top)
    assert fresh(store).verify().ok
    assert isinstance(fresh(store).load("h").state, list)  # a load follows it too


@pytest.mark.parametrize("backend_kind", NO_S3)
def test_a_long_path_behind_shortcuts_is_too_deep(store: CheckpointStore) -> None:
    """Every node of a long chain is also a child of the root: the shortest path to each is 1
    level, the longest (which a load follows) is the whole chain."""
    b = tree._Builder(None)
    chain = [b.node(tree.VALUE, codec.encode(1))]
    for _ in range(MAX_DEPTH + 20):
        chain.append(b.node(tree.VALUE, b"\x91" + codec.encode_link(codec.Ref(0)), [chain[-1]]))
    links = b"".join(codec.encode_link(codec.Ref(i)) for i in range(len(chain)))
    root = b.node(tree.VALUE, b"\xdc" + len(chain).to_bytes(2, "big") + links, chain)
    cid = _hostile_thread(store, dict(b.objects), root)
    p = only(store)
    assert (p.kind, p.what, p.checkpoints) == ("too_deep", "node", (cid,))
    with pytest.raises(CasError):
        fresh(store).load("h")


@pytest.mark.parametrize("backend_kind", NO_S3)
def test_a_tree_that_expands_into_gigabytes(store: CheckpointStore) -> None:
    b = tree._Builder(None)
    leaf = b.node(tree.VALUE, codec.encode("x" * 60_000))
    links = b"".join(codec.encode_link(codec.Ref(i)) for i in range(999))
    mid = b.node(tree.VALUE, b"\xdc\x03\xe7" + links, [leaf] * 999)
    top = b.node(tree.VALUE, b"\xdc\x03\xe7" + links, [mid] * 999)
    cid = _hostile_thread(store, dict(b.objects), top)
    p = only(store)
    assert (p.kind, p.what, p.object, p.checkpoints) == ("too_big", "node", top, (cid,))
    with pytest.raises(CasError):
        fresh(store).load("h")


def test_a_bad_node_decoding_is_reported_against_its_checkpoint(tmp_path: Any) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    bad = encode_node(b"\x00", ())[:5] + b"\x09"  # names 9 children in a 1-byte node
    cid = _hostile_thread(store, {object_id(bad): bad}, object_id(bad))
    p = only(store)
    assert (p.kind, p.what, p.object, p.checkpoints) == ("undecodable", "node", object_id(bad),
                                                         (cid,))
    with pytest.raises(CasError):
        decode_node(bad)


# --- sample, progress and the CLI ----------------------------------------------------------------


def test_sample_rehashes_about_that_fraction_of_the_unreached_objects(tmp_path: Any) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    store.refs.inline_max = 1
    for t in range(30):
        first = store.save(f"t{t}", state(t)).id
        for i in range(1, 8):
            store.save(f"t{t}", state(1000 * t + i))
        store.rewind(f"t{t}", first)  # 7 records and their nodes reached by no checkpoint
    quick, full = store.verify(deep=False), store.verify(deep=True)
    assert quick.ok and full.ok and full.objects_hashed >= quick.objects_hashed + 210
    seen = []
    for _ in range(5):
        report = store.verify(deep=True, sample=0.5)
        assert report.ok and report.by_kind["pack"] == full.by_kind["pack"]
        assert quick.objects_hashed < report.objects_hashed < full.objects_hashed
        seen.append(report.objects_hashed)
    assert len(set(seen)) > 1  # a different random sample each run
    for bad in ({"sample": 1.5}, {"sample": 0}, {"sample": 0.5, "deep": False}):
        with pytest.raises(CasError):
            store.verify(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("backend_kind", NO_S3)
def test_progress_is_reported(store: CheckpointStore) -> None:
    build(store)
    calls: list[tuple[int, int]] = []
    store.verify(progress=lambda done, total: calls.append((done, total)))
    assert calls and calls[-1][0] == calls[-1][1] > 0
    assert all(d <= t for d, t in calls)


def test_nan_metadata_is_not_a_mismatch() -> None:
    store = CheckpointStore.open(f"memory://nan-{os.getpid()}-{id(object())}")
    store.save("t", {"a": 1}, metadata={"score": float("nan")})
    report = store.verify()
    assert report.ok and report.checkpoints == 1, report.to_text()


def _cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def test_cli_exit_codes(tmp_path: Any) -> None:
    path = str(tmp_path / "cli")
    store = CheckpointStore.open(path, compression="none")
    lay = build(store)
    code, out, _ = _cli("verify", path, "--deep")
    assert code == 0 and "OK" in out
    code, out, _ = _cli("verify", path, "--json")
    assert code == 0 and json.loads(out)["ok"] is True and json.loads(out)["deep"] is False
    oid, pids = next(iter(holding(store, "c", b"message 100").items()))
    (pid,) = pids
    data = store.backend.get(pack_key(pid))
    flip(store, pack_key(pid), data.index(objects_of(store, pid)[ObjectId(oid)]) + 40)
    # a quick verify reads no pack: a flipped byte keeps the pack's size, only --deep sees it
    assert _cli("verify", path)[0] == 0
    code, out, _ = _cli("verify", path, "--thread", "c", "--deep")
    assert code == 1 and lay["c"][0] in out and "corrupt" in out
    code, out, _ = _cli("verify", path, "--json", "--deep")
    assert code == 1 and oid in [p["object"] for p in json.loads(out)["problems"]]
    assert _cli("verify", path, "--thread", "a", "--deep")[0] == 0
    code, _, err = _cli("verify", str(tmp_path / "no-such-store"))
    assert code == 2 and "no-such-store" in err
    assert not os.path.exists(tmp_path / "no-such-store")
    (tmp_path / "afile").write_text("x")
    assert _cli("verify", str(tmp_path / "afile"))[0] == 2
    code, _, err = _cli("verify", path, "--deep", "--progress")
    assert code == 1 and "objects" in err
    store.backend.delete_many([pack_key(pid)])  # a missing pack: the quick verify sees it
    code, out, _ = _cli("verify", path)
    assert code == 1 and pack_key(pid) in out


def test_cli_s3_endpoint(moto_server: dict[str, Any], monkeypatch: Any) -> None:
    url = f"s3://{moto_server['bucket']}/cli-{os.getpid()}"
    store = CheckpointStore.open(url, storage_options=moto_server["storage_options"])
    build(store)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    code, out, err = _cli("verify", url, "--endpoint-url", moto_server["endpoint"], "--deep")
    assert code == 0, err
    assert "OK" in out
    store.backend.delete_many([pack_key(head_of(store, "c").packs[0].id)])
    assert _cli("verify", url, "--endpoint-url", moto_server["endpoint"])[0] == 1
    bad = "s3://no-such-bucket-x/p"
    assert _cli("verify", bad, "--endpoint-url", moto_server["endpoint"])[0] == 2
