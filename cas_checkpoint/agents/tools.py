"""Tools for LLM function calling: let an agent list, create, restore and search its own
checkpoints. Every tool only reads or adds (nothing a model calls can destroy history):
``restore_checkpoint`` saves a new head whose state is the earlier checkpoint's, its parent the
current head, so the attempt it abandons stays in the thread's history; a rewind, delete or
prune stays an operator's action (the store's API, the command line). ``openai_tools()`` and
``anthropic_tools()`` give the definitions (JSON Schema) in each API's shape; ``dispatch(store,
thread_id, name, arguments)`` runs a call the model made (``adispatch`` for an
``AsyncCheckpointStore``) and returns a JSON-ready dict.

The model's arguments are untrusted input. They are checked before the store is touched: a JSON
text of at most ``MAX_ARGUMENTS_CHARS`` characters (or a dict) holding one object, no unknown or
repeated keys, each value of its type (a bool is not an integer), integers in range, strings
within their lengths, ids of 64 lowercase hex digits. A bad call raises
``InvalidArgumentError`` whose message tells the model what to send instead: return
``str(exc)`` to the model as the tool's (error) result. The thread is the one the host passes,
never one the model names: an agent reaches only its own checkpoints. Regular expressions are
not offered to the model (a pattern can take exponential time to match).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cas_checkpoint.engine.model import CheckpointInfo
from cas_checkpoint.errors import CasError, InvalidArgumentError, NotFoundError
from cas_checkpoint.format.objects import KINDS, STATUSES, bad_text

__all__ = ["MAX_ARGUMENTS_CHARS", "TOOL_NAMES", "adispatch", "anthropic_tools", "dispatch",
           "openai_tools", "tool_definitions"]

MAX_ARGUMENTS_CHARS = 16 * 1024
_ID = "^[0-9a-f]{64}$"
_ID_LIMITS: dict[str, Any] = {"pattern": _ID, "min_length": 64, "max_length": 64}


@dataclass(frozen=True, slots=True)
class _Param:
    name: str
    type: str  # "string", "integer", "boolean"
    description: str
    required: bool = False
    enum: tuple[str, ...] = ()
    minimum: int = 0
    maximum: int = 0
    min_length: int = 0
    max_length: int = 0
    pattern: str = ""
    default: Any = None

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "description": self.description}
        if self.enum:
            out["enum"] = list(self.enum)
        if self.type == "integer":
            out["minimum"], out["maximum"] = self.minimum, self.maximum
        if self.type == "string" and not self.enum:
            out["minLength"], out["maxLength"] = self.min_length, self.max_length
        if self.pattern:
            out["pattern"] = self.pattern
        if self.default is not None:
            out["default"] = self.default
        return out

    def check(self, tool: str, value: object) -> Any:
        where = f"{tool}: argument {self.name!r}"
        if self.type == "boolean":
            if not isinstance(value, bool):
                raise InvalidArgumentError(f"{where} must be true or false, not {_show(value)}")
        elif self.type == "integer":
            if (not isinstance(value, int) or isinstance(value, bool)
                    or not self.minimum <= value <= self.maximum):
                raise InvalidArgumentError(f"{where} must be an integer from {self.minimum} to "
                                           f"{self.maximum}, not {_show(value)}")
        elif not isinstance(value, str):
            raise InvalidArgumentError(f"{where} must be a string, not {_show(value)}")
        elif self.enum and value not in self.enum:
            raise InvalidArgumentError(f"{where} must be one of {', '.join(self.enum)}, not "
                                       f"{_show(value)}")
        elif self.pattern == _ID and not (len(value) == 64 and value.isascii()
                                          and all(c in "0123456789abcdef" for c in value)):
            raise InvalidArgumentError(f"{where} must be a checkpoint id (64 lowercase hex "
                                       f"digits, as list_checkpoints returns), not "
                                       f"{_show(value)}")
        elif not self.enum and not self.min_length <= len(value) <= self.max_length:
            raise InvalidArgumentError(f"{where} must be {self.min_length} to "
                                       f"{self.max_length} characters long, not {len(value)}")
        elif (problem := bad_text(value)) is not None:  # JSON's "\ud800" escape
            raise InvalidArgumentError(f"{where} {problem}; send text without unpaired "
                                       "\\ud800-\\udfff escapes")
        return value


@dataclass(frozen=True, slots=True)
class _Tool:
    name: str
    description: str
    params: tuple[_Param, ...]

    def schema(self) -> dict[str, Any]:
        return {"type": "object",
                "properties": {p.name: p.schema() for p in self.params},
                "required": [p.name for p in self.params if p.required],
                "additionalProperties": False}


_TOOLS = (
    _Tool("list_checkpoints",
          "List the checkpoints of this conversation, newest first: id, step, time, label, "
          "status and kind of each. Use the ids with restore_checkpoint.",
          (_Param("limit", "integer", "How many to return.", minimum=1, maximum=100,
                  default=10),
           _Param("kind", "string", "Only checkpoints of this kind.", enum=KINDS),
           _Param("status", "string", "Only checkpoints with this status.", enum=STATUSES),
           _Param("before", "string", "Start after this checkpoint id (to page back).",
                  **_ID_LIMITS))),
    _Tool("create_checkpoint",
          "Save a checkpoint of the current state now, e.g. before a risky step, so that it "
          "can be restored later.",
          (_Param("label", "string", "A short name for the checkpoint.", min_length=1,
                  max_length=200),
           _Param("note", "string", "Why it is made; stored with it.", min_length=1,
                  max_length=2000))),
    _Tool("restore_checkpoint",
          "Go back to an earlier checkpoint: a new checkpoint is saved with its state, which "
          "becomes the current state. Nothing is deleted: the checkpoints made since stay in "
          "the history (list_checkpoints, search_checkpoints still find them).",
          (_Param("checkpoint_id", "string", "The id of the checkpoint, from list_checkpoints.",
                  required=True, **_ID_LIMITS),)),
    _Tool("search_checkpoints",
          "Find text in this conversation's saved states (case-insensitive substring): where "
          "it occurs and a snippet around it.",
          (_Param("query", "string", "The text to look for.", required=True, min_length=1,
                  max_length=200),
           _Param("all_history", "boolean", "Search every checkpoint, not just the latest.",
                  default=False),
           _Param("limit", "integer", "Most matches to return.", minimum=1, maximum=50,
                  default=10))),
)
_BY_NAME = {t.name: t for t in _TOOLS}
TOOL_NAMES = tuple(_BY_NAME)


def tool_definitions() -> list[dict[str, Any]]:
    """Each tool as ``{"name", "description", "parameters"}`` (a JSON Schema object)."""
    return [{"name": t.name, "description": t.description, "parameters": t.schema()}
            for t in _TOOLS]


def openai_tools() -> list[dict[str, Any]]:
    """The tools in OpenAI's shape: ``{"type": "function", "function": {...}}``."""
    return [{"type": "function", "function": d} for d in tool_definitions()]


