"""Secrets out of everything ppd records or prints: command lines, URLs, log lines.

One helper for every place a command line or a URL is written down (a table's meta.json, a
replay's summary.json, an interrupt or resume message, a log line), so a key given on the
command line never lands on disk or on screen:

- the value of a secret flag (`--admin-key K`, `--api-key=K`, `--discovery-token T`, ...),
  also inside a quoted argument that holds a command line of its own (`--proxy-args "..."`);
- the password of a URL (`redis://:PASSWORD@host/0`), whatever flag carries it;
- any argument (or `--flag=` value) equal to a value the caller knows is secret (what argparse
  parsed for a secret flag, so an abbreviation such as `--admin K` is caught too).

A redacted command is for reading, not for pasting back as is: the secrets read `***`.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit, urlunsplit

MASK = "***"

# Every ppd flag that carries a secret, and vLLM's own (passed through --vllm-args).
SECRET_FLAGS = frozenset({
    "--admin-key", "--api-key", "--backend-api-key", "--discovery-token", "--token",
    "--hf-token",
})


def redacted_url(url: str) -> str:
    """The URL without its password (`redis://user:***@host:6379/0`); others unchanged."""
    try:
        parts = urlsplit(url)
        password = parts.password
        port = parts.port
    except ValueError:  # not a URL after all (a bad port, say): nothing to take out
        return url
    if password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:{MASK}@{host}" + (f":{port}" if port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def redacted_argv(argv: Sequence[str], secrets: Iterable[str | None] = ()) -> list[str]:
    """argv with every secret replaced by MASK (see the module docstring)."""
    known = sorted({secret for secret in secrets if secret})
    out: list[str] = []
    hide_next = False
    for token in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        flag, equals, _ = token.partition("=")
        if flag in SECRET_FLAGS:
            if equals:
                out.append(f"{flag}={MASK}")
            else:
                out.append(token)
                hide_next = True
            continue
        out.append(_redacted_token(token, known))
    return out


def _redacted_token(token: str, known: Sequence[str]) -> str:
    if " " in token and token.strip().startswith("-"):
        # A quoted command line of its own (`--proxy-args "--admin-key K --port 1"`).
        try:
            inner = shlex.split(token)
        except ValueError:
            inner = None
        if inner is not None and len(inner) > 1:
            return shlex.join(redacted_argv(inner, known))
    flag, equals, value = token.partition("=")
    if equals and flag.startswith("-"):
        return f"{flag}={_redacted_value(value, known)}"
    return _redacted_value(token, known)


def _redacted_value(value: str, known: Sequence[str]) -> str:
    # Whole values only: a short key must not mask its letters inside other arguments.
    return MASK if value in known else redacted_url(value)


def redacted_command(argv: Sequence[str], secrets: Iterable[str | None] = ()) -> str:
    """`shlex.join` of the redacted argv: the command line as ppd records and prints it."""
    return shlex.join(redacted_argv(argv, secrets))


def rerun_note(command: str) -> str:
    """A line to print under a redacted command the user is told to run again."""
    return f"\n(the secrets above read {MASK}: give yours again)" if MASK in command else ""
