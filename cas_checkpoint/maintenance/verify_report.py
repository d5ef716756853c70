"""What ``verify`` reports: the problems it found and what it checked, as text or JSON. Pure
code."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cas_checkpoint.humanize import human_bytes as _human
from cas_checkpoint.humanize import plural

Progress = Callable[[int, int], None]
"""``progress(done, total)``: packs read and objects checked so far, of about ``total``."""


@dataclass(frozen=True, slots=True)
class Problem:
    kind: str  # missing | corrupt | undecodable | unreadable | stray | dangling_ref | mismatch
    #            | too_deep | too_big
    what: str  # ref | pack | segment | record | node | object
    object: str | None  # object or pack id, or the checkpoint id a ref names
    path: str  # storage key under the store's root
    detail: str
    threads: tuple[str, ...] = ()  # threads this breaks
    checkpoints: tuple[str, ...] = ()  # checkpoints whose record or state this breaks

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "what": self.what, "object": self.object, "path": self.path,
                "detail": self.detail, "threads": list(self.threads),
                "checkpoints": list(self.checkpoints)}


@dataclass(slots=True)
class VerifyReport:
    url: str
    deep: bool
    sample: float | None
    thread: str | None
    problems: list[Problem] = field(default_factory=list)
    threads: int = 0
    checkpoints: int = 0
    objects: int = 0  # distinct objects reached (segments, records, nodes)
    objects_hashed: int = 0
    bytes_hashed: int = 0
    by_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    unreachable_objects: int | None = None  # packs no ref names (garbage for gc)
    unreachable_bytes: int | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # not damage, but worth knowing

    @property
    def ok(self) -> bool:
        return not self.problems

    def broken_checkpoints(self) -> set[str]:
        return {c for p in self.problems for c in p.checkpoints}

    def broken_threads(self) -> set[str]:
        return {t for p in self.problems for t in p.threads}

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "url": self.url, "deep": self.deep, "sample": self.sample,
                "thread": self.thread, "threads": self.threads, "checkpoints": self.checkpoints,
                "objects": self.objects, "objects_hashed": self.objects_hashed,
                "bytes_hashed": self.bytes_hashed, "by_kind": self.by_kind,
                "unreachable_objects": self.unreachable_objects,
                "unreachable_bytes": self.unreachable_bytes, "seconds": round(self.seconds, 3),
                "problems": [p.to_dict() for p in self.problems], "notes": list(self.notes)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def to_text(self, *, limit: int | None = None) -> str:
        """The report as lines, the counts first; with ``limit``, at most that many notes,
        problems and checkpoint ids per problem, each list ending with how many it left out."""
        mode = "deep" if self.deep else "quick"
        if self.deep and self.sample is not None:
            mode += f" (sample {self.sample:g})"
        lines = [f"verify {self.url} ({mode}"
                 + (f", thread {self.thread!r})" if self.thread is not None else ")"),
                 f"  {plural(self.threads, 'thread')}, {plural(self.checkpoints, 'checkpoint')}, "
                 f"{plural(self.objects, 'object')} reached in "
                 f"{plural(self.by_kind.get('pack', {}).get('objects', 0), 'pack')}; "
                 f"{self.objects_hashed} hashed ({_human(self.bytes_hashed)}) in "
                 f"{self.seconds:.2f} s"]
        if not self.deep:
            packs = plural(self.by_kind.get("pack", {}).get("objects", 0), "pack")
            lines[1] = (f"  {plural(self.threads, 'thread')}, "
                        f"{plural(self.checkpoints, 'checkpoint')}, {packs} named, each "
                        "present at the size its ref records (from a listing; no pack read: "
                        f"--deep reads and re-hashes) in {self.seconds:.2f} s")
        if self.unreachable_objects is not None:
            lines.append(f"  unreachable (garbage for gc, not an error): "
                         f"{plural(self.unreachable_objects, 'pack')}, "
                         f"{_human(self.unreachable_bytes or 0)}")
        lines += [f"  note: {n}" for n in _cut(self.notes, limit, "note")]
        if self.ok:
            return "\n".join([*lines, "OK: no problems found"])
        lines.append(f"{plural(len(self.problems), 'PROBLEM', 'PROBLEMS')}, breaking "
                     f"{plural(len(self.broken_checkpoints()), 'checkpoint')} in "
                     f"{plural(len(self.broken_threads()), 'thread')}:")
        for p in self.problems[:limit]:
            lines.append(f"  {p.kind} {p.what} {p.path}: {p.detail}")
            if p.threads:
                lines.append("    threads: " + ", ".join(
                    _cut([repr(t) for t in p.threads], limit, "thread")))
            if p.checkpoints:
                lines.append(f"    checkpoints ({len(p.checkpoints)}): "
                             + ", ".join(_cut(list(p.checkpoints), limit, "checkpoint")))
        if limit is not None and len(self.problems) > limit:
            lines.append(f"  ... and {plural(len(self.problems) - limit, 'more problem')}")
        return "\n".join(lines)


def _cut(items: list[str], limit: int | None, noun: str) -> list[str]:
    """``items``, or its first ``limit`` and a last item saying how many more there are."""
    if limit is None or len(items) <= limit:
        return items
    return [*items[:limit], f"... and {plural(len(items) - limit, 'more ' + noun)}"]


__all__ = ["Problem", "Progress", "VerifyReport"]
