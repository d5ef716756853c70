"""A cold read: a thread no store object of the process has read (issue 29's many-conversations
server). The packs it reads stay held as stored: each body is decompressed into a scratch
buffer of the reading thread, and the objects the read takes are copied out (and hashed), so
the process keeps about the bytes of the state, not every body it looked into."""

from __future__ import annotations

import sys
import threading
from typing import Any

import pytest

from cas_checkpoint import CheckpointStore
from cas_checkpoint.engine import process_caches, staging
from cas_checkpoint.engine.object_store import Pack, pack_key
from cas_checkpoint.errors import IntegrityError
from cas_checkpoint.format import ids
from cas_checkpoint.format import pack as packfile
from cas_checkpoint.format.heads import Head
from cas_checkpoint.format.objects import Record, object_id
from cas_checkpoint.format.pack import Zstd
from cas_checkpoint.tree import build as tree
from tests._hostile import plant_lying_pack


def _chat(path: str, saves: int = 120) -> list[str]:
    """A chat of ``saves`` saves (every message kept), a pack flushed every save: its newest
    state names nodes written all along the thread, spread through merged packs. (Cut as
    when these tests were written, one leaf a message up to 64 of them: the pack reads they
    look at need the packs that cut makes, a body of 64 KB or more among them; a reader
    joins any cut.)"""
    was = tree.LONG_LIST
    tree.LONG_LIST = 64
    try:
        store = CheckpointStore.open(path)
        store.refs.inline_max = 1
        messages: list[str] = []
        for i in range(saves):
            messages = messages + [f"message {i}: " + "lorem ipsum dolor " * 40]
            store.save("t", {"messages": messages, "step": i})
    finally:
        tree.LONG_LIST = was
    return messages


def _kept(store: CheckpointStore) -> tuple[int, int, list[Pack]]:
    """(bytes of pack bodies kept decompressed, bytes of objects copied out, the packs)."""
    packs: list[Pack] = list(store._core.objects.cache.packs.values())
    bodies = sum(p._data.nbytes for p in packs if p._data is not None)
    return bodies, sum(getattr(p, "took", 0) for p in packs), packs


def test_a_cold_load_keeps_the_objects_it_takes_not_the_bodies_it_read(tmp_path: Any) -> None:
    """Read by a store object of a process that never read the store (the process caches
    cleared): the load keeps no body of 64 KB or more decompressed, and copies out at most
    the bytes of the objects its state is made of. Old code: every body of every pack the
    load looked into kept decompressed (here 186 KB for the 90 KB of objects it used)."""
    path = str(tmp_path / "s")
    messages = _chat(path)
    process_caches.clear()
    store = CheckpointStore.open(path)
    assert store.load("t").state["messages"] == messages
    _, took, packs = _kept(store)
    used = sum(p.index.get(packfile.pack_prefix(o))[0][1] - p.index.get(
        packfile.pack_prefix(o))[0][0] for p in packs for o in p.verified)
    big = [p for p in packs if p.index.size >= 1 << 16]  # (a smaller body is kept: the
    assert big and used > 0  # process reuses such memory)
    bodies = sum(p._data.nbytes for p in big if p._data is not None)
    assert bodies == 0, (bodies, used)
    assert took <= used, (took, used)


