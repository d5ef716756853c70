"""A page of a thread's history laid out for SVG: one dot per checkpoint, in the lanes that
``cas-checkpoint log --graph`` draws (its lane algorithm, ``cli.render.graph``, places each
checkpoint in a column), and the edges to its parents on the page. Pure code."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cas_checkpoint.engine.model import CheckpointInfo
from cas_checkpoint.query.lanes import graph as lanes

ROW, COL, PAD = 30, 16, 12  # pixels: a row, a lane, the margin


@dataclass(frozen=True, slots=True)
class Dot:
    info: CheckpointInfo
    row: int
    col: int
    x: int
    y: int


@dataclass(frozen=True, slots=True)
class Layout:
    dots: list[Dot]
    edges: list[str]  # SVG path data, child to parent
    loose: list[str]  # path data: a parent on another page (a short dashed stub)
    width: int  # of the lanes
    height: int
    text_x: int


def layout(infos: Sequence[CheckpointInfo]) -> Layout:
    """Dots and edges of ``infos`` (newest first, as ``history`` returns them)."""
    dots: list[Dot] = []
    for prefix, info in lanes(infos):
        if info is None:
            continue
        col = prefix.index("*") // 2
        row = len(dots)
        dots.append(Dot(info, row, col, PAD + col * COL, PAD + row * ROW))
    where = {d.info.id: d for d in dots}
    edges: list[str] = []
    loose: list[str] = []
    for d in dots:
        for parent in d.info.parent_ids:
            p = where.get(parent)
            if p is None:
                loose.append(f"M{d.x},{d.y} L{d.x},{d.y + ROW // 2}")
            elif p.col == d.col:
                edges.append(f"M{d.x},{d.y} L{p.x},{p.y}")
            elif d.col > p.col:  # a side lane joins its parent's lane at the parent
                bend = p.y - ROW
                edges.append(f"M{d.x},{d.y} L{d.x},{bend} C{d.x},{p.y - ROW // 3} "
                             f"{p.x},{bend + ROW // 3} {p.x},{p.y}")
            else:  # a merge opens a lane for its other parent at once
                bend = d.y + ROW
                edges.append(f"M{d.x},{d.y} C{d.x},{d.y + ROW // 2} {p.x},{d.y + ROW // 2} "
                             f"{p.x},{bend} L{p.x},{p.y}")
    cols = max((d.col for d in dots), default=0) + 1
    width = PAD * 2 + (cols - 1) * COL
    return Layout(dots, edges, loose, width, PAD * 2 + max(0, len(dots) - 1) * ROW + ROW // 2,
                  width + 8)
