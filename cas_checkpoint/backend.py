"""The few storage primitives cas_checkpoint needs, over fsspec filesystems.

Keys are ``/``-separated paths relative to the store's root. Two families of keys:

* immutable objects (``objects/ab/cdef...``): ``get``, ``get_many``, ``put_many`` (create if
  absent; an existing object is left as it is, since its content is the same by construction);
* mutable refs (``refs/...``): ``read_ref`` returns the bytes together with a version token and
  ``write_ref``/``delete_ref`` succeed only if the ref still has the expected version
  (compare-and-swap). A ``RefMismatch`` tells the caller to re-read and try again.

Implementations: ``LocalBackend`` (plain ``os`` calls: temp file + fsync + ``os.link`` or
``os.replace``, and an ``flock`` per ref, which the kernel releases when a holder dies),
``MemoryBackend`` (fsspec's process-wide ``memory://``), and ``S3Backend`` in ``backend_s3.py``
(conditional PUTs).
"""

from __future__ import annotations

import builtins
import os
import secrets
import stat
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import blake3

from .errors import FormatError, InvalidArgumentError, NotFoundError, StorageError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


class RefMismatch(Exception):
    """Internal: a compare-and-swap found another version than expected."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    mtime: float  # seconds since the epoch, by the storage's own clock
    regular: bool = True  # False: a folder, a link or a device where a file should be


MAX_REF_BYTES = 4 << 20  # a ref larger than this is refused before it is read
LOCK_WAIT = 10.0  # seconds a local ref update waits for another writer's lock, at most
REFRESH_WAIT = 0.5  # a ref update that waited longer than this for its lock refreshes its packs


class Backend(ABC):
    """Storage primitives. Every method is safe to call from several threads."""

    url: str
    concurrency: int = 16

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The bytes of ``key``; NotFoundError if it does not exist."""

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        """Read several keys concurrently; a missing key maps to None."""
        keys = list(dict.fromkeys(keys))

        def one(key: str) -> bytes | None:
            try:
                return self.get(key)
            except NotFoundError:
                return None

        if len(keys) <= 1:
            return {k: one(k) for k in keys}
        with ThreadPoolExecutor(min(self.concurrency, len(keys))) as pool:
            return dict(zip(keys, pool.map(one, keys), strict=True))

    @abstractmethod
    def put_many(self, items: dict[str, bytes]) -> None:
        """Create each key that does not exist yet, completely or not at all."""

    @abstractmethod
    def read_ref(self, key: str) -> tuple[bytes, str] | None:
        """(bytes, version) of a ref, or None if it does not exist."""

    @abstractmethod
    def write_ref(self, key: str, data: bytes, expected: str | None,
                  refresh: Callable[[], None] | None = None) -> str:
        """Replace the ref if its version is ``expected`` (None: create it only if absent).
        Returns the new version; raises RefMismatch otherwise. ``refresh`` is called before the
        write when the update had to wait long for another writer (it re-puts the objects the
        new ref names, so a gc that ran meanwhile cannot have taken them)."""

    @abstractmethod
    def delete_ref(self, key: str, expected: str) -> None:
        """Delete the ref if its version is ``expected``; RefMismatch otherwise."""

    @abstractmethod
    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every key under ``prefix`` (a folder), with size and modified time."""

    @abstractmethod
    def delete_many(self, keys: Iterable[str]) -> builtins.list[str]:
        """Delete keys; missing keys are ignored. Returns the keys the storage refused to
        delete (they are still there)."""

    def list_many(self, prefixes: Iterable[str]) -> Iterable[ObjectInfo]:
        """Every key under each of ``prefixes`` (folders), listed concurrently (used by gc to
        list ``objects/00`` .. ``objects/ff`` at once)."""
        prefixes = list(prefixes)
        if len(prefixes) <= 1:
            return [i for p in prefixes for i in self.list(p)]
        with ThreadPoolExecutor(min(self.concurrency, len(prefixes))) as pool:
            return [i for part in pool.map(self.list, prefixes) for i in part]


def _version(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()


# --- local directory ---------------------------------------------------------------------------


class LocalBackend(Backend):
    """A local directory. Atomic by construction: readers see old or new bytes, never a part."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.url = self.root
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as exc:
            raise StorageError(
                f"cannot create the store directory {self.root}: {exc.strerror}; check the path "
                "and its permissions"
            ) from exc
        if not os.path.isdir(self.root):
            raise StorageError(f"{self.root} exists and is not a directory; choose another path")
        self._real = os.path.realpath(self.root)
        self._dirs_made: set[str] = set()

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))

    def get(self, key: str) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise NotFoundError(f"{key} does not exist in {self.root}") from None
        except OSError as exc:
            raise StorageError(f"cannot read {key} in {self.root}: {exc}") from exc

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        # Sequential: reading small files from the page cache costs a few microseconds each,
        # far less than handing them to a thread pool.
        out: dict[str, bytes | None] = {}
        prefix = self.root + os.sep
        for key in keys:
            try:
                fd = os.open(prefix + key.replace("/", os.sep), os.O_RDONLY)
            except FileNotFoundError:
                out[key] = None
                continue
            except OSError as exc:
                raise StorageError(f"cannot read {key} in {self.root}: {exc}") from exc
            try:
                first = os.read(fd, 1 << 16)
                parts = [first]
                if len(first) == 1 << 16:  # a short read of a regular file is its end
                    while chunk := os.read(fd, 1 << 20):
                        parts.append(chunk)
            finally:
                os.close(fd)
            out[key] = first if len(parts) == 1 else b"".join(parts)
        return out

    def _makedirs(self, folder: str) -> None:
        if folder not in self._dirs_made:
            os.makedirs(folder, exist_ok=True)
            real = os.path.realpath(folder)
            if real != self._real and not real.startswith(self._real + os.sep):
                raise StorageError(
                    f"{folder} leads out of the store (to {real}) through a link; remove the "
                    "link: cas_checkpoint writes only inside its root")
            self._dirs_made.add(folder)

    def _write_tmp(self, path: str, data: bytes) -> str:
        folder = os.path.dirname(path)
        self._makedirs(folder)
        tmp = f"{path}.tmp-{os.getpid()}-{secrets.token_hex(6)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        return tmp

    @staticmethod
    def _fsync_dir(folder: str) -> None:
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _put_one(self, key: str, data: bytes) -> str | None:
        path = self._path(key)
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            size = None
        if size == len(data):
            try:
                os.utime(path)  # a reused object is fresh again for the GC grace period
                return None
            except FileNotFoundError:
                pass  # a gc took it just now (see gc.py): write it again
        tmp = self._write_tmp(path, data)
        try:
            if size is not None and size != len(data):
                os.replace(tmp, path)  # a damaged copy (truncated, say): never reuse it
            else:
                os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return os.path.dirname(path)

    def put_many(self, items: dict[str, bytes]) -> None:
        try:
            if len(items) <= 2:
                folders = [self._put_one(k, v) for k, v in items.items()]
            else:
                with ThreadPoolExecutor(min(self.concurrency, len(items))) as pool:
                    folders = list(pool.map(self._put_one, items.keys(), items.values()))
            for folder in {f for f in folders if f}:
                self._fsync_dir(folder)
        except OSError as exc:
            raise StorageError(f"cannot write objects in {self.root}: {exc}") from exc

    def read_ref(self, key: str) -> tuple[bytes, str] | None:
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(f"cannot read ref {key} in {self.root}: {exc}; a ref must be a "
                               "regular file (run `cas-checkpoint verify`)") from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise StorageError(f"ref {key} in {self.root} is not a regular file; run "
                                   "`cas-checkpoint verify`")
            if st.st_size > MAX_REF_BYTES:
                raise FormatError(f"ref {key} in {self.root} is {st.st_size} bytes, larger than "
                                  f"any valid ref ({MAX_REF_BYTES}); it is corrupt or hostile")
            parts = []
            while chunk := os.read(fd, 1 << 20):
                parts.append(chunk)
                if sum(map(len, parts)) > MAX_REF_BYTES:
                    raise FormatError(f"ref {key} in {self.root} grew past {MAX_REF_BYTES} "
                                      "bytes while being read")
        except OSError as exc:
            raise StorageError(f"cannot read ref {key} in {self.root}: {exc}") from exc
        finally:
            os.close(fd)
        data = b"".join(parts)
        return data, _version(data)

    @contextmanager
    def _locked(self, path: str) -> Iterator[float]:
        """Hold the ref's lock; yields the seconds spent waiting for it. Waits at most
        ``LOCK_WAIT`` (a writer stalled while holding it must not stall others forever)."""
        self._makedirs(os.path.dirname(path))
        if fcntl is None:  # pragma: no cover
            raise StorageError("local refs need fcntl.flock, which this platform lacks")
        lock = path + ".lock"
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            started, delay = time.monotonic(), 0.001
            while True:
                try:  # released by the kernel if its holder dies
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    waited = time.monotonic() - started
                    if waited >= LOCK_WAIT:
                        holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
                        raise StorageError(
                            f"gave up after {waited:.1f} s waiting for the lock {lock}, held by "
                            f"{holder or 'another process'}: a writer of this thread is stalled. "
                            "Retry; if it stays stuck, stop that process") from None
                    time.sleep(min(delay, LOCK_WAIT - waited))
                    delay = min(delay * 2, 0.05)
            os.pwrite(fd, f"pid {os.getpid()} on {os.uname().nodename}".ljust(64).encode(), 0)
            yield time.monotonic() - started
        finally:
            os.close(fd)

    def write_ref(self, key: str, data: bytes, expected: str | None,
                  refresh: Callable[[], None] | None = None) -> str:
        path = self._path(key)
        try:
            with self._locked(path) as waited:
                if refresh is not None and waited > REFRESH_WAIT:
                    refresh()  # a gc may have run while we waited: re-put what the ref names
                current = self.read_ref(key)
                if (current[1] if current else None) != expected:
                    raise RefMismatch(key)
                tmp = self._write_tmp(path, data)
                os.replace(tmp, path)
                self._fsync_dir(os.path.dirname(path))
        except OSError as exc:
            raise StorageError(f"cannot update ref {key} in {self.root}: {exc}") from exc
        return _version(data)

    def delete_ref(self, key: str, expected: str) -> None:
        path = self._path(key)
        try:
            with self._locked(path):
                current = self.read_ref(key)
                if current is None or current[1] != expected:
                    raise RefMismatch(key)
                os.unlink(path)
                self._fsync_dir(os.path.dirname(path))
        except OSError as exc:
            raise StorageError(f"cannot delete ref {key} in {self.root}: {exc}") from exc

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every file under ``prefix``; a folder that cannot be read raises StorageError (never
        "nothing there"), and links, devices or folders where only files belong are listed
        with ``regular=False``."""
        base = self._path(prefix.rstrip("/"))

        def fail(exc: OSError) -> None:
            if isinstance(exc, FileNotFoundError) and exc.filename == base:
                return  # nothing was ever written under this prefix
            raise StorageError(f"cannot list {exc.filename} in {self.root}: {exc.strerror}; "
                               "check its permissions (nothing was changed)") from exc

        out = []
        flat = prefix.rstrip("/") == "refs/heads"
        for folder, dirs, files in os.walk(base, onerror=fail):
            rel = os.path.relpath(folder, self.root).replace(os.sep, "/")
            for name in dirs + files:
                if ".tmp-" in name or name.endswith(".lock"):
                    continue
                try:
                    st = os.lstat(os.path.join(folder, name))
                except FileNotFoundError:
                    continue
                if name in dirs and stat.S_ISDIR(st.st_mode):
                    if flat:  # refs/heads holds files only
                        out.append(ObjectInfo(f"{rel}/{name}", 0, st.st_mtime, False))
                    continue  # packs/ab/: a real folder, walked into
                out.append(ObjectInfo(f"{rel}/{name}", st.st_size, st.st_mtime,
                                      stat.S_ISREG(st.st_mode)))
            if flat:
                dirs[:] = []
        return out

    def delete_many(self, keys: Iterable[str]) -> builtins.list[str]:
        for key in keys:
            try:
                os.unlink(self._path(key))
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise StorageError(f"cannot delete {key} in {self.root}: {exc}") from exc
        return []

    def stale_temps(self, before: float) -> builtins.list[tuple[str, int]]:
        """(path, size) of temp files under ``packs/`` and ``refs/`` last modified before
        ``before``: a writer that died between writing one and linking it left it behind."""
        out = []
        for top in ("packs", "refs"):
            for folder, _dirs, files in os.walk(os.path.join(self.root, top)):
                for name in files:
                    if ".tmp-" not in name:
                        continue
                    path = os.path.join(folder, name)
                    try:
                        st = os.stat(path)
                    except FileNotFoundError:
                        continue
                    if st.st_mtime < before:
                        out.append((path, st.st_size))
        return out


# --- memory:// ---------------------------------------------------------------------------------


class MemoryBackend(Backend):
    """fsspec's ``memory://`` filesystem: shared by every store in this process, gone at exit."""

    _lock = threading.Lock()

    def __init__(self, fs: Any, root: str) -> None:
        self.fs = fs
        self.root = "/" + root.strip("/")
        self.url = "memory://" + self.root

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def get(self, key: str) -> bytes:
        try:
            return bytes(self.fs.cat_file(self._path(key)))
        except FileNotFoundError:
            raise NotFoundError(f"{key} does not exist in {self.url}") from None

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        """Reads from the process's memory: one after the other, no thread pool."""
        out: dict[str, bytes | None] = {}
        store = self.fs.store
        for key in keys:
            f = store.get(self._path(key))
            out[key] = None if f is None else bytes(f.getbuffer())
        return out

    def put_many(self, items: dict[str, bytes]) -> None:
        with self._lock:
            for key, data in items.items():
                path = self._path(key)
                existing = self.fs.store.get(path)
                if existing is not None:  # a reused object is fresh again for the GC grace
                    existing.modified = datetime.now(UTC)
                else:
                    self.fs.pipe_file(path, bytes(data))

    def read_ref(self, key: str) -> tuple[bytes, str] | None:
        with self._lock:
            try:
                data = self.get(key)
            except NotFoundError:
                return None
        return data, _version(data)

    def write_ref(self, key: str, data: bytes, expected: str | None,
                  refresh: Callable[[], None] | None = None) -> str:
        with self._lock:
            current = self.read_ref_unlocked(key)
            if current != expected:
                raise RefMismatch(key)
            self.fs.pipe_file(self._path(key), bytes(data))
        return _version(data)

    def read_ref_unlocked(self, key: str) -> str | None:
        try:
            return _version(self.get(key))
        except NotFoundError:
            return None

    def delete_ref(self, key: str, expected: str) -> None:
        with self._lock:
            if self.read_ref_unlocked(key) != expected:
                raise RefMismatch(key)
            self.fs.rm_file(self._path(key))

    def list(self, prefix: str) -> list[ObjectInfo]:
        base = self._path(prefix.rstrip("/"))
        with self._lock:
            try:
                found = self.fs.find(base, detail=True)
            except FileNotFoundError:
                return []
            out = []
            for path, info in found.items():
                f = self.fs.store.get(path)
                when = getattr(f, "modified", None) or info.get("created")
                mtime = when.timestamp() if isinstance(when, datetime) else time.time()
                out.append(ObjectInfo(path[len(self.root) + 1:], int(info.get("size") or 0),
                                      mtime))
        return out

    def delete_many(self, keys: Iterable[str]) -> builtins.list[str]:
        with self._lock:
            for key in keys:
                try:
                    self.fs.rm_file(self._path(key))
                except FileNotFoundError:
                    pass
        return []


