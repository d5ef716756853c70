"""The object kinds stored by cas_checkpoint, as frozen dataclasses, and their byte encodings.
Rule: an object's name is the BLAKE3 of its canonical bytes."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from cas_checkpoint.errors import FormatError
from cas_checkpoint.format.ids import BIG_HASH as BIG_HASH
from cas_checkpoint.format.ids import CheckpointId as CheckpointId
from cas_checkpoint.format.ids import ObjectId as ObjectId
from cas_checkpoint.format.ids import hashed as hashed
from cas_checkpoint.format.ids import inline_id as inline_id
from cas_checkpoint.format.ids import is_object_id as is_object_id
from cas_checkpoint.format.ids import object_id as object_id
from cas_checkpoint.format.ids import object_ids as object_ids
from cas_checkpoint.format.placeholders import read_varint, varint

VERSION = 3  # 3: packs, heads with a checksum, inline objects and pack lists
NODE, RECORD, SEGMENT, HEAD, PACK = b"N", b"C", b"L", b"H", b"P"
ARCHIVE = b"A"  # a long thread's list of archived packs (archive.py)
_HEADERS = {k: b"CAS" + k + bytes([VERSION])
            for k in (NODE, RECORD, SEGMENT, HEAD, PACK, ARCHIVE)}
MAX_META_BYTES = 64 * 1024
# A head copies its newest log entries (up to 15), so every field an entry repeats from its
# record is bounded: 15 entries at their largest (metadata, label, tags, reason, 256 parents;
# ~160 KB each) and a 64 KiB thread id stay well under a head's 4 MB (``heads.MAX_HEAD_BYTES``).
MAX_LABEL = 1024  # characters of a label
MAX_TAGS = 64  # tags of one checkpoint
MAX_TAG = 256  # characters of one tag
MAX_PARENTS = 256  # parents of one checkpoint
# a checkpoint record's bytes, at most: its thread id (64 KiB of UTF-8), parents, label, tags,
# metadata and reason at their bounds and an inline root come to ~230 KB; a reader refuses a
# bigger record by its size, before decoding it (a hostile bundle's record included)
MAX_RECORD_BYTES = 512 * 1024
INLINE_ROOT_MAX = 1024  # a root node encoding to at most this many bytes lives in its record


def object_kind(data: bytes | memoryview) -> bytes:
    """The kind byte of an encoded object; FormatError if the header is wrong."""
    head = bytes(data[:5])
    if len(head) < 5 or head[:3] != b"CAS" or head[3:4] not in _HEADERS:
        raise FormatError(
            f"not a cas_checkpoint object (header {head!r}); the object is corrupt or was not "
            "written by cas_checkpoint"
        )
    if head[4] != VERSION:
        advice = ("upgrade the package" if head[4] > VERSION else
                  "it was written by an older cas_checkpoint (format 2 is cas_checkpoint 0.1's "
                  "layout of one file per object): read it with that version, or start a new "
                  "store")
        raise FormatError(
            f"object format version {head[4]} is not supported by this version of "
            f"cas_checkpoint (it reads version {VERSION}); {advice}"
        )
    return head[3:4]


def unpack(data: bytes | memoryview) -> Any:
    """msgpack bytes as every reader decodes them: UTF-8 strings, str (or bytes) map keys only,
    no extension types, at most 1,024 levels deep. Raises what msgpack raises."""
    return msgpack.unpackb(data, raw=False, strict_map_key=True, max_ext_len=0, use_list=True)


META_NESTING = 3  # containers around an entry's metadata in a head or segment: map, list, entry
# levels of dicts and lists in metadata, at most (a save refuses more): msgpack reads 1,024, but
# Python compares, copies and prints nested values recursively (verify, find, the CLI's JSON)
MAX_META_DEPTH = 64


def unpack_meta(packed: bytes) -> Any:
    """``packed`` metadata decoded as a reader decodes it where it nests deepest (in a head's or
    a segment's log entry): a writer runs it on what it will record (``model.check_meta``), so
    it never records what a reader refuses."""
    return unpack(b"\x91" * META_NESTING + packed)[0][0][0]


def _unpack_body(data: bytes | memoryview, kind: bytes) -> Any:
    if object_kind(data) != kind:
        raise FormatError(f"expected an object of kind {kind!r}, found {object_kind(data)!r}")
    try:
        return unpack(data[5:])
    except Exception as exc:  # msgpack raises many types on hostile input
        raise FormatError(
            f"cannot decode {kind.decode()} object: {exc}; the object is corrupt or was not "
            "written by cas_checkpoint"
        ) from None


def _pack(kind: bytes, body: Any) -> bytes:
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return _HEADERS[kind] + packed


def _bad(what: str) -> FormatError:
    return FormatError(f"malformed object: {what}; the object is corrupt or was not written by "
                       "cas_checkpoint")


def _hex_ids(value: object, what: str, most: int | None = None) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, bytes) and len(v) == 32 for v in value):
        raise _bad(f"{what} must be a list of 32-byte ids")
    if most is not None and len(value) > most:
        raise _bad(f"{what} lists {len(value)} ids, more than {most}")
    return tuple(v.hex() for v in value)


def _bin_id(value: str) -> bytes:
    return bytes.fromhex(value)


# --- state nodes -----------------------------------------------------------------------------


def encode_node(payload: bytes, children: tuple[str, ...] = ()) -> bytes:
    """A state node: ``payload`` is codec bytes that may refer to ``children`` by index."""
    return node_bytes((payload,), children)


def node_bytes(parts: Iterable[bytes | memoryview], children: Sequence[str] = ()) -> bytes:
    """``encode_node`` of the payload ``parts`` joined, in one copy (a big payload is not
    copied again to be joined first)."""
    if not children:
        return b"".join([_LEAF_HEADER, *parts])
    return b"".join([_HEADERS[NODE], varint(len(children)), bytes.fromhex("".join(children)),
                     *parts])


_LEAF_HEADER = _HEADERS[NODE] + varint(0)  # a node without children: no ids follow


def decode_node(data: bytes | memoryview) -> tuple[tuple[ObjectId, ...], memoryview]:
    """(child ids, payload view) of an encoded node."""
    if data[:5] != _HEADERS[NODE]:  # (compared in place: no bytes made for each node)
        object_kind(data)  # a foreign or newer object says so
        raise _bad("expected a state node")
    view = memoryview(data)
    if len(view) > 5 and view[5] == 0:  # no children: the common leaf
        return (), view[6:]
    if len(view) > 5 and view[5] < 0x80:  # under 128 children: a one-byte count
        count, pos = view[5], 6
    else:
        got = read_varint(view, 5, 6)
        if got is None:
            raise _bad("truncated node header")
        count, pos = got
    end = pos + 32 * count
    if end > len(view):
        raise _bad(f"node names {count} children but is only {len(view)} bytes long")
    ids = view[pos:end].hex()  # (one hex string cut in 64s: no bytes made per child)
    children = tuple([ObjectId(ids[i : i + 64]) for i in range(0, len(ids), 64)])
    return children, view[end:]


def decode_nodes(datas: list[bytes | memoryview]) -> list[tuple[tuple[ObjectId, ...],
                                                                  memoryview]]:
    """``decode_node`` of each of ``datas`` (a leaf, the common case, is cut in place)."""
    leaf = _LEAF_HEADER
    out: list[tuple[tuple[ObjectId, ...], memoryview]] = []
    for data in datas:
        if data[:6] == leaf and type(data) is memoryview:
            out.append(((), data[6:]))
        else:
            out.append(decode_node(data))
    return out


# --- log entries and checkpoint records --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogEntry:
    """What a thread's ref log knows of one checkpoint: enough for history/find/count."""

    id: CheckpointId
    parents: tuple[CheckpointId, ...]
    step: int
    created_at: float  # seconds since the epoch, UTC
    size: int  # encoded state bytes
    label: str | None = None
    tags: tuple[str, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)
    status: str | None = None
    kind: str | None = None
    reason: str | None = None

    def pack(self, prev: CheckpointId | None = None) -> list[Any]:
        """The entry as a list; parents are ``nil`` when they are exactly ``(prev,)``, the id of
        the entry before this one in the same container."""
        return [
            _bin_id(self.id),
            None if prev is not None and self.parents == (prev,)
            else [_bin_id(p) for p in self.parents],
            *_described(self),
            *_annotated(self),
        ]

    @staticmethod
    def unpack(raw: object, prev: CheckpointId | None = None) -> LogEntry:
        """Inverse of ``pack(prev)``: ``nil`` parents stand for ``(prev,)``."""
        if type(raw) is not list or not 8 <= len(raw) <= 11:
            raise _bad("log entry must be an 8-item list (up to 11 with status, kind, reason)")
        cid, parents, step, created, size, label, tags, meta = raw[:8]
        if type(cid) is not bytes or len(cid) != 32:
            raise _bad("log entry id must be 32 bytes")
        _check_fields(step, created, size, label, tags, meta)
        status, kind, reason = _check_annotations(raw[8:]) if len(raw) > 8 else _UNANNOTATED
        if parents is None:
            if prev is None:
                raise _bad("the first log entry of a segment or head names its parent by "
                           "back-reference, but there is no entry before it")
            back: tuple[CheckpointId, ...] = (prev,)
        else:
            back = tuple(CheckpointId(p) for p in _hex_ids(parents, "parents", MAX_PARENTS))
        return LogEntry(CheckpointId(cid.hex()), back, step, float(created), size, label,
                        tuple(tags), meta, status, kind, reason)


def _pack_entries(entries: tuple[LogEntry, ...]) -> list[list[Any]]:
    """Entries of one container, each naming its parent by back-reference where it can."""
    out, prev = [], None
    for e in entries:
        out.append(e.pack(prev))
        prev = e.id
    return out


def _list_header(n: int) -> bytes:
    """msgpack's header of an array of ``n`` items."""
    if n < 16:
        return bytes([0x90 | n])
    return b"\xdc" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xdd" + n.to_bytes(4, "big")


_PACKED: dict[tuple[int, CheckpointId | None], tuple[LogEntry, bytes]] = {}
PACKED_MAX = 4096  # log entries whose bytes are remembered (a head's tail holds up to 15)


def _packed_entries(entries: tuple[LogEntry, ...]) -> bytes:
    """``msgpack.packb(_pack_entries(entries))``, each entry's bytes remembered for the very
    same ``LogEntry`` object (kept alive with them, so its identity is not reused) after the
    same predecessor. An entry's fields are immutable but for its metadata dict, which is the
    caller's: the bytes are those of the first encoding, made by the save that wrote the
    entry's record, so the head's copy of an entry keeps matching its record even if the
    caller changes that dict afterwards."""
    parts = [_list_header(len(entries))]
    prev: CheckpointId | None = None
    for entry in entries:
        key = (id(entry), prev)
        got = _PACKED.get(key)
        if got is not None and got[0] is entry:
            parts.append(got[1])
        else:
            data: bytes = msgpack.packb(entry.pack(prev), use_bin_type=True)
            if len(_PACKED) >= PACKED_MAX:
                _PACKED.clear()
            _PACKED[key] = (entry, data)
            parts.append(data)
        prev = entry.id
    return b"".join(parts)


def _unpack_entries(raw: list[Any]) -> tuple[LogEntry, ...]:
    out: list[LogEntry] = []
    for item in raw:
        out.append(LogEntry.unpack(item, out[-1].id if out else None))
    return tuple(out)


def _described(x: LogEntry | Record) -> list[Any]:
    """The fields a log entry repeats from its record, in their stored order."""
    return [x.step, x.created_at, x.size, x.label, list(x.tags), x.metadata]


STATUSES = ("in_progress", "completed", "failed", "halted")
KINDS = ("automatic", "manual", "pre_operation", "recovery")
MAX_REASON = 4096  # characters of a failed/halted checkpoint's reason


def _annotated(x: LogEntry | Record) -> list[Any]:
    """Status, kind and reason, as stored: trailing unset ones are left out (none set: the
    bytes of a checkpoint from before these fields existed)."""
    out = [x.status, x.kind, x.reason]
    while out and out[-1] is None:
        out.pop()
    return out


_UNANNOTATED = (None, None, None)


def _check_annotations(raw: list[Any]) -> tuple[str | None, str | None, str | None]:
    """The optional trailing items of an entry or record, checked (nothing else goes past)."""
    if not raw:  # (most entries: none set)
        return _UNANNOTATED
    if raw[-1] is None:
        raise _bad("a trailing status/kind/reason item is nil (it is left out when unset)")
    status, kind, reason = [*raw, None, None, None][:3]
    if status is not None and status not in STATUSES:
        raise _bad(f"status must be one of {', '.join(STATUSES)} or nil")
    if kind is not None and kind not in KINDS:
        raise _bad(f"kind must be one of {', '.join(KINDS)} or nil")
    if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_REASON):
        raise _bad(f"reason must be a string of at most {MAX_REASON} characters or nil")
    return status, kind, reason


