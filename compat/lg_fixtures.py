# ruff: noqa: F821  (appended to LangGraph's tests/conftest.py, which defines pytest and the savers)
# --- appended by cas_checkpoint's compat/langgraph_suite.py -------------------------------
# LangGraph's checkpointer fixtures re-defined: the same savers as LangGraph's own conftest
# (by name), plus CasSaver on a fresh local directory and on a unique memory:// name per test.
# CAS_LG_BACKENDS chooses the savers (comma-separated); CAS_LG_RESULTS names a JSON-lines file
# the controller writes one line per test phase into.
import json as _cas_json
import os as _cas_os
import shutil as _cas_shutil
import tempfile as _cas_tempfile
from contextlib import contextmanager as _cas_cm

_CAS_SYNC = ("memory", "memory_migrate_sends", "sqlite", "sqlite_aes", "cas_local", "cas_memory")
_CAS_ASYNC = ("memory", "sqlite_aio", "cas_local", "cas_memory")
_CAS_WANTED = [b for b in _cas_os.environ.get(
    "CAS_LG_BACKENDS", "memory,sqlite,cas_local,cas_memory").split(",") if b]
_CAS_FIXTURES = ("sync_checkpointer", "async_checkpointer")


@_cas_cm
def _cas_saver(kind):
    from cas_checkpoint.integrations.langgraph import CasSaver

    if kind == "cas_local":
        folder = _cas_tempfile.mkdtemp(prefix="lgsuite-")
        try:
            yield CasSaver.from_url(folder)
        finally:
            _cas_shutil.rmtree(folder, ignore_errors=True)
    else:
        import fsspec

        root = f"lgsuite-{_cas_os.urandom(8).hex()}"  # (tests patch uuid.uuid4)
        try:
            yield CasSaver.from_url(f"memory://{root}")
        finally:
            fs = fsspec.filesystem("memory")
            for path in [p for p in fs.store if p.startswith(f"/{root}/")]:
                fs.store.pop(path, None)


@pytest.fixture(scope="function",
                params=[b for b in _CAS_SYNC if b in _CAS_WANTED])
def sync_checkpointer(request):
    name = request.param
    makers = {"memory": _checkpointer_memory,
              "memory_migrate_sends": _checkpointer_memory_migrate_sends,
              "sqlite": _checkpointer_sqlite, "sqlite_aes": _checkpointer_sqlite_aes}
    with (makers[name]() if name in makers else _cas_saver(name)) as checkpointer:
        yield checkpointer


@pytest.fixture(scope="function",
                params=[b for b in _CAS_ASYNC
                        if b in _CAS_WANTED or (b == "sqlite_aio" and "sqlite" in _CAS_WANTED)])
async def async_checkpointer(request):
    name = request.param
    if name == "memory":
        with _checkpointer_memory() as checkpointer:
            yield checkpointer
    elif name == "sqlite_aio":
        async with _checkpointer_sqlite_aio() as checkpointer:
            yield checkpointer
    else:
        with _cas_saver(name) as checkpointer:
            async with checkpointer:
                yield checkpointer


def _cas_key(item):
    """The test without its checkpointer: the same run on each saver has the same key."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    rest = ",".join(f"{k}={params[k]!r}" for k in sorted(params) if k not in _CAS_FIXTURES)
    return f"{item.path.name}::{item.originalname}[{rest}]"


def pytest_collection_modifyitems(config, items):
    """Keep only the runs that use a checkpointer fixture, and label them."""
    keep, drop = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        saver = next((params[f] for f in _CAS_FIXTURES if f in params), None)
        if saver is None:
            drop.append(item)
            continue
        item.user_properties.append(("cas_saver", "sqlite" if saver == "sqlite_aio" else saver))
        item.user_properties.append(("cas_mode", "async" if "async_checkpointer" in params
                                     else "sync"))
        item.user_properties.append(("cas_key", _cas_key(item)))
        item.user_properties.append(("cas_name", f"{item.path.name}::{item.name}"))
        keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_runtest_logreport(report):
    path = _cas_os.environ.get("CAS_LG_RESULTS")
    if not path or _cas_os.environ.get("PYTEST_XDIST_WORKER"):
        return
    props = dict(report.user_properties)
    if "cas_saver" not in props:
        return
    line = {"when": report.when, "outcome": report.outcome,
            "xfail": hasattr(report, "wasxfail"), "duration": report.duration, **props}
    with open(path, "a", encoding="utf-8") as f:
        f.write(_cas_json.dumps(line) + "\n")
