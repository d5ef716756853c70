"""The classes CasSaver constructs: LangChain's messages and documents, LangGraph's own types,
and what a caller or LangGraph names."""

from __future__ import annotations

import functools
import logging
from typing import Any

from cas_checkpoint.errors import FormatError, InvalidArgumentError
from cas_checkpoint.format.codec import TypeRegistry
from cas_checkpoint.format.extypes import ObjectData

log = logging.getLogger("cas_checkpoint")


def default_types() -> TypeRegistry:
    """LangChain messages and documents, LangGraph's Send/Command/Interrupt/Overwrite: a copy of
    the process's own (registered once: each new saver, e.g. one per request, paid ~20
    registrations before its first read)."""
    return _defaults().copy()


@functools.cache
def _defaults() -> TypeRegistry:
    reg = TypeRegistry()
    from langchain_core import messages as m

    for name in ("AIMessage", "AIMessageChunk", "HumanMessage", "HumanMessageChunk",
                 "SystemMessage", "SystemMessageChunk", "ChatMessage", "ChatMessageChunk",
                 "ToolMessage", "ToolMessageChunk", "FunctionMessage", "FunctionMessageChunk",
                 "RemoveMessage"):
        reg.register(getattr(m, name))
    try:
        from langchain_core.documents import Document

        reg.register(Document)
    except ImportError:  # pragma: no cover
        pass
    from langgraph import types as lt

    reg.register(lt.Send, to_data=lambda s: [s.node, s.arg],
                 from_data=lambda d: lt.Send(*_pair(d, "Send")))
    for name in ("Command", "Interrupt"):
        reg.register(getattr(lt, name))
    overwrite = getattr(lt, "Overwrite", None)
    if isinstance(overwrite, type):
        _register_any(reg, overwrite)
    try:
        from langgraph.checkpoint.serde.types import _DeltaSnapshot

        reg.register(_DeltaSnapshot, to_data=lambda s: list(s),
                     from_data=lambda d: _DeltaSnapshot(*_items(d, "_DeltaSnapshot")))
    except ImportError:  # pragma: no cover - an older langgraph-checkpoint
        pass
    return reg


def _pair(data: Any, what: str) -> tuple[Any, Any]:
    if type(data) is not list or len(data) != 2:
        raise FormatError(f"invalid stored {what}: expected [node, arg]")
    return data[0], data[1]


def _items(data: Any, what: str) -> list[Any]:
    if type(data) is not list:
        raise FormatError(f"invalid stored {what}")
    return data


def _register_any(reg: TypeRegistry, cls: type) -> bool:
    """Register a class of a kind the codec stores (dataclass, pydantic model, enum)."""
    try:
        reg.register(cls)
        return True
    except InvalidArgumentError:
        return False



# --- what LangGraph's serializer stores that the codec alone would refuse ----------------------

_PLAIN = (str, int, float, bool, bytes, type(None))
_warned: set[str] = set()


def exception_text(exc: BaseException) -> str:
    """A node's error as LangGraph's serializer stores it (``repr``, e.g.
    ``ValueError('bad input')``), built from the type's name and the arguments that are plain
    values only: no ``__repr__`` of the error's or its arguments' classes runs."""
    args = ", ".join(repr(a) if type(a) in _PLAIN else f"<{type(a).__name__}>"
                     for a in exc.args)
    return f"{type(exc).__name__}({args})"


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def stand_in(obj: Any, *, objects: bool) -> Any:
    """What CasSaver stores for a value of a class that is not registered, as LangGraph's
    serializer does (``jsonplus``): an error as its text; a subclass of str, int, float, list or
    dict as its base type (ormsgpack's behaviour); with ``objects``, a dataclass, pydantic model
    or enum member as its data under its class's name (rebuilt only by a saver that has the
    class: ``types=``, ``with_allowlist`` or the graph's schemas). Anything else:
    NotImplemented (refused, with the codec's error)."""
    import dataclasses
    import enum

    if isinstance(obj, BaseException):
        return exception_text(obj)
    cls = type(obj)
    if objects and isinstance(obj, enum.Enum):
        return ObjectData(_name(cls), obj.value)
    if isinstance(obj, str):
        return str.__str__(obj)
    if isinstance(obj, int) and not isinstance(obj, bool):
        return int.__index__(obj)
    if isinstance(obj, float):
        return float.__float__(obj)
    if isinstance(obj, dict):
        return dict(obj)
    if isinstance(obj, list):
        return list(obj)
    if isinstance(obj, tuple) and objects and hasattr(obj, "_asdict"):  # a namedtuple
        return ObjectData(_name(cls), dict(obj._asdict()))
    if not objects:
        return NotImplemented
    if dataclasses.is_dataclass(obj):
        return ObjectData(_name(cls), {f.name: getattr(obj, f.name)
                                       for f in dataclasses.fields(obj)})
    fields = getattr(cls, "model_fields", None)
    if isinstance(fields, dict) and hasattr(obj, "model_dump"):  # a pydantic v2 model
        if getattr(cls, "__pydantic_root_model__", False):
            return ObjectData(_name(cls), obj.root)
        data = {f: getattr(obj, f) for f in fields}
        data.update(getattr(obj, "__pydantic_extra__", None) or {})
        return ObjectData(_name(cls), data)
    return NotImplemented


def as_data(name: str, data: Any) -> Any:
    """A stored object whose class this saver may not rebuild: its data, as LangGraph's strict
    mode returns it (logged once per class, with the fix)."""
    if name not in _warned and len(_warned) < 1024:
        _warned.add(name)
        short = name.rsplit(".", 1)[-1]
        log.warning("CasSaver returns a stored %s as its data (a dict): the class is not "
                    "registered; pass types=[%s] to CasSaver (or CasSaver.from_url) to get it "
                    "back as itself", name, short)
    return data


def saver_registry(*, objects: bool) -> TypeRegistry:
    """default_types() with the hooks CasSaver stores and loads through (``objects``: store
    unregistered dataclasses, pydantic models and enums as data, and return them as data)."""
    reg = default_types()
    set_hooks(reg, objects=objects)
    return reg


def set_hooks(reg: TypeRegistry, *, objects: bool) -> None:
    reg.stand_in = functools.partial(stand_in, objects=objects)
    reg.unknown = as_data if objects else None
