"""A local directory: plain ``os`` calls. Objects: temp file + fsync + ``os.link`` (create if
absent); refs: under an ``flock`` per ref, which the kernel releases when a holder dies, a
``pwrite`` + ``fdatasync`` into the free slot of a two-slot ref file (``ref_slots.py`` says why that
is as strong as a temp file + fsync + ``os.replace`` + folder fsync, which a new ref, an old
one-piece ref or a head that outgrew its slot still get). The async face runs these calls on a
small thread pool (``base.py``)."""

from __future__ import annotations

import builtins
import itertools
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress

from cas_checkpoint.backends import local_trash, ref_slots
from cas_checkpoint.backends.base import (
    DISK,
    MAX_REF_BYTES,
    Backend,
    ObjectInfo,
    RefMismatch,
    _version,
)
from cas_checkpoint.backends.local_folders import DurableFolders
from cas_checkpoint.errors import FormatError, IntegrityError, NotFoundError, StorageError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

LOCK_WAIT = 10.0  # seconds a local ref update waits for another writer's lock, at most
REFRESH_WAIT = 0.5  # a ref update that waited longer than this for its lock refreshes its packs
_datasync = getattr(os, "fdatasync", os.fsync)  # (macOS has no fdatasync)
MAX_REF_FILE = ref_slots.max_file(MAX_REF_BYTES)  # a ref file larger than this is refused unread
REPAIR = ("Run `cas-checkpoint verify STORE` to see what each slot holds, then `cas-checkpoint "
          "repair-ref STORE THREAD --use-slot N` (keep a whole slot's head) or `--remove`")
TORN_READS = 100  # a reader that keeps finding no valid slot in changing bytes gives up then
# A temp file's name: ``<key's path>.tmp-<pid>-<12 random hex digits>-<n>``, the random part
# drawn once a process (again in a forked child) and ``n`` counted, so that naming one costs no
# ``getpid`` or ``getrandom`` call (``O_EXCL`` refuses a name that exists all the same).
_TMP = [f".tmp-{os.getpid()}-{secrets.token_hex(6)}-"]
_TMP_COUNT = itertools.count()


def _new_tmp_names() -> None:
    _TMP[0] = f".tmp-{os.getpid()}-{secrets.token_hex(6)}-"


os.register_at_fork(after_in_child=_new_tmp_names)


def _holder(fd: int) -> str:
    """Who holds the lock on ``fd``: what an older version wrote into the lock file, or the
    pid ``/proc/locks`` names (Linux), or "another process"."""
    with suppress(OSError):
        note = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
        if note:
            return note
    with suppress(OSError, ValueError):
        st = os.fstat(fd)
        ident = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        with open("/proc/locks") as f:
            for line in f:
                parts = line.split()
                if "FLOCK" in parts and ident in parts and "->" not in parts:
                    return f"pid {parts[parts.index(ident) - 1]}"
    return "another process"


