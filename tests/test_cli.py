"""The ``cas-checkpoint`` command in-process, on local disk, S3 (moto server) and memory://:
every command, its ``--json`` parsed back, bad arguments, missing and damaged stores, a progress
bar on a terminal; and once through the installed console script in a real process."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from builders import S3_ENV, run_cli, run_json
from langgraph.graph.message import add_messages

from cas_checkpoint import CheckpointStore
from cas_checkpoint.cli import main

ENV = {**S3_ENV, "COLUMNS": "200"}


def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    return run_cli(*args, env={**ENV, **(env or {})})


def cli_json(*args: str, env: dict[str, str] | None = None) -> Any:
    return run_json(*args, env={**ENV, **(env or {})})


def inproc(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _message(i: int) -> dict[str, Any]:
    return {"role": "user" if i % 2 else "assistant",
            "content": f"message {i}: " + ("about the refund policy " if i == 7 else "") +
            "lorem ipsum dolor sit amet " * 12}


def build(store: CheckpointStore) -> dict[str, Any]:
    """Thread 'main' of 30 saves (labels on some), 'branch' forked at step 19 plus 3 saves."""
    state: dict[str, Any] = {"messages": [], "step": 0}
    ids = []
    for i in range(30):
        state["messages"].append(_message(i))
        state["step"] = i
        ids.append(store.save("main", state, label=f"l{i}" if i % 10 == 9 else None,
                              tags=["tool"] if i % 3 == 0 else [],
                              metadata={"phase": "act" if i % 2 else "plan"}).id)
    store.fork("main", ids[19], "branch")
    branch = store.load("branch").state
    for i in range(3):
        branch["messages"].append({"role": "user", "content": f"what if {i}?"})
        ids.append(store.save("branch", branch).id)
    return {"ids": ids}


@pytest.fixture(params=["local", "s3"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """A built store and the command-line arguments that reach it."""
    if request.param == "local":
        url, opts, extra = str(tmp_path / "store"), {}, []
    else:
        server = request.getfixturevalue("moto_server")
        url = f"s3://{server['bucket']}/cli-{uuid.uuid4().hex[:8]}"
        opts, extra = server["storage_options"], ["--endpoint-url", server["endpoint"]]
    store = CheckpointStore.open(url, storage_options=opts)
    return {"url": url, "store": store, "extra": extra, "kind": request.param, **build(store)}


def test_demo_shows_the_point_of_the_store(tmp_path: Path) -> None:
    url = str(tmp_path / "demo")
    code, out, err = cli("demo", url)
    assert code == 0, err
    store = CheckpointStore.open(url)
    assert store.threads() == ["support-agent", "support-agent/what-if"]
    assert store.count("support-agent") == 195 and store.count("support-agent/what-if") == 130
    # bytes measured for both stores, ours far smaller; the graph marks the fork; diff; verify
    ours, copies = (line for line in out.splitlines() if "x the final state" in line)
    assert "cas_checkpoint" in ours and "copy per checkpoint" in copies
    assert "less stored" in out and "<- also in 'support-agent'" in out
    last = len(store.load("support-agent/what-if").state["messages"]) - 1
    assert f'+ state["messages"][{last}] = ' in out and "tree nodes read" in out
    assert "OK" in out.split("verify")[-1]
    assert len(out.splitlines()) <= 30  # one screen
    assert cli("demo", url)[0] == 0  # runs again on the same store
    assert CheckpointStore.open(url).count("support-agent") == 195


def test_console_script_in_a_real_process(tmp_path: Path) -> None:
    """The one test through a real process: the installed ``cas-checkpoint`` script runs a
    command, says its version, and exits 2 with one line on stderr for an error."""
    exe = Path(sys.executable).with_name("cas-checkpoint")
    url = str(tmp_path / "s")
    CheckpointStore.open(url).save("t", {"a": 1})
    env = {**os.environ, "COLUMNS": "200"}

    def real(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=60,
                              env=env)

    proc = real("--help")
    assert proc.returncode == 0 and "diff" in proc.stdout and "export" in proc.stdout
    proc = real("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("cas-checkpoint "), proc.stderr
    proc = real("log", url, "t")
    assert proc.returncode == 0 and "thread 't': 1 checkpoint" in proc.stdout, proc.stderr
    proc = real("log", url, "nope")
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1


def test_read_commands_never_create_a_store(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "nonexistent" / "x")
    for args in (["threads", missing], ["log", missing, "t"], ["show", missing, "t"],
                 ["diff", missing, "a", "b"], ["stats", missing], ["search", missing, "q"],
                 ["verify", missing], ["export", missing, "t", str(tmp_path / "b.cas")]):
        code, out, err = inproc(capsys, *args)
        assert code == 2 and "no store at" in err and "cas-checkpoint init" in err, (args, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "nonexistent")
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = inproc(capsys, "threads", str(empty))
    assert code == 2 and "no store at" in err and os.listdir(empty) == []
    code, _, err = inproc(capsys, "threads", "memory://never-made")
    assert code == 2 and "no store at" in err
    code, out, _ = inproc(capsys, "init", str(empty))
    assert code == 0 and "created a store" in out
    assert inproc(capsys, "init", str(empty))[1].startswith("a store is already there")
    code, out, _ = inproc(capsys, "threads", str(empty))
    assert code == 0 and "(no threads)" in out
    assert inproc(capsys, "verify", str(empty))[0] == 0  # the marker is not damage


def test_bad_urls_and_arguments_are_one_line_errors(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli("threads", "ftp://x/y")
    assert code == 2 and "ftp://" in err and "not supported" in err and "Traceback" not in err
    code, _, err = cli("threads", "ftp://x/y", "--debug")
    assert code == 2 and "Traceback" in err
    code, _, err = cli("threads", "gs://bucket/p")
    assert code == 2 and "not supported" in err
    url = str(tmp_path / "s")
    build(CheckpointStore.open(url))
    for args, words in (
            (["prune", url], "say what to keep"),
            (["prune", url, "--older-than", "7x"], "not a duration"),
            (["log", url], "the following arguments are required"),
            (["log", url, "nope"], "'nope'"),
            (["show", url, "main", "zzzz"], "not a checkpoint id"),
            (["show", url, "ffff"], "no checkpoint id starts with"),
            (["show", url, "main", "--path", "messages[999]"], "has no item 999"),
            (["show", url, "main", "--path", "messages[0.x"], "cannot read the path"),
            (["diff", url, "main~99", "main"], "goes past"),
            (["threads", url, "--storage-option", "novalue"], "not KEY=VALUE"),
            (["search", url, "(", "--regex"], "")):
        code, _, err = inproc(capsys, *args)
        assert code == 2 and words in err, (args, err)
        assert "Traceback" not in err


def test_every_command_with_json(target: dict[str, Any], tmp_path: Path) -> None:
    url, extra, ids = target["url"], target["extra"], target["ids"]
    out = cli_json("threads", url, "--bytes", *extra)
    rows = {r["thread"]: r for r in out["threads"]}
    assert set(rows) == {"main", "branch"} and out["damaged"] == 0
    assert rows["main"]["checkpoints"] == 30 and rows["main"]["head"] == ids[29]
    assert rows["branch"]["checkpoints"] == 23 and rows["branch"]["head_step"] == 22
    assert rows["main"]["stored_bytes"] > 0 and rows["main"]["messages"] == 30

    log = cli_json("log", url, "main", *extra)
    assert [c["id"] for c in log["log"]] == ids[29::-1] and log["log"][0]["head"] is True
    assert log["log"][0]["metadata"] == {"phase": "act"}
    assert [c["label"] for c in cli_json("log", url, "main", "--label", "l9", *extra)["log"]] \
        == ["l9"]
    assert len(cli_json("log", url, "main", "--tag", "tool", *extra)["log"]) == 10
    graph = cli_json("log", url, "main", "--graph", *extra)
    assert {c["id"]: c["forks"] for c in graph["log"]}[ids[19]] == ["branch"]
    code, text, _ = cli("log", url, "branch", "--graph", "-n", "3", *extra)
    assert code == 0 and "<- also in 'main'" not in text  # the fork point is the 4th
    code, text, _ = cli("log", url, "branch", "--graph", *extra)
    assert f"{ids[19][:12]}" in text and "<- also in 'main'" in text

    shown = cli_json("show", url, "main", "--path", "messages[-1]", *extra)
    assert shown["value"] == _message(29) and shown["checkpoint"]["id"] == ids[29]
    assert cli_json("show", url, ids[5][:10], *extra)["value"]["step"] == 5
    assert cli_json("show", url, "main", "~2", *extra)["checkpoint"]["id"] == ids[27]
    code, text, _ = cli("show", url, "main", *extra)
    assert code == 0 and "... 15 more items ..." in text and '"step": 29' in text

    d = cli_json("diff", url, "main~1", "main", *extra)
    assert [(c["op"], c["path"]) for c in d["changes"]] == [
        ("added", '["messages"][29]'), ("changed", '["step"]')]
    assert d["changes"][0]["new"] == _message(29) and d["nodes_read"] > 0
    d = cli_json("diff", url, "main", "branch", *extra)  # across threads
    assert {c["op"] for c in d["changes"]} >= {"changed"}

    st = cli_json("stats", url, "--by-thread", *extra)
    assert st["threads"] == 2 and st["checkpoints"] == 33 and st["dedup_ratio"] > 1
    assert st["by_thread"]["main"]["checkpoints"] == 30

    found = cli_json("search", url, "REFUND policy", *extra)
    assert [(m["thread"], m["path"]) for m in found["matches"]] == [
        ("branch", '["messages"][7]["content"]'), ("main", '["messages"][7]["content"]')]
    assert found["checkpoints_searched"] == 2
    assert cli_json("search", url, "what if [12]", "--regex", *extra)["matches"][0]["thread"] \
        == "branch"

    v = cli_json("verify", url, *extra)
    assert v["ok"] is True

    cli_json("fork", url, "main", ids[9][:12], "side", *extra)
    assert cli_json("log", url, "side", *extra)["log"][0]["id"] == ids[9]
    r = cli_json("rewind", url, "main", "~3", *extra)
    assert r["head"]["id"] == ids[26] and r["left_the_thread"] == 3
    assert cli_json("delete", url, "main", ids[26][:12], *extra)["deleted"] == ids[26]
    assert cli_json("delete-thread", url, "side", *extra)["checkpoints"] == 10
    dry = cli_json("prune", url, "--keep-last", "5", "--dry-run", *extra)
    assert dry["dry_run"] is True and dry["removed"] > 0
    assert cli_json("log", url, "main", *extra)["checkpoints"] == 26  # nothing changed
    pruned = cli_json("prune", url, "main", "--keep-last", "5", "--no-keep-labeled", *extra)
    assert pruned["removed"] == 21
    assert cli_json("log", url, "main", *extra)["checkpoints"] == 5
    would = cli_json("gc", url, "--grace", "0s", "--force", "--dry-run", *extra)
    assert would["dry_run"] is True and len(would["would_delete"]) == would["deleted_objects"]
    gc = cli_json("gc", url, "--grace", "0s", "--force", *extra)
    assert gc["deleted_objects"] >= 0 and gc["dry_run"] is False
    assert cli_json("verify", url, *extra)["ok"] is True


def test_export_import_between_local_and_s3(moto_server: dict[str, Any], tmp_path: Path) -> None:
    local = str(tmp_path / "local")
    src = CheckpointStore.open(local)
    build(src)
    s3 = f"s3://{moto_server['bucket']}/bundle-{uuid.uuid4().hex[:8]}"
    extra = ["--endpoint-url", moto_server["endpoint"]]
    bundle = str(tmp_path / "branch.cas")
    e = cli_json("export", local, "branch", bundle)
    assert e["checkpoints"] == 23 and os.path.getsize(bundle) == e["bytes"]
    i = cli_json("import", s3, bundle, "--as", "moved", *extra)
    assert i["thread_id"] == "moved" and i["objects_written"] == i["objects"] > 0
    again = cli_json("import", s3, bundle, "--as", "moved", *extra)
    assert again["objects_written"] == 0
    dst = CheckpointStore.open(s3, storage_options=moto_server["storage_options"])
    assert [c.id for c in dst.history("moved")] == [c.id for c in src.history("branch")]
    for c in src.history("branch"):
        assert dst.load("moved", c.id).state == src.load("branch", c.id).state
    assert cli_json("verify", s3, *extra)["ok"] is True
    back = str(tmp_path / "back.cas")
    cli_json("export", s3, "moved", back, *extra)
    home = str(tmp_path / "home")
    cli_json("import", home, back)
    assert CheckpointStore.open(home).load("moved").state == src.load("branch").state
    c = cli_json("copy", local, s3, "main", *extra)
    assert c["threads"] == ["main"]
    assert dst.load("main").state == src.load("main").state
    with open(bundle, "r+b") as f:  # a damaged bundle is refused, nothing imported
        f.seek(os.path.getsize(bundle) // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    code, _, err = cli("import", str(tmp_path / "third"), bundle)
    assert code == 2 and "Traceback" not in err
    assert "branch" not in CheckpointStore.open(str(tmp_path / "third")).threads()


def test_aws_endpoint_url_variable(moto_server: dict[str, Any]) -> None:
    url = f"s3://{moto_server['bucket']}/env-{uuid.uuid4().hex[:8]}"
    CheckpointStore.open(url, storage_options=moto_server["storage_options"]).save("t", {"a": 1})
    env = {"AWS_ENDPOINT_URL": moto_server["endpoint"]}
    out = cli_json("threads", url, env=env)
    assert [r["thread"] for r in out["threads"]] == ["t"]


def test_memory_store_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"memory://cli-{uuid.uuid4().hex[:8]}"
    store = CheckpointStore.open(url)
    ids = build(store)["ids"]
    code, out, _ = inproc(capsys, "log", url, "main", "-n", "2")
    assert code == 0 and ids[29][:12] in out and ids[27][:12] not in out
    code, out, _ = inproc(capsys, "threads", url)
    assert code == 0 and "main" in out and "branch" in out
    code, out, _ = inproc(capsys, "show", url, "branch", "--path", "messages[-1].content",
                          "--state-only")
    assert code == 0 and out.strip() == '"what if 2?"'
    code, out, _ = inproc(capsys, "stats", url)
    assert code == 0 and "2 threads, 33 checkpoints" in out


def test_merge_is_drawn_as_a_graph(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "m")
    store = CheckpointStore.open(url)
    root = store.save("t", {"x": 0})
    a = store.save("t", {"x": 1})
    b = store.save("t", {"x": 2}, expected_head=a.id)
    side = store._run(store._core.save("t", {"x": 3}, parents=[root.id]))  # another writer
    merged = store._run(store._core.save("t", {"x": 4}, parents=[b.id, side.id]))
    code, out, _ = inproc(capsys, "log", url, "t", "--graph")
    assert code == 0
    lines = out.splitlines()[1:]
    assert lines[0].startswith("*") and merged.id[:12] in lines[0] and "merge" in lines[0]
    assert lines[1] == "|\\"  # the merge's second parent opens a lane
    assert lines[2].startswith("| *") and side.id[:12] in lines[2]
    assert lines[-2] == "|/" and lines[-1].startswith("*") and root.id[:12] in lines[-1]


def test_progress_bar_renders_on_a_terminal(tmp_path: Path) -> None:
    url = str(tmp_path / "p")
    build(CheckpointStore.open(url))
    code, out, text = run_cli("verify", url, "--deep", terminal=True, env={"TERM": "xterm"})
    assert code == 0 and "OK" in out
    assert "verify" in text and "objects/s" in text and "eta" in text and "\x1b[" in text
    code, out, err = cli("verify", url)
    assert code == 0 and err == ""  # not a terminal: no bar


@pytest.mark.parametrize("kind", ["memory", "local", "s3"])
def test_open_without_create_and_init(kind: str, tmp_path: Path,
                                      request: pytest.FixtureRequest) -> None:
    import asyncio

    from cas_checkpoint import NotFoundError
    from cas_checkpoint.aio import AsyncCheckpointStore

    opts: dict[str, Any] = {}
    if kind == "memory":
        url = f"memory://open-{uuid.uuid4().hex[:8]}"
    elif kind == "local":
        url = str(tmp_path / "deep" / "store")
    else:
        server = request.getfixturevalue("moto_server")
        url, opts = f"s3://{server['bucket']}/open-{uuid.uuid4().hex[:8]}", \
            server["storage_options"]
    with pytest.raises(NotFoundError, match="no store at"):
        CheckpointStore.open(url, storage_options=opts, create=False)

    async def aopen() -> None:
        with pytest.raises(NotFoundError, match="no store at"):
            await AsyncCheckpointStore.open(url, storage_options=opts, create=False)

    asyncio.run(aopen())
    if kind == "local":
        assert not (tmp_path / "deep").exists()
    store = CheckpointStore.init(url, storage_options=opts)
    assert store.threads() == []
    assert CheckpointStore.open(url, storage_options=opts, create=False).threads() == []
    store.save("t", {"a": 1})
    assert CheckpointStore.open(url, storage_options=opts, create=False).load("t").state == {"a": 1}
    assert store.verify(deep=True).ok


class LgState(TypedDict):
    messages: Annotated[list[Any], add_messages]


def test_langgraph_store_with_types(tmp_path: Path) -> None:
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.graph import END, START, StateGraph

    from cas_checkpoint.integrations.langgraph import CasSaver

    def bot(state: LgState) -> dict[str, Any]:
        return {"messages": [AIMessage(content="our refund policy is 30 days")]}

    builder = StateGraph(LgState)
    builder.add_node("bot", bot)
    builder.add_edge(START, "bot")
    builder.add_edge("bot", END)
    url = str(tmp_path / "lg")
    graph = builder.compile(checkpointer=CasSaver(CheckpointStore.open(url)))
    graph.invoke({"messages": [HumanMessage(content="hi")]}, {"configurable": {"thread_id": "t1"}})
    thread = 'lg:["t1",""]'
    code, out, err = cli("show", url, thread)  # the store's LangGraph threads bring the types
    assert code == 0 and "AIMessage(content='our refund policy is 30 days'" in out, err
    # LangGraph's last checkpoint (the thread's head is sometimes a pending write that
    # LangGraph's background writer saved after it)
    log = cli_json("log", url, thread)["log"]
    last = next(e["id"] for e in log if "lg" in e["metadata"])
    code, out, err = cli("show", url, thread, last[:12], "--types", "langgraph")
    assert code == 0 and "AIMessage(content='our refund policy is 30 days'" in out, err
    found = cli_json("search", url, "REFUND POLICY", "--types", "langgraph", "--all-history")
    assert found["matches"] and all(m["thread"] == thread for m in found["matches"])
