"""The command line speaks in its own words: ``--version``; errors that name flags and commands,
never the Python API's arguments (``encryption=...``, ``force=True``, ``threads()``); counts
whose nouns agree (``1 thread``); long listings that summarize first and list only under ``-v``
or ``--json``. In-process."""

from __future__ import annotations

import json
import re
import uuid
from importlib.metadata import version
from pathlib import Path
from typing import Any

from builders import run_cli

from cas_checkpoint import CheckpointStore, Key
from cas_checkpoint.cli.wording import for_cli

# What the Python API says and a command line must not: an argument (`force=`), a call
# (`threads()`), an API name (Key.from_env, timedelta), a Python constant.
PYTHON = re.compile(r"(?<![\w-])[a-z_]+=|[A-Za-z_]\(\)|\bKey\.|timedelta|CheckpointStore"
                    r"|\b(True|False|None)\b")


def test_version() -> None:
    code, out, err = run_cli("--version")
    assert code == 0 and out.strip() == f"cas-checkpoint {version('cas_checkpoint')}", err


def _key_file(tmp_path: Path, name: str) -> tuple[Key, str]:
    key = Key.generate()
    path = tmp_path / name
    path.write_text(key.to_text())
    return key, str(path)


def test_errors_name_flags_and_commands(tmp_path: Path) -> None:
    plain = str(tmp_path / "plain")
    store = CheckpointStore.open(plain)
    for i in range(3):
        store.save("main", {"i": i})
    key, key_file = _key_file(tmp_path, "key")
    _, other_file = _key_file(tmp_path, "other")
    enc = str(tmp_path / "enc")
    CheckpointStore.open(enc, encryption=key).save("main", {"i": 1})
    not_a_key = tmp_path / "not-a-key"
    not_a_key.write_text("nope")
    cases = [
        (["threads", enc], ["--key-file", "--keyless"]),
        (["threads", plain, "--key-file", key_file], ["without --key-file"]),
        (["threads", enc, "--key-file", other_file], ["--key-file NEW --key-file OLD"]),
        (["show", enc, "main", "--keyless"], ["verify without --deep", "--key-file"]),
        (["fork", enc, "main", "~0", "x", "--keyless"], ["--key-file"]),
        (["verify", enc, "--deep", "--keyless"], ["--key-file", "without --deep"]),
        (["rekey", plain, "--key-file", key_file], ["without --key-file"]),
        (["threads", enc, "--key-file", str(not_a_key)], ["cas-checkpoint keygen"]),
        (["log", plain, "nope"], ["cas-checkpoint threads STORE"]),
        (["delete-thread", plain, "nope"], ["cas-checkpoint threads STORE"]),
        (["export", plain, "nope", str(tmp_path / "x.cas")], ["cas-checkpoint threads"]),
        (["search", plain, "(", "--regex"], ["leave out --regex"]),
        (["search", plain, "x", "-n", "0"], ["-n/--limit"]),
        (["log", plain, "main", "-n", "0"], ["-n/--limit"]),
        (["verify", plain, "--sample", "2"], ["--sample"]),
        (["init", plain, "--compression", "none"], ["--compression"]),
        (["prune", plain], ["--keep-last"]),
    ]
    for argv, words in cases:
        code, _, err = run_cli(*argv)
        assert code == 2 and "Traceback" not in err, (argv, err)
        assert not PYTHON.search(err), (argv, err)  # no Python arguments, calls or constants
        for word in words:
            assert word in err, (argv, word, err)


def test_gc_below_s3s_resolution_names_force(moto_server: dict[str, Any]) -> None:
    url = f"s3://{moto_server['bucket']}/words-{uuid.uuid4().hex[:8]}"
    CheckpointStore.open(url, storage_options=moto_server["storage_options"]).save("t", {"a": 1})
    code, _, err = run_cli("gc", url, "--grace", "0s", "--endpoint-url", moto_server["endpoint"],
                           env={"AWS_ACCESS_KEY_ID": "testing",
                                "AWS_SECRET_ACCESS_KEY": "testing"})
    assert code == 2 and "--force" in err and "--grace 1s" in err, err
    assert not PYTHON.search(err), err


