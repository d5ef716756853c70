"""store.verify(): an intact store verifies clean; every kind of damage is found and names exactly
the threads and checkpoints it breaks; load refuses damaged data; the CLI's exit codes."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from typing import Any

import pytest

from cas_checkpoint import (
    CasError,
    CheckpointStore,
    FormatError,
    IntegrityError,
    NotFoundError,
)
from cas_checkpoint.cli import main
from cas_checkpoint.objects import Head, Record, encode_node, object_id
from cas_checkpoint.objstore import key_object_id, object_key
from cas_checkpoint.refs import thread_key

LOCAL_S3 = ["local", "s3"]  # damage on real storage; memory:// runs the rest
NO_S3 = ["memory", "local"]  # moto answers ~7 ms a request, one at a time: keep S3 runs few

# --- helpers -----------------------------------------------------------------------------------


def raw_get(store: CheckpointStore, key: str) -> bytes:
    return store.backend.get(key)


def raw_put(store: CheckpointStore, key: str, data: bytes) -> None:
    """Overwrite a key behind the store's back (objects are never overwritten otherwise)."""
    store.backend.delete_many([key])
    store.backend.put_many({key: data})
    oid = key_object_id(key)
    if oid is not None:
        store.objects.forget([oid])


def flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]


def threads_with(store: CheckpointStore, cid: str) -> set[str]:
    return {t for t in store.threads() if cid in {c.id for c in store.history(t)}}


def state(i: int) -> dict[str, Any]:
    """A small state: one root node, stored inside its record (no state node objects)."""
    return {"messages": [{"role": "user", "content": f"message {i}"}], "step": i}


def big(i: int) -> dict[str, Any]:
    """A root inside its record, over one stored node (the 2 KB document)."""
    return {"step": i, "doc": f"document {i} " * 200}


SHARED = {"shared": True, "note": "the same state in several checkpoints", "doc": "x" * 2000}


@dataclass
class Layout:
    a: list[str]  # checkpoint ids of thread "a", oldest first (20: one segment + 4 in the tail)
    b: list[str]  # thread "b": forked from a[7], then one save
    c: list[str]  # thread "c": independent, 3 saves of big(100 + i)
    shared_cps: set[str]  # the checkpoints whose state is SHARED


_BUILT: dict[str, tuple[Layout, dict[str, bytes]]] = {}


def build(store: CheckpointStore) -> Layout:
    """Three threads; built once per backend kind, then copied key by key (fast on S3)."""
    kind = type(store.backend).__name__
    if kind in _BUILT:
        lay, files = _BUILT[kind]
        store.backend.put_many(files)
        return lay
    a = [store.save("a", SHARED if 5 <= i <= 9 else state(i)).id for i in range(20)]
    store.fork("a", a[7], "b")
    b = [*a[:8], store.save("b", SHARED).id]
    c = [store.save("c", big(100 + i)).id for i in range(3)]
    lay = Layout(a, b, c, {*a[5:10], b[-1]})
    keys = [i.key for i in [*store.backend.list("objects"), *store.backend.list("refs")]]
    got = store.backend.get_many(keys)
    _BUILT[kind] = lay, {k: v for k, v in got.items() if v is not None}
    return lay


def record_of(store: CheckpointStore, cid: str) -> Record:
    return Record.decode(raw_get(store, object_key(cid)))


def node_of(store: CheckpointStore, cid: str) -> str:
    """The one stored state node under a checkpoint's inline root."""
    rec = record_of(store, cid)
    assert rec.root_node is not None and len(rec.children()) == 1
    return rec.children()[0]


def assert_broken(store: CheckpointStore, checkpoints: set[str], threads: set[str],
                  kinds: set[str], deep_only: bool = False) -> None:
    for deep in (True, False):
        report = store.verify(deep=deep)
        if deep_only and not deep:
            continue
        assert not report.ok, report.to_text()
        assert {p.kind for p in report.problems} == kinds, report.to_text()
        assert report.broken_checkpoints() == checkpoints, report.to_text()
        assert report.broken_threads() == threads, report.to_text()


# --- an intact store ---------------------------------------------------------------------------


