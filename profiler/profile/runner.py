"""`ppd profile`: measure the routes of every grid cell and write the decision table.

For each cell (context class, turn-2 workload shape, qps point) the profiler replays synthetic
two-turn conversations through the proxy at that load for a fixed duration, once with turn 2
forced to `pd` (x=0) and once forced to `local` (x=1) by the `x-ppd-route` request header,
and with `--readback` once more forced to `readback` (P reads the history back from D;
docs/readback.md), and records turn-2 TTFT/TPOT (mean and p99), success rate and request
counts. Turn 1 always goes P->D: it only builds the context D holds. With readback profiled,
every route's turn 1 is sent whole (not streamed), since D names its blocks only in a whole
answer: the three routes then see the same turn 1.

Bias control: cells run in a seeded random order and the two routes of a cell in a seeded random
order, so slow drift (thermal, page cache, a filling prefix cache) does not favour one route;
every (cell, route, phase) replay uses its own conversations, so one route never reuses the
other's cached turn 1. The output CSV is rewritten after every cell, and a re-run skips the cells
it already holds (resumable). Conversations are drawn from `conversation_seed(seed, cell, route,
phase)`, a hash of what they are for: a resumed run draws for a cell exactly what a fresh run
would have drawn.

Token counts follow proxy.tokens (TOKEN_DEFINITION, recorded in the table's meta with the
tokenizer used): a synthetic turn 2 made for a cell is the turn the proxy files under that cell.

Units: a qps point is requests (conversation turns) per second, the unit of the proxy's load
meter, so the proxy's measured load maps onto the table's points. Each conversation has
TURNS_PER_CONVERSATION turns, so conversations arrive at qps / TURNS_PER_CONVERSATION per second.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import random
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd

# The grid lives apart (no pandas) for the command's parser; re-exported for callers.
from profiler.profile.grid import GRID_KEYS as GRID_KEYS
from profiler.profile.grid import ProfileGrid as ProfileGrid
from profiler.profile.grid import grid_from_mapping as grid_from_mapping
from profiler.replay.client import ReplayConfig, replay
from profiler.tables.io import KEY_COLUMNS, meta_path, normalize, read_table, write_table
from profiler.traces.request_records import RequestRecord
from profiler.traces.synthetic import two_turn_conversations
from proxy.shared.discretize import TURN1_PROFILES, Cell
from proxy.shared.tokens import TOKEN_DEFINITION, EstimateTokenCounter, TokenCounter
from proxy.shared.vocabulary import RouteKind

PROFILED_ROUTES: tuple[RouteKind, ...] = (RouteKind.PD, RouteKind.LOCAL)
WITH_READBACK: tuple[RouteKind, ...] = (*PROFILED_ROUTES, RouteKind.READBACK)
TURNS_PER_CONVERSATION = 2
@dataclass(frozen=True, slots=True)
class RouteStats:
    """Turn-2 measurements of one route in one cell."""

    ttft_ms: float
    tpot_ms: float
    ttft_p99_ms: float
    tpot_p99_ms: float
    success: float
    n_requests: int


def turn2_stats(records: Sequence[RequestRecord], route: RouteKind) -> RouteStats:
    """Summarize the turn-2+ records of a forced-route run.

    Success counts every turn-2+ request sent. Latencies come only from successful requests
    that really took the forced route (a failover reroute would measure the other route).
    """
    later = [record for record in records if record.turn >= 2]
    ok = [r for r in later if r.success and (r.route is None or r.route == route.value)]
    ttfts = [r.ttft_s * 1000 for r in ok if r.ttft_s is not None]
    tpots = [r.tpot_s * 1000 for r in ok if r.tpot_s is not None]
    success = sum(r.success for r in later) / len(later) if later else 0.0
    return RouteStats(
        ttft_ms=_mean(ttfts),
        tpot_ms=_mean(tpots),
        ttft_p99_ms=_p99(ttfts),
        tpot_p99_ms=_p99(tpots),
        success=success,
        n_requests=len(later),
    )


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if values else math.nan


def _p99(values: Sequence[float]) -> float:
    return float(np.percentile(values, 99)) if values else math.nan


def cell_row(cell: Cell, stats: Mapping[RouteKind, RouteStats]) -> dict[str, Any]:
    """One table row: TABLE_COLUMNS plus the extras, from every profiled route's stats."""
    row: dict[str, Any] = {
        "context_class": str(cell.context_class),
        "workload": cell.workload,
        "qps": cell.qps,
        "n_requests": min(route_stats.n_requests for route_stats in stats.values()),
    }
    for route, route_stats in stats.items():
        row[f"{route}_ttft_ms"] = route_stats.ttft_ms
        row[f"{route}_tpot_ms"] = route_stats.tpot_ms
        row[f"{route}_success"] = route_stats.success
        row[f"{route}_ttft_p99_ms"] = route_stats.ttft_p99_ms
        row[f"{route}_tpot_p99_ms"] = route_stats.tpot_p99_ms
        row[f"{route}_n_requests"] = route_stats.n_requests
    return row


