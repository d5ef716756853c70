"""The backend contract (``cas_checkpoint.testing.BackendTests``) on every backend the library
ships: local disk, memory://, S3 (s3fs against a moto server) and the sealed wrapper of an
encrypted store (here over memory:// and local disk)."""

from __future__ import annotations

import secrets
import uuid
from pathlib import Path
from typing import Any

import pytest

from cas_checkpoint import Key
from cas_checkpoint.backends import Backend, open_backend
from cas_checkpoint.backends.sealed import SealedBackend
from cas_checkpoint.format.sealing import Keyring
from cas_checkpoint.testing import BackendTests


class TestLocal(BackendTests):
    def make_backend(self, tmp_path: Path) -> Backend:
        return open_backend(str(tmp_path / "store"))


class TestMemory(BackendTests):
    def make_backend(self, tmp_path: Path) -> Backend:
        return open_backend(f"memory://contract-{uuid.uuid4().hex[:12]}")


class TestS3(BackendTests):
    @pytest.fixture
    def backend(self, moto_server: dict[str, Any]) -> Backend:
        return open_backend(f"s3://{moto_server['bucket']}/contract-{uuid.uuid4().hex[:12]}",
                            dict(moto_server["storage_options"]))


def _sealed(inner: Backend) -> Backend:
    """The wrapper an encrypted store's objects go through: refs renamed and sealed."""
    sealed = SealedBackend(inner, Keyring([Key.generate()]))
    sealed.names = secrets.token_bytes(32)
    return sealed


class TestSealedMemory(BackendTests):
    def make_backend(self, tmp_path: Path) -> Backend:
        return _sealed(open_backend(f"memory://contract-{uuid.uuid4().hex[:12]}"))


class TestSealedLocal(BackendTests):
    def make_backend(self, tmp_path: Path) -> Backend:
        return _sealed(open_backend(str(tmp_path / "store")))
