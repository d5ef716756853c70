"""LangGraph's public checkpointer conformance suite (langgraph-checkpoint-conformance) against
CasSaver on memory://, a local directory and S3 (moto over HTTP). Every capability, base and
extended, must be detected and pass; a failure prints the suite's report with each failing
test's traceback."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import (
    BASE_CAPABILITIES,
    EXTENDED_CAPABILITIES,
)
from langgraph.checkpoint.conformance.report import ProgressCallbacks

from cas_checkpoint.integrations.langgraph import CasSaver


@pytest.mark.parametrize("kind", ["memory", "local", "s3"])
def test_conformance_suite_passes_in_full(kind: str, tmp_path: Path,
                                          request: pytest.FixtureRequest) -> None:
    storage_options: dict[str, Any] | None = None
    if kind == "s3":
        server = request.getfixturevalue("moto_server")
        storage_options = server["storage_options"]
    run = uuid.uuid4().hex[:12]
    opened: list[str] = []

    def url() -> str:  # a fresh store for each capability suite, as the suite asks
        name = f"conf-{run}-{len(opened)}"
        opened.append(name)
        if kind == "memory":
            return f"memory://{name}"
        if kind == "local":
            return str(tmp_path / name)
        return f"s3://{server['bucket']}/{name}"

    @checkpointer_test(name=f"CasSaver[{kind}]")
    async def cas_saver() -> AsyncGenerator[CasSaver, None]:
        yield CasSaver.from_url(url(), storage_options=storage_options)

    failures: list[tuple[str, str, str]] = []
    results: list[tuple[str, str, bool]] = []

    def on_result(capability: str, test: str, passed: bool, error: str | None) -> None:
        results.append((capability, test, passed))
        if not passed:
            failures.append((capability, test, error or "(no traceback)"))

    report = asyncio.run(validate(cas_saver, progress=ProgressCallbacks(
        on_test_result=on_result)))

    wanted = {c.value for c in BASE_CAPABILITIES | EXTENDED_CAPABILITIES}
    bad = sorted(
        name for name in wanted
        if name not in report.results or not report.results[name].detected
        or report.results[name].passed is not True)
    if bad or failures:
        report.print_report()
        for name in bad:
            r = report.results.get(name)
            if r is None or not r.detected:
                print(f"capability {name}: not detected (the method is not overridden)")
        for capability, test, tb in failures:
            print(f"--- {capability} / {test}\n{tb}")
    assert not failures, (
        f"{len(failures)} of {len(results)} conformance tests failed on {kind}: "
        + ", ".join(f"{c}/{t}" for c, t, _ in failures))
    assert not bad, f"capabilities not detected or not passed on {kind}: {bad}"
    assert report.passed_all_base() and report.passed_all()
    assert report.conformance_level() == "FULL"
    assert len(results) > 50  # the suite really ran (about 90 tests in 0.0.2)
