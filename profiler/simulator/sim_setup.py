"""What a simulated run is given and what it produces: `SimSetup` (everything besides the
workload: layout, cost preset, policy, link, the client's and the proxy's options) and
`SimResult` (the replay records, the run's virtual length and the cluster's counters).
`profiler.simulator.virtual_cluster` runs one; its parts read the setup from here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from profiler.engine.config import EngineConfig
from profiler.engine.cost import CostModel
from profiler.engine.transfer import Link
from profiler.traces.request_records import RequestRecord
from proxy.live.load_meter import DEFAULT_LOAD_WINDOW_S
from proxy.policies.routing import RoutingPolicy
from proxy.readback.protocol import VLLM_DECODER_BLOCKS_TTL_S
from proxy.shared.vocabulary import Layout, RouteKind

DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class SimSetup:
    """Everything a run needs besides its workload."""

    layout: Layout
    cost: CostModel
    policy: RoutingPolicy
    link: Link
    kv_bytes_per_token: int
    engine: EngineConfig = field(default_factory=EngineConfig)
    timeout_s: float = DEFAULT_TIMEOUT_S
    load_window_s: float = DEFAULT_LOAD_WINDOW_S
    forced: Callable[[int], RouteKind | None] | None = None
    # The paper's benchmark client (scripts/benchmark/comprehensive_benchmark.py in its
    # repository): at most this many requests in flight; a turn due while every connection
    # is busy waits for one, and its TTFT clock runs from when it was due. None: the ideal
    # client (every turn is sent when it is due), as `ppd replay`.
    client_connections: int | None = None
    # The next turn carries each reply as text that the server tokenizes again into other
    # ids, so it misses the prefix cache past the previous prompt (the tiny CPU model's
    # replies never round-trip: docs/engine-model.md). False: the reply's own token ids come
    # back (a model whose text re-tokenizes to what it generated; the paper's assumption).
    reply_retokenized: bool = False
    # D keeps a finished P->D turn's blocks for a readback this long (vLLM's
    # decoder_kv_blocks_ttl, as `ppd cluster up` sets it); None: no readback route.
    readback_ttl_s: float | None = VLLM_DECODER_BLOCKS_TTL_S
    # The paper's client sends the reply back as text: of a reply of n tokens, the first
    # kept_reply(n) keep their ids (and hit), the rest come back as new ids
    # (`paper_client.kept_reply_tokens`). None: as reply_retokenized says.
    kept_reply: Callable[[int], int] | None = None
    # The paper's proxy places a new conversation on node `hash(conversation) % n` of each
    # role and keeps it there (`sim_proxy.hashed_placement`); this seeds that hash (Python's
    # str hash is drawn per proxy process). None: ppd's pool, the least loaded node.
    placement_seed: int | None = None
    # The conversation and turn the proxy sees for a client's (conversation, turn): the
    # paper's proxy names a conversation by its prompt's text, and some turn 2s are a new
    # conversation to it (`paper_client.proxy_conversation`). None: the client's own.
    proxy_names: Callable[[str, int], tuple[str, int]] | None = None


@dataclass(slots=True)
class SimResult:
    """What a run produced: the records, its virtual length, and cluster-side counters."""

    records: list[RequestRecord]
    wall_time_s: float  # virtual seconds from the first arrival window's start to the last end
    n_conversations: int
    kv_bytes_moved: float
    node_stats: dict[str, Any]
