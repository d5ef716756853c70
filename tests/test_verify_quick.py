"""A quick verify reads the refs and lists the packs: no pack is read (issue 31)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from builders import count_s3

from cas_checkpoint import CheckpointStore
from cas_checkpoint.engine.object_store import pack_key
from tests.conftest import open_store


def packed(store: CheckpointStore) -> CheckpointStore:
    store.refs.inline_max = 1  # every save writes a pack
    return store


def fill(store: CheckpointStore, n: int) -> None:
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: store.save(f"t{i}", {"i": i, "pad": "x" * 64}), range(n)))


def test_quick_verify_on_s3_reads_refs_and_lists_packs_only(
        tmp_path: Any, request: pytest.FixtureRequest) -> None:
    n = 60
    store = packed(open_store("s3", tmp_path, request))
    fill(store, n)
    calls = count_s3(store)
    quick = store.verify(deep=False)
    assert quick.ok and quick.threads == n and quick.objects_hashed == 0, quick.to_text()
    # one GET a ref, no pack read; LIST: refs/heads, then the packs (one request: < 1,000)
    assert calls["get_object"] == n, calls
    assert calls["list_objects_v2"] == 2, calls
    calls.clear()
    deep = store.verify(deep=True)
    assert deep.ok and calls["get_object"] == n + deep.by_kind["pack"]["objects"]


@pytest.mark.parametrize("backend_kind", ["memory", "local", "s3"])
def test_quick_verify_finds_a_missing_pack_and_one_of_another_size(
        store: CheckpointStore) -> None:
    packed(store)
    fill(store, 3)
    packs = [p.id for p in store.refs.read("t1").head.packs]  # type: ignore[union-attr]
    store.backend.delete_many([pack_key(packs[0])])
    other = [p.id for p in store.refs.read("t2").head.packs]  # type: ignore[union-attr]
    data = store.backend.get(pack_key(other[0]))
    store.backend.delete_many([pack_key(other[0])])
    store.backend.put_many({pack_key(other[0]): data + b"x"})  # (its name is now a lie)
    report = store.verify(deep=False)
    found = {(p.kind, p.object, p.threads) for p in report.problems}
    assert found == {("missing", packs[0], ("t1",)), ("mismatch", other[0], ("t2",))}, found
    assert "--deep" in report.to_text()
