"""A missing thread costs one read of its ref once the store object has written: a CasSaver
asks for a new subgraph namespace's latest checkpoint every turn, and it read the store's
settings each time only to word the error for an encrypted store opened without its key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cas_checkpoint import CheckpointStore, Key
from cas_checkpoint.engine.settings import MARKER
from cas_checkpoint.errors import InvalidArgumentError, NotFoundError


def _reads(store: CheckpointStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    backend: Any = store._core.backend
    keys: list[str] = []
    get_many = backend.get_many

    def counting(wanted: Any) -> Any:
        wanted = list(wanted)
        keys.extend(wanted)
        return get_many(wanted)

    monkeypatch.setattr(backend, "get_many", counting)
    return keys


def test_a_missing_thread_after_a_write_reads_no_settings(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    store.save("here", {"n": 1})
    keys = _reads(store, monkeypatch)
    for _ in range(3):
        with pytest.raises(NotFoundError, match="'gone' does not exist"):
            store.load("gone")
    assert MARKER not in keys, keys


def test_an_encrypted_store_opened_without_its_key_still_says_so(tmp_path: Path) -> None:
    url = str(tmp_path / "sealed")
    CheckpointStore.open(url, encryption=Key.generate()).save("t", {"n": 1})
    with pytest.raises(InvalidArgumentError, match="is encrypted"):
        CheckpointStore.open(url).load("gone")
