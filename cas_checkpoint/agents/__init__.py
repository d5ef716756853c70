"""The agent layer: when to checkpoint a run (policies), what state each checkpoint is in
(status and kind), and tools that let a model list, create, restore and search its own
checkpoints. Built on the public store API.

    from cas_checkpoint.agents import Recorder, Every, AfterToolCall, Interval

    rec = Recorder(store, "thread-1", policy=AfterToolCall() | Every(5))
    rec.event("llm_response", state)             # saved or not, by the policy
    with rec.before("drop_table", state): ...    # pre_operation, then recovery on an error
    rec.finish(state, status="completed")
"""

from cas_checkpoint.agents.policy import (
    AfterLlmResponse,
    AfterToolCall,
    AnyOf,
    Event,
    Every,
    Interval,
    Never,
    Policy,
)
from cas_checkpoint.agents.recorder import (
    AsyncBackground,
    AsyncRecorder,
    Background,
    Operation,
    Recorder,
)
from cas_checkpoint.agents.tools import (
    MAX_ARGUMENTS_CHARS,
    TOOL_NAMES,
    adispatch,
    anthropic_tools,
    dispatch,
    openai_tools,
    tool_definitions,
)

__all__ = [
    "MAX_ARGUMENTS_CHARS",
    "TOOL_NAMES",
    "AfterLlmResponse",
    "AfterToolCall",
    "AnyOf",
    "AsyncBackground",
    "AsyncRecorder",
    "Background",
    "Event",
    "Every",
    "Interval",
    "Never",
    "Operation",
    "Policy",
    "Recorder",
    "adispatch",
    "anthropic_tools",
    "dispatch",
    "openai_tools",
    "tool_definitions",
]
