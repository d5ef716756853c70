"""OpenTelemetry (issue 34): a span per public operation with its thread, bytes and storage
requests by kind, and the metrics, read with the SDK's in-memory exporter and metric reader; and
without ``opentelemetry`` importable, the store works and the drivers trace nothing."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import metrics, trace  # noqa: E402
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from test_packs import S3Requests  # noqa: E402

from cas_checkpoint import CheckpointStore  # noqa: E402

_EXPORTER = InMemorySpanExporter()
_READER = InMemoryMetricReader()


@pytest.fixture(scope="module", autouse=True)
def _sdk() -> None:
    """The SDK installed once per process (OpenTelemetry's global providers are set once)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[_READER]))


def _spans() -> list[Any]:
    out = list(_EXPORTER.get_finished_spans())
    _EXPORTER.clear()
    return out


def _metrics() -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for rm in _READER.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out[m.name] = list(m.data.data_points)
    return out


_S3_KIND = {"GetObject": ("get", "read_ref"), "PutObject": ("put", "write_ref"),
            "ListObjectsV2": ("list",)}


def test_spans_of_one_save_and_one_cold_load_count_their_requests_on_s3(
        moto_server: dict[str, Any]) -> None:
    url = f"s3://{moto_server['bucket']}/otel-{uuid.uuid4().hex[:8]}"
    opts = moto_server["storage_options"]
    writer = CheckpointStore.open(url, storage_options=opts)
    writer.save("warm-up", {"x": 1})  # (the backend's one-off checks, and the store's settings)
    state = {"messages": [f"message {i} " * 20 for i in range(300)]}
    counter = S3Requests(writer)
    _spans()
    try:
        info = writer.save("t", state)
        sent = Counter(counter.take())
    finally:
        counter.close()
    [save] = _spans()
    a = dict(save.attributes)
    assert save.name == "cas_checkpoint.save" and a["cas.thread_id"] == "t"
    assert a["cas.bytes"] == info.size and a["cas.bytes_written"] < info.size
    assert a["cas.requests.write_ref"] == 1 and a["cas.requests.put"] >= 1
    assert a["cas.requests"] == sum(n for k, n in a.items() if k.startswith("cas.requests."))
    # what the span counts is what botocore sent
    for op, kinds in _S3_KIND.items():
        assert sent[op] == sum(a.get(f"cas.requests.{k}", 0) for k in kinds), (op, sent, a)

    reader = CheckpointStore.open(url, storage_options=opts)  # a new process, as far as caches go
    counter = S3Requests(reader)
    try:
        assert reader.load("t").state == state
        sent = Counter(counter.take())
    finally:
        counter.close()
    [load] = _spans()
    a = dict(load.attributes)
    assert load.name == "cas_checkpoint.load" and a["cas.thread_id"] == "t"
    assert a["cas.requests.read_ref"] == 1 and a["cas.requests.get"] == a["cas.objects_read"]
    assert a["cas.cache_misses"] >= 1 and a["cas.bytes"] == info.size
    assert a.get("cas.requests.put", 0) == 0 and a["cas.bytes_written"] == 0
    for op, kinds in _S3_KIND.items():
        assert sent[op] == sum(a.get(f"cas.requests.{k}", 0) for k in kinds), (op, sent, a)
    got = _metrics()
    ops = {p.attributes["cas.operation"] for p in got["cas_checkpoint.operation.duration"]}
    assert {"save", "load"} <= ops
    assert sum(p.value for p in got["cas_checkpoint.bytes_written"]) > 0
    assert got["cas_checkpoint.save.dedup_ratio"]


def test_every_public_operation_has_a_span_and_gc_counts_what_it_reclaimed() -> None:
    store = CheckpointStore.open(f"memory://otel-{uuid.uuid4().hex[:8]}")
    for i in range(3):  # (states large enough to go into packs, not into the ref)
        store.save("a", {"messages": [f"message {i} {j} " * 20 for j in range(300)]})
    store.save("b", {"messages": [f"b {j} " * 20 for j in range(300)]})
    _spans()
    store.prune(keep_last=1)
    store.verify()
    store.expire(idle_for=timedelta(days=30))
    store.delete_thread("b")
    store.gc(grace=timedelta(0), repack=True)
    dest = CheckpointStore.open(f"memory://otel-{uuid.uuid4().hex[:8]}")
    from cas_checkpoint import copy_threads

    copy_threads(store, dest)
    names = [s.name.removeprefix("cas_checkpoint.") for s in _spans()]
    assert names == ["prune", "verify", "expire", "gc", "copy"]
    assert sum(p.value for p in _metrics()["cas_checkpoint.gc.reclaimed_bytes"]) > 0


def test_a_lost_race_is_counted() -> None:
    store = CheckpointStore.open(f"memory://otel-{uuid.uuid4().hex[:8]}")
    other = CheckpointStore.open(store.url)
    store.save("t", {"v": 0})
    other.save("t", {"v": 1})  # store's remembered ref is now stale: its next save loses once
    _spans()
    store.save("t", {"v": 2})
    [save] = _spans()
    assert save.attributes["cas.lost_races"] == 1
    assert sum(p.value for p in _metrics()["cas_checkpoint.cas.lost_races"]) >= 1


def test_without_opentelemetry_nothing_is_traced_and_the_store_works(tmp_path: Any) -> None:
    code = textwrap.dedent(f"""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    raise ImportError("blocked")
        sys.meta_path.insert(0, Block())
        from cas_checkpoint import CheckpointStore
        from cas_checkpoint.engine import telemetry
        assert telemetry.ENABLED is False
        s = CheckpointStore.open({str(tmp_path / 's')!r})
        s.save("t", {{"x": 1}})
        assert CheckpointStore.open(s.url).load("t").state == {{"x": 1}}
        assert not any(m.startswith("opentelemetry") for m in sys.modules)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_the_async_face_traces_too() -> None:
    import asyncio

    from cas_checkpoint import AsyncCheckpointStore

    async def go() -> None:
        store = await AsyncCheckpointStore.open(f"memory://otel-{uuid.uuid4().hex[:8]}")
        await store.save("t", {"x": 1})
        await (await AsyncCheckpointStore.open(store.url)).load("t")

    _spans()
    asyncio.run(go())
    spans = _spans()
    assert [s.name for s in spans] == ["cas_checkpoint.save", "cas_checkpoint.load"]
    assert spans[1].attributes["cas.requests.read_ref"] == 1


def test_the_langgraph_saver_puts_and_gets_in_spans() -> None:
    pytest.importorskip("langgraph")
    from test_langgraph import ask_graph, human

    from cas_checkpoint.integrations.langgraph import CasSaver

    saver = CasSaver.from_url(f"memory://otel-{uuid.uuid4().hex[:8]}")
    _spans()
    ask_graph(saver).invoke(human("refund please"), {"configurable": {"thread_id": "lg"}})
    spans = _spans()
    names = {s.name for s in spans}
    assert {"cas_checkpoint.save", "cas_checkpoint.load"} <= names
    assert all(s.attributes["cas.thread_id"] == "lg" for s in spans
               if "cas.thread_id" in s.attributes)


def test_an_application_that_never_imports_opentelemetry_pays_no_import(tmp_path: Any) -> None:
    """opentelemetry installed (as here) but not used by the application: a save and a load
    import none of it."""
    code = textwrap.dedent(f"""
        import sys
        from cas_checkpoint import CheckpointStore
        from cas_checkpoint.engine import telemetry
        assert telemetry.ENABLED is True
        s = CheckpointStore.open({str(tmp_path / 's')!r})
        s.save("t", {{"x": 1}})
        assert CheckpointStore.open(s.url).load("t").state == {{"x": 1}}
        print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout, out.stderr)
