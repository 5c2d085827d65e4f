"""The HTTP legs to vLLM: what each leg sends, and what its answer means.

- `fetch`: a non-streamed leg. The whole body is read before anything reaches the client, so
  an upstream that dies mid-body is an UpstreamError (a 502 or a failover), never a 200 with
  half a JSON document. vLLM's non-streamed replies are small; buffering them costs nothing.
- `complete`: a non-streamed D, local or replica leg (a fetch whose 2xx must be JSON, or 502).
- `prefill`: the P leg (a fetch); returns P's kv_transfer_params (or None).
- `open_stream`: a streamed D, local or replica leg. It returns once the first body chunk has
  arrived, so every failure that can still be hidden from the client (refused, reset, 5xx, a
  read error before any byte) surfaces as an exception the router can fail over on.
- `UpstreamStream.next_chunk()` then passes the bytes through unchanged while
  `proxy.shared.completion.ReplyCapture` parses them on the side for what the session ledger needs.
An upstream 4xx is the client's request at fault, not a failure: it comes back as an `Answer`
that goes to the client as is.

The legs go through `proxy.upstream.legs.Legs` (the default:
`proxy.upstream.transport.DefaultLegs`; the
tests': `proxy.upstream.httpx_legs.HttpxLegs` over a mock network), whose implementations raise the
proxy's own errors, each translated once at its own boundary; nothing here translates.

Nothing here sends a request twice. A request may only be sent again when it provably never
reached the server, and no failure after the connection was established proves that:
httpcore already resends by itself on a pooled connection it finds closed before writing
(ConnectionNotAvailable), swallows a WriteError to read the server's answer, and a read error
or a "server disconnected without sending a response" may follow a request the server
received in full and started to run (`proxy.upstream.legs`: all UpstreamBroken). Stale keep-alive
connections are avoided instead (the legs drop idle connections before vLLM's keep-alive
timeout closes them), and a failure is handled by the router, which moves on to another node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.observability import tracing
from proxy.shared.errors import UpstreamProtocol, UpstreamRunaway, UpstreamStatus
from proxy.shared.json_codec import dumps, exact_loads, loads
from proxy.shared.tokens import MAX_TOKEN_COUNT
from proxy.shared.validate import Endpoint
from proxy.shared.vocabulary import RouteKind
from proxy.upstream.bounded_legs import BoundedResponse
from proxy.upstream.legs import LegResponse, Legs

# How much of a failing upstream's body to quote in the error message.
_ERROR_SNIPPET = 200


@dataclass(frozen=True, slots=True)
class Answer:
    """A complete upstream response: a non-streamed 2xx, or any 4xx (the client's fault)."""

    status: int
    body: bytes
    content_type: str

    @property
    def rejected(self) -> bool:
        """The node refused the request (4xx): the client gets this answer unchanged."""
        return 400 <= self.status < 500


@dataclass(frozen=True, slots=True)
class Prefilled:
    """P's answer to the P leg: the kv_transfer_params D needs (None when P returned none)."""

    kv_transfer_params: Any


async def _post(legs: Legs, url: str, body: dict[str, Any], request_id: str, *,
                stream: bool, leg: str) -> tuple[LegResponse, bytes, tracing.LegSpan | None]:
    """POST one leg, once: the response and, unless streamed, its whole body. The legs
    raise the proxy's own errors (`proxy.upstream.legs`) and add the headers every leg carries.
    When the turn is traced (`proxy.observability.tracing`), the leg gets a span named `leg` and
    carries
    its traceparent; a stream's span ends when the stream is closed (`UpstreamStream`)."""
    headers = {"content-type": "application/json", "x-request-id": request_id}
    trace = tracing.current()
    span = trace.leg(leg, url, request_id, headers) if trace is not None else None
    try:
        response = await legs.post(url, dumps(body), headers)
    except BaseException as exc:
        if span is not None:
            span.end(error=exc)
        raise
    if stream:
        return response, b"", span
    try:
        content = await response.aread()
    except BaseException as exc:
        if span is not None:
            span.end(response.status, exc)
            span = None
        raise
    finally:
        await response.aclose()
        if span is not None:
            span.end(response.status)
    return response, content, None


def _answering_leg(body: dict[str, Any]) -> str:
    """The span name of a leg that answers the client: D after P (it gets P's
    kv_transfer_params), else the one node's route the turn decided (local or replica)."""
    if "kv_transfer_params" in body:
        return "decode"
    trace = tracing.current()
    one_node = (RouteKind.LOCAL, RouteKind.REPLICA)
    return trace.route if trace is not None and trace.route in one_node else RouteKind.LOCAL.value


def _answer(response: LegResponse, body: bytes, url: str) -> Answer:
    """The answer of a finished response; a 5xx raises (the node failed, not the request)."""
    if response.status >= 500:
        snippet = body[:_ERROR_SNIPPET].decode(errors="replace")
        raise UpstreamStatus(f"backend {url} answered {response.status}: {snippet}")
    return Answer(response.status, body, response.content_type)


async def fetch(legs: Legs, base_url: str, endpoint: Endpoint,
                body: dict[str, Any], request_id: str, leg_name: str | None = None) -> Answer:
    """POST body and read the whole answer (2xx or 4xx); a 5xx or a broken body raises
    (`leg_name`: its span's, when traced)."""
    url = base_url + endpoint
    leg = "prefill" if leg_name is None else leg_name
    response, content, _ = await _post(legs, url, body, request_id, stream=False, leg=leg)
    return _answer(response, content, url)


async def tokenize(legs: Legs, base_url: str, body: dict[str, Any],
                   request_id: str) -> Any:
    """vLLM's POST /tokenize (a readback's check of the new prompt's ids): the decoded JSON of
    a 2xx, None for any other answer (a node without the endpoint, a prompt it refuses)."""
    url = base_url + "/tokenize"
    response, content, _ = await _post(legs, url, body, request_id, stream=False,
                                       leg="tokenize")
    if not 200 <= response.status < 300:
        return None
    try:
        return loads(content)
    except ValueError:
        return None


async def complete(legs: Legs, base_url: str, endpoint: Endpoint,
                   body: dict[str, Any], request_id: str) -> Answer:
    """A non-streamed leg that answers the client: a 2xx must be a JSON object, as from P; a
    body that is not (an HTML error page, a cut document) is the node's failure, a 502."""
    answer = await fetch(legs, base_url, endpoint, body, request_id, _answering_leg(body))
    if not answer.rejected:
        try:
            data = loads(answer.body)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise UpstreamProtocol(f"backend {base_url + endpoint.value} answered non-JSON "
                                   f"(status {answer.status})")
        _check_length(data, body, base_url + endpoint.value)
    return answer


def _check_length(data: dict[str, Any], body: dict[str, Any], url: str) -> None:
    """A whole answer that generated more than the request's max_tokens (times n choices, as
    vLLM's usage sums them) is the node's fault, as a stream past it is (`proxy.upstream.relay`)."""
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    usage = data.get("usage")
    generated = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if isinstance(usage, dict):  # numbers from outside: finite counts in range, or a 502
        for field in ("prompt_tokens", "completion_tokens", "total_tokens"):
            count = usage.get(field)
            if count is not None and not (count.__class__ is int
                                          and 0 <= count <= MAX_TOKEN_COUNT):
                raise UpstreamProtocol(f"backend {url} answered usage.{field} "
                                       f"{str(count)[:40]}, not a token count")
    n = body.get("n")
    choices = n if isinstance(n, int) and n > 0 else 1
    if (isinstance(limit, int) and isinstance(generated, int)
            and generated > limit * choices):
        raise UpstreamRunaway(f"backend {url} generated {generated} tokens past the request's "
                              f"max_tokens ({limit}); reply dropped")


async def prefill(legs: Legs, base_url: str, endpoint: Endpoint,
                  body: dict[str, Any], request_id: str) -> Prefilled | Answer:
    """Run the P leg: P's kv_transfer_params, or P's 4xx answer for the client."""
    params = body.get("kv_transfer_params")
    # A P leg that reads the history's KV back from D names how many tokens to read.
    reads_back = isinstance(params, dict) and "remote_num_tokens" in params
    leg = RouteKind.READBACK if reads_back else "prefill"
    answer = await fetch(legs, base_url, endpoint, body, request_id, leg)
    if answer.rejected:
        return answer
    try:
        data = exact_loads(answer.body)  # exactly: D gets P's kv_transfer_params as sent
    except ValueError as exc:
        raise UpstreamProtocol(f"backend {base_url + endpoint.value} answered non-JSON to the "
                               f"prefill ({exc})") from exc
    return Prefilled(data.get("kv_transfer_params") if isinstance(data, dict) else None)


@dataclass(slots=True)
class UpstreamStream:
    """An upstream response whose status, headers and first chunk have arrived."""

    response: LegResponse
    first: bytes
    span: tracing.LegSpan | None = None  # the leg's span when traced, ended by aclose
    bounds: BoundedResponse | None = None  # counts each chunk's bytes of an unfinished event

    @property
    def status(self) -> int:
        """The upstream status (2xx here)."""
        return self.response.status

    @property
    def content_type(self) -> str:
        """The upstream content type."""
        return self.response.content_type

    async def next_chunk(self) -> bytes:
        """The body's next bytes as they arrived, the first chunk first; b"" at its end.
        Mid-stream failures raise the legs' errors (`proxy.upstream.legs`).

        A method, not an async generator: each chunk of each stream passes here, and every
        generator layer between the socket and the client cost a resumption per chunk."""
        first = self.first
        if first:
            self.first = b""
            return first
        chunk = await self.response.read_chunk()
        if self.bounds is not None:
            self.bounds.check_event(chunk)
        return chunk

    @property
    def at_end(self) -> bool:
        """Every byte of the body has been read and its end has arrived (False: not known,
        on the legs other than `proxy.upstream.http1`'s)."""
        return not self.first and self.response.at_end

    async def aclose(self) -> None:
        """Close the upstream response (vLLM aborts a request whose connection closes)."""
        try:
            await self.response.aclose()
        finally:
            if self.span is not None:
                self.span.end(self.response.status)
                self.span = None


async def open_stream(legs: Legs, base_url: str, endpoint: Endpoint,
                      body: dict[str, Any], request_id: str) -> UpstreamStream | Answer:
    """POST body and wait for the first chunk (a 4xx: its whole answer); errors raise."""
    url = base_url + endpoint
    response, _, span = await _post(legs, url, body, request_id, stream=True,
                                    leg=_answering_leg(body))
    try:
        if response.status >= 400:
            try:
                answer = _answer(response, await response.aread(), url)
            finally:
                await response.aclose()
                if span is not None:
                    span.end(response.status)
                    span = None
            return answer
        first = await response.read_chunk()
    except BaseException as exc:
        await response.aclose()
        if span is not None:
            span.end(response.status, exc)
        raise
    if isinstance(response, BoundedResponse):  # its checks without its coroutine layer
        return UpstreamStream(response.inner, first, span, response)
    return UpstreamStream(response, first, span)
