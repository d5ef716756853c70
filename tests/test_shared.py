"""What store objects over one memory:// store or local folder share in this process
(``process_caches.py``): packs parsed from the same bytes, heads decoded from the same bytes,
states by root id. Never stale, never damaged, never across encrypted stores or other stores."""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest
from builders import random_msg

from cas_checkpoint import CheckpointStore, IntegrityError, Key, NotFoundError
from cas_checkpoint.engine import pack_reads as objstore_mod
from cas_checkpoint.engine import process_caches
from cas_checkpoint.engine.object_store import ObjectStore, pack_key
from cas_checkpoint.format.heads import Head
from cas_checkpoint.tree import build as tree_mod


def _url() -> str:
    return f"memory://shared-{uuid.uuid4().hex[:12]}"


def _thread(store: CheckpointStore, n: int = 60) -> tuple[dict[str, Any], list[str]]:
    state: dict[str, Any] = {"messages": []}
    ids = []
    for i in range(n):
        state["messages"].append(random_msg(i))
        ids.append(store.save("t", state).id)
    head = store.refs.read("t").head
    assert head.packs, "the thread should have packs"
    return state, ids


class _Counts:
    """Counts packs parsed, heads decoded and states joined from nodes."""

    def __init__(self, monkeypatch: Any) -> None:
        self.parsed = self.heads = self.joined = 0
        parse, decode, load = ObjectStore.parse, Head.decode, tree_mod.load

        def counting_parse(obj: ObjectStore, *a: Any, **k: Any) -> Any:
            self.parsed += 1
            return parse(obj, *a, **k)

        def counting_decode(*a: Any, **k: Any) -> Any:
            self.heads += 1
            return decode(*a, **k)

        def counting_load(*a: Any, **k: Any) -> Any:
            self.joined += 1
            return load(*a, **k)

        monkeypatch.setattr(ObjectStore, "parse", counting_parse)
        monkeypatch.setattr(Head, "decode", staticmethod(counting_decode))
        monkeypatch.setattr(tree_mod, "load", counting_load)


def test_a_new_store_object_reuses_what_another_verified(monkeypatch: Any) -> None:
    url = _url()
    writer = CheckpointStore.open(url)
    state, ids = _thread(writer)
    first = CheckpointStore.open(url)
    counts = _Counts(monkeypatch)
    assert first.load("t", ids[-5]).state == {"messages": state["messages"][:56]}
    assert counts.parsed == 0  # the packs the writer wrote, parsed once in this process
    assert counts.heads == 0  # the head the writer decoded
    assert counts.joined == 0  # a state the writer saved: decoded in one pass
    process_caches.STATES.clear()
    second = CheckpointStore.open(url)
    assert second.load("t", ids[-5]).state == {"messages": state["messages"][:56]}
    assert (counts.parsed, counts.heads, counts.joined) == (0, 0, 1)  # joined from its nodes


def test_a_new_store_object_on_local_disk_reuses_what_another_verified(
        monkeypatch: Any, tmp_path: Any) -> None:
    """A local folder shares as memory:// does (issue 29's many-conversations server: each
    request a new saver over a warm process). Each use is checked against the bytes read now:
    the ref and packs are still read from disk, compared with the bytes parsed before. Old
    code: every new store object parsed and hashed each pack and decoded each head again
    (here 2 packs, 1 head, 1 state joined per load)."""
    path = str(tmp_path / "store")
    writer = CheckpointStore.open(path)
    state, ids = _thread(writer)
    counts = _Counts(monkeypatch)
    for _ in range(3):
        reader = CheckpointStore.open(path)
        assert reader.load("t", ids[-5]).state == {"messages": state["messages"][:56]}
        assert reader.load("t").state == state
    assert (counts.parsed, counts.heads, counts.joined) == (0, 0, 0)
    assert CheckpointStore.open(str(tmp_path / "." / "store"))._core.objects.shared is (
        writer._core.objects.shared)  # (another spelling of the same folder: the same store)
    assert CheckpointStore.open(str(tmp_path / "other"))._core.objects.shared is not (
        writer._core.objects.shared)


