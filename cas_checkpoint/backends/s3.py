"""S3 (and S3-compatible) storage through s3fs, with conditional writes for refs.

* objects: ``PutObject`` with ``If-None-Match: *`` (an existing object is left alone);
* refs: ``GetObject`` returns body and ETag together (never a listing cache), then ``PutObject``
  with ``If-Match: <etag>`` to replace or ``If-None-Match: *`` to create; a 412 is a mismatch;
* on opening, one probe checks that the endpoint refuses a second ``If-None-Match: *`` PUT;
  without that, two writers could overwrite each other's refs, so writing is refused unless the
  caller passed ``allow_unsafe=True``;
* transient failures (timeouts, resets, 5xx, throttling) are retried with bounded exponential
  backoff and jitter; permanent ones (access denied, no such bucket, bad key) fail at once;
* every ref write carries a unique write id in its user metadata (``x-amz-meta-cas-write-id``).
  When a conditional PUT fails with a 412 or an ambiguous error (its reply may have been lost,
  and botocore's own retry of an applied PUT gets a 412), the ref is read again: if it carries
  our write id, the write was applied and succeeds, instead of being reported as a conflict and
  appended twice.
"""

from __future__ import annotations

import asyncio
import builtins
import errno
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from fsspec.asyn import sync

from ..errors import CasError, FormatError, NotFoundError, StorageError, UnsafeStorageError
from ..retry import Backoff, error_code, is_connection_error, is_precondition, is_transient
from .base import MAX_REF_BYTES, Backend, ObjectInfo, RefMismatch

log = logging.getLogger("cas_checkpoint")
T = TypeVar("T")
WRITE_ID = "cas-write-id"  # user-metadata key of the write id on every ref write
_code = error_code
_is_precondition = is_precondition


def _is_missing(exc: BaseException) -> bool:
    return isinstance(exc, FileNotFoundError) and _code(exc) != "NoSuchBucket"


