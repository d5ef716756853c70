"""Contract tests shipped with the library (zarr's ``StoreTests`` style): ``BackendTests`` is
the storage contract every backend keeps (``cas_checkpoint.backends.Backend``), written once.
Subclass it in a test module and say how to make your backend; pytest runs each test on it::

    from cas_checkpoint.testing import BackendTests

    class TestMyBackend(BackendTests):
        def make_backend(self, tmp_path):
            return MyBackend(...)  # an empty store's storage

Needs pytest (``pip install pytest``). Rule: a test here uses only the ``Backend`` interface."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path

import pytest

from cas_checkpoint.backends import Backend, RefMismatch
from cas_checkpoint.engine.refs import thread_key
from cas_checkpoint.errors import NotFoundError
from cas_checkpoint.store import CheckpointStore

__all__ = ["BackendTests"]

_HEADS: list[bytes] = []


def heads(n: int) -> list[bytes]:
    """``n`` different thread heads as a store writes them (a ref holds a head; a sealing
    backend reads the packs a head names before it seals it)."""
    while len(_HEADS) < n:
        url = f"memory://cas-contract-{uuid.uuid4().hex}"
        store = CheckpointStore.open(url)
        for i in range(8):
            store.save("t", {"i": len(_HEADS), "turn": i})
            got = store.backend.read_ref(thread_key("t"))
            assert got is not None
            _HEADS.append(got[0])
        store.backend.delete_many([i.key for i in store.backend.list("")])
    return _HEADS[:n]


def _object(i: int, prefix: str = "ab") -> str:
    return f"packs/{prefix}/{i:062x}"


class BackendTests:
    """The storage contract: immutable objects (``get``, ``get_many``, ``put_many``, ``list``,
    ``delete_many``) and refs changed only by compare-and-swap (``read_ref``, ``write_ref``,
    ``delete_ref``), and their awaitable twins. Override ``make_backend`` (or the ``backend``
    fixture, when making one needs other fixtures); set ``concurrent_writers`` lower for a
    slow storage."""

    concurrent_writers = 8  # threads racing for one ref in the compare-and-swap test
    clock_skew = 600.0  # seconds a listed modified time may be off this machine's clock

    def make_backend(self, tmp_path: Path) -> Backend:
        """A backend on empty storage of its own (``tmp_path`` is pytest's, for local files)."""
        raise NotImplementedError("subclass BackendTests and define make_backend(tmp_path)")

    @pytest.fixture
    def backend(self, tmp_path: Path) -> Backend:
        return self.make_backend(tmp_path)

    # --- objects ---

    def test_a_missing_object_is_not_found(self, backend: Backend) -> None:
        with pytest.raises(NotFoundError):
            backend.get(_object(0))
        assert backend.get_many([_object(0)]) == {_object(0): None}

    def test_put_many_creates_and_get_returns_the_bytes(self, backend: Backend) -> None:
        items = {_object(i): bytes([i]) * (100 + i) for i in range(5)}
        backend.put_many(items)
        for key, data in items.items():
            assert backend.get(key) == data
        assert backend.get_many([*items, _object(99)]) == {**items, _object(99): None}
        backend.put_many(items)  # again: the same bytes, left as they are
        assert backend.get_many(items) == items

    def test_list_names_each_object_under_a_folder_with_its_size_and_time(
            self, backend: Backend) -> None:
        items = {_object(i, p): b"x" * (10 + i) for i in range(3) for p in ("ab", "cd")}
        backend.put_many(items)
        listed = {i.key: i for i in backend.list("packs")}
        assert set(listed) == set(items)
        for key, info in listed.items():
            assert info.size == len(items[key])
            assert abs(info.mtime - time.time()) < self.clock_skew
        assert {i.key for i in backend.list("packs/ab")} == {k for k in items if "/ab/" in k}
        assert {i.key for i in backend.list_many(["packs/ab", "packs/cd"])} == set(items)
        assert backend.list("nothing-here") == []

    def test_delete_many_removes_and_ignores_what_is_missing(self, backend: Backend) -> None:
        backend.put_many({_object(1): b"one", _object(2): b"two"})
        assert backend.delete_many([_object(1), _object(3)]) == []
        with pytest.raises(NotFoundError):
            backend.get(_object(1))
        assert [i.key for i in backend.list("packs")] == [_object(2)]

    # --- refs ---

    def test_a_missing_ref_reads_as_none(self, backend: Backend) -> None:
        assert backend.read_ref(thread_key("nobody")) is None
        assert backend.read_refs([thread_key("nobody"), thread_key("nor")]) == [None, None]

    def test_a_ref_is_created_only_if_absent(self, backend: Backend) -> None:
        one, two = heads(2)
        key = thread_key("t")
        version = backend.write_ref(key, one, None)
        assert backend.read_ref(key) == (one, version)
        with pytest.raises(RefMismatch):
            backend.write_ref(key, two, None)
        assert backend.read_ref(key) == (one, version)
        assert len(backend.list("refs")) == 1

    def test_a_ref_is_replaced_only_from_the_version_read(self, backend: Backend) -> None:
        one, two, three = heads(3)
        key = thread_key("t")
        first = backend.write_ref(key, one, None)
        second = backend.write_ref(key, two, first)
        assert second != first and backend.read_ref(key) == (two, second)
        with pytest.raises(RefMismatch):
            backend.write_ref(key, three, first)  # stale: another writer replaced it
        assert backend.read_ref(key) == (two, second)
        assert backend.read_refs([key, thread_key("other")]) == [(two, second), None]

    def test_a_ref_is_deleted_only_at_the_version_read(self, backend: Backend) -> None:
        one, two = heads(2)
        key = thread_key("t")
        first = backend.write_ref(key, one, None)
        second = backend.write_ref(key, two, first)
        with pytest.raises(RefMismatch):
            backend.delete_ref(key, first)
        assert backend.read_ref(key) == (two, second)
        backend.delete_ref(key, second)
        assert backend.read_ref(key) is None
        assert backend.write_ref(key, one, None)  # and it can be created again

    def test_racing_writers_of_one_version_have_one_winner(self, backend: Backend) -> None:
        n = self.concurrent_writers
        start, *bids = heads(n + 1)
        key = thread_key("t")
        version = backend.write_ref(key, start, None)
        barrier = threading.Barrier(n)
        won: list[tuple[bytes, str]] = []
        lost: list[int] = []

        def bid(data: bytes) -> None:
            barrier.wait()
            try:
                won.append((data, backend.write_ref(key, data, version)))
            except RefMismatch:
                lost.append(1)

        threads = [threading.Thread(target=bid, args=(data,)) for data in bids]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1 and len(lost) == n - 1
        assert backend.read_ref(key) == won[0]

    # --- the awaitable twins ---

    def test_the_awaitable_twins_keep_the_same_contract(self, backend: Backend) -> None:
        one, two = heads(2)
        key = thread_key("t")

        async def go() -> None:
            await backend.aput_many({_object(1): b"one"})
            assert await backend.aget_many([_object(1), _object(2)]) == {
                _object(1): b"one", _object(2): None}
            assert [i.key for i in await backend.alist("packs")] == [_object(1)]
            assert await backend.adelete_many([_object(1)]) == []
            assert await backend.aread_ref(key) is None
            first = await backend.awrite_ref(key, one, None)
            with pytest.raises(RefMismatch):
                await backend.awrite_ref(key, two, None)
            second = await backend.awrite_ref(key, two, first)
            assert await backend.aread_refs([key]) == [(two, second)]
            with pytest.raises(RefMismatch):
                await backend.adelete_ref(key, first)
            await backend.adelete_ref(key, second)
            assert await backend.aread_ref(key) is None
            await backend.aclose()

        asyncio.run(go())
