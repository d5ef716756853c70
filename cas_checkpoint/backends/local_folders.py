"""The folders of a local store and their names made durable: a file made durable in a folder
(a pack, then the ref naming it) survives power loss only if the folder's own name does, and
each folder above it up to the store's root. Flushing a folder costs a journal commit unless
what it holds was committed already, so the folders a write makes are made before the file it
writes and flushed after that file's flush, before the write returns: one commit holds them all,
and the folder flushes after it commit nothing (ext4: ~50 us each against ~250 us)."""

from __future__ import annotations

import builtins
import os
import stat
import threading
from collections.abc import Iterable

from cas_checkpoint.errors import StorageError


class DurableFolders:
    """The folders one local backend object has made, and whose names it has flushed."""

    root: str
    _real: str

    def __init__(self) -> None:
        self._dirs_made: set[str] = set()
        # folders found to be real folders inside the root (the root's own realpath checked
        # once): a folder made in one of them with ``mkdir`` is one too, with no ``realpath``
        self._inside: set[str] = {self.root}
        self._entries_synced: set[str] = set()  # folders whose own names were fsynced
        self._owed: list[str] = []  # folders made whose names the next write flushes
        self._owed_lock = threading.Lock()

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))

    def _makedirs(self, folder: str, later: list[str] | None = None) -> None:
        """Make ``folder`` (inside the root), and make its name durable: the first time this
        process uses a folder, its parent is fsynced (its entry is there; also when another
        process made it, which may not have synced it yet), and so on up for each folder
        whose own entry this process has not made durable yet, so that a file made durable in
        it (a pack, then the ref naming it) cannot vanish with a folder entry that power loss
        dropped. With ``later``, the folders whose names need a flush are added to it instead
        of flushed here: the caller flushes them (``_flush``) after its own file, before it
        returns. The folder is then made before that file, and one journal commit (the
        file's flush) holds both: a folder flushed afterwards finds its change committed, a
        flush that costs no commit of its own (ext4: ~50 us, against ~250 us first)."""
        if folder in self._dirs_made:
            return
        if not self._made_inside(folder):
            os.makedirs(folder, exist_ok=True)
            real = os.path.realpath(folder)
            if real != self._real and not real.startswith(self._real + os.sep):
                raise StorageError(
                    f"{folder} leads out of the store (to {real}) through a link; remove the "
                    "link: cas_checkpoint writes only inside its root")
            self._inside.add(folder)
        made, entry = [], folder
        while entry not in self._entries_synced and entry.startswith(self.root + os.sep):
            made.append(entry)
            entry = os.path.dirname(entry)
        if not made:
            self._dirs_made.add(folder)
        elif later is None:
            self._flush((), made)
        else:
            later.extend(made)

    def _made_inside(self, folder: str) -> bool:
        """Make ``folder`` with one ``mkdir`` when its parent is a folder known to be inside
        the root (``_inside``): what ``mkdir`` makes there, or a folder (not a link) found
        there, is inside too, so its ``realpath`` (an ``lstat`` per level: 5-7 calls for a
        pack folder, x256 pack folders a store object) is not needed. False: not known, the
        caller makes it with ``makedirs`` and checks its ``realpath``."""
        parent = os.path.dirname(folder)
        if parent not in self._inside and not self._found_inside(parent):
            return False
        try:
            os.mkdir(folder)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(folder).st_mode):
                return False  # (a link, say: the caller's realpath decides)
        except FileNotFoundError:
            return False  # (its parent went away meanwhile)
        self._inside.add(folder)
        return True

    def _found_inside(self, folder: str) -> bool:
        """Whether ``folder`` (under the root) is a folder whose ``realpath`` is inside the
        root, remembered in ``_inside`` if so: one ``realpath`` for ``packs/``, not one for
        each of the 256 folders made in it."""
        if not folder.startswith(self.root + os.sep) or not os.path.isdir(folder):
            return False
        real = os.path.realpath(folder)
        if real != self._real and not real.startswith(self._real + os.sep):
            return False  # (the caller's own realpath raises, naming the folder)
        self._inside.add(folder)
        return True

    def _flush(self, folders: Iterable[str], made: Iterable[str] = ()) -> None:
        """Flush ``folders`` (the names just written into them), then the parent of each
        folder ``made`` (``_makedirs``), each folder once; the names of ``made`` are durable
        after that."""
        made = builtins.list(made)
        for folder in dict.fromkeys([*folders, *(os.path.dirname(m) for m in made)]):
            self._fsync_dir(folder)
        self._entries_synced.update(made)
        self._dirs_made.update(made)

    has_folders = True

    def prepare_folders(self, folders: Iterable[str], flush: bool = True) -> None:
        """Make these folders, then flush each of their parents once: one flush makes every
        name in a folder durable, so the first pack written into each of them (256 pack
        folders) does not flush their parent again (``_makedirs``). The folders are all made
        before the first flush (which commits them all). With ``flush=False`` nothing is
        flushed now: the next write of this object (``put_many``, ``write_ref``) flushes them
        with its own folders, before it returns (a new store's ``refs/heads``, made with its
        root object: one flush of the root for both)."""
        paths = [self._path(f) for f in folders]
        todo = [p for p in paths if p not in self._entries_synced]
        if not todo:
            return
        made: list[str] = []
        try:
            for path in todo:
                self._makedirs(path, made)
            if not flush:
                with self._owed_lock:
                    self._owed.extend(made)
                return
            self._flush((), made)
        except OSError as exc:
            raise StorageError(f"cannot make folders in {self.root}: {exc}") from exc

    def _take_owed(self, made: list[str]) -> list[str]:
        """``made`` with the folders ``prepare_folders(flush=False)`` left to flush (taken:
        the caller flushes them)."""
        if self._owed:
            with self._owed_lock:
                made.extend(self._owed)
                self._owed.clear()
        return made

    @staticmethod
    def _fsync_dir(folder: str) -> None:
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