class S3Backend(Backend):
    concurrency = 32
    backoff = Backoff()  # our retries, on top of botocore's and s3fs's own

    def __init__(self, fs: Any, root: str, *, allow_unsafe: bool = False,
                 retries: int | None = None) -> None:
        if retries is not None:
            self.backoff = Backoff(attempts=retries)
        self._answered = False  # the endpoint answered once: then a failed connection is a
        #                         blip worth retrying; before, it is a wrong URL: fail fast
        self.fs = fs
        root = root.strip("/")
        self.bucket, _, prefix = root.partition("/")
        if len(self.bucket) < 3:
            raise StorageError(f"{root!r} does not name an S3 bucket; use s3://bucket/prefix")
        self.prefix = prefix.strip("/")
        self.url = f"s3://{root}"
        self.allow_unsafe = allow_unsafe
        self._safe: bool | None = None
        self._unsafe_reason = ""

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _run(self, coro: Any) -> Any:
        async def wrapped() -> Any:
            return await coro

        try:
            return sync(self.fs.loop, wrapped)
        except (OSError, CasError, RefMismatch):
            raise
        except Exception as exc:  # botocore's connection/endpoint errors are not OSErrors
            raise OSError(errno.EIO, f"{type(exc).__name__}: {exc}") from exc

    def _fail(self, what: str, exc: BaseException) -> StorageError:
        code = _code(exc) or type(exc).__name__
        hint = {
            "NoSuchBucket": "create the bucket or fix the URL",
            "AccessDenied": "check the credentials and the bucket policy",
            "InvalidAccessKeyId": "check the credentials",
            "SignatureDoesNotMatch": "check the secret key",
        }.get(code, "check the endpoint, credentials and network, then retry")
        if is_connection_error(exc) and not self._answered:
            hint = ("the endpoint could not be reached at all (refused, unknown host or no "
                    "answer); check the URL, endpoint_url / AWS_ENDPOINT_URL, the network and "
                    "that the server runs. Nothing was written")
        elif is_transient(exc):
            hint = (f"the storage kept failing after {self.backoff.attempts} attempts with "
                    "backoff (and botocore's own retries); check the endpoint and network, then "
                    "retry: nothing half-written is ever visible")
        return StorageError(f"{what} failed on {self.url}: {code}: {exc}; {hint}")

    async def _retrying(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, again after a transient failure (bounded, exponential backoff with
        jitter); a permanent failure or a precondition failure is raised at once."""
        for attempt in range(self.backoff.attempts):
            try:
                result = await call()
                self._answered = True
                return result
            except Exception as exc:
                if attempt + 1 >= self.backoff.attempts or not is_transient(exc):
                    raise
                if not self._answered and is_connection_error(exc):
                    raise  # never reached: a wrong endpoint or a server that is down
                log.debug("%s on %s: transient %s: %s; retrying (attempt %d)", what, self.url,
                          type(exc).__name__, exc, attempt + 1)
            await asyncio.sleep(self.backoff.delay(attempt))
        raise AssertionError("unreachable")

    async def _s3(self, method: str, **kw: Any) -> Any:
        """One S3 call with our retries; idempotent calls only."""
        return await self._retrying(method, lambda: self.fs._call_s3(method, Bucket=self.bucket,
                                                                     **kw))

    # --- objects ---

    async def _get_object(self, key: str, limit: int | None = None
                          ) -> tuple[bytes, str, str] | None:
        """(body, ETag, write id) of a key read in one GET, or None if it does not exist.
        With ``limit``, a larger object is refused (FormatError) before its body is read."""
        async def once() -> tuple[bytes, str, str] | None:
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

        return await self._retrying(f"reading {key}", once)

    async def _get(self, key: str) -> bytes | None:
        got = await self._get_object(key)
        return None if got is None else got[0]

    def get(self, key: str) -> bytes:
        data = self.get_many([key])[key]
        if data is None:
            raise NotFoundError(f"{key} does not exist in {self.url}")
        return data

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        keys = list(dict.fromkeys(keys))
        sem = asyncio.Semaphore(self.concurrency)

        async def one(key: str) -> bytes | None:
            async with sem:
                return await self._get(key)

        async def all_() -> list[bytes | None]:
            return list(await asyncio.gather(*(one(k) for k in keys)))

        try:
            return dict(zip(keys, self._run(all_()), strict=True))
        except StorageError:
            raise
        except OSError as exc:
            raise self._fail("reading objects", exc) from exc

    def put_many(self, items: dict[str, bytes]) -> None:
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

        async def all_() -> None:
            await asyncio.gather(*(one(k, v) for k, v in items.items()))

        self._check_safe()
        try:
            self._run(all_())
        except OSError as exc:
            raise self._fail("writing objects", exc) from exc

    # --- refs ---

    def read_ref(self, key: str) -> tuple[bytes, str] | None:
        try:
            got = self._run(self._get_object(key, MAX_REF_BYTES))
        except OSError as exc:
            raise self._fail(f"reading ref {key}", exc) from exc
        return None if got is None else (got[0], got[1])

    def write_ref(self, key: str, data: bytes, expected: str | None,
                  refresh: Callable[[], None] | None = None) -> str:
        self._check_safe()
        wid = secrets.token_hex(12)
        cond = {"IfNoneMatch": "*"} if expected is None else {"IfMatch": expected}

        async def go() -> str:
            failure: BaseException | None = None
            for attempt in range(self.backoff.attempts):
                try:
                    resp = await self.fs._call_s3("put_object", Bucket=self.bucket,
                                                  Key=self._key(key), Body=data,
                                                  Metadata={WRITE_ID: wid}, **cond)
                    return str(resp["ETag"])
                except Exception as exc:  # 404: If-Match on a deleted key
                    refused = _is_precondition(exc) or _is_missing(exc)
                    if not refused and not is_transient(exc):
                        raise
                    failure = exc
                # Refused, or no reply: did our PUT land (a lost reply, retried into a 412)?
                now = await self._get_object(key)
                if now is not None and now[2] == wid:
                    log.debug("ref %s: write %s was applied, its reply was lost", key, wid)
                    return now[1]
                if refused or (now[1] if now else None) != expected:
                    raise RefMismatch(key) from failure
                if attempt + 1 < self.backoff.attempts:  # not applied, ref unchanged: again
                    await asyncio.sleep(self.backoff.delay(attempt))
            assert failure is not None
            raise failure

        try:
            return self._run(go())  # type: ignore[no-any-return]
        except OSError as exc:
            raise self._fail(f"updating ref {key}", exc) from exc

    def delete_ref(self, key: str, expected: str) -> None:
        self._check_safe()

        async def go() -> None:
            failure: BaseException | None = None
            for attempt in range(self.backoff.attempts):
                try:
                    await self.fs._call_s3("delete_object", Bucket=self.bucket,
                                           Key=self._key(key), IfMatch=expected)
                    return
                except Exception as exc:
                    refused = _is_precondition(exc) or _is_missing(exc)
                    if not refused and not is_transient(exc):
                        raise
                    failure = exc
                now = await self._get_object(key)
                if now is None:  # gone, as wanted (our delete whose reply was lost, or another)
                    return
                if refused or now[1] != expected:
                    raise RefMismatch(key) from failure
                if attempt + 1 < self.backoff.attempts:
                    await asyncio.sleep(self.backoff.delay(attempt))
            assert failure is not None
            raise failure

        try:
            self._run(go())
        except OSError as exc:
            raise self._fail(f"deleting ref {key}", exc) from exc

    def _check_safe(self) -> None:
        """Once per backend: does the endpoint honour every condition the store relies on?"""
        if self._safe or self.allow_unsafe:
            return
        if self._safe is None:
            self._safe = self._probe()
        if not self._safe:  # every write asks again, so a caught error cannot be skipped past
            raise UnsafeStorageError(
                f"{self.url} does not honour {self._unsafe_reason}, so concurrent writers could "
                "lose checkpoints. Use a storage that honours If-None-Match and If-Match on PUT "
                "and If-Match on DELETE (AWS S3, MinIO, R2...), or pass allow_unsafe=True if "
                "only one writer ever touches each thread."
            )

    def _probe(self) -> bool:
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

        try:
            self._unsafe_reason = str(self._run(go()))
        except OSError as exc:
            raise self._fail("checking conditional writes", exc) from exc
        return not self._unsafe_reason

    # --- listing ---

    def list(self, prefix: str) -> list[ObjectInfo]:
        full = self._key(prefix.rstrip("/")) + "/"
        strip = len(self.prefix) + 1 if self.prefix else 0

        async def go() -> list[ObjectInfo]:
            out: list[ObjectInfo] = []
            token: str | None = None
            while True:
                kw: dict[str, Any] = {"Prefix": full}
                if token:
                    kw["ContinuationToken"] = token
                resp = await self._s3("list_objects_v2", **kw)
                for item in resp.get("Contents", []):
                    out.append(ObjectInfo(item["Key"][strip:], int(item["Size"]),
                                          item["LastModified"].timestamp()))
                if not resp.get("IsTruncated"):
                    return out
                token = resp["NextContinuationToken"]

        try:
            return self._run(go())  # type: ignore[no-any-return]
        except OSError as exc:
            raise self._fail(f"listing {prefix}", exc) from exc

    def list_many(self, prefixes: Iterable[str]) -> Iterable[ObjectInfo]:
        """Every key under each prefix: one ListObjectsV2 paginator per prefix, concurrently."""
        strip = len(self.prefix) + 1 if self.prefix else 0
        sem = asyncio.Semaphore(self.concurrency)

        async def one(prefix: str) -> list[ObjectInfo]:
            out: list[ObjectInfo] = []
            kw: dict[str, Any] = {"Prefix": self._key(prefix.rstrip("/")) + "/"}
            async with sem:
                while True:
                    resp = await self._s3("list_objects_v2", **kw)
                    out += [ObjectInfo(item["Key"][strip:], int(item["Size"]),
                                       item["LastModified"].timestamp())
                            for item in resp.get("Contents", [])]
                    if not resp.get("IsTruncated"):
                        return out
                    kw["ContinuationToken"] = resp["NextContinuationToken"]

        async def all_() -> list[ObjectInfo]:
            folders = [p.rstrip("/") for p in prefixes]
            parents = {f.rsplit("/", 1)[0] for f in folders}
            if len(folders) > 8 and len(parents) == 1:  # a small store: one request may do
                resp = await self._s3("list_objects_v2", Prefix=self._key(parents.pop()) + "/")
                if not resp.get("IsTruncated"):
                    want = set(folders)
                    return [ObjectInfo(item["Key"][strip:], int(item["Size"]),
                                       item["LastModified"].timestamp())
                            for item in resp.get("Contents", [])
                            if item["Key"][strip:].rsplit("/", 1)[0] in want]
            parts = await asyncio.gather(*(one(p) for p in folders))
            return [i for part in parts for i in part]

        try:
            return self._run(all_())  # type: ignore[no-any-return]
        except OSError as exc:
            raise self._fail("listing objects", exc) from exc

    def delete_many(self, keys: Iterable[str]) -> builtins.list[str]:
        """DeleteObjects in batches of 1,000; returns the keys whose per-key ``Errors`` said
        they were not deleted."""
        keys = list(keys)
        strip = len(self.prefix) + 1 if self.prefix else 0

        async def go() -> list[str]:
            failed: list[str] = []
            for i in range(0, len(keys), 1000):
                batch = [{"Key": self._key(k)} for k in keys[i:i + 1000]]
                resp = await self._s3("delete_objects", Delete={"Objects": batch, "Quiet": True})
                for err in resp.get("Errors") or []:
                    if err.get("Code") != "NoSuchKey":
                        log.warning("%s: could not delete %s: %s %s", self.url, err.get("Key"),
                                    err.get("Code"), err.get("Message"))
                        failed.append(str(err.get("Key", ""))[strip:])
            return failed

        try:
            return self._run(go())  # type: ignore[no-any-return]
        except OSError as exc:
            raise self._fail("deleting objects", exc) from exc
