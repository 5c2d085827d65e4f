"""`Limits`: how many bytes and things from outside the proxy reads before it refuses them.

Every input that enters the proxy - a client's body, a node's answer, a heartbeat, a KV event,
a readback book entry - is bounded in bytes (and in count where a count is what costs) before
it is parsed or kept. Each bound is a flag with a default no real deployment reaches
(docs/robustness.md, "Bytes before parsing"); a request over one gets an error naming the flag.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.shared.options import option

MIB = 1024 * 1024


class LimitError(ValueError):
    """A limit flag with an impossible value."""


@dataclass(frozen=True, slots=True)
class Limits:
    """The byte and count bounds on outside input (one flag each)."""

    max_messages: int = option(
        10_000, "refuse (400) a chat request with more than N messages (a long agent transcript "
        "has a few thousand)", metavar="N")
    max_answer_bytes: int = option(
        64 * MIB, "refuse (502) a node's non-streamed answer longer than N bytes (32k tokens "
        "with 20 logprobs each are ~40 MB)", metavar="N")
    max_stream_event_bytes: int = option(
        8 * MIB, "refuse (502, or an in-band error once streaming) a node's stream event "
        "longer than N bytes without an end", metavar="N")
    discovery_max_nodes: int = option(
        512, "--discovery registers at most N nodes; heartbeats of new nodes past it are "
        "dropped and counted", metavar="N")
    discovery_registrations_per_s: float = option(
        20.0, "--discovery registers at most this many new nodes a second (a burst of 4 "
        "seconds' worth; heartbeats of known nodes are not limited)", metavar="R")
    kv_clock_skew: float = option(
        300.0, "policy live: a KV event batch stamped more than S seconds ahead of the proxy's "
        "clock, or numbered more than 2^32 past the last, is rejected and counted", metavar="S")
    readback_book_bytes: int = option(
        64 * MIB, "bytes of readback parameters the proxy keeps (oldest dropped first)",
        metavar="N")

    def __post_init__(self) -> None:
        for name in ("max_messages", "max_answer_bytes", "max_stream_event_bytes",
                     "discovery_max_nodes", "readback_book_bytes"):
            if getattr(self, name) < 1:
                raise LimitError(f"--{name.replace('_', '-')} must be >= 1")
        for name in ("discovery_registrations_per_s", "kv_clock_skew"):
            value = getattr(self, name)
            if not 0 < value < float("inf"):
                raise LimitError(f"--{name.replace('_', '-')} must be a positive number")
