"""cas_checkpoint: checkpoints of AI agents in a content-addressed object store.

    >>> from cas_checkpoint import CheckpointStore
    >>> store = CheckpointStore.open("memory://doc")
    >>> c1 = store.save("thread-1", {"messages": ["hi"], "step": 1})
    >>> store.load("thread-1").state
    {'messages': ['hi'], 'step': 1}
"""

from cas_checkpoint.aio import AsyncCheckpointStore
from cas_checkpoint.engine.model import ThreadStats
from cas_checkpoint.engine.retention import PruneReport
from cas_checkpoint.errors import (
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
from cas_checkpoint.format.codec import TypeRegistry
from cas_checkpoint.format.objects import CheckpointId, ObjectId
from cas_checkpoint.format.sealing import Key
from cas_checkpoint.maintenance.expire import ExpireReport
from cas_checkpoint.maintenance.gc import GCReport
from cas_checkpoint.maintenance.repack import RepackReport
from cas_checkpoint.maintenance.verify_report import Problem, VerifyReport
from cas_checkpoint.query.diff import Change, StateDiff
from cas_checkpoint.query.part import StatePart, Unread
from cas_checkpoint.query.search import Match, SearchResult
from cas_checkpoint.store import (
    Checkpoint,
    CheckpointInfo,
    CheckpointStore,
    StoreStats,
    copy_threads,
)
from cas_checkpoint.transfer.copy import CopyReport
from cas_checkpoint.transfer.receive import BundleReport

__all__ = [
    "AsyncCheckpointStore",
    "BundleReport",
    "CasError",
    "Change",
    "Checkpoint",
    "CheckpointId",
    "CheckpointInfo",
    "CheckpointStore",
    "ConflictError",
    "CopyReport",
    "ExpireReport",
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
