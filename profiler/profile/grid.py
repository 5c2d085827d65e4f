"""What `ppd profile` measures: the grid of cells, from flags or a YAML file, validated once.

Apart from the runner (profiler.profile.runner, which needs pandas and numpy) so that the
command's parser and its usage errors do not import them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from proxy.discretize import PAPER_CONTEXTS, TURN1_PROFILES, WORKLOAD_SHAPES, Cell, ContextClass

GRID_KEYS = frozenset(
    {"contexts", "workloads", "qps", "duration_s", "warmup_conversations", "timeout_s",
     "max_conversations"}
)


@dataclass(frozen=True, slots=True)
class ProfileGrid:
    """What to measure. Built once from flags or a YAML file, validated here."""

    # huge (an 8k-token turn 1) is opt-in: far too slow for the CPU cluster, too long for its
    # max_model_len.
    contexts: tuple[ContextClass, ...] = PAPER_CONTEXTS
    workloads: tuple[str, ...] = tuple(WORKLOAD_SHAPES)
    qps: tuple[float, ...] = (0.5, 1.0)
    duration_s: float = 60.0
    warmup_conversations: int = 2
    timeout_s: float = 60.0
    max_conversations: int | None = None

    def __post_init__(self) -> None:
        for context in self.contexts:
            if context not in TURN1_PROFILES:
                raise ValueError(
                    f"context class {context!r} has no turn-1 profile; "
                    f"profilable: {', '.join(TURN1_PROFILES)}"
                )
        unknown = [name for name in self.workloads if name not in WORKLOAD_SHAPES]
        if unknown:
            raise ValueError(
                f"unknown workload shape(s) {unknown}; known: {', '.join(WORKLOAD_SHAPES)}"
            )
        if not self.contexts or not self.workloads or not self.qps:
            raise ValueError("the grid needs at least one context, workload and qps point")
        if any(q <= 0 for q in self.qps):
            raise ValueError(f"qps points must be > 0, got {list(self.qps)}")
        # Named by flag and grid key: the grid comes from flags or a YAML file.
        for flag, key, value in (("--duration", "duration_s", self.duration_s),
                                 ("--timeout", "timeout_s", self.timeout_s)):
            if not value > 0:
                raise ValueError(f"{flag} (grid key {key}) must be > 0 seconds, got {value:g}")
        if self.warmup_conversations < 0:
            raise ValueError("--warmup (grid key warmup_conversations) must be >= 0, got "
                             f"{self.warmup_conversations}")

    def cells(self) -> list[Cell]:
        return [
            Cell(context, workload, float(qps))
            for context in self.contexts
            for workload in self.workloads
            for qps in self.qps
        ]

    def as_meta(self) -> dict[str, Any]:
        record = asdict(self)
        record["contexts"] = [str(context) for context in self.contexts]
        return record


def grid_from_mapping(values: Mapping[str, Any]) -> ProfileGrid:
    """A grid from a YAML mapping; unknown keys are errors, not silently ignored."""
    unknown = sorted(set(values) - GRID_KEYS)
    if unknown:
        raise ValueError(f"unknown grid key(s) {unknown}; known: {sorted(GRID_KEYS)}")
    kwargs: dict[str, Any] = dict(values)
    if "contexts" in kwargs:
        kwargs["contexts"] = tuple(_context(name) for name in kwargs["contexts"])
    for key in ("workloads", "qps"):
        if key in kwargs:
            kwargs[key] = tuple(kwargs[key])
    if "qps" in kwargs:
        kwargs["qps"] = tuple(float(q) for q in kwargs["qps"])
    return ProfileGrid(**kwargs)


def _context(name: str) -> ContextClass:
    try:
        return ContextClass(name)
    except ValueError:
        raise ValueError(
            f"unknown context class {name!r}; known: {', '.join(c.value for c in ContextClass)}"
        ) from None


__all__ = ["GRID_KEYS", "ProfileGrid", "grid_from_mapping"]
