"""Where a store's bytes live: one backend per kind of storage, each in its module (``local``,
``memory``, ``s3``) over the primitives of ``base``. Opening a URL imports only the module it
needs (a local path imports no fsspec; s3fs is imported for ``s3://`` alone)."""

from __future__ import annotations

import os
from typing import Any

from cas_checkpoint.backends.base import MAX_REF_BYTES, Backend, ObjectInfo, RefMismatch
from cas_checkpoint.backends.local import LocalBackend
from cas_checkpoint.backends.memory import MemoryBackend
from cas_checkpoint.errors import InvalidArgumentError, NotFoundError

__all__ = ["MAX_REF_BYTES", "Backend", "LocalBackend", "MemoryBackend", "ObjectInfo",
           "RefMismatch", "backend_for", "open_backend", "open_backend_async"]


SUPPORTED = ("memory", "s3", "s3a")  # protocols besides local paths
DEFAULT_TIMEOUT = 30.0  # seconds to connect, and to wait for each read, of one S3 request
# botocore makes one attempt per request: the store's own retries (retry.Backoff) are the only
# ones, so ``retries`` attempts of ``timeout`` each bound a request (see retry.py)
ONE_ATTEMPT = {"mode": "standard", "total_max_attempts": 1}


def check_open_args(retries: object, timeout: object) -> None:
    """InvalidArgumentError unless ``retries`` and ``timeout`` are what ``open`` accepts."""
    if retries is not None and (not isinstance(retries, int) or isinstance(retries, bool)
                                or not 1 <= retries <= 100):
        raise InvalidArgumentError(f"retries must be an int from 1 to 100, not {retries!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                                or not 0 < timeout <= 86400):  # nan and inf are no bound
        raise InvalidArgumentError(f"timeout must be a positive number of seconds up to 86400 "
                                   f"(e.g. timeout=10), not {timeout!r}")


def _target(url: str, storage_options: dict[str, Any] | None,
            timeout: float | None) -> tuple[str | None, str, dict[str, Any]]:
    """(protocol, path, filesystem options) of a store URL; protocol None: a local directory."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidArgumentError("the store URL is empty; pass a directory path, "
                                   "'memory://name' or 's3://bucket/prefix'")
    if "://" not in url and not url.startswith(("file:", "local:")):
        return None, url, {}  # a plain path: no need to import fsspec (~40 ms)
    from fsspec.core import split_protocol

    protocol, path = split_protocol(url)
    if protocol in (None, "file", "local"):
        return None, path, {}
    if protocol not in SUPPORTED:
        raise InvalidArgumentError(
            f"cannot open {url!r}: {protocol}:// is not supported; cas_checkpoint needs atomic "
            "compare-and-swap for refs, which it implements for a local path, memory://name "
            "and s3://bucket/prefix (S3-compatible storage too: set the endpoint URL)")
    options = dict(storage_options or {})
    if protocol in ("s3", "s3a"):  # storage_options' own config_kwargs win
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("connect_timeout", DEFAULT_TIMEOUT if timeout is None else timeout)
        config.setdefault("read_timeout", DEFAULT_TIMEOUT if timeout is None else timeout)
        config.setdefault("retries", dict(ONE_ATTEMPT))
        options["config_kwargs"] = config
    return protocol, path, options


def _one_attempt(fs: Any) -> Any:
    """s3fs retries each call 5 times on its own (``S3FileSystem.retries``, a class attribute,
    not an option): once here, so the store's retries are the only ones. Only filesystems made
    from a URL are changed; one passed to ``backend_for`` keeps its settings."""
    if "s3" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
        fs.retries = 1
    return fs


def _filesystem(url: str, protocol: str, options: dict[str, Any]) -> Any:
    import fsspec

    try:
        return fsspec.filesystem(protocol, **options)
    except ImportError as exc:
        raise InvalidArgumentError(
            f"cannot open {url!r}: {exc}; install the extra: pip install 'cas_checkpoint[s3]'"
        ) from exc
    except Exception as exc:  # a bad storage option: any error the filesystem's __init__ raises
        raise InvalidArgumentError(
            f"cannot open {url!r}: {type(exc).__name__}: {exc}; check its storage options"
        ) from exc


def open_backend(url: str, storage_options: dict[str, Any] | None = None,
                 *, allow_unsafe: bool = False, retries: int | None = None,
                 timeout: float | None = None, create: bool = True) -> Backend:
    """A backend for a store URL: a local path, ``file://``, ``memory://`` or ``s3://``.
    ``create=False``: a local directory that does not exist raises NotFoundError."""
    protocol, path, options = _target(url, storage_options, timeout)
    if protocol is None:
        return _local(url, path, create)
    fs = _one_attempt(_filesystem(url, protocol, options))
    return backend_for(fs, path, allow_unsafe=allow_unsafe, retries=retries)


async def open_backend_async(url: str, storage_options: dict[str, Any] | None = None,
                             *, allow_unsafe: bool = False, retries: int | None = None,
                             timeout: float | None = None, create: bool = True) -> Backend:
    """``open_backend`` for asyncio code. For ``s3://`` the backend gets an s3fs filesystem of
    its own, ``asynchronous=True``, whose client is made here on the running event loop: its
    requests are awaited on that loop (no thread, no fsspec I/O loop). Use it from that loop
    only, through its async methods (its sync ones raise InvalidArgumentError), and
    ``await backend.aclose()`` to close its connections. Local paths and ``memory://`` get the
    same backends as ``open_backend``."""
    protocol, path, options = _target(url, storage_options, timeout)
    if protocol is None:
        return _local(url, path, create)
    if protocol not in ("s3", "s3a"):
        return backend_for(_filesystem(url, protocol, options), path,
                           allow_unsafe=allow_unsafe, retries=retries)
    # fsspec caches filesystem instances by their options: a cached one may belong to another
    # loop (or be a sync one), so this one is never shared. s3fs binds its client to the loop
    # that runs set_session (an asynchronous fs has no loop of its own): this one.
    options.update(asynchronous=True, skip_instance_cache=True)
    fs = _one_attempt(_filesystem(url, protocol, options))
    backend = backend_for(fs, path, allow_unsafe=allow_unsafe, retries=retries)
    try:
        await fs.set_session()
    except Exception as exc:  # a bad option of the client (region, endpoint URL, config...)
        raise InvalidArgumentError(f"cannot open {url!r}: {type(exc).__name__}: {exc}") from exc
    from cas_checkpoint.backends.s3 import S3Backend

    if isinstance(backend, S3Backend):
        backend.owns_session = True  # aclose() closes the client made here
    return backend


def _local(url: str, path: str, create: bool) -> LocalBackend:
    if not create and not os.path.isdir(path):
        raise NotFoundError(f"no store at {url!r}: "
                            + ("not a directory" if os.path.exists(path) else "no such directory")
                            + "; check the path, or create one with `cas-checkpoint init`")
    return LocalBackend(path)


def backend_for(fs: Any, root: str, *, allow_unsafe: bool = False,
                retries: int | None = None) -> Backend:
    """A backend over an fsspec filesystem object and a root path inside it. An asynchronous
    ``S3FileSystem`` gives a backend used through its async methods only, on the loop its
    client belongs to."""
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    if "file" in protocols or "local" in protocols:
        return LocalBackend(root)
    if "memory" in protocols:
        return MemoryBackend(fs, root)
    if "s3" in protocols or "s3a" in protocols:
        from cas_checkpoint.backends.s3 import S3Backend

        return S3Backend(fs, root, allow_unsafe=allow_unsafe, retries=retries)
    raise InvalidArgumentError(
        f"filesystem {protocols[0]!r} is not supported yet: cas_checkpoint needs atomic "
        "compare-and-swap for refs, which it implements for local disk, memory:// and s3://"
    )
