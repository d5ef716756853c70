"""Counts what zstd decompresses: ``zstandard.ZstdDecompressor`` replaced by one whose stream
readers add up the plain bytes they give (every pack body is read through one), one count a
stream. Works on any version of the readers (none is patched but zstd's own class)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import zstandard

from cas_checkpoint.format import pack as packfile


class _Reader:
    def __init__(self, real: Any, counts: list[int]) -> None:
        self._real, self._counts, self._at = real, counts, len(counts)
        counts.append(0)

    def readinto(self, buf: Any) -> int:
        n: int = self._real.readinto(buf)
        self._counts[self._at] += n
        return n

    def close(self) -> None:
        self._real.close()

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def counting_zstd(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on, the plain bytes each zstd stream gives (a list, one count a stream);
    this thread's zstd contexts and scratch buffers are dropped first."""
    counts: list[int] = []
    real = zstandard.ZstdDecompressor

    class Counting:
        def __init__(self, **kwargs: Any) -> None:
            self._real = real(**kwargs)

        def stream_reader(self, source: Any, **kwargs: Any) -> _Reader:
            return _Reader(self._real.stream_reader(source, **kwargs), counts)

    monkeypatch.setattr(zstandard, "ZstdDecompressor", Counting)
    packfile._READING.__dict__.clear()
    packfile._SCRATCH.__dict__.clear()
    return counts


@pytest.fixture
def zstd_counts(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    yield counting_zstd(monkeypatch)
