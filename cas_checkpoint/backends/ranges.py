"""One folder listed in key ranges at once, where a range costs a request a page (S3's
``StartAfter``: ``Backend.list_after``).

A folder is listed from its first key, a page at a time. When its first page says more follow,
the rest of the key space is cut into ranges ``(after, end]`` (``after`` exclusive, as
``StartAfter`` is; ``end`` inclusive: a key equal to a boundary belongs to the range below it,
and the range above starts after it) and up to ``parts`` ranges are listed at once. Where the
keys lie is not known in advance (refs are base32 of the thread ids: ids with a common prefix
share a long key prefix, so a split by first character would put most of a store in one share),
so the cuts are taken from the keys themselves and adjusted as the listing goes:

* finding the end: a page is listed after a cut 1, then 4, 16... times the spread of the page
  before past its last key, until one is the last page. Each such page is the first of the
  range its cut starts, and the range before it (up to the cut) is listed from then on, so
  these pages never hold the same keys and a large store has ranges running after a few
  requests;
* a range that has listed two pages and has more, while fewer than ``parts`` ranges run,
  hands shares of its rest to new ranges: equal shares of the key space between its last key
  and its end (the open last range: shares as wide as the pages it listed);
* a split costs at most one more request (the partial last page of a share, or a share with
  no key), and splits are bounded: one for every 4 pages listed. Counted over 1,000 pages
  (``bench_scale.py --rounds``): 1,055-1,158 requests in 162-205 rounds, where one page
  after another takes 1,000 in 1,000.

Pages come out in the order they arrive, each page sorted, each range in key order; the
whole is not sorted. At most ``parts`` pages are held waiting for the caller, besides one in
hand per running range: memory does not grow with the folder.

Keys compare as strings, which orders them as S3 does (by their UTF-8 bytes). Cut points are
made of the characters the first page's keys use (``KeySpace``).
"""

from __future__ import annotations

import asyncio
import bisect
import builtins
from collections.abc import AsyncGenerator, Coroutine, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cas_checkpoint.backends.base import Backend, ObjectInfo

PAGE = 1000  # keys a request (S3's largest page); tests make it small to list many pages
PARTS = 8  # ranges listed at once, at most
SPLITS_PER_PAGE = 4  # one split (a new range) allowed for every this many pages listed


