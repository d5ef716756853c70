"""The public surface, pinned: a change here is a change users see."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import cas_checkpoint
from cas_checkpoint import CheckpointStore, errors

# Every name each public import path exports, exactly: adding one is a deliberate act (add it
# here), and so is removing one (users' imports break).
PUBLIC = {
    "cas_checkpoint": {
        "AsyncCheckpointStore", "BundleReport", "CasError", "Change", "Checkpoint",
        "CheckpointId", "CheckpointInfo", "CheckpointStore", "ConflictError", "CopyReport",
        "ExpireReport", "FormatError", "GCReport", "IntegrityError", "InvalidArgumentError", "Key",
        "Match",
        "NotFoundError", "ObjectId", "Problem", "PruneReport", "RepackReport", "SearchResult",
        "SerializationError", "StateDiff", "StatePart", "StorageError", "StoreStats", "ThreadStats",
        "TypeRegistry", "UnsafeStorageError", "Unread", "VerifyReport", "copy_threads",
    },
    "cas_checkpoint.aio": {"AsyncCheckpointStore", "landed"},
    "cas_checkpoint.backends": {
        "MAX_REF_BYTES", "Backend", "LocalBackend", "MemoryBackend", "ObjectInfo", "RefMismatch",
        "backend_for", "open_backend", "open_backend_async",
    },
    "cas_checkpoint.agents": {
        "MAX_ARGUMENTS_CHARS", "TOOL_NAMES", "AfterLlmResponse", "AfterToolCall", "AnyOf",
        "AsyncBackground", "AsyncRecorder", "Background", "Event", "Every", "Interval", "Never",
        "Operation", "Policy", "Recorder", "adispatch", "anthropic_tools", "dispatch",
        "openai_tools", "tool_definitions",
    },
    "cas_checkpoint.integrations.langgraph": {"PREFIX", "RECENT", "CasSaver", "default_types"},
    "cas_checkpoint.cli": {"main"},
}


def test_every_public_import_path_exports_exactly_its_names() -> None:
    import importlib

    for path, names in PUBLIC.items():
        module = importlib.import_module(path)
        assert sorted(module.__all__) == sorted(names), path
        assert len(set(module.__all__)) == len(module.__all__), path
        for name in names:
            assert getattr(module, name) is not None, f"{path}.{name}"
    from cas_checkpoint.aio import AsyncCheckpointStore

    assert cas_checkpoint.AsyncCheckpointStore is AsyncCheckpointStore


@pytest.mark.parametrize("module", ["cas_checkpoint.cli", "cas_checkpoint"])
def test_the_command_runs_as_a_module(module: str) -> None:
    """``python -m cas_checkpoint`` (and ``.cli``) run the ``cas-checkpoint`` command, with its
    exit status (a subprocess: what users run)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", module, "--help"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.startswith("usage: cas-checkpoint")
    bad = subprocess.run([sys.executable, "-m", module, "no-such-command"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "no-such-command" in bad.stderr


def test_exports() -> None:
    assert {
        "CasError", "Checkpoint", "CheckpointId", "CheckpointInfo", "CheckpointStore",
        "ConflictError", "FormatError", "IntegrityError", "InvalidArgumentError",
        "NotFoundError", "ObjectId", "SerializationError", "StorageError", "TypeRegistry",
        "UnsafeStorageError", "Change", "StateDiff", "Match", "SearchResult",
        "BundleReport", "CopyReport", "copy_threads", "Key",
    } <= set(cas_checkpoint.__all__)
    for name in cas_checkpoint.__all__:
        assert hasattr(cas_checkpoint, name), name


def test_store_methods() -> None:
    public = {n for n, _ in inspect.getmembers(CheckpointStore) if not n.startswith("_")}
    assert {"open", "save", "load", "get", "history", "find", "threads", "count", "head",
            "fork", "rewind", "delete", "delete_thread", "stats", "storage_bytes",
            "url", "diff", "search", "init", "settings", "rekey", "read_part"} <= public
    from cas_checkpoint.aio import AsyncCheckpointStore

    for cls in (CheckpointStore, AsyncCheckpointStore):
        params = inspect.signature(cls.open).parameters
        assert all(params[p].kind is inspect.Parameter.KEYWORD_ONLY
                   for p in ("create", "compression", "compression_level", "encryption")), cls
        assert hasattr(cls, "rekey"), cls
    assert list(inspect.signature(CheckpointStore.diff).parameters) == ["self", "a_id", "b_id"]
    for cls in (CheckpointStore, AsyncCheckpointStore):  # a part of a state, a page of a list
        params = inspect.signature(cls.read_part).parameters
        assert list(params) == ["self", "thread_id", "checkpoint_id", "path", "start", "count"]
        assert all(params[p].kind is inspect.Parameter.KEYWORD_ONLY for p in ("start", "count"))
    params = inspect.signature(CheckpointStore.search).parameters
    assert list(params) == ["self", "query", "regex", "thread_id", "all_history", "limit",
                            "progress", "checkpoint_id"]
    assert all(params[p].kind is inspect.Parameter.KEYWORD_ONLY for p in list(params)[2:])
    params = inspect.signature(CheckpointStore.save).parameters
    assert list(params)[:3] == ["self", "thread_id", "state"]
    assert all(params[p].kind is inspect.Parameter.KEYWORD_ONLY
               for p in ("label", "tags", "metadata", "expected_head", "status", "kind",
                         "reason"))
    for cls in (CheckpointStore, AsyncCheckpointStore):  # several ids, one compare-and-swap
        params = inspect.signature(cls.delete).parameters
        assert list(params) == ["self", "thread_id", "checkpoint_ids", "expected_head"], cls
        assert params["checkpoint_ids"].kind is inspect.Parameter.VAR_POSITIONAL
        assert params["expected_head"].kind is inspect.Parameter.KEYWORD_ONLY
    for method, names in (("find", ("status", "kind")), ("history", ("status", "kind")),
                          ("stats", ("by_thread",))):
        params = inspect.signature(getattr(CheckpointStore, method)).parameters
        assert all(params[p].kind is inspect.Parameter.KEYWORD_ONLY for p in names), method


def test_agent_layer() -> None:
    from cas_checkpoint import agents

    assert "ThreadStats" in cas_checkpoint.__all__
    assert {"Recorder", "AsyncRecorder", "Every", "AfterToolCall", "AfterLlmResponse",
            "Interval", "Never", "Policy", "dispatch", "adispatch", "openai_tools",
            "anthropic_tools"} <= set(agents.__all__)
    for name in agents.__all__:
        assert hasattr(agents, name), name


def test_moving_threads() -> None:
    """export/import/copy (bundle.py, copy.py): the signatures the CLI is built on."""
    from cas_checkpoint.aio import AsyncCheckpointStore

    for cls in (CheckpointStore, AsyncCheckpointStore):
        export = inspect.signature(cls.export_thread).parameters
        assert list(export)[:3] == ["self", "thread_id", "dest"]
        assert export["progress"].kind is inspect.Parameter.KEYWORD_ONLY
        imp = inspect.signature(cls.import_bundle).parameters
        assert list(imp)[:2] == ["self", "src"]
        assert all(imp[p].kind is inspect.Parameter.KEYWORD_ONLY
                   for p in ("as_thread", "progress"))
    copy = inspect.signature(cas_checkpoint.copy_threads).parameters
    assert list(copy)[:3] == ["src", "dst", "threads"] and copy["threads"].default is None
    assert copy["progress"].kind is inspect.Parameter.KEYWORD_ONLY
    assert list(cas_checkpoint.BundleReport.__dataclass_fields__)[:5] == [
        "thread_id", "checkpoints", "objects", "objects_written", "bytes"]
    assert list(cas_checkpoint.CopyReport.__dataclass_fields__)[:5] == [
        "threads", "checkpoints", "objects", "objects_written", "bytes_written"]


def test_one_error_tree() -> None:
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass)
               if c.__module__ == errors.__name__]
    assert len(classes) >= 9
    assert all(issubclass(c, errors.CasError) for c in classes)
    assert issubclass(errors.NotFoundError, KeyError)
    assert issubclass(errors.SerializationError, TypeError)


