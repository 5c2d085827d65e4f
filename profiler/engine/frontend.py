"""A node's API server as a queue: requests reach its engine one at a time.

vLLM's API server runs one asyncio event loop per node (`vllm serve` without
`--api-server-count`): it parses each request, preprocesses its prompt and hands it to the
engine-core process, and it streams every running request's tokens on the same loop. A burst
of simultaneous requests is therefore taken in turn: the k-th waits for the k - 1 before it.
`ApiServer` is that FIFO server: each request holds it for `HostModel.frontend_service_ms`,
then reaches the engine `HostModel.frontend_s` after its service began (the rest of the front
end - the HTTP hop, the first token's way back - is latency, not the loop's time). With
`frontend_service_ms` 0 it is the fixed delay per request it replaces.

Measured on real vLLM 0.24 (profiler/engine/data/h100_vllm_0_24, phase C): the time outside
the engine of B requests launched together grows ~linearly in B (3.5 ms for one, ~48 for 30,
103-141 for 100); `measured.fit_host` fits the service time on it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from profiler.engine.host import HostModel


@dataclass(slots=True)
class ApiServer:
    """One node's API server: a FIFO queue with a fixed service time per request.

    `service_s` is how long a request holds the event loop; `reach_s(prompt_tokens, running)`
    how long after its service began its engine sees it. The simulator builds one from its
    `HostModel` (`for_host`); an emulated node from its NodeSpec, on the real clock."""

    service_s: float
    reach_s: Callable[[int, int], float]
    free_at: float = 0.0  # when the event loop is next free (seconds, the caller's clock)

    @classmethod
    def for_host(cls, host: HostModel) -> ApiServer:
        return cls(host.frontend_service_ms / 1000, host.frontend_s)

    def admit(self, now: float, prompt_tokens: int, running: int = 0) -> float:
        """A request reaches the API server at `now`: when its engine sees it (seconds).
        `running` is the engine's batch as it arrives (`HostModel.frontend_per_running_ms`)."""
        start = max(now, self.free_at)
        self.free_at = start + self.service_s
        return start + self.reach_s(prompt_tokens, running)
