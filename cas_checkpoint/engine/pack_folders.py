"""Which pack folders a store object makes before writing packs (local disk, where a folder's
name needs a flush of its parent before a pack in it, and then a ref naming that pack, is
durable).

Packs go into 256 folders (``packs/ab/...``). Making all of them before a store object's first
pack costs 256 ``mkdir`` and, in a test suite or a short-lived tool, 256 ``rmdir`` when the
folder is removed: ~100 ms on a busy ext4 disk, more than a small store's whole life (a
LangGraph test writes one or two packs). Making each one the first time a pack needs it costs
a flush of ``packs/`` per folder, up to 256 over a long-lived store object's life. So folders
are made in batches that double: the folders the packs at hand need, topped up with folders
not made yet to 1, 2, 4, ... 256 in all, each batch made with one flush of ``packs/``
(``Backend.prepare_folders``). A store object flushes ``packs/`` for its pack folders at most 9
times in its life (1 + 2 + ... + 256 > 256), and one that writes p packs makes at most
2^p - 1 of them (a LangGraph test's store: 1 to 7, not 256).

Pure bookkeeping: the object store asks ``batch`` what to make, makes it, then says ``made``."""

from __future__ import annotations

import threading
from collections.abc import Iterable

PREFIX = "packs"
PACK_FOLDERS = tuple(f"{PREFIX}/{i:02x}" for i in range(256))  # (pack_key's folders)


class PackFolders:
    """The pack folders one store object has made (durably), and the next batch's size."""

    def __init__(self, needed: bool) -> None:
        self._made: set[str] = set() if needed else set(PACK_FOLDERS)
        self._size = 1  # folders the next batch makes at least (doubling)
        self._lock = threading.Lock()  # (saves from several threads share a store object)

    def batch(self, keys: Iterable[str]) -> list[str]:
        """The folders to make before writing the packs at ``keys`` (``packs/ab/...``): []
        when they are all made."""
        need = {k.rsplit("/", 1)[0] for k in keys}
        with self._lock:
            need -= self._made
            if not need:
                return []
            more = max(0, self._size - len(need))
            extra = [f for f in PACK_FOLDERS if f not in self._made and f not in need][:more]
            self._size = min(2 * max(self._size, len(need)), len(PACK_FOLDERS))
        return sorted(need) + extra

    def made(self, folders: Iterable[str]) -> None:
        """``folders`` exist and their names are durable."""
        with self._lock:
            self._made.update(folders)
