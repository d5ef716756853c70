"""When to checkpoint: policies a ``Recorder`` asks at each event of an agent run.

A policy is stateless (one object may serve many recorders): it sees an :class:`Event` (its
name, how many events the recorder has seen, the details the caller passed, and how long ago
the recorder last saved, by the policy's own clock) and says whether to save. Combine policies
with ``|``: ``AfterToolCall() | Every(5) | Interval(seconds=300)`` saves when any of them wants to.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cas_checkpoint.errors import InvalidArgumentError
from cas_checkpoint.format.objects import bad_text

__all__ = ["AfterLlmResponse", "AfterToolCall", "AnyOf", "Clock", "Event", "Every", "Interval",
           "LLM_RESPONSE", "Never", "Policy", "TOOL_CALL"]

Clock = Callable[[], float]
"""A function returning seconds (``time.monotonic`` by default)."""

LLM_RESPONSE = "llm_response"
TOOL_CALL = "tool_call"


@dataclass(frozen=True, slots=True)
class Event:
    """What a policy sees of one event of a run."""

    name: str  # e.g. "llm_response", "tool_call", or any name of the caller's
    count: int  # events the recorder has seen, this one included (1 for the first)
    count_of_name: int  # events of this name it has seen, this one included
    details: Mapping[str, Any] = field(default_factory=dict)  # what the caller passed
    marks: Mapping[Clock, float] = field(default_factory=dict)  # clock -> when it last saved

    def since_save(self, clock: Clock) -> float:
        """Seconds, by ``clock``, since the recorder last saved (or was made, if it never
        saved)."""
        mark = self.marks.get(clock)
        return math.inf if mark is None else clock() - mark


class Policy:
    """Base of every policy: override :meth:`wants` (and :meth:`clocks`, if it reads one)."""

    def wants(self, event: Event) -> bool:
        raise NotImplementedError  # pragma: no cover - every policy overrides it

    def clocks(self) -> tuple[Clock, ...]:
        """The clocks whose time of the last save this policy asks ``Event.since_save``."""
        return ()

    def intervals(self) -> tuple[Interval, ...]:
        """The ``Interval`` policies inside this one (a background checkpointer's default)."""
        return ()

    def __or__(self, other: Policy) -> Policy:
        if not isinstance(other, Policy):
            return NotImplemented
        left = self.policies if isinstance(self, AnyOf) else (self,)
        right = other.policies if isinstance(other, AnyOf) else (other,)
        return AnyOf(*left, *right)


class AnyOf(Policy):
    """Saves when any of its policies wants to (what ``a | b`` makes)."""

    def __init__(self, *policies: Policy) -> None:
        if not all(isinstance(p, Policy) for p in policies):
            raise InvalidArgumentError("AnyOf takes policies, e.g. AnyOf(Every(5), "
                                       "AfterToolCall())")
        self.policies = tuple(p for p in policies if not isinstance(p, Never))

    def wants(self, event: Event) -> bool:
        return any([p.wants(event) for p in self.policies])  # every policy sees every event

    def clocks(self) -> tuple[Clock, ...]:
        return tuple(dict.fromkeys(c for p in self.policies for c in p.clocks()))

    def intervals(self) -> tuple[Interval, ...]:
        return tuple(i for p in self.policies for i in p.intervals())

    def __repr__(self) -> str:
        return " | ".join(map(repr, self.policies)) or "Never()"


def _positive_int(n: object, what: str) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise InvalidArgumentError(f"{what} must be a positive int, not {n!r}")
    return n


def _event_name(name: object, what: str = "event name") -> str:
    if not isinstance(name, str) or not name or len(name) > 200:
        raise InvalidArgumentError(f"{what} must be a non-empty str of at most 200 characters, "
                                   f"not {name!r}")
    problem = bad_text(name)
    if problem is not None:
        raise InvalidArgumentError(f"{what} {problem}; pass a str without lone surrogates")
    return name


class Every(Policy):
    """Saves at every ``n``-th event (the n-th, 2n-th, ...), or, with ``on=``, at every
    ``n``-th event of that name: ``Every(5)``, ``Every(3, on="llm_response")``."""

    def __init__(self, n: int, *, on: str | None = None) -> None:
        self.n = _positive_int(n, "Every(n): n")
        self.on = None if on is None else _event_name(on, "Every(on=)")

    def wants(self, event: Event) -> bool:
        if self.on is None:
            return event.count % self.n == 0
        return event.name == self.on and event.count_of_name % self.n == 0

    def __repr__(self) -> str:
        return f"Every({self.n})" if self.on is None else f"Every({self.n}, on={self.on!r})"


class AfterToolCall(Policy):
    """Saves after each ``"tool_call"`` event (with ``only_ok=True``, only those whose
    ``ok=`` detail is not False)."""

    def __init__(self, *, only_ok: bool = False) -> None:
        if not isinstance(only_ok, bool):
            raise InvalidArgumentError(f"only_ok must be True or False, not {only_ok!r}")
        self.only_ok = only_ok

    def wants(self, event: Event) -> bool:
        return event.name == TOOL_CALL and not (self.only_ok and event.details.get("ok") is False)

    def __repr__(self) -> str:
        return "AfterToolCall(only_ok=True)" if self.only_ok else "AfterToolCall()"


class AfterLlmResponse(Policy):
    """Saves after each ``"llm_response"`` event."""

    def wants(self, event: Event) -> bool:
        return event.name == LLM_RESPONSE

    def __repr__(self) -> str:
        return "AfterLlmResponse()"


class Interval(Policy):
    """Saves at the first event ``seconds`` or more after the recorder's last save (or its
    start), by ``clock`` (``time.monotonic`` by default; pass a fake one in tests). Given to
    ``Recorder.background()``, it also checkpoints the latest state on that period, in a
    thread or an asyncio task, without waiting for events."""

    def __init__(self, *, seconds: float, clock: Clock = time.monotonic) -> None:
        if (isinstance(seconds, bool) or not isinstance(seconds, int | float)
                or not 0 < seconds < math.inf):
            raise InvalidArgumentError(f"Interval(seconds=) must be a positive number, not "
                                       f"{seconds!r}")
        if not callable(clock):
            raise InvalidArgumentError("Interval(clock=) must be a function returning seconds, "
                                       "like time.monotonic")
        self.seconds = float(seconds)
        self.clock = clock

    def wants(self, event: Event) -> bool:
        return event.since_save(self.clock) >= self.seconds

    def clocks(self) -> tuple[Clock, ...]:
        return (self.clock,)

    def intervals(self) -> tuple[Interval, ...]:
        return (self,)

    def __repr__(self) -> str:
        return f"Interval(seconds={self.seconds:g})"


class Never(Policy):
    """Never saves on an event (``checkpoint()``, ``before()`` and ``finish()`` still do)."""

    def wants(self, event: Event) -> bool:
        return False

    def __repr__(self) -> str:
        return "Never()"
