"""How the S3 backend makes one call: retries of transient failures with backoff, and the error
a failure becomes, saying what failed, where, and what to do (``S3Calls``, a base of
``S3Backend``; the backend's module says what each operation sends)."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from cas_checkpoint.backends.base import RefMismatch
from cas_checkpoint.backends.retry import (
    Backoff,
    error_code,
    is_connection_error,
    is_timeout,
    is_transient,
)
from cas_checkpoint.errors import CasError, StorageError

log = logging.getLogger("cas_checkpoint")
T = TypeVar("T")
_code = error_code


class S3Calls:
    """Retries and error mapping over an s3fs filesystem's ``_call_s3``."""

    fs: Any
    url: str
    bucket: str
    backoff: Backoff
    _answered: bool  # the endpoint answered once: then a failed connection is a blip

    def endpoint(self) -> str:
        """The URL the S3 client sends its requests to, for error messages."""
        meta = getattr(getattr(self.fs, "_s3", None), "meta", None)
        url = getattr(meta, "endpoint_url", None) or (
            getattr(self.fs, "client_kwargs", None) or {}).get("endpoint_url") or (
            os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"))
        return str(url) if url else "AWS S3 (the region's default endpoint)"

    def timeout(self) -> float | None:
        """The client's read timeout in seconds (connect and read are both ``timeout=``)."""
        config = getattr(self.fs, "config_kwargs", None) or {}
        value = config.get("read_timeout", getattr(self.fs, "read_timeout", None))
        return float(value) if isinstance(value, int | float) else None

    def _fail(self, what: str, exc: BaseException) -> StorageError:
        code = _code(exc) or type(exc).__name__
        hint = {
            "NoSuchBucket": "create the bucket or fix the URL",
            "AccessDenied": "check the credentials and the bucket policy",
            "InvalidAccessKeyId": "check the credentials",
            "SignatureDoesNotMatch": "check the secret key",
        }.get(code, "check the endpoint, credentials and network, then retry")
        where = f"{self.url} (endpoint {self.endpoint()})"
        limit = self.timeout()
        within = f" within {limit:g} s" if limit is not None else ""
        slow = ("if it is only slow, raise timeout= (--timeout on the command line)"
                + (" and retries= (--retries)" if self._answered else ""))
        if not self._answered and is_timeout(exc):
            hint = (f"the endpoint did not answer{within}, and it has not answered once "
                    "since the store was opened, so it was not retried; "
                    "check the endpoint URL (endpoint_url / AWS_ENDPOINT_URL, --endpoint-url), "
                    f"that the server runs and answers, and the network; {slow}. Nothing "
                    "half-written is ever visible")
        elif is_connection_error(exc) and not self._answered:
            hint = ("the endpoint could not be reached at all (refused, unknown host or no "
                    "answer); check the URL, endpoint_url / AWS_ENDPOINT_URL (--endpoint-url), "
                    "the network and that the server runs. Nothing was written")
        elif is_transient(exc):
            hint = (f"the storage kept failing after {self.backoff.attempts} attempts"
                    + (f" of up to {limit:g} s each" if limit and is_timeout(exc) else "")
                    + f" with backoff; check the endpoint and network; {slow}; then retry: "
                    "nothing half-written is ever visible")
        return StorageError(f"{what} failed on {where}: {code}: {exc}; {hint}")

    async def _mapped(self, what: str, coro: Awaitable[T]) -> T:
        """Await ``coro``; a storage failure becomes a StorageError saying ``what`` failed.
        cas_checkpoint's own errors and RefMismatch pass as they are, and so does
        CancelledError (not an Exception)."""
        try:
            return await coro
        except (CasError, RefMismatch):
            raise
        except Exception as exc:  # botocore's connection/endpoint errors are not OSErrors
            err = exc if isinstance(exc, OSError) else _as_oserror(exc)
            raise self._fail(what, err) from err

    async def _spend(self, what: str, exc: Exception, failed: int) -> int:
        """A storage call that had ``failed`` failures fails again with ``exc``: raise it unless
        another try is worth it (a transient failure, attempts left, and an endpoint that has
        answered before: one that was never reached or never answered is a wrong URL or a dead
        server), else wait the backoff and return the new count. Each try of each request
        waits at most the client's timeout (botocore and s3fs make one attempt each), so a
        call takes at most about ``retries`` x ``timeout`` plus the backoff."""
        if failed + 1 >= self.backoff.attempts or not is_transient(exc):
            raise exc
        if not self._answered and (is_connection_error(exc) or is_timeout(exc)):
            raise exc
        log.debug("%s on %s: transient %s: %s; retrying (attempt %d)", what, self.url,
                  type(exc).__name__, exc, failed + 1)
        await asyncio.sleep(self.backoff.delay(failed))
        return failed + 1

    async def _retrying(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, again after a transient failure (bounded, exponential backoff with
        jitter); a permanent failure or a precondition failure is raised at once."""
        failed = 0
        while True:
            try:
                result = await call()
                self._answered = True
                return result
            except Exception as exc:
                failed = await self._spend(what, exc, failed)

    async def _s3(self, method: str, **kw: Any) -> Any:
        """One S3 call with our retries; idempotent calls only."""
        return await self._retrying(method, lambda: self.fs._call_s3(method, Bucket=self.bucket,
                                                                     **kw))


def _as_oserror(exc: BaseException) -> OSError:
    """A non-OSError failure (botocore's connection and endpoint errors) as an EIO OSError
    caused by it, as the retry and hint logic expects."""
    err = OSError(errno.EIO, f"{type(exc).__name__}: {exc}")
    err.__cause__ = exc
    return err
