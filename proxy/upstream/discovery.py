"""Node discovery: a ZMQ ROUTER socket that turns heartbeats into pool membership.

Two heartbeat formats (msgpack maps), both accepted on the same socket:
- legacy P2pNccl (vLLM's xPyD proxy): `{"type": "P"|"D", "http_address": "host:port",
  "zmq_address": "host:port"}` every 3 s; such nodes get the legacy request id format;
- ppd's own (`ppd register`): `{"type": "prefill"|"decode"|"replica", "url": "http://...",
  "models": [...]}` (models optional).
A registered node that sends nothing for `heartbeat_timeout` seconds leaves the pool.

Trust: a node in the pool receives user prompts, so every heartbeat must carry the token T
(`--discovery-token`, compared in constant time; `ppd register --token`) - on loopback too,
where any local process could otherwise register - unless `--discovery-insecure` says
otherwise (ProxyConfig refuses --discovery with neither; a Discovery built with neither
refuses every heartbeat). vLLM's own P2pNccl heartbeats cannot carry a token: legacy nodes
register through `ppd register --legacy --token`. Heartbeats never touch a static node
(configured by flag, file or cluster.json): they cannot change its role, zmq address, model
list or health, nor make it expire; a heartbeat from a static node is ignored (give such a
P2pNccl node as a discovered one if it needs the legacy request id). A URL that names a
static node another way - `localhost`, `127.1`, `[::1]` or `0.0.0.0` for `127.0.0.1`, an
explicit default port, a trailing slash - is that node (`proxy.upstream.backends.same_node`).

Frames: a heartbeat is one ZMQ message from a DEALER, `[map]` (vLLM's P2pNccl nodes, or a
sender without a token) or `[token, map]`. The token has a frame of its own so that it is
checked before the map is unpacked: whoever lacks it costs the proxy a comparison, never a
parse (three 25 MB heartbeats with a wrong token once took RSS from 68 to ~700 MB).
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import msgpack
import zmq
import zmq.asyncio

from proxy.shared.vocabulary import Role
from proxy.upstream.backends import BackendPool, Source

log = logging.getLogger("ppd.proxy.discovery")

REJECTION_LOG_INTERVAL_S = 60.0
# A heartbeat is a few hundred bytes; ZMQ drops a longer message before it is read (three
# 25 MB heartbeats with a wrong token once took 600 MB to unpack and reject). The token comes
# in a frame of its own, compared before the map is unpacked.
MAX_HEARTBEAT_BYTES = 64 * 1024
MAX_URL_CHARS = 2048
MAX_FIELD_BYTES = 4096  # any string in a heartbeat: a URL, a model name, the token
MAX_MODELS = 64
MAX_MODEL_CHARS = 512
DEFAULT_MAX_NODES = 512
DEFAULT_REGISTRATIONS_PER_S = 20.0
BURST_SECONDS = 4.0  # the registration bucket holds this many seconds' worth
_LEGACY_ROLES = {"P": Role.PREFILL, "D": Role.DECODE}
_LEGACY_TYPES = {role: kind for kind, role in _LEGACY_ROLES.items()}


class HeartbeatError(ValueError):
    """A heartbeat that is not one of the two formats."""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """One parsed heartbeat."""

    url: str
    role: Role
    zmq_address: str | None = None
    models: tuple[str, ...] | None = None


def parse_heartbeat(payload: bytes) -> Heartbeat:
    """Decode a msgpack heartbeat in either format (at most MAX_HEARTBEAT_BYTES)."""
    if len(payload) > MAX_HEARTBEAT_BYTES:
        raise HeartbeatError(f"heartbeat of {len(payload)} bytes (at most "
                             f"{MAX_HEARTBEAT_BYTES})")
    try:
        # Each container and string bounded while unpacking, whatever the socket let in.
        data: Any = msgpack.unpackb(payload, raw=False, max_str_len=MAX_FIELD_BYTES,
                                    max_bin_len=MAX_FIELD_BYTES, max_array_len=MAX_MODELS,
                                    max_map_len=32, max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated exception types
        raise HeartbeatError(f"not msgpack: {exc}") from exc
    if not isinstance(data, dict):
        raise HeartbeatError("heartbeat is not a map")
    kind = data.get("type")
    if kind in _LEGACY_ROLES:
        http_address, zmq_address = data.get("http_address"), data.get("zmq_address")
        if not isinstance(http_address, str) or not http_address:
            raise HeartbeatError("legacy heartbeat without http_address")
        url = _checked_url(http_address if "://" in http_address else f"http://{http_address}")
        return Heartbeat(url, _LEGACY_ROLES[kind],
                         zmq_address if isinstance(zmq_address, str) else None)
    try:
        role = Role(str(kind))
    except ValueError:
        raise HeartbeatError(f"unknown node type {kind!r}") from None
    node_url = data.get("url")
    if not isinstance(node_url, str) or not node_url.startswith(("http://", "https://")):
        raise HeartbeatError("heartbeat without an http(s) url")
    models = data.get("models")
    if isinstance(models, list) and (len(models) > MAX_MODELS or not all(
            isinstance(m, str) and len(m) <= MAX_MODEL_CHARS for m in models)):
        raise HeartbeatError(f"heartbeat models: at most {MAX_MODELS} names of at most "
                             f"{MAX_MODEL_CHARS} characters")
    return Heartbeat(_checked_url(node_url), role, None,
                     tuple(models) if isinstance(models, list) else None)


def _checked_url(url: str) -> str:
    """A node URL fit for request lines and logs: short, no whitespace or control bytes."""
    if len(url) > MAX_URL_CHARS or any(ord(c) <= 32 or ord(c) == 127 for c in url):
        raise HeartbeatError(f"heartbeat url {url[:80]!r} is over {MAX_URL_CHARS} characters "
                             "or holds a space or control character")
    return url


def heartbeat(role: Role, url: str, models: list[str], legacy: bool = False,
              zmq_address: str | None = None) -> dict[str, Any]:
    """The heartbeat map for a node (its token travels beside it: `heartbeat_frames`)."""
    if not legacy:
        return {"type": role.value, "url": url, "models": models}
    if role not in _LEGACY_TYPES:
        raise ValueError("the legacy format knows only prefill and decode nodes")
    parts = urlsplit(url)
    if not parts.hostname or not parts.port:
        raise ValueError(f"--url must carry host and port for the legacy format: {url!r}")
    http_address = f"{parts.hostname}:{parts.port}"
    return {"type": _LEGACY_TYPES[role], "http_address": http_address,
            "zmq_address": zmq_address or http_address}


def heartbeat_frames(payload: dict[str, Any], token: str | None = None) -> list[bytes]:
    """One heartbeat's ZMQ frames: `[token, map]`, or `[map]` without a token."""
    body = msgpack.packb(payload)
    return [token.encode(), body] if token else [body]


