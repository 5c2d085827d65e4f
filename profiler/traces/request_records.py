"""What a run records of each turn: one `RequestRecord` as the client saw it.

The replay client (`profiler.replay.client`, over HTTP) and the simulator
(`profiler.simulator`, on its virtual clock) both write them, and the metrics, outputs and
reports read them; neither side owns the type, so neither imports the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One turn as the client saw it. Times in seconds; start_s from the replay's start."""

    conversation_id: str
    turn: int  # 1-based
    route: str | None  # x-ppd-route
    decode: str | None  # x-ppd-decode
    prefill: str | None  # x-ppd-prefill
    start_s: float
    ttft_s: float | None
    tpot_s: float | None  # (e2e - ttft) / (output tokens - 1); None below 2 tokens
    e2e_s: float | None
    itl_s: tuple[float, ...]  # gaps between successive streamed chunks with text or reasoning
    n_input_tokens: int | None  # from usage
    n_output_tokens: int  # usage when present, else chunks with text
    success: bool  # HTTP 200, >= 1 token, no error, within the timeout
    error: str | None
    status: int | None
    max_tokens: int | None = None
    proxy_turn: int | None = None  # x-ppd-turn, the proxy's view of the turn index
