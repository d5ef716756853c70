"""Store-level fuzzing: objects and refs replaced by random or mutated bytes, and hostile objects
stored under their true names (so decoding is reached, not just the hash check). ``load``, ``get``
and ``history`` must raise a CasError or return the original state; ``verify`` must not raise
and must see every changed object. Nothing may crash or hang."""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import blake3
import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cas_checkpoint import CasError, CheckpointStore
from cas_checkpoint.engine.object_store import pack_key
from cas_checkpoint.engine.refs import thread_key
from cas_checkpoint.engine.staging import make_pack
from cas_checkpoint.format.heads import Head, PackRef, Peak
from cas_checkpoint.format.objects import (
    LogEntry,
    ObjectId,
    Record,
    Segment,
    encode_node,
    object_id,
)
from cas_checkpoint.format.pack import decode_pack

FUZZ = settings(max_examples=int(os.environ.get("CAS_FUZZ_EXAMPLES", "40")), deadline=5000,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def _base() -> tuple[dict[str, bytes], dict[str, Any], dict[str, str], tuple[PackRef, ...]]:
    """A small store's files (packs and refs), each checkpoint's state by id, each thread's
    head, and the packs thread "a" names."""
    store = CheckpointStore.open(f"memory://fuzz-base-{uuid.uuid4().hex[:8]}")
    store.refs.inline_max = 1  # every object in a pack
    states: dict[str, Any] = {}
    for i in range(18):  # one log segment and a tail
        st_ = {"messages": [{"role": "user", "content": f"m{j}"} for j in range(i % 4)],
               "step": i, "when": datetime(2026, 1, 1, tzinfo=UTC), "d": Decimal(i),
               "t": (i, {"x"}), "blob": b"\x00" * (i * 7)}
        states[store.save("a", st_, label=f"l{i}", tags=["t"], metadata={"i": i}).id] = st_
    first = store.history("a")[-3].id
    store.fork("a", first, "b")
    states[store.save("b", {"forked": True}).id] = {"forked": True}
    keys = [i.key for i in [*store.backend.list("packs"), *store.backend.list("refs")]]
    files = {k: v for k, v in store.backend.get_many(keys).items() if v is not None}
    heads = {t: str(store.head(t)) for t in store.threads()}
    ref = store.refs.read("a")
    assert ref is not None
    return files, states, heads, ref.head.packs


FILES, STATES, HEADS, A_PACKS = _base()
NAMED = {pack_key(p.id) for p in A_PACKS} | {
    pack_key(p.id) for p in Head.decode(FILES[thread_key("b")]).packs}
KEYS = sorted(FILES)


_LAST: list[CheckpointStore] = []


def _copy() -> CheckpointStore:
    """A fresh copy of the base store. memory:// is one process-wide dict that listing scans
    whole, so the previous copy is removed first (else every example gets slower)."""
    while _LAST:
        old = _LAST.pop()
        old.backend.fs.rm(old.backend.root, recursive=True)  # type: ignore[attr-defined]
    store = CheckpointStore.open(f"memory://fuzz-{uuid.uuid4().hex}")
    store.backend.put_many(FILES)
    _LAST.append(store)
    _NEW.clear()
    return store


def _put(store: CheckpointStore, key: str, data: bytes) -> None:
    store.backend.delete_many([key])
    store.backend.put_many({key: data})


def _exercise(store: CheckpointStore) -> None:
    """Every read either raises CasError or returns exactly what was saved."""
    for thread in ("a", "b", "h"):
        try:
            cp = store.load(thread)
        except CasError:
            pass
        else:  # "h" holds hostile checkpoints: whatever they decode to is theirs
            assert thread == "h" or (cp.id in STATES and cp.state == STATES[cp.id])
        try:
            store.history(thread)
        except CasError:
            pass
    for cid, expected in STATES.items():
        try:
            got = store.get(cid)  # type: ignore[arg-type]
        except CasError:
            continue
        assert got.state == expected
    store.verify(deep=True)  # must not raise: problems go into the report


@st.composite
def damage(draw: st.DrawFn) -> tuple[str, bytes]:
    key = draw(st.sampled_from(KEYS))
    data = FILES[key]
    how = draw(st.sampled_from(["random", "flip", "truncate", "extend", "other", "splice"]))
    if how == "random":
        new = draw(st.binary(max_size=300))
    elif how == "flip":
        at = draw(st.integers(0, len(data) - 1))
        new = data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1:]
    elif how == "truncate":
        new = data[:draw(st.integers(0, len(data) - 1))]
    elif how == "extend":
        new = data + draw(st.binary(min_size=1, max_size=20))
    elif how == "other":
        new = FILES[draw(st.sampled_from(KEYS))]
    else:
        at = draw(st.integers(0, len(data)))
        new = data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
    return key, new