# --- opening -----------------------------------------------------------------------------------


def open_backend(url: str, storage_options: dict[str, Any] | None = None,
                 *, allow_unsafe: bool = False, retries: int | None = None,
                 timeout: float | None = None) -> Backend:
    """A backend for a store URL: a local path, ``file://``, ``memory://`` or ``s3://``."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidArgumentError("the store URL is empty; pass a directory path, "
                                   "'memory://name' or 's3://bucket/prefix'")
    if "://" not in url and not url.startswith(("file:", "local:")):
        return LocalBackend(url)  # a plain path: no need to import fsspec (~40 ms)
    import fsspec
    from fsspec.core import split_protocol

    protocol, path = split_protocol(url)
    if protocol in (None, "file", "local"):
        return LocalBackend(path)
    options = dict(storage_options or {})
    if timeout is not None and protocol in ("s3", "s3a"):
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("connect_timeout", timeout)
        config.setdefault("read_timeout", timeout)
        options["config_kwargs"] = config
    try:
        fs = fsspec.filesystem(protocol, **options)
    except (ImportError, ValueError) as exc:
        raise InvalidArgumentError(
            f"cannot open {url!r}: {exc}. For s3:// install the extra: pip install "
            "'cas_checkpoint[s3]'"
        ) from exc
    return backend_for(fs, path, allow_unsafe=allow_unsafe, retries=retries)


def backend_for(fs: Any, root: str, *, allow_unsafe: bool = False,
                retries: int | None = None) -> Backend:
    """A backend over an fsspec filesystem object and a root path inside it."""
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    if "file" in protocols or "local" in protocols:
        return LocalBackend(root)
    if "memory" in protocols:
        return MemoryBackend(fs, root)
    if "s3" in protocols or "s3a" in protocols:
        from .backend_s3 import S3Backend

        return S3Backend(fs, root, allow_unsafe=allow_unsafe, retries=retries)
    raise InvalidArgumentError(
        f"filesystem {protocols[0]!r} is not supported yet: cas_checkpoint needs atomic "
        "compare-and-swap for refs, which it implements for local disk, memory:// and s3://"
    )


def is_transient(exc: BaseException) -> bool:
    """A storage error worth retrying (timeouts, resets, 5xx, throttling); see ``retry.py``."""
    from .retry import is_transient as transient

    return transient(exc)
