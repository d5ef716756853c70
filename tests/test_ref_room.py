"""Issue 29, bytes while running: a local ref file is two slots with room for its head to grow
by a quarter (whole 4 KB blocks), not to double, and a new ref's file a block more (its first
saves are where its head grows); a file of the old size still reads."""

from __future__ import annotations

import os
from typing import Any

import pytest

from cas_checkpoint.backends import ref_slots
from cas_checkpoint.backends.local import MAX_REF_FILE, LocalBackend
from cas_checkpoint.format.heads import MAX_HEAD_BYTES

KEY = "refs/heads/orsxg5a"


def _blocks(n: int) -> int:
    return max(ref_slots.BLOCK, -(-n // ref_slots.BLOCK) * ref_slots.BLOCK)


def test_a_rewritten_ref_file_is_its_head_and_a_quarter_twice(tmp_path: Any) -> None:
    """A ref whose head outgrows its slot is rewritten with room to grow by a quarter: a head
    of 10,000 bytes, two slots of 16 KB (the head and a quarter, in 4 KB blocks), 32 KB. Old
    code: room to double, two slots of 20 KB, 40 KB."""
    backend = LocalBackend(str(tmp_path / "s"))
    version = backend.write_ref(KEY, b"h" * 100, None)
    backend.write_ref(KEY, b"h" * 10_000, version)
    size = os.path.getsize(os.path.join(backend.root, KEY))
    assert size == 2 * _blocks((ref_slots.HEADER + 10_000) * 5 // 4) == 32 * 1024


@pytest.mark.parametrize("heads", [(554, 3424, 4552, 5547), (7601, 10471, 11599, 12594)])
def test_a_new_ref_has_room_for_its_first_saves(tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                                                heads: tuple[int, ...]) -> None:
    """A new ref file has room for its head to grow by a quarter and a block more: the
    namespace ref a LangGraph subgraph makes each turn (its heads' sizes in the agent benchmark
    at 50 and 10 turns) is written whole once, when it is made, then in place (one flush
    each). Old code: room for a quarter, written whole twice (a temp file, two flushes and a
    rename more)."""
    wholes: list[int] = []
    real = ref_slots.new_file

    def counted(seq: int, head: bytes, *args: Any, **kwargs: Any) -> bytes:
        wholes.append(len(head))
        return real(seq, head, *args, **kwargs)

    monkeypatch.setattr(ref_slots, "new_file", counted)
    backend = LocalBackend(str(tmp_path / "s"))
    version = None
    for n in heads:
        version = backend.write_ref(KEY, b"h" * n, version)
    assert wholes == [heads[0]]
    got = LocalBackend(backend.root).read_ref(KEY)
    assert got is not None and got[0] == b"h" * heads[-1]
    size = os.path.getsize(os.path.join(backend.root, KEY))
    assert size == 2 * _blocks((ref_slots.HEADER + heads[0]) * 5 // 4 + ref_slots.BLOCK)


def test_a_ref_file_of_the_old_size_still_reads(tmp_path: Any) -> None:
    """A file whose slots have room to double (what earlier versions wrote) reads, and takes
    the next head in place; the largest such file is within what a reader reads."""
    assert MAX_REF_FILE >= 2 * _blocks(2 * (ref_slots.HEADER + MAX_HEAD_BYTES))
    backend = LocalBackend(str(tmp_path / "s"))
    backend.write_ref(KEY, b"h" * 10_000, None)
    real = ref_slots.slot_size
    ref_slots.slot_size = lambda head_len, new=False: _blocks(  # (the old rule)
        2 * (ref_slots.HEADER + head_len))
    try:
        old = ref_slots.new_file(7, b"o" * 10_000)
    finally:
        ref_slots.slot_size = real
    assert len(old) == 40 * 1024
    with open(os.path.join(backend.root, KEY), "wb") as f:
        f.write(old)
    fresh = LocalBackend(backend.root)
    got = fresh.read_ref(KEY)
    assert got is not None and got[0] == b"o" * 10_000
    fresh.write_ref(KEY, b"n" * 11_000, got[1])
    assert os.path.getsize(os.path.join(backend.root, KEY)) == 40 * 1024  # (in place)
    again = LocalBackend(backend.root).read_ref(KEY)
    assert again is not None and again[0] == b"n" * 11_000