@FUZZ
@given(damage())
def test_damaged_bytes_never_come_back_as_state(hit: tuple[str, bytes]) -> None:
    key, new = hit
    store = _copy()
    _put(store, key, new)
    _exercise(store)
    if key in NAMED and new != FILES[key]:  # (a pack no ref names is garbage: not checked)
        report = store.verify(deep=True)
        assert any(p.path.startswith(key) for p in report.problems), report.to_text()


# --- hostile objects under their true names ----------------------------------------------------

json_like = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False)
    | st.text(max_size=10) | st.binary(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner,
                                                                max_size=4),
    max_leaves=12)


def _body(kind: bytes) -> st.SearchStrategy[bytes]:
    header = b"CAS" + kind + b"\x03"
    keys = {b"L": "vec"}.get(kind, "")
    shaped = st.fixed_dictionaries({k: json_like for k in keys}) if keys else json_like
    return st.one_of(
        st.binary(max_size=200).map(lambda b: header + b),
        shaped.map(lambda v: header + msgpack.packb(v, use_bin_type=True)),
        st.binary(max_size=60),
    )


def _real(kind: bytes) -> list[bytes]:
    """Every stored object of one kind (from the base store's packs)."""
    return sorted(d for k in KEYS if k.startswith("packs/") for d in map(
        bytes, decode_pack(FILES[k]).values()) if d[3:4] == kind)


@st.composite
def hostile_record(draw: st.DrawFn) -> bytes:
    """Random bytes, a random 9-item array (a record's shape), or a real record with one field
    replaced: the last two reach every field check of the decoder."""
    how = draw(st.sampled_from(["body", "shaped", "mutated"]))
    if how == "body":
        return draw(_body(b"C"))
    if how == "shaped":
        fields = draw(st.lists(json_like, min_size=9, max_size=9))
    else:
        fields = msgpack.unpackb(draw(st.sampled_from(_real(b"C")))[5:])
        fields[draw(st.integers(0, 8))] = draw(json_like)
    return b"CASC\x03" + msgpack.packb(fields, use_bin_type=True)


@st.composite
def hostile_head(draw: st.DrawFn) -> bytes:
    """A ref for thread "h": random bytes (most fail the checksum), or a body with a valid
    checksum (so the decoder is reached): a random map of the head's keys, or a real head with
    one field replaced."""
    how = draw(st.sampled_from(["body", "shaped", "mutated"]))
    if how == "body":
        return draw(_body(b"H"))
    if how == "shaped":
        raw = draw(st.fixed_dictionaries({k: json_like for k in "thspekig"}))
    else:
        raw = msgpack.unpackb(FILES[thread_key("a")][37:])
        raw["t"] = "h"
        raw[draw(st.sampled_from(sorted(raw)))] = draw(json_like)
    body = msgpack.packb(raw, use_bin_type=True)
    return b"CASH\x03" + blake3.blake3(body).digest() + body


def _existing_ids() -> list[str]:
    return sorted({oid for k in KEYS if k.startswith("packs/") for oid in decode_pack(FILES[k])})


@st.composite
def hostile_node(draw: st.DrawFn) -> bytes:
    if draw(st.booleans()):
        return draw(_body(b"N"))
    kids = draw(st.lists(st.sampled_from(_existing_ids()) | st.binary(min_size=32, max_size=32)
                         .map(bytes.hex), max_size=5))
    payload = draw(st.binary(max_size=80) | json_like.map(
        lambda v: bytes([0]) + msgpack.packb(v, use_bin_type=True)))
    return encode_node(payload, tuple(kids))


_NEW: list[PackRef] = []  # packs installed for thread "h" by the current example


def _install(store: CheckpointStore, objects: list[bytes]) -> list[str]:
    """Store hostile objects under their true names, in a pack the next ``_ref`` names."""
    ids = [object_id(d) for d in objects]
    ref, data = make_pack({ObjectId(i): d for i, d in zip(ids, objects, strict=True)}, 0)
    _put(store, pack_key(ref.id), data)
    _NEW.append(ref)
    return ids


