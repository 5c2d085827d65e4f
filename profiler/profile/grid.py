"""What `ppd profile` measures: the grid of cells, from flags or a YAML file, validated once.

Apart from the runner (profiler.profile.runner, which needs pandas and numpy) so that the
command's parser and its usage errors do not import them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from proxy.shared.discretize import (
    PAPER_CONTEXTS,
    TURN1_PROFILES,
    WORKLOAD_SHAPES,
    Cell,
    ContextClass,
)

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


def read_grid_file(path: Path) -> dict[str, Any]:
    """The keys of a YAML grid file, each checked for its type; every error names the file."""
    import yaml  # only a grid file needs it

    try:
        with path.open() as stream:  # (a stream: PyYAML's own marks then name the file too)
            loaded = yaml.safe_load(stream) or {}
    except yaml.YAMLError as error:
        raise ValueError(f"{path}: not valid YAML ({_yaml_problem(error)})") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"{path}: a grid file is a YAML mapping (`qps: [0.5, 1]`, ...)")
    return checked_grid_values(loaded, source=str(path))


def grid_from_mapping(values: Mapping[str, Any]) -> ProfileGrid:
    """A grid from a YAML mapping (or flags); unknown keys are errors, not silently ignored."""
    kwargs = checked_grid_values(values)
    if "contexts" in kwargs:
        kwargs["contexts"] = tuple(_context(name) for name in kwargs["contexts"])
    if "qps" in kwargs:
        kwargs["qps"] = tuple(float(q) for q in kwargs["qps"])
    return ProfileGrid(**kwargs)


def checked_grid_values(values: Mapping[str, Any], source: str | None = None) -> dict[str, Any]:
    """values with unknown keys refused and each key's type checked, list keys as tuples;
    errors start with source (the grid file) when given."""
    where = f"{source}: " if source else ""
    unknown = sorted(set(values) - GRID_KEYS)
    if unknown:
        raise ValueError(f"{where}unknown grid key(s) {unknown}; known: {sorted(GRID_KEYS)}")
    checked: dict[str, Any] = {}
    for key, value in values.items():
        if key in _LIST_KEYS:
            checked[key] = _checked_list(key, value, where)
        else:
            what, fits = _SCALAR_KEYS[key]
            if not fits(value):
                raise ValueError(f"{where}`{key}` must be {what} (got {value!r})")
            checked[key] = value
    return checked


def _checked_list(key: str, value: Any, where: str) -> tuple[Any, ...]:
    what, fits = _LIST_KEYS[key]
    # A bare item (`qps: 1`, `contexts: small`) is what a user means by a one-point axis, so
    # it is taken as a one-item list; a string is one item, never iterated char by char.
    items = list(value) if isinstance(value, list | tuple) else [value]
    if not all(fits(item) for item in items):
        raise ValueError(f"{where}`{key}` must be a list of {what} (got {value!r})")
    return tuple(items)


def _is_number(value: Any) -> bool:
    # YAML reads yes/true as booleans, which Python counts as ints; .inf and .nan are floats
    return isinstance(value, int | float) and not isinstance(value, bool) \
        and math.isfinite(value)


def _is_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_LIST_KEYS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "contexts": ("context class names", lambda item: isinstance(item, str)),
    "workloads": ("workload names", lambda item: isinstance(item, str)),
    "qps": ("numbers", _is_number),
}
_SCALAR_KEYS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "duration_s": ("a number of seconds", _is_number),
    "timeout_s": ("a number of seconds", _is_number),
    "warmup_conversations": ("a whole number", _is_whole),
    "max_conversations": ("a whole number >= 1, or null for no cap",
                          lambda value: value is None or (_is_whole(value) and value >= 1)),
}


def _yaml_problem(error: Exception) -> str:
    """PyYAML's problem and where it is (the caller names the file)."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else problem


def _context(name: str) -> ContextClass:
    try:
        return ContextClass(name)
    except ValueError:
        raise ValueError(
            f"unknown context class {name!r}; known: {', '.join(c.value for c in ContextClass)}"
        ) from None


__all__ = ["GRID_KEYS", "ProfileGrid", "checked_grid_values", "grid_from_mapping",
           "read_grid_file"]
