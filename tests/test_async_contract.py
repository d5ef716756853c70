"""The contract tests of ``test_store.py``, run against ``AsyncCheckpointStore`` (memory, local
disk; S3 where a test is marked ``s3_matters``) through ``conftest.AsyncFace``.

S3's async face (native aiobotocore calls, no thread) is not lost here: its primitives are
``test_s3_async.py``'s, and whole stores run on it in ``test_async.py`` (200 tasks on 50
threads, a save cancelled at each await), ``test_langgraph.py`` and ``test_bundle.py``."""

from __future__ import annotations

from test_store import *  # noqa: F403  (the tests themselves, collected here again)

FACE = "-async"  # conftest: backend_kind is memory-async, local-async (s3-async if marked)
