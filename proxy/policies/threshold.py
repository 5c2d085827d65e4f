"""`--policy threshold --non-cached-tokens N`: local iff the uncached suffix n_in <= N tokens
(llm-d's prefix-based decider)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.policies.base import Inputs, Turn, disaggregated_default
from proxy.shared.options import option
from proxy.shared.vocabulary import Decision, Reason, RouteKind

NAME = "threshold"
_LABEL = "threshold-"
LABEL_HELP = f"{_LABEL}N"


@dataclass(frozen=True)
class Flags:
    non_cached_tokens: int | None = option(
        None, "policy threshold: local iff the uncached suffix has <= N tokens", metavar="N")


def check(config: Any) -> None:
    if config.non_cached_tokens is None:
        raise ValueError("policy threshold needs --non-cached-tokens N")


def check_flags(config: Any) -> None:
    if config.non_cached_tokens is not None and config.non_cached_tokens < 0:
        raise ValueError("--non-cached-tokens must be >= 0")


def label(config: Any) -> str:
    return f"{_LABEL}{config.non_cached_tokens}"


def parse_label(text: str, table: Any) -> dict[str, Any] | None:
    digits = text.removeprefix(_LABEL)
    if digits == text or not digits.isdigit():
        return None
    return {"non_cached_tokens": int(digits)}


def describe(config: Any) -> str:
    return f"non-cached tokens <= {config.non_cached_tokens}"


def decide(turn: Turn, inputs: Inputs) -> Decision:
    """Local iff the turn's new tokens fit under the threshold."""
    default = disaggregated_default(turn)
    if default is not None:
        return default
    limit = inputs.config.non_cached_tokens or 0
    return Decision(RouteKind.LOCAL if turn.workload.n_in <= limit else RouteKind.PD,
                    Reason.THRESHOLD)
