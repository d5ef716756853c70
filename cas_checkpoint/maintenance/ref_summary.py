"""What each ref named at the last gc run, kept in the store so the next run reads only the refs
that changed since (issue 31; ARCHITECTURE.md invariant 14).

The summary is a root, ``gc/summary/<blake3 of its bytes>``, naming parts, ``gc-parts/<blake3>``,
each the refs of one key range (``summary_parts.py``: a part is rewritten only when its refs
changed, and a part that does not verify costs the reading of its refs, not of every ref); a
row is ``[key, version, mtime, the 32-byte ids of the packs the ref names, concatenated]``
(zlib-compressed msgpack: the standard library's, so a gc of a plain store imports no zstd).
A summary of format 1, one object of ``{"v": 1, "taken": t0, "packs": [pack ids], "refs":
[[key, version, mtime, [pack indexes]]]}`` (before the split), is still read, and replaced.
It is a cache, never an authority:

* it is verified when read (its name is the hash of its bytes; every field is type- and
  size-checked); anything wrong and it is ignored (and rebuilt by the run), as is a missing one;
  a part that is wrong is ignored alone (its refs are read);
* an entry is used only while the listing shows the ref at the very version recorded
  (``ObjectInfo.version``: S3's ETag; on local disk inode, size and the nanosecond modified
  *and change* times: ``os.utime`` can put a modified time back, not a change time). A storage
  whose listing gives no version (memory://) reads every ref, as before;
* where the version is not the content's own (local disk: times, not S3's ETag), an entry
  whose ref was modified within ``RACY`` seconds of the run that wrote it is not trusted
  (git's "racily clean" index entries): a file rewritten in the same clock tick with the same
  size could show the same times, so such a ref is read again;
* each run also re-reads a random sample of the entries it trusts (``audit_size``), and one
  that disagrees with its ref throws the whole summary away: every ref is read.

What the summary cannot do is prove that no forged entry lies about a ref nobody sampled: one
who can write ``gc/summary/`` can as well delete packs. Keep the bucket's write permission to
the store's writers and gc (docs/operations/large-stores.md).
"""

from __future__ import annotations

import logging
import math
import secrets
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field

import blake3
import msgpack

from cas_checkpoint.backends import ObjectInfo
from cas_checkpoint.engine.steps import DeleteMany, PutMany, Step
from cas_checkpoint.errors import FormatError, InvalidArgumentError
from cas_checkpoint.maintenance import summary_parts
from cas_checkpoint.maintenance.summary_parts import Root, Row

log = logging.getLogger("cas_checkpoint")

FOLDER = "gc/summary"
PARTS = "gc-parts"
FORMAT = 1  # the single-object summary (read, never written)
ID_BYTES = 32
RACY = 2.0  # seconds: a ref modified this close to the run that recorded it is read again
AUDIT_MIN = 32  # entries re-read each run to check the summary, at least...
AUDIT_SHARE = 1000  # ...or one in this many


@dataclass(slots=True)
class Entry:
    version: str
    mtime: float
    packs: frozenset[str]


@dataclass(slots=True)
class Summary:
    """ref key -> what it named when its listing showed ``version``; ``taken``: the storage's
    clock at the start of the run that wrote it."""

    taken: float = 0.0
    refs: dict[str, Entry] = field(default_factory=dict)
    root: Root | None = None  # as read: its parts (those verified are not written again)

    def trusted(self, info: ObjectInfo, racy: float) -> Entry | None:
        """The entry for a listed ref, if it may stand in for reading the ref."""
        entry = self.refs.get(info.key)
        if (entry is None or not info.version or entry.version != info.version
                or entry.mtime != info.mtime or entry.mtime >= self.taken - racy):
            return None
        return entry


@dataclass(slots=True)
class Marks:
    """The marks of a sharded gc's workers (``gc_marks.py``), as a summary: ``summary.taken``
    is the oldest mark's start; ``keys``, every mark found (deleted after the run); ``of``, the
    number of shares."""

    summary: Summary
    keys: list[str]
    of: int
    requests: dict[str, int] = field(default_factory=lambda: {"list": 0, "get": 0})

    def check_age(self, now: float, grace: float) -> None:
        """Refuse marks taken longer than ``grace`` before ``now`` (the deleter's start, by
        the storage's clock)."""
        if now - self.summary.taken > grace:
            raise refuse_marks(f"the oldest mark was taken {now - self.summary.taken:.0f} s "
                               f"before this run, more than the {grace:g} s grace (--grace)",
                               self.of)


def refuse_marks(what: str, of: int | None = None) -> InvalidArgumentError:
    n = of or "N"
    return InvalidArgumentError(f"gc from marks refused: {what}; run gc_mark(shard=i, of={n}) "
                                f"for each share i from 1 to {n}, then gc(from_marks=True) "
                                "again. Nothing was deleted")


def key_of(data: bytes) -> str:
    return f"{FOLDER}/{blake3.blake3(data).hexdigest()}"


