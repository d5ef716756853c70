"""When a storage failure is worth retrying, and how long to wait before the next attempt."""

from __future__ import annotations

import errno
import random
from dataclasses import dataclass

TRANSIENT_CODES = frozenset({
    "InternalError", "ServiceUnavailable", "SlowDown", "SlowDownRead", "SlowDownWrite",
    "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled",
    "RequestThrottledException", "TooManyRequestsException", "RequestLimitExceeded",
    "RequestTimeout", "RequestTimeoutException", "BandwidthLimitExceeded", "OperationAborted",
    "ConditionalRequestConflict",  # 409: another write of the key is in flight; retry it
    "500", "502", "503", "504",
})
PERMANENT_CODES = frozenset({
    "AccessDenied", "AccountProblem", "AllAccessDisabled", "InvalidAccessKeyId",
    "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "NoSuchBucket", "InvalidBucketName",
    "NotSignedUp", "InvalidSecurity", "403",
})
PRECONDITION_CODES = frozenset({"PreconditionFailed", "412"})
_TRANSIENT_ERRNOS = frozenset({
    errno.EAGAIN, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNABORTED, errno.ECONNREFUSED,
    errno.EPIPE, errno.EBUSY, getattr(errno, "EREMOTEIO", errno.EIO),
})


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and len(out) < 8 and cur not in out:
        out.append(cur)
        cur = cur.__cause__ if cur.__cause__ is not None else cur.__context__
    return out


def _response_field(exc: BaseException, section: str, key: str) -> object:
    """``response[section][key]`` of the first exception in the cause chain that has it."""
    for e in _chain(exc):
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            value = response.get(section, {}).get(key)
            if value:
                return value
    return None


def error_code(exc: BaseException) -> str:
    """The S3 error code (``NoSuchBucket``...) of an exception or its causes, or ''."""
    code = _response_field(exc, "Error", "Code")
    return str(code) if code else ""


def error_status(exc: BaseException) -> int:
    """The HTTP status of an exception or its causes, or 0."""
    status = _response_field(exc, "ResponseMetadata", "HTTPStatusCode")
    return int(status) if isinstance(status, (int, str)) and status else 0


def is_precondition(exc: BaseException) -> bool:
    """A conditional request was refused: the object exists or has another version."""
    return (isinstance(exc, FileExistsError) or error_code(exc) in PRECONDITION_CODES
            or error_status(exc) == 412)


def is_connection_error(exc: BaseException) -> bool:
    """The endpoint could not be reached at all: refused, unknown host, connect timeout."""
    for e in _chain(exc):
        names = {c.__name__ for c in type(e).__mro__}
        if names & {"EndpointConnectionError", "ConnectTimeoutError", "ConnectionRefusedError",
                    "gaierror", "ClientConnectorError"}:
            return True
        if isinstance(e, OSError) and e.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH,
                                                  errno.ENETUNREACH):
            return True
    return False


def is_timeout(exc: BaseException) -> bool:
    """A request got no answer in time (connect or read timeout)."""
    for e in _chain(exc):
        if isinstance(e, TimeoutError):
            return True
        names = {c.__name__ for c in type(e).__mro__}
        if names & {"ReadTimeoutError", "ConnectTimeoutError", "ServerTimeoutError",
                    "FSTimeoutError", "ReadTimeout", "ConnectTimeout"}:
            return True
    return False


def is_transient(exc: BaseException) -> bool:
    """A storage failure worth retrying (timeouts, resets, 5xx, throttling)."""
    code, status = error_code(exc), error_status(exc)
    if code in PERMANENT_CODES or status in (401, 403) or is_precondition(exc):
        return False
    if code in TRANSIENT_CODES or status >= 500 or status in (408, 429):
        return True
    for e in _chain(exc):
        if isinstance(e, (TimeoutError, ConnectionError)):
            return True
        if isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNOS:
            return True
        names = {c.__name__ for c in type(e).__mro__}
        if names & {"HTTPClientError", "ClientError", "ServerDisconnectedError",
                    "ClientPayloadError", "ResponseParserError", "IncompleteRead"} and not (
                "ClientError" in names and "botocore" in type(e).__module__):
            return True  # aiohttp's and botocore's connection-level errors, by name
        if "EndpointConnectionError" in names or "ConnectTimeoutError" in names:
            return True
    return False


@dataclass(frozen=True, slots=True)
class Backoff:
    """Bounded exponential backoff with full jitter: attempt ``n`` (from 0) waits a random time
    in ``[0, min(cap, base * 2**n)]``."""

    attempts: int = 6
    base: float = 0.05
    cap: float = 2.0

    def delay(self, attempt: int) -> float:
        return random.uniform(0, min(self.cap, self.base * 2 ** min(attempt, 30)))
