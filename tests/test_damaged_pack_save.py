"""Saves and forks on a thread whose head names a damaged (or missing) pack (issue 27, item 5).

A load needs only the packs that hold the objects of the checkpoint it loads: a save onto such a
thread writes what it needs into a fresh pack (or the ref), and loads, from any process, by
``load`` and by ``get``. Damaged bytes are never returned: what needs the damaged pack still
raises its error. A save that would have to merge the damaged pack raises before writing its
ref; a fork checks its checkpoint before it creates the new thread."""

from __future__ import annotations

import os
from typing import Any

import pytest

from cas_checkpoint import CheckpointStore
from cas_checkpoint.engine.object_store import pack_key
from cas_checkpoint.errors import CasError, IntegrityError, NotFoundError


def _big(i: int) -> dict[str, Any]:
    """A state that goes into packs (30 messages of ~200 bytes), its root in its record."""
    return {"i": i, "messages": [f"message {i}-{k} " * 10 for k in range(30)]}


def _store(tmp_path: Any, name: str = "s") -> CheckpointStore:
    return CheckpointStore.open(str(tmp_path / name), compression="none")


def _damage(store: CheckpointStore, pid: str, how: str) -> None:
    """Flip one byte in the middle of a stored pack, or delete it."""
    path = os.path.join(store.url, pack_key(pid))
    if how == "deleted":
        os.remove(path)
        return
    with open(path, "rb") as f:
        data = bytearray(f.read())
    data[len(data) // 2] ^= 0x40
    os.chmod(path, 0o644)
    with open(path, "wb") as f:
        f.write(bytes(data))


def _error_of(how: str) -> type[CasError]:
    return NotFoundError if how == "deleted" else IntegrityError


def _thread_with_a_damaged_pack(tmp_path: Any, how: str) -> tuple[str, list[str], str]:
    """Thread ``t``: 6 checkpoints in three packs; the oldest (which holds checkpoints 0-3)
    is damaged. Returns the store's url, the ids, and the damaged pack's key."""
    store = _store(tmp_path)
    store.refs.inline_max = 1
    ids = [store.save("t", _big(i)).id for i in range(6)]
    ref = store.refs.read("t")
    assert ref is not None and len(ref.head.packs) == 3 and ref.head.packs[0].level == 1
    _damage(store, ref.head.packs[0].id, how)
    return store.url, ids, pack_key(ref.head.packs[0].id)


@pytest.mark.parametrize("how", ["flipped", "deleted"])
@pytest.mark.parametrize("state", ["small", "big"], ids=["inline", "packed"])
def test_a_save_onto_a_thread_with_a_damaged_pack_loads_everywhere(
        how: str, state: str, tmp_path: Any) -> None:
    url, ids, key = _thread_with_a_damaged_pack(tmp_path, how)
    value = {"x": 1} if state == "small" else _big(100)
    writer = CheckpointStore.open(url)
    new = writer.save("t", value).id
    # the old code: load and get hash every pack the head names, and raise for the damaged one
    for reader in (writer, CheckpointStore.open(url)):
        assert reader.load("t").state == value
        assert reader.load("t", new).state == value
        assert reader.get(new).state == value
        assert reader.load("t", ids[5]).state == _big(5)  # in an intact pack
    fresh = CheckpointStore.open(url)
    for call in (lambda: fresh.load("t", ids[0]), lambda: fresh.get(ids[0])):
        with pytest.raises(_error_of(how)) as err:  # damaged bytes are never returned
            call()
        assert key in str(err.value) and "verify" in str(err.value)
    assert not fresh.verify().ok


@pytest.mark.parametrize("how", ["flipped", "deleted"])
def test_every_acknowledged_save_onto_a_damaged_thread_loads(how: str, tmp_path: Any) -> None:
    """Saves go on until one has to merge the damaged pack: that one raises the pack's error
    and writes no ref; every save that returned loads in a fresh process."""
    url, _, key = _thread_with_a_damaged_pack(tmp_path, how)
    writer = CheckpointStore.open(url)
    writer.refs.inline_max = 1
    acked: dict[str, dict[str, Any]] = {}
    refused = 0
    for i in range(40):
        before = writer.refs.read("t")
        try:
            acked[writer.save("t", _big(100 + i)).id] = _big(100 + i)
        except (IntegrityError, NotFoundError) as exc:
            refused += 1
            assert key in str(exc)
            after = writer.refs.read("t")
            assert after is not None and before is not None and after.version == before.version
    assert acked and refused  # some land, and the merge that needs the damaged pack refuses
    fresh = CheckpointStore.open(url)
    for cid, value in acked.items():
        assert fresh.load("t", cid).state == value
        assert CheckpointStore.open(url).get(cid).state == value


@pytest.mark.parametrize("how", ["flipped", "deleted"])
def test_a_fork_checks_its_checkpoint_before_it_creates_the_thread(
        how: str, tmp_path: Any) -> None:
    url, ids, key = _thread_with_a_damaged_pack(tmp_path, how)
    store = CheckpointStore.open(url)
    with pytest.raises(_error_of(how)) as err:  # its state is in the damaged pack
        store.fork("t", ids[0], "f0")
    assert key in str(err.value)
    assert CheckpointStore.open(url).threads() == ["t"]  # no half-made fork
    store.fork("t", ids[5], "f5")  # in an intact pack: the fork is made, and loads
    fresh = CheckpointStore.open(url)
    assert fresh.load("f5").state == _big(5)
    store.save("f5", _big(200))
    assert CheckpointStore.open(url).load("f5").state == _big(200)


def test_a_fork_of_a_thread_whose_log_needs_a_damaged_pack_is_refused_whole(
        tmp_path: Any) -> None:
    """A fork reads the source's whole log before it writes anything: when that fails,
    nothing is created. (A guard on the fork's order of steps: the old code read the log
    first too.)"""
    store = _store(tmp_path)
    store.refs.inline_max = 1
    ids = [store.save("t", _big(i)).id for i in range(20)]  # 20 > 16 entries: a log segment
    ref = store.refs.read("t")
    assert ref is not None and ref.head.peaks
    for pack in ref.head.packs:
        _damage(store, pack.id, "flipped")
    with pytest.raises(IntegrityError):
        CheckpointStore.open(store.url).fork("t", ids[-1], "f")
    assert CheckpointStore.open(store.url).threads() == ["t"]


def test_get_finds_a_checkpoint_though_another_threads_log_is_damaged(tmp_path: Any) -> None:
    store = _store(tmp_path)
    store.refs.inline_max = 1
    for i in range(20):  # thread "a" (listed first): a log segment, in its packs
        store.save("a", _big(i))
    good = store.save("b", _big(50)).id
    ref = store.refs.read("a")
    assert ref is not None
    for pack in ref.head.packs:
        _damage(store, pack.id, "flipped")
    fresh = CheckpointStore.open(store.url)
    assert fresh.get(good).state == _big(50)
    with pytest.raises(IntegrityError):  # not in any readable log: the damage is named
        fresh.get("ab" * 32)