def encode(taken: float, refs: dict[str, Entry]) -> bytes:
    table: dict[str, int] = {}
    rows = []
    for key in sorted(refs):
        e = refs[key]
        rows.append([key, e.version, e.mtime,
                     [table.setdefault(p, len(table)) for p in sorted(e.packs)]])
    raw = msgpack.packb({"v": FORMAT, "taken": taken, "packs": list(table), "refs": rows},
                        use_bin_type=True)
    return zlib.compress(raw, 6)


def decode(key: str, data: bytes) -> Summary:
    """A summary's bytes, checked; FormatError for anything that is not one gc wrote."""
    if key != key_of(data):  # (in FOLDER, and hashing to its name)
        raise FormatError(f"{key} does not hash to its name")
    got = summary_parts.unpack(key, data, "gc summary")
    if got.get("v") != FORMAT:
        raise FormatError(f"{key} is not a gc summary of format {FORMAT}")
    taken, packs, rows = got.get("taken"), got.get("packs"), got.get("refs")
    if (not isinstance(taken, float) or not isinstance(packs, list)
            or not isinstance(rows, list) or not all(isinstance(p, str) for p in packs)):
        raise FormatError(f"{key} has malformed fields")
    out = Summary(taken)
    for row in rows:
        if not (isinstance(row, list) and len(row) == 4 and isinstance(row[0], str)
                and isinstance(row[1], str) and isinstance(row[2], float)
                and isinstance(row[3], list)
                and all(isinstance(i, int) and 0 <= i < len(packs) for i in row[3])):
            raise FormatError(f"{key} has a malformed entry")
        out.refs[row[0]] = Entry(row[1], row[2], frozenset(packs[i] for i in row[3]))
    return out


def newest(listed: Iterable[ObjectInfo], folder: str = FOLDER) -> list[ObjectInfo]:
    """The summaries under ``folder`` (gc's: ``gc/summary/``), newest first."""
    return sorted((i for i in listed if i.key.startswith(folder + "/")),
                  key=lambda i: i.mtime, reverse=True)


def audit_size(trusted: int) -> int:
    return min(trusted, max(AUDIT_MIN, math.ceil(trusted / AUDIT_SHARE)))


def audit_sample(keys: list[str]) -> list[str]:
    """A random sample of the trusted keys, not one a summary's author can predict."""
    n = audit_size(len(keys))
    rng = secrets.SystemRandom()
    return rng.sample(keys, n) if n < len(keys) else list(keys)


# --- rows of the split summary -------------------------------------------------------------


def _row_ok(row: Row) -> bool:
    return (len(row) == 4 and isinstance(row[1], str) and isinstance(row[2], float)
            and isinstance(row[3], bytes) and len(row[3]) % ID_BYTES == 0)


def to_row(key: str, e: Entry) -> Row:
    return [key, e.version, e.mtime, b"".join(bytes.fromhex(p) for p in sorted(e.packs))]


def from_row(row: Row) -> Entry:
    ids = row[3]
    return Entry(row[1], row[2], frozenset(ids[i:i + ID_BYTES].hex()
                                           for i in range(0, len(ids), ID_BYTES)))


def _old(key: str, data: bytes) -> Root:
    """A summary of format 1, as a root holding its rows."""
    got = decode(key, data)
    return Root(key, got.taken, {k: to_row(k, e) for k, e in got.refs.items()}, format=FORMAT)


# --- as steps: read the newest summary, write a new one ------------------------------------


def load(requests: dict[str, int]) -> Step[tuple[Summary | None, list[str]]]:
    """The newest summary that verifies (None if none does), and the keys of every summary
    found (the run deletes them once it has written its own)."""
    root, found = yield from summary_parts.load(FOLDER, PARTS, "gc", _row_ok, _old, requests)
    if root is None:
        return None, found
    out = Summary(root.taken, root=root)
    rows, root.rows = root.rows, {}
    for key, row in rows.items():
        out.refs[key] = from_row(row)
    return out, found


def store(taken: float, refs: dict[str, Entry], old: list[str],
          requests: dict[str, int], loaded: Summary | None = None) -> Step[str]:
    """Write the summary of this run (the parts that changed, then the root), then delete the
    ones before it; returns its key."""
    rows = {k: to_row(k, e) for k, e in refs.items()}
    changed = None
    if loaded is not None:
        changed = {k for k, e in refs.items() if loaded.refs.get(k) != e}
        changed.update(k for k in loaded.refs if k not in refs)
    return (yield from summary_parts.store(FOLDER, PARTS, "gc", taken, rows,
                                           loaded.root if loaded is not None else None, old,
                                           requests, changed))


def put_replacing(key: str, data: bytes, old: list[str]) -> Step[bool]:
    """Write a summary, then delete the ones before it (True if there were any)."""
    yield PutMany({key: data})
    stale = [k for k in old if k != key]
    if stale:
        yield DeleteMany(stale)
    return bool(stale)
