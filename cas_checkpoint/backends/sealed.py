"""The sealed backend: a storage whose thread refs are renamed (a keyed hash) and sealed on
their way to storage, so every part of the store that reads or writes refs works unchanged.
Rule: no ref leaves this wrapper in the clear, and no thread id in a key."""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from concurrent.futures import Future as ConcurrentFuture
from typing import Any, TypeVar

import blake3

from cas_checkpoint.backends import Backend, ObjectInfo
from cas_checkpoint.errors import InvalidArgumentError
from cas_checkpoint.format.sealing import HEADS, Keyring, is_sealed_key, open_head, seal_head

T = TypeVar("T")


class SealedBackend(Backend):
    """A backend whose thread refs are renamed (``e-`` + a keyed hash of their plain name) and
    sealed on the way to storage; everything else passes through. ``names`` is the store's
    names secret (None until ``opening`` read it, and for a key-less store). It does not
    expose the storage's own attributes (``fs``...): code that would open a second backend
    from them would bypass the sealing; ``inner`` is the storage, for those who mean it."""

    def __init__(self, inner: Backend, ring: Keyring) -> None:
        self.inner = inner
        self.ring = ring
        self.names: bytes | None = None
        self.concurrency = inner.concurrency
        self.url = inner.url
        self.has_folders = inner.has_folders
        self.list_after = inner.list_after
        self.pooled = inner.pooled  # (its sync methods seal as its async ones do)

    def prepare_folders(self, folders: Iterable[str], flush: bool = True) -> None:
        self.inner.prepare_folders(folders, flush)  # (packs and refs/heads keep their keys)

    def ref_key(self, key: str) -> str:
        """The stored key of a thread's ref (its plain key as ``refs.thread_key`` spells it)."""
        if not key.startswith(HEADS + "/") or is_sealed_key(key):
            return key
        if self.names is None:
            raise InvalidArgumentError(
                f"{self.url} is encrypted and was opened key-less: only gc and verify("
                "deep=False) work; open it with encryption=Key.from_env('CAS_KEY')")
        name = key[len(HEADS) + 1:]
        return f"{HEADS}/e-" + blake3.blake3(name.encode(), key=self.names).hexdigest()

    def _out(self, key: str, got: tuple[bytes, str] | None) -> tuple[bytes, str] | None:
        if got is None or not key.startswith(HEADS + "/"):
            return got
        return open_head(got[0], self.ring, key), got[1]

    def _in(self, key: str, data: bytes) -> bytes:
        if not key.startswith(HEADS + "/"):
            return data
        return seal_head(data, self.ring.write_key(), key)

    # --- the primitives ---

    def get(self, key: str) -> bytes:
        return self.inner.get(key)

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        return self.inner.get_many(keys)

    def put_many(self, items: dict[str, bytes]) -> None:
        self.inner.put_many(items)

    def read_ref(self, key: str) -> tuple[bytes, str] | None:
        key = self.ref_key(key)
        return self._out(key, self.inner.read_ref(key))

    def read_refs(self, keys: builtins.list[str]) -> builtins.list[tuple[bytes, str] | None]:
        keys = [self.ref_key(k) for k in keys]
        return [self._out(k, g) for k, g in zip(keys, self.inner.read_refs(keys), strict=True)]

    def write_ref(self, key: str, data: bytes, expected: str | None,
                  refresh: Callable[[], None] | None = None) -> str:
        key = self.ref_key(key)
        return self.inner.write_ref(key, self._in(key, data), expected, refresh)

    def delete_ref(self, key: str, expected: str) -> None:
        self.ring.write_key()
        self.inner.delete_ref(self.ref_key(key), expected)

    def list(self, prefix: str) -> builtins.list[ObjectInfo]:
        return self.inner.list(prefix)

    def delete_many(self, keys: Iterable[str]) -> builtins.list[str]:
        return self.inner.delete_many(keys)

    def list_many(self, prefixes: Iterable[str]) -> Iterable[ObjectInfo]:
        return self.inner.list_many(prefixes)

    def list_pages(self, prefix: str) -> Iterator[builtins.list[ObjectInfo]]:
        return self.inner.list_pages(prefix)

    def list_page(self, prefix: str, start_after: str | None = None,
                  limit: int = 1000) -> tuple[builtins.list[ObjectInfo], bool]:
        return self.inner.list_page(prefix, start_after, limit)

    async def alist_page(self, prefix: str, start_after: str | None = None,
                         limit: int = 1000) -> tuple[builtins.list[ObjectInfo], bool]:
        return await self.inner.alist_page(prefix, start_after, limit)

    def alist_pages(self, prefix: str) -> AsyncIterator[builtins.list[ObjectInfo]]:
        return self.inner.alist_pages(prefix)

    async def run_blocking(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await self.inner.run_blocking(fn, *args)

    def hand_off(self, fn: Callable[..., T], *args: Any) -> ConcurrentFuture[T]:
        return self.inner.hand_off(fn, *args)

    async def aget_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        return await self.inner.aget_many(keys)

    async def aput_many(self, items: dict[str, bytes]) -> None:
        await self.inner.aput_many(items)

    async def aread_ref(self, key: str) -> tuple[bytes, str] | None:
        key = self.ref_key(key)
        return self._out(key, await self.inner.aread_ref(key))

    async def aread_refs(self, keys: builtins.list[str]) -> builtins.list[tuple[bytes, str] | None]:
        keys = [self.ref_key(k) for k in keys]
        got = await self.inner.aread_refs(keys)
        return [self._out(k, g) for k, g in zip(keys, got, strict=True)]

    async def awrite_ref(self, key: str, data: bytes, expected: str | None,
                         refresh: Callable[[], None] | None = None) -> str:
        key = self.ref_key(key)
        return await self.inner.awrite_ref(key, self._in(key, data), expected, refresh)

    async def adelete_ref(self, key: str, expected: str) -> None:
        self.ring.write_key()
        await self.inner.adelete_ref(self.ref_key(key), expected)

    async def alist(self, prefix: str) -> builtins.list[ObjectInfo]:
        return await self.inner.alist(prefix)

    async def alist_many(self, prefixes: Iterable[str]) -> builtins.list[ObjectInfo]:
        return await self.inner.alist_many(prefixes)

    async def adelete_many(self, keys: Iterable[str]) -> builtins.list[str]:
        return await self.inner.adelete_many(keys)

    async def aclose(self) -> None:
        await self.inner.aclose()


def unwrap(backend: Backend) -> Backend:
    """The storage backend under a ``SealedBackend`` (itself otherwise)."""
    return backend.inner if isinstance(backend, SealedBackend) else backend
