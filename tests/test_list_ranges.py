"""A folder listed in key ranges at once (backends/ranges.py, issue 31): every key exactly once
whatever the cut points, LIST requests in flight together on S3, the same keys on every
backend, errors raised (never a short listing), and an iterator closed early stops listing."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest

from cas_checkpoint import CheckpointStore
from cas_checkpoint.backends import ranges
from cas_checkpoint.backends.base import Backend
from cas_checkpoint.engine.refs import HEADS, thread_key
from cas_checkpoint.errors import StorageError
from tests.conftest import open_store

KINDS = ["memory", "local", "s3"]


def put_refs(store: CheckpointStore, ids: list[str]) -> set[str]:
    """Refs for these thread ids (bytes nobody reads: listing decodes the keys alone)."""
    keys = {thread_key(t): b"ref" for t in ids}
    store.backend.put_many(keys)
    return set(keys)


def split_keys(backend: Backend, **kw: Any) -> list[str]:
    async def go() -> list[str]:
        return [i.key async for page in ranges.alist_split(backend, HEADS, **kw) for i in page]

    return asyncio.run(go())


class InFlight:
    """Counts an S3 backend's ListObjectsV2 requests, and the most in flight at once."""

    def __init__(self, store: CheckpointStore, fail: Any = None) -> None:
        fs = store.backend.fs  # type: ignore[attr-defined]
        self.calls: Counter[str] = Counter()
        self.now = self.peak = 0
        real = fs._call_s3

        async def counting(method: str, *a: Any, **kw: Any) -> Any:
            self.calls[method] += 1
            if method != "list_objects_v2":
                return await real(method, *a, **kw)
            if fail is not None:
                fail(kw)
            self.now += 1
            self.peak = max(self.peak, self.now)
            try:
                await asyncio.sleep(0.01)  # (a real LIST takes 30-100 ms: let others start)
                return await real(method, *a, **kw)
            finally:
                self.now -= 1

        fs._call_s3 = counting


def test_s3_threads_listed_once_each_with_lists_in_flight_together(
        tmp_path: Any, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ranges, "PAGE", 50)
    store = open_store("s3", tmp_path, request)
    ids = [f"tenant-42/agent-{i * 7919 % 100_000:05d}" for i in range(3000)]  # clustered keys
    put_refs(store, ids)
    lists = InFlight(store)
    got = list(store.iter_threads())
    assert len(got) == len(set(got)) == 3000 and set(got) == set(ids)
    pages = 3000 // 50
    # 60 pages' worth; the cut points tried and ranges' partial last pages cost some more
    assert pages <= lists.calls["list_objects_v2"] <= pages * 3 // 2 + 2 * ranges.PARTS, lists.calls
    assert 2 <= lists.peak <= ranges.PARTS, lists.peak  # old code: 1 at a time
    assert lists.calls["get_object"] == 0
    lists.calls.clear()
    assert store.threads() == sorted(ids)  # threads() (and gc, stats, verify: List) alike
    assert lists.peak >= 2


@pytest.mark.parametrize("tail", ["keys past the last cut", "a cut at the last key",
                                  "a cut past the last key"])