def anthropic_tools() -> list[dict[str, Any]]:
    """The tools in Anthropic's shape: ``{"name", "description", "input_schema"}``."""
    return [{"name": d["name"], "description": d["description"],
             "input_schema": copy.deepcopy(d["parameters"])} for d in tool_definitions()]


def _show(value: object) -> str:
    """A short, cheap description of an untrusted value (never its whole repr)."""
    if isinstance(value, str | bytes | bytearray):
        return repr(value) if len(value) <= 60 else (
            f"a {type(value).__name__} of {len(value)} characters")
    if isinstance(value, bool | float) or value is None:
        return repr(value)
    if isinstance(value, int):
        return repr(value) if value.bit_length() <= 64 else (
            f"an integer of {value.bit_length()} bits")
    if isinstance(value, list | tuple | dict | set):
        return f"a {'JSON object' if isinstance(value, dict) else 'list'} of {len(value)} items"
    return f"a {type(value).__name__}"


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise InvalidArgumentError(f"the arguments name {_show(key)} twice; send each once")
        out[key] = value
    return out


def parse_call(name: object, arguments: object) -> tuple[str, dict[str, Any]]:
    """The tool and its checked arguments (defaults filled in), or InvalidArgumentError."""
    if not isinstance(name, str) or name not in _BY_NAME:
        raise InvalidArgumentError(f"there is no tool {_show(name)}; the tools are "
                                   f"{', '.join(TOOL_NAMES)}")
    tool = _BY_NAME[name]
    if arguments is None:
        arguments = {}
    elif isinstance(arguments, str | bytes | bytearray):
        if len(arguments) > MAX_ARGUMENTS_CHARS:
            raise InvalidArgumentError(f"{name}: the arguments are {len(arguments)} characters "
                                       f"long, more than {MAX_ARGUMENTS_CHARS}; send only the "
                                       "documented arguments")
        try:
            arguments = json.loads(arguments, object_pairs_hook=_no_repeats,
                                   parse_constant=_refuse_constant)
        except (ValueError, RecursionError) as exc:
            if isinstance(exc, InvalidArgumentError):
                raise
            raise InvalidArgumentError(f"{name}: the arguments are not valid JSON ({exc}); "
                                       "send a JSON object such as {}") from None
    if not isinstance(arguments, Mapping):
        raise InvalidArgumentError(f"{name}: the arguments must be a JSON object, not "
                                   f"{_show(arguments)}")
    params = {p.name: p for p in tool.params}
    unknown = [k for k in arguments if k not in params]
    if unknown:
        raise InvalidArgumentError(f"{name}: unknown argument {_show(unknown[0])}; it takes "
                                   f"{', '.join(params) or 'no arguments'}")
    out: dict[str, Any] = {}
    for p in tool.params:
        value = arguments.get(p.name)
        if value is None:  # absent, or null for an optional argument
            if p.required:
                raise InvalidArgumentError(f"{name}: argument {p.name!r} is required "
                                           f"({p.description})")
            out[p.name] = p.default
        else:
            out[p.name] = p.check(name, value)
    return name, out