def _ref(store: CheckpointStore, head: Head | bytes) -> None:
    """Thread "h": ``head``, naming thread a's packs and the hostile ones installed."""
    if isinstance(head, Head):
        head = Head(head.thread_id, head.head, head.head_step, head.peaks, head.tail,
                    (*A_PACKS, *_NEW), (), b"12345678").encode()
    _NEW.clear()
    _put(store, thread_key("h"), head)


@FUZZ
@given(hostile_node(), st.integers(0, 3))
def test_hostile_state_nodes(node: bytes, depth: int) -> None:
    store = _copy()
    oid = _install(store, [node])[0]
    for _ in range(depth):  # wrap it in valid interior nodes
        oid = _install(store, [encode_node(b"\x00\x91\xd4\x01\x00", (oid,))])[0]
    record = Record("h", (), oid, 0, 1.0, 10).encode()  # type: ignore[arg-type]
    cid = _install(store, [record])[0]
    _ref(store, Head("h", cid, 0, (), (Record.decode(record).entry(cid),)))  # type: ignore[arg-type]
    _exercise(store)
    try:
        store.load("h")
    except CasError:
        pass


@FUZZ
@given(hostile_record())
def test_hostile_records(record: bytes) -> None:
    store = _copy()
    cid = _install(store, [record])[0]
    entry = LogEntry(cid, (), 0, 1.0, 1)  # type: ignore[arg-type]
    _ref(store, Head("h", cid, 0, (), (entry,)))  # type: ignore[arg-type]
    _exercise(store)
    try:
        store.get(cid)  # type: ignore[arg-type]
    except CasError:
        pass
    report = store.verify(deep=True)
    assert not report.ok


@FUZZ
@given(st.lists(_body(b"L"), min_size=1, max_size=3), st.integers(0, 3), st.integers(0, 40))
def test_hostile_segments(segments: list[bytes], level: int, count: int) -> None:
    store = _copy()
    ids = _install(store, segments)
    top = Segment(level + 1, children=tuple(ids)).encode()  # type: ignore[arg-type]
    peaks = (Peak(ids[0], level, count), Peak(_install(store, [top])[0], level + 1, count))  # type: ignore[arg-type]
    _ref(store, Head("h", HEADS["a"], 0, peaks, ()))  # type: ignore[arg-type]
    _exercise(store)
    assert not store.verify(deep=True).ok


@FUZZ
@given(hostile_head())
def test_hostile_heads(head: bytes) -> None:
    store = _copy()
    _ref(store, head)
    _exercise(store)
    try:  # a ref gc cannot read stops it; one it can read must not cost others their packs
        store.gc(grace=timedelta(0))
    except CasError:
        pass
    assert NAMED <= {i.key for i in store.backend.list("packs")}
    for thread in ("a", "b"):
        assert STATES[store.load(thread).id] == store.load(thread).state


@pytest.mark.parametrize("fanout", [16, 64])
def test_segment_dag_bomb_does_not_explode(fanout: int) -> None:
    """Segments that name the same child many times on many levels must not be walked
    exponentially (each level multiplies the entries by ``fanout``)."""
    store = _copy()
    leaf_entries = tuple(LogEntry(HEADS["a"], (), 0, 1.0, 1) for _ in range(16))  # type: ignore[arg-type]
    oid = _install(store, [Segment(0, entries=leaf_entries).encode()])[0]
    for level in range(1, 8):
        oid = _install(store, [Segment(level, children=(oid,) * fanout).encode()])[0]  # type: ignore[arg-type]
    _ref(store, Head("h", HEADS["a"], 0, (Peak(oid, 7, 16 * fanout ** 7),), ()))  # type: ignore[arg-type]
    for call in (lambda: store.history("h", limit=5), lambda: store.load("h"),
                 lambda: store.verify()):
        try:
            call()
        except CasError:
            pass


def test_a_ref_damaged_into_the_sealed_magic_is_reported_not_raised() -> None:
    """A plain store's ref whose bytes came to begin ``CASE`` (one flipped byte: the head
    magic's kind ``H`` to ``E``) is a damaged ref in verify's report, not an error telling
    to open the store with a key (found by test_damaged_bytes_never_come_back_as_state)."""
    key = "refs/heads/me"
    store = _copy()
    data = FILES[key]
    _put(store, key, data[:3] + b"E" + data[4:])
    report = store.verify(deep=True)
    assert any(p.path.startswith(key) for p in report.problems), report.to_text()
