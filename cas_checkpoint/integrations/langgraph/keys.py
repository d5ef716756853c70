"""Where LangGraph's threads live in the store: names, configs."""

from __future__ import annotations

from langchain_core.runnables import RunnableConfig

from cas_checkpoint.errors import InvalidArgumentError
from cas_checkpoint.integrations import langgraph_threads as _names

PREFIX = _names.PREFIX
_key = _names.name_of
_parse = _names.parse_name


def _config(thread_id: str, ns: str, cid: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}}


def _target(config: RunnableConfig) -> tuple[str, str]:
    conf = config.get("configurable") or {}
    thread_id = conf.get("thread_id")
    if thread_id is None:
        raise InvalidArgumentError("the config has no configurable.thread_id; pass "
                                   "{'configurable': {'thread_id': ...}}")
    return str(thread_id), str(conf.get("checkpoint_ns", "") or "")
