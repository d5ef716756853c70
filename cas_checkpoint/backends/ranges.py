"""One folder listed in key ranges at once, where a range costs a request a page (S3's
``StartAfter``: ``Backend.list_after``).

A folder is listed from its first key, a page at a time. When its first page says more follow,
the rest of the key space is cut into ranges ``(after, end]`` (``after`` exclusive, as
``StartAfter`` is; ``end`` inclusive: a key equal to a boundary belongs to the range below it,
and the range above starts after it) and up to ``parts`` ranges are listed at once. Where the
keys lie is not known in advance (refs are base32 of the thread ids: ids with a common prefix
share a long key prefix, so a split by first character would put most of a store in one share),
so the cuts are taken from the keys themselves and adjusted as the listing goes:

* a range whose page says more follow, while fewer than ``parts`` ranges run, hands part of its
  rest to new ranges: a bounded one is cut into equal shares of the key space between its last
  key and its end; the open last range, whose end is unknown, keeps as many pages' worth of keys
  as it has listed (measured by its last page's spread) and hands on shares as wide, the last of
  them open. A store's ranges thus follow its keys wherever they cluster, and grow geometrically
  where the store is large;
* every split costs at most one extra request (the partial last page of a range, or an empty
  range past the last key), and splits are bounded: ``parts`` plus one for every 16 pages
  listed (at most ~6% more requests than one listing page after page).

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
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cas_checkpoint.backends.base import Backend, ObjectInfo

PAGE = 1000  # keys a request (S3's largest page); tests make it small to list many pages
PARTS = 8  # ranges listed at once, at most
SPLITS_PER_PAGE = 8  # one split allowed for every this many pages listed (beyond ``parts``)
PROBES = 2  # cut points tried at once to find where the keys end

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
        budget = self.parts + self.pages // SPLITS_PER_PAGE - self.splits
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
        """Find where the keys end: a page after each of the cut points 1, 4, 16... times the
        first page's spread past ``last`` (two at a time, until one is the last page), each
        page the first of the range its cut starts. Each range is listed as soon as its end
        is known."""
        after, got, scale = last, None, 1
        while True:
            cuts: builtins.list[str] = []
            for _ in range(PROBES):
                key = self.space.past(first, last, scale)
                scale *= 4
                if key is not None and key > (cuts[-1] if cuts else after):
                    cuts.append(key)
            if not cuts:  # past the last key there can be
                self._start(self._walk(after, None, 0, got))
                return
            pages = await asyncio.gather(*(self._page(key) for key in cuts))
            for start, end, page in zip([after, *cuts], cuts, [got, *pages], strict=False):
                self._start(self._walk(start, end, 0, page))
            after, got = cuts[-1], pages[-1]
            if not got[1]:  # no key after this page: the last range
                self._start(self._walk(after, None, 0, got))
                return

    async def pages_from(self, first: builtins.list[ObjectInfo]) -> AsyncIterator[
            builtins.list[ObjectInfo]]:
        self.running += 1  # (the probe: until it has started the ranges)
        self.space = KeySpace(self.folder + "/", (i.key for i in first))
        self._start(self._probe(first[0].key, first[-1].key))
        self.running -= 1
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
    async for page in _Split(backend, folder, PARTS if parts is None else parts,
                             size).pages_from(first):
        yield page
