"""Each case an adversarial review found (issue 12), as a test that failed on the old code.

Deep nesting and hostile trees (items 1 and 6) are in test_tree.py, run in subprocesses."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from _faultproxy import FaultProxy
from builders import options

from cas_checkpoint import (
    CheckpointStore,
    FormatError,
    IntegrityError,
    InvalidArgumentError,
    StorageError,
    UnsafeStorageError,
)
from cas_checkpoint.backends import local as backend_mod
from cas_checkpoint.engine.refs import thread_key
from cas_checkpoint.format.heads import Head
from cas_checkpoint.format.objects import LogEntry


def _big(n: int, salt: str = "") -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": f"{salt}message {i} " + "x" * 300}
                         for i in range(n)]}


def _pack_files(root: str) -> list[str]:
    out = []
    for folder, _dirs, files in os.walk(os.path.join(root, "packs")):
        out += [os.path.join(folder, f) for f in files if ".tmp-" not in f]
    return out


# --- 2. a listing error is never "no refs" ------------------------------------------------------


def test_an_unreadable_refs_folder_stops_gc_and_threads(tmp_path: Any,
                                                        monkeypatch: Any) -> None:
    root = str(tmp_path / "s")
    store = CheckpointStore.open(root)
    store.save("a", _big(40))
    packs = _pack_files(root)
    assert packs
    real = os.scandir
    heads = os.path.join(root, "refs", "heads")

    def scandir(path: Any = ".") -> Any:
        if os.fspath(path) == heads:
            raise OSError(errno.EIO, "Input/output error", heads)
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(StorageError, match="cannot list"):
        store.threads()
    with pytest.raises(StorageError, match="cannot list"):
        store.gc(grace=timedelta(0))
    monkeypatch.undo()
    assert _pack_files(root) == packs  # nothing was deleted
    assert CheckpointStore.open(root).load("a").state == _big(40)


@pytest.mark.parametrize("kind", ["dir", "symlink"])
def test_a_folder_where_a_ref_belongs_makes_gc_refuse(tmp_path: Any, kind: str) -> None:
    root = str(tmp_path / "s")
    store = CheckpointStore.open(root)
    store.save("a", _big(40))
    store.save("b", _big(41))
    path = os.path.join(root, *thread_key("b").split("/"))
    os.rename(path, path + ".moved")
    if kind == "dir":
        os.mkdir(path)
    else:
        os.mkdir(str(tmp_path / "elsewhere"))
        os.symlink(str(tmp_path / "elsewhere"), path)
    packs = _pack_files(root)
    fresh = CheckpointStore.open(root)
    assert fresh.threads() == ["a"]  # the healthy thread is still listed
    with pytest.raises(StorageError, match="not refs gc can read"):
        fresh.gc(grace=timedelta(0))
    assert _pack_files(root) == packs


# --- 3. every condition the store relies on is probed ----------------------------------------


@pytest.mark.parametrize("strip", [("PUT", "if-none-match"), ("PUT", "if-match"),
                                   ("DELETE", "if-match")])
def test_an_endpoint_that_ignores_one_condition_is_refused(moto_server: dict[str, Any],
                                                           strip: tuple[str, str]) -> None:
    proxy = FaultProxy(moto_server["endpoint"], strip_only=(strip,))
    try:
        opts = dict(moto_server["storage_options"])
        opts["client_kwargs"] = dict(opts["client_kwargs"], endpoint_url=proxy.endpoint)
        store = CheckpointStore.open(f"s3://{moto_server['bucket']}/strip-{strip[0]}-{strip[1]}",
                                     storage_options=opts)
        with pytest.raises(UnsafeStorageError, match=strip[1].replace("if-", "If-")
                           .replace("none-match", "None-Match").replace("match", "Match")):
            store.save("t", {"a": 1})
        assert store.threads() == []  # refused before anything was written
    finally:
        proxy.close()


# --- 4. the lock wait is bounded, and a long wait refreshes the save's packs -------------------


_HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.pwrite(fd, b"pid holder-%d" % os.getpid(), 0)
print("locked", flush=True)
if sys.argv[2] == "stdin":
    sys.stdin.readline()  # held until the test says so
else:
    time.sleep(float(sys.argv[2]))
"""


