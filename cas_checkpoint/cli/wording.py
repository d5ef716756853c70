"""The library's words in the command line's: an error message (or report line) that names a
Python argument (``force=True``, ``encryption=Key.from_env('CAS_KEY')``) or a method
(``threads()``) is said with the flag or the command that does the same (``--force``,
``--key-file FILE``, ``cas-checkpoint threads STORE``). Rule: the library keeps speaking Python;
every error and report text the command prints from it passes through ``for_cli`` here, and
nowhere else is its text rewritten. Pure code."""

from __future__ import annotations

import re

# Python argument -> the flag that sets it (``None``: the command line has no such setting).
FLAGS: dict[str, str | None] = {
    "encryption": "--key-file", "force": "--force", "grace": "--grace", "deep": "--deep",
    "sample": "--sample", "thread_id": "--thread", "all_history": "--all-history",
    "regex": "--regex", "keep_last": "--keep-last", "older_than": "--older-than",
    "keep_tags": "--keep-tag", "keep_labeled": "--keep-labeled", "idle_for": "--idle",
    "compression": "--compression", "compression_level": "--level", "limit": "--limit",
    "timeout": "--timeout", "retries": "--retries", "as_thread": "--as", "dry_run": "--dry-run",
    "types": "--types", "storage_options": "--storage-option",
    "allow_unsafe": None,
}

# Store methods -> the command that runs them.
COMMANDS = {
    "threads": "threads STORE", "history": "log STORE THREAD", "verify": "verify STORE",
    "gc": "gc STORE", "prune": "prune STORE", "expire": "expire STORE", "rekey": "rekey STORE",
    "fork": "fork",
    "rewind": "rewind", "stats": "stats STORE", "search": "search STORE QUERY",
    "diff": "diff STORE A B", "export_thread": "export", "import_bundle": "import",
    "delete_thread": "delete-thread", "delete": "delete", "copy_threads": "copy",
}

_KEY = "--key-file FILE (or CAS_KEY)"

# Whole phrases first, in order: where a literal rewrite would read badly.
_PHRASES: list[tuple[re.Pattern[str], str]] = [(re.compile(p), r) for p, r in (
    (r"(?:CheckpointStore\.open\(url, )?encryption=\[new(?:_key)?, old(?:_key)?\]\)?",
     "--key-file NEW --key-file OLD"),
    (r"\(encryption=Key\.from_env\('CAS_KEY'\)\)", "(--key-file FILE or CAS_KEY)"),
    (r"encryption=Key\.from_env\('CAS_KEY'\)", _KEY),
    (r"encryption='keyless'", "--keyless"),
    (r"without encryption=", "without --key-file, --keyless or CAS_KEY"),
    (r"verify\(deep=False\)", "verify without --deep"),
    (r"gc_mark\(shard=i, of=(\w+)\) for each share i from 1 to (\w+)",
     r"`cas-checkpoint gc STORE --shard I/\1` for each share I from 1 to \2"),
    (r"gc\(from_marks=True\)", "`cas-checkpoint gc STORE --from-marks`"),
    (r"grace=timedelta\(seconds=1\), --grace 1s", "--grace 1s"),
    (r"([a-z_]+)=\S+ \((--[a-z-]+)\)", r"\2"),  # "force=True (--force)": the flag said twice
    (r"threads\(\) lists the threads there are", "`cas-checkpoint threads STORE` lists them"),
    (r"pass regex=False", "leave out --regex"),
    (r"older_than=timedelta\(\.\.\.\)", "--older-than AGE"),
    (r"idle_for=timedelta\(days=30\)", "--idle 30d"),
    (r"Open it without compression= to use its own settings",
     "Leave out --compression and --level to use its own settings"),
    (r"(`cas-checkpoint keygen` or )?Key\.generate\(\)(?:\.to_text\(\))?",
     "`cas-checkpoint keygen`"),
    (r"Key\.from_env\('CAS_KEY'\)", "CAS_KEY"),
    (r"run rekey\b", "run `cas-checkpoint rekey STORE`"),
    (r"pass types=\[[^\]]*\] when opening the store \([^)]*\)",
     "for LangGraph's and LangChain's classes pass --types langgraph"),
    (r"or pass allow_unsafe=True if only one writer ever touches each thread",
     "or, if only one writer ever touches each thread, open the store from Python with "
     "allow_unsafe=True (the command line always refuses such storage)"),
)]

_VALUE = r"('[^']*'|\"[^\"]*\"|\[[^\]]*\]|[\w.]+\([^)]*\)|[\w.\-]+)?"
_ARG = re.compile(r"(?<![\w./-])(" + "|".join(FLAGS) + r")=" + _VALUE)
_LEAD = re.compile(r"^(" + "|".join(FLAGS) + r") (must|is|takes)\b")
_CALL = re.compile(r"(?<![\w./`-])(" + "|".join(COMMANDS) + r")\(\)")
# What a message quotes (a thread id, a URL: ``thread 'force=True'``) is the user's, never
# rewritten; a quoted value of an argument (``compression='zstd'``) is the library's.
_QUOTED = re.compile(r"""((?<![=(\w])'(?:[^'\\]|\\.)*'|(?<![=(\w])"(?:[^"\\]|\\.)*")""")


def _arg(m: re.Match[str]) -> str:
    name, value = m.group(1), m.group(2)
    flag = FLAGS[name]
    if flag is None:
        return m.group(0)
    if value in (None, "True"):
        return flag
    if value in ("False", "None"):
        return f"no {flag}"
    if value.startswith(("'", '"')):
        value = value[1:-1]
    if "(" in value:  # timedelta(hours=1) and the like: the flag's own spelling
        value = "AGE"
    return f"{flag} {value}"


def for_cli(text: str) -> str:
    """``text`` with the Python API's argument and method names said as flags and commands;
    what it quotes is left as it is."""
    parts = _QUOTED.split(text)
    return "".join(part if i % 2 else _said(part) for i, part in enumerate(parts))


def _said(text: str) -> str:
    for pattern, repl in _PHRASES:
        text = pattern.sub(repl, text)
    text = _LEAD.sub(lambda m: f"{FLAGS[m.group(1)] or m.group(1)} {m.group(2)}", text)
    text = _ARG.sub(_arg, text)
    return _CALL.sub(lambda m: f"`cas-checkpoint {COMMANDS[m.group(1)]}`", text)