def test_the_translation_keeps_the_library_in_python() -> None:
    """The library's own message is unchanged; the command line's says the same in flags."""
    said = ("grace=0 s is below the 1-second resolution of modified times on s3://b, so gc "
            "could delete an object a writer is about to commit; use a grace of at least 1 "
            "second (grace=timedelta(seconds=1), --grace 1s; the default is 1 hour), or pass "
            "force=True (--force) if no writer is active. Nothing was changed")
    assert for_cli(said) == (
        "--grace 0 s is below the 1-second resolution of modified times on s3://b, so gc "
        "could delete an object a writer is about to commit; use a grace of at least 1 second "
        "(--grace 1s; the default is 1 hour), or pass --force if no writer is active. Nothing "
        "was changed")
    assert for_cli("checkpoint_id searches one checkpoint of one thread: pass thread_id= with "
                   "it, and not all_history=True") == (
        "checkpoint_id searches one checkpoint of one thread: pass --thread with it, and not "
        "--all-history")
    assert for_cli("prune needs a policy: pass keep_last=N and/or older_than=timedelta(...)") \
        == "prune needs a policy: pass --keep-last N and/or --older-than AGE"
    assert for_cli("the store at 's' was created with compression='zstd', compression_level=3"
                   ) == "the store at 's' was created with --compression zstd, --level 3"
    # what a message quotes or names as a path is the user's: never rewritten
    said = ("thread 'limit=3 threads()' does not exist in /tmp/grace=1/s; threads() lists "
            "the threads there are")
    assert for_cli(said) == ("thread 'limit=3 threads()' does not exist in /tmp/grace=1/s; "
                             "`cas-checkpoint threads STORE` lists them")
    assert for_cli('a "force=True" and the refs\' pack lists, thread\'s force=True') == (
        'a "force=True" and the refs\' pack lists, thread\'s --force')


SINGULAR_SLIPS = re.compile(r"(?<![\d.,])1 (threads|checkpoints|objects|packs|matches|changes|"
                            r"tree nodes|pending writes|entries|namespaces|PROBLEMS)\b")


def test_counts_of_one_are_singular(tmp_path: Path) -> None:
    url = str(tmp_path / "one")
    store = CheckpointStore.open(url)
    first = store.save("t", {"text": "hello world", "n": 1})
    store.save("t", {"text": "hello world", "n": 2})
    bundle = str(tmp_path / "t.cas")
    outputs = []
    for argv in (["threads", url], ["log", url, "t", "-n", "1"], ["stats", url],
                 ["verify", url], ["verify", url, "--deep"], ["search", url, "hello"],
                 ["diff", url, "t~1", "t"], ["prune", url, "--keep-last", "1", "--dry-run"],
                 ["gc", url, "--grace", "0s", "--dry-run"], ["export", url, "t", bundle],
                 ["import", str(tmp_path / "two"), bundle], ["copy", url, str(tmp_path / "c")],
                 ["rewind", url, "t", first.id[:12]], ["log", url, "t"],
                 ["fork", url, "t", "~0", "u"], ["delete-thread", url, "u"]):
        code, out, err = run_cli(*argv)
        assert code == 0, (argv, err)
        outputs.append((argv, out))
        assert not SINGULAR_SLIPS.search(out), (argv, out)
    said = dict((a[0] + str(i), o) for i, (a, o) in enumerate(outputs))
    assert "1 thread, 2 checkpoints" in said["stats2"]
    assert "1 thread, 2 checkpoints" in said["verify3"]
    assert said["search5"].startswith("1 match in 1 checkpoint")  # the count first
    assert "1 change;" in said["diff6"]
    assert "thread 't': 1 checkpoint\n" in said["log13"]


def _many_threads(url: str, threads: int, saves: int) -> CheckpointStore:
    store = CheckpointStore.open(url)
    for t in range(threads):
        for i in range(saves):
            store.save(f"t{t:03}", {"i": i, "text": f"thread {t} turn {i} " + "x" * 3000})
    return store


