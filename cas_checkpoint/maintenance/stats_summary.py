"""``stats()`` at the cost of what changed (issue 31): what each ref's log held at the last
``stats()`` (each checkpoint's id and size), kept in ``stats/summary/<blake3 of its bytes>``
and keyed, as gc's summary is, by the version the listing gives for the ref (see
``ref_summary.py`` for the versions and the "racily clean" rule). A run reads only the refs
whose version moved (and their logs); the others' figures come from the summary. The summary
only feeds figures (it never decides a delete): damaged or missing, it is ignored and rebuilt.
It is split as gc's is (``summary_parts.py``: a root naming parts ``stats-parts/<blake3>`` of
rows ``[key, version, mtime, ids, [sizes]]``, each part the refs of one key range); a summary
of format 1 (one object, before the split) is still read, and replaced.

Checkpoints shared by several threads (forks, copies) count once, by id: the summary keeps
the first 16 bytes of each id (a collision among them is as likely as one of 128-bit hashes).
"""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass

import msgpack

from cas_checkpoint.backends import ObjectInfo
from cas_checkpoint.engine.refs import HEADS, RefStore, is_thread_key
from cas_checkpoint.engine.steps import List, ReadRefs, Step
from cas_checkpoint.errors import FormatError, StorageError
from cas_checkpoint.format.heads import Head
from cas_checkpoint.maintenance import ref_summary, summary_parts
from cas_checkpoint.maintenance.summary_parts import Root, Row

log = logging.getLogger("cas_checkpoint")

FOLDER = "stats/summary"
PARTS = "stats-parts"
FORMAT = 1  # the single-object summary (read, never written)
ID_BYTES = 16


@dataclass(frozen=True, slots=True)
class Facts:
    version: str
    mtime: float
    ids: bytes  # ID_BYTES per checkpoint of the ref's log
    sizes: tuple[int, ...]


def encode(taken: float, refs: dict[str, Facts]) -> bytes:
    rows = [[k, f.version, f.mtime, f.ids, list(f.sizes)] for k, f in sorted(refs.items())]
    return zlib.compress(msgpack.packb({"v": FORMAT, "taken": taken, "refs": rows},
                                       use_bin_type=True), 6)


def decode(key: str, data: bytes) -> tuple[float, dict[str, Facts]]:
    if key != f"{FOLDER}/{ref_summary.key_of(data).rsplit('/', 1)[1]}":
        raise FormatError(f"{key} does not hash to its name")
    got = summary_parts.unpack(key, data, "stats summary")
    if got.get("v") != FORMAT or not isinstance(
            got.get("taken"), float) or not isinstance(got.get("refs"), list):
        raise FormatError(f"{key} is not a stats summary of format {FORMAT}")
    out = {}
    for row in got["refs"]:
        if not (isinstance(row, list) and len(row) == 5 and isinstance(row[0], str)
                and isinstance(row[1], str) and isinstance(row[2], float)
                and isinstance(row[3], bytes) and isinstance(row[4], list)
                and len(row[3]) == ID_BYTES * len(row[4])
                and all(isinstance(s, int) and s >= 0 for s in row[4])):
            raise FormatError(f"{key} has a malformed entry")
        out[row[0]] = Facts(row[1], row[2], row[3], tuple(row[4]))
    return got["taken"], out


def _row_ok(row: Row) -> bool:
    return (len(row) == 5 and isinstance(row[1], str) and isinstance(row[2], float)
            and isinstance(row[3], bytes) and isinstance(row[4], list)
            and len(row[3]) == ID_BYTES * len(row[4])
            and all(isinstance(s, int) and s >= 0 for s in row[4]))


def _old(key: str, data: bytes) -> Root:
    taken, facts = decode(key, data)
    return Root(key, taken, {k: _row(k, f) for k, f in facts.items()}, format=FORMAT)


def _row(key: str, f: Facts) -> Row:
    return [key, f.version, f.mtime, f.ids, list(f.sizes)]


def figures(refs: RefStore, racy: float, now: float
            ) -> Step[tuple[int, dict[bytes, int], int]]:
    """(threads, {checkpoint id prefix: size}, refs read), reading only the refs (and logs)
    whose listed version changed since the summary; writes the new summary."""
    root, found = yield from summary_parts.load(FOLDER, PARTS, "stats", _row_ok, _old)
    taken, known = 0.0, dict[str, Facts]()
    if root is not None:
        taken = root.taken
        rows, root.rows = root.rows, {}
        known = {k: Facts(r[1], r[2], r[3], tuple(r[4])) for k, r in rows.items()}
        del rows
    listed: list[ObjectInfo] = [i for i in (yield List(HEADS)) if is_thread_key(i.key)]
    facts: dict[str, Facts] = {}
    todo = []
    for info in listed:
        f = known.get(info.key)
        if (f is not None and info.version and f.version == info.version
                and f.mtime == info.mtime and f.mtime < taken - racy):
            facts[info.key] = f
        else:
            todo.append(info)
    got_refs = (yield ReadRefs([i.key for i in todo])) if todo else []
    threads = len(facts)
    for info, ref in zip(todo, got_refs, strict=True):
        if ref is None:  # deleted since the listing
            continue
        threads += 1
        head = Head.decode(ref[0], info.key)
        entries = yield from refs.entries(head)
        f = Facts(info.version, info.mtime,
                  b"".join(bytes.fromhex(e.id)[:ID_BYTES] for e in entries),
                  tuple(e.size for e in entries))
        if not refs.backend.ref_version_listed or ref[1] == info.version:
            facts[info.key] = f
        else:  # (written since the listing: not recorded under the version listed)
            facts[info.key + "\0"] = f
    sizes: dict[bytes, int] = {}
    for f in facts.values():
        for n, size in enumerate(f.sizes):
            sizes[f.ids[n * ID_BYTES:(n + 1) * ID_BYTES]] = size
    keep = {k: f for k, f in facts.items() if not k.endswith("\0")}
    if any(i.version for i in listed) and (keep != known or len(found) != 1 or (
            root is not None and root.stale)):
        try:  # (best effort: stats() of a store this process may not write still answers)
            changed = {k for k, f in keep.items() if known.get(k) != f}
            changed.update(k for k in known if k not in keep)
            yield from summary_parts.store(FOLDER, PARTS, "stats", now,
                                           {k: _row(k, f) for k, f in keep.items()}, root, found,
                                           None, changed)
        except StorageError as exc:
            log.warning("stats: could not write its summary (%s): the next stats() reads "
                        "every ref again", exc)
    return threads, sizes, len(todo)
