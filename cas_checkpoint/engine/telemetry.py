"""OpenTelemetry spans and metrics for the store's public operations, at one place: the step
drivers (``steps.run``, ``steps.arun``) pass the step they are about to run to ``traced``,
which, when it is one of ``OPERATIONS``, counts every storage request it yields (``Tally.op``)
and ends its span with what it did.

Without ``opentelemetry-api`` installed (the ``otel`` extra) ``ENABLED`` is False and ``traced``
is never called: the drivers pay one test of a module constant per operation. With it, nothing
is imported here until the application has imported opentelemetry itself, and nothing is
counted until it installs an SDK's providers (the API's own are proxies that record nothing):
an operation then costs a look in ``sys.modules`` or two more calls. The application installs
the SDK and its exporters; this module configures none.

Span ``cas_checkpoint.<operation>`` attributes: ``cas.thread_id``, ``cas.bytes`` (a save's or
a load's state size, gc's reclaimed bytes), ``cas.requests.<kind>`` (get, put, read_ref,
write_ref, delete_ref, list, delete), ``cas.requests``, ``cas.bytes_written``,
``cas.bytes_read``, ``cas.objects_written``, ``cas.objects_read``, ``cas.cache_hits``,
``cas.cache_misses``, ``cas.lost_races``. Metrics (meter ``cas_checkpoint``):
``cas_checkpoint.operation.duration`` (s, by ``cas.operation``), ``cas_checkpoint.bytes_written``,
``cas_checkpoint.save.logical_bytes`` (their ratio is the dedup ratio),
``cas_checkpoint.save.dedup_ratio`` (per save), ``cas_checkpoint.cache.hits`` and ``.misses``,
``cas_checkpoint.cas.lost_races``, ``cas_checkpoint.gc.reclaimed_bytes``."""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Generator
from typing import Any, TypeVar

try:  # the otel extra, installed? (imported only once the application has imported it)
    ENABLED = importlib.util.find_spec("opentelemetry") is not None
except (ImportError, ValueError):  # pragma: no cover - exercised in a subprocess
    ENABLED = False

from cas_checkpoint.backends.base import RefMismatch

T = TypeVar("T")
Step = Generator[Any, Any, T]  # (steps.Step: this module is below steps.py, whose drivers use it)

OPERATIONS = {  # the qualified names of the steps that are public operations
    "Core.save": "save", "Core.load": "load", "Maintenance.gc": "gc",
    "Maintenance.verify": "verify", "Maintenance.prune": "prune",
    "Maintenance.expire": "expire", "copy_step": "copy",
    "Steps._commit": "save", "Steps._get_tuple": "load",  # CasSaver's (group) commits of
    # its puts and pending writes, and its get_tuple
}

_KINDS = {"GetMany": "get", "PutMany": "put", "ReadRef": "read_ref", "ReadRefs": "read_ref",
          "WriteRef": "write_ref", "DeleteRef": "delete_ref", "List": "list",
          "ListMany": "list", "DeleteMany": "delete"}

_instruments: dict[str, Any] = {}


def _meter() -> dict[str, Any]:
    if not _instruments:
        from opentelemetry import metrics

        m = metrics.get_meter("cas_checkpoint")
        _instruments.update(
            duration=m.create_histogram("cas_checkpoint.operation.duration", unit="s",
                                        description="time of a store operation"),
            written=m.create_counter("cas_checkpoint.bytes_written", unit="By"),
            logical=m.create_counter("cas_checkpoint.save.logical_bytes", unit="By"),
            dedup=m.create_histogram("cas_checkpoint.save.dedup_ratio",
                                     description="a save's state bytes / bytes it wrote"),
            hits=m.create_counter("cas_checkpoint.cache.hits"),
            misses=m.create_counter("cas_checkpoint.cache.misses"),
            races=m.create_counter("cas_checkpoint.cas.lost_races"),
            reclaimed=m.create_counter("cas_checkpoint.gc.reclaimed_bytes", unit="By"))
    return _instruments


def _installed() -> bool:
    """Whether the application installed a tracer or a meter provider (an SDK): not if it never
    imported opentelemetry (nothing is imported here then); until it installs one, the API's
    providers are proxies that record nothing, and nothing is counted."""
    if not _api:
        if "opentelemetry.trace" not in sys.modules and "opentelemetry.metrics" not in sys.modules:
            return False
        from opentelemetry import metrics, trace

        _api.extend((trace.get_tracer_provider, metrics.get_meter_provider))
    return not (type(_api[0]()).__name__ == "ProxyTracerProvider"
                and type(_api[1]()).__name__ == "_ProxyMeterProvider")


_api: list[Any] = []  # the API's provider getters, once the application has imported it


