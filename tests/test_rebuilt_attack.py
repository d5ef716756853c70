"""Attempts to break the decoded-object memo (``format/rebuilt.py``): every decode, the 1st
to the 10th, equals a decode with the memo cleared, whatever callers did to earlier results,
whatever class the registry maps the name to, and from several threads at once."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pydantic
import pytest
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    ChatMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)

from cas_checkpoint.format import codec
from cas_checkpoint.format.rebuilt import REBUILT
from cas_checkpoint.integrations.langgraph.registry import default_types

POSTED: list[str] = []


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    REBUILT.clear()
    POSTED.clear()
    yield
    REBUILT.clear()


def _messages() -> list[Any]:
    return [
        HumanMessage(content="hi", name="u", id="h1", example=True),
        AIMessage(content=[{"type": "text", "text": "a"}, "b"], id="a1",
                  tool_calls=[{"name": "f", "args": {"q": [1, {"x": None}]}, "id": "c1"}],
                  invalid_tool_calls=[{"name": "g", "args": "{bad", "id": "c2",
                                       "error": "json"}],
                  usage_metadata={"input_tokens": 1, "output_tokens": 2, "total_tokens": 3},
                  response_metadata={"model": "m", "nested": {"k": [1, 2.5, True]}},
                  additional_kwargs={"extra": {"deep": ["v"]}}),
        ToolMessage(content="r", tool_call_id="c1", artifact={"rows": [1, 2]}, status="error"),
        ChatMessage(content="c", role="critic"),
        SystemMessage(content="s", id="s1"),
        RemoveMessage(id="h1"),
        AIMessageChunk(content="chunk", id="k1", tool_call_chunks=[
            {"name": "f", "args": '{"a": 1}', "id": "t", "index": 0}]),
    ]


def _shape(objs: list[Any]) -> list[Any]:
    return [(type(o), o.model_dump(), set(o.model_fields_set), o.__pydantic_extra__,
             o.__pydantic_private__) for o in objs]


def test_every_decode_equals_a_memo_free_decode_whatever_callers_did() -> None:
    msgs = _messages()
    reg = default_types()
    data = codec.encode(msgs, types=reg)
    REBUILT.clear()
    plain = codec.decode(data, types=reg)
    expected = _shape(plain)
    REBUILT.clear()
    for i in range(10):
        got = codec.decode(data, types=reg)
        assert _shape(got) == expected and got == plain, i
        for m in got:  # mutate everything reachable
            if isinstance(m.content, list):
                m.content.append("x")
                if isinstance(m.content[0], dict):
                    m.content[0]["text"] = "changed"
            m.additional_kwargs["new"] = 1
            m.response_metadata["new"] = {"x": 1}
            for key in ("nested",):
                if key in m.response_metadata:
                    m.response_metadata[key]["k"].append(9)
            for call in getattr(m, "tool_calls", []) or []:
                if "q" in call["args"]:
                    call["args"]["q"].append(0)
                    call["args"]["q"][1]["x"] = 5
                call["args"]["new"] = 1
            for call in getattr(m, "invalid_tool_calls", []) or []:
                call["error"] = "other"
            if getattr(m, "usage_metadata", None):
                m.usage_metadata["input_tokens"] = 99
            if isinstance(m, ToolMessage):
                m.artifact["rows"].append(3)
            m.id = "changed"
            m.__dict__["surprise"] = 1
            m.__pydantic_fields_set__.add("surprise")
    assert REBUILT.kept > 0  # (the memo was in use)


class First(pydantic.BaseModel):
    text: str


class Second(pydantic.BaseModel):
    text: str

    @pydantic.field_validator("text")
    @classmethod
    def upper(cls, value: str) -> str:
        return value.upper()


def test_a_name_registered_to_another_class_never_gets_the_old_class() -> None:
    old = codec.TypeRegistry()
    old.register(First, name="note")
    data = codec.encode([First(text="a")], types=old)
    for _ in range(3):
        assert codec.decode(data, types=old)[0] == First(text="a")
    new = codec.TypeRegistry()
    new.register(Second, name="note")
    for _ in range(3):  # the same bytes, another class under that name
        got = codec.decode(data, types=new)[0]
        assert type(got) is Second and got.text == "A"
    assert type(codec.decode(data, types=old)[0]) is First  # two registries in one process


class Posted(pydantic.BaseModel):  # a side effect a copy does not repeat: private state
    text: str
    _note: str = pydantic.PrivateAttr(default="")

    def model_post_init(self, context: Any) -> None:
        self._note = "built " + self.text
        POSTED.append(self.text)


def test_a_model_with_private_state_made_at_build_is_built_every_time() -> None:
    reg = codec.TypeRegistry([Posted])
    data = codec.encode([Posted(text="a")], types=reg)
    POSTED.clear()
    for _ in range(4):
        got = codec.decode(data, types=reg)[0]
        assert got._note == "built a"
    assert POSTED == ["a"] * 4


def test_threads_racing_decodes_get_equal_results() -> None:
    reg = default_types()
    blobs = [codec.encode([AIMessage(content=f"m{i}", id=f"{i}",
                                     response_metadata={"k": [i]})], types=reg)
             for i in range(50)]
    expected = [codec.decode(b, types=reg) for b in blobs]
    REBUILT.clear()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for _ in range(5):
                for blob, want in zip(blobs, expected, strict=True):
                    got = codec.decode(blob, types=reg)
                    assert got == want and _shape(got) == _shape(want)
                    got[0].response_metadata["k"].append(0)
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


class Hooked(pydantic.BaseModel):  # pydantic's own after-build hook, with a side effect only
    text: str

    def model_post_init(self, context: Any) -> None:
        POSTED.append(self.text)


class Checked(pydantic.BaseModel):  # an after-validator, with a side effect only
    text: str

    @pydantic.model_validator(mode="after")
    def _seen(self) -> Checked:
        POSTED.append(self.text)
        return self


@pytest.mark.parametrize("cls", [Hooked, Checked])
def test_a_model_post_init_hook_runs_at_every_decode(cls: Any) -> None:
    """Building that acts on the built object (``model_post_init``, an ``after`` or ``wrap``
    validator) runs at every decode: such a class is never copied."""
    reg = codec.TypeRegistry([cls])
    data = codec.encode([cls(text="a")], types=reg)
    POSTED.clear()
    for _ in range(4):
        assert codec.decode(data, types=reg) == [cls(text="a")]
    assert POSTED == ["a"] * 8  # 4 decodes, 4 objects to compare with (was 6: 2 copies)
    assert REBUILT.kept == 0
