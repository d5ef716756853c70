"""The file-system calls one local commit makes (``backends/local.py``, ``local_folders.py``):
a steady ref update, a new pack, a new store object's pack folders. Counted by wrapping the
``os`` functions (``os.path`` and ``os.makedirs`` call them through the module too), never
timed: each call is a trip into the kernel and a release of the GIL that the event loop's
thread may take meanwhile (issue 29: the local-disk turn's CPU over memory://)."""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from cas_checkpoint import CheckpointStore
from cas_checkpoint.backends import local
from cas_checkpoint.backends.local import LocalBackend
from cas_checkpoint.engine.pack_folders import PACK_FOLDERS

CALLS = ("open", "close", "stat", "lstat", "fstat", "read", "write", "pread", "pwrite",
         "fsync", "fdatasync", "link", "unlink", "replace", "rename", "mkdir", "utime",
         "getpid", "urandom")


class Calls:
    """``os`` calls made on this thread while ``counting``."""

    def __init__(self, mp: pytest.MonkeyPatch) -> None:
        self.n: Counter[str] = Counter()
        self.on = False
        me = threading.get_ident()
        for name in CALLS:
            real = getattr(os, name)

            def wrapped(*a: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
                if self.on and threading.get_ident() == me:
                    self.n[_name] += 1
                return _real(*a, **kw)
            mp.setattr(os, name, wrapped)
        mp.setattr(local, "_datasync", os.fdatasync)  # (bound at import)

    @contextmanager
    def counting(self) -> Iterator[Counter[str]]:
        self.n.clear()
        self.on = True
        try:
            yield self.n
        finally:
            self.on = False


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    return Calls(monkeypatch)


def test_a_steady_ref_update_is_thirteen_calls(tmp_path: Path, calls: Calls) -> None:
    """Into the free slot of a ref file this object wrote: the lock (open, flock, fstat and
    stat: is the file held the one at its name), the ref (open, fstat, pread), the slot, its
    predecessor's mark, one ``fdatasync``, the retire, two closes; flock is not an ``os`` call
    (counted apart by the kernel). The lock is compared with its name, not by ``st_nlink``
    (NFS renames a removed file that is held open), so this is the floor of the protocol."""
    backend = LocalBackend(str(tmp_path / "s"))
    version = backend.write_ref("refs/heads/t", b"h" * 20_000, None)
    version = backend.write_ref("refs/heads/t", b"i" * 20_000, version)
    for n in range(3):
        with calls.counting() as got:
            version = backend.write_ref("refs/heads/t", bytes([n]) * 20_000, version)
        assert dict(got) == {"open": 2, "fstat": 2, "stat": 1, "pread": 1, "pwrite": 3,
                             "fdatasync": 1, "close": 2}
    assert backend.read_ref("refs/heads/t") == (bytes([2]) * 20_000, version)


def test_a_new_pack_is_ten_calls_and_leaves_no_temp_file(tmp_path: Path, calls: Calls) -> None:
    """A pack not written before: is it there (stat), the temp file (open, write, fsync,
    close), its name (link), the temp name gone (unlink), the folder's flush (open, fsync,
    close). No ``stat`` of the temp file before its unlink, no ``getpid`` or random bytes for
    its name (were 3 a pack)."""
    backend = LocalBackend(str(tmp_path / "s"))
    backend.put_many({"packs/ab/first": b"x" * 100})  # (the folder made and flushed)
    for n in range(3):
        with calls.counting() as got:
            backend.put_many({f"packs/ab/{n}": b"p" * 3000})
        assert dict(got) == {"stat": 1, "open": 2, "write": 1, "fsync": 2, "close": 2,
                             "link": 1, "unlink": 1}
    assert sorted(os.listdir(tmp_path / "s" / "packs" / "ab")) == ["0", "1", "2", "first"]
    with calls.counting() as got:  # an object there already: refreshed, not written
        backend.put_many({"packs/ab/0": b"p" * 3000})
    assert dict(got) == {"stat": 1, "utime": 1, "open": 1, "fsync": 1, "close": 1}


def test_temp_names_differ_within_a_process_and_in_a_forked_child(tmp_path: Path) -> None:
    backend = LocalBackend(str(tmp_path / "s"))
    path = str(tmp_path / "s" / "f")
    first, second = backend._write_tmp(path, b"a"), backend._write_tmp(path, b"b")
    assert first != second and ".tmp-" in first
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(write, backend._write_tmp(path, b"c").encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 4096).decode()
    os.close(read)
    assert child.split(".tmp-")[1].split("-")[:2] != first.split(".tmp-")[1].split("-")[:2]
    assert os.path.exists(child)


def test_pack_folders_are_made_with_one_mkdir_each(tmp_path: Path, calls: Calls) -> None:
    """A new store object's 256 pack folders: one ``mkdir`` each, one flush of their parent
    and one of the root (for ``packs/``'s own name); one ``realpath`` (an ``lstat`` per level
    of the path), of ``packs/``, made by another store object as a saver's store finds it,
    not one of each folder (~1,800 calls a store object, were)."""
    root = tmp_path / "s"
    CheckpointStore.open(str(root)).save("t", {"a": 1})
    os.makedirs(root / "packs", exist_ok=True)
    backend = LocalBackend(str(root))
    with calls.counting() as got:
        backend.prepare_folders(PACK_FOLDERS)
    levels = len(str(root / "packs").split(os.sep))
    assert got["mkdir"] == 256 and got["lstat"] + got["stat"] <= levels + 1, dict(got)
    assert got["fsync"] == 2  # (``packs/``: every name in it at once; the root: its name)
    assert all((root / f).is_dir() for f in PACK_FOLDERS)


def test_a_pack_folder_that_is_a_link_out_of_the_store_is_still_refused(
        tmp_path: Path) -> None:
    root, outside = tmp_path / "s", tmp_path / "elsewhere"
    outside.mkdir()
    backend = LocalBackend(str(root))
    backend.prepare_folders(["packs"])
    os.symlink(outside, root / "packs" / "ab")
    with pytest.raises(Exception, match="leads out of the store") as err:
        backend.put_many({"packs/ab/x": b"x"})
    assert type(err.value).__name__ == "StorageError"
    assert os.listdir(outside) == []


def test_a_packs_folder_that_is_a_link_out_of_the_store_is_still_refused(
        tmp_path: Path) -> None:
    root, outside = tmp_path / "s", tmp_path / "elsewhere"
    outside.mkdir()
    backend = LocalBackend(str(root))
    os.symlink(outside, root / "packs")
    with pytest.raises(Exception, match="leads out of the store") as err:
        backend.put_many({"packs/ab/x": b"x"})
    assert type(err.value).__name__ == "StorageError"
    assert not (outside / "ab" / "x").exists()