def _hold_lock(path: str, seconds: float | None) -> subprocess.Popen[str]:
    """A process that holds ``path``'s lock for ``seconds``, or (None) until a line on its stdin."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, path,
                             "stdin" if seconds is None else str(seconds)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def test_a_stalled_lock_holder_gives_a_storage_error_naming_the_lock(
        tmp_path: Any, monkeypatch: Any) -> None:
    root = str(tmp_path / "s")
    store = CheckpointStore.open(root)
    store.save("t", {"a": 1})
    lock = os.path.join(root, *thread_key("t").split("/")) + ".lock"
    monkeypatch.setattr(backend_mod, "LOCK_WAIT", 1.0)
    holder = _hold_lock(lock, 30)
    try:
        started = time.monotonic()
        with pytest.raises(StorageError, match=r"lock .*\.lock.*holder-"):
            store.save("t", {"a": 2})
        assert time.monotonic() - started < 10
    finally:
        holder.kill()
        holder.wait()
    assert store.save("t", {"a": 3}).step == 1  # the kernel released the dead holder's lock


def test_a_save_that_waited_for_the_lock_survives_a_gc_meanwhile(tmp_path: Any) -> None:
    root = str(tmp_path / "s")
    store = CheckpointStore.open(root)
    store.save("t", {"a": 1})
    before = set(_pack_files(root))
    lock = os.path.join(root, *thread_key("t").split("/")) + ".lock"
    holder = _hold_lock(lock, None)  # held until the gc below has run: no race with the clock
    state = _big(300)  # too big for the ref: one pack, written before the lock wait
    done: dict[str, Any] = {}

    def save() -> None:
        done["info"] = store.save("t", state)

    saver = threading.Thread(target=save)
    saver.start()
    try:
        deadline = time.monotonic() + 60
        while not (new := set(_pack_files(root)) - before):  # the save's pack is written ...
            assert time.monotonic() < deadline, "the save wrote no pack"
            time.sleep(0.02)
        grace = 0.5
        (pack,) = new
        while time.time() - os.stat(pack).st_mtime < grace + 0.2:  # ... and older than the grace
            time.sleep(0.05)
        assert saver.is_alive() and "info" not in done  # still waiting for the lock
        report = CheckpointStore.open(root).gc(grace=timedelta(seconds=grace))
        assert report.deleted_objects >= 1  # it took the waiting save's pack
        assert not os.path.exists(pack)
    finally:
        assert holder.stdin is not None
        holder.stdin.write("go\n")
        holder.stdin.close()
        holder.wait()
        saver.join()
    assert "info" in done  # the save waited longer than REFRESH_WAIT, so it put its pack again
    assert CheckpointStore.open(root).load("t").state == state  # rewritten after the wait


# --- 5. a damaged copy is never reused ---------------------------------------------------------


def test_a_truncated_pack_is_rewritten_not_reused(tmp_path: Any) -> None:
    root = str(tmp_path / "s")
    store = CheckpointStore.open(root)
    store.save("t", _big(300))
    (path,) = _pack_files(root)
    data = open(path, "rb").read()
    with open(path, "r+b") as f:
        f.truncate(len(data) // 2)
    key = os.path.relpath(path, root).replace(os.sep, "/")
    store.backend.put_many({key: data})  # what a save that reuses this pack does
    assert open(path, "rb").read() == data
    assert CheckpointStore.open(root).load("t").state == _big(300)


# --- 7. refs carry a checksum and a size bound ------------------------------------------------


def test_a_flipped_byte_in_a_ref_is_an_integrity_error(store: CheckpointStore) -> None:
    store.save("t", {"a": 1}, label="before")
    key = thread_key("t")
    got = store.backend.read_ref(key)
    assert got is not None
    data = bytearray(got[0])
    pos = data.index(b"before")
    data[pos] ^= 0x20  # "Before": a wrong label, not a decoding error
    store.backend.write_ref(key, bytes(data), got[1])
    fresh = CheckpointStore.open(store.url, storage_options=options(store))
    with pytest.raises(IntegrityError):
        fresh.history("t")


def test_a_huge_ref_is_refused_by_its_size(tmp_path: Any) -> None:
    root = str(tmp_path / "s")
    store = CheckpointStore.open(root)
    store.save("t", {"a": 1})
    path = os.path.join(root, *thread_key("t").split("/"))
    with open(path, "r+b") as f:
        f.truncate(1 << 30)  # a 1 GB sparse file
    started = time.monotonic()
    with pytest.raises(FormatError, match="larger than any valid ref"):
        CheckpointStore.open(root).load("t")
    assert time.monotonic() - started < 5  # refused by its size, not read


# --- 8. everything raised is a CasError ---------------------------------------------------------


@pytest.mark.parametrize("created", [float("inf"), float("nan"), 1e20, -5.0])
def test_a_bad_time_in_a_ref_is_a_format_error(store: CheckpointStore, created: float) -> None:
    store.save("t", {"a": 1})
    entry = LogEntry("ab" * 32, (), 0, created, 10)  # type: ignore[arg-type]
    head = Head("t", entry.id, 0, (), (entry,))
    key = thread_key("t")
    got = store.backend.read_ref(key)
    assert got is not None
    store.backend.write_ref(key, head.encode(), got[1])
    fresh = CheckpointStore.open(store.url, storage_options=options(store))
    with pytest.raises(FormatError, match="created_at"):
        fresh.history("t")


def test_a_head_step_at_the_limit_is_a_format_error(store: CheckpointStore) -> None:
    store.save("t", {"a": 1})
    key = thread_key("t")
    got = store.backend.read_ref(key)
    assert got is not None
    head = Head.decode(got[0])
    big = Head(head.thread_id, head.head, 2**64 - 1, head.peaks, head.tail, head.packs,
               head.inline, head.lineage)
    store.backend.write_ref(key, big.encode(), got[1])
    fresh = CheckpointStore.open(store.url, storage_options=options(store))
    with pytest.raises(FormatError, match="head step"):
        fresh.save("t", {"a": 2})


def test_a_lone_surrogate_thread_id_is_refused_before_writing(store: CheckpointStore) -> None:
    with pytest.raises(InvalidArgumentError, match="not valid Unicode"):
        store.save("\udcff", _big(300))
    assert store.threads() == [] and store.storage_bytes() == 0


# --- 9. gc runs on a full disk ------------------------------------------------------------------


def test_gc_frees_space_when_it_cannot_write_its_clock_probe(tmp_path: Any,
                                                             monkeypatch: Any) -> None:
    root = str(tmp_path / "s")
    store = CheckpointStore.open(root)
    first = store.save("t", _big(300))
    store.save("t", _big(300, "b"))
    store.save("t", _big(300, "c"))
    store.rewind("t", first.id)
    assert store.repack("t").threads[0].repacked  # the later checkpoints' packs: garbage
    time.sleep(0.05)
    real = store.backend.put_many

    def full(items: dict[str, bytes]) -> None:
        if any(k.startswith("gc/") for k in items):
            raise StorageError(f"cannot write objects in {root}: [Errno 28] No space left on "
                               "device")
        real(items)

    monkeypatch.setattr(store.backend, "put_many", full)
    before = store.storage_bytes()
    report = store.gc(grace=timedelta(0))
    assert report.deleted_objects >= 1 and store.storage_bytes() < before
    assert store.load("t").state == _big(300)


# --- 10. deletes that fail are not reported; no write leaves the root --------------------------


def test_s3_keys_that_deleteobjects_refused_are_not_reported_deleted(
        moto_server: dict[str, Any], monkeypatch: Any) -> None:
    store = CheckpointStore.open(f"s3://{moto_server['bucket']}/refuse-{os.getpid()}",
                                 storage_options=moto_server["storage_options"])
    first = store.save("t", _big(300))
    store.save("t", _big(300, "b"))
    store.rewind("t", first.id)
    assert store.repack("t").threads[0].repacked
    fs = store.backend.fs  # type: ignore[attr-defined]
    real = fs._call_s3

    async def call(method: str, *args: Any, **kw: Any) -> Any:
        if method != "delete_objects":
            return await real(method, *args, **kw)
        keys = [o["Key"] for o in kw["Delete"]["Objects"]]
        kw["Delete"]["Objects"] = []
        return {"Errors": [{"Key": k, "Code": "AccessDenied", "Message": "denied"}
                           for k in keys]}

    monkeypatch.setattr(fs, "_call_s3", call)
    time.sleep(2.2)  # S3 modified times have a 1-second resolution
    report = store.gc(grace=timedelta(seconds=1))
    assert report.deleted_objects == 0 and report.refreshed_objects >= 1


def test_a_link_out_of_the_root_is_never_written_through(tmp_path: Any) -> None:
    root = str(tmp_path / "s")
    outside = str(tmp_path / "outside")
    os.makedirs(outside)
    store = CheckpointStore.open(root)
    state = _big(300)
    built = __import__("cas_checkpoint.tree.build").tree.build.build(state)
    assert built.objects
    os.makedirs(os.path.join(root, "packs"), exist_ok=True)
    for i in range(256):  # every pack folder a link out
        os.symlink(outside, os.path.join(root, "packs", f"{i:02x}"))
    with pytest.raises(StorageError, match="leads out of the store"):
        store.save("t", state)
    assert os.listdir(outside) == []
