"""iter_threads: every thread a page of the listing at a time (issue 31)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from cas_checkpoint import CheckpointStore
from tests.conftest import open_store
from tests.test_verify_quick import count_s3, fill


def test_iter_threads_gives_what_threads_gives(store: CheckpointStore) -> None:
    fill(store, 30)
    store.save("x" * 300, {"long": "id: a hashed key, read from its ref"})
    got = list(store.iter_threads())
    assert sorted(got) == store.threads() and len(got) == len(set(got)) == 31


def test_s3_iter_threads_lists_one_page_first_then_key_ranges(
        tmp_path: Any, request: pytest.FixtureRequest) -> None:
    store = open_store("s3", tmp_path, request)
    fill(store, 2500)
    calls = count_s3(store)
    it = store.iter_threads()
    first = [next(it) for _ in range(1000)]
    assert calls["list_objects_v2"] == 1 and calls["get_object"] == 0  # one page so far
    rest = list(it)
    assert len(first + rest) == len(set(first + rest)) == 2500
    # the rest in key ranges at once: 2 more pages' worth, plus the cut points tried (the
    # count is exact: the listing is deterministic for these keys)
    assert 3 <= calls["list_objects_v2"] <= 8, calls


@pytest.mark.parametrize("backend_kind", ["local"])
def test_local_pages_of_1000(store: CheckpointStore) -> None:
    fill(store, 2100)
    pages = list(store.backend.list_pages("refs/heads"))
    assert [len(p) for p in pages] == [1000, 1000, 100]
    assert {i.key: i for p in pages for i in p} == {
        i.key: i for i in store.backend.list("refs/heads")}


def test_cli_threads_names(tmp_path: Any) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    fill(store, 12)
    out = subprocess.run([sys.executable, "-m", "cas_checkpoint.cli", "threads", store.url,
                          "--names"], capture_output=True, text=True, check=True).stdout
    assert sorted(out.split()) == store.threads()


@pytest.mark.parametrize("kind", ["memory", "local", "s3"])
def test_async_iter_threads(kind: str, tmp_path: Any, request: pytest.FixtureRequest,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    import uuid

    from cas_checkpoint.aio import AsyncCheckpointStore
    from cas_checkpoint.backends import ranges

    monkeypatch.setattr(ranges, "PAGE", 50)  # S3: many pages of a few refs (1,200 saves to
    # moto took ~90 s of the suite for the same proof)

    name = uuid.uuid4().hex[:12]
    kw: dict[str, Any] = {}
    if kind == "memory":
        url = f"memory://it-{name}"
    elif kind == "local":
        url = str(tmp_path / name)
    else:
        server = request.getfixturevalue("moto_server")
        url, kw = f"s3://{server['bucket']}/{name}", {"storage_options":
                                                      server["storage_options"]}
    n = 180 if kind == "s3" else 50

    async def go() -> tuple[list[str], list[str]]:
        store = await AsyncCheckpointStore.open(url, **kw)
        try:
            await asyncio.gather(*(store.save(f"t{i}", {"i": i}) for i in range(n)))
            return [t async for t in store.iter_threads()], await store.threads()
        finally:
            await store.aclose()

    got, listed = asyncio.run(go())
    assert sorted(got) == listed and len(got) == n
