"""argparse types for the numbers the offline tools take, so a bad one is refused at parse
time with a message in words (`ppd sim grid: error: argument --processes: ...`) instead of
surfacing later as a Python error or a silent nonsense run (NaN weights, -2 processes)."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path


def positive_int(text: str) -> int:
    """A count that must be at least 1 (processes, turns, conversations)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {value})")
    return value


def weight(text: str) -> float:
    """A routing weight (w_ttft, w_tpot): a finite number >= 0, as the proxy requires."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0 (got {text})")
    return value


def output_file(text: str) -> Path:
    """A file a long command writes at its end (`ppd sim grid --out`, `ppd profile --out`):
    refused now, not after minutes of work, when it is a folder or its nearest existing
    folder cannot be written (folders below that are made when it is written)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file name in it")
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text}: {folder} is not a writable folder")
    return path


def refuse_both(argv: list[str], new: str, old: str) -> None:
    """A flag and its old alias share one value and argparse keeps the last silently
    (`--conversation-rate 2 --qps 1` ran at 1): given both, say so."""
    given = {name for name in (new, old)
             if any(arg == name or arg.startswith(f"{name}=") for arg in argv)}
    if len(given) == 2:
        raise ValueError(f"{new} and {old} are one option ({old} is its old name): give one")
