"""Progress bars (rich) for long commands: shown on stderr when it is a terminal, never in
``--quiet`` or ``--json`` runs unless ``--progress`` forces them. The library only calls a
``progress(done, total)`` callback; drawing is this module's business."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


def wanted(args: argparse.Namespace) -> bool:
    if getattr(args, "progress", False):
        return True
    if getattr(args, "quiet", False):
        return False
    return sys.stderr.isatty()


class _Rate(TextColumn):
    """Items per second (rich's speed column counts bytes)."""

    def __init__(self, unit: str) -> None:
        super().__init__("")
        self.unit = unit

    def render(self, task: Any) -> Any:
        from rich.text import Text

        speed = task.finished_speed or task.speed
        if speed is None and task.elapsed:  # too few samples yet: the average so far
            speed = task.completed / task.elapsed
        return Text(f"{speed or 0:,.0f} {self.unit}/s", style="cyan")


@contextmanager
def bar(args: argparse.Namespace, what: str, unit: str = "objects"
        ) -> Iterator[Callable[..., None] | None]:
    """A ``progress(done, total)`` callback drawing one bar with rate and ETA (or None when no
    bar is wanted). Also takes ``progress(phase, done, total)`` (gc): one bar per phase."""
    if not wanted(args):
        yield None
        return
    console = Console(file=sys.stderr, force_terminal=getattr(args, "progress", False) or None)
    rate: Any = TransferSpeedColumn() if unit == "bytes" else _Rate(unit)
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), rate,
               TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn()]
    with Progress(*columns, console=console, transient=False, refresh_per_second=8) as p:
        tasks: dict[str, TaskID] = {}

        def update(*a: Any) -> None:
            phase, done, total = (a if len(a) == 3 else (what, *a))
            name = what if phase == what else f"{what}: {phase}"
            if name not in tasks:
                tasks[name] = p.add_task(name, total=total)
            p.update(tasks[name], completed=done, total=total)

        yield update
