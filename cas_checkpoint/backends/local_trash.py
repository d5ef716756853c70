"""gc's deletes in a local directory, safe against a writer that refreshes an object: each
candidate is renamed into a trash folder, then its modified time is looked at; and the temp
files dead writers left. Rule: an object is deleted only if, once out of writers' reach, its
modified time is still older than the cutoff; anything else goes back."""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from cas_checkpoint.backends.base import ObjectInfo
from cas_checkpoint.errors import StorageError

TRASH_STALE = 600.0  # seconds: a trash folder this old was left by a gc that died
PACKS = "packs"  # the folder of objects (the one gc deletes from)


class LocalDirectory(Protocol):
    """What these steps need of a ``local.LocalBackend``."""

    root: str

    def stale_temps(self, before: float) -> list[tuple[str, int]]: ...

    def _fsync_dir(self, folder: str) -> None: ...


def _path(backend: LocalDirectory, key: str) -> str:
    return os.path.join(backend.root, *key.split("/"))


def _housekeeping(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A local housekeeping step (its first argument the backend) whose OSError becomes a
    StorageError saying what was wrong and what to do."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run_it(backend: LocalDirectory, *args: Any) -> Any:
            try:
                return fn(backend, *args)
            except OSError as exc:
                raise housekeeping_error(backend, what, exc) from exc
        return run_it
    return wrap


def housekeeping_error(backend: LocalDirectory, what: str, exc: OSError) -> StorageError:
    gc_dir = os.path.join(backend.root, "gc")
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        todo = ("this process has run out of file descriptors: raise its limit (`ulimit -n`) "
                "or let it close files")
    elif exc.errno in (errno.ENOTDIR, errno.EEXIST) and not os.path.isdir(gc_dir):
        todo = (f"{gc_dir} must be a folder (gc keeps its clock probe and trash there) and is "
                "not: move it away")
    elif exc.errno in (errno.ENOSPC, errno.EDQUOT):
        todo = "the disk is full: free some space"
    else:
        todo = f"check the permissions of {backend.root}"
    return StorageError(f"gc could not {what} ({exc.strerror or exc}: {exc.filename or gc_dir}); "
                        f"{todo}, then run gc again (objects it moved aside are put back by the "
                        "next run)")


@_housekeeping("delete writers' stale temp files")
def delete_stale_temps(backend: LocalDirectory, cutoff: float, dry_run: bool) -> int:
    """Delete temp files older than the grace: no live writer holds one that long. Returns how
    many there were."""
    stale = backend.stale_temps(cutoff)
    for path, _size in [] if dry_run else stale:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return len(stale)


def _object_name(name: str) -> bool:
    return len(name) == 64 and all(c in "0123456789abcdef" for c in name)


@_housekeeping("put back what an earlier gc left in its trash")
def restore_trash(backend: LocalDirectory) -> None:
    """Put back what a gc that died mid-sweep left in its trash (putting garbage back is always
    safe; the next gc deletes it again)."""
    gc_dir = os.path.join(backend.root, "gc")
    try:
        names = os.listdir(gc_dir)
    except FileNotFoundError:
        return
    for name in names:
        folder = os.path.join(gc_dir, name)
        try:
            if not name.startswith("trash-") or time.time() - os.stat(folder).st_mtime < \
                    TRASH_STALE:
                continue
            for f in os.listdir(folder):
                src = os.path.join(folder, f)
                if _object_name(f):
                    try:
                        os.link(src, _path(backend, f"{PACKS}/{f[:2]}/{f[2:]}"))
                    except FileExistsError:
                        pass
                os.unlink(src)
            os.rmdir(folder)
        except FileNotFoundError:
            continue


def delete_unless_touched(backend: LocalDirectory, infos: list[ObjectInfo],
                          cutoff: float) -> list[bool]:
    """Rename each of ``infos`` into a trash folder, then look at its modified time: a writer
    that refreshed it before the rename moved it, so it goes back; a writer that comes after
    the rename finds no file to refresh and writes the object again. True for each deleted."""
    trash = os.path.join(backend.root, "gc", f"trash-{os.getpid()}-{secrets.token_hex(4)}")
    _make_trash(backend, trash)
    try:
        gone = _trash_batch(backend, trash, infos, cutoff)
    except OSError as exc:
        raise housekeeping_error(backend, "remove objects", exc) from exc
    _drop_trash(backend, trash)
    return gone


@_housekeeping("make its trash folder")
def _make_trash(backend: LocalDirectory, trash: str) -> None:
    os.makedirs(trash)


@_housekeeping("remove its trash folder")
def _drop_trash(backend: LocalDirectory, trash: str) -> None:
    os.rmdir(trash)


def _trash_batch(backend: LocalDirectory, trash: str, batch: list[ObjectInfo],
                 cutoff: float) -> list[bool]:
    """The rename, check and unlink of each of ``batch`` (True: deleted), on a small thread
    pool."""

    def one(info: ObjectInfo) -> bool:
        src = _path(backend, info.key)
        dst = os.path.join(trash, info.key.split("/", 1)[1].replace("/", ""))
        try:
            os.rename(src, dst)
        except FileNotFoundError:
            return False  # gone already (another gc)
        if os.stat(dst).st_mtime >= cutoff:  # refreshed between the listing and the rename
            try:
                os.link(dst, src)
                backend._fsync_dir(os.path.dirname(src))
            except FileExistsError:
                pass  # a writer wrote it again meanwhile
            os.unlink(dst)
            return False
        os.unlink(dst)
        return True

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, batch))
