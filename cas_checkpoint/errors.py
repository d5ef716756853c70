"""One exception tree for cas_checkpoint.

::

    CasError                              base of everything this package raises
    ├── SerializationError(CasError, TypeError)   a value cannot be stored (names where)
    ├── FormatError(CasError, ValueError)         stored bytes do not decode (hostile/corrupt)
    ├── IntegrityError(CasError)                  bytes do not hash to their name
    ├── NotFoundError(CasError, KeyError)         unknown thread, checkpoint or object
    ├── ConflictError(CasError)                   a ref moved under a compare-and-swap
    ├── InvalidArgumentError(CasError, ValueError) bad input from the caller
    └── StorageError(CasError, OSError)           the storage cannot be reached or refused
        └── UnsafeStorageError(StorageError)      the storage does not honour conditional writes

Every message says what was wrong and what to do about it.
"""

from __future__ import annotations


class CasError(Exception):
    """Base class of every error raised by cas_checkpoint."""


class SerializationError(CasError, TypeError):
    """A value in the state cannot be encoded. ``path`` names where, e.g. ``state["tools"][2]``."""

    def __init__(self, message: str, path: str = "state") -> None:
        super().__init__(message)
        self.path = path


class FormatError(CasError, ValueError):
    """Stored bytes are not a valid cas_checkpoint object (corrupt, truncated or hostile)."""


class IntegrityError(CasError):
    """An object's bytes do not hash to its name: the storage returned damaged data."""

    def __init__(self, expected: str, actual: str, path: str) -> None:
        super().__init__(
            f"object {path} is damaged: its name says blake3 {expected} but its bytes hash to "
            f"{actual}; the data was not returned. Run `cas-checkpoint verify` to find every "
            "checkpoint affected, and restore the object from a backup or a replica."
        )
        self.expected = expected
        self.actual = actual
        self.path = path


class NotFoundError(CasError, KeyError):
    """A thread, checkpoint or object does not exist."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "not found"


class ConflictError(CasError):
    """A compare-and-swap failed: the thread's head is not the one the caller expected."""

    def __init__(self, thread_id: str, expected: str | None, actual: str | None) -> None:
        super().__init__(
            f"thread {thread_id!r} moved: expected head {expected}, found {actual}. "
            "Load the thread again, merge your change onto the new head, and save with "
            "expected_head set to it."
        )
        self.thread_id = thread_id
        self.expected = expected
        self.actual = actual


class InvalidArgumentError(CasError, ValueError):
    """The caller passed a value the store cannot accept."""


class StorageError(CasError, OSError):
    """The storage could not be reached, refused a request, or failed after retries."""


class UnsafeStorageError(StorageError):
    """The storage does not honour conditional writes, so refs could be lost."""