def test_typed_package() -> None:
    assert (Path(cas_checkpoint.__file__).parent / "py.typed").exists()


def test_key_api() -> None:
    from cas_checkpoint import Key

    assert {"generate", "from_env", "from_file", "from_text", "to_text", "id"} <= set(dir(Key))
    assert list(inspect.signature(Key).parameters) == ["secret"]
    assert list(inspect.signature(Key.from_env).parameters) == ["name"]


def test_importing_the_package_imports_no_optional_heavy_module() -> None:
    """``import cas_checkpoint`` (every process that saves a checkpoint pays it) leaves out what
    only some stores or values need: S3's client, LangGraph, zstd (compressed packs), FastCDC
    (long str/bytes; its package imports click), click itself, and asyncio (with ssl: ~10 ms;
    only the async API needs it). A save, a load, a gc and a verify of a plain local store
    import none of them either. In a subprocess: this test process has them all."""
    import subprocess
    import sys

    code = (
        "import sys, tempfile\n"
        "import cas_checkpoint\n"
        "s = cas_checkpoint.CheckpointStore.open(tempfile.mkdtemp(), compression='none')\n"
        "s.save('t', {'m': ['x' * 300] * 40})\n"
        "assert cas_checkpoint.CheckpointStore.open(s.url).load('t').state['m'][0] == 'x' * 300\n"
        "assert s.gc().deleted_objects == 0 and s.verify().ok\n"
        "heavy = ('s3fs', 'botocore', 'aiobotocore', 'langgraph', 'zstandard', 'fastcdc',\n"
        "         'click', 'asyncio', 'ssl')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_an_argument_not_given_reads_unset_not_ellipsis() -> None:
    """Where ``None`` means something (``expected_head=None``: the thread must not exist;
    ``keep_last=None``: keep all), "not given" is the typed sentinel ``UNSET``, and help()
    says so (it read ``= Ellipsis``, typed ``Any``)."""
    from cas_checkpoint import AsyncCheckpointStore
    from cas_checkpoint.engine.model import UNSET, Unset

    for method in (CheckpointStore.save, AsyncCheckpointStore.save, CheckpointStore.rewind,
                   CheckpointStore.delete):
        params = inspect.signature(method).parameters
        given = [p for p in params.values() if p.default is UNSET]
        assert given, method
        for p in given:
            assert "Unset" in str(p.annotation), (method, p)
            assert f"{p.name}: '{p.annotation}' = UNSET" in str(inspect.signature(method))
    assert repr(UNSET) == "UNSET" and isinstance(UNSET, Unset)
