"""Google ADK artifacts on a cas_checkpoint store (``CasArtifactService``): S3 included.

One artifact (an app, a user, a session or the user scope, a filename) is one thread; each
version is one checkpoint, numbered 0, 1, 2... as ADK expects. A version's bytes are stored as
bytes, so the store cuts a large file into content-defined chunks (FastCDC): a version with the
same bytes as an earlier version of that artifact adds no chunk, one with a few bytes changed
adds the chunks around them (the store packs per thread: another artifact with the same bytes
stores them again); a version's ``ArtifactVersion``
(number, URI, MIME type, metadata) is kept in its checkpoint's metadata, so listing versions
reads no artifact. A part is stored as the JSON data of ``Part.model_dump_json`` (its inline
bytes apart) and rebuilt with ``Part.model_validate_json``.
"""

from __future__ import annotations

import json
import time
from typing import Any, cast

from google.adk.artifacts import artifact_util
from google.adk.artifacts.base_artifact_service import (
    ArtifactVersion,
    BaseArtifactService,
    ensure_part,
)
from google.adk.errors.input_validation_error import InputValidationError
from google.genai import types
from pydantic import ValidationError
from pydantic_core import to_jsonable_python

from cas_checkpoint.aio import AsyncCheckpointStore
from cas_checkpoint.engine.model import CheckpointInfo
from cas_checkpoint.errors import ConflictError, NotFoundError
from cas_checkpoint.integrations._names import LazyStore, bad_stored, name_parts, thread_name

SESSION_SCOPE, USER_SCOPE = "adk/artifact", "adk/artifact-user"
CAS_RETRIES = 64


def _data(part: types.Part) -> dict[str, Any]:
    """A part as stored: its JSON data, inline bytes apart (kept as bytes)."""
    blob = part.inline_data.data if part.inline_data is not None else None
    if blob is not None:
        part = part.model_copy(update={"inline_data": part.inline_data.model_copy(  # type: ignore[union-attr]
            update={"data": None})})
    out = {"part": json.loads(part.model_dump_json(exclude_none=True))}
    if blob is not None:
        out["bytes"] = bytes(blob)
    return out


def _part(raw: Any, where: str) -> types.Part:
    if not isinstance(raw, dict) or not isinstance(raw.get("part"), dict):
        raise bad_stored("ADK artifact", where, "no 'part' dict")
    blob = raw.get("bytes")
    if blob is not None and not isinstance(blob, bytes):
        raise bad_stored("ADK artifact", where, "'bytes' is not bytes")
    try:
        part = types.Part.model_validate_json(json.dumps(raw["part"]))
    except (ValidationError, TypeError, ValueError) as e:
        raise bad_stored("ADK artifact", where, str(e).splitlines()[0]) from None
    if blob is not None:
        if part.inline_data is None:
            raise bad_stored("ADK artifact", where, "bytes without inline_data")
        part.inline_data.data = blob
    return part


def _version_of(info: CheckpointInfo, where: str) -> ArtifactVersion:
    meta = info.metadata.get("adk_artifact")
    try:
        return ArtifactVersion.model_validate(meta)
    except ValidationError as e:
        raise bad_stored("ADK artifact version", where, str(e).splitlines()[0]) from None


