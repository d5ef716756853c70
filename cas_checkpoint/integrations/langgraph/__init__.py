"""``CasSaver``: a LangGraph checkpointer over a cas_checkpoint store.

    from cas_checkpoint.integrations.langgraph import CasSaver
    saver = CasSaver.from_url("s3://bucket/agents")      # or CasSaver(CheckpointStore.open(...))
    graph = builder.compile(checkpointer=saver)

How LangGraph's model maps onto the store (``pip install 'cas_checkpoint[langgraph]'``):

* each ``(thread_id, checkpoint_ns)`` is a store thread named ``lg:["<thread_id>","<ns>"]``; its
  checkpoints are LangGraph's, in the order they were put. A checkpoint's state is LangGraph's
  checkpoint dict itself, so ``channel_values["messages"]`` is a list whose unchanged messages are
  shared with the checkpoint before (one more message costs about one message of storage), and a
  channel whose value did not change is the same objects. LangGraph's id, parent id and metadata
  are the record's metadata: history, ``list(filter=...)`` and ``before`` read no state.
* pending writes are entries of the same store thread, one per ``put_writes`` call (LangGraph's
  checkpoint id and the task id in their metadata, no parent), so a message a node wrote and the
  next checkpoint holds is stored once. On read, a regular
  write ``(task_id, idx)`` keeps its first value and a special one (``__error__``,
  ``__interrupt__``, ``__resume__``, ``__scheduled__``) its last, returned in ``writes_sort_key``
  order, as LangGraph's own savers do.
* values are encoded by cas_checkpoint's codec, never by pickle, and nothing is imported by a
  name read from storage: only LangChain messages and documents, LangGraph's
  ``Send``/``Command``/``Interrupt``/``Overwrite``, the codec's own safe types, the ``types=`` you
  pass, those LangGraph names through ``with_allowlist`` and the classes of the calling graph's
  own schemas (``schemas``) are ever constructed. What LangGraph's serializer stores beyond
  those is stored as it stores it (``registry.stand_in``): a node's error as its text, a str
  subclass as a str, a dataclass, pydantic model or enum of another class as its data, which
  comes back as that data (as in LangGraph's strict mode; ``unregistered="raise"`` refuses it
  instead). Any other object is a ``SerializationError`` on put.
* two processes writing one thread both land (compare-and-swap), each checkpoint with the parent
  LangGraph gave it.
* reads cost what the head holds, not the thread's length (``cursor``): each checkpoint entry
  records the greatest LangGraph id up to it, so ``get_tuple``, a put's parent lookup,
  ``list(limit=k)`` and the DeltaChannel walk read the log newest first only back to what they
  need.

Every method is one step (``cas_checkpoint.engine.steps``), run by the sync methods with blocking
calls and by the ``a``-methods on the event loop: one implementation, two faces.
"""

from __future__ import annotations

from cas_checkpoint.integrations.langgraph.keys import PREFIX
from cas_checkpoint.integrations.langgraph.registry import default_types
from cas_checkpoint.integrations.langgraph.saver import RECENT, CasSaver

__all__ = ["PREFIX", "RECENT", "CasSaver", "default_types"]
