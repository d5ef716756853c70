"""Where a store's bytes live: one backend per kind of storage, each in its module (``local``,
``memory``, ``s3``) over the primitives of ``base``. Opening a URL imports only the module it
needs (a local path imports no fsspec; s3fs is imported for ``s3://`` alone)."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidArgumentError
from .base import MAX_REF_BYTES, Backend, ObjectInfo, RefMismatch
from .local import LocalBackend
from .memory import MemoryBackend

__all__ = ["MAX_REF_BYTES", "Backend", "LocalBackend", "MemoryBackend", "ObjectInfo",
           "RefMismatch", "backend_for", "open_backend"]


def open_backend(url: str, storage_options: dict[str, Any] | None = None,
                 *, allow_unsafe: bool = False, retries: int | None = None,
                 timeout: float | None = None) -> Backend:
    """A backend for a store URL: a local path, ``file://``, ``memory://`` or ``s3://``."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidArgumentError("the store URL is empty; pass a directory path, "
                                   "'memory://name' or 's3://bucket/prefix'")
    if "://" not in url and not url.startswith(("file:", "local:")):
        return LocalBackend(url)  # a plain path: no need to import fsspec (~40 ms)
    import fsspec
    from fsspec.core import split_protocol

    protocol, path = split_protocol(url)
    if protocol in (None, "file", "local"):
        return LocalBackend(path)
    options = dict(storage_options or {})
    if timeout is not None and protocol in ("s3", "s3a"):
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("connect_timeout", timeout)
        config.setdefault("read_timeout", timeout)
        options["config_kwargs"] = config
    try:
        fs = fsspec.filesystem(protocol, **options)
    except (ImportError, ValueError) as exc:
        raise InvalidArgumentError(
            f"cannot open {url!r}: {exc}. For s3:// install the extra: pip install "
            "'cas_checkpoint[s3]'"
        ) from exc
    return backend_for(fs, path, allow_unsafe=allow_unsafe, retries=retries)


def backend_for(fs: Any, root: str, *, allow_unsafe: bool = False,
                retries: int | None = None) -> Backend:
    """A backend over an fsspec filesystem object and a root path inside it."""
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    if "file" in protocols or "local" in protocols:
        return LocalBackend(root)
    if "memory" in protocols:
        return MemoryBackend(fs, root)
    if "s3" in protocols or "s3a" in protocols:
        from .s3 import S3Backend

        return S3Backend(fs, root, allow_unsafe=allow_unsafe, retries=retries)
    raise InvalidArgumentError(
        f"filesystem {protocols[0]!r} is not supported yet: cas_checkpoint needs atomic "
        "compare-and-swap for refs, which it implements for local disk, memory:// and s3://"
    )

