"""What the simulated cluster's event loop moves between its parts: the kinds of event, in
the order ties at one instant are handled, and the running records of a node and of a turn in
flight (`profiler.simulator.virtual_cluster` owns the loop; `node_protocol` and `sim_client`
handle the events)."""

from __future__ import annotations

from dataclasses import dataclass

from profiler.engine.engine import Engine
from profiler.engine.frontend import ApiServer
from profiler.engine.transfer import SharedLink
from profiler.simulator.layout import SimNode
from profiler.simulator.sim_proxy import Plan
from profiler.simulator.workload import SimConversation

# Event kinds, in the order ties at one instant are handled.
STEP_END, TRANSFER, TURN, TIMEOUT, SUBMIT, SEND_WAITING, UNPIN, TOKENIZED = range(8)


@dataclass(slots=True)
class NodeRun:
    """One simulated node while the run lasts: its engine, its API server, its link."""

    spec: SimNode
    engine: Engine
    api: ApiServer  # its API server, a FIFO queue (profiler/engine/frontend.py)
    busy: bool = False  # a step is running (its end event is queued)
    link: SharedLink | None = None  # P (and D, for readbacks): the egress port transfers share
    link_event: float | None = None  # the queued completion time of link (None: none queued)


@dataclass(slots=True)
class TurnRun:
    """One turn in flight."""

    conversation: SimConversation
    index: int  # 0-based turn index in the conversation
    request_id: str
    start: float
    prompt: list[int]
    plan: Plan
    done: bool = False
    prefill_id: str | None = None
    preloaded: int = 0  # a readback: prompt tokens P reads from D instead of computing
    # the prompt's block hashes at the engines' block size, when known (a recorded prompt's,
    # hashed once per process), so no node hashes it again (`Request.prompt_hashes`)
    prompt_hashes: tuple[int, ...] | None = None
