"""A maintenance summary split into parts by key range (issue 31): gc's and stats' summaries of
what each ref named (``ref_summary.py``, ``stats_summary.py``) grow with the store (~60 bytes a
thread: 60 MB at 1M threads, 6 GB at 100M), so each is a small root naming parts, and a part
holds the rows of the refs of one key range.

Where a part ends is decided by the keys alone, as content-defined chunking does (restic's
chunker, the "prolly trees" of Dolt): a ref key whose BLAKE3 falls under ``2^32 / PART_REFS``
starts a new part, and a part that reaches ``MAX_PART_REFS`` keys without one is cut there (so
ids chosen to dodge the rule make parts no larger than that). Why not fixed ranges by first
character: ref keys are base32 of the thread id, and ASCII ids start with one of about eight
characters (docs/operations/large-stores.md), so most stores would land in one part. Why not
ranges fixed by count when the summary is built: an insertion then shifts every later range
(or the ranges need splitting and merging rules); with cuts taken from the keys a new or removed
ref changes the part it falls in and no other, so a run rewrites only the parts whose refs
changed, and two runs agree on the parts without reading each other's.

Objects (zlib-compressed msgpack, named by the BLAKE3 of their bytes, verified when read):

* the root, ``<folder>/<blake3>``: ``{"v": 2, "kind": kind, "taken": t0, "parts": [[first
  key, blake3 of the part, number of rows], ...], "rows": [...]}``; a summary of at most
  ``INLINE_REFS`` refs keeps its rows in the root itself (one object, one read) and no parts;
* a part, ``<parts folder>/<blake3>``: ``{"v": 2, "kind": kind, "rows": [[key, ...], ...]}``,
  rows sorted by key; its rows must be the root's count, and lie between its first key and
  the next part's;
* the root's ``"delta"``, ``[blake3, rows, gone]`` or absent: a part of the same form (with
  ``"gone": [keys]``) holding the rows that changed since the parts were written, over any
  key range, and the keys deleted since. Changes spread over the keys (1% of a store's threads
  touch every part of 4,096), so a run whose changes (with those already in the delta) are at
  most ``DELTA_SHARE`` of the refs and ``DELTA_REFS`` writes the delta and the root, not the
  parts: its writes grow with what changed. Past that, the parts whose rows changed are
  written again and the delta is dropped (LSM trees merge so). A delta that does not verify
  leaves the parts' rows, older than the refs' versions (so not trusted where they changed).

A part that is missing, damaged, or that does not match what the root says of it is dropped:
its refs are read as if the summary did not know them (the rest of the summary still counts).
The root says nothing else, so a forged part that verifies is caught only as a forged entry
is, by gc's audit (``ref_summary.py``).
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import blake3
import msgpack

from cas_checkpoint.engine.steps import DeleteMany, GetMany, List, PutMany, Step
from cas_checkpoint.errors import FormatError

log = logging.getLogger("cas_checkpoint")

FORMAT = 2
PART_REFS = 4096  # refs a part holds, on average (gc: ~250 KB before compression)
MAX_PART_REFS = 4 * PART_REFS  # ...and at most
INLINE_REFS = 2048  # a summary of at most this many refs is one object
MAX_BYTES = 1 << 30  # an object (decompressed) larger than this is refused unread
DELTA_SHARE = 0.25  # a delta holds at most this share of the refs...
DELTA_REFS = MAX_PART_REFS * 4  # ...and at most this many (else the parts are written again)
READ_BATCH = 4  # parts read in one round (a run holds at most these, and the summary's rows)

Row = list[Any]
RowCheck = Callable[[Row], bool]


def starts_part(key: str) -> bool:
    """Whether ``key`` starts a part (a function of the key alone)."""
    cut = (1 << 32) // PART_REFS
    return int.from_bytes(blake3.blake3(key.encode()).digest()[:4], "big") < cut


def split(keys: list[str]) -> Iterator[list[str]]:
    """Sorted ``keys`` in parts: each starts at a key for which ``starts_part`` holds, or after
    ``MAX_PART_REFS`` keys."""
    part: list[str] = []
    for key in keys:
        if part and (len(part) >= MAX_PART_REFS or starts_part(key)):
            yield part
            part = []
        part.append(key)
    if part:
        yield part


def name_of(folder: str, data: bytes) -> str:
    return f"{folder}/{blake3.blake3(data).hexdigest()}"


def pack(obj: dict[str, Any]) -> bytes:
    return zlib.compress(msgpack.packb(obj, use_bin_type=True), 6)


def unpack(key: str, data: bytes, what: str) -> dict[str, Any]:
    """The checked map behind ``data`` stored at ``key``; FormatError for anything else."""
    if key != name_of(key.rsplit("/", 1)[0], data):
        raise FormatError(f"{key} does not hash to its name")
    try:
        inflate = zlib.decompressobj()
        raw = inflate.decompress(data, MAX_BYTES)
        if inflate.unconsumed_tail or not inflate.eof:
            raise ValueError(f"larger than {MAX_BYTES} bytes, or cut short")
        got = msgpack.unpackb(raw, raw=False, strict_map_key=True, use_list=True)
    except (zlib.error, ValueError, msgpack.UnpackException) as exc:
        raise FormatError(f"{key} is not a {what}: {exc}") from None
    if not isinstance(got, dict):
        raise FormatError(f"{key} is not a {what}")
    return got


@dataclass(slots=True)
class Root:
    """A summary as read: ``rows`` of every part that verified (key -> row); ``parts``: the
    part names the root gives, and ``good`` those read and verified (a run may keep those
    without writing them again); ``bad``: parts dropped (their refs are read)."""

    key: str
    taken: float
    rows: dict[str, Row] = field(default_factory=dict)
    parts: list[str] = field(default_factory=list)
    good: set[str] = field(default_factory=set)
    bad: int = 0
    delta: str | None = None  # the delta part's name (as the root gives it)
    delta_keys: set[str] = field(default_factory=set)  # keys the delta changes or removes
    table: list[Any] = field(default_factory=list)  # [first key, part name, rows] a part
    format: int = FORMAT  # 1: a single-object summary from before the split (rewritten)

    @property
    def stale(self) -> bool:
        """Whether a run must write a new summary even if no row changed."""
        return self.bad > 0 or self.format != FORMAT


def _check_rows(key: str, rows: object, check: RowCheck, lo: str | None, hi: str | None,
                what: str) -> list[Row]:
    if not isinstance(rows, list):
        raise FormatError(f"{key} has malformed rows")
    last = None
    for row in rows:
        if not (isinstance(row, list) and row and isinstance(row[0], str) and check(row)):
            raise FormatError(f"{key} has a malformed {what} entry")
        k = row[0]
        if (last is not None and k <= last) or (lo is not None and k < lo) or (
                hi is not None and k >= hi):
            raise FormatError(f"{key} has an entry out of its key range or order ({k})")
        last = k
    return rows


def read_root(key: str, data: bytes, kind: str, check: RowCheck) -> tuple[Root, list[Any]]:
    """The root at ``key`` (its inline rows in ``Root.rows``) and its part table, checked."""
    got = unpack(key, data, f"{kind} summary")
    taken, parts = got.get("taken"), got.get("parts")
    if got.get("v") != FORMAT or got.get("kind") != kind or not isinstance(taken, float) \
            or not isinstance(parts, list):
        raise FormatError(f"{key} is not a {kind} summary of format {FORMAT}")
    last = None
    for p in parts:
        if not (isinstance(p, list) and len(p) == 3 and isinstance(p[0], str)
                and isinstance(p[1], str) and len(p[1]) == 64 and isinstance(p[2], int)
                and 0 < p[2] <= MAX_PART_REFS and (last is None or p[0] > last)):
            raise FormatError(f"{key} has a malformed part table")
        last = p[0]
    delta = got.get("delta")
    if delta is not None and not (parts and isinstance(delta, list) and len(delta) == 3
                                  and isinstance(delta[0], str) and len(delta[0]) == 64
                                  and all(isinstance(n, int) and 0 <= n <= DELTA_REFS
                                          for n in delta[1:])):
        raise FormatError(f"{key} has a malformed delta")
    root = Root(key, taken, parts=[p[1] for p in parts])
    for row in _check_rows(key, got.get("rows", []), check, None, None, kind):
        root.rows[row[0]] = row
    if parts and root.rows:
        raise FormatError(f"{key} has both parts and rows")
    return root, parts + ([["", *delta]] if delta is not None else [])


def load(folder: str, parts_folder: str, kind: str, check: RowCheck,
         old: Callable[[str, bytes], Root] | None = None,
         requests: dict[str, int] | None = None) -> Step[tuple[Root | None, list[str]]]:
    """The newest root under ``folder`` that verifies, with the rows of each of its parts that
    verifies (None if no root does); and the keys of every root found (the run deletes them
    once it has written its own). ``old`` reads a summary of format 1 (one object)."""
    req = requests if requests is not None else {"list": 0, "get": 0}
    found = sorted((i for i in (yield List(folder)) if i.key.startswith(folder + "/")),
                   key=lambda i: i.mtime, reverse=True)
    req["list"] += 1
    for info in found[:2]:  # the newest, or the one before if a run is writing it now
        if info.size > MAX_BYTES:
            continue
        got: dict[str, bytes | None] = yield GetMany([info.key])
        req["get"] += 1
        data = got.get(info.key)
        if data is None:
            continue
        try:
            try:
                root, table = read_root(info.key, data, kind, check)
            except FormatError:
                if old is None:
                    raise
                return old(info.key, data), [i.key for i in found]
        except FormatError as exc:
            log.warning("%s: %s is ignored, every ref is read and a new summary written (%s)",
                        kind, info.key, exc)
            continue
        delta = table.pop() if table and table[-1][0] == "" else None
        root.table = table
        yield from _read_parts(root, table, parts_folder, kind, check, req)
        if delta is not None:
            yield from _read_delta(root, delta, parts_folder, kind, check, req)
        return root, [i.key for i in found]
    return None, [i.key for i in found]


def _read_parts(root: Root, table: list[Any], parts_folder: str, kind: str, check: RowCheck,
                req: dict[str, int]) -> Step[None]:
    """Each part of ``root``'s ``table`` into ``root.rows``, ``READ_BATCH`` at a time; one that
    does not verify is dropped (``root.bad``)."""
    for start in range(0, len(table), READ_BATCH):
        batch = table[start:start + READ_BATCH]
        keys = [f"{parts_folder}/{p[1]}" for p in batch]
        got: dict[str, bytes | None] = yield GetMany(keys)
        req["get"] += len(keys)
        for n, (p, pkey) in enumerate(zip(batch, keys, strict=True)):
            hi = table[start + n + 1][0] if start + n + 1 < len(table) else None
            try:
                data = got.get(pkey)
                if data is None:
                    raise FormatError(f"{pkey} is missing")
                part = unpack(pkey, data, f"{kind} summary part")
                if part.get("v") != FORMAT or part.get("kind") != kind:
                    raise FormatError(f"{pkey} is not a {kind} summary part")
                rows = _check_rows(pkey, part.get("rows"), check, p[0], hi, kind)
                if len(rows) != p[2] or rows[0][0] != p[0]:
                    raise FormatError(f"{pkey} does not hold the {p[2]} refs from {p[0]!r} "
                                      "its root names")
            except FormatError as exc:
                log.warning("%s: summary part %s is ignored, its refs are read (%s)", kind,
                            pkey, exc)
                root.bad += 1
                continue
            root.good.add(p[1])
            for row in rows:
                root.rows[row[0]] = row
        del got


def _read_delta(root: Root, delta: list[Any], parts_folder: str, kind: str, check: RowCheck,
                req: dict[str, int]) -> Step[None]:
    """The delta over ``root.rows``: its rows replace theirs, its gone keys leave."""
    root.delta = delta[1]
    pkey = f"{parts_folder}/{delta[1]}"
    got: dict[str, bytes | None] = yield GetMany([pkey])
    req["get"] += 1
    try:
        data = got.get(pkey)
        if data is None:
            raise FormatError(f"{pkey} is missing")
        part = unpack(pkey, data, f"{kind} summary delta")
        gone = part.get("gone")
        if part.get("v") != FORMAT or part.get("kind") != kind or not isinstance(gone, list) \
                or not all(isinstance(k, str) for k in gone):
            raise FormatError(f"{pkey} is not a {kind} summary delta")
        rows = _check_rows(pkey, part.get("rows"), check, None, None, kind)
        if (len(rows), len(gone)) != (delta[2], delta[3]):
            raise FormatError(f"{pkey} does not hold the rows its root counts")
    except FormatError as exc:
        log.warning("%s: summary delta %s is ignored, the parts' older rows stand (%s)", kind,
                    pkey, exc)
        root.bad += 1
        return
    root.good.add(delta[1])
    for row in rows:
        root.rows[row[0]] = row
        root.delta_keys.add(row[0])
    for k in gone:
        root.rows.pop(k, None)
        root.delta_keys.add(k)


def store(folder: str, parts_folder: str, kind: str, taken: float, rows: dict[str, Row],
          loaded: Root | None, old_roots: list[str],
          requests: dict[str, int] | None = None,
          changed: set[str] | None = None) -> Step[str]:
    """Write a summary of ``rows`` (key -> row): the parts not already stored and verified
    (``loaded.good``), then its root; then delete the roots before it and the parts no longer
    named. When no root was read (a first run, or one rebuilding a damaged summary) the parts
    folder is listed so that parts a killed run left are deleted. ``changed``: the keys whose
    row differs from ``loaded``'s (changed, new or gone): when they are few, only a delta is
    written (see the module docstring). Returns the root's key."""
    req = requests if requests is not None else {"list": 0, "put": 0, "delete": 0}
    if (changed is not None and loaded is not None and loaded.parts and not loaded.stale
            and len(rows) > INLINE_REFS):
        delta = loaded.delta_keys | changed
        if len(delta) <= min(DELTA_REFS, DELTA_SHARE * len(rows)):
            return (yield from _store_delta(folder, parts_folder, kind, taken, rows, loaded,
                                            old_roots, req, delta))
    table: list[list[Any]] = []
    inline: list[Row] = []
    keys = sorted(rows)
    if len(keys) <= INLINE_REFS:
        inline = [rows[k] for k in keys]
    else:
        for part in split(keys):
            data = pack({"v": FORMAT, "kind": kind, "rows": [rows[k] for k in part]})
            name = name_of(parts_folder, data)
            digest = name.rsplit("/", 1)[1]
            if loaded is None or digest not in loaded.good:
                yield PutMany({name: data})
                req["put"] += 1
            table.append([part[0], digest, len(part)])
    data = pack({"v": FORMAT, "kind": kind, "taken": taken, "parts": table, "rows": inline})
    key = name_of(folder, data)
    yield PutMany({key: data})
    req["put"] += 1
    named = {p[1] for p in table}
    if loaded is not None:
        drop = [f"{parts_folder}/{p}" for p in loaded.parts if p not in named]
    else:
        listed = yield List(parts_folder)
        req["list"] += 1
        drop = [i.key for i in listed if i.key.rsplit("/", 1)[1] not in named]
    if loaded is not None and loaded.delta is not None:
        drop.append(f"{parts_folder}/{loaded.delta}")
    drop += [k for k in old_roots if k != key]
    if drop:
        yield DeleteMany(drop)
        req["delete"] += 1
    return key


def _store_delta(folder: str, parts_folder: str, kind: str, taken: float, rows: dict[str, Row],
                 loaded: Root, old_roots: list[str], req: dict[str, int],
                 delta: set[str]) -> Step[str]:
    """The root naming ``loaded``'s parts as they are, and a delta of the rows of ``delta``."""
    keys = sorted(delta)
    data = pack({"v": FORMAT, "kind": kind, "rows": [rows[k] for k in keys if k in rows],
                 "gone": [k for k in keys if k not in rows]})
    name = name_of(parts_folder, data)
    digest = name.rsplit("/", 1)[1]
    if digest != loaded.delta:
        yield PutMany({name: data})
        req["put"] += 1
    n = sum(k in rows for k in keys)
    data = pack({"v": FORMAT, "kind": kind, "taken": taken, "parts": loaded.table, "rows": [],
                 "delta": [digest, n, len(keys) - n]})
    key = name_of(folder, data)
    yield PutMany({key: data})
    req["put"] += 1
    drop = [k for k in old_roots if k != key]
    if loaded.delta is not None and loaded.delta != digest:
        drop.append(f"{parts_folder}/{loaded.delta}")
    if drop:
        yield DeleteMany(drop)
        req["delete"] += 1
    return key