class KeySpace:
    """Keys as numbers, so a span of keys can be cut at equal shares. The digits are the
    characters the keys were seen to use (``chars``, sorted; 0 ends a key), so the shares
    follow where keys can be: base32 refs use 32 of the 95 printable characters, and a cut
    in the others would land where no key is. A character not seen counts as the one
    below it: order is kept (two keys that differ only there count as equal)."""

    def __init__(self, folder: str, keys: Iterable[str]) -> None:
        self.folder = folder  # the keys' common start (``refs/heads/``), not a digit
        self.chars = sorted({ch for key in keys for ch in key[len(folder):]})
        self.base = len(self.chars) + 1

    def number(self, key: str, width: int) -> int:
        n = 0
        key = key[len(self.folder):]
        for ch in key[:width]:
            n = n * self.base + bisect.bisect_right(self.chars, ch)
        return n * int(self.base ** (width - min(len(key), width)))

    def key(self, n: int, width: int) -> str:
        digits = []
        for _ in range(width):
            n, d = divmod(n, self.base)
            digits.append(d)
        out = []
        for d in reversed(digits):
            if d == 0:
                break
            out.append(self.chars[d - 1])
        return self.folder + "".join(out)

    def cuts(self, first: str, last: str, end: str | None, listed: int,
             n: int) -> builtins.list[str]:
        """Up to ``n`` keys strictly between ``last`` and ``end``, increasing, that cut the
        keys after ``last`` into ``n + 1`` shares: of ``(last, end]`` equal shares of the key
        space; of an open range (``end`` None) shares each as wide as ``listed`` pages that
        spread as ``first`` .. ``last`` did (the last share stays open). Fewer, or none, where
        the keys are too close to cut."""
        width = max(len(first), len(last), len(end or "")) + 2 - len(self.folder)
        lo, start = self.number(last, width), self.number(first, width)
        if end is None:
            wide = max(lo - start, 1) * max(listed, 1)  # ``listed`` pages' spread
            hi = min(int(self.base ** width) - 1, lo + wide * (n + 1))
        else:
            hi = self.number(end, width)
        out: builtins.list[str] = []
        for j in range(1, n + 1):
            key = self.key(lo + (hi - lo) * j // (n + 1), width)
            if last < key and (end is None or key < end) and (not out or out[-1] < key):
                out.append(key)
        return out

    def past(self, first: str, last: str, scale: int) -> str | None:
        """The key ``scale`` times the spread of ``first`` .. ``last`` past ``last`` (None:
        past the last key there can be)."""
        width = max(len(first), len(last)) + 2 - len(self.folder)
        lo, start = self.number(last, width), self.number(first, width)
        at = lo + max(lo - start, 1) * scale
        return self.key(at, width) if at < int(self.base ** width) else None


class _Split:
    """The ranges of one listing, run as tasks on the caller's event loop."""

    def __init__(self, backend: Backend, folder: str, parts: int, page_size: int) -> None:
        self.backend, self.folder = backend, folder
        self.parts, self.page_size = max(1, parts), page_size
        self.out: asyncio.Queue[builtins.list[ObjectInfo] | BaseException | None] = \
            asyncio.Queue(self.parts)
        self.tasks: set[asyncio.Task[None]] = set()
        self.running = 0
        self.pages = 1  # the first, listed before the split
        self.splits = 0
        self.gate = asyncio.Semaphore(self.parts)
        self.space = KeySpace(folder + "/", ())

    def _start(self, coro: Coroutine[Any, Any, None]) -> None:
        self.running += 1
        task = asyncio.ensure_future(self._guard(coro))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _guard(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the caller raises it (and cancels the other ranges)
            await self.out.put(exc)
            return
        self.running -= 1
        if not self.running:
            await self.out.put(None)  # every range is done

    def _hand_off(self, first: str, last: str, end: str | None, listed: int) -> str | None:
        """Give part of ``(last, end]`` to new ranges while fewer than ``parts`` run; returns
        the end this range keeps."""
        budget = self.pages // SPLITS_PER_PAGE - self.splits
        idle = min(self.parts - self.running, budget)
        if idle <= 0 or listed < 2:  # only a range that has shown it is long
            return end
        cuts = self.space.cuts(first, last, end, listed, idle)
        for after, upto in zip(cuts, [*cuts[1:], end][:len(cuts)], strict=True):
            self.splits += 1
            self._start(self._walk(after, upto, 0))
        return cuts[0] if cuts else end

    async def _walk(self, after: str, end: str | None, listed: int,
                    got: tuple[builtins.list[ObjectInfo], bool] | None = None) -> None:
        """List the keys in ``(after, end]`` a page at a time (the first may be ``got``
        already), handing off as it goes."""
        while True:
            page, more = got or await self._page(after)
            got = None
            listed += 1
            if end is not None and page and page[-1].key >= end:  # the range ends in this page
                page = [i for i in page if i.key <= end]
                more = False
            if page:
                await self.out.put(page)
            if not more or not page:
                return
            after = page[-1].key
            end = self._hand_off(page[0].key, after, end, listed)

    async def _page(self, after: str | None) -> tuple[builtins.list[ObjectInfo], bool]:
        async with self.gate:  # at most ``parts`` requests in flight
            got = await self.backend.alist_page(self.folder, after, self.page_size)
        self.pages += 1
        return got

    async def _probe(self, first: str, last: str) -> None:
        """Find where the keys end, a page at a time: list a page after the key 1, then 4,
        16... times the spread of the page before past its last key. Each such page is the
        first of the range its cut starts, and the range before it (up to the cut) is listed
        from then on: no two of these pages hold the same keys."""
        after, got, scale = last, None, 1
        while True:
            cut = self.space.past(first, last, scale)
            if cut is None or cut <= last:  # past the last key there can be
                break
            page = await self._page(cut)
            self._start(self._walk(after, cut, 0, got))
            after, got, scale = cut, page, scale * 4
            if not page[1]:  # no key after this page: the last range
                break
            first, last = page[0][0].key, page[0][-1].key
        self._start(self._walk(after, None, 0, got))

    async def pages_from(self, first: builtins.list[ObjectInfo]) -> AsyncGenerator[
            builtins.list[ObjectInfo]]:
        self.space = KeySpace(self.folder + "/", (i.key for i in first))
        self._start(self._probe(first[0].key, first[-1].key))  # it starts the ranges
        try:
            while True:
                got = await self.out.get()
                if got is None:
                    return
                if isinstance(got, BaseException):
                    raise got
                yield got
        finally:
            for task in builtins.list(self.tasks):
                task.cancel()
            if self.tasks:
                await asyncio.gather(*self.tasks, return_exceptions=True)


async def alist_split(backend: Backend, prefix: str, *, parts: int | None = None,
                      page_size: int | None = None) -> AsyncGenerator[builtins.list[ObjectInfo]]:
    """Every key under ``prefix`` (a folder), a page at a time, listed in up to ``parts`` key
    ranges at once once the first page shows there is more (see the module's docstring): pages
    in the order they arrive, each sorted. A folder of one page costs one request, as a plain
    listing does. Closing the iterator early cancels the ranges still listing."""
    folder = prefix.rstrip("/")
    size = page_size or PAGE
    first, more = await backend.alist_page(folder, None, size)
    if first:
        yield first
    if not more or not first:
        return
    split = _Split(backend, folder, PARTS if parts is None else parts, size).pages_from(first)
    try:
        async for page in split:
            yield page
    finally:  # (closed now, not when the loop's finalizer gets to it: the ranges still
        await split.aclose()  # listing are cancelled before a caller's aclose returns)