def test_intact_store_verifies_clean_quick_and_deep(store: CheckpointStore) -> None:
    lay = build(store)
    listed = {i.key: i.size for i in store.backend.list("objects")}
    for deep in (False, True):
        report = store.verify(deep=deep)
        assert report.ok and report.problems == [], report.to_text()
        assert report.threads == 3
        assert report.checkpoints == len({*lay.a, *lay.b, *lay.c})
        assert report.objects == len(listed)  # nothing is garbage yet
        assert report.unreachable_objects == 0 and report.unreachable_bytes == 0
        assert "OK" in report.to_text()
        data = json.loads(report.to_json())
        assert data["ok"] is True and data["problems"] == []
        assert data["checkpoints"] == report.checkpoints and data["deep"] is deep
    # every root here is inside its record: no object holds a root node
    recs = [record_of(store, c) for c in {*lay.a, *lay.b, *lay.c}]
    assert all(r.root_node is not None for r in recs)
    assert not {object_key(r.root) for r in recs} & set(listed)
    deep = store.verify(deep=True)
    assert deep.by_kind["node"]["objects"] == 1 + len(lay.c)  # SHARED's doc, c's docs
    assert deep.objects_hashed == len(listed)
    assert deep.bytes_hashed == sum(listed.values())
    quick = store.verify(deep=False)
    assert quick.by_kind["node"]["hashed"] == 0
    assert quick.by_kind["record"]["hashed"] == report.checkpoints


@pytest.mark.parametrize("backend_kind", NO_S3)
def test_one_thread_only(store: CheckpointStore) -> None:
    lay = build(store)
    raw_put(store, object_key(lay.c[1]), flip(raw_get(store, object_key(lay.c[1])), 10))
    assert store.verify(thread_id="a").ok
    report = store.verify(thread_id="c")
    assert report.broken_checkpoints() == {lay.c[1]}
    assert report.unreachable_objects is None and report.threads == 1
    with pytest.raises(NotFoundError):
        store.verify(thread_id="nope")


@pytest.mark.parametrize("backend_kind", NO_S3)
def test_unreachable_objects_are_counted_not_problems(store: CheckpointStore) -> None:
    lay = build(store)
    garbage = {object_id(d): d for d in (encode_node(b"\xa1x"), encode_node(b"\xa2yy"))}
    store.objects.put_many(garbage)  # type: ignore[arg-type]
    report = store.verify()
    assert report.ok, report.to_text()
    assert report.unreachable_objects == 2
    assert report.unreachable_bytes == sum(len(d) for d in garbage.values())
    before = {i.key for i in store.backend.list("objects")}
    store.delete_thread("c")  # c's records and states become garbage
    report = store.verify()
    assert report.ok and report.checkpoints == len({*lay.a, *lay.b})
    assert report.unreachable_objects == len(before) - report.objects


# --- damage ------------------------------------------------------------------------------------


def test_flipped_byte_in_a_shared_node(store: CheckpointStore) -> None:
    lay = build(store)
    root = node_of(store, lay.a[6])
    assert all(node_of(store, c) == root for c in lay.shared_cps)
    data = raw_get(store, object_key(root))
    raw_put(store, object_key(root), flip(data, len(data) - 1))
    with pytest.raises(IntegrityError) as err:
        store.load("a", lay.a[6])
    assert err.value.path == object_key(root)
    assert store.load("a", lay.a[4]).state == state(4)  # the rest still loads
    report = store.verify(deep=True)
    assert [(p.kind, p.what, p.object, p.path) for p in report.problems] == [
        ("corrupt", "node", root, object_key(root))]
    assert report.broken_checkpoints() == lay.shared_cps and len(lay.shared_cps) == 6
    assert report.broken_threads() == {"a", "b"}
    assert store.verify(deep=False).ok  # quick proves structure, not content


@pytest.mark.parametrize("backend_kind", LOCAL_S3)
def test_flipped_byte_in_a_record(store: CheckpointStore) -> None:
    lay = build(store)
    cid = lay.a[3]
    data = raw_get(store, object_key(cid))
    assert record_of(store, cid).root_node is not None
    raw_put(store, object_key(cid), flip(data, len(data) - 20))  # in its inline root
    with pytest.raises(IntegrityError) as err:
        store.get(cid)
    assert err.value.path == object_key(cid)
    assert_broken(store, {cid}, threads_with(store, cid), {"corrupt"})
    assert threads_with(store, cid) == {"a", "b"}


