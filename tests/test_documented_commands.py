"""Every `ppd` command in a code block of the README or docs/ parses as written.

Nine documented `ppd sim grid` commands once lacked the required `--out` and stopped at a
usage error. This parses each one with the real CLI and stops it right after its own parser
accepted the arguments, so nothing runs: a renamed or removed flag, a missing required one or
a bad value fails here with the doc's file and line. Checks made after parsing (files that
must exist, flags that need each other) are the commands' own tests'."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from profiler.cli import main as ppd
from proxy.shared.vocabulary import PRODUCT

REPO = Path(__file__).resolve().parents[1]
SHELL_VARIABLE = re.compile(r"\$\{?\w+\}?")
# A line the program printed: its name and command words, then a colon.
PROGRAM_SPEAKS = re.compile(rf"^{PRODUCT}(?: [a-z][a-z-]*)*: ")


def documented_commands() -> list[tuple[str, str]]:
    """(where, command) for each `ppd ...` line of a fenced block, continuations joined,
    the shell around it (comments, `&`, pipes, redirections) cut off, and shell variables
    given a sample value; lines that elide arguments (`...`) are left out."""
    found = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        text = doc.read_text()
        for block in re.finditer(r"```[^\n]*\n(.*?)```", text, flags=re.S):
            first_line = text[:block.start()].count("\n") + 2
            joined = re.sub(r"\\\n\s*", " ", block.group(1))
            for line in joined.splitlines():
                command = re.split(r"\s#|\s\|\s|\s&&\s|\s2?>\s|;", line.strip())[0]
                command = command.rstrip("& ").strip()
                if not command.startswith(f"{PRODUCT} ") or "..." in command:
                    continue
                if PROGRAM_SPEAKS.match(command):
                    continue  # output the command printed (`ppd sim plan: warning: ...`)
                found.append((f"{doc.relative_to(REPO)} (block from line {first_line})",
                              SHELL_VARIABLE.sub("1", command)))
    return found


class _Parsed(BaseException):
    """Raised once a command's own parser accepted its arguments: nothing runs after it
    (a BaseException, so the CLI's error boundary does not catch it)."""


def test_the_docs_have_ppd_commands_to_check() -> None:
    commands = {command.split()[1] for _, command in documented_commands()}
    assert {"cluster", "proxy", "replay", "profile", "sim", "table"} <= commands


def test_every_documented_ppd_command_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    parse_args = argparse.ArgumentParser.parse_args
    parse_known_args = argparse.ArgumentParser.parse_known_args

    def stop_after_parsing(original):
        def parse(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            if self.prog != PRODUCT:  # the top-level parser only picks the command
                raise _Parsed
            return result
        return parse

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop_after_parsing(parse_args))
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args",
                        stop_after_parsing(parse_known_args))
    broken = []
    for where, command in dict.fromkeys(documented_commands()):
        errors = io.StringIO()
        try:
            with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
                code = ppd(shlex.split(command)[1:])
        except _Parsed:
            continue
        except SystemExit as exit_:
            code = exit_.code
        if code != 0:  # 0: a top-level flag (--version, --help) that needs no command parser
            last = (errors.getvalue().strip().splitlines() or ["(no message)"])[-1]
            broken.append(f"{where}: {command}\n    -> {last}")
    assert not broken, "documented commands that do not parse:\n" + "\n".join(broken)
