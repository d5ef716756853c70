"""A long thread's archive: the packs that merges no longer take, named through one small pack
instead of by the head (issue 29, "long threads stay flat"). Pure code but for ``listed``, a step.

Without it a head names every byte of its thread in at most ``MAX_PACKS`` packs, so the packs
grow with the thread: merging them rewrites each object about log_4(thread bytes) times, and a
new process reads them all before it can load the newest state. With it (``staging.stage``):

* a pack that reaches ``ARCHIVE_LEVEL`` (4^4 flushes of a save's new objects) is merged no
  further. When a second one forms, the older one leaves the head's pack list for the archive,
  so each object is rewritten at most ``ARCHIVE_LEVEL`` times however long the thread grows, and
  the packs a head names hold the thread's newest saves, a bounded number of bytes;
* the archive is an object (kind ``A``: the ``PackRef`` of each archived pack, oldest first)
  alone in a pack of its own, which the head names under the key ``a``. Archiving a pack writes
  a new one (the list grows by one entry in ~256 saves); the head names only the newest;
* reads that want the newest state or the newest entries of the log (a load of the head,
  ``history(limit=k)``) read the head's packs only (``ObjectStore.view(head, recent=True)``), and
  read the archived packs too only when an object is in none of them (``InArchive``); every
  other reader reads them all, as before (``ObjectStore.view(head)``);
* gc, verify, repack, forks and copies take the archive's packs as named by the head.

An encrypted store never archives (its key-less gc reads the packs a sealed ref names in the
clear, and could not read a sealed archive's list): its heads stay as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import msgpack

from cas_checkpoint.errors import FormatError, IntegrityError, NotFoundError
from cas_checkpoint.format.heads import Head, PackRef, _pack_ref
from cas_checkpoint.format.objects import (
    _HEADERS,
    ARCHIVE,
    ObjectId,
    _bin_id,
    object_id,
    object_kind,
)

if TYPE_CHECKING:
    from cas_checkpoint.engine.steps import Step


class Packs(Protocol):
    """What reads packs by id (``ObjectStore``: not imported, it imports this module)."""

    def packs(self, pids: Iterable[str]) -> Step[dict[str, Any]]: ...

ARCHIVE_LEVEL = 4  # a pack of this level (or above) is merged no further (4^4 flushes)
MAX_ARCHIVED = 1 << 20  # packs an archive lists, at most (a writer stops archiving there)
MAX_ARCHIVE_BYTES = MAX_ARCHIVED * 64  # an archive object's bytes, at most (refused unread)


class InArchive(NotFoundError):
    """An object a view of a head's own packs did not find: it may be in the head's archive
    (``ObjectStore.view(head)`` reads that too)."""


def encode(packs: Iterable[PackRef]) -> bytes:
    """The archive object listing ``packs`` (oldest first)."""
    body: bytes = msgpack.packb([[_bin_id(p.id), p.level, p.size, p.count] for p in packs],
                                use_bin_type=True)
    return _HEADERS[ARCHIVE] + body


def decode(data: bytes | memoryview) -> tuple[PackRef, ...]:
    """The packs an archive object lists; FormatError for anything else."""
    if len(data) > MAX_ARCHIVE_BYTES:
        raise FormatError(f"an archive of {len(data)} bytes is larger than any valid archive "
                          f"({MAX_ARCHIVE_BYTES} bytes); the thread's archive is damaged (run "
                          "`cas-checkpoint verify`)")
    if object_kind(data) != ARCHIVE:
        raise FormatError("expected a thread's archive (a list of packs); the thread's archive "
                          "is damaged (run `cas-checkpoint verify`)")
    try:
        raw = msgpack.unpackb(bytes(data[5:]), raw=False, max_ext_len=0, use_list=True,
                              max_array_len=MAX_ARCHIVED, max_map_len=0, max_str_len=0)
    except Exception as exc:
        raise FormatError(f"cannot decode a thread's archive: {exc}; run `cas-checkpoint "
                          "verify`") from None
    if not isinstance(raw, list):
        raise FormatError("a thread's archive must be a list of packs; run `cas-checkpoint "
                          "verify`")
    return tuple(_pack_ref(p) for p in raw)


def of_pack(objects: Mapping[ObjectId, bytes | memoryview]) -> tuple[PackRef, ...]:
    """The packs listed by the archive pack whose objects are ``objects`` (one: the list)."""
    if len(objects) != 1:
        raise FormatError(f"an archive pack holds one object, not {len(objects)}; the thread's "
                          "archive is damaged (run `cas-checkpoint verify`)")
    return decode(next(iter(objects.values())))


def archived(objects: Packs, head: Head) -> Step[tuple[PackRef, ...]]:
    """The packs ``head``'s archive lists (none for a head without one): one read."""
    if head.archive is None:
        return ()
    got = yield from objects.packs([head.archive.id])
    return of_pack(got[head.archive.id].objects)


def named(objects: Packs, head: Head) -> Step[tuple[PackRef, ...]]:
    """Every pack ``head`` names: its own, its archive's pack and the packs listed there."""
    if head.archive is None:
        return head.packs
    return (*head.packs, head.archive, *(yield from archived(objects, head)))


def listing(packs: Iterable[PackRef]) -> dict[ObjectId, bytes]:
    """The objects of a new archive pack listing ``packs``: the list, by its id."""
    data = encode(packs)
    return {object_id(data): data}


def flattened(head: Head, data: bytes | None, parse: Callable[[str, bytes], Any]
              ) -> tuple[Head, str | None]:
    """``head`` naming its archive's pack and the packs listed there among its own packs (for
    audits that take every pack a head names: verify), from its archive pack's stored bytes
    ``data``, read by ``parse`` (``parse_pack``); and what is wrong with those bytes (the head
    then names only the archive pack)."""
    if head.archive is None:
        return head, None
    listed: tuple[PackRef, ...] = ()
    problem = None
    try:
        if data is None:
            raise NotFoundError("it does not exist")
        listed = of_pack(parse(head.archive.id, data).objects)
    except (NotFoundError, FormatError, IntegrityError) as exc:
        problem = (f"the thread's archive cannot be read ({exc}): the checkpoints in the packs "
                   "it lists cannot be loaded")
    return replace(head, packs=(*head.packs, head.archive, *listed), archive=None), problem
