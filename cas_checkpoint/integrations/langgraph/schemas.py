"""The classes of a compiled graph's own schemas, which CasSaver rebuilds without being told.

LangGraph hands a saver these classes (``with_allowlist``) only in its strict mode
(``LANGGRAPH_STRICT_MSGPACK=true``). CasSaver finds the graph that is calling it on the call
stack instead (a ``Pregel`` method's ``self``: ``invoke``/``stream``, ``get_state``,
``get_state_history``, ``update_state``, their async forms) and takes the classes from the
graph's objects themselves: its state, input, output and context schemas, its nodes' and
branches' input schemas and its channels' value and update types, walked as LangGraph's
``collect_allowlist_from_schemas`` walks them. A class defined inside a function is found too
(nothing is looked up by name).

A test suite or a server builds many graphs of the same schemas: each class's type hints are
read once per process (``typing.get_type_hints`` is the walk's cost: ~1 ms a graph of
``MessagesState``), and the classes of the last ``ROOTS_KEPT`` sets of roots are kept.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import sys
import threading
import types
import typing
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, get_args, get_origin

MAX_FRAMES = 256  # how far up the stack a saver looks for its graph
MAX_TYPES = 4096  # types one graph's walk visits at most
ROOTS_KEPT = 64  # graphs' sets of roots whose classes are kept (a graph's roots, its classes)
_HINTS: weakref.WeakKeyDictionary[Any, tuple[Any, ...]] = weakref.WeakKeyDictionary()
_FOUND: OrderedDict[tuple[Any, ...], frozenset[type]] = OrderedDict()
_LOCK = threading.Lock()


def _pregel_file() -> str | None:
    module = sys.modules.get("langgraph.pregel.main")
    return getattr(module, "__file__", None)


def callers() -> Iterator[Any]:
    """The ``Pregel`` objects whose methods are on the current call stack, innermost first."""
    where = _pregel_file()
    if where is None:
        return
    from langgraph.pregel import Pregel

    frame = sys._getframe(1)
    for _ in range(MAX_FRAMES):
        if frame is None:
            return
        if frame.f_code.co_filename == where and frame.f_code.co_varnames[:1] == ("self",):
            obj = frame.f_locals.get("self")
            if isinstance(obj, Pregel):
                yield obj
        frame = frame.f_back  # type: ignore[assignment]


def _hints(cls: Any) -> tuple[Any, ...]:
    """A class's type hints (its fields' types), read once per class."""
    try:
        with _LOCK:
            got = _HINTS.get(cls)
    except TypeError:  # (not weakly referable)
        return tuple(_read_hints(cls))
    if got is None:
        got = tuple(_read_hints(cls))
        with _LOCK:
            _HINTS[cls] = got
    return got


def _read_hints(cls: Any) -> list[Any]:
    try:
        return list(typing.get_type_hints(cls, include_extras=True).values())
    except Exception:  # a forward reference that does not resolve, etc.
        fields = getattr(cls, "model_fields", None)
        if isinstance(fields, dict):
            return [f.annotation for f in fields.values()]
        if dataclasses.is_dataclass(cls):
            return [f.type for f in dataclasses.fields(cls)]
        return list(getattr(cls, "__annotations__", {}).values())


def classes_of(roots: list[Any]) -> set[type]:
    """The dataclasses, pydantic models and enums reachable from these types."""
    try:
        key = tuple(roots)
        with _LOCK:
            got = _FOUND.get(key)
            if got is not None:
                _FOUND.move_to_end(key)
                return set(got)
    except TypeError:  # (a root that is not hashable)
        return _walk(roots)
    found = _walk(roots)
    with _LOCK:
        _FOUND[key] = frozenset(found)
        while len(_FOUND) > ROOTS_KEPT:
            _FOUND.popitem(last=False)
    return found


def _walk(roots: list[Any]) -> set[type]:
    found: set[type] = set()
    seen: set[int] = set()
    stack = list(roots)
    while stack and len(seen) < MAX_TYPES:
        typ = stack.pop()
        if typ is None or id(typ) in seen:
            continue
        seen.add(id(typ))
        origin = get_origin(typ)
        if origin is not None or isinstance(typ, types.UnionType):
            stack.extend(a for a in get_args(typ) if not isinstance(a, (str, int, bytes)))
            continue
        if hasattr(typ, "__supertype__"):  # NewType
            stack.append(typ.__supertype__)
            continue
        if not isinstance(typ, type):
            continue
        try:
            if typing.is_typeddict(typ):
                stack.extend(_hints(typ))
            elif issubclass(typ, enum.Enum):
                found.add(typ)
            elif dataclasses.is_dataclass(typ) or _is_model(typ):
                found.add(typ)
                stack.extend(_hints(typ))
        except Exception:  # a class that cannot be looked at is simply not learned
            continue
    return found


def _is_model(typ: type) -> bool:
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and issubclass(typ, pydantic.BaseModel)


def _stored(owner: Any, attr: str) -> Any:
    """``owner.attr`` when it is a value the object holds, None when it is computed (a
    property: a compiled graph's ``input_schema`` and ``output_schema`` build a new pydantic
    model on every access, ~0.3 ms, from its channels' types, which ``graph_roots`` reads
    anyway)."""
    cls: Any = type(owner)
    if owner is None or _computed(cls, attr):
        return None
    return getattr(owner, attr, None)


@functools.lru_cache(maxsize=256)
def _computed(cls: Any, attr: str) -> bool:
    """Whether ``cls`` computes ``attr`` (a property), looked up once per class."""
    return isinstance(inspect.getattr_static(cls, attr, None), property)


def graph_roots(graph: Any) -> list[Any]:
    """The schema types of a compiled graph (and of its builder, for a StateGraph)."""
    roots: list[Any] = []
    builder = getattr(graph, "builder", None)
    for owner in (builder, graph):
        for attr in ("state_schema", "input_schema", "output_schema", "context_schema"):
            value = _stored(owner, attr)
            if isinstance(value, type) or get_origin(value) is not None:
                roots.append(value)
    for node in (getattr(builder, "nodes", None) or {}).values():
        roots.append(getattr(node, "input_schema", None))
    for branches in (getattr(builder, "branches", None) or {}).values():
        for branch in branches.values():
            roots.append(getattr(branch, "input_schema", None))
    channels = getattr(graph, "channels", None) or {}
    for channel in channels.values():
        for attr in ("ValueType", "UpdateType"):
            try:
                roots.append(getattr(channel, attr, None))
            except Exception:  # a channel whose type is not set
                pass
    return roots


class Learned:
    """The graphs a saver has taken classes from (each once; weakly held)."""

    def __init__(self) -> None:
        self._graphs: weakref.WeakSet[Any] = weakref.WeakSet()

    def new_classes(self) -> set[type]:
        """The classes of the calling graphs not seen before."""
        out: set[type] = set()
        for graph in callers():
            try:
                if graph in self._graphs:
                    continue
                self._graphs.add(graph)
            except TypeError:  # not weakly referable: look at it every time
                pass
            try:
                out |= classes_of(graph_roots(graph))
            except Exception:  # learning is a convenience: it never fails a read
                continue
        return out
