"""Every ``cas-checkpoint ...`` command line of the README and the docs (in code blocks or
inline code) names a subcommand that exists and only options (``--flag``, ``-n``) that
subcommand takes: a page cannot go on teaching a command or an option after it was renamed or
dropped."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from cas_checkpoint.cli.app import parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PLACEHOLDERS = {"COMMAND"}  # "cas-checkpoint COMMAND --help" (the CLI guide)


def command_lines() -> list[tuple[str, list[str]]]:
    """(page, words) of each ``cas-checkpoint`` command on the pages, up to a comment, a shell
    operator or the end of its inline code."""
    found = []
    for page in PAGES:
        for m in re.finditer(r"(?<![\w/-])cas-checkpoint ([^`\n#|&;]*)", page.read_text()):
            if words := m.group(1).split():
                found.append((str(page.relative_to(ROOT)), words))
    return found


def problems(lines: list[tuple[str, list[str]]]) -> list[str]:
    top = parser()
    subs = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices
    found = []
    for page, words in lines:
        line = "cas-checkpoint " + " ".join(words)
        first = words[0]
        if first.startswith("-"):
            if first not in top._option_string_actions:
                found.append(f"{page}: {line}: no option {first}")
            continue
        if first in PLACEHOLDERS:
            continue
        if first not in subs:
            found.append(f"{page}: {line}: no command {first!r}")
            continue
        options = subs[first]._option_string_actions
        for word in words[1:]:
            flag = word.split("=")[0].strip("'\"(),.")
            if re.fullmatch(r"--?[a-zA-Z][\w-]*", flag) and flag not in options:
                found.append(f"{page}: {line}: {first} takes no {flag}")
    return found


def test_the_pages_name_commands() -> None:
    assert len(command_lines()) >= 40


def test_every_command_and_flag_on_the_pages_exists() -> None:
    assert problems(command_lines()) == []


def test_a_dropped_command_or_flag_is_found() -> None:
    assert problems([("x.md", ["gc", "STORE", "--grace", "1h"]),
                     ("x.md", ["log", "STORE", "T", "-n", "2", "-m", "-2"]),
                     ("x.md", ["gc", "STORE", "--no-such-flag"]),
                     ("x.md", ["no-such-command", "STORE"]),
                     ("x.md", ["--no-such-option"])]) == [
        "x.md: cas-checkpoint log STORE T -n 2 -m -2: log takes no -m",
        "x.md: cas-checkpoint gc STORE --no-such-flag: gc takes no --no-such-flag",
        "x.md: cas-checkpoint no-such-command STORE: no command 'no-such-command'",
        "x.md: cas-checkpoint --no-such-option: no option --no-such-option"]
