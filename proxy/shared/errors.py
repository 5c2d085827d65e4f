"""The proxy's one exception hierarchy; every error a client sees is one of these.

    ProxyError (500 internal_error)
    ├── BadRequest (400)          malformed JSON, missing/mistyped fields, bad forcing header
    ├── Unauthorized (401)        missing or wrong API / admin key
    ├── NotFound (404)            a model no backend serves
    ├── MethodNotAllowed (405)    a method the path does not take
    ├── RequestTimeout (408)      the client's headers or body too slow (proxy.serving.server)
    ├── PayloadTooLarge (413)     body over --max-body-bytes
    ├── Overloaded (429)          admission control (--max-in-flight)
    ├── UpstreamError (502)       a backend failed, after failover; what failed:
    │   ├── UpstreamRefused           the connection was refused: nothing listens there
    │   ├── UpstreamBroken            the connection broke (reset, read or write error)
    │   ├── UpstreamStatus            the backend answered 5xx
    │   ├── UpstreamProtocol          the backend's answer was not what vLLM sends
    │   ├── UpstreamRunaway           the backend streamed past max_tokens
    │   └── UpstreamTooLarge          an answer or stream event over its byte limit
    ├── NoBackend (503)           no healthy node for the route
    └── UpstreamTimeout (504)     backend did not answer in time
        └── BudgetExhausted           the request's whole budget ran out

A backend's 4xx answer is not an error of the proxy: it is the client's request that is at
fault, so `proxy.upstream.forward` returns it as a value (`forward.Answer`) and the client gets it
as is.
Transport failures (sockets, aiohttp, httpx) never leave the legs that meet them: each
`proxy.upstream.legs` implementation translates its own into UpstreamRefused, UpstreamTimeout or
UpstreamBroken, once, at its boundary.
`to_openai_body()` gives the OpenAI error shape `{"error": {"message", "type", "param", "code"}}`
(`param` names the request field at fault, or is null);
`headers` carries the `x-ppd-*` headers known when the error was raised (the router adds them).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar


class ProxyError(Exception):
    """Base of every error the proxy answers with; carries its HTTP status and OpenAI type."""

    status: ClassVar[int] = 500
    type: ClassVar[str] = "internal_error"
    code: ClassVar[str] = "internal_error"
    # The metrics label of a failure (ppd_upstream_errors{kind}): a class's code unless it
    # names a finer one.
    kind: ClassVar[str] = "internal_error"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" not in vars(cls) and "code" in vars(cls):
            cls.kind = cls.code

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        # Response headers the client gets with the error (session, turn, route tried).
        self.headers: dict[str, str] = {}

    def to_openai_body(self) -> dict[str, Any]:
        """The OpenAI-shaped error body."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def body_bytes(self) -> bytes:
        """The error body as JSON bytes, ready to send."""
        return json.dumps(self.to_openai_body()).encode()


class BadRequest(ProxyError):
    status = 400
    type = "invalid_request_error"
    code = "bad_request"


class Unauthorized(ProxyError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class NotFound(ProxyError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class MethodNotAllowed(ProxyError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class RequestTimeout(ProxyError):
    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class PayloadTooLarge(ProxyError):
    status = 413
    type = "invalid_request_error"
    code = "payload_too_large"


class HeadersTooLarge(ProxyError):
    status = 431
    type = "invalid_request_error"
    code = "request_header_fields_too_large"


class Overloaded(ProxyError):
    status = 429
    type = "rate_limit_error"
    code = "overloaded"


class UpstreamError(ProxyError):
    status = 502
    type = "upstream_error"
    code = "bad_gateway"


class UpstreamRefused(UpstreamError):
    """Nothing listens at the node: it is down at once (`proxy.routing.failover.charge`)."""

    kind = "connect"


class UpstreamBroken(UpstreamError):
    """The connection broke after it was made: may be this request's alone."""

    kind = "transport"


class UpstreamStatus(UpstreamError):
    """The node answered 5xx: it failed this request."""

    kind = "status"


class UpstreamProtocol(UpstreamError):
    """The node's answer is not what vLLM sends (e.g. a prefill answer that is not JSON)."""

    kind = "protocol"


class UpstreamRunaway(UpstreamError):
    """The node streamed past the request's max_tokens: a backend fault, the reply is cut."""

    kind = "runaway"


class UpstreamTooLarge(UpstreamError):
    """The node's answer, or one of its stream events, passed its byte limit
    (`proxy.upstream.bounded_legs`): read no further."""

    kind = "too_large"


class NoBackend(ProxyError):
    status = 503
    type = "service_unavailable"
    code = "no_backend"


class UpstreamTimeout(ProxyError):
    status = 504
    type = "timeout"
    code = "upstream_timeout"
    kind = "timeout"


class BudgetExhausted(UpstreamTimeout):
    """The request's whole budget (`--request-timeout`, stream included) ran out: not a node's
    fault by itself, so it strikes no circuit."""

    kind = "deadline"