class LocalBackend(DurableFolders, Backend):
    """A local directory. Atomic by construction: readers see old or new bytes, never a part."""

    exact_mtimes = atomic_delete = housekeeping = pooled = True

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.url = self.root
        try:
            if not os.path.isdir(self.root):
                os.makedirs(self.root, exist_ok=True)
                self._fsync_dir(os.path.dirname(self.root))  # the new root's name, durable
        except OSError as exc:
            raise StorageError(
                f"cannot create the store directory {self.root}: {exc.strerror}; check the path "
                "and its permissions"
            ) from exc
        try:
            st = os.stat(self.root)
        except OSError as exc:
            raise StorageError(f"cannot read the store directory {self.root}: {exc.strerror}; "
                               "check the path and its permissions") from exc
        if not stat.S_ISDIR(st.st_mode):
            raise StorageError(f"{self.root} exists and is not a directory; choose another path")
        self.pool_key = st.st_dev  # (the async face's pool: one a device, see base._POOLS)
        self._real = os.path.realpath(self.root)
        self.shared_scope = (DISK, self._real)  # (two paths to one folder: one store)
        DurableFolders.__init__(self)
        # per ref key, the slot this object last wrote: (seq, checksum, head, version), so
        # that reading it back hashes nothing (its exact bytes are checked instead)
        self._written: dict[str, tuple[int, bytes, bytes, str]] = {}
        # per ref key, the slots of a file last read that is not at rest as a finished update
        # leaves it (two valid slots, a torn or damaged slot): what verify reports
        self.ref_notes: dict[str, ref_slots.Reading] = {}

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
                # One read of the size fstat gives (a big pack is not read in parts and then
                # joined), and a byte to spare. Anything else (a file that grew, or a read cut
                # short, as Linux cuts one past 2 GB) is read on to its end.
                size = os.fstat(fd).st_size
                data = os.read(fd, size + 1)
                if len(data) != size:
                    parts = [data]
                    while chunk := os.read(fd, 1 << 20):
                        parts.append(chunk)
                    data = b"".join(parts)
            finally:
                os.close(fd)
            out[key] = data
        return out

    def _write_tmp(self, path: str, data: bytes) -> str:
        """A temp file beside ``path`` (whose folder is made) holding ``data``, flushed."""
        tmp = f"{path}{_TMP[0]}{next(_TMP_COUNT)}"
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

    def _put_one(self, key: str, data: bytes, made: list[str]) -> str:
        path = self._path(key)
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            size = None
        if size == len(data):
            try:
                os.utime(path)  # a reused object is fresh again for the GC grace period
                # Its bytes were fsynced before it was linked, but its name (and its folder's)
                # may not be durable yet (a writer killed between its link and its folder
                # fsyncs): they are made durable as after a write, before a ref may name it.
                self._makedirs(os.path.dirname(path), made)
                return os.path.dirname(path)
            except FileNotFoundError:
                pass  # a gc took it just now (see gc.py): write it again
        self._makedirs(os.path.dirname(path), made)
        tmp = self._write_tmp(path, data)
        replaced = False
        try:
            if size is not None and size != len(data):
                os.replace(tmp, path)  # a damaged copy (truncated, say): never reuse it
                replaced = True
            else:
                os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            if not replaced:  # (no stat first: the name is there unless replaced)
                with suppress(FileNotFoundError):
                    os.unlink(tmp)
        return os.path.dirname(path)

    def put_many(self, items: dict[str, bytes]) -> None:
        made: list[str] = []  # folders made for these objects (flushed after them)
        try:
            if len(items) <= 2:
                folders = [self._put_one(k, v, made) for k, v in items.items()]
            else:
                with ThreadPoolExecutor(min(self.concurrency, len(items))) as pool:
                    folders = list(pool.map(self._put_one, items.keys(), items.values(),
                                            itertools.repeat(made)))
            # one fsync per folder written or reused, then per parent of a folder made
            self._flush(folders, self._take_owed(made))
        except OSError as exc:
            raise StorageError(f"cannot write objects in {self.root}: {exc}") from exc

    def _read_file(self, key: str, fd: int) -> bytes:
        """The bytes of an open ref file, refused by its size first."""
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StorageError(f"ref {key} in {self.root} is not a regular file; run "
                               "`cas-checkpoint verify`")
        if st.st_size > MAX_REF_FILE:
            raise FormatError(f"ref {key} in {self.root} is {st.st_size} bytes, larger than "
                              f"any valid ref ({MAX_REF_FILE}); it is corrupt or hostile")
        # Its size as fstat saw it: a ref file never changes size in place (a new one is
        # renamed over it, and this fd keeps the one it opened), so no read to the end follows.
        parts, at = [], 0
        while at < st.st_size and (chunk := os.pread(fd, st.st_size - at, at)):
            parts.append(chunk)
            at += len(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)  # (b"" for an empty file)

    def _head_of(self, key: str, data: bytes) -> tuple[bytes, ref_slots.Live | None] | str | None:
        """(head, live slot) of a ref file's bytes: a one-piece ref is its head (no slot);
        None for a slotted file with no valid slot (being written, or damaged); a str (what
        is wrong, slot by slot) for one whose newest head is damaged. Notes in
        ``ref_notes`` a slotted file that is not at rest as a finished update leaves it."""
        if not ref_slots.is_slotted(data):
            if len(data) > MAX_REF_BYTES:
                raise FormatError(f"ref {key} in {self.root} is {len(data)} bytes, larger than "
                                  f"any valid ref ({MAX_REF_BYTES}); it is corrupt or hostile")
            return data, None
        known = self._written.get(key)
        try:
            got = ref_slots.read(data, None if known is None else known[:3])
        except ValueError as exc:
            raise FormatError(f"ref {key} in {self.root} is damaged: {exc}; run "
                              "`cas-checkpoint verify`") from None
        if got.settled:
            self.ref_notes.pop(key, None)
        else:
            self.ref_notes[key] = got
        if got.error is not None:
            return f"{got.error} ({got.describe()})"
        if got.live is None:
            return None
        if len(got.live.head) > MAX_REF_BYTES:
            raise FormatError(f"ref {key} in {self.root} holds a head of {len(got.live.head)} "
                              f"bytes, larger than any valid ref ({MAX_REF_BYTES})")
        return got.live.head, got.live

    def _no_slot(self, key: str, why: str | None = None,
                 data: bytes | None = None) -> IntegrityError:
        if why is None:
            why = "both slots fail their checksums (neither holds a whole head): it is damaged"
            with suppress(ValueError):
                why += f" ({ref_slots.read(data).describe()})" if data is not None else ""
        exc = IntegrityError("a valid slot", "none", f"ref {key} in {self.root}")
        exc.args = (f"ref {key} in {self.root} cannot be read: {why}. {REPAIR}",)
        return exc

    def repair_ref(self, key: str, use_slot: int | None) -> str:
        """Under the ref's lock: rewrite the ref whole with the head of slot ``use_slot`` (it
        must be whole), or (None) remove the ref and its lock file. What the ref held is
        given up: only for a ref that cannot be read (``cas-checkpoint repair-ref``)."""
        path = self._path(key)
        try:
            with self._locked(path):
                with open(path, "rb") as f:
                    data = f.read(MAX_REF_FILE + 1)
                if use_slot is None:
                    self._remove(key, path)
                    return "removed"
                if not ref_slots.is_slotted(data) or len(data) > MAX_REF_FILE:
                    raise FormatError(f"ref {key} in {self.root} is not a slotted ref: choose "
                                      "--remove")
                try:
                    reading = ref_slots.read(data)
                except ValueError as exc:
                    raise FormatError(f"ref {key} in {self.root} is damaged: {exc}; choose "
                                      "--remove") from None
                chosen = reading.slots[use_slot]
                if chosen.state != "valid":
                    raise FormatError(f"slot {use_slot} of ref {key} does not hold a whole "
                                      f"head ({reading.describe()}); choose another --use-slot "
                                      "or --remove")
                seq = max(s.seq for s in reading.slots) + 1
                os.replace(self._write_tmp(path, ref_slots.new_file(seq, chosen.head)), path)
                self._fsync_dir(os.path.dirname(path))
                self._written.pop(key, None)
                self.ref_notes.pop(key, None)
                return f"kept slot {use_slot}"
        except FileNotFoundError:
            raise NotFoundError(f"{key} does not exist in {self.root}") from None
        except OSError as exc:
            raise StorageError(f"cannot repair ref {key} in {self.root}: {exc}") from exc

    def read_ref(self, key: str) -> tuple[bytes, str] | None:
        path = self._path(key)
        last = None
        for _ in range(TORN_READS):
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            except FileNotFoundError:
                return None
            except OSError as exc:
                raise StorageError(f"cannot read ref {key} in {self.root}: {exc}; a ref must "
                                   "be a regular file (run `cas-checkpoint verify`)") from exc
            try:
                data = self._read_file(key, fd)
            except OSError as exc:
                raise StorageError(f"cannot read ref {key} in {self.root}: {exc}") from exc
            finally:
                os.close(fd)
            got = self._head_of(key, data)
            if isinstance(got, tuple):
                return got[0], self._version_of(key, got[0])
            if data == last:  # the same bytes twice, and no head to read: damaged, not torn
                raise self._no_slot(key, got, data)
            last = data  # read while a writer was rewriting it: read again
            time.sleep(0.0005)
        raise self._no_slot(key, None, last)

    @contextmanager
    def _locked(self, path: str, made: list[str] | None = None) -> Iterator[float]:
        """Hold the ref's lock; yields the seconds spent waiting for it. Waits at most
        ``LOCK_WAIT`` (a writer stalled while holding it must not stall others forever).
        ``made``: see ``_makedirs`` (the caller flushes the folders it adds)."""
        self._makedirs(os.path.dirname(path), made)
        if fcntl is None:  # pragma: no cover
            raise StorageError("local refs need fcntl.flock, which this platform lacks")
        lock = path + ".lock"
        started, delay = time.monotonic(), 0.001
        while True:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                while True:
                    try:  # released by the kernel if its holder dies
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        waited = time.monotonic() - started
                        if waited >= LOCK_WAIT:
                            raise StorageError(
                                f"gave up after {waited:.1f} s waiting for the lock {lock}, held "
                                f"by {_holder(fd)}: a writer of this thread is stalled. Retry; "
                                "if it stays stuck, stop that process") from None
                        time.sleep(min(delay, LOCK_WAIT - waited))
                        delay = min(delay * 2, 0.05)
                # A lock file is removed (under its lock) with its thread: one that was removed
                # while we waited is no lock any more; take the one at its name now.
                # (Compared with the file at its name, not by ``st_nlink``: on NFS a removed
                # file another process holds open is renamed, not unlinked, so it keeps a link.)
                try:
                    same = os.path.samestat(os.fstat(fd), os.stat(lock))
                except FileNotFoundError:
                    same = False
                if same:
                    # (nothing is written into it: a lock file holds no clear information)
                    yield time.monotonic() - started
                    return
            finally:
                os.close(fd)

    def write_ref(self, key: str, data: bytes, expected: str | None,
                  refresh: Callable[[], None] | None = None) -> str:
        """Compare-and-swap under the ref's lock: the head is re-read under it and compared
        with ``expected``; then the new head goes into the free slot (one ``fdatasync``), or
        the ref is written whole (temp file, fsync, rename, folder fsync; see ``ref_slots.py``).
        Folders made for it (a new store's ``refs/heads``) are flushed after the ref's own
        flush, before it returns (``_makedirs``)."""
        path = self._path(key)
        made: list[str] = []
        try:
            with self._locked(path, made) as waited:
                version = self._swap(key, path, data, expected,
                                     refresh if waited > REFRESH_WAIT else None)
            self._flush((), self._take_owed(made))
        except OSError as exc:
            raise StorageError(f"cannot update ref {key} in {self.root}: {exc}") from exc
        return version

    def _swap(self, key: str, path: str, data: bytes, expected: str | None,
              refresh: Callable[[], None] | None) -> str:
        """``write_ref``'s work, under the ref's lock."""
        if refresh is not None:
            refresh()  # a gc may have run while we waited: re-put what the ref names
        try:
            fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            fd = -1
        try:
            current = None
            if fd >= 0:
                held = self._read_file(key, fd)
                got = self._head_of(key, held)
                if not isinstance(got, tuple):  # no writer but us: it is damaged
                    raise self._no_slot(key, got, held)
                current = got
            if (self._version_of(key, current[0]) if current else None) != expected:
                raise RefMismatch(key)
            live = current[1] if current else None
            if live is not None and live.fmt == ref_slots.FORMAT and ref_slots.fits(
                    live.slot, len(data)):
                slot = self._write_slot(fd, live, data)
                return self._wrote(key, live.seq + 1, slot, data)
        finally:
            if fd >= 0:
                os.close(fd)
        seq = live.seq + 1 if live is not None else 1
        whole = ref_slots.new_file(seq, data, new=current is None)
        tmp = self._write_tmp(path, whole)
        os.replace(tmp, path)
        self._fsync_dir(os.path.dirname(path))
        return self._wrote(key, seq, whole, data)

    def _wrote(self, key: str, seq: int, slot: bytes, head: bytes) -> str:
        """Remember the slot just written (durably) and return its version."""
        version = _version(head)
        if len(self._written) >= 4096:
            self._written.clear()
        self._written[key] = (seq, ref_slots.checksum_of(slot), head, version)
        return version

    def _version_of(self, key: str, head: bytes) -> str:
        known = self._written.get(key)
        return known[3] if known is not None and known[2] == head else _version(head)

    @staticmethod
    def _write_slot(fd: int, live: ref_slots.Live, head: bytes) -> bytes:
        """Write ``head`` into the slot that is not live, flush it, then retire the old one;
        returns the slot's bytes."""
        slot = ref_slots.encode_slot(live.seq + 1, head)
        view = memoryview(slot)
        start = at = (1 - live.index) * live.slot
        try:
            while view:
                done = os.pwrite(fd, view, at)
                view, at = view[done:], at + done
            # Once the new slot is whole, the live one names it as its successor (outside its
            # checksum), flushed with it: if the retire below is lost and the new slot is later
            # damaged, readers raise instead of stepping back to the old head (slots.read).
            os.pwrite(fd, ref_slots.next_mark(live.seq + 1),
                      live.index * live.slot + ref_slots.NEXT_AT)
            _datasync(fd)  # the file's size is unchanged: this makes the new slot durable
        except BaseException:
            # Not acknowledged, so not visible either: retire the new slot again (best
            # effort; the old one is still valid and, if this fails too, only has a lower seq)
            with suppress(OSError):
                os.pwrite(fd, bytes(32), start + ref_slots.CHECKSUM_AT)
            raise
        # After that (not before), retire the old slot: a ref at rest has one valid slot, so a
        # damaged one is an error, not a step back. Unflushed: if lost, the old slot is valid
        # but has the lower seq.
        os.pwrite(fd, bytes(32), live.index * live.slot + ref_slots.CHECKSUM_AT)
        return slot

    def delete_ref(self, key: str, expected: str) -> None:
        path = self._path(key)
        try:
            with self._locked(path):
                current = self.read_ref(key)
                if current is None or current[1] != expected:
                    raise RefMismatch(key)
                self._remove(key, path)
        except OSError as exc:
            raise StorageError(f"cannot delete ref {key} in {self.root}: {exc}") from exc

    def _remove(self, key: str, path: str) -> None:
        """Remove a ref file and its lock file (under its lock)."""
        os.unlink(path)
        with suppress(FileNotFoundError):
            os.unlink(path + ".lock")
        self._fsync_dir(os.path.dirname(path))
        self._written.pop(key, None)
        self.ref_notes.pop(key, None)

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
                out.append(ObjectInfo(
                    f"{rel}/{name}", st.st_size, st.st_mtime, stat.S_ISREG(st.st_mode),
                    f"{st.st_ino}.{st.st_size}.{st.st_mtime_ns}.{st.st_ctime_ns}"))
            if flat:
                dirs[:] = []
        return out

    def list_pages(self, prefix: str) -> Iterator[builtins.list[ObjectInfo]]:
        """``refs/heads`` (a flat folder) a page of 1,000 refs at a time, read from the
        directory as it goes (``os.scandir``); any other prefix in one page."""
        if prefix.rstrip("/") != "refs/heads":
            yield from super().list_pages(prefix)
            return
        try:
            entries = os.scandir(self._path("refs/heads"))
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StorageError(f"cannot list refs/heads in {self.root}: {exc.strerror}; check "
                               "its permissions (nothing was changed)") from exc
        page: builtins.list[ObjectInfo] = []
        with entries:
            for entry in entries:
                name = entry.name
                if ".tmp-" in name or name.endswith(".lock"):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                page.append(ObjectInfo(
                    f"refs/heads/{name}", st.st_size, st.st_mtime, stat.S_ISREG(st.st_mode),
                    f"{st.st_ino}.{st.st_size}.{st.st_mtime_ns}.{st.st_ctime_ns}"))
                if len(page) >= 1000:
                    yield page
                    page = []
        if page:
            yield page

    def delete_many(self, keys: Iterable[str]) -> builtins.list[str]:
        for key in keys:
            try:
                os.unlink(self._path(key))
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise StorageError(f"cannot delete {key} in {self.root}: {exc}") from exc
        return []

    def delete_unless_touched(self, infos: builtins.list[ObjectInfo],
                              cutoff: float) -> builtins.list[bool]:
        return local_trash.delete_unless_touched(self, infos, cutoff)

    def restore_trash(self) -> None:
        local_trash.restore_trash(self)

    def delete_stale_temps(self, cutoff: float, dry_run: bool) -> int:
        return local_trash.delete_stale_temps(self, cutoff, dry_run)  # type: ignore[no-any-return]

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
