"""cas_checkpoint: checkpoints of AI agents in a content-addressed object store.

    >>> from cas_checkpoint import CheckpointStore
    >>> store = CheckpointStore.open("memory://doc")
    >>> c1 = store.save("thread-1", {"messages": ["hi"], "step": 1})
    >>> store.load("thread-1").state
    {'messages': ['hi'], 'step': 1}
"""

from .codec import TypeRegistry
from .copy import CopyReport, copy_threads
from .crypto import Key
from .diff import Change, StateDiff
from .errors import (
    CasError,
    ConflictError,
    FormatError,
    IntegrityError,
    InvalidArgumentError,
    NotFoundError,
    SerializationError,
    StorageError,
    UnsafeStorageError,
)
from .gc import GCReport
from .model import ThreadStats
from .objects import CheckpointId, ObjectId
from .part import StatePart, Unread
from .receive import BundleReport
from .repack import RepackReport
from .retention import PruneReport
from .search import Match, SearchResult
from .store import Checkpoint, CheckpointInfo, CheckpointStore, StoreStats
from .verify_report import Problem, VerifyReport

__all__ = [
    "BundleReport",
    "CasError",
    "Change",
    "Checkpoint",
    "CheckpointId",
    "CheckpointInfo",
    "CheckpointStore",
    "ConflictError",
    "CopyReport",
    "FormatError",
    "GCReport",
    "IntegrityError",
    "InvalidArgumentError",
    "Key",
    "Match",
    "NotFoundError",
    "ObjectId",
    "Problem",
    "PruneReport",
    "RepackReport",
    "SearchResult",
    "SerializationError",
    "StateDiff",
    "StatePart",
    "StorageError",
    "StoreStats",
    "ThreadStats",
    "TypeRegistry",
    "UnsafeStorageError",
    "Unread",
    "VerifyReport",
    "copy_threads",
]
__version__ = "0.2.0"
