"""The public surface, pinned: a change here is a change users see."""

from __future__ import annotations

import inspect
from pathlib import Path

import cas_checkpoint
from cas_checkpoint import CheckpointStore, errors


def test_exports() -> None:
    assert {
        "CasError", "Checkpoint", "CheckpointId", "CheckpointInfo", "CheckpointStore",
        "ConflictError", "FormatError", "IntegrityError", "InvalidArgumentError",
        "NotFoundError", "ObjectId", "SerializationError", "StorageError", "TypeRegistry",
        "UnsafeStorageError",
    } <= set(cas_checkpoint.__all__)
    for name in cas_checkpoint.__all__:
        assert hasattr(cas_checkpoint, name), name


def test_store_methods() -> None:
    public = {n for n, _ in inspect.getmembers(CheckpointStore) if not n.startswith("_")}
    assert {"open", "save", "load", "get", "history", "find", "threads", "count", "head",
            "fork", "rewind", "delete", "delete_thread", "stats", "storage_bytes",
            "url"} <= public
    params = inspect.signature(CheckpointStore.save).parameters
    assert list(params)[:3] == ["self", "thread_id", "state"]
    assert all(params[p].kind is inspect.Parameter.KEYWORD_ONLY
               for p in ("label", "tags", "metadata", "expected_head"))


def test_one_error_tree() -> None:
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass)
               if c.__module__ == errors.__name__]
    assert len(classes) >= 9
    assert all(issubclass(c, errors.CasError) for c in classes)
    assert issubclass(errors.NotFoundError, KeyError)
    assert issubclass(errors.SerializationError, TypeError)


def test_typed_package() -> None:
    assert (Path(cas_checkpoint.__file__).parent / "py.typed").exists()