def _objects(step: Any) -> Any:
    """The object store the step works on (its ``self``'s, or its engine's), for cache hits."""
    owner = step.gi_frame.f_locals.get("self") if step.gi_frame is not None else None
    got = getattr(owner, "objects", None)
    return got if hasattr(got, "hits") else getattr(getattr(owner, "_core", None), "objects",
                                                    None)


class Tally:
    """One operation's span and what its requests did."""

    __slots__ = ("name", "span", "t0", "requests", "written", "read", "objects_written",
                 "objects_read", "races", "store", "hits0", "misses0")

    def __init__(self, name: str, step: Any) -> None:
        self.name = name
        local = step.gi_frame.f_locals if step.gi_frame is not None else {}
        attrs: dict[str, Any] = {"cas.operation": name}
        thread = local.get("thread_id")
        if isinstance(thread, str):
            attrs["cas.thread_id"] = thread
        from opentelemetry import trace

        self.span = trace.get_tracer("cas_checkpoint").start_span(f"cas_checkpoint.{name}",
                                                                   attributes=attrs)
        self.requests: dict[str, int] = {}
        self.written = self.read = self.objects_written = self.objects_read = self.races = 0
        self.store = _objects(step)
        self.hits0 = getattr(self.store, "hits", 0)
        self.misses0 = getattr(self.store, "misses", 0)
        self.t0 = time.perf_counter()

    def op(self, op: Any, value: Any, error: BaseException | None) -> None:
        """Count one request the step yielded, with its result or error."""
        kind = _KINDS.get(type(op).__name__)
        if kind is None:
            return
        keys = getattr(op, "keys", None) or getattr(op, "items", None) or getattr(
            op, "prefixes", None)
        n = 1 if keys is None else len(keys)
        self.requests[kind] = self.requests.get(kind, 0) + n
        if isinstance(error, RefMismatch):
            self.races += 1
        if error is not None:
            return
        if kind == "put":
            self.objects_written += len(op.items)
            self.written += sum(len(v) for v in op.items.values())
        elif kind == "write_ref":
            self.written += len(op.data)
        elif kind == "get" and isinstance(value, dict):
            got = [v for v in value.values() if v is not None]
            self.objects_read += len(got)
            self.read += sum(len(v) for v in got)
        elif kind == "read_ref":
            for one in value if isinstance(value, list) else [value]:
                if one is not None:
                    self.read += len(one[0])

    def end(self, result: Any, error: BaseException | None) -> None:
        span, m = self.span, _meter()
        seconds = time.perf_counter() - self.t0
        hits = getattr(self.store, "hits", 0) - self.hits0
        misses = getattr(self.store, "misses", 0) - self.misses0
        size = getattr(result, "size", None)
        if self.name == "gc":
            size = getattr(result, "deleted_bytes", None)
            if size:
                m["reclaimed"].add(size)
        attrs = {f"cas.requests.{k}": n for k, n in sorted(self.requests.items())}
        attrs.update({"cas.requests": sum(self.requests.values()),
                      "cas.bytes_written": self.written, "cas.bytes_read": self.read,
                      "cas.objects_written": self.objects_written,
                      "cas.objects_read": self.objects_read, "cas.cache_hits": hits,
                      "cas.cache_misses": misses, "cas.lost_races": self.races})
        if isinstance(size, int):
            attrs["cas.bytes"] = size
        span.set_attributes(attrs)
        op = {"cas.operation": self.name}
        m["duration"].record(seconds, op)
        if self.written:
            m["written"].add(self.written, op)
        if self.name == "save" and isinstance(size, int):
            m["logical"].add(size)
            if self.written:
                m["dedup"].record(size / self.written)
        if hits:
            m["hits"].add(hits, op)
        if misses:
            m["misses"].add(misses, op)
        if self.races:
            m["races"].add(self.races, op)
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        span.end()


def traced(step: Step[T]) -> Step[T]:
    """``step`` itself, or when it is a public operation (``OPERATIONS``) a step that runs it
    in a span, counting its requests (called by the drivers only if ``ENABLED``)."""
    name = OPERATIONS.get(getattr(getattr(step, "gi_code", None), "co_qualname", ""))
    if name is None or not _installed():
        return step
    return _traced(step, Tally(name, step))


def _traced(step: Step[T], tally: Tally) -> Step[T]:
    value: Any = None
    error: BaseException | None = None
    try:
        while True:
            op = step.send(value) if error is None else step.throw(error)
            value = error = None
            try:
                value = yield op
            except Exception as exc:  # the request failed: the step sees it, as from a driver
                error = exc
            tally.op(op, value, error)
    except StopIteration as stop:
        tally.end(stop.value, None)
        return stop.value  # type: ignore[no-any-return]
    except BaseException as exc:
        step.close()
        tally.end(None, exc)
        raise
