"""The message for a name that is not one of the valid ones: "did you mean", and the list.

    unknown_name("policy", "lcoal", ["pd", "local", ...])
    -> "unknown policy 'lcoal': did you mean local? (policies: pd, local, ...)"
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence


def unknown_name(what: str, name: str, valid: Sequence[str]) -> str:
    """Why `name` is not a `what`: the closest valid names (difflib) and every valid one."""
    close = difflib.get_close_matches(name, list(valid), n=2, cutoff=0.5)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    return f"unknown {what} {name!r}: {hint}({what} names: {', '.join(valid)})"
