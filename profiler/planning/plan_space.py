"""What `ppd sim plan` searches: the layouts a number of GPUs fits, and the policies each runs.

A GPU count and a cost preset `GPU:MODEL[:tpN]` give the instances (vLLM servers): GPUs // N.
The layouts of n instances are every P:D split (1P(n-1)D ... (n-1)P1D), n replicas (nR) and
hybrids (replicas beside P and D). The search is pruned, and says how (`Space.notes`):
- more than MAX_SIMULATED instances are simulated as k equal slices of n/k instances, one
  slice at 1/k of the traffic (each slice routed on its own, as a proxy per slice would):
  k = ceil(n / MAX_SIMULATED), a slice n // k instances (the remainder, if any, left out
  and said so);
- more than MAX_SPLITS P:D splits are thinned to MAX_SPLITS spread evenly over the P share;
- hybrids are not enumerated (n = 8 has 21): they are placed after the P:D splits are
  screened, with replicas taking 1, n/4 or n/2 of the instances and P:D keeping the best
  split's P share (`hybrids_near`).
Policies by layout: replicas alone run `replica`, P/D layouts the P/D policies asked for,
hybrids the policies that place conversations on replicas (`live`); others leave R idle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from proxy.policies import live as live_policy
from proxy.policies import local as local_policy
from proxy.policies import pd as pd_policy
from proxy.policies import ppd as ppd_policy
from proxy.policies import registry
from proxy.policies import replica as replica_policy
from proxy.shared.vocabulary import Layout

MAX_SIMULATED = 16  # instances simulated at once (a bigger cluster is simulated in slices)
MAX_SPLITS = 8  # P:D splits screened
DEFAULT_POLICIES = (pd_policy.NAME, local_policy.NAME, live_policy.NAME, ppd_policy.NAME)
HYBRID_POLICIES = (live_policy.NAME,)  # the policies that send conversations to replicas
MAX_GPUS = 64


@dataclass(frozen=True, slots=True)
class Space:
    """The cluster a plan searches: instances, how they are simulated, the P:D splits."""

    gpus: int
    tp: int
    instances: int  # vLLM servers of tp GPUs each
    slices: int  # the cluster simulated as this many equal slices (1: whole)
    splits: tuple[str, ...]  # the P:D layouts screened, at simulated (slice) size
    replica_layout: str | None  # nR at slice size (None: a single instance has no choice)
    notes: tuple[str, ...] = field(default=())

    @property
    def simulated(self) -> int:
        """Instances in one simulated slice."""
        return self.instances // self.slices

    def full_name(self, layout: str) -> str:
        """A slice's layout at the cluster's size (`2P6D` x 4 slices -> `8P24D`)."""
        if self.slices == 1:
            return layout
        parsed = Layout.parse(layout)
        return Layout(parsed.prefill * self.slices, parsed.decode * self.slices,
                      parsed.replica * self.slices).name


def tp_of(cost: str) -> int:
    """The tensor parallelism a cost preset names (`h100:llama-3.1-70b:tp4` -> 4; 1 if none)."""
    for part in cost.partition("@")[0].split(":")[2:]:
        if part.startswith("tp") and part[2:].isdigit():
            return int(part[2:])
    return 1


def plan_space(gpus: int, cost: str, *, max_splits: int = MAX_SPLITS,
               max_simulated: int = MAX_SIMULATED) -> Space:
    """The layouts `gpus` GPUs fit with the preset's tensor parallelism (module docstring)."""
    if not 1 <= gpus <= MAX_GPUS:
        raise ValueError(f"--gpus must be between 1 and {MAX_GPUS} (got {gpus})")
    tp = tp_of(cost)
    instances = gpus // tp
    if instances < 1:
        raise ValueError(f"--gpus {gpus} cannot hold one instance of {cost} ({tp} GPUs each): "
                         f"give at least {tp} GPUs")
    notes = []
    if gpus % tp:
        notes.append(f"{gpus % tp} GPU(s) left idle: {instances} instances of tp{tp}")
    slices = _slices(instances, max_simulated)
    size = instances // slices
    if slices > 1:
        spare = instances - slices * size
        notes.append(f"{instances} instances simulated as {slices} slices of {size}, one slice "
                     f"at 1/{slices} of the traffic (a proxy per slice)"
                     + (f"; {spare} instance(s) left out of the slices" if spare else ""))
    splits = [Layout(p, size - p).name for p in range(1, size)]
    if len(splits) > max_splits:
        kept = sorted({round(1 + i * (size - 2) / (max_splits - 1)) for i in range(max_splits)})
        notes.append(f"{len(splits)} P:D splits thinned to {len(kept)} "
                     f"({', '.join(Layout(p, size - p).name for p in kept)})")
        splits = [Layout(p, size - p).name for p in kept]
    replica = Layout(replica=size).name if size >= 1 else None
    if size == 1:
        notes.append("one instance: it serves alone (1R); there is no layout to choose")
    return Space(gpus=gpus, tp=tp, instances=instances, slices=slices, splits=tuple(splits),
                 replica_layout=replica, notes=tuple(notes))


def _slices(instances: int, max_simulated: int) -> int:
    return math.ceil(instances / max_simulated)


def hybrids_near(space: Space, p_share: float) -> list[str]:
    """Hybrid layouts of one slice: R = 1, n/4, n/2 instances, the rest split as P share
    p_share (the best P:D split's), rounded, each role at least one."""
    size = space.simulated
    out: list[str] = []
    for replicas in sorted({1, size // 4, size // 2}):
        rest = size - replicas
        if replicas < 1 or rest < 2:
            continue
        prefill = min(max(round(rest * p_share), 1), rest - 1)
        name = Layout(prefill, rest - prefill, replicas).name
        if name not in out:
            out.append(name)
    return out


def policies_for(layout: str, policies: tuple[str, ...]) -> list[str]:
    """The asked-for policies that apply to a layout (module docstring)."""
    parsed = Layout.parse(layout)
    if not parsed.disaggregated:
        return [replica_policy.NAME]
    if parsed.replica:
        return [label for label in policies if _name(label) in HYBRID_POLICIES]
    return [label for label in policies
            if not registry.get(_name(label)).replicas_only]


def _name(label: str) -> str:
    """A label's policy name (a table-needing label parses with a stand-in: only the name
    is read here)."""
    return registry.parse_label(label, lambda: Path("table.csv"))[0]


def p_share(layout: str) -> float:
    parsed = Layout.parse(layout)
    return parsed.prefill / max(parsed.prefill + parsed.decode, 1) if parsed.prefill else math.nan
