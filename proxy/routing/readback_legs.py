"""The router's side of a readback (docs/readback.md), one step each: whether the session's D
keeps blocks to read (`status`, asking the book only when it can matter), P's
kv_transfer_params after its /tokenize of the new prompt (`prefill_params`, through the turn
machine's mismatch rule), and what D's whole answer keeps (`answer_and_held`). The wire
formats are `proxy.readback.protocol`'s; the rules `proxy.routing.turn_machine`'s.
"""

from __future__ import annotations

from typing import Any

from proxy.readback import protocol as readback
from proxy.readback.protocol import HeldKV
from proxy.routing.turn_machine import TurnMachine
from proxy.sessions.readbacks import Readbacks
from proxy.sessions.session import Lookup
from proxy.shared.json_codec import dumps, loads
from proxy.shared.validate import Endpoint
from proxy.shared.vocabulary import Reason, RouteKind
from proxy.upstream import forward
from proxy.upstream.legs import Legs


async def status(book: Readbacks | None, reads_back: bool, lookup: Lookup,
                 forced: RouteKind | None) -> Reason | None:
    """None when the session's D keeps blocks P can read back now, else why not; the book
    is asked only when the answer can matter (`reads_back`: a policy that reads it, or a turn
    forced to readback): a shared book is a round trip away."""
    if book is None:
        return Reason.READBACK_MISSING  # the nodes do not offer it
    if forced is not RouteKind.READBACK and not reads_back:
        return Reason.READBACK_MISSING  # this policy never reads back by itself
    return await book.status(lookup)


async def prefill_params(legs: Legs, machine: TurnMachine, prefill_base: str,
                         endpoint: Endpoint, body: dict[str, Any], held: HeldKV,
                         request_id: str) -> dict[str, Any] | None:
    """P's kv_transfer_params reading back the tokens of the new prompt that D's blocks
    hold, by P's own tokenization of the request; None when too few match (the turn goes
    P->D, reason readback_mismatch: `TurnMachine.tokenized`)."""
    answer = await forward.tokenize(legs, prefill_base, readback.tokenize_body(endpoint, body),
                                    f"{request_id}-tokenize")
    matched = machine.tokenized(held, readback.tokenized_ids(answer))
    return readback.prefill_params(held, matched) if matched is not None else None


def answer_and_held(body: bytes, decode: str, now: float,
                    ttl: float) -> tuple[bytes, HeldKV | None]:
    """D's whole answer as the client gets it (without the token ids and block names the
    proxy asked for), and the blocks D keeps for a readback, if any."""
    try:
        answer = loads(body)
    except ValueError:
        return body, None
    if not isinstance(answer, dict):
        return body, None
    held = readback.held_kv(answer, decode, now, ttl)
    return dumps(readback.client_answer(answer)), held
