"""store.verify() on layout v3: an intact store verifies clean; every kind of damage is found and
names exactly the threads and checkpoints it breaks; load refuses damaged data; the CLI's exit
codes."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

import pytest

from cas_checkpoint import CasError, CheckpointStore, IntegrityError, codec, tree
from cas_checkpoint.cli import main
from cas_checkpoint.objects import (
    Head,
    LogEntry,
    ObjectId,
    Record,
    decode_node,
    decode_pack,
    encode_node,
    encode_pack,
    object_id,
)
from cas_checkpoint.objstore import pack_key
from cas_checkpoint.packing import make_pack
from cas_checkpoint.refs import thread_key

LOCAL_S3 = ["local", "s3"]
NO_S3 = ["memory", "local"]

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


def put_head(store: CheckpointStore, head: Head) -> None:
    key = thread_key(head.thread_id)
    got = store.backend.read_ref(key)
    store.backend.write_ref(key, head.encode(), got[1] if got else None)


def with_packs(head: Head, packs: Any, inline: Any = None) -> Head:
    return Head(head.thread_id, head.head, head.head_step, head.peaks, head.tail, tuple(packs),
                head.inline if inline is None else tuple(inline), head.lineage)


def build(store: CheckpointStore) -> dict[str, Any]:
    """Thread a (30 saves, SHARED at 10..14, so its doc node is shared), b forked from a[12]
    plus one save of SHARED, c independent. Small inline_max: everything is in packs."""
    store.refs.inline_max = 1
    a = [store.save("a", SHARED if 10 <= i <= 14 else state(i)).id for i in range(30)]
    store.fork("a", a[12], "b")
    b = [*a[:13], store.save("b", SHARED).id]
    c = [store.save("c", state(100 + i)).id for i in range(3)]
    shared = {*a[10:15], b[-1]}
    return {"a": a, "b": b, "c": c, "shared": shared}


def node_with(store: CheckpointStore, thread: str, text: bytes) -> tuple[str, str]:
    """(node id, pack id) of a state node of ``thread`` whose bytes contain ``text``."""
    head = head_of(store, thread)
    for p in head.packs:
        for oid, data in decode_pack(store.backend.get(pack_key(p.id))).items():
            if bytes(data[:4]) == b"CASN" and text in bytes(data):
                return oid, p.id
    raise AssertionError("no such node")


def damage_pack(store: CheckpointStore, pid: str, oid: str) -> None:
    """Flip one byte inside object ``oid`` of pack ``pid``, in place (the pack's name stays)."""
    data = bytearray(store.backend.get(pack_key(pid)))
    obj = bytes(decode_pack(bytes(data))[ObjectId(oid)])
    at = bytes(data).index(obj) + len(obj) - 2
    data[at] ^= 0x01
    store.backend.delete_many([pack_key(pid)])
    store.backend.put_many({pack_key(pid): bytes(data)})


def assert_broken(store: CheckpointStore, checkpoints: set[str], threads: set[str],
                  kinds: set[tuple[str, str]]) -> None:
    for deep in (False, True):
        report = fresh(store).verify(deep=deep)
        assert not report.ok, report.to_text()
        assert {(p.kind, p.what) for p in report.problems} == kinds, report.to_text()
        assert report.broken_checkpoints() == checkpoints, report.to_text()
        assert report.broken_threads() == threads, report.to_text()


# --- an intact store ---------------------------------------------------------------------------


def test_intact_store_verifies_clean_quick_and_deep(store: CheckpointStore) -> None:
    lay = build(store)
    long_id = "|".join(f"node{i}:task-{i}" for i in range(400))
    store.save(long_id, state(7))
    for deep in (False, True):
        report = fresh(store).verify(deep=deep)
        assert report.ok, report.to_text()
        assert report.threads == 4 and report.checkpoints == len(set(lay["a"] + lay["b"]
                                                                     + lay["c"])) + 1
        assert report.by_kind["pack"]["objects"] >= 1 and report.by_kind["record"]["objects"]
        assert "OK" in report.to_text()
        data = json.loads(report.to_json())
        assert set(data) >= {"ok", "url", "deep", "sample", "thread", "threads", "checkpoints",
                             "objects", "objects_hashed", "bytes_hashed", "by_kind",
                             "unreachable_objects", "unreachable_bytes", "seconds", "problems"}
    deep, quick = fresh(store).verify(deep=True), fresh(store).verify(deep=False)
    assert deep.objects_hashed > quick.objects_hashed  # deep hashes every object of every pack


@pytest.mark.parametrize("backend_kind", NO_S3)
def test_one_thread_only_and_a_missing_thread(store: CheckpointStore) -> None:
    build(store)
    report = store.verify(thread_id="c")
    assert report.ok and report.threads == 1 and report.checkpoints == 3
    assert report.unreachable_objects is None
    with pytest.raises(CasError):
        store.verify(thread_id="nope")


@pytest.mark.parametrize("backend_kind", NO_S3)
def test_unreachable_packs_are_counted_not_problems(store: CheckpointStore) -> None:
    build(store)
    store.delete_thread("c")
    report = store.verify()
    assert report.ok and report.unreachable_objects and report.unreachable_bytes


# --- damage --------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend_kind", LOCAL_S3)
def test_a_flipped_byte_in_a_shared_node_names_every_checkpoint(store: CheckpointStore) -> None:
    lay = build(store)
    oid, _ = node_with(store, "a", b"a document shared")
    packs = {p.id for t in ("a", "b") for p in head_of(store, t).packs}
    for pid in packs:  # every copy (a merge in "a" after the fork left one in "b"'s old pack)
        if ObjectId(oid) in decode_pack(store.backend.get(pack_key(pid))):
            damage_pack(store, pid, oid)
    report = fresh(store).verify()
    kinds = {(p.kind, p.what) for p in report.problems}
    assert ("corrupt", "pack") in kinds and ("corrupt", "node") in kinds, report.to_text()
    node = next(p for p in report.problems if p.what == "node")
    assert node.object == oid and set(node.checkpoints) == lay["shared"]
    assert set(node.threads) == {"a", "b"} and node.path.startswith("packs/")
    with pytest.raises(IntegrityError):
        fresh(store).load("b")  # the load refuses it too


@pytest.mark.parametrize("backend_kind", LOCAL_S3)
def test_a_missing_pack(store: CheckpointStore) -> None:
    lay = build(store)
    head = head_of(store, "c")
    store.backend.delete_many([pack_key(p.id) for p in head.packs])
    report = fresh(store).verify()
    kinds = {(p.kind, p.what) for p in report.problems}
    assert ("missing", "pack") in kinds, report.to_text()
    assert report.broken_threads() == {"c"}
    assert report.broken_checkpoints() == set(lay["c"])


@pytest.mark.parametrize("backend_kind", NO_S3)
def test_a_truncated_pack_index_is_undecodable(store: CheckpointStore) -> None:
    build(store)
    head = head_of(store, "c")
    objs = {ObjectId(k): bytes(v) for p in head.packs
            for k, v in decode_pack(store.backend.get(pack_key(p.id))).items()}
    data = encode_pack(objs)[:20]  # the index cut short: a pack that cannot be read
    pid = object_id(data)
    store.backend.put_many({pack_key(pid): data})
    put_head(store, with_packs(head, [type(head.packs[0])(pid, 0, len(data), len(objs))]))
    report = fresh(store).verify()
    assert ("undecodable", "pack") in {(p.kind, p.what) for p in report.problems}
    assert report.broken_threads() == {"c"}


@pytest.mark.parametrize("backend_kind", LOCAL_S3)
def test_a_flipped_byte_in_a_ref_fails_its_checksum(store: CheckpointStore) -> None:
    build(store)
    key = thread_key("c")
    got = store.backend.read_ref(key)
    assert got is not None
    data = bytearray(got[0])
    data[len(data) // 2] ^= 0x01
    store.backend.write_ref(key, bytes(data), got[1])
    report = fresh(store).verify()
    assert [(p.kind, p.what, p.path) for p in report.problems] == [("corrupt", "ref", key)]
    assert report.broken_threads() == {"c"}


@pytest.mark.parametrize("backend_kind", NO_S3)
def test_a_ref_naming_a_checkpoint_outside_its_log_dangles(store: CheckpointStore) -> None:
    lay = build(store)
    head = head_of(store, "c")
    put_head(store, Head(head.thread_id, lay["a"][3], head.head_step, head.peaks, head.tail,
                         head.packs, head.inline, head.lineage))
    report = fresh(store).verify()
    assert [(p.kind, p.what) for p in report.problems] == [("dangling_ref", "ref")]
    assert report.broken_checkpoints() == {lay["a"][3]}


@pytest.mark.parametrize("backend_kind", NO_S3)
def test_a_log_entry_that_disagrees_with_its_record(store: CheckpointStore) -> None:
    lay = build(store)
    head = head_of(store, "c")
    last = head.tail[-1]
    wrong = LogEntry(last.id, last.parents, last.step, last.created_at, last.size, "forged",
                     last.tags, last.metadata)
    put_head(store, Head(head.thread_id, head.head, head.head_step, head.peaks,
                         (*head.tail[:-1], wrong), head.packs, head.inline, head.lineage))
    report = fresh(store).verify()
    assert [(p.kind, p.what) for p in report.problems] == [("mismatch", "record")]
    assert "label" in report.problems[0].detail
    assert report.broken_checkpoints() == {lay["c"][-1]}


@pytest.mark.parametrize("backend_kind", LOCAL_S3)
def test_a_hostile_pack_whose_object_is_not_what_its_prefix_says(store: CheckpointStore) -> None:
    """A pack with a valid name (the hash of its bytes) whose object bytes were swapped."""
    lay = build(store)
    oid, pid = node_with(store, "c", b"message 102")
    objs = {ObjectId(k): bytes(v) for k, v in decode_pack(store.backend.get(pack_key(pid))).items()}
    objs[ObjectId(oid)] = objs[ObjectId(oid)].replace(b"message 102", b"message 666")
    ref, data = make_pack(objs, 0)
    store.backend.put_many({pack_key(ref.id): data})
    head = head_of(store, "c")
    put_head(store, with_packs(head, [ref if p.id == pid else p for p in head.packs]))
    report = fresh(store).verify()
    assert [(p.kind, p.what, p.object) for p in report.problems] == [("corrupt", "node", oid)]
    assert report.broken_checkpoints() == {lay["c"][2]} and report.broken_threads() == {"c"}
    with pytest.raises(IntegrityError):
        fresh(store).load("c")


@pytest.mark.parametrize("backend_kind", NO_S3)
def test_a_node_missing_from_every_pack(store: CheckpointStore) -> None:
    lay = build(store)
    oid, pid = node_with(store, "c", b"message 101")
    objs = {ObjectId(k): bytes(v) for k, v in decode_pack(store.backend.get(pack_key(pid))).items()
            if k != oid}
    ref, data = make_pack(objs, 0)
    store.backend.put_many({pack_key(ref.id): data})
    head = head_of(store, "c")
    put_head(store, with_packs(head, [ref if p.id == pid else p for p in head.packs]))
    assert_broken(store, {lay["c"][1]}, {"c"}, {("missing", "node")})


@pytest.mark.parametrize("backend_kind", ["local"])
def test_a_folder_where_a_ref_belongs_is_reported(store: CheckpointStore) -> None:
    build(store)
    path = os.path.join(store.url, *thread_key("c").split("/"))
    os.rename(path, path + ".moved")
    os.mkdir(path)
    report = fresh(store).verify()
    assert [(p.kind, p.what) for p in report.problems] == [("unreadable", "ref")]
    assert report.broken_threads() == {"c"}


def _hostile_thread(store: CheckpointStore, nodes: dict[str, bytes], root: str) -> None:
    rec = Record("h", (), ObjectId(root), 0, 1.0, 10)
    data = rec.encode()
    cid = object_id(data)
    objs = {**nodes, cid: data}
    ref, pack = make_pack(objs, 0)  # type: ignore[arg-type]
    store.backend.put_many({pack_key(ref.id): pack})
    entry = rec.entry(cid)  # type: ignore[arg-type]
    put_head(store, Head("h", entry.id, 0, (), (entry,), (ref,), (), b"12345678"))


@pytest.mark.parametrize("backend_kind", NO_S3)
def test_a_tree_deeper_than_a_load_follows(store: CheckpointStore) -> None:
    b = tree._Builder(None)
    child = b.node(tree.VALUE, codec.encode(1))
    for _ in range(1100):
        child = b.node(tree.VALUE, b"\x91" + codec.encode_link(codec.Ref(0)), [child])
    _hostile_thread(store, dict(b.objects), child)
    report = fresh(store).verify()
    assert {(p.kind, p.what) for p in report.problems} == {("too_deep", "node")}
    assert report.broken_threads() == {"h"} and len(report.broken_checkpoints()) == 1
    with pytest.raises(CasError):
        fresh(store).load("h")


@pytest.mark.parametrize("backend_kind", NO_S3)
def test_a_tree_that_expands_into_gigabytes(store: CheckpointStore) -> None:
    b = tree._Builder(None)
    leaf = b.node(tree.VALUE, codec.encode("x" * 60_000))
    links = b"".join(codec.encode_link(codec.Ref(i)) for i in range(999))
    mid = b.node(tree.VALUE, b"\xdc\x03\xe7" + links, [leaf] * 999)
    top = b.node(tree.VALUE, b"\xdc\x03\xe7" + links, [mid] * 999)
    _hostile_thread(store, dict(b.objects), top)
    report = fresh(store).verify()
    assert {(p.kind, p.what) for p in report.problems} == {("too_big", "node")}
    with pytest.raises(CasError):
        fresh(store).load("h")


def test_a_bad_node_decoding_is_reported_against_its_checkpoint(tmp_path: Any) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    bad = encode_node(b"\x00", ())[:5] + b"\x09"  # names 9 children in a 1-byte node
    _hostile_thread(store, {object_id(bad): bad}, object_id(bad))
    report = store.verify()
    assert {(p.kind, p.what) for p in report.problems} == {("undecodable", "node")}
    assert len(report.broken_checkpoints()) == 1
    with pytest.raises(CasError):
        decode_node(bad)


# --- sample, progress and the CLI ----------------------------------------------------------------


def test_sample_hashes_about_that_fraction_of_the_packs(tmp_path: Any) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    store.refs.inline_max = 1
    for t in range(40):
        store.save(f"t{t}", state(t))
    full = store.verify(deep=True)
    seen = []
    for _ in range(3):
        report = store.verify(deep=True, sample=0.25)
        assert report.ok
        seen.append(report.objects_hashed)
        assert full.by_kind["pack"]["objects"] == report.by_kind["pack"]["objects"] == 40
        assert report.objects_hashed < full.objects_hashed
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
    store = CheckpointStore.open(path)
    lay = build(store)
    code, out, _ = _cli("verify", path, "--deep")
    assert code == 0 and "OK" in out
    code, out, _ = _cli("verify", path, "--json")
    assert code == 0 and json.loads(out)["ok"] is True and json.loads(out)["deep"] is False
    oid, pid = node_with(store, "c", b"message 100")
    damage_pack(store, pid, oid)
    code, out, _ = _cli("verify", path, "--thread", "c")
    assert code == 1 and lay["c"][0] in out and "corrupt" in out
    code, out, _ = _cli("verify", path, "--json")
    assert code == 1 and oid in [p["object"] for p in json.loads(out)["problems"]]
    assert _cli("verify", path, "--thread", "a")[0] == 0
    code, _, err = _cli("verify", str(tmp_path / "no-such-store"))
    assert code == 2 and "no-such-store" in err
    assert not os.path.exists(tmp_path / "no-such-store")
    (tmp_path / "afile").write_text("x")
    assert _cli("verify", str(tmp_path / "afile"))[0] == 2
    code, _, err = _cli("verify", path, "--deep", "--progress")
    assert code == 1 and "objects" in err
    proc = subprocess.run([sys.executable, "-m", "cas_checkpoint.cli", "verify", path],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and lay["c"][0] in proc.stdout


def test_cli_s3_endpoint(moto_server: dict[str, Any], monkeypatch: Any) -> None:
    url = f"s3://{moto_server['bucket']}/cli-{os.getpid()}"
    store = CheckpointStore.open(url, storage_options=moto_server["storage_options"])
    build(store)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    code, out, err = _cli("verify", url, "--endpoint-url", moto_server["endpoint"], "--deep")
    assert code == 0, err
    assert "OK" in out
    bad = "s3://no-such-bucket-x/p"
    assert _cli("verify", bad, "--endpoint-url", moto_server["endpoint"])[0] == 2
