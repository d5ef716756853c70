"""A cursor over a head's tail alone (``Cursor(short=True)``), given the rest of the log when a
question reads past the tail (``Short``, ``Cursor.more``), answers every question as a cursor
over the whole log does, and reads each entry once (``Steps._ask``: a save's stamp and put's
parent lookup). Random logs of checkpoints, pending writes, ``lgm`` bounds (or none: an old
log), ids out of order (a copied thread), every split of the log into tail and segments."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("langgraph")

from cas_checkpoint.format.objects import CheckpointId, LogEntry  # noqa: E402
from cas_checkpoint.integrations.langgraph.cursor import (  # noqa: E402
    EARLY,
    MAX_KEY,
    Cursor,
    Short,
    lg_of,
)


def _log(rng: random.Random) -> list[LogEntry]:
    """A log, oldest first: checkpoints (LangGraph ids mostly rising) and pending writes."""
    out: list[LogEntry] = []
    top: str | None = None
    bounded = rng.random() < 0.8  # (else a log of before lgm: no bounds)
    for i in range(rng.randint(0, 40)):
        meta: dict[str, Any]
        if out and rng.random() < 0.5:
            cps = [lg_of(e) for e in out if lg_of(e) is not None]
            meta = {"w": rng.choice(cps) if cps else "x", "task": f"t{i}"}
        else:
            lg = f"{i + rng.randint(-5, 5):04d}"
            top = lg if top is None or lg > top else top
            meta = {"lg": lg, **({MAX_KEY: top} if bounded else {})}
        if rng.random() < 0.2:
            meta[EARLY] = {"9999": ""}
        out.append(LogEntry(CheckpointId(f"{i:064x}"), (), i, 0.0, 1, metadata=meta))
    return out


def _asked(entries: list[LogEntry], tail: int, question: Callable[[Cursor], Any]
           ) -> tuple[Any, int]:
    """``question``'s answer as ``Steps._ask`` gets it (the newest ``tail`` entries first), and
    the entries it read."""
    newest = list(reversed(entries))
    read = 0

    def counted(items: list[LogEntry]) -> Iterator[LogEntry]:
        nonlocal read
        for e in items:
            read += 1
            yield e

    cursor = Cursor(counted(newest[:tail]), short=True)
    try:
        return question(cursor), read
    except Short:
        pass
    cursor.more(counted(newest[tail:]))
    return question(cursor), read


def _whole(entries: list[LogEntry], question: Callable[[Cursor], Any]) -> tuple[Any, int]:
    cursor = Cursor(iter(list(reversed(entries))))
    got = question(cursor)
    return got, len(cursor.seen)


QUESTIONS: dict[str, Callable[[Cursor], Any]] = {
    "stamp": lambda c: (c.newest(), c.first_checkpoint(), c.latest()),
    "find": lambda c: [c.find(f"{n:04d}") for n in (3, 17, 30, 9999)],
    "top": lambda c: c.top(3, lambda e, lg: True),
    "writes": lambda c: (c.newest(), c.find("0010"), c.writes({"0010"})),
}


@pytest.mark.parametrize("name", sorted(QUESTIONS))
def test_a_short_cursor_answers_as_the_whole_log(name: str) -> None:
    question = QUESTIONS[name]
    rng = random.Random(name)
    for _ in range(300):
        entries = _log(rng)
        want, read_whole = _whole(entries, question)
        for tail in range(0, len(entries) + 1):
            got, read = _asked(entries, tail, question)
            assert got == want, (tail, len(entries))
            assert read == read_whole  # each entry read once, no more than the whole walk