def test_a_store_object_asked_to_cache_nothing_shares_nothing(tmp_path: Any) -> None:
    """``cache_bytes=0``: the process keeps nothing for it once it is gone (without the rule,
    a local folder's store objects left up to 52 MB in the process caches)."""
    from cas_checkpoint.engine import process_caches

    process_caches.clear()
    path = str(tmp_path / "store")
    store = CheckpointStore.open(path, cache_bytes=0)
    _, ids = _thread(store)
    assert CheckpointStore.open(path, cache_bytes=0).load("t", ids[0]).id == ids[0]
    assert [len(lru.items) for lru in process_caches.LOCAL] == [0, 0, 0]
    CheckpointStore.open(path).load("t", ids[0])
    assert len(process_caches.LOCAL[0].items) > 0  # (the default shares)


def test_a_local_pack_or_ref_changed_on_disk_is_read_afresh(tmp_path: Any) -> None:
    """Another process's damage (or a gc's delete) is seen by this process's next store
    object: what is shared is used only for the very bytes read now."""
    path = str(tmp_path / "store")
    writer = CheckpointStore.open(path)
    _, ids = _thread(writer)
    CheckpointStore.open(path).load("t", ids[0])  # (shared now)
    ref = os.path.join(path, *writer._core.refs.stored_key("t").split("/"))
    with open(ref, "rb") as f:
        before = f.read()
    newer = writer.save("t", {"messages": []}).id
    assert CheckpointStore.open(path).load("t").id == newer
    os.chmod(ref, 0o644)
    with open(ref, "wb") as f:  # the ref as it was (another process rewound it on disk)
        f.write(before)
    assert CheckpointStore.open(path).load("t").id == ids[-1]
    head = writer.refs.read("t").head
    file = os.path.join(path, *pack_key(head.packs[0].id).split("/"))
    data = bytearray(open(file, "rb").read())
    data[-20] ^= 1
    os.chmod(file, 0o644)
    with open(file, "wb") as f:
        f.write(bytes(data))
    with pytest.raises(IntegrityError):
        CheckpointStore.open(path).load("t", ids[0])
    os.remove(file)
    with pytest.raises(NotFoundError):
        CheckpointStore.open(path).load("t", ids[0])


def test_shared_packs_still_hash_each_object_once(monkeypatch: Any) -> None:
    url = _url()
    writer = CheckpointStore.open(url)
    _, ids = _thread(writer)
    inline = set(writer.refs.read("t").head.inline)  # (a view names these by hashing them)
    hashed: list[int] = []
    real = objstore_mod.object_id

    def counting(data: Any) -> Any:
        if bytes(data) not in inline:
            hashed.append(len(data))
        return real(data)

    monkeypatch.setattr(objstore_mod, "object_id", counting)
    cid = ids[-3]
    process_caches.PACKS.clear()  # as if another process had written them: nothing hashed here yet
    process_caches.STATES.clear()
    CheckpointStore.open(url).load("t", cid)
    first = len(hashed)
    assert first > 0  # the objects taken out of the packs were hashed...
    CheckpointStore.open(url).load("t", cid)
    assert len(hashed) == first  # ...once in this process, not once per store object
    other = CheckpointStore.open(_url())
    _, ids = _thread(other)
    inline.update(other.refs.read("t").head.inline)
    hashed.clear()
    for cid in ids:
        CheckpointStore.open(other.url).load("t", cid)
    assert hashed == []  # what this process packed it hashed when it built the objects


def test_a_damaged_pack_is_found_by_a_new_store_object() -> None:
    url = _url()
    writer = CheckpointStore.open(url)
    _, ids = _thread(writer)
    head = writer.refs.read("t").head
    key = pack_key(head.packs[0].id)
    data = bytearray(writer.backend.get(key))
    data[-20] ^= 1
    writer.backend.fs.pipe_file(writer.backend._path(key), bytes(data))
    with pytest.raises(IntegrityError):
        CheckpointStore.open(url).load("t", ids[0])
    writer.backend.fs.rm_file(writer.backend._path(key))
    with pytest.raises(NotFoundError):
        CheckpointStore.open(url).load("t", ids[0])


