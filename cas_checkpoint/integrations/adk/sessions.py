"""Google ADK sessions on a cas_checkpoint store (``CasSessionService``).

One ADK session is one thread, ``adk/session/<app>/<user>/<session id>``, whose state is
``{"state": {...}, "events": [...], "last_update_time": t}``; every ``append_event`` saves one
checkpoint. The events list is split into shared nodes by the store, so a checkpoint costs
about the new event, not the whole session. ``app:`` and ``user:`` state live in their own
threads (``adk/app/<app>``, ``adk/user/<app>/<user>``), merged into sessions as ADK's own
services do.

A session object remembers the checkpoint it was read at (ADK's ``_storage_update_marker``);
an ``append_event`` on a session whose thread has moved since raises ADK's
``StaleSessionError``, and two writers racing are told apart by the store's compare-and-swap.
``fork_session`` and ``rewind_session`` move refs only: no event is copied.

Events are stored as the JSON data of ``Event.model_dump_json`` and rebuilt with
``Event.model_validate_json``; stored data that is not a session gives a ``FormatError``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from typing import Any

from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session
from google.adk.sessions.state import State
from pydantic import ValidationError
from pydantic_core import to_jsonable_python

from cas_checkpoint.aio import AsyncCheckpointStore
from cas_checkpoint.errors import ConflictError, NotFoundError
from cas_checkpoint.format.objects import CheckpointId
from cas_checkpoint.integrations._names import LazyStore, bad_stored, name_parts, thread_name

SESSION, APP, USER = "adk/session", "adk/app", "adk/user"
CAS_RETRIES = 64  # shared app/user state: attempts of a read-merge-save before giving up


def _json_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """State values as JSON data (as ADK's SQL services store them; what is not JSON-able,
    a callable say, becomes its str)."""
    out = to_jsonable_python(dict(state), fallback=str)
    assert isinstance(out, dict)
    return out


def _split(delta: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    app: dict[str, Any] = {}
    user: dict[str, Any] = {}
    own: dict[str, Any] = {}
    for key, value in delta.items():
        if key.startswith(State.APP_PREFIX):
            app[key.removeprefix(State.APP_PREFIX)] = value
        elif key.startswith(State.USER_PREFIX):
            user[key.removeprefix(State.USER_PREFIX)] = value
        elif not key.startswith(State.TEMP_PREFIX):
            own[key] = value
    return app, user, own


def _stored(raw: Any, where: str) -> dict[str, Any]:
    """A stored session's data, checked for shape (not yet its events)."""
    if not isinstance(raw, dict):
        raise bad_stored("ADK session", where, f"a {type(raw).__name__}, not a dict")
    state, events, t = raw.get("state"), raw.get("events"), raw.get("last_update_time")
    if not isinstance(state, dict) or not isinstance(events, list):
        raise bad_stored("ADK session", where, "no 'state' dict or no 'events' list")
    if not isinstance(t, int | float) or isinstance(t, bool):
        raise bad_stored("ADK session", where, "'last_update_time' is not a number")
    return raw


def _event(data: Any, where: str) -> Event:
    if not isinstance(data, dict):
        raise bad_stored("ADK event", where, f"a {type(data).__name__}, not a dict")
    try:
        return Event.model_validate_json(json.dumps(data))
    except (ValidationError, TypeError, ValueError) as e:
        raise bad_stored("ADK event", where, str(e).splitlines()[0]) from None


def _event_data(event: Event) -> dict[str, Any]:
    out = json.loads(event.model_dump_json(exclude_none=True))
    assert isinstance(out, dict)
    return out


