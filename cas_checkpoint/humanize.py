"""Formatting shared by reports and the command line. Pure code."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """``1536`` -> ``'1.5 KB'``."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"