def send_heartbeats(proxy: str, payload: dict[str, Any], interval: float, count: int = 0,
                    stop: threading.Event | None = None, token: str | None = None) -> int:
    """Send payload (with token, if any) every interval seconds, count times or until stop is
    set; the number sent."""
    if not proxy.startswith("tcp://"):
        raise ValueError(f"--proxy must look like tcp://HOST:PORT, got {proxy!r}")
    stop = stop or threading.Event()
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 1000)  # let the last heartbeat leave before closing
    sent = 0
    try:
        socket.connect(proxy)
        frames = heartbeat_frames(payload, token)
        while not stop.is_set() and (count <= 0 or sent < count):
            socket.send_multipart(frames)
            sent += 1
            if count <= 0 or sent < count:
                stop.wait(interval)
    finally:
        socket.close()
        context.term()
    return sent


class Discovery:
    """Receives heartbeats on a bound ROUTER socket and keeps the pool's registered nodes."""

    def __init__(self, pool: BackendPool, address: str, heartbeat_timeout: float,
                 clock: Callable[[], float], token: str | None = None, *,
                 insecure: bool = False, max_nodes: int = DEFAULT_MAX_NODES,
                 registrations_per_s: float = DEFAULT_REGISTRATIONS_PER_S) -> None:
        self._pool = pool
        # New registrations are bounded (--discovery-max-nodes, a token bucket of
        # --discovery-registrations-per-s): 2,000 fake nodes once slowed /stats to 3 s.
        self._max_nodes = max_nodes
        self._rate = registrations_per_s
        self._bucket = registrations_per_s * BURST_SECONDS
        self._filled_at = clock()
        self._token = token.encode() if token else None
        self._insecure = insecure  # no token needed (--discovery-insecure)
        self.rejected = 0  # heartbeats dropped: malformed, unauthenticated, or for a static node
        self._ignored: set[str] = set()  # static nodes whose heartbeats were ignored (logged)
        self._warned_at = -math.inf
        self._address = address
        self._timeout = heartbeat_timeout
        self._clock = clock
        self._context: zmq.asyncio.Context | None = None
        self._socket: zmq.asyncio.Socket | None = None
        self.bound_address: str | None = None

    def bind(self) -> str:
        """Bind the socket (port `*` or 0 picks a free one); returns the bound endpoint."""
        address = self._address
        if address.endswith(":0"):
            address = address[:-2] + ":*"
        self._context = zmq.asyncio.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.MAXMSGSIZE, MAX_HEARTBEAT_BYTES)
        try:
            self._socket.bind(address)
        except zmq.ZMQError as exc:
            self.close()
            raise OSError(f"cannot bind discovery socket {self._address}: {exc}") from exc
        self.bound_address = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        return self.bound_address

    def receive(self, frames: list[bytes]) -> None:
        """One heartbeat as the socket gave it, its sender's identity removed: `[map]` or
        `[token, map]`."""
        if len(frames) == 1:
            self.handle(frames[0])
        elif len(frames) == 2:
            self.handle(frames[1], frames[0])
        else:
            self._reject(HeartbeatError(f"heartbeat of {len(frames)} frames (1 or 2)"))

    def handle(self, payload: bytes, token: bytes | None = None) -> None:
        """Apply one heartbeat (its map, and the token frame beside it) to the pool; bad ones
        are logged and dropped. The token is checked first: without it nothing is unpacked."""
        if not self._authentic(token):
            self._reject(HeartbeatError(
                "heartbeat without the discovery token" if self._token else "heartbeat "
                "refused: the proxy has no --discovery-token (nor --discovery-insecure)"))
            return
        try:
            beat = parse_heartbeat(payload)
            static = self._pool.static_twin(beat.url)
            if static is not None and static.role is not beat.role:
                raise HeartbeatError(f"{beat.url} is a static {static.role} node; a heartbeat "
                                     f"cannot make it {beat.role}")
        except HeartbeatError as exc:
            self._reject(exc)
            return
        if static is not None:
            # Configured by flag, file or cluster.json: the configuration and the health
            # checks own it, so its own heartbeat (P2pNccl nodes send them) changes nothing.
            if static.url not in self._ignored:  # once per node: they come every few seconds
                self._ignored.add(static.url)
                log.info("heartbeats for %s ignored: it is configured statically (a P2pNccl "
                         "node that needs its zmq address must register, not be given by flag)",
                         static.url)
            return
        known = self._pool.get(beat.url) is not None
        if not known and not self._admit():
            self.rejected += 1
            if self._clock() - self._warned_at >= REJECTION_LOG_INTERVAL_S:
                self._warned_at = self._clock()
                log.warning("ignoring heartbeat of new node %s: over --discovery-max-nodes %d or "
                            "--discovery-registrations-per-s %g (%d rejected so far)", beat.url,
                            self._max_nodes, self._rate, self.rejected)
            return
        self._pool.add(beat.url, beat.role, source=Source.DISCOVERED,
                       zmq_address=beat.zmq_address, models=beat.models, now=self._clock())
        if not known:
            log.info("node registered: %s (%s)", beat.url, beat.role)

    def _admit(self) -> bool:
        """Whether a new node may register now: under the cap, and a token in the bucket."""
        discovered = sum(1 for n in self._pool.nodes() if n.source is Source.DISCOVERED)
        if discovered >= self._max_nodes:
            return False
        now = self._clock()
        self._bucket = min(self._rate * BURST_SECONDS,
                           self._bucket + (now - self._filled_at) * self._rate)
        self._filled_at = now
        if self._bucket < 1:
            return False
        self._bucket -= 1
        return True

    def _reject(self, exc: HeartbeatError) -> None:
        self.rejected += 1
        # Anyone who reaches the socket can send these: one line per interval, not per beat.
        if self._clock() - self._warned_at >= REJECTION_LOG_INTERVAL_S:
            self._warned_at = self._clock()
            log.warning("ignoring heartbeat: %s (%d rejected so far)", exc, self.rejected)

    def _authentic(self, token: bytes | None) -> bool:
        if self._token is None:
            return self._insecure
        return token is not None and hmac.compare_digest(token, self._token)

    def expire(self) -> list[str]:
        """Drop registered nodes whose heartbeats stopped."""
        gone = self._pool.expire(self._clock(), self._timeout)
        for url in gone:
            log.warning("node %s missed its heartbeats; removed", url)
        return gone

    async def run(self) -> None:
        """Receive heartbeats until cancelled, expiring silent nodes as time passes."""
        if self._socket is None:
            self.bind()
        assert self._socket is not None
        poll_ms = int(min(self._timeout / 4, 1.0) * 1000)
        try:
            while True:
                if await self._socket.poll(poll_ms):  # POLLIN by default
                    frames = await self._socket.recv_multipart()
                    # ROUTER prepends the sender identity: [identity, (token,) map].
                    self.receive(frames[1:])
                self.expire()
        finally:
            self.close()

    def close(self) -> None:
        """Close the socket and context."""
        if self._socket is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._socket.close(linger=0)
            self._socket = None
        if self._context is not None:
            self._context.term()
            self._context = None
