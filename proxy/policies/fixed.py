"""`--policy fixed --x F`: turn 2+ local with probability x, drawn from a stable hash of
(session, turn), so a rerun routes the same turns the same way."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from proxy.policies.base import Inputs, Turn, disaggregated_default
from proxy.shared.options import option
from proxy.shared.vocabulary import Decision, Reason, RouteKind

NAME = "fixed"
LABEL_HELP = "x=F"


@dataclass(frozen=True)
class Flags:
    x: float | None = option(None, "policy fixed: share of turn 2+ run locally, in [0, 1]",
                             metavar="F")

_LABEL = "x="


def stable_fraction(session_id: str, turn: int) -> float:
    """A deterministic draw in [0, 1) per (session, turn); unlike hash(), stable across runs."""
    digest = hashlib.blake2b(f"{session_id}\x00{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def check(config: Any) -> None:
    if config.x is None:
        raise ValueError("policy fixed needs --x F (the share of turn 2+ run locally)")


def check_flags(config: Any) -> None:
    """--x is checked whichever policy is chosen (a config file may carry it)."""
    if config.x is not None and not (0.0 <= config.x <= 1.0):
        raise ValueError(f"--x must be in [0, 1], got {config.x}")


def label(config: Any) -> str:
    return f"{_LABEL}{config.x:.2g}"


def parse_label(text: str, table: Any) -> dict[str, Any] | None:
    if not text.startswith(_LABEL):
        return None
    try:
        return {"x": float(text[len(_LABEL):])}
    except ValueError:
        raise ValueError(f"bad policy {text!r}: x=F wants a number in [0, 1]") from None


def local_share(config: Any) -> float:
    return float(config.x)


def describe(config: Any) -> str:
    return f"x={config.x:g}"


def decide(turn: Turn, inputs: Inputs) -> Decision:
    """Local for a stable share x of the turns that could run locally."""
    default = disaggregated_default(turn)
    if default is not None:
        return default
    x = inputs.config.x or 0.0
    local = stable_fraction(turn.session_id, turn.workload.turn) < x
    return Decision(RouteKind.LOCAL if local else RouteKind.PD, Reason.DRAW)
