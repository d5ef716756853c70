"""Issue 29: long threads stay flat. A save flushes its new objects into a pack and merges
packs geometrically (``packing.stage``); once a head names ``MAX_PACKS`` packs, early merges
must rewrite small packs, not the whole thread on every save."""

from __future__ import annotations

from typing import Any

import pytest

from cas_checkpoint import CheckpointStore
from cas_checkpoint.engine import archive, staging
from cas_checkpoint.format.heads import Head, PackRef
from cas_checkpoint.format.objects import ObjectId, object_id
from cas_checkpoint.format.pack import decode_pack


def _objects(save: int) -> dict[ObjectId, bytes]:
    """What one save adds: two objects of ~200 bytes, unique to the save (a rolling window's
    new message leaf and its record)."""
    out = {}
    for i in range(2):
        data = b"CASN\x03\x00" + save.to_bytes(4, "big") + bytes([i]) * 200
        out[object_id(data)] = data
    return out


def _grow(saves: int, marks: tuple[int, ...], keep: dict[ObjectId, bytes] | None = None
          ) -> tuple[dict[int, float], int, Head]:
    """Stage ``saves`` saves that each flush a pack (uncompressed: the bytes are exact);
    returns the mean bytes written a save up to each of ``marks``, the most one save wrote,
    and the last head. Stops early (the mean so far past 40 saves' worth) on a runaway."""
    store: dict[ObjectId, bytes] = {} if keep is None else keep

    def read(ids: list[ObjectId]) -> dict[ObjectId, dict[ObjectId, memoryview]]:
        return {i: decode_pack(store[i]) for i in ids}

    head, total, worst, means = Head("t", None), 0, 0, {}
    new_bytes = sum(map(len, _objects(0).values()))
    for n in range(1, saves + 1):
        head, packs = staging.stage(head, _objects(n), read, inline_max=0)
        store.update(packs)
        wrote = sum(map(len, packs.values()))
        total, worst = total + wrote, max(worst, wrote)
        assert len(head.packs) <= staging.MAX_PACKS
        if n in marks:
            means[n] = total / n
        if n > 1000 and total / n > 40 * new_bytes:
            raise AssertionError(f"after {n} saves a save writes {total / n:.0f} bytes on "
                                 f"average, {total / n / new_bytes:.0f} times its new bytes")
    return means, worst, head


def test_bytes_written_a_save_stay_flat_once_the_head_is_full() -> None:
    """Fails on the old code: past ~4,000 flushes (a head full at 14 packs) the early merge
    took the newest two packs, the newest being the biggest, so every save rewrote the whole
    thread (after 5,000 saves, ~390 times a save's new bytes on average)."""
    means, worst, head = _grow(8000, (1000, 8000))
    new_bytes = sum(map(len, _objects(0).values()))
    # geometric merging: ~log_4(n) rewrites of each byte, so the mean grows by a level or two
    # from 1,000 to 8,000 saves, not with the thread
    assert means[8000] <= 1.5 * means[1000], means
    assert means[8000] <= 10 * new_bytes, (means, new_bytes)
    assert worst <= 8000 * new_bytes * 1.2  # one merge of the whole thread at most
    assert len(head.packs) <= staging.MAX_PACKS


def test_early_merges_keep_every_object_and_rewrite_small_packs() -> None:
    """Merges never drop an object, past the point where the head is full."""
    store: dict[ObjectId, bytes] = {}
    _, _, head = _grow(1500, (), store)
    held: set[ObjectId] = set()
    listed = () if head.archive is None else archive.of_pack(decode_pack(store[head.archive.id]))
    for p in (*head.packs, *listed):  # (the head's packs, and its archive's: archive.py)
        held |= set(decode_pack(store[p.id]))
    assert held == {oid for n in range(1, 1501) for oid in _objects(n)}
    # levels do not rise toward the newest pack: the newest packs are the small ones
    sizes = [p.size for p in head.packs]
    assert sizes[-1] < sizes[0], sizes


def test_a_head_an_older_version_left_with_its_biggest_pack_last_recovers() -> None:
    """A head the old early merge left (its newest pack the biggest, at a high level) merges
    its small packs from now on: the big pack is not rewritten by each save (old code: every
    save rewrote it)."""
    store: dict[ObjectId, bytes] = {}

    def read(ids: list[ObjectId]) -> dict[ObjectId, dict[ObjectId, memoryview]]:
        return {i: decode_pack(store[i]) for i in ids}

    head = Head("t", None)
    levels = [5, 5, 4, 4, 4, 3, 3, 3, 2, 2, 2, 1, 1]
    packs: list[PackRef] = []
    for i, level in enumerate(levels + [63]):
        objs = {oid: d for n in range(i * 1000, i * 1000 + (3000 if level == 63 else 2))
                for oid, d in _objects(n).items()}
        ref, data = staging.make_pack(objs, level)
        store[ref.id] = data
        packs.append(ref)
    head = Head("t", None, packs=tuple(packs))
    big = packs[-1]
    rewrote_big = 0
    for n in range(100):
        head, written = staging.stage(head, _objects(10**6 + n), read, inline_max=0)
        store.update(written)
        rewrote_big += any(len(d) >= big.size for d in written.values())
        assert len(head.packs) <= staging.MAX_PACKS
    assert big in head.packs and rewrote_big == 0


@pytest.mark.parametrize("saves", [300])
def test_a_store_whose_every_save_flushes_loads_every_checkpoint(tmp_path: Any,
                                                                 saves: int) -> None:
    """Through the store, with a small head (every save flushes) and MAX_PACKS lowered so the
    early merge runs all the time: every checkpoint loads from packs in a new process."""
    old = staging.MAX_PACKS
    staging.MAX_PACKS = 5
    try:
        store = CheckpointStore.open(str(tmp_path / "s"))
        store.refs.inline_max = 1
        ids = [store.save("t", {"i": i, "m": f"message {i} " * 20}).id for i in range(saves)]
        fresh = CheckpointStore.open(str(tmp_path / "s"))
        assert [fresh.load("t", c).state["i"] for c in ids] == list(range(saves))
        ref = fresh.refs.read("t")
        assert ref is not None and len(ref.head.packs) <= 5
    finally:
        staging.MAX_PACKS = old