def test_each_pack_is_decompressed_once_a_cold_load(tmp_path: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The load takes the state's tree a level at a time, from the same packs: a thread's
    scratch buffers keep the bodies of the last packs it read, so each body is decompressed
    once a load, and a second load of the same state takes what was copied out (nothing is
    decompressed again)."""
    path = str(tmp_path / "s")
    _chat(path)
    process_caches.clear()
    seen: list[int] = []
    real = packfile._decompress

    def counting(data: memoryview, start: int, size: int, out: Any) -> None:
        seen.append(size)
        real(data, start, size, out)

    monkeypatch.setattr(packfile, "_decompress", counting)
    store = CheckpointStore.open(path)
    store.load("t")
    packs = [p for p in store._core.objects.cache.packs.values()
             if p.verified]
    assert 0 < len(seen) == len(packs) <= 14  # (a head names 14 packs at most)
    seen.clear()
    other = CheckpointStore.open(path)  # (its process shares the packs, and their copies)
    assert other.load("t").state["step"] == 119
    assert seen == []


def test_an_object_that_lies_in_a_compressed_pack_is_refused_on_a_cold_read(
        tmp_path: Any) -> None:
    """A compressed pack that hashes to its name, whose index names an object at the bytes of
    another: the copy the cold read takes out is hashed, and the error names the object and
    the pack (nothing is kept of it)."""
    store = CheckpointStore.open(str(tmp_path / "s"))
    store.refs.inline_max = 1
    for i in range(5):
        store.save("t", {"i": i, "messages": [f"message {i}-{k} " * 10 for k in range(30)]})
    ref = store.refs.read("t")
    assert ref is not None
    view = store.objects.view(ref.head)
    objects = {oid: view.get(oid) for oid in sorted(view.ids())}
    assert ref.head.head is not None
    target = Record.decode(objects[ref.head.head]).children()[0]
    liar = objects[next(o for o in objects if o != target and len(objects[o]) > 64)]
    real = staging.make_pack
    staging.make_pack = lambda objs, level, *a: real(objs, level, Zstd(3))
    try:
        pref = plant_lying_pack(store, "t", ref, objects, target, liar)
    finally:
        staging.make_pack = real
    raw = store.backend.get_many([pack_key(pref.id)])[pack_key(pref.id)]
    assert raw is not None and raw[5] & packfile.ZSTD  # (read through a scratch buffer)
    process_caches.clear()
    fresh = CheckpointStore.open(store.url)
    with pytest.raises(IntegrityError) as err:
        fresh.load("t")
    assert err.value.expected == target and err.value.actual == object_id(liar)
    assert err.value.path == f"{pack_key(pref.id)} (object {target})"
    pack = fresh._core.objects.cache.packs[pref.id]
    assert target not in (getattr(pack, "taken", None) or {}) and target not in pack.verified


def test_threads_reading_packs_at_once_each_get_their_own_bytes(tmp_path: Any) -> None:
    """Scratch buffers are per thread: eight threads loading eight threads' states, each
    through the same process-wide packs, get each state whole."""
    path = str(tmp_path / "s")
    store = CheckpointStore.open(path)
    store.refs.inline_max = 1
    want = {}
    for t in range(8):
        for i in range(30):
            want[t] = {"t": t, "messages": [f"thread {t} message {k} " * 12 for k in range(i)]}
            store.save(f"t{t}", want[t])
    for _ in range(3):
        process_caches.clear()
        reader = CheckpointStore.open(path)
        errors: list[BaseException] = []

        def load(t: int, reader: CheckpointStore = reader,
                 errors: list[BaseException] = errors) -> None:
            try:
                assert reader.load(f"t{t}").state == want[t]
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=load, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors


def test_a_cold_load_reads_each_pack_header_and_each_id_prefix_once(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold load parses the header of each pack it reads once (when it reads the pack: a
    body decompressed into a scratch buffer later is found where that parse said), and the id
    prefix of each object it looks up once, not once for every pack it looks in. Old code:
    18 header parses for the 7 packs (a body decompressed later, into a scratch buffer or
    whole, parsed it again, once a tree level for a scratch body), and 226 prefixes parsed
    for the 44 objects taken."""
    path = str(tmp_path / "s")
    _chat(path)
    process_caches.clear()
    headers: list[int] = []
    prefixes: list[str] = []
    real_header = packfile._header

    def header(data: Any) -> Any:
        headers.append(len(data))
        return real_header(data)

    def parse(text: str, base: int = 10) -> int:  # (the module's calls of int(), counted)
        prefixes.append(text)
        return int(text, base)

    monkeypatch.setattr(packfile, "_header", header)
    monkeypatch.setattr(packfile, "int", parse, raising=False)
    store = CheckpointStore.open(path)
    assert store.load("t").state["step"] == 119
    packs = [p for p in store._core.objects.cache.packs.values()]
    taken = sum(len(p.verified) for p in packs)
    assert any(p.index.size >= packfile.SCRATCH_MIN for p in packs)  # (scratch bodies too)
    assert len(headers) == len(packs), (len(headers), len(packs))
    assert 0 < len(prefixes) <= taken, (len(prefixes), taken)


def _calls(fn: Any) -> int:
    """Python functions called while ``fn()`` runs (generator expressions included)."""
    calls = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        calls += event == "call"

    sys.setprofile(count)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls - 1  # (fn itself)


def test_a_heads_log_entries_are_checked_without_a_call_a_field(tmp_path: Any) -> None:
    """A cold read decodes the thread's head: its log tail's entries are checked field by
    field inline (decoded msgpack gives exact types), an entry without status, kind or
    reason, a peak's and a pack's counts and the inline objects need no call of their own.
    Old code: 196 calls for this head of 8 entries, 12 peaks, 4 packs and 25 inline objects
    (each metadata key, count and inline object went through a generator or a function)."""
    store = CheckpointStore.open(str(tmp_path / "s"))
    for i in range(200):
        store.save("t", {"i": i}, metadata={"step": i, "source": "loop", "parents": {}})
    ref = store.refs.read("t")
    assert ref is not None
    data = ref.head.encode()
    head = Head.decode(data)
    assert len(head.tail) >= 8 and len(head.peaks) >= 3
    calls = _calls(lambda: Head.decode(data))
    # an entry: LogEntry.unpack, _check_fields, _too_deep and its __init__; a peak: its
    # __init__; a pack: _pack_ref and its __init__; the head's own few (here 70 in all)
    assert calls <= 4 * len(head.tail) + len(head.peaks) + 2 * len(head.packs) + 20, calls


def test_a_heads_inline_objects_are_hashed_in_one_pass(tmp_path: Any,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The inline objects of a head read for the first time are named (hashed) in one pass
    over a reused hasher, not one hashing call each. Old code: one ``object_id`` call per
    inline object."""
    store = CheckpointStore.open(str(tmp_path / "s"))
    for i in range(30):
        store.save("t", {"i": i, "note": f"note {i}"})
    ref = store.refs.read("t")
    assert ref is not None
    head = Head.decode(ref.head.encode())  # (new bytes objects: none hashed before)
    assert len(head.inline) >= 10
    singles: list[int] = []
    batches: list[int] = []
    real_one, real_many = ids.object_id, ids.object_ids
    monkeypatch.setattr(ids, "object_id", lambda d: singles.append(1) or real_one(d))
    monkeypatch.setattr(ids, "object_ids", lambda ds: batches.append(len(ds)) or real_many(ds))
    view = store.objects.view(head)
    got = view.inline
    assert sorted(got) == sorted(real_one(d) for d in head.inline)
    assert singles == [] and batches == [len(head.inline)], (len(singles), batches)
    assert view.inline is got
