"""S3 (and S3-compatible) storage through s3fs, with conditional writes for refs.

* objects: ``PutObject`` with ``If-None-Match: *`` (an existing object is left alone);
* refs: ``GetObject`` returns body and ETag together (never a listing cache), then ``PutObject``
  with ``If-Match: <etag>`` to replace or ``If-None-Match: *`` to create; a 412 is a mismatch;
* on the first write, one probe checks that the endpoint refuses a second ``If-None-Match: *``
  PUT (and a PUT and a DELETE with a wrong ``If-Match``); without that, two writers could
  overwrite each other's refs, so writing is refused unless the caller passed
  ``allow_unsafe=True``;
* transient failures (timeouts, resets, 5xx, throttling) are retried with bounded exponential
  backoff and jitter, ``retries`` attempts of at most ``timeout`` each in all (botocore and
  s3fs retry nothing themselves, ``backends/__init__.py``); permanent ones (access denied, no
  such bucket, bad key) fail at once;
* every ref write carries a unique write id in its user metadata (``x-amz-meta-cas-write-id``).
  When a conditional PUT fails with a 412 or an ambiguous error (its reply may have been lost,
  and a retry of an applied PUT gets a 412), the ref is read again: if it carries
  our write id, the write was applied and succeeds, instead of being reported as a conflict and
  appended twice.

Every operation is written once, as a coroutine over s3fs's ``_call_s3`` (the aiobotocore
client): the async face (``aget_many``, ``awrite_ref``...) awaits it on the caller's event loop,
and each sync method runs it on the filesystem's own loop (``_run``). Which one applies depends on
the filesystem the backend wraps:

* a sync ``S3FileSystem`` (``open_backend``): its client belongs to fsspec's private I/O loop.
  The sync methods run there; the async face must not await that client on another loop, so it
  runs the sync method on a thread (``Backend.run_blocking``) instead;
* an asynchronous one (``S3FileSystem(asynchronous=True)``, made by ``open_backend_async`` on the
  caller's loop): the async face is native, no thread and no ``sync()``; the sync methods raise
  ``InvalidArgumentError`` (blocking on that loop from its own thread would deadlock).
"""

from __future__ import annotations

import asyncio
import builtins
import errno
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator
from typing import Any, TypeVar

from fsspec.asyn import sync

from cas_checkpoint.backends.base import MAX_REF_BYTES, Backend, ObjectInfo, RefMismatch
from cas_checkpoint.backends.ranges import alist_split
from cas_checkpoint.backends.retry import (
    Backoff,
    error_code,
    is_precondition,
)
from cas_checkpoint.backends.s3_calls import S3Calls, _as_oserror
from cas_checkpoint.errors import (
    CasError,
    FormatError,
    InvalidArgumentError,
    NotFoundError,
    StorageError,
    UnsafeStorageError,
)

log = logging.getLogger("cas_checkpoint")
T = TypeVar("T")
WRITE_ID = "cas-write-id"  # user-metadata key of the write id on every ref write
_code = error_code
_is_precondition = is_precondition


def _is_missing(exc: BaseException) -> bool:
    return isinstance(exc, FileNotFoundError) and _code(exc) != "NoSuchBucket"