@pytest.mark.parametrize("backend_kind", LOCAL_S3)
def test_flipped_byte_in_a_segment(store: CheckpointStore) -> None:
    lay = build(store)
    head = Head.decode(raw_get(store, thread_key("a")))
    assert len(head.peaks) == 1
    seg = head.peaks[0].id
    raw_put(store, object_key(seg), flip(raw_get(store, object_key(seg)), 30))
    with pytest.raises(IntegrityError) as err:
        store.history("a")
    assert err.value.path == object_key(seg)
    with pytest.raises(IntegrityError):
        store.load("a", lay.a[0])
    report = store.verify()
    assert [(p.kind, p.what, p.object) for p in report.problems] == [("corrupt", "segment", seg)]
    assert report.broken_threads() == {"a"} and report.broken_checkpoints() == set()
    assert store.verify(thread_id="b").ok


@pytest.mark.parametrize("backend_kind", NO_S3)
def test_damaged_segment_holding_the_head(store: CheckpointStore) -> None:
    ids = [store.save("x", state(i)).id for i in range(16)]  # the tail is now empty
    head = Head.decode(_fresh_ref(store, thread_key("x")))
    assert head.tail == () and len(head.peaks) == 1
    seg = head.peaks[0].id
    store.backend.delete_many([object_key(seg)])
    store.objects.forget([seg])
    assert store.load("x").id == ids[-1]
    with pytest.raises(NotFoundError):
        store.history("x")
    report = store.verify()
    assert [(p.kind, p.object) for p in report.problems] == [("missing", seg)], report.to_text()
    assert report.broken_threads() == {"x"} and report.broken_checkpoints() == set()
    assert report.checkpoints == 1  # the head's record was still checked


@pytest.mark.parametrize("backend_kind", LOCAL_S3)
def test_flipped_byte_in_a_head_id(store: CheckpointStore) -> None:
    lay = build(store)
    key = thread_key("c")
    data = raw_get(store, key)
    at = data.index(bytes.fromhex(lay.c[-1]))
    raw_put(store, key, flip(data, at))
    bogus = flip(data, at)[at:at + 32].hex()
    with pytest.raises(NotFoundError) as err:
        store.load("c")
    assert bogus in str(err.value)
    report = store.verify()
    assert [(p.kind, p.what, p.path) for p in report.problems] == [("dangling_ref", "ref", key)]
    assert report.broken_threads() == {"c"} and report.broken_checkpoints() == set()


@pytest.mark.parametrize("backend_kind", NO_S3)
def test_flipped_byte_in_a_head_header_and_a_log_entry(store: CheckpointStore) -> None:
    lay = build(store)
    key = thread_key("c")
    data = raw_get(store, key)
    raw_put(store, key, flip(data, 0))
    with pytest.raises(FormatError):
        store.load("c")
    report = store.verify()
    assert [(p.kind, p.path) for p in report.problems] == [("undecodable", key)]
    assert report.broken_threads() == {"c"}
    # a changed label in the thread's log: the log disagrees with the record
    raw_put(store, key, data)
    cid = store.save("c", state(7), label="AAAA").id
    raw = _fresh_ref(store, key)
    assert raw.count(b"AAAA") == 1
    raw_put(store, key, raw.replace(b"AAAA", b"AAAB"))
    assert store.history("c")[0].label == "AAAB"
    assert_broken(store, {cid}, {"c"}, {"mismatch"})
    assert lay.c[0] not in store.verify().broken_checkpoints()


def _fresh_ref(store: CheckpointStore, key: str) -> bytes:
    got = store.backend.read_ref(key)
    assert got is not None
    return got[0]


@pytest.mark.parametrize("backend_kind", LOCAL_S3)
def test_truncated_and_deleted_objects(store: CheckpointStore) -> None:
    lay = build(store)
    node = node_of(store, lay.c[0])
    raw_put(store, object_key(node), raw_get(store, object_key(node))[:-3])
    store.backend.delete_many([object_key(lay.c[2])])
    store.objects.forget([lay.c[2]])
    with pytest.raises(IntegrityError):
        store.load("c", lay.c[0])
    with pytest.raises(NotFoundError) as err:
        store.load("c")
    assert lay.c[2] in str(err.value)
    report = store.verify()
    assert {(p.kind, p.object) for p in report.problems} == {("corrupt", node),
                                                             ("missing", lay.c[2])}
    assert report.broken_checkpoints() == {lay.c[0], lay.c[2]}
    assert report.broken_threads() == {"c"}
    quick = store.verify(deep=False)
    assert {(p.kind, p.object) for p in quick.problems} == {("missing", lay.c[2])}