def test_a_store_made_again_under_the_same_name_is_read_afresh() -> None:
    url = _url()
    old = CheckpointStore.open(url)
    _thread(old)
    old.backend.fs.rm(old.backend.root, recursive=True)
    new = CheckpointStore.open(url)
    with pytest.raises(NotFoundError):
        new.load("t")
    state = {"messages": [random_msg(1000 + i) for i in range(40)]}
    new.save("t", state)
    assert CheckpointStore.open(url).load("t").state == state


def test_other_stores_and_encrypted_stores_share_nothing() -> None:
    a, b = CheckpointStore.open(_url()), CheckpointStore.open(_url())
    assert a._core.objects.shared is not b._core.objects.shared
    assert CheckpointStore.open(a.url)._core.objects.shared is a._core.objects.shared
    key = Key.generate()
    sealed = CheckpointStore.open(_url(), encryption=key)
    _thread(sealed, 30)
    assert sealed._core.objects.shared is None
    assert CheckpointStore.open(sealed.url, encryption=key).load("t").state["messages"]


def test_the_shared_caches_are_bounded() -> None:
    lru = process_caches._LRU(1000)
    for i in range(50):
        lru.put(i, b"x" * 100, 100)
    assert lru.bytes <= 1000 and len(lru.items) == 10
    assert lru.get(0) is None and lru.get(49) is not None
    lru.put("big", b"x" * 2000, 2000)  # bigger than the whole budget: not kept
    assert lru.get("big") is None and lru.bytes <= 1000


def test_merging_packs_this_process_wrote_hashes_none_of_their_objects(monkeypatch: Any
                                                                       ) -> None:
    store = CheckpointStore.open(_url())
    store.refs.inline_max = 600  # a pack nearly every save, a merge every few
    hashed: list[int] = []
    real = objstore_mod.object_id

    def counting(data: Any) -> Any:
        hashed.append(len(data))
        return real(data)

    monkeypatch.setattr(objstore_mod, "object_id", counting)
    state: dict[str, Any] = {"messages": []}
    for i in range(80):
        state["messages"].append(random_msg(i))
        store.save("t", state)
    assert len(store.refs.read("t").head.packs) > 1
    assert hashed == []  # each object's id is known from when it was packed
    monkeypatch.undo()
    assert CheckpointStore.open(store.url).verify().ok


def test_memory_ref_versions_are_those_of_the_bytes_there() -> None:
    """The memory backend remembers each ref's version with its bytes (a save hashes neither
    the ref it replaces nor the one it writes: a ref it wrote is versioned by a write counter),
    and compares the bytes: a ref changed behind its back (a rewrite of the file, of the same
    size) has the version of its new bytes, and a compare-and-swap that expects the old one
    loses."""
    import blake3

    from cas_checkpoint.backends import RefMismatch

    store = CheckpointStore.open(_url())
    backend = store.backend
    v1 = backend.write_ref("refs/x", b"one", None)
    assert v1 != blake3.blake3(b"one").hexdigest()  # (not hashed)
    assert backend.read_ref("refs/x") == (b"one", v1)
    assert backend.write_ref("refs/x", b"one", v1) not in (v1, blake3.blake3(b"one").hexdigest())
    v1 = backend.read_ref("refs/x")[1]  # (the same bytes written again: a new version)
    backend.fs.pipe_file(f"{backend.root}/refs/x", b"two")  # not through write_ref
    got = backend.read_ref("refs/x")
    assert got == (b"two", blake3.blake3(b"two").hexdigest())
    backend.fs.pipe_file(f"{backend.root}/refs/x", b"six")
    with pytest.raises(RefMismatch):
        backend.write_ref("refs/x", b"new", got[1])
    v3 = backend.write_ref("refs/x", b"new", blake3.blake3(b"six").hexdigest())
    assert backend.read_ref("refs/x") == (b"new", v3)
