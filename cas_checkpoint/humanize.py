"""Formatting shared by reports and the command line. Pure code."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """``1536`` -> ``'1.5 KB'``."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def plural(n: int, word: str, many: str | None = None, *, fmt: str = "") -> str:
    """``plural(1, "thread")`` -> ``'1 thread'``, ``plural(2, "match", "matches")`` ->
    ``'2 matches'``: a count with its noun in the number that agrees (``fmt=","``: 1,024)."""
    return f"{n:{fmt}} {word if n == 1 else many or word + 's'}"