MAX_STEP = (1 << 62) - 1
MAX_TIME = 253402300799.0  # 9999-12-31T23:59:59Z: the last second a datetime can hold


def _check_fields(step: object, created: object, size: object, label: object, tags: object,
                  meta: object) -> None:
    # (decoded msgpack only: its ints, floats, strs, lists and dicts are those exact types, so
    # a type() test is isinstance's without bool; one test a field, every entry of a head)
    if type(step) is not int or not 0 <= step <= MAX_STEP:
        raise _bad(f"step must be an int in [0, {MAX_STEP}]")
    if (type(created) is not float and type(created) is not int
            or not 0 <= created <= MAX_TIME):  # also refuses nan and inf
        raise _bad("created_at must be a time between 1970 and 9999, in seconds")
    if type(size) is not int or not 0 <= size <= MAX_STEP:
        raise _bad("size must be a non-negative int")
    if label is not None and (type(label) is not str or len(label) > MAX_LABEL):
        raise _bad(f"label must be a string of at most {MAX_LABEL} characters or nil")
    if type(tags) is not list or tags and (len(tags) > MAX_TAGS or not all(
            type(t) is str and len(t) <= MAX_TAG for t in tags)):
        raise _bad(f"tags must be a list of at most {MAX_TAGS} strings of at most {MAX_TAG} "
                   "characters")
    if type(meta) is not dict:
        raise _bad("metadata must be a map with string keys")
    if meta:
        for key in meta:
            if type(key) is not str:
                raise _bad("metadata must be a map with string keys")
        if _too_deep(meta):
            raise _bad(f"metadata must nest at most {MAX_META_DEPTH} levels of maps and lists")


