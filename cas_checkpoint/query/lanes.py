"""A history drawn in lanes like ``git log --graph``: the rows of the command line's ``log
--graph`` and of the viewer's SVG."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from cas_checkpoint.engine.model import CheckpointInfo


def graph(infos: Sequence[CheckpointInfo]) -> Iterable[tuple[str, CheckpointInfo | None]]:
    """(prefix, info) rows drawing the DAG of ``infos`` (newest first, children before
    parents) in lanes like ``git log --graph``; rows with ``info`` None are connectors
    (``|/`` where lanes join, ``|\\`` where a merge's other parent opens a lane)."""
    known = {i.id for i in infos}
    lanes: list[str | None] = []

    def row(marks: dict[int, str], between: dict[int, str] | None = None) -> str:
        cells = [" "] * (2 * len(lanes))
        for i, lane in enumerate(lanes):
            cells[2 * i] = marks.get(i, "|" if lane is not None else " ")
        for i, ch in (between or {}).items():  # between lane i-1 and lane i
            if i > 0:
                cells[2 * i - 1] = ch
        return "".join(cells).rstrip()

    for info in infos:
        cols = [i for i, lane in enumerate(lanes) if lane == info.id]
        if cols[1:]:  # other lanes waited for this checkpoint too: they join its lane first
            for i in cols[1:]:
                lanes[i] = None
            yield row({i: " " for i in cols[1:]}, {i: "/" for i in cols[1:]}), None
        if cols:
            col = cols[0]
        elif None in lanes:
            col = lanes.index(None)
            lanes[col] = info.id
        else:
            col = len(lanes)
            lanes.append(info.id)
        yield row({col: "*"}), info
        parents = [p for p in info.parent_ids if p in known]
        lanes[col] = parents[0] if parents else None
        opened = []
        for parent in parents[1:]:
            if parent in lanes:
                continue
            slot = lanes.index(None) if None in lanes else len(lanes)
            if slot == len(lanes):
                lanes.append(parent)
            else:
                lanes[slot] = parent
            opened.append(slot)
        if opened:
            yield row({i: " " for i in opened}, {i: "\\" for i in opened}), None
        while lanes and lanes[-1] is None:
            lanes.pop()
