"""gc's reading work shared among machines (issue 31, docs/operations/large-stores.md): each of
``of`` workers runs ``gc_mark(shard=i, of=n)``, reads the refs of its share and writes what each
names to a mark; then one process runs ``gc(from_marks=True)``, which deletes.

* A share is the ref keys whose BLAKE3 is ``i - 1`` modulo ``n``: even shares without sampling
  the keys, and a key's share never moves. Each worker lists every ref (a LIST page per 1,000:
  the listing is not split) and reads only its own (the GETs, the decoding, a long thread's
  archive: the work that grows with the store).
* A mark, ``gc/marks/<n>-<i>-<blake3 of its bytes>``, is a gc summary of its share
  (``ref_summary.py``'s rows: each ref's listed version, modified time and the packs it names;
  a long thread's: its archive pack and the packs that lists too), with the storage's clock
  when the worker started. A new mark replaces the older ones of its share and
  every mark of another split.
* The deleter takes one mark of each share of one split, or refuses: a mark missing, damaged,
  of another split, or taken longer than the grace before the deleter's start. It then runs
  ``gc()`` with the marks standing in for its summary, every rule kept: a ref counts as marked
  only while the listing shows it at the very version its mark recorded (a ref written since,
  by a save that landed after the marks, is read again), a ref no mark holds is read, a ref
  modified within ``RACY`` s of its mark is read (local disk), the refs are listed again after
  the packs until none changed, a random sample of the marked refs is re-read before anything
  is deleted (one wrong: every ref is read), and each batch of candidates is listed again
  before it is deleted. A mark is a cache written by gc's own workers, never an authority.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import blake3

from cas_checkpoint.backends import Backend, ObjectInfo
from cas_checkpoint.backends.sealed import unwrap
from cas_checkpoint.engine.refs import HEADS, is_thread_key
from cas_checkpoint.engine.steps import DeleteMany, GetMany, List, PutMany, Step
from cas_checkpoint.errors import FormatError, InvalidArgumentError
from cas_checkpoint.maintenance import gc as gcmod
from cas_checkpoint.maintenance import ref_summary, summary_parts

log = logging.getLogger("cas_checkpoint")

FOLDER = "gc/marks"
FORMAT = 1
MAX_SHARDS = 4096


def share(key: str, of: int) -> int:
    """The share (1..``of``) of a ref key."""
    return int.from_bytes(blake3.blake3(key.encode()).digest()[4:8], "big") % of + 1


def check_shard(shard: object, of: object) -> tuple[int, int]:
    if not isinstance(of, int) or isinstance(of, bool) or not 1 <= of <= MAX_SHARDS:
        raise InvalidArgumentError(f"of must be the number of shares, 1 to {MAX_SHARDS} (the N "
                                   f"of --shard I/N), not {of!r}")
    if not isinstance(shard, int) or isinstance(shard, bool) or not 1 <= shard <= of:
        raise InvalidArgumentError(f"shard must be a share from 1 to of={of} (the I of --shard "
                                   f"I/N), not {shard!r}")
    return shard, of


@dataclass(slots=True)
class MarkReport:
    """What ``gc_mark`` read and wrote: ``key``, the mark; ``refs_read``, the refs of the share
    (``refs_left``: those written or deleted while it read, left to the deleter); ``packs``,
    distinct packs named."""

    url: str
    shard: int
    of: int
    key: str = ""
    storage_now: float = 0.0
    refs_read: int = 0
    refs_left: int = 0
    packs: int = 0
    seconds: float = 0.0
    requests: dict[str, int] = field(default_factory=lambda: {
        "list": 0, "get": 0, "put": 0, "delete": 0})

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "shard": self.shard, "of": self.of, "key": self.key,
                "storage_now": self.storage_now, "refs_read": self.refs_read,
                "refs_left": self.refs_left, "packs": self.packs, "seconds": self.seconds,
                "requests": dict(self.requests)}

    def to_text(self) -> str:
        return (f"gc mark {self.shard}/{self.of} of {self.url}: read {self.refs_read} refs "
                f"naming {self.packs} packs ({self.refs_left} changed meanwhile: left to the "
                f"deleter)"
                f"; wrote {self.key}; {self.seconds:.2f} s; requests "
                + ", ".join(f"{k} {v}" for k, v in self.requests.items())
                + f". When every share 1..{self.of} is marked, run gc(from_marks=True) in one "
                "process")


def _encrypted(backend: Backend) -> None:
    if unwrap(backend) is not backend:
        raise InvalidArgumentError(
            "an encrypted store keeps no gc summary and no marks (they would tell which packs "
            "each hidden ref names): run gc() in one process")


def _name(of: int, shard: int, data: bytes) -> str:
    return f"{FOLDER}/{of}-{shard}-{blake3.blake3(data).hexdigest()}"


def _parse_name(key: str) -> tuple[int, int] | None:
    parts = key.rsplit("/", 1)[-1].split("-")
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    return int(parts[0]), int(parts[1])


def mark(backend: Backend, shard: int, of: int) -> Step[MarkReport]:
    """Read the refs of share ``shard`` of ``of`` and write its mark (see the docstring)."""
    check_shard(shard, of)
    _encrypted(backend)
    started = time.perf_counter()
    out = MarkReport(backend.url, shard, of)
    scratch = gcmod.GCReport(backend.url, True, 0.0)
    scratch.requests = out.requests
    c = gcmod._Collector(backend, scratch, None)
    t0 = out.storage_now = scratch.storage_now = (
        yield from gcmod.storage_now(backend, out.requests))
    listed: list[ObjectInfo] = yield List(HEADS)
    out.requests["list"] += 1 + len(listed) // 1000
    mine = [i for i in listed if is_thread_key(i.key) and share(i.key, of) == shard]
    del listed
    yield from c.mark_heads((yield from c._read(mine)))  # (reads long threads' archives)
    out.refs_read = len(mine)
    out.refs_left = len(mine) - len(c.entries)
    out.packs = len(set().union(*(e.packs for e in c.entries.values())))
    rows = [ref_summary.to_row(k, c.entries[k]) for k in sorted(c.entries)]
    data = summary_parts.pack({"v": FORMAT, "kind": "gc-mark", "taken": t0, "shard": shard,
                               "of": of, "rows": rows})
    out.key = _name(of, shard, data)
    yield PutMany({out.key: data})
    out.requests["put"] += 1
    found: list[ObjectInfo] = yield List(FOLDER)
    out.requests["list"] += 1
    stale = [i.key for i in found if i.key != out.key and (
        (_parse_name(i.key) or (0, 0))[0] != of or (_parse_name(i.key) or (0, 0))[1] == shard)]
    if stale:
        yield DeleteMany(stale)
        out.requests["delete"] += 1
    out.seconds = time.perf_counter() - started
    return out


def _refuse(what: str, of: int | None = None) -> InvalidArgumentError:
    return ref_summary.refuse_marks(what, of)


def load(backend: Backend, requests: dict[str, int]) -> Step[ref_summary.Marks]:
    """One mark of each share of one split, checked (else ``InvalidArgumentError``: nothing is
    deleted), as a summary for ``gc``."""
    _encrypted(backend)
    found: list[ObjectInfo] = yield List(FOLDER)
    requests["list"] += 1
    named = [(i, _parse_name(i.key)) for i in found]
    splits = sorted({n[0] for _, n in named if n is not None})
    if not splits:
        raise _refuse(f"{FOLDER}/ holds no marks")
    if len(splits) > 1:
        raise _refuse("the marks are of different splits (" + ", ".join(
            f"of {n}" for n in splits) + ")", splits[-1])
    of = splits[0]
    newest: dict[int, ObjectInfo] = {}
    for info, n in sorted(named, key=lambda x: x[0].mtime):
        if n is not None and 1 <= n[1] <= of:
            newest[n[1]] = info
    missing = [s for s in range(1, of + 1) if s not in newest]
    if missing:
        raise _refuse(f"no mark of share {', '.join(map(str, missing[:5]))} of {of}", of)
    out = ref_summary.Marks(ref_summary.Summary(float("inf")), [i.key for i in found], of,
                            requests)
    for start in range(0, of, summary_parts.READ_BATCH):
        batch = [newest[s].key for s in range(start + 1, min(of, start
                                                             + summary_parts.READ_BATCH) + 1)]
        got: dict[str, bytes | None] = yield GetMany(batch)
        requests["get"] += len(batch)
        for key in batch:
            _add(out, key, got.get(key), of)
    return out


def _add(out: ref_summary.Marks, key: str, data: bytes | None, of: int) -> None:
    shard = (_parse_name(key) or (0, 0))[1]
    try:
        if data is None:
            raise FormatError("it is gone")
        if key != _name(of, shard, data):
            raise FormatError("it does not hash to its name")
        got = _unpack(data)
        taken = got.get("taken")
        if (got.get("v") != FORMAT or got.get("kind") != "gc-mark" or got.get("of") != of
                or got.get("shard") != shard or not isinstance(taken, float)
                or not isinstance(got.get("rows"), list)):
            raise FormatError("it is not a gc mark of this share")
        rows: Iterable[Any] = got["rows"]
        for row in rows:
            if not (isinstance(row, list) and row and isinstance(row[0], str)
                    and ref_summary._row_ok(row) and share(row[0], of) == shard):
                raise FormatError("it has an entry that is malformed or of another share")
            out.summary.refs[row[0]] = ref_summary.from_row(row)
    except FormatError as exc:
        raise _refuse(f"the mark {key} cannot be used ({exc})", of) from None
    out.summary.taken = min(out.summary.taken, taken)


def _unpack(data: bytes) -> dict[str, Any]:
    """A mark's map (its name checked by the caller: the hash is its last field)."""
    return summary_parts.unpack(summary_parts.name_of(FOLDER, data), data, "gc mark")
