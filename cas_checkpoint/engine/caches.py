"""What a store object remembers between its operations (states, heads, known ids), so that
it does not read, hash or decode again what it just wrote or checked.
Rule: keyed by content or by the objects it was checked against, so nothing goes stale."""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from typing import Any

from cas_checkpoint.engine.object_store import View
from cas_checkpoint.engine.process_caches import Shared
from cas_checkpoint.engine.refs import Ref
from cas_checkpoint.format import codec
from cas_checkpoint.format.codec import TypeRegistry
from cas_checkpoint.format.heads import Head
from cas_checkpoint.format.objects import ObjectId, Record

STATE_CACHE_BYTES = 64 * 1024 * 1024  # encodings of recently saved states, for warm loads
THREAD_STATES = 64  # a thread's newest states whose encodings are kept, at most (see state)
STATE_THREADS = 64  # threads whose newest states are kept (the threads used last)
THREAD_SLACK = 64 * 1024  # bytes of small states a thread keeps beyond two of its biggest
THREADS_KEPT = 1024  # threads whose newest head and record (and last ref) are remembered
KNOWN_IDS = 8192  # ids a thread's Known holds before they become its older generation
KNOWN_THREADS = 256  # threads whose Known is kept (each holds about its state's node ids)
VIEWS_KEPT = 64  # threads whose loaded view (its packs' bytes) a ``Known`` keeps (see shed)


class Known:
    """Ids of the objects this process saw in a head of one lineage (so a save may skip writing
    them): those of a view it loaded (those the load hashed, and each other one a save asks
    about, hashed then), plus the nodes of each state it saved since and what it wrote.

    Bounded by what a save asks about, not by the thread's length: past ``KNOWN_IDS`` ids
    the set becomes ``older`` and a new one starts (``add``); each save adds every node of
    its state, so the nodes of the newest states stay known, and only ids no save asked
    about for two generations are forgotten (a save that meets one again writes it again,
    never less than it must)."""

    __slots__ = ("ids", "lineage", "older", "view")

    def __init__(self, lineage: bytes, view: View | None = None) -> None:
        self.lineage, self.view, self.ids = lineage, view, set[str]()
        self.older: set[str] = set()

    def missing(self, nodes: dict[ObjectId, bytes]) -> dict[ObjectId, bytes]:
        rest = nodes.keys() - self.ids  # (a save's nodes are mostly known: a small set)
        older = self.older
        if rest and older:
            rest = rest - older
        view = self.view  # (``shed`` may drop it meanwhile, from another thread)
        if rest and view is not None:
            rest = view.lacks(rest)
        return {k: nodes[k] for k in rest}

    def add(self, *groups: Iterable[str]) -> None:
        """These ids are held by the lineage's head now (a save's: its state's nodes, and what
        it wrote)."""
        ids = self.ids
        for group in groups:
            ids.update(group)
        if len(ids) > KNOWN_IDS:  # (new sets: a save reading the old ones is not disturbed)
            self.older, self.ids = ids, set()

    def shed(self) -> None:
        """Let go of the view (the bytes of the thread's packs), keeping as known the ids
        its head holds that were checked already (its inline objects and what a load or a
        save hashed in its packs): a later save still skips the state it loaded, and writes
        again anything else (never less than it must)."""
        view = self.view
        if view is None:
            return
        try:
            held = set(view.inline).union(*(p.verified for p in view.packs))
        except RuntimeError:  # (a set another thread's read grew meanwhile: keep nothing)
            held = set()
        self.ids = self.ids | held  # a new set: a save reading the old one is not disturbed
        self.view = None