def test_long_listings_summarize_first(tmp_path: Path) -> None:
    url = str(tmp_path / "many")
    store = _many_threads(url, 40, 4)
    code, out, _ = run_cli("prune", url, "--keep-last", "1", "--dry-run")
    lines = out.splitlines()
    assert code == 0 and len(lines) <= 3, out  # the old code: 160 lines before its summary
    assert lines[0].startswith("total: kept 40") and "would remove 120 checkpoints" in lines[0]
    assert "-v" in lines[-1]
    code, out, _ = run_cli("prune", url, "--keep-last", "1", "--dry-run", "-v")
    lines = out.splitlines()
    assert lines[0].startswith("total: kept 40")  # the summary still first
    assert sum(line.startswith("would remove t") for line in lines) == 120
    assert sum(re.match(r"t\d{3}: kept 1, would remove 3$", line) is not None
               for line in lines) == 40
    listed = json.loads(run_cli("prune", url, "--keep-last", "1", "--dry-run", "--json")[1])
    assert sum(len(t["removed"]) for t in listed["threads"].values()) == 120
    assert store.count("t000") == 4  # a dry run

    for t in range(30):
        store.delete_thread(f"t{t:03}")
    code, out, _ = run_cli("gc", url, "--grace", "0s", "--dry-run")
    lines = out.splitlines()
    would = json.loads(run_cli("gc", url, "--grace", "0s", "--dry-run", "--json")[1])
    assert len(would["would_delete"]) >= 30
    assert code == 0 and len(lines) <= 4 and lines[0].startswith("would free"), out
    assert f"-v lists the {len(would['would_delete'])} packs" in out
    code, out, _ = run_cli("gc", url, "--grace", "0s", "--dry-run", "-v")
    assert out.splitlines()[0].startswith("would free")
    assert {line.split()[-1] for line in out.splitlines()
            if line.startswith("would delete pack")} == set(would["would_delete"])


def test_report_text_names_commands(tmp_path: Path) -> None:
    """verify's report (library text) printed by the command line names commands too."""
    url = tmp_path / "s"
    CheckpointStore.open(str(url)).save("t", {"a": 1})
    (url / "refs" / "heads" / "stray!").write_bytes(b"not a ref")
    code, out, _ = run_cli("verify", str(url))
    assert code == 1 and "stray" in out, out
    assert "`cas-checkpoint threads STORE` ignores it" in out and "threads()" not in out


def test_verify_lists_every_problem_only_under_v(tmp_path: Path) -> None:
    url = str(tmp_path / "broken")
    store = _many_threads(url, 15, 14)
    store.backend.delete_many([i.key for i in store.backend.list("packs")])
    # (--deep: the audit that names the checkpoints a problem breaks; the quick one names
    # threads)
    found = json.loads(run_cli("verify", url, "--json", "--deep")[1])["problems"]
    assert len(found) > 10 and max(len(p["checkpoints"]) for p in found) > 10
    code, out, _ = run_cli("verify", url, "--deep")
    lines = out.splitlines()
    assert code == 1 and re.match(r"\d+ PROBLEMS, breaking 210 checkpoints in 15 threads:",
                                  lines[3]), out  # the counts first
    assert sum(line.startswith("  missing") for line in lines) == 10
    assert f"  ... and {len(found) - 10} more problems" in lines
    assert all(line.count(", ") <= 10 for line in lines if "checkpoints (" in line)
    assert lines[-1] == "(-v lists them all; --json too)"
    code, out, _ = run_cli("verify", url, "-v", "--deep")
    assert code == 1 and sum(line.startswith("  missing") for line in out.splitlines()) \
        == len(found)
    assert all(p["checkpoints"][-1] in out for p in found) and "-v lists" not in out


def test_what_show_elides_is_counted_in_agreement() -> None:
    from cas_checkpoint.cli.render import MAX_DEPTH, MAX_TEXT, render

    assert render("x" * (MAX_TEXT + 1)).endswith("(1 more character)")
    assert render("x" * (MAX_TEXT + 1234)).endswith("(1,234 more characters)")
    assert render(b"a") == "<1 byte: 61>"
    deep: Any = {"k": 1}
    for _ in range(MAX_DEPTH):
        deep = [deep]
    assert "... 1 key }" in render(deep)
