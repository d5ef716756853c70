"""Every Python block of the README runs as written, in order, in one namespace (like a reader
pasting them into one session), in a scratch folder; and the two set-up commands are the ones CI
runs."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def test_every_python_block_runs_as_written(tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                                            moto_server: dict[str, Any]) -> None:
    """The S3 block runs against the moto server, named by ``AWS_ENDPOINT_URL`` as the README
    tells (the bucket ``my-bucket`` is created first)."""
    import boto3

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server["endpoint"])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    s3 = boto3.client("s3", endpoint_url=moto_server["endpoint"], region_name="us-east-1")
    if "my-bucket" not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
        s3.create_bucket(Bucket="my-bucket")
    found = blocks("python")
    assert len(found) >= 2
    namespace: dict[str, Any] = {"__name__": "readme"}
    for i, code in enumerate(found):
        try:
            exec(compile(code, f"README.md python block {i + 1}", "exec"), namespace)
        except Exception as exc:  # name the block: the README must be fixed, not this test
            raise AssertionError(f"README python block {i + 1} fails: {exc!r}\n{code}") from exc
    assert os.path.isdir(tmp_path / "checkpoints")
    assert namespace["s3"].load("thread-1").state == {"step": 1}  # it really went to S3


def test_the_test_command_is_the_one_ci_runs() -> None:
    ci = (README.parent / ".ci" / "run").read_text()
    bash = blocks("bash")
    test_cmd = next(b.strip() for b in bash if "pytest" in b)
    assert test_cmd in ci
    assert any("cas-checkpoint demo" in b for b in bash)
    for tool in ("ruff check cas_checkpoint tests benchmarks compat", "mypy"):
        assert tool in ci and tool in README.read_text()