def _too_deep(meta: dict[str, Any]) -> bool:
    """Whether ``meta`` nests more than ``MAX_META_DEPTH`` levels (what a save refuses): a
    reader refuses it too, so nothing past the bound reaches code that compares, copies or
    prints values recursively. Iterative; a flat dict costs one pass over its values."""
    todo: list[tuple[Any, int]] = [(meta, 1)]
    while todo:
        value, depth = todo.pop()
        items = value.values() if type(value) is dict else value
        for item in items:
            if type(item) is dict or type(item) is list:
                if depth >= MAX_META_DEPTH:
                    return True
                todo.append((item, depth + 1))
    return False


def bad_text(text: str) -> str | None:
    """What makes ``text`` unstorable (a lone surrogate: not UTF-8), or None. A decoded string
    is always UTF-8; a writer asks before it records a string."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"holds a lone surrogate {text[exc.start]!r} at index {exc.start} (not valid "
                "Unicode)")
    return None


def inlinable(node: bytes) -> bool:
    """Whether a root node's encoding can be stored inside its checkpoint record."""
    return (5 < len(node) <= INLINE_ROOT_MAX and node[:5] == _HEADERS[NODE]
            and len(node) - 5 != 32)  # a 32-byte root field is an id


@dataclass(frozen=True, slots=True)
class Record:
    """A checkpoint record. Its ObjectId is the checkpoint id; it names parents and state root
    by hash, so an id covers the whole history behind it.

    ``root`` is always the root node's id. ``root_node`` is the root node's full encoding
    (header included) when the record holds it inline (see ``inlinable``); that node is then
    not stored as an object of its own."""

    thread_id: str
    parents: tuple[CheckpointId, ...]
    root: ObjectId
    step: int
    created_at: float
    size: int
    label: str | None = None
    tags: tuple[str, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)
    root_node: bytes | None = None
    status: str | None = None
    kind: str | None = None
    reason: str | None = None

    def encode(self) -> bytes:
        if self.root_node is None:
            root = _bin_id(self.root)
        elif not inlinable(self.root_node):
            raise ValueError("root_node is not a state node that fits in a record; pass "
                             "root_node=None and store the node as an object")
        elif inline_id(self.root_node) != self.root:
            raise ValueError("root_node does not hash to root")
        else:
            root = self.root_node[5:]
        data = _pack(RECORD, [
            self.thread_id,
            [_bin_id(p) for p in self.parents],
            root,
            *_described(self),
            *_annotated(self),
        ])
        if len(data) > MAX_RECORD_BYTES:  # (the bounds on each field keep it far below)
            raise ValueError(f"a checkpoint record of {len(data)} bytes is more than a reader "
                             f"reads ({MAX_RECORD_BYTES})")
        return data

    def entry(self, cid: CheckpointId) -> LogEntry:
        return LogEntry(cid, self.parents, self.step, self.created_at, self.size, self.label,
                        self.tags, self.metadata, self.status, self.kind, self.reason)

    def children(self) -> tuple[ObjectId, ...]:
        """The stored state nodes this record names directly: its root, or the children of
        its inline root."""
        if self.root_node is None:
            return (self.root,)
        return decode_node(self.root_node)[0]

    @staticmethod
    def decode(data: bytes | memoryview) -> Record:
        if len(data) > MAX_RECORD_BYTES:
            raise _bad(f"a checkpoint record is at most {MAX_RECORD_BYTES} bytes, this one is "
                       f"{len(data)}")
        body = _unpack_body(data, RECORD)
        if not isinstance(body, list) or not 9 <= len(body) <= 12:
            raise _bad("checkpoint record must be a 9-item array (up to 12 with status, kind, "
                       "reason)")
        thread, parents, root, step, created, size, label, tags, meta = body[:9]
        if not isinstance(thread, str):
            raise _bad("record thread must be a string")
        if not isinstance(root, bytes) or not 0 < len(root) <= INLINE_ROOT_MAX - 5:
            raise _bad("record state root must be a 32-byte id or an inline node of at most "
                       f"{INLINE_ROOT_MAX - 5} bytes")
        _check_fields(step, created, size, label, tags, meta)
        status, kind, reason = _check_annotations(body[9:])
        node = None
        if len(root) == 32:
            oid = ObjectId(root.hex())
        else:
            node = _HEADERS[NODE] + root
            try:
                decode_node(node)
            except FormatError:
                raise _bad("the state root stored inside the record is not a valid state "
                           "node") from None
            oid = object_id(node)
        return Record(
            thread, tuple(CheckpointId(p) for p in _hex_ids(parents, "parents", MAX_PARENTS)),
            oid, step,
            float(created), size, label, tuple(tags), meta, node, status, kind, reason,
        )


