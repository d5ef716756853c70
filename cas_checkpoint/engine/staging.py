"""Where a thread's new objects go: inside its head while few, then into packs merged
geometrically (an LSM tree of packs). Pure code: the caller reads and writes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from cas_checkpoint.engine import live
from cas_checkpoint.engine.archive import ARCHIVE_LEVEL, MAX_ARCHIVED, listing, of_pack
from cas_checkpoint.errors import InvalidArgumentError
from cas_checkpoint.format.heads import Head, PackRef
from cas_checkpoint.format.objects import ObjectId, inline_id, object_id
from cas_checkpoint.format.pack import Sealing, Zstd, encode_packs

if TYPE_CHECKING:
    from cas_checkpoint.format.sealing import Key


def seal_pack(data: bytes, key: Key) -> bytes:
    from cas_checkpoint.format.sealing import seal_pack as seal

    return seal(data, key)

INLINE_MAX = 4 * 1024  # bytes of objects a head may hold before they go to a pack
MERGE_FACTOR = 4
MAX_PACKS = 14  # a cold load: the ref, then at most this many packs in one parallel round
SPLIT_LEVEL = 2  # a merge of this level or above keeps its live objects apart (live.py)
FAST_MIN = 64 * 1024  # a save's new pack bigger than this is compressed fast (Zstd.fast)

PackReader = Callable[[list[ObjectId]], Mapping[ObjectId, Mapping[ObjectId, bytes | memoryview]]]
"""Reads packs (id -> their objects) for a merge."""


def make_pack(objects: Mapping[ObjectId, bytes | memoryview], level: int,
              compressor: Zstd | None = None, sealer: Key | None = None
              ) -> tuple[PackRef, bytes]:
    """A pack of ``objects`` (compressed, then sealed under ``sealer``'s key, when given),
    named by the hash of its stored bytes."""
    ref, data, _ = make_packs(objects, level, compressor, sealer)
    return ref, data


def make_packs(objects: Mapping[ObjectId, bytes | memoryview], level: int,
               compressor: Zstd | None = None, sealer: Key | None = None
               ) -> tuple[PackRef, bytes, bytes]:
    """``make_pack``, and the pack as a reader sees it once it is opened (decrypted and
    decompressed): what this process keeps in its cache, not undone from the stored bytes."""
    if sealer is None and isinstance(compressor, Sealing):  # an encrypted store's packer
        if compressor.key is None:
            raise InvalidArgumentError("this store is encrypted and was opened key-less: it "
                                       "cannot write; open it with encryption=Key.from_env("
                                       "'CAS_KEY')")
        sealer = compressor.key
    data, plain = encode_packs(objects, compressor)
    if sealer is not None:
        data = seal_pack(data, sealer)
    return PackRef(object_id(data), level, len(data), len(objects)), data, plain


def stage(head: Head, new: Mapping[ObjectId, bytes], read: PackReader,
          inline_max: int = INLINE_MAX, compressor: Zstd | None = None,
          sealer: Key | None = None, contents: dict[ObjectId, tuple[ObjectId, ...]] | None = None,
          opened: dict[ObjectId, bytes] | None = None) -> tuple[Head, dict[ObjectId, bytes]]:
    """``head`` holding ``new`` objects too, and the packs to write before it (id -> bytes).
    ``contents``, if given, gets the ids of each pack's objects (each the hash of its bytes);
    ``opened`` each pack as a reader sees it (``make_packs``)."""
    inline = _inline_objects(head.inline)
    inline.update(new)  # (an id held already keeps its place: the same id, the same bytes)
    size = sum(map(len, inline.values()))
    if size <= inline_max:
        kept = tuple(inline.values())
        if len(_STAGED) >= STAGED_MAX:
            _STAGED.clear()
        _STAGED[id(kept)] = (kept, inline)
        return _with(head, head.packs, kept), {}
    # a big first pack (a whole state's first save) is compressed fast: a merge that takes it
    # compresses it again at the store's level
    fresh_by = compressor.fast() if compressor is not None and size > FAST_MIN else compressor
    ref, data, plain = make_packs(inline, 0, fresh_by, sealer)
    written: dict[ObjectId, bytes] = {ref.id: data}
    plains: dict[ObjectId, bytes] = {ref.id: plain}
    fresh: dict[ObjectId, Mapping[ObjectId, bytes | memoryview]] = {ref.id: inline}
    packs = list(head.packs) + [ref]
    while True:
        span = _next_merge(packs)
        if span is None:
            break
        start, end = span
        group = packs[start:end]
        level = min(max(live.level(p) for p in group) + 1, live.LEGACY - live.LIVE - 1)
        # a merge of archive level also takes the live packs of that level made before: the
        # live objects stay among the head's packs, never in the archive
        extra = [p for p in packs[:start] if live.is_live(p) and live.level(p) >= ARCHIVE_LEVEL
                 ] if level >= ARCHIVE_LEVEL else []
        parts = _read(extra + group, fresh, read)
        merged: dict[ObjectId, bytes | memoryview] = {}
        for p in extra + group:
            for oid, obj in parts[p.id].items():
                merged.setdefault(oid, obj)
        made: list[tuple[dict[ObjectId, bytes | memoryview], int]] = [(merged, level)]
        if level >= SPLIT_LEVEL:
            hot = _live(head, merged, packs[end:], fresh, read)
            if hot and len(hot) < len(merged):  # (all live: one pack, of history's level,
                # so that each history pack has at most one live pack after it)
                made = [({k: v for k, v in merged.items() if k not in hot}, level),
                        ({k: v for k, v in merged.items() if k in hot}, live.LIVE + level)]
        for p in extra + group:
            written.pop(p.id, None)  # merged before it was ever written
            plains.pop(p.id, None)
        refs = []
        for objects, at in made:  # (after: a live part may come out the very pack it was)
            ref, data, plain = make_packs(objects, at, compressor, sealer)
            written[ref.id], plains[ref.id], fresh[ref.id] = data, plain, objects
            refs.append(ref)
        packs[start:end] = refs
        if extra:
            gone = {p.id for p in extra}
            packs[:] = [p for p in packs if p.id not in gone]
    archive = head.archive
    if sealer is None and not isinstance(compressor, Sealing):  # (see archive.py)
        archive = _archive(packs, archive, fresh, read, written, plains, compressor)
    if contents is not None:
        contents.update((pid, tuple(fresh[pid])) for pid in written)
    if opened is not None:
        opened.update(plains)
    return _with(head, tuple(packs), (), archive), written


def _archive(packs: list[PackRef], archive: PackRef | None,
             fresh: dict[ObjectId, Mapping[ObjectId, bytes | memoryview]], read: PackReader,
             written: dict[ObjectId, bytes], plains: dict[ObjectId, bytes],
             compressor: Zstd | None) -> PackRef | None:
    """Move every pack of ``ARCHIVE_LEVEL`` or above but the newest out of ``packs`` (in
    place) into a new archive (written, with its listing pack, into ``written``); returns the
    archive the head names (``archive``, when nothing moved)."""
    top = [p for p in packs if not live.is_live(p) and p.level >= ARCHIVE_LEVEL]
    if len(top) < 2:
        return archive
    leaving = top[:-1]
    old = () if archive is None else of_pack(_read([archive], fresh, read)[archive.id])
    if len(old) + len(leaving) > MAX_ARCHIVED:
        return archive  # (a thread of ~10^9 saves: its head names more packs from here on)
    objects = listing([*old, *leaving])
    ref, data, plain = make_packs(objects, 0, compressor)
    written[ref.id], plains[ref.id], fresh[ref.id] = data, plain, objects
    gone = set(leaving)
    packs[:] = [p for p in packs if p not in gone]
    return ref


_STAGED: dict[int, tuple[tuple[bytes, ...], dict[ObjectId, bytes]]] = {}
STAGED_MAX = 1024  # heads' inline objects whose ids are remembered (by the tuple they are in)


def _inline_objects(objects: tuple[bytes, ...]) -> dict[ObjectId, bytes]:
    """A head's inline objects by id: a copy of the ids ``stage`` found for the very same
    tuple (kept alive with them, so its identity is not reused; a tuple of bytes never
    changes), else each one's id (``inline_id``)."""
    got = _STAGED.get(id(objects))
    if got is not None and got[0] is objects:
        return dict(got[1])
    return {inline_id(d): d for d in objects}


def _next_merge(packs: list[PackRef]) -> tuple[int, int] | None:
    """(start, end) of the packs to merge next, or None. The rules see a live pack as part of
    the history pack before it (live.py): the four newest of one level merge; a head of more
    than ``MAX_PACKS`` merges its cheapest neighbours."""
    units: list[tuple[int, int]] = []  # (start, end) of each history pack and its live packs
    for i, p in enumerate(packs):
        if units and live.is_live(p):
            units[-1] = (units[-1][0], i + 1)
        else:
            units.append((i, i + 1))
    joined = [PackRef(packs[a].id, live.level(packs[a]), sum(p.size for p in packs[a:b]),
                      sum(p.count for p in packs[a:b])) for a, b in units]
    top = joined[-MERGE_FACTOR:]
    if len(top) == MERGE_FACTOR and len({p.level for p in top}) == 1:
        return units[-MERGE_FACTOR][0], len(packs)
    if len(joined) > MAX_PACKS:
        a, b = _cheapest_runs(joined)
        return units[a][0], units[b - 1][1]
    return None


def _live(head: Head, merged: Mapping[ObjectId, bytes | memoryview], after: list[PackRef],
          fresh: dict[ObjectId, Mapping[ObjectId, bytes | memoryview]], read: PackReader
          ) -> set[ObjectId]:
    """The objects of ``merged`` that ``head``'s newest entries reach (``live.reached``),
    walking through them, the packs ``after`` them and the head's inline objects."""
    at_hand: list[Mapping[ObjectId, bytes | memoryview]] = [merged]
    if after:
        got = _read(after, fresh, read)
        at_hand += [got[p.id] for p in after]
    inline = _inline_objects(head.inline) if head.inline else {}
    at_hand.append(inline)

    def get(oid: ObjectId) -> bytes | memoryview | None:
        for objects in at_hand:
            data = objects.get(oid)
            if data is not None:
                return data
        return None

    return live.reached(head, get) & merged.keys()


def _runs(packs: list[PackRef]) -> list[tuple[int, int]]:
    """The runs of ``packs``: (start, end) of each stretch of packs side by side of one level."""
    out: list[tuple[int, int]] = []
    for i, p in enumerate(packs):
        if out and packs[out[-1][0]].level == p.level:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


def _cheapest_runs(packs: list[PackRef]) -> tuple[int, int]:
    """(start, end) of the two neighbouring runs whose packs add up to the fewest bytes (the
    newer of two such pairs), or of the newest two packs when all are of one level. Judged by
    bytes, not by level: a head whose levels do not fall along its list (one an older version
    wrote, or an import's) still merges its small packs, not its big ones."""
    runs = _runs(packs)
    if len(runs) < 2:
        return len(packs) - 2, len(packs)
    sizes = [sum(p.size for p in packs[a:b]) for a, b in runs]
    best = min(range(len(runs) - 1), key=lambda j: (sizes[j] + sizes[j + 1], -j))
    return runs[best][0], runs[best + 1][1]


def _read(group: list[PackRef], fresh: Mapping[ObjectId, Mapping[ObjectId, bytes | memoryview]],
          read: PackReader) -> dict[ObjectId, Mapping[ObjectId, bytes | memoryview]]:
    out = {p.id: fresh[p.id] for p in group if p.id in fresh}
    missing = [p.id for p in group if p.id not in out]
    if missing:
        got = read(missing)
        out.update((k, got[k]) for k in missing)
    return out


def _with(head: Head, packs: tuple[PackRef, ...], inline: tuple[bytes, ...],
          archive: PackRef | None = None) -> Head:
    """``head`` naming ``packs``, ``inline`` and ``archive``; of its held packs, those it
    still names (collect.py)."""
    archive = head.archive if archive is None else archive
    held = head.held
    if held:
        named = {p.id for p in packs} | ({archive.id} if archive is not None else set())
        held = frozenset(held & named)
    return Head(head.thread_id, head.head, head.head_step, head.peaks, head.tail, packs, inline,
                head.lineage, archive, held)
