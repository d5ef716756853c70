"""cas_checkpoint: checkpoints of AI agents in a content-addressed object store.

    >>> from cas_checkpoint import CheckpointStore
    >>> store = CheckpointStore.open("memory://doc")
    >>> c1 = store.save("thread-1", {"messages": ["hi"], "step": 1})
    >>> store.load("thread-1").state
    {'messages': ['hi'], 'step': 1}
"""

from .codec import TypeRegistry
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
from .objects import CheckpointId, ObjectId
from .repack import RepackReport
from .retention import PruneReport
from .store import Checkpoint, CheckpointInfo, CheckpointStore, StoreStats
from .verify_report import Problem, VerifyReport

__all__ = [
    "CasError",
    "Checkpoint",
    "CheckpointId",
    "CheckpointInfo",
    "CheckpointStore",
    "ConflictError",
    "FormatError",
    "GCReport",
    "IntegrityError",
    "InvalidArgumentError",
    "NotFoundError",
    "ObjectId",
    "Problem",
    "PruneReport",
    "RepackReport",
    "SerializationError",
    "StorageError",
    "StoreStats",
    "TypeRegistry",
    "UnsafeStorageError",
    "VerifyReport",
]
__version__ = "0.2.0"
