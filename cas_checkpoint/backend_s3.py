"""S3 (and S3-compatible) storage through s3fs, with conditional writes for refs.

* objects: ``PutObject`` with ``If-None-Match: *`` (an existing object is left alone);
* refs: ``GetObject`` returns body and ETag together (never a listing cache), then ``PutObject``
  with ``If-Match: <etag>`` to replace or ``If-None-Match: *`` to create; a 412 is a mismatch;
* on opening, one probe checks that the endpoint refuses a second ``If-None-Match: *`` PUT;
  without that, two writers could overwrite each other's refs, so writing is refused unless the
  caller passed ``allow_unsafe=True``.
"""

from __future__ import annotations

import asyncio
import errno
import secrets
from collections.abc import Iterable
from typing import Any

from fsspec.asyn import sync

from .backend import Backend, ObjectInfo, RefMismatch
from .errors import CasError, NotFoundError, StorageError, UnsafeStorageError


def _code(exc: BaseException) -> str:
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    response = getattr(cause, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def _status(exc: BaseException) -> int:
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    response = getattr(cause, "response", None) or {}
    return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def _is_precondition(exc: BaseException) -> bool:
    return isinstance(exc, FileExistsError) or _code(exc) in (
        "PreconditionFailed", "ConditionalRequestConflict") or _status(exc) in (409, 412)


class S3Backend(Backend):
    concurrency = 32

    def __init__(self, fs: Any, root: str, *, allow_unsafe: bool = False) -> None:
        self.fs = fs
        root = root.strip("/")
        self.bucket, _, prefix = root.partition("/")
        if len(self.bucket) < 3:
            raise StorageError(f"{root!r} does not name an S3 bucket; use s3://bucket/prefix")
        self.prefix = prefix.strip("/")
        self.url = f"s3://{root}"
        self.allow_unsafe = allow_unsafe
        self._safe: bool | None = None

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
        }.get(code, "check the endpoint, credentials and network, then retry")
        return StorageError(f"{what} failed on {self.url}: {code}: {exc}; {hint}")

    # --- objects ---

    async def _get(self, key: str) -> bytes | None:
        try:
            resp = await self.fs._call_s3("get_object", Bucket=self.bucket, Key=self._key(key))
        except FileNotFoundError as exc:
            if _code(exc) == "NoSuchBucket":
                raise self._fail(f"reading {key}", exc) from exc
            return None
        body = resp["Body"]
        try:
            return bytes(await body.read())
        finally:
            body.close()

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
                try:
                    await self.fs._call_s3("put_object", Bucket=self.bucket, Key=self._key(key),
                                           Body=data, IfNoneMatch="*")
                except OSError as exc:
                    if not _is_precondition(exc):
                        raise

        async def all_() -> None:
            await asyncio.gather(*(one(k, v) for k, v in items.items()))

        self._check_safe()
        try:
            self._run(all_())
        except OSError as exc:
            raise self._fail("writing objects", exc) from exc

    # --- refs ---

    def read_ref(self, key: str) -> tuple[bytes, str] | None:
        async def go() -> tuple[bytes, str] | None:
            try:
                resp = await self.fs._call_s3("get_object", Bucket=self.bucket,
                                              Key=self._key(key))
            except FileNotFoundError as exc:
                if _code(exc) == "NoSuchBucket":
                    raise
                return None
            body = resp["Body"]
            try:
                return bytes(await body.read()), str(resp["ETag"])
            finally:
                body.close()

        try:
            return self._run(go())  # type: ignore[no-any-return]
        except OSError as exc:
            raise self._fail(f"reading ref {key}", exc) from exc

    def write_ref(self, key: str, data: bytes, expected: str | None) -> str:
        self._check_safe()
        cond = {"IfNoneMatch": "*"} if expected is None else {"IfMatch": expected}
        try:
            resp = self._run(self.fs._call_s3("put_object", Bucket=self.bucket,
                                              Key=self._key(key), Body=data, **cond))
        except FileNotFoundError as exc:  # If-Match on a deleted key
            if _code(exc) == "NoSuchBucket":
                raise self._fail(f"updating ref {key}", exc) from exc
            raise RefMismatch(key) from exc
        except OSError as exc:
            if _is_precondition(exc):
                raise RefMismatch(key) from exc
            raise self._fail(f"updating ref {key}", exc) from exc
        return str(resp["ETag"])

    def delete_ref(self, key: str, expected: str) -> None:
        self._check_safe()
        try:
            self._run(self.fs._call_s3("delete_object", Bucket=self.bucket, Key=self._key(key),
                                       IfMatch=expected))
        except FileNotFoundError as exc:
            raise RefMismatch(key) from exc
        except OSError as exc:
            if _is_precondition(exc):
                raise RefMismatch(key) from exc
            raise self._fail(f"deleting ref {key}", exc) from exc

    def _check_safe(self) -> None:
        """Once per backend: does the endpoint refuse a second If-None-Match PUT?"""
        if self._safe is not None or self.allow_unsafe:
            return
        probe = self._key(f"probe/{secrets.token_hex(8)}")

        async def go() -> bool:
            await self.fs._call_s3("put_object", Bucket=self.bucket, Key=probe, Body=b"1",
                                   IfNoneMatch="*")
            try:
                await self.fs._call_s3("put_object", Bucket=self.bucket, Key=probe, Body=b"2",
                                       IfNoneMatch="*")
                honoured = False
            except OSError as exc:
                if not _is_precondition(exc):
                    raise
                honoured = True
            await self.fs._call_s3("delete_object", Bucket=self.bucket, Key=probe)
            return honoured

        try:
            self._safe = bool(self._run(go()))
        except OSError as exc:
            raise self._fail("checking conditional writes", exc) from exc
        if not self._safe:
            raise UnsafeStorageError(
                f"{self.url} accepted a second PUT with If-None-Match: *, so it does not honour "
                "conditional writes and concurrent writers could lose checkpoints. Use a storage "
                "that does (AWS S3, MinIO, R2...), or pass allow_unsafe=True if only one writer "
                "ever touches each thread."
            )

    # --- listing ---

    def list(self, prefix: str) -> list[ObjectInfo]:
        full = self._key(prefix.rstrip("/")) + "/"
        strip = len(self.prefix) + 1 if self.prefix else 0

        async def go() -> list[ObjectInfo]:
            out: list[ObjectInfo] = []
            token: str | None = None
            while True:
                kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full}
                if token:
                    kw["ContinuationToken"] = token
                resp = await self.fs._call_s3("list_objects_v2", **kw)
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

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)

        async def go() -> None:
            for i in range(0, len(keys), 1000):
                batch = [{"Key": self._key(k)} for k in keys[i:i + 1000]]
                await self.fs._call_s3("delete_objects", Bucket=self.bucket,
                                       Delete={"Objects": batch, "Quiet": True})

        try:
            self._run(go())
        except OSError as exc:
            raise self._fail("deleting objects", exc) from exc