def _refuse_constant(text: str) -> Any:
    raise InvalidArgumentError(f"the arguments hold {text}, which is not JSON; send numbers "
                               "as digits")


def _time(value: datetime) -> str:
    return value.isoformat()


def _summary(info: CheckpointInfo) -> dict[str, Any]:
    note = info.metadata.get("note")
    return {"id": info.id, "step": info.step, "created_at": _time(info.created_at),
            "label": info.label, "status": info.status, "kind": info.kind,
            "reason": info.reason, "note": note if isinstance(note, str) else None}


def _not_here(cid: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"checkpoint {cid} is not in this conversation's history; call "
                                "list_checkpoints for the ids there are")


def _search_result(result: Any, limit: int) -> dict[str, Any]:
    matches = [{"checkpoint_id": m.checkpoint_id, "path": m.path, "snippet": m.snippet}
               for m in list(result.matches)[:limit]]
    return {"matches": matches, "count": len(matches)}


def _searcher(store: Any) -> Any:
    search = getattr(store, "search", None)
    if search is None:
        raise CasError("this store has no search(): search_checkpoints needs cas_checkpoint "
                       "with content search; leave the tool out of the model's tool list")
    return search


_NO_STATE: Any = object()


def dispatch(store: Any, thread_id: str, name: str, arguments: object, *,
             state: Any = _NO_STATE) -> dict[str, Any]:
    """Run the tool call ``name(arguments)`` of a model on ``thread_id`` of ``store`` (a
    ``CheckpointStore``) and return a JSON-ready result. ``arguments`` is the model's JSON text
    or dict. ``create_checkpoint`` saves ``state`` if given, else the thread's current state
    again (a new checkpoint; content addressing stores nothing twice). ``restore_checkpoint``
    saves the earlier checkpoint's state as a new head (kind ``manual``, metadata
    ``{"restored_from": id}``; nothing leaves the history); the host must then reload the
    state (``store.load(thread_id)``).
    Raises InvalidArgumentError (give ``str(exc)`` back to the model) on a bad call."""
    tool, args = parse_call(name, arguments)
    if tool == "list_checkpoints":
        try:
            infos = store.history(thread_id, limit=args["limit"], before=args["before"],
                                  kind=args["kind"], status=args["status"])
        except NotFoundError:
            if args["before"] is None:
                return {"checkpoints": []}
            raise _not_here(args["before"]) from None
        return {"checkpoints": [_summary(i) for i in infos]}
    if tool == "create_checkpoint":
        if state is _NO_STATE:
            state = store.load(thread_id).state
        info = store.save(thread_id, state, label=args["label"], kind="manual",
                          status="in_progress", metadata=_note(args["note"]))
        return {"created": _summary(info)}
    if tool == "restore_checkpoint":
        try:
            old = store.load(thread_id, args["checkpoint_id"])
        except NotFoundError:
            raise _not_here(args["checkpoint_id"]) from None
        info = store.save(thread_id, old.state, **_restore(old))
        return {"restored": _summary(old), "created": _summary(info)}
    result = _searcher(store)(args["query"], thread_id=thread_id,
                              all_history=args["all_history"], limit=args["limit"])
    return _search_result(result, args["limit"])


async def adispatch(store: Any, thread_id: str, name: str, arguments: object, *,
                    state: Any = _NO_STATE) -> dict[str, Any]:
    """``dispatch`` for an ``AsyncCheckpointStore``."""
    tool, args = parse_call(name, arguments)
    if tool == "list_checkpoints":
        try:
            infos = await store.history(thread_id, limit=args["limit"], before=args["before"],
                                        kind=args["kind"], status=args["status"])
        except NotFoundError:
            if args["before"] is None:
                return {"checkpoints": []}
            raise _not_here(args["before"]) from None
        return {"checkpoints": [_summary(i) for i in infos]}
    if tool == "create_checkpoint":
        if state is _NO_STATE:
            state = (await store.load(thread_id)).state
        info = await store.save(thread_id, state, label=args["label"], kind="manual",
                                status="in_progress", metadata=_note(args["note"]))
        return {"created": _summary(info)}
    if tool == "restore_checkpoint":
        try:
            old = await store.load(thread_id, args["checkpoint_id"])
        except NotFoundError:
            raise _not_here(args["checkpoint_id"]) from None
        info = await store.save(thread_id, old.state, **_restore(old))
        return {"restored": _summary(old), "created": _summary(info)}
    result = await _searcher(store)(args["query"], thread_id=thread_id,
                                    all_history=args["all_history"], limit=args["limit"])
    return _search_result(result, args["limit"])


def _note(note: str | None) -> dict[str, Any] | None:
    return None if note is None else {"note": note}


RESTORED_FROM = "restored_from"  # the metadata key naming the checkpoint a restore brought back


def _restore(old: Any) -> dict[str, Any]:
    """The save() arguments of a restore: a new head holding ``old``'s state (its parent the
    current head; nothing is rewound), marked as the restore of ``old``."""
    return {"kind": "manual", "status": "in_progress", "metadata": {RESTORED_FROM: old.id}}