class CasSessionService(BaseSessionService):
    """ADK's ``BaseSessionService`` on the store at ``store`` (a URL such as ``./sessions``,
    ``memory://name`` or ``s3://bucket/prefix``, or an open ``AsyncCheckpointStore``).

    A URL is opened at the first call, inside the running event loop, with ``open_options``
    (the keyword arguments of ``AsyncCheckpointStore.open``); ``await service.close()``
    closes a store it opened."""

    def __init__(self, store: str | AsyncCheckpointStore, **open_options: Any) -> None:
        self._lazy = LazyStore(store, open_options)

    async def close(self) -> None:
        await self._lazy.aclose()

    # --- helpers ---

    async def _scoped(self, name: str) -> dict[str, Any]:
        store = await self._lazy.get()
        try:
            raw = (await store.load(name)).state
        except NotFoundError:
            return {}
        if not isinstance(raw, dict) or not isinstance(raw.get("state"), dict):
            raise bad_stored("ADK app/user state", name, "no 'state' dict")
        return dict(raw["state"])

    async def _update_scoped(self, name: str, delta: Mapping[str, Any]) -> None:
        """Merge ``delta`` into a shared state thread by compare-and-swap (retried: other
        sessions of the same app or user may write it at the same time)."""
        store = await self._lazy.get()
        for _ in range(CAS_RETRIES):
            head = await store.head(name)
            current = await self._scoped(name) if head is not None else {}
            current.update(_json_state(delta))
            try:
                await store.save(name, {"state": current}, expected_head=head)
                return
            except ConflictError:
                continue
        raise StaleSessionError(
            f"the shared state thread {name!r} kept moving under {CAS_RETRIES} attempts to "
            "update it; retry append_event"
        )

    async def _merge(self, session: Session) -> Session:
        app = await self._scoped(thread_name(APP, session.app_name))
        user = await self._scoped(thread_name(USER, session.app_name, session.user_id))
        for key, value in app.items():
            session.state[State.APP_PREFIX + key] = value
        for key, value in user.items():
            session.state[State.USER_PREFIX + key] = value
        return session

    def _session(self, app_name: str, user_id: str, session_id: str, raw: dict[str, Any],
                 where: str, events: list[Event], marker: CheckpointId) -> Session:
        session = Session(id=session_id, app_name=app_name, user_id=user_id,
                          state=dict(raw["state"]), events=events,
                          last_update_time=float(raw["last_update_time"]))
        session._storage_update_marker = marker
        return session

    # --- BaseSessionService ---

    async def create_session(self, *, app_name: str, user_id: str,
                             state: dict[str, Any] | None = None,
                             session_id: str | None = None) -> Session:
        store = await self._lazy.get()
        session_id = (session_id.strip() if session_id else None) or str(uuid.uuid4())
        app, user, own = _split(state or {})
        name = thread_name(SESSION, app_name, user_id, session_id)
        raw = {"state": _json_state(own), "events": [], "last_update_time": time.time()}
        try:
            info = await store.save(name, raw, expected_head=None, kind="manual")
        except ConflictError:
            raise AlreadyExistsError(f"Session with id {session_id} already exists.") from None
        if app:
            await self._update_scoped(thread_name(APP, app_name), app)
        if user:
            await self._update_scoped(thread_name(USER, app_name, user_id), user)
        session = self._session(app_name, user_id, session_id, raw, name, [], info.id)
        return await self._merge(session)

    async def get_session(self, *, app_name: str, user_id: str, session_id: str,
                          config: GetSessionConfig | None = None) -> Session | None:
        store = await self._lazy.get()
        name = thread_name(SESSION, app_name, user_id, session_id.strip())
        try:
            cp = await store.load(name)
        except NotFoundError:
            return None
        raw = _stored(cp.state, name)
        stored = raw["events"]
        if config is not None and config.num_recent_events is not None:
            stored = stored[len(stored) - config.num_recent_events:] \
                if config.num_recent_events else []
        events = [_event(e, name) for e in stored]
        if config is not None and config.after_timestamp is not None:
            i = len(events)
            while i > 0 and events[i - 1].timestamp >= config.after_timestamp:
                i -= 1
            events = events[i:]
        session = self._session(app_name, user_id, session_id.strip(), raw, name, events, cp.id)
        return await self._merge(session)

    async def list_sessions(self, *, app_name: str,
                            user_id: str | None = None) -> ListSessionsResponse:
        """Sessions of an app (and user), without events, oldest update first. This lists the
        store's threads and reads each session's head: it costs one read a session."""
        store = await self._lazy.get()
        found: list[Session] = []
        for name in await store.threads():
            parts = name_parts(SESSION, name, 3)
            if parts is None or parts[0] != app_name or (user_id is not None
                                                         and parts[1] != user_id):
                continue
            try:
                cp = await store.load(name)
            except NotFoundError:  # deleted meanwhile
                continue
            raw = _stored(cp.state, name)
            session = self._session(parts[0], parts[1], parts[2], raw, name, [], cp.id)
            found.append(await self._merge(session))
        found.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=found)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        store = await self._lazy.get()
        name = thread_name(SESSION, app_name, user_id, session_id.strip())
        try:
            await store.delete_thread(name)
        except NotFoundError:
            pass

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        return await self._scoped(thread_name(USER, app_name, user_id))

    async def append_event(self, session: Session, event: Event) -> Event:
        if event.partial:
            return event
        store = await self._lazy.get()
        name = thread_name(SESSION, session.app_name, session.user_id, session.id)
        try:
            cp = await store.load(name)
        except NotFoundError:
            raise SessionNotFoundError(f"Session {session.id} not found.") from None
        raw = _stored(cp.state, name)
        marker = session._storage_update_marker
        if (marker is not None and marker != cp.id) or (
                marker is None and raw["last_update_time"] > session.last_update_time):
            if any(isinstance(e, dict) and e.get("id") == event.id and _event(e, name) == event
                   for e in raw["events"][-8:]):
                return event  # an equal re-delivery of an event already stored
            raise StaleSessionError(
                f"session {session.id!r} changed in the store since this Session object was "
                "read; get_session() it again and append to that"
            )
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        app, user, own = _split(event.actions.state_delta if event.actions else {})
        new = {"state": {**raw["state"], **_json_state(own)},
               "events": [*raw["events"], _event_data(event)],
               "last_update_time": event.timestamp}
        try:
            info = await store.save(name, new, expected_head=cp.id,
                                    metadata={"event_id": event.id})
        except ConflictError:
            raise StaleSessionError(
                f"another writer appended to session {session.id!r} at the same time; "
                "get_session() it again and append to that"
            ) from None
        if app:
            await self._update_scoped(thread_name(APP, session.app_name), app)
        if user:
            await self._update_scoped(thread_name(USER, session.app_name, session.user_id),
                                      user)
        session._storage_update_marker = info.id
        session.last_update_time = event.timestamp
        return self._commit_event_to_session(session, event)

    # --- beyond ADK's interface: O(1) branches ---

    async def _at_event(self, name: str, event_id: str | None) -> CheckpointId:
        store = await self._lazy.get()
        if event_id is None:
            head = await store.head(name)
            if head is None:
                raise SessionNotFoundError(f"Session thread {name!r} not found.")
            return head
        found = await store.find(name, metadata={"event_id": event_id})
        if not found:
            raise SessionNotFoundError(
                f"no event {event_id!r} in session thread {name!r}; pass an event id of that "
                "session (session.events[i].id)"
            )
        return found[0].id

    async def fork_session(self, *, app_name: str, user_id: str, session_id: str,
                           new_session_id: str | None = None, at_event_id: str | None = None,
                           new_user_id: str | None = None) -> Session:
        """A new session whose events are those of ``session_id`` up to and including
        ``at_event_id`` (all of them when None), sharing them: only a ref is written."""
        store = await self._lazy.get()
        name = thread_name(SESSION, app_name, user_id, session_id)
        at = await self._at_event(name, at_event_id)
        new_id = new_session_id or str(uuid.uuid4())
        new_user = new_user_id or user_id
        new_name = thread_name(SESSION, app_name, new_user, new_id)
        if await store.head(new_name) is not None:
            raise AlreadyExistsError(f"Session with id {new_id} already exists.")
        await store.fork(name, at, new_name)
        got = await self.get_session(app_name=app_name, user_id=new_user, session_id=new_id)
        assert got is not None
        return got

    async def rewind_session(self, *, app_name: str, user_id: str, session_id: str,
                             to_event_id: str) -> Session:
        """Move the session back to just after event ``to_event_id`` (a ref move: later
        events leave the session; ``fork_session`` first keeps them on a branch). ADK's own
        ``Runner.rewind_async`` instead appends a rewind event and works on this service too."""
        store = await self._lazy.get()
        name = thread_name(SESSION, app_name, user_id, session_id)
        at = await self._at_event(name, to_event_id)
        await store.rewind(name, at)
        got = await self.get_session(app_name=app_name, user_id=user_id, session_id=session_id)
        assert got is not None
        return got
