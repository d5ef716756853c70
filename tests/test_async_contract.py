"""The contract tests of ``test_store.py``, run against ``AsyncCheckpointStore`` (memory, local
disk, S3 on the moto server) through ``conftest.AsyncFace``."""

from __future__ import annotations

import pytest
from test_store import *  # noqa: F403  (the tests themselves, collected here again)


@pytest.fixture(params=["memory-async", "local-async", "s3-async"])
def backend_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)
