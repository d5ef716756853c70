"""The classes CasSaver constructs: LangChain's messages and documents, LangGraph's own types,
and what a caller or LangGraph names."""

from __future__ import annotations

from typing import Any

from ...codec import TypeRegistry
from ...errors import FormatError, InvalidArgumentError


def default_types() -> TypeRegistry:
    """LangChain messages and documents, LangGraph's Send/Command/Interrupt/Overwrite."""
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