def cell_key(context_class: str, workload: str, qps: float) -> tuple[str, str, float]:
    return (str(context_class), str(workload), round(float(qps), 6))


def measured_keys(frame: pd.DataFrame) -> set[tuple[str, str, float]]:
    return {cell_key(*values) for values in frame[list(KEY_COLUMNS)].itertuples(index=False)}


class ReplayPurpose(enum.StrEnum):
    """What a replay of a (cell, route) is for."""

    WARMUP = "warmup"
    MEASURE = "measure"


def conversation_seed(seed: int, cell: Cell, route: RouteKind, phase: ReplayPurpose) -> int:
    """The seed of the conversations one (cell, route, phase) replays.

    A hash of the run's seed and what the conversations are for - not of the cell's place in
    the run - so resuming, reordering or a smaller grid never changes a cell's conversations,
    and no two (cell, route, phase) replays share a conversation.
    """
    key = (f"ppd-profile:{seed}:{cell.context_class}:{cell.workload}:{float(cell.qps)!r}:"
           f"{route}:{phase}")
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


def run_order(cells: Sequence[Cell], seed: int,
              routes: Sequence[RouteKind] = PROFILED_ROUTES,
              ) -> list[tuple[Cell, tuple[RouteKind, ...]]]:
    """Cells shuffled, and each cell's routes in a random order (both seeded)."""
    rng = random.Random(seed)
    order = list(cells)
    rng.shuffle(order)
    plans = []
    for cell in order:
        shuffled = list(routes)
        rng.shuffle(shuffled)
        plans.append((cell, tuple(shuffled)))
    return plans