@pytest.mark.parametrize("kind", KINDS)
def test_every_key_once_whatever_the_cut_points(
        kind: str, tail: str, tmp_path: Any, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Cuts equal to keys, between keys, at and past the last key, and keys past the last cut:
    each key in one range only (a range ends at its cut inclusive, the next starts after it)."""
    store = open_store(kind, tmp_path, request)
    keys = sorted(put_refs(store, [f"t{i}" for i in range(400)]))
    picks = [keys[40], keys[60] + "a", keys[97], keys[120]]  # where the probes look
    picks += {"keys past the last cut": [], "a cut at the last key": [keys[-1]],
              "a cut past the last key": [keys[-1] + "z"]}[tail]
    monkeypatch.setattr(ranges.KeySpace, "past",
                        lambda self, first, last, scale: picks.pop(0) if picks else None)
    pool = [keys[150], keys[150] + "a", keys[151], keys[300]]  # where long ranges hand off

    def cuts(self: Any, first: str, last: str, end: str | None, listed: int,
             n: int) -> list[str]:
        out = [k for k in pool if k > last and (end is None or k < end)][:n]
        for k in out:
            pool.remove(k)
        return out

    monkeypatch.setattr(ranges.KeySpace, "cuts", cuts)
    got = split_keys(store.backend, page_size=10)
    assert sorted(got) == keys and len(got) == len(keys)
    assert not picks  # every probe's cut was made (one after another: always)
    if kind == "memory":  # (answered inline: the same hand-offs every run; elsewhere timing)
        assert not pool


@pytest.mark.parametrize("kind", KINDS)
def test_small_folders(kind: str, tmp_path: Any, request: pytest.FixtureRequest) -> None:
    store = open_store(kind, tmp_path, request)
    assert split_keys(store.backend) == [] and list(store.iter_threads()) == []
    one = put_refs(store, ["only"])
    assert split_keys(store.backend, page_size=1) == sorted(one)
    assert list(store.iter_threads()) == ["only"]
    two = one | put_refs(store, ["other"])
    assert sorted(split_keys(store.backend, page_size=1)) == sorted(two)


@pytest.mark.parametrize("kind", KINDS)
def test_list_page_is_the_same_everywhere(kind: str, tmp_path: Any,
                                          request: pytest.FixtureRequest) -> None:
    store = open_store(kind, tmp_path, request)
    keys = sorted(put_refs(store, [f"id-{i}" for i in range(25)]))
    b = store.backend
    page, more = b.list_page(HEADS, None, 10)
    assert [i.key for i in page] == keys[:10] and more
    page, more = b.list_page(HEADS, keys[9], 10)  # after a key: that key is not listed
    assert [i.key for i in page] == keys[10:20] and more
    page, more = b.list_page(HEADS, keys[19] + "0", 10)  # after a point between keys
    assert [i.key for i in page] == keys[20:] and not more
    assert b.list_page(HEADS, keys[-1], 10) == ([], False)
    assert b.list_page("refs/none", None, 10) == ([], False)


@pytest.mark.parametrize("kind", KINDS)
def test_the_same_keys_on_every_backend(kind: str, tmp_path: Any,
                                        request: pytest.FixtureRequest) -> None:
    store = open_store(kind, tmp_path, request)
    ids = [f"{c}{i}" for c in ("a", "tenant-1/", "Zed-", "é") for i in range(150)]
    keys = put_refs(store, [*ids, "x" * 300])  # a long id: a hashed key
    got = split_keys(store.backend, page_size=20)
    assert len(got) == len(set(got)) and set(got) == keys


def test_s3_a_failed_range_raises_never_a_short_listing(
        tmp_path: Any, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """gc lists refs so: a range that cannot be listed must fail the listing, or gc would take
    its refs' packs for garbage."""
    monkeypatch.setattr(ranges, "PAGE", 50)
    store = open_store("s3", tmp_path, request)
    put_refs(store, [f"t{i}" for i in range(600)])
    seen: list[str] = []

    def fail(kw: dict[str, Any]) -> None:
        seen.append(kw.get("StartAfter", ""))
        if len(seen) == 4:
            raise PermissionError("AccessDenied")  # permanent: not retried

    InFlight(store, fail)
    with pytest.raises(StorageError, match="listing refs/heads"):
        list(store.iter_threads())
    seen.clear()
    with pytest.raises(StorageError):
        store.threads()  # gc's, stats' and verify's List(refs/heads) too


def test_s3_closing_the_iterator_early_stops_listing(
        tmp_path: Any, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ranges, "PAGE", 20)
    store = open_store("s3", tmp_path, request)
    put_refs(store, [f"t{i}" for i in range(1000)])
    lists = InFlight(store)
    it = store.iter_threads()
    taken = [next(it) for _ in range(30)]
    it.close()  # (a `for` loop that breaks does this)
    count = lists.calls["list_objects_v2"]
    time.sleep(0.3)
    assert lists.calls["list_objects_v2"] == count and lists.now == 0
    # no more than the ranges' pages that wait for the caller were listed (1000 keys: 50 pages)
    assert count <= 1 + 2 * ranges.PARTS + 2 * 4 and len(taken) == 30


def test_s3_no_range_is_left_listing_once_close_returns(
        tmp_path: Any, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Closing the iterator cancels the ranges before it returns: the ranges' generator is
    closed by the listing's own, not later by the event loop's finalizer of async generators
    (meanwhile a range could start one more LIST: seen once in CI)."""
    import asyncio

    monkeypatch.setattr(ranges, "PAGE", 20)
    store = open_store("s3", tmp_path, request)
    put_refs(store, [f"t{i}" for i in range(1000)])
    fs: Any = store.backend.fs  # type: ignore[attr-defined]

    async def ranges_pending() -> int:
        return sum(1 for t in asyncio.all_tasks() if not t.done()
                   and "_Split._guard" in repr(t.get_coro()))

    for _ in range(5):
        it = store.iter_threads()
        for _ in range(30):
            next(it)
        it.close()
        assert asyncio.run_coroutine_threadsafe(ranges_pending(), fs.loop).result(10) == 0


def test_async_iter_threads_on_s3_in_ranges(tmp_path: Any, request: pytest.FixtureRequest,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import uuid

    from cas_checkpoint.aio import AsyncCheckpointStore

    monkeypatch.setattr(ranges, "PAGE", 40)
    server = request.getfixturevalue("moto_server")
    url = f"s3://{server['bucket']}/{uuid.uuid4().hex[:12]}"
    put_refs(CheckpointStore.open(url, storage_options=server["storage_options"]),
             [f"t{i}" for i in range(700)])

    async def go() -> tuple[list[str], list[str], int]:
        store = await AsyncCheckpointStore.open(url, storage_options=server["storage_options"])
        peak = now = 0
        fs = store.backend.fs  # type: ignore[attr-defined]
        real = fs._call_s3

        async def counting(method: str, *a: Any, **kw: Any) -> Any:
            nonlocal peak, now
            now += 1
            peak = max(peak, now)
            try:
                await asyncio.sleep(0.01)
                return await real(method, *a, **kw)
            finally:
                now -= 1

        fs._call_s3 = counting
        try:
            return [t async for t in store.iter_threads()], await store.threads(), peak
        finally:
            await store.aclose()

    got, listed, peak = asyncio.run(go())
    assert sorted(got) == listed and len(got) == len(set(got)) == 700
    assert peak >= 2
