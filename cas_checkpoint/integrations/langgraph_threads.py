"""The store thread a LangGraph thread lives in: ``lg:["<thread_id>","<checkpoint_ns>"]``.

Rule: CasSaver writes these names and the command line reads them through this module only; it
imports nothing of LangGraph, so the command line can tell LangGraph's threads without it.
"""

from __future__ import annotations

import json

PREFIX = "lg:"


_NAMES: dict[tuple[str, str], str] = {}  # recent short (thread_id, ns), exactly str -> names
_PARSED: dict[str, tuple[str, str]] = {}  # and back: what ``parse_name`` gives of those names
NAMES_MAX = 4096
NAME_CHARS = 512  # (thread_id, ns) of more characters in all are not remembered


def name_of(thread_id: str, ns: str) -> str:
    """The store thread of LangGraph's ``(thread_id, checkpoint_ns)`` (each put and put_writes
    asks: the names of recent ones are remembered, not encoded again)."""
    if type(thread_id) is str and type(ns) is str and len(thread_id) + len(ns) <= NAME_CHARS:
        got = _NAMES.get((thread_id, ns))
        if got is None:
            got = _name_of(thread_id, ns)
            if len(_NAMES) >= NAMES_MAX:
                _NAMES.clear()
                _PARSED.clear()
            _NAMES[thread_id, ns] = got
            _PARSED[got] = (thread_id, ns)
        return got
    return _name_of(thread_id, ns)


def _name_of(thread_id: str, ns: str) -> str:
    return PREFIX + json.dumps([thread_id, ns], ensure_ascii=False, separators=(",", ":"))


def parse_name(name: str) -> tuple[str, str] | None:
    """``(thread_id, checkpoint_ns)`` of a store thread CasSaver writes, else None."""
    known = _PARSED.get(name)
    if known is not None:  # (a name ``name_of`` made: its inverse)
        return known
    if not name.startswith(PREFIX):
        return None
    try:
        got = json.loads(name[len(PREFIX):])
    except ValueError:
        return None
    if type(got) is list and len(got) == 2 and type(got[0]) is str and type(got[1]) is str:
        return got[0], got[1]
    return None


def thread_of(name: str) -> str | None:
    """The LangGraph thread id of a store thread CasSaver writes, else None: the key by which
    ``expire`` keeps a thread's namespaces together (``group=``)."""
    got = parse_name(name)
    return None if got is None else got[0]