class CasArtifactService(BaseArtifactService):
    """ADK's ``BaseArtifactService`` on the store at ``store`` (a URL or an open
    ``AsyncCheckpointStore``; a URL is opened at first use with ``open_options``)."""

    def __init__(self, store: str | AsyncCheckpointStore, **open_options: Any) -> None:
        self._lazy = LazyStore(store, open_options)

    async def close(self) -> None:
        await self._lazy.aclose()

    def _thread(self, app_name: str, user_id: str, filename: str,
                session_id: str | None) -> str:
        artifact_util.validate_path_segment(app_name, "app_name")
        artifact_util.validate_path_segment(user_id, "user_id")
        if filename.startswith("user:"):
            return thread_name(USER_SCOPE, app_name, user_id, filename)
        if session_id is None:
            raise InputValidationError(
                "Session ID must be provided for session-scoped artifacts.")
        artifact_util.validate_path_segment(session_id, "session_id")
        return thread_name(SESSION_SCOPE, app_name, user_id, session_id, filename)

    async def _versions(self, name: str) -> list[CheckpointInfo]:
        """The artifact's checkpoints, version 0 first (its log: no artifact is read)."""
        store = await self._lazy.get()
        try:
            infos = await store.history(name)
        except NotFoundError:
            return []
        infos.reverse()
        for i, info in enumerate(infos):
            if _version_of(info, name).version != i:
                raise bad_stored("ADK artifact version", name, f"version {i} is missing")
        return infos

    async def save_artifact(self, *, app_name: str, user_id: str, filename: str,
                            artifact: types.Part | dict[str, Any],
                            session_id: str | None = None,
                            custom_metadata: dict[str, Any] | None = None) -> int:
        part = ensure_part(artifact)
        name = self._thread(app_name, user_id, filename, session_id)
        scoped = None if filename.startswith("user:") else session_id
        mime: str | None
        if part.inline_data is not None:
            mime = part.inline_data.mime_type
        elif part.text is not None:
            mime = "text/plain"
        elif part.file_data is not None:
            mime = part.file_data.mime_type
            if artifact_util.is_artifact_ref(part):
                parsed = artifact_util.parse_artifact_uri(cast(str, part.file_data.file_uri))
                if not parsed:
                    raise InputValidationError(
                        f"Invalid artifact reference URI: {part.file_data.file_uri}")
                artifact_util.validate_artifact_reference_scope(
                    app_name=app_name, user_id=user_id, session_id=session_id,
                    parsed_uri=parsed)
                mime = None
        else:
            raise InputValidationError("Not supported artifact type.")
        store = await self._lazy.get()
        state = _data(part)
        for _ in range(CAS_RETRIES):
            head = await store.head(name)
            version = await store.count(name) if head is not None else 0
            meta = ArtifactVersion(
                version=version, mime_type=mime, create_time=time.time(),
                canonical_uri=artifact_util.get_artifact_uri(
                    app_name=app_name, user_id=user_id, filename=filename, version=version,
                    session_id=scoped),
                custom_metadata=to_jsonable_python(custom_metadata or {}, fallback=str))
            try:
                await store.save(name, state, expected_head=head,
                                 metadata={"adk_artifact": meta.model_dump(mode="json")})
                return version
            except ConflictError:
                continue
        raise ConflictError(name, None, None)

    async def load_artifact(self, *, app_name: str, user_id: str, filename: str,
                            session_id: str | None = None,
                            version: int | None = None) -> types.Part | None:
        return await self._load(app_name, user_id, filename, session_id, version,
                                artifact_util._MAX_ARTIFACT_REFERENCE_DEPTH)

    async def _load(self, app_name: str, user_id: str, filename: str,
                    session_id: str | None, version: int | None,
                    depth: int) -> types.Part | None:
        name = self._thread(app_name, user_id, filename, session_id)
        store = await self._lazy.get()
        if version is None:
            try:
                cp = await store.load(name)
            except NotFoundError:
                return None
        else:
            infos = await self._versions(name)
            if not 0 <= version < len(infos):
                return None
            cp = await store.load(name, infos[version].id)
        part = _part(cp.state, name)
        if artifact_util.is_artifact_ref(part):
            assert part.file_data is not None
            ref = artifact_util.resolve_artifact_reference(
                file_uri=cast(str, part.file_data.file_uri), app_name=app_name,
                user_id=user_id, session_id=session_id, remaining_depth=depth)
            return await self._load(ref.app_name, ref.user_id, ref.filename, ref.session_id,
                                    ref.version, depth - 1)
        if part == types.Part() or artifact_util._is_rewind_tombstone(part):
            return None
        return part

    async def list_artifact_keys(self, *, app_name: str, user_id: str,
                                 session_id: str | None = None) -> list[str]:
        artifact_util.validate_path_segment(app_name, "app_name")
        artifact_util.validate_path_segment(user_id, "user_id")
        store = await self._lazy.get()
        names = []
        for t in await store.threads():
            user = name_parts(USER_SCOPE, t, 3)
            if user is not None and user[:2] == (app_name, user_id):
                names.append(user[2])
                continue
            own = name_parts(SESSION_SCOPE, t, 4)
            if session_id is not None and own is not None and \
                    own[:3] == (app_name, user_id, session_id):
                names.append(own[3])
        return sorted(names)

    async def delete_artifact(self, *, app_name: str, user_id: str, filename: str,
                              session_id: str | None = None) -> None:
        store = await self._lazy.get()
        try:
            await store.delete_thread(self._thread(app_name, user_id, filename, session_id))
        except NotFoundError:
            pass

    async def list_versions(self, *, app_name: str, user_id: str, filename: str,
                            session_id: str | None = None) -> list[int]:
        name = self._thread(app_name, user_id, filename, session_id)
        return list(range(len(await self._versions(name))))

    async def list_artifact_versions(self, *, app_name: str, user_id: str, filename: str,
                                     session_id: str | None = None) -> list[ArtifactVersion]:
        name = self._thread(app_name, user_id, filename, session_id)
        return [_version_of(i, name) for i in await self._versions(name)]

    async def get_artifact_version(self, *, app_name: str, user_id: str, filename: str,
                                   session_id: str | None = None,
                                   version: int | None = None) -> ArtifactVersion | None:
        name = self._thread(app_name, user_id, filename, session_id)
        infos = await self._versions(name)
        if not infos:
            return None
        if version is None:
            return _version_of(infos[-1], name)
        return _version_of(infos[version], name) if 0 <= version < len(infos) else None