async def _all(coros: Iterable[Coroutine[Any, Any, T]]) -> builtins.list[T]:
    """Run ``coros`` concurrently; the first failure cancels the others (``gather`` would leave
    them running on the loop), and so does cancelling the caller."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return builtins.list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        raise


class S3Backend(S3Calls, Backend):
    concurrency = 32
    ref_version_listed = True  # GetObject and ListObjectsV2 give the same ETag
    list_after = True  # ListObjectsV2's StartAfter: a folder is listed in key ranges at once
    backoff = Backoff()  # the only retries of a store opened from a URL (see retry.py)

    def __init__(self, fs: Any, root: str, *, allow_unsafe: bool = False,
                 retries: int | None = None) -> None:
        if retries is not None:
            self.backoff = Backoff(attempts=retries)
        self._answered = False  # the endpoint answered once: then a failed connection is a
        #                         blip worth retrying; before, it is a wrong URL: fail fast
        self.fs = fs
        self.asynchronous = bool(getattr(fs, "asynchronous", False))
        self.owns_session = False  # open_backend_async made the fs: aclose() closes its client
        root = root.strip("/")
        self.bucket, _, prefix = root.partition("/")
        if len(self.bucket) < 3:
            raise StorageError(f"{root!r} does not name an S3 bucket; use s3://bucket/prefix")
        self.prefix = prefix.strip("/")
        self.url = f"s3://{root}"
        self.allow_unsafe = allow_unsafe
        self._safe: bool | None = None
        self._unsafe_reason = ""
        self._probe_lock: asyncio.Lock | None = None  # made on first use, on the loop it serves
        self._probe_loop: asyncio.AbstractEventLoop | None = None

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """A sync method: run one of the coroutines below on the fs's own loop (fsspec's I/O
        thread) and wait for it."""
        if self.asynchronous:
            coro.close()
            raise InvalidArgumentError(
                f"{self.url} was opened for asyncio (AsyncCheckpointStore.open or "
                "open_backend_async): its S3 client belongs to that event loop, so its blocking "
                "methods cannot be used; use its awaitable methods (aget_many, awrite_ref...)")

        async def wrapped() -> T:
            return await coro

        try:
            result: T = sync(self.fs.loop, wrapped)
        except (CasError, RefMismatch):
            raise  # what the coroutine raised, already mapped
        except Exception as exc:  # fsspec's loop itself failed (closed at exit, forked...)
            err = exc if isinstance(exc, OSError) else _as_oserror(exc)
            raise self._fail("running a request", err) from err
        return result

    def _native(self) -> bool:
        """May the async face await S3 calls right here? Yes on an asynchronous fs (its client
        lives on the caller's loop) and on a sync fs's own loop (where ``_run`` sends the sync
        methods). Otherwise the client belongs to fsspec's private loop: awaiting it on the
        caller's loop would mix two loops, so the async face falls back to running the sync
        method on a thread (the base class's ``run_blocking``)."""
        return self.asynchronous or asyncio.get_running_loop() is self.fs.loop

    # The async face. ``run_blocking`` stays the base class's (the process's small pool,
    # started on first use): S3 requests never go through it on an asynchronous fs; it serves
    # blocking local-disk work, and the fallback of a sync fs (see ``_native``).

    async def aclose(self) -> None:
        await super().aclose()  # (forgets the process's pool, if the fallback used it)
        client = getattr(self.fs, "_s3", None)
        if self.owns_session and client is not None:
            creator = getattr(self.fs, "_s3creator", None)
            self.fs._s3 = None  # a later call would open a new client
            if creator is not None:
                await creator.__aexit__(None, None, None)

    # --- objects ---

    async def _get_object(self, key: str, limit: int | None = None
                          ) -> tuple[bytes, str, str] | None:
        """(body, ETag, write id) of a key read in one GET, or None if it does not exist.
        With ``limit``, a larger object is refused (FormatError) before its body is read."""
        return await self._retrying(f"reading {key}", lambda: self._get_once(key, limit))

    async def _get_once(self, key: str, limit: int | None = None
                        ) -> tuple[bytes, str, str] | None:
        """``_get_object`` in one attempt (a failure is raised as it is)."""
        try:
            resp = await self.fs._call_s3("get_object", Bucket=self.bucket,
                                          Key=self._key(key))
        except FileNotFoundError as exc:
            if _code(exc) == "NoSuchBucket":
                raise
            return None
        body = resp["Body"]
        size = resp.get("ContentLength")
        if limit is not None and isinstance(size, int) and size > limit:
            body.close()
            raise FormatError(f"{key} on {self.url} is {size} bytes, larger than any valid "
                              f"ref ({limit}); it is corrupt or hostile")
        try:  # a reply cut short fails here, and is retried with the request
            data = bytes(await body.read())
        finally:
            body.close()
        meta = resp.get("Metadata") or {}
        return data, str(resp["ETag"]), str(meta.get(WRITE_ID, ""))

    def get(self, key: str) -> bytes:
        data = self.get_many([key])[key]
        if data is None:
            raise NotFoundError(f"{key} does not exist in {self.url}")
        return data

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        return self._run(self.aget_many(keys))

    async def aget_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        keys = builtins.list(dict.fromkeys(keys))
        if not self._native():
            return await super().aget_many(keys)
        sem = asyncio.Semaphore(self.concurrency)

        async def one(key: str) -> bytes | None:
            async with sem:
                got = await self._get_object(key)
                return None if got is None else got[0]

        got = await self._mapped("reading objects", _all(one(k) for k in keys))
        return dict(zip(keys, got, strict=True))

    def put_many(self, items: dict[str, bytes]) -> None:
        self._run(self.aput_many(items))

    async def aput_many(self, items: dict[str, bytes]) -> None:
        if not self._native():
            return await super().aput_many(items)
        sem = asyncio.Semaphore(self.concurrency)

        async def one(key: str, data: bytes) -> None:
            async with sem:
                for _ in range(3):
                    try:  # idempotent: the same key always gets the same bytes
                        await self._s3("put_object", Key=self._key(key), Body=data,
                                       IfNoneMatch="*")
                        return
                    except OSError as exc:
                        if not _is_precondition(exc):
                            raise
                    # It exists. A copy of another size is damaged: overwrite it (same name, so
                    # same bytes by construction). Else copy it onto itself so its LastModified
                    # moves and a running gc keeps it (gc.py); a 404 means a gc deleted it just
                    # now: PUT it again.
                    try:
                        head = await self._s3("head_object", Key=self._key(key))
                        if int(head.get("ContentLength", -1)) != len(data):
                            log.warning("%s on %s has %s bytes, not %d: rewriting it", key,
                                        self.url, head.get("ContentLength"), len(data))
                            await self._s3("put_object", Key=self._key(key), Body=data)
                            return
                    except FileNotFoundError as exc:
                        if not _is_missing(exc):
                            raise
                        continue
                    try:
                        await self._s3("copy_object", Key=self._key(key), CopySource={
                            "Bucket": self.bucket, "Key": self._key(key)},
                            MetadataDirective="REPLACE")
                        return
                    except FileNotFoundError as exc:
                        if not _is_missing(exc):
                            raise
                raise OSError(errno.EIO, f"{key} was deleted three times while being written "
                              "(a gc with a very short grace is running?); retry the save")

        await self._acheck_safe()
        await self._mapped("writing objects", _all(one(k, v) for k, v in items.items()))

    # --- refs ---

    def read_ref(self, key: str) -> tuple[bytes, str] | None:
        return self._run(self.aread_ref(key))

    async def aread_ref(self, key: str) -> tuple[bytes, str] | None:
        if not self._native():
            return await super().aread_ref(key)
        got = await self._mapped(f"reading ref {key}", self._get_object(key, MAX_REF_BYTES))
        return None if got is None else (got[0], got[1])

    def read_refs(self, keys: builtins.list[str]) -> builtins.list[tuple[bytes, str] | None]:
        return self._run(self.aread_refs(keys))

    async def aread_refs(self, keys: builtins.list[str]) -> builtins.list[tuple[bytes, str] | None]:
        """Several refs (None for a missing one): one GET each, ``concurrency`` at a time."""
        if not self._native():
            return await super().aread_refs(keys)
        sem = asyncio.Semaphore(self.concurrency)

        async def one(key: str) -> tuple[bytes, str] | None:
            async with sem:
                got = await self._get_object(key, MAX_REF_BYTES)
            return None if got is None else (got[0], got[1])

        return await self._mapped("reading refs", _all(one(k) for k in keys))

    def write_ref(self, key: str, data: bytes, expected: str | None,
                  refresh: Callable[[], None] | None = None) -> str:
        return self._run(self.awrite_ref(key, data, expected, refresh))

    async def awrite_ref(self, key: str, data: bytes, expected: str | None,
                         refresh: Callable[[], None] | None = None) -> str:
        """``refresh`` is ignored: S3 writers do not wait for each other's lock."""
        if not self._native():
            return await super().awrite_ref(key, data, expected, refresh)
        await self._acheck_safe()
        wid = secrets.token_hex(12)
        cond = {"IfNoneMatch": "*"} if expected is None else {"IfMatch": expected}

        async def go() -> str:
            failed = 0  # transient failures of this call's requests: the PUTs and re-reads
            while True:
                failure: Exception | None = None
                try:
                    resp = await self.fs._call_s3("put_object", Bucket=self.bucket,
                                                  Key=self._key(key), Body=data,
                                                  Metadata={WRITE_ID: wid}, **cond)
                    self._answered = True
                    return str(resp["ETag"])
                except Exception as exc:  # 404: If-Match on a deleted key
                    failure = exc
                refused = _is_precondition(failure) or _is_missing(failure)
                if refused:
                    self._answered = True
                else:  # no reply: wait, then see whether it landed
                    failed = await self._spend(f"updating ref {key}", failure, failed)
                # Refused, or no reply: did our PUT land (a lost reply, retried into a 412)?
                try:
                    now = await self._get_once(key)
                except Exception as exc:
                    failed = await self._spend(f"updating ref {key}", exc, failed)
                    continue  # PUT again: if the last one landed, this one is refused
                if now is not None and now[2] == wid:
                    log.debug("ref %s: write %s was applied, its reply was lost", key, wid)
                    return now[1]
                if refused or (now[1] if now else None) != expected:
                    raise RefMismatch(key) from failure

        return await self._mapped(f"updating ref {key}", go())

    def delete_ref(self, key: str, expected: str) -> None:
        self._run(self.adelete_ref(key, expected))

    async def adelete_ref(self, key: str, expected: str) -> None:
        if not self._native():
            return await super().adelete_ref(key, expected)
        await self._acheck_safe()

        async def go() -> None:
            failed = 0  # transient failures of this call's requests: the DELETEs and re-reads
            while True:
                failure: Exception | None = None
                try:
                    await self.fs._call_s3("delete_object", Bucket=self.bucket,
                                           Key=self._key(key), IfMatch=expected)
                    self._answered = True
                    return
                except Exception as exc:
                    failure = exc
                refused = _is_precondition(failure) or _is_missing(failure)
                if refused:
                    self._answered = True
                else:
                    failed = await self._spend(f"deleting ref {key}", failure, failed)
                try:
                    now = await self._get_once(key)
                except Exception as exc:
                    failed = await self._spend(f"deleting ref {key}", exc, failed)
                    continue
                if now is None:  # gone, as wanted (our delete whose reply was lost, or another)
                    return
                if refused or now[1] != expected:
                    raise RefMismatch(key) from failure

        await self._mapped(f"deleting ref {key}", go())

    # --- the conditional-write probe ---

    def _check_safe(self) -> None:
        self._run(self._acheck_safe())

    async def _acheck_safe(self) -> None:
        """Once per backend: does the endpoint honour every condition the store relies on? The
        first writers wait for one probe (a lock, so 50 concurrent first writes make one probe;
        a probe that failed or was cancelled is tried again by the next write)."""
        if self._safe or self.allow_unsafe:
            return
        if self._safe is None:
            loop = asyncio.get_running_loop()
            if self._probe_lock is None or self._probe_loop is not loop:
                self._probe_lock, self._probe_loop = asyncio.Lock(), loop
            async with self._probe_lock:
                if self._safe is None:
                    self._safe = await self._aprobe()
        if not self._safe:  # every write asks again, so a caught error cannot be skipped past
            raise UnsafeStorageError(
                f"{self.url} does not honour {self._unsafe_reason}, so concurrent writers could "
                "lose checkpoints. Use a storage that honours If-None-Match and If-Match on PUT "
                "and If-Match on DELETE (AWS S3, MinIO, R2...), or pass allow_unsafe=True if "
                "only one writer ever touches each thread."
            )

    async def _aprobe(self) -> bool:
        """Try each condition on a scratch key: a second PUT with If-None-Match: * must be
        refused, and so must a PUT and a DELETE with If-Match naming a wrong ETag."""
        name = f"probe/{secrets.token_hex(8)}"
        probe = self._key(name)
        wrong = '"00000000000000000000000000000000"'

        async def refused(method: str, **kw: Any) -> bool:
            """True if the request was refused with 412 Precondition Failed."""
            try:
                await self._s3(method, Key=probe, **kw)
                return False
            except OSError as exc:
                if not _is_precondition(exc):
                    raise
                return True

        async def go() -> str:
            await refused("put_object", Body=b"1", IfNoneMatch="*")  # a 412 here: a lost reply
            try:
                if not await refused("put_object", Body=b"2", IfNoneMatch="*"):
                    return "If-None-Match: * on PUT (a second create was accepted)"
                if not await refused("put_object", Body=b"3", IfMatch=wrong):
                    return "If-Match on PUT (a wrong ETag was accepted)"
                if not await refused("delete_object", IfMatch=wrong):
                    return "If-Match on DELETE (a wrong ETag was accepted)"
                got = await self._get_object(name)
                if got is None or got[0] != b"1":
                    return "conditional writes (the probe object changed)"
                return ""
            finally:
                try:
                    await self._s3("delete_object", Key=probe)
                except OSError:
                    pass  # a leftover probe is harmless

        self._unsafe_reason = await self._mapped("checking conditional writes", go())
        return not self._unsafe_reason

    # --- listing ---

    def _info(self, item: dict[str, Any]) -> ObjectInfo:
        strip = len(self.prefix) + 1 if self.prefix else 0
        return ObjectInfo(item["Key"][strip:], int(item["Size"]), item["LastModified"].timestamp(),
                          version=str(item.get("ETag") or ""))

    async def _list(self, prefix: str) -> builtins.list[ObjectInfo]:
        """One ListObjectsV2 paginator over ``prefix`` (a folder)."""
        out: builtins.list[ObjectInfo] = []
        kw: dict[str, Any] = {"Prefix": self._key(prefix.rstrip("/")) + "/"}
        while True:
            resp = await self._s3("list_objects_v2", **kw)
            out += [self._info(item) for item in resp.get("Contents", [])]
            if not resp.get("IsTruncated"):
                return out
            kw["ContinuationToken"] = resp["NextContinuationToken"]

    def list(self, prefix: str) -> builtins.list[ObjectInfo]:
        return self._run(self.alist(prefix))

    async def _page(self, prefix: str, start_after: str | None,
                    limit: int) -> tuple[builtins.list[ObjectInfo], bool]:
        kw: dict[str, Any] = {"Prefix": self._key(prefix.rstrip("/")) + "/", "MaxKeys": limit}
        if start_after is not None:
            kw["StartAfter"] = self._key(start_after)
        resp = await self._s3("list_objects_v2", **kw)
        return [self._info(item) for item in resp.get("Contents", [])], bool(
            resp.get("IsTruncated"))

    def list_page(self, prefix: str, start_after: str | None = None,
                  limit: int = 1000) -> tuple[builtins.list[ObjectInfo], bool]:
        return self._run(self.alist_page(prefix, start_after, limit))

    async def alist_page(self, prefix: str, start_after: str | None = None,
                         limit: int = 1000) -> tuple[builtins.list[ObjectInfo], bool]:
        """One ListObjectsV2 request: up to ``limit`` keys after ``start_after``."""
        if not self._native():
            return await super().alist_page(prefix, start_after, limit)
        return await self._mapped(f"listing {prefix}", self._page(prefix, start_after, limit))

    def list_pages(self, prefix: str) -> Iterator[builtins.list[ObjectInfo]]:
        """A page (up to 1,000 keys) at a time: the first page, then, if more follow, key
        ranges listed at once (``ranges.py``), their pages as they arrive. Ranges run on the
        filesystem's loop between the pages taken; at most a few pages wait for the caller."""
        pages = alist_split(self, prefix)

        async def step() -> builtins.list[ObjectInfo] | None:
            try:
                return await pages.__anext__()
            except StopAsyncIteration:
                return None

        try:
            while (page := self._run(step())) is not None:
                yield page
        finally:
            if not self.asynchronous:
                self._run(pages.aclose())  # cancels the ranges still listing

    async def alist(self, prefix: str) -> builtins.list[ObjectInfo]:
        if not self._native():
            return await super().alist(prefix)
        return [i async for page in alist_split(self, prefix) for i in page]

    async def alist_pages(self, prefix: str) -> AsyncIterator[builtins.list[ObjectInfo]]:
        if not self._native():
            async for page in super().alist_pages(prefix):
                yield page
            return
        async for page in alist_split(self, prefix):
            yield page

    def list_many(self, prefixes: Iterable[str]) -> Iterable[ObjectInfo]:
        return self._run(self.alist_many(prefixes))

    async def alist_many(self, prefixes: Iterable[str]) -> builtins.list[ObjectInfo]:
        """Every key under each prefix: one ListObjectsV2 paginator per prefix, concurrently."""
        folders = [p.rstrip("/") for p in prefixes]
        if not self._native():
            return await super().alist_many(folders)
        sem = asyncio.Semaphore(self.concurrency)
        strip = len(self.prefix) + 1 if self.prefix else 0

        async def one(prefix: str) -> builtins.list[ObjectInfo]:
            async with sem:
                return await self._list(prefix)

        async def go() -> builtins.list[ObjectInfo]:
            parents = {f.rsplit("/", 1)[0] for f in folders}
            if len(folders) > 8 and len(parents) == 1:  # a small store: one request may do
                resp = await self._s3("list_objects_v2", Prefix=self._key(parents.pop()) + "/")
                if not resp.get("IsTruncated"):
                    want = set(folders)
                    return [self._info(item) for item in resp.get("Contents", [])
                            if item["Key"][strip:].rsplit("/", 1)[0] in want]
            return [i for part in await _all(one(p) for p in folders) for i in part]

        return await self._mapped("listing objects", go())

    def delete_many(self, keys: Iterable[str]) -> builtins.list[str]:
        return self._run(self.adelete_many(keys))

    async def adelete_many(self, keys: Iterable[str]) -> builtins.list[str]:
        """DeleteObjects in batches of 1,000; returns the keys whose per-key ``Errors`` said
        they were not deleted."""
        keys = builtins.list(keys)
        if not self._native():
            return await super().adelete_many(keys)
        strip = len(self.prefix) + 1 if self.prefix else 0

        async def go() -> builtins.list[str]:
            failed: builtins.list[str] = []
            for i in range(0, len(keys), 1000):
                batch = [{"Key": self._key(k)} for k in keys[i:i + 1000]]
                resp = await self._s3("delete_objects", Delete={"Objects": batch, "Quiet": True})
                for err in resp.get("Errors") or []:
                    if err.get("Code") != "NoSuchKey":
                        log.warning("%s: could not delete %s: %s %s", self.url, err.get("Key"),
                                    err.get("Code"), err.get("Message"))
                        failed.append(str(err.get("Key", ""))[strip:])
            return failed

        return await self._mapped("deleting objects", go())