class Threads:
    """Per thread, the ref a store object last wrote or loaded (``refs``) and what its
    lineage is known to hold (``have``), for at most ``THREADS_KEPT`` threads (``have``:
    ``KNOWN_THREADS``), the least recently used forgotten first; only the newest ``VIEWS_KEPT``
    keep their loaded view, the others are ``shed``. Forgetting costs a later save of that
    thread reading its ref, or writing its state's objects again (merges keep one copy), never
    correctness."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.refs: OrderedDict[str, Ref] = OrderedDict()
        self.have: OrderedDict[str, Known] = OrderedDict()
        self._viewed: OrderedDict[str, Known] = OrderedDict()

    def remember(self, thread_id: str, ref: Ref, have: Known) -> None:
        with self._lock:
            self.refs[thread_id] = ref
            self.refs.move_to_end(thread_id)
            self.have[thread_id] = have
            self.have.move_to_end(thread_id)
            if have.view is not None:
                self._viewed[thread_id] = have
                self._viewed.move_to_end(thread_id)
            else:  # (a Known replaced by one without a view: the old one is not kept alive)
                self._viewed.pop(thread_id, None)
            while len(self.refs) > THREADS_KEPT:
                self.refs.popitem(last=False)
            while len(self.have) > min(KNOWN_THREADS, THREADS_KEPT):
                self._viewed.pop(self.have.popitem(last=False)[0], None)
            while len(self._viewed) > VIEWS_KEPT:
                self._viewed.popitem(last=False)[1].shed()

    def forget(self, thread_id: str, ref_only: bool = False) -> None:
        with self._lock:
            self.refs.pop(thread_id, None)
            if not ref_only:
                self.have.pop(thread_id, None)
                self._viewed.pop(thread_id, None)


class Remembered:
    """A store object's bounded memories for warm loads, safe to use from several threads."""

    def __init__(self, shared: Shared | None) -> None:
        self.shared = shared  # the other store objects of this memory:// store, or None
        self._lock = threading.Lock()
        self._states: OrderedDict[str, bytes] = OrderedDict()
        self._states_bytes = 0
        self._recent: OrderedDict[str, deque[tuple[str, int]]] = OrderedDict()  # per thread,
        self._uses: dict[str, int] = {}  # its newest states (root, bytes); threads using a root
        self._newest: dict[str, tuple[Head, Record]] = {}

    def state(self, thread_id: str, root: str, data: bytes,
              nodes: Mapping[ObjectId, bytes] | None = None) -> None:
        """Keep the encoding of a state of ``thread_id`` by its root id, so a later load of it
        decodes it in one pass; with ``nodes`` (a save's: every node of the state), for the
        other store objects of a memory:// store too.

        What a thread's next operations read is its newest states: the newest checkpoint's
        and what was saved after it (LangGraph: the pending writes of the next step). So a
        thread keeps only its newest ``THREAD_STATES`` encodings, and of those, from the newest
        back, only while they add up to at most twice the biggest of them and
        ``THREAD_SLACK``: two big states and the small ones between them, not the last 64 MB
        of a long thread's saves (each a whole state that grows with the thread)."""
        if len(data) > STATE_CACHE_BYTES // 4:
            return
        if nodes is not None and self.shared is not None:
            self.shared.keep_state(root, data, frozenset(nodes))
        with self._lock:
            if root not in self._states:
                self._states_bytes += len(data)
            self._states[root] = data
            self._states.move_to_end(root)
            recent = self._recent.pop(thread_id, None) or deque()
            self._recent[thread_id] = recent  # (the most recently used thread last)
            recent.append((root, len(data)))
            self._uses[root] = self._uses.get(root, 0) + 1
            total = biggest = i = 0  # (plain statements: a save walks ~16 of them)
            for _, size in reversed(recent):
                total += size
                if size > biggest:
                    biggest = size
                if i >= THREAD_STATES or total > 2 * biggest + THREAD_SLACK:
                    for _ in range(len(recent) - i):
                        self._release(recent.popleft()[0])
                    break
                i += 1
            while len(self._recent) > min(STATE_THREADS, THREADS_KEPT):
                for old, _ in self._recent.popitem(last=False)[1]:
                    self._release(old)
            while self._states_bytes > STATE_CACHE_BYTES:
                self._states_bytes -= len(self._states.popitem(last=False)[1])

    def _release(self, root: str) -> None:
        """One use of ``root`` by a thread's newest states is gone: drop its encoding when
        it was the last one (under the lock)."""
        uses = self._uses.get(root, 0) - 1
        if uses > 0:
            self._uses[root] = uses
            return
        self._uses.pop(root, None)
        data = self._states.pop(root, None)
        if data is not None:
            self._states_bytes -= len(data)
        if self.shared is not None:  # (nor kept for the other store objects of memory://)
            self.shared.drop_state(root)

    def held(self) -> int:
        """Bytes of state encodings kept now."""
        return self._states_bytes

    def loaded(self, thread_id: str, root: str, size: int, state: Any, types: TypeRegistry
               ) -> None:
        """Keep the encoding of a head's state just joined from verified nodes, encoded again
        (before the caller can change it), so that the next load of that head is warm. It is
        this store object's own (never shared: other store objects take only encodings a save
        made); a state whose encoding is not exactly the ``size`` its record gives (a
        registered class whose round trip changes it) is not kept. (A warm load decodes what
        a registered class's ``to_data`` gives of what its ``from_data`` made, as after a
        save: a class whose round trip is not the same the second time would differ; one
        that keeps its size is not caught. Built-in types round-trip exactly.)"""
        if size > STATE_CACHE_BYTES // 4:
            return
        try:
            data = codec.encode(state, types=types)
        except Exception:  # (a registered class's to_data that fails: the load is not the
            return  # worse for it, the next one joins the state again)
        if len(data) == size:
            self.state(thread_id, root, data)

    def encoding(self, root: str, view: View) -> bytes | None:
        """The encoding of the state ``root`` of a checkpoint ``view`` holds: one this store
        object saved, or one another store object of this memory:// store saved, once the view
        is seen to hold each of its nodes (``View.check`` raises for a missing or damaged one)."""
        with self._lock:
            data = self._states.get(root)
        if data is None and self.shared is not None:
            got = self.shared.state(root)
            if got is not None:
                view.check(got[1])
                data = got[0]
                self.state(view.head.thread_id, root, data)
        return data

    def newest(self, thread_id: str, head: Head, record: Record) -> None:
        """``head`` is the one this store object saved, or loaded with every check, and
        ``record`` the record of its head checkpoint."""
        with self._lock:
            if len(self._newest) >= THREADS_KEPT and thread_id not in self._newest:
                self._newest.clear()
            self._newest[thread_id] = (head, record)

    def warm(self, thread_id: str, head: Head) -> tuple[Record, bytes] | None:
        """The record and state encoding of ``head``'s newest checkpoint, when ``head`` is the
        very head object remembered for the thread and the encoding is remembered; else None."""
        with self._lock:
            got = self._newest.get(thread_id)
            if got is None or got[0] is not head:
                return None
            data = self._states.get(got[1].root)
            if data is not None:
                self._states.move_to_end(got[1].root)
        return None if data is None else (got[1], data)

    def forget(self, thread_id: str) -> None:
        with self._lock:
            self._newest.pop(thread_id, None)
            for root, _ in self._recent.pop(thread_id, ()):
                self._release(root)
