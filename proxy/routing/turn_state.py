"""What the router knows of one request while it runs: the validated request it was handed
(`Incoming`), the turn in flight (`TurnInFlight`: its session, workload, failover, access line
and the turn machine walking its plan), a leg that answered (`Served`), and what goes back
to the app (`Reply`). Plain records: `proxy.routing.router` fills them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from proxy.observability.logs import AccessEntry
from proxy.routing.failover import Failover
from proxy.routing.turn_machine import TurnMachine
from proxy.sessions.session import Lookup, Transcript
from proxy.shared.validate import Endpoint
from proxy.shared.vocabulary import RouteKind, Workload
from proxy.upstream.backends import Backend
from proxy.upstream.forward import Answer, UpstreamStream
from proxy.upstream.relay import Relay

# Visible ASCII but `%`: what a client-chosen session id may carry unescaped in a header.
_HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")
# Ids quote() would leave as they are (the proxy's own are hex digests): no quoting needed.
_PLAIN_ID = re.compile(r"[!-$&-~]*")


@dataclass(frozen=True, slots=True)
class Incoming:
    """A validated completion request (the app has checked auth and the body)."""

    endpoint: Endpoint
    body: dict[str, Any]
    session_id: str | None = None  # the x-session-id header
    forced: RouteKind | None = None  # the x-ppd-route header, already authorized

    @property
    def stream(self) -> bool:
        """Whether the client asked for a streamed (SSE) reply."""
        return bool(self.body.get("stream", False))

    def transcript(self) -> Transcript:
        """The conversation the request carries, as the session ledger matches it."""
        if self.endpoint is Endpoint.CHAT:
            return Transcript.from_chat(self.body["messages"])
        return Transcript.from_prompt(self.body["prompt"])


@dataclass(slots=True)
class Reply:
    """What the app sends back: a status, headers and a body (bytes or a relay)."""

    status: int
    headers: dict[str, str]
    body: bytes | Relay
    content_type: str = "application/json"


@dataclass(slots=True)
class Served:
    """A leg that answered: a stream under way, or a whole answer (2xx, or a 4xx to pass on)."""

    route: RouteKind
    result: UpstreamStream | Answer
    decode: Backend | None  # None when P rejected the request before D was asked
    prefill: Backend | None

    @property
    def rejected(self) -> bool:
        """A node answered 4xx: the client's request is at fault and gets that answer."""
        return isinstance(self.result, Answer) and self.result.rejected

    def proves(self) -> bool:
        """Whether the request was servable (the nodes that failed it before were at fault)."""
        return not self.rejected


@dataclass(slots=True)
class TurnInFlight:
    """Everything known about a turn in flight (for the bookkeeping at its end)."""

    incoming: Incoming
    transcript: Transcript
    lookup: Lookup
    workload: Workload
    started: float
    failover: Failover
    access: AccessEntry
    route: RouteKind | None = None  # the route being tried
    machine: TurnMachine | None = None  # the turn's walk through its plan, once planned
    # Whether the D leg asked for token ids the client did not (stripped from its answer).
    token_ids_added: bool = False
    # x-ppd-reason, x-ppd-fallback, x-ppd-costs (`proxy.shared.explain`), once decided.
    explained: dict[str, str] | None = None

    @property
    def session_label(self) -> str:
        """The session id the client is told: its own id when it chose one (whichever branch
        of it this is, so a reused id answers as an unused one), else the session's."""
        explicit = self.incoming.body.get("conversation_id", self.incoming.session_id)
        return self.lookup.session.id if explicit is None else str(explicit)

    def headers(self) -> dict[str, str]:
        """The x-ppd-* headers known so far (an error response carries them too)."""
        # A client-chosen id may hold CR/LF or non-Latin-1 text: percent-encode what is not
        # plain visible ASCII (and `%` itself, so the encoding can be undone).
        label = self.session_label
        session = label if _PLAIN_ID.fullmatch(label) else quote(label, safe=_HEADER_SAFE)
        headers = {"x-ppd-session": session, "x-ppd-turn": str(self.lookup.turn)}
        if self.route is not None:
            headers["x-ppd-route"] = self.route  # a StrEnum: its value
        if self.explained is not None:
            headers.update(self.explained)
        return headers


def over_budget(request_timeout: float | None) -> str:
    """The error message of a request that ran out of its `--request-timeout` budget."""
    return (f"the request did not complete within --request-timeout "
            f"({request_timeout or 0:g} s)")
