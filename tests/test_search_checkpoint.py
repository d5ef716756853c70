"""``search(query, thread_id=..., checkpoint_id=...)``: one checkpoint of one thread, on both
faces (the command line searches a LangGraph thread at its latest checkpoint with it)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cas_checkpoint import CheckpointStore, InvalidArgumentError, NotFoundError
from cas_checkpoint.aio import AsyncCheckpointStore


def test_search_one_checkpoint(tmp_path: Path) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    old = store.save("t", {"note": "the blue door"})
    store.save("t", {"note": "the red door"})
    other = store.save("u", {"note": "the blue door"})
    assert store.search("blue", thread_id="t").matches == []  # the head
    got = store.search("blue", thread_id="t", checkpoint_id=old.id)
    assert [(m.thread_id, m.checkpoint_id, m.path) for m in got.matches] == [
        ("t", old.id, '["note"]')] and got.checkpoints_searched == 1
    with pytest.raises(NotFoundError, match="not in thread 't'"):
        store.search("blue", thread_id="t", checkpoint_id=other.id)
    for kw in ({}, {"thread_id": "t", "all_history": True}):
        with pytest.raises(InvalidArgumentError, match="pass thread_id= with it"):
            store.search("blue", checkpoint_id=old.id, **kw)  # type: ignore[arg-type]

    async def main() -> list[str]:
        async with await AsyncCheckpointStore.open(str(tmp_path / "s")) as a:
            r = await a.search("blue", thread_id="t", checkpoint_id=old.id)
            return [m.checkpoint_id for m in r.matches]

    assert asyncio.run(main()) == [old.id]