@dataclass
class Profiler:
    """Drives one grid through a proxy at `target`; writes the table after every cell."""

    grid: ProfileGrid
    target: str
    out_csv: Path
    meta: dict[str, Any]
    seed: int = 0
    model: str | None = None
    tokenizer: TokenCounter | None = None
    admin_key: str | None = None
    progress: bool = True
    transport: httpx.AsyncBaseTransport | None = None
    on_cell: Callable[[Cell, dict[str, Any]], None] | None = None
    routes: tuple[RouteKind, ...] = PROFILED_ROUTES  # WITH_READBACK: the third route too
    rows: list[dict[str, Any]] = field(default_factory=list)

    async def run(self) -> pd.DataFrame:
        done: set[tuple[str, str, float]] = set()
        if self.out_csv.exists():
            _check_token_definition(meta_path(self.out_csv))
            previous = read_table(self.out_csv)
            self.rows = previous.to_dict("records")
            done = measured_keys(previous)
        plans = [
            (cell, routes)
            for cell, routes in run_order(self.grid.cells(), self.seed, self.routes)
            if cell_key(*cell) not in done
        ]
        meta = {**self.meta, "token_definition": TOKEN_DEFINITION,
                "tokenizer": (self.tokenizer or EstimateTokenCounter()).name}
        bar = _progress_bar(len(plans), enabled=self.progress)
        try:
            for cell, routes in plans:
                bar.set_postfix_str(f"{cell.context_class}/{cell.workload}@{cell.qps:g}")
                measured = {route: await self._measure(cell, route) for route in routes}
                row = cell_row(cell, {route: measured[route] for route in self.routes})
                self.rows.append(row)
                write_table(self.rows, self.out_csv, meta)
                if self.on_cell is not None:
                    self.on_cell(cell, row)
                bar.update(1)
        finally:
            bar.close()
        if not self.rows:
            raise RuntimeError("nothing was measured: the grid is empty")
        write_table(self.rows, self.out_csv, meta)
        return normalize(self.rows)

    async def _measure(self, cell: Cell, route: RouteKind) -> RouteStats:
        turn1 = TURN1_PROFILES[cell.context_class]
        conversation_rate = cell.qps / TURNS_PER_CONVERSATION
        count = math.ceil(conversation_rate * self.grid.duration_s * 1.5) + 5
        if self.grid.max_conversations is not None:
            count = min(count, self.grid.max_conversations)
        if self.grid.warmup_conversations:
            warm = two_turn_conversations(
                turn1, cell.workload, self.grid.warmup_conversations,
                seed=conversation_seed(self.seed, cell, route, ReplayPurpose.WARMUP),
                tokenizer=self.tokenizer,
            )
            await replay(warm, self._config(route, conversation_rate, max_conversations=len(warm),
                                            duration_s=self.grid.duration_s),
                         transport=self.transport)
        conversations = two_turn_conversations(
            turn1, cell.workload, count,
            seed=conversation_seed(self.seed, cell, route, ReplayPurpose.MEASURE),
            tokenizer=self.tokenizer,
        )
        result = await replay(
            conversations,
            self._config(route, conversation_rate, max_conversations=count,
                         duration_s=self.grid.duration_s),
            transport=self.transport,
        )
        stats = turn2_stats(result.records, route)
        refused = next((r for r in result.records if r.status == 401), None)
        if refused is not None:
            # Every later cell would fail the same way: stop now, with the fix.
            raise ValueError(f"the proxy refused the forced route ({refused.error}); pass its "
                             "admin key with --admin-key KEY (the key it was started with)")
        failed = [r for r in result.records if not r.success]
        if failed:
            # The table records the success rate; the operator also needs to see why.
            print(f"warning: {cell.context_class}/{cell.workload}@{cell.qps:g} {route}: "
                  f"{len(failed)}/{len(result.records)} requests failed, first: "
                  f"{failed[0].error}", file=sys.stderr)
        return stats

    def _config(
        self, route: RouteKind, conversation_rate: float, *, max_conversations: int,
        duration_s: float
    ) -> ReplayConfig:
        forced = {"x-ppd-route": route.value}
        if self.admin_key:
            forced["authorization"] = f"Bearer {self.admin_key}"

        def headers_for_turn(turn: int) -> Mapping[str, str]:
            return forced if turn >= 2 else {}

        return ReplayConfig(
            target=self.target,
            qps=conversation_rate,
            duration_s=duration_s,
            model=self.model,
            max_turns=2,
            timeout_s=self.grid.timeout_s,
            seed=self.seed,
            max_conversations=max_conversations,
            headers_for_turn=headers_for_turn,
            whole_turns=(1,) if RouteKind.READBACK in self.routes else (),
        )


def _check_token_definition(path: Path) -> None:
    """Resume only a table whose cells were counted the way this run counts them."""
    try:
        counted = json.loads(path.read_text()).get("token_definition", TOKEN_DEFINITION)
    except (OSError, ValueError, AttributeError):
        return  # no readable meta: nothing says the cells mean something else
    if counted != TOKEN_DEFINITION:
        raise ValueError(f"{path.name}: the table was measured with token definition "
                         f"{counted!r}, this run counts {TOKEN_DEFINITION!r}; resuming would "
                         "mix cells that mean different things (write to another --out)")


class _NoProgress:
    def set_postfix_str(self, text: str) -> None:
        pass

    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(total: int, *, enabled: bool) -> Any:
    if not enabled:
        return _NoProgress()
    from tqdm import tqdm

    return tqdm(total=total, unit="cell", desc="profile", dynamic_ncols=True)