# --- ref log segments and heads ----------------------------------------------------------------


_LEVEL0 = b"\x82\xa1v\x00\xa1e"  # a level-0 segment's map up to its entries


@dataclass(frozen=True, slots=True)
class Segment:
    """An immutable piece of a thread's log: level 0 holds entries, higher levels child ids."""

    level: int
    entries: tuple[LogEntry, ...] = ()
    children: tuple[ObjectId, ...] = ()

    def encode(self) -> bytes:
        if self.level == 0:  # msgpack.packb({"v": 0, "e": _pack_entries(entries)}), its
            # entries' bytes those the head's tail already packed (``_packed_entries``)
            return b"".join((_HEADERS[SEGMENT], _LEVEL0, _packed_entries(self.entries)))
        return _pack(SEGMENT, {"v": self.level, "c": [_bin_id(c) for c in self.children]})

    @staticmethod
    def decode(data: bytes | memoryview) -> Segment:
        body = _unpack_body(data, SEGMENT)
        if not isinstance(body, dict) or not isinstance(body.get("v"), int):
            raise _bad("segment must be a map with a level")
        level = body["v"]
        if level == 0 and isinstance(body.get("e"), list) and len(body) == 2:
            return Segment(0, entries=_unpack_entries(body["e"]))
        if 0 < level < 64 and len(body) == 2 and "c" in body:
            return Segment(level, children=tuple(ObjectId(c)
                                                 for c in _hex_ids(body["c"], "children")))
        raise _bad("segment has the wrong shape")