@pytest.mark.parametrize("backend_kind", LOCAL_S3)
def test_swapped_records(store: CheckpointStore) -> None:
    lay = build(store)
    one, two = object_key(lay.a[1]), object_key(lay.a[2])
    d1, d2 = raw_get(store, one), raw_get(store, two)
    raw_put(store, one, d2)
    raw_put(store, two, d1)
    for cid in lay.a[1:3]:
        with pytest.raises(IntegrityError):
            store.get(cid)
    assert_broken(store, {lay.a[1], lay.a[2]}, {"a", "b"}, {"corrupt"})


@pytest.mark.parametrize("backend_kind", LOCAL_S3)
def test_record_replaced_by_another_valid_record(store: CheckpointStore) -> None:
    lay = build(store)
    fake, other = record_of(store, lay.c[1]), record_of(store, lay.c[0])
    forged = Record(fake.thread_id, fake.parents, other.root, fake.step, fake.created_at,
                    fake.size, fake.label, fake.tags, fake.metadata, other.root_node).encode()
    raw_put(store, object_key(lay.c[1]), forged)  # a valid record, under the wrong name
    with pytest.raises(IntegrityError):
        store.load("c", lay.c[1])
    assert_broken(store, {lay.c[1]}, {"c"}, {"corrupt"})


@pytest.mark.parametrize("backend_kind", NO_S3)
def test_invalid_inline_root_is_reported_against_its_checkpoint(store: CheckpointStore) -> None:
    """A record that hashes right (so a writer made it) but holds an inline root that is not a
    state node (it names 5 children in 1 byte)."""
    lay = build(store)
    good = record_of(store, lay.c[2])
    node = b"CASN\x02\x05"
    bad = Record("c", (lay.c[2],), object_id(node), good.step + 1, 2.0, 10,  # type: ignore[arg-type]
                 root_node=node)
    data = bad.encode()
    cid = object_id(data)
    store.objects.put_many({cid: data})
    from cas_checkpoint.refs import append

    key = thread_key("c")
    head = Head.decode(_fresh_ref(store, key))
    raw_put(store, key, append(head, bad.entry(cid), {}).encode())  # type: ignore[arg-type]
    with pytest.raises(FormatError, match="state root stored inside the record"):
        store.load("c")
    assert store.load("c", lay.c[2]).state == big(102)
    for deep in (False, True):
        report = store.verify(deep=deep)
        assert [(p.kind, p.what, p.object, p.path) for p in report.problems] == [
            ("undecodable", "record", cid, object_key(cid))], report.to_text()
        assert "state root stored inside the record" in report.problems[0].detail
        assert report.broken_checkpoints() == {cid} and report.broken_threads() == {"c"}


@pytest.mark.parametrize("backend_kind", LOCAL_S3)
def test_ref_pointed_at_another_threads_checkpoint(store: CheckpointStore) -> None:
    lay = build(store)
    key = thread_key("c")
    head = Head.decode(raw_get(store, key))
    step = Record.decode(raw_get(store, object_key(lay.a[19]))).step
    tampered = Head("c", lay.a[19], step, head.peaks, head.tail)  # type: ignore[arg-type]
    raw_put(store, key, tampered.encode())
    report = store.verify(deep=False)
    assert [(p.kind, p.object, p.path) for p in report.problems] == [
        ("dangling_ref", lay.a[19], key)]
    assert report.broken_threads() == {"c"} and report.broken_checkpoints() == set()
    # a ref copied from another thread
    raw_put(store, key, raw_get(store, thread_key("b")))
    with pytest.raises(FormatError):
        store.load("c")
    report = store.verify()
    assert [(p.kind, p.path) for p in report.problems] == [("mismatch", key)]


