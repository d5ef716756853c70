"""CasSaver's time-to-live: LangGraph's TTL settings mapped onto ``CheckpointStore.expire``.

LangGraph's checkpointer ``ttl`` (``langgraph.json``: ``{"strategy": "delete", "default_ttl":
MINUTES, "sweep_interval_minutes": MINUTES}``) and the Redis saver's ``ttl={"default_ttl":
MINUTES, "refresh_on_read": ...}`` are read as they are; a ``timedelta`` is the idle time itself.
A LangGraph thread (all its namespaces) expires when none of its namespaces was saved to for
``default_ttl``; its refs are deleted by compare-and-swap, and gc reclaims its bytes."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from cas_checkpoint.errors import InvalidArgumentError

KEYS = ("strategy", "default_ttl", "sweep_interval_minutes", "refresh_on_read")


def _minutes(value: object, name: str) -> timedelta:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidArgumentError(f"ttl[{name!r}] must be a positive number of minutes "
                                   f"(LangGraph's unit), e.g. ttl={{'default_ttl': 43200}} for "
                                   f"30 days, not {value!r}")
    return timedelta(minutes=float(value))


@dataclass(slots=True)
class TTL:
    """Threads idle for ``idle_for`` expire; with ``sweep_every``, a put sweeps when that long
    has passed since the saver's last sweep (in this process)."""

    idle_for: timedelta
    sweep_every: timedelta | None = None
    last_sweep: float = field(default_factory=time.monotonic)

    def due(self) -> bool:
        if self.sweep_every is None:
            return False
        now = time.monotonic()
        if now - self.last_sweep < self.sweep_every.total_seconds():
            return False
        self.last_sweep = now
        return True


def ttl_of(ttl: Mapping[str, Any] | timedelta | None) -> TTL | None:
    """The TTL of CasSaver's ``ttl`` argument (checked; None: threads never expire)."""
    if ttl is None:
        return None
    if isinstance(ttl, timedelta):
        if ttl <= timedelta(0):
            raise InvalidArgumentError(f"ttl must be a positive timedelta, not {ttl!r}")
        return TTL(ttl)
    if not isinstance(ttl, Mapping):
        raise InvalidArgumentError("ttl must be a timedelta or LangGraph's TTL settings, e.g. "
                                   "ttl={'default_ttl': 43200, 'sweep_interval_minutes': 60}")
    unknown = sorted(set(ttl) - set(KEYS))
    if unknown:
        raise InvalidArgumentError(f"ttl has {unknown[0]!r}, which this saver does not know; "
                                   f"use {', '.join(KEYS)}")
    if ttl.get("strategy", "delete") != "delete":
        raise InvalidArgumentError(f"ttl['strategy'] must be 'delete' (the only strategy "
                                   f"LangGraph defines), not {ttl['strategy']!r}")
    if ttl.get("refresh_on_read"):
        raise InvalidArgumentError(
            "ttl['refresh_on_read']=True is not supported: a thread's idle time runs from its "
            "last save (reading does not write); leave refresh_on_read out or set it to False")
    if ttl.get("default_ttl") is None:
        raise InvalidArgumentError("ttl needs 'default_ttl' (minutes a thread may stay idle), "
                                   "e.g. ttl={'default_ttl': 43200} for 30 days")
    every = ttl.get("sweep_interval_minutes")
    return TTL(_minutes(ttl["default_ttl"], "default_ttl"),
               None if every is None else _minutes(every, "sweep_interval_minutes"))

