"""Where LangGraph's threads live in the store: names, configs."""

from __future__ import annotations

import json

from langchain_core.runnables import RunnableConfig

from ...errors import InvalidArgumentError

PREFIX = "lg:"


def _key(thread_id: str, ns: str) -> str:
    return PREFIX + json.dumps([thread_id, ns], ensure_ascii=False, separators=(",", ":"))


def _parse(name: str) -> tuple[str, str] | None:
    """(thread_id, ns) of a store thread of this saver's, else None."""
    if not name.startswith(PREFIX):
        return None
    try:
        got = json.loads(name[len(PREFIX):])
    except ValueError:
        return None
    if type(got) is list and len(got) == 2 and type(got[0]) is str and type(got[1]) is str:
        return got[0], got[1]
    return None


def _config(thread_id: str, ns: str, cid: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}}


def _target(config: RunnableConfig) -> tuple[str, str]:
    conf = config.get("configurable") or {}
    thread_id = conf.get("thread_id")
    if thread_id is None:
        raise InvalidArgumentError("the config has no configurable.thread_id; pass "
                                   "{'configurable': {'thread_id': ...}}")
    return str(thread_id), str(conf.get("checkpoint_ns", "") or "")