@pytest.mark.parametrize("backend_kind", NO_S3)
def test_multi_level_node_tree_names_every_checkpoint_above_a_leaf(store: CheckpointStore) -> None:
    """Nodes written by hand (whatever tree.build does): a leaf under two interior nodes."""
    leaf = encode_node(b"\xa4leaf")
    lid = object_id(leaf)
    inner = [encode_node(b"\x91\xd4\x01" + bytes([i]), (lid,)) for i in range(2)]
    store.objects.put_many({object_id(d): d for d in [leaf, *inner]})  # type: ignore[misc]
    cps = []
    for data in inner:
        rec = Record("t", (), object_id(data), 0, 1.0, 10).encode()  # type: ignore[arg-type]
        cid = object_id(rec)
        store.objects.put_many({cid: rec})
        cps.append(cid)
    from cas_checkpoint.refs import build as build_log

    for n, cid in enumerate(cps):
        entry = Record.decode(raw_get(store, object_key(cid))).entry(cid)  # type: ignore[arg-type]
        head = build_log(f"t{n}", [entry], cid, {})  # type: ignore[arg-type]
        store.backend.write_ref(thread_key(f"t{n}"), head.encode(), None)
    report = store.verify()
    assert report.ok and report.by_kind["node"]["objects"] == 3, report.to_text()
    raw_put(store, object_key(lid), leaf + b"!")
    report = store.verify()
    assert [(p.kind, p.object) for p in report.problems] == [("corrupt", lid)]
    assert report.broken_checkpoints() == set(cps) and report.broken_threads() == {"t0", "t1"}
    store.backend.delete_many([object_key(lid)])
    report = store.verify(deep=False)
    assert [(p.kind, p.object) for p in report.problems] == [("missing", lid)]
    assert report.broken_checkpoints() == set(cps)


# --- sampling ----------------------------------------------------------------------------------


def test_sample_checks_about_that_fraction(tmp_path: Any) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    ids = [store.save("s", big(i)).id for i in range(60)]
    roots = [node_of(store, c) for c in ids]
    for r in roots:  # damage every state's stored node in its payload (header intact)
        data = raw_get(store, object_key(r))
        raw_put(store, object_key(r), flip(data, len(data) - 1))
    assert store.verify(deep=False).ok  # quick does not re-hash nodes
    full = store.verify(deep=True)
    assert full.broken_checkpoints() == set(ids)
    found = []
    for _ in range(3):
        report = store.verify(deep=True, sample=0.25)
        hashed = report.by_kind["node"]["hashed"]
        assert report.by_kind["node"]["objects"] == 60
        assert 3 <= hashed <= 30, hashed  # mean 15, sd 3.4
        assert len(report.problems) == hashed  # every node sampled is found damaged
        found.append(frozenset(report.broken_checkpoints()))
    assert len(set(found)) > 1  # a different random sample each run
    for bad in ({"sample": 1.5}, {"sample": 0}, {"sample": 0.5, "deep": False}):
        with pytest.raises(CasError):
            store.verify(**bad)  # type: ignore[arg-type]


# --- progress and the CLI ----------------------------------------------------------------------


@pytest.mark.parametrize("backend_kind", NO_S3)
def test_progress_is_reported(store: CheckpointStore) -> None:
    build(store)
    calls: list[tuple[int, int]] = []
    store.verify(progress=lambda done, total: calls.append((done, total)))
    assert calls and calls[-1][0] == calls[-1][1] > 0
    assert all(d <= t for d, t in calls)


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
    raw_put(store, object_key(lay.c[0]), b"junk")
    code, out, _ = _cli("verify", path, "--thread", "c")
    assert code == 1 and lay.c[0] in out and "corrupt" in out
    code, out, _ = _cli("verify", path, "--json", "--sample", "0.5", "--deep")
    assert code == 1 and [p["object"] for p in json.loads(out)["problems"]] == [lay.c[0]]
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
    assert proc.returncode == 1 and lay.c[0] in proc.stdout


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


def test_nan_metadata_is_not_a_mismatch() -> None:
    store = CheckpointStore.open(f"memory://nan-{os.getpid()}-{id(object())}")
    store.save("t", {"a": 1}, metadata={"score": float("nan")})
    report = store.verify()
    assert report.ok and report.checkpoints == 1, report.to_text()
