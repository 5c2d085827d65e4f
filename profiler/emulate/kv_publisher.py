"""An emulated node's KV cache events on the wire: vLLM's `ZmqEventPublisher`, frame for frame.

The publishing socket sends one message per engine step that changed the cache: `[topic, seq,
payload]`, seq an 8-byte big-endian counter from 0, payload msgpack of `[ts, events]`
(`proxy.live.kv_events` encodes it; `proxy.live.kv_subscriber` reads it). The last REPLAY_BUFFER
batches are kept for the replay ROUTER socket, which answers `[b"", start_seq]` with
`[b"", topic, seq, payload]` per buffered batch from start_seq on, then `[b"", b"", END_SEQ,
b""]` - what a subscriber asks for when it saw a gap in the sequence.

Publishing never blocks the engine loop: a send is one non-blocking call made after the step's
tokens went out, and a subscriber whose queue (`send_hwm` batches) is full loses the batch -
it sees the gap and replays - while the others get it, as from vLLM's PUB socket. A PUB drops
without telling its sender, so the socket is an XPUB (the same to a SUB) that first sends with
XPUB_NODROP: that send fails when a subscriber is full (checked again once the socket has
caught up with what its subscribers read), which `dropped` counts, and the batch is sent again
without NODROP to whoever has room. libzmq then stops writing to the full subscriber until it
has drained half its queue, and the batches it misses meanwhile go uncounted: `dropped` counts
the times a subscriber fell behind, a lower bound on the batches subscribers lost. The node's
/metrics exports it. Replay requests are served by a task on the node's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import zmq
import zmq.asyncio

from proxy.live.kv_events import END_SEQ, KvEvent, encode_batch, encode_seq

log = logging.getLogger("ppd.emulate")

TOPIC = b"kv"  # as profiler.emulate.node_kv_events configures vLLM
REPLAY_BUFFER = 10_000  # batches kept for replay (vLLM's default buffer_steps)
SEND_HWM = 1000  # batches queued per subscriber before a batch is dropped (ZMQ's default)


class KvEventPublisher:
    """XPUB (+ replay ROUTER) sockets of one node; `publish` sends one step's events.

    Ports 0 let the OS choose (tests); `endpoint` and `replay_endpoint` say where they are
    once `start` has bound them."""

    def __init__(self, host: str, port: int, replay_port: int | None,
                 buffer_steps: int = REPLAY_BUFFER, send_hwm: int = SEND_HWM) -> None:
        self.host, self.port, self.replay_port = host, port, replay_port
        self.send_hwm = send_hwm
        self.seq = 0
        self.dropped = 0  # batches that found a subscriber full (the module docstring)
        self.endpoint: str | None = None
        self.replay_endpoint: str | None = None
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._ctx: zmq.asyncio.Context | None = None
        self._pub: zmq.Socket[bytes] | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._replay: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Bind the sockets and serve replay requests (on the running loop)."""
        self._ctx = zmq.asyncio.Context()
        # A plain (synchronous) socket: a send is one call that returns at once. XPUB with
        # NODROP, so that a full subscriber fails the send instead of losing it unseen. XPUB
        # also queues a subscription message each time the topic gains its first subscriber
        # (a few bytes per proxy start); nothing reads them.
        self._pub = zmq.Socket(self._ctx, zmq.XPUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.SNDHWM, self.send_hwm)
        self._pub.setsockopt(zmq.XPUB_NODROP, 1)
        self.endpoint = _bind(self._pub, self.host, self.port)
        if self.replay_port is not None:
            self._router = self._ctx.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.LINGER, 0)
            self.replay_endpoint = _bind(self._router, self.host, self.replay_port)
            self._replay = asyncio.create_task(self._serve_replay(), name="kv-events-replay")

    async def stop(self) -> None:
        if self._replay is not None:
            self._replay.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replay
            self._replay = None
        # Each socket is closed by hand: the XPUB was not made by ctx.socket(), so
        # ctx.destroy() would not close it, and term() would wait for it forever.
        for socket in (self._pub, self._router):
            if socket is not None:
                socket.close(linger=0)
        if self._ctx is not None:
            self._ctx.term()
        self._ctx = self._pub = self._router = None

    def publish(self, events: Sequence[KvEvent]) -> None:
        """Send one step's events as the next batch (nothing for a step without any)."""
        if not events or self._pub is None:
            return
        seq = self.seq
        self.seq += 1
        payload = encode_batch(time.time(), list(events))
        self._buffer.append((seq, payload))
        frames = [TOPIC, encode_seq(seq), payload]
        try:
            self._pub.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            if self._send_after_catching_up(frames):
                return
            # A subscriber is full: it loses this one (kept for replay).
            self.dropped += 1
            self._send_to_those_with_room(frames)

    def _send_after_catching_up(self, frames: list[bytes]) -> bool:
        """Send again once the socket knows what its subscribers have read; False if one is
        still full.

        A socket learns what a subscriber read from commands its I/O thread posts, and a send
        handles those at most once a millisecond: publishing faster than that, a subscriber
        that keeps up looks full. Reading ZMQ_EVENTS handles them all at once (libzmq's
        socket_base_t::getsockopt), so only a subscriber that truly fell behind counts, and
        the one that keeps up is not dropped with it."""
        assert self._pub is not None
        self._pub.getsockopt(zmq.EVENTS)
        try:
            self._pub.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def _send_to_those_with_room(self, frames: list[bytes]) -> None:
        assert self._pub is not None
        self._pub.setsockopt(zmq.XPUB_NODROP, 0)
        try:
            self._pub.send_multipart(frames, flags=zmq.NOBLOCK)  # never fails without NODROP
        finally:
            self._pub.setsockopt(zmq.XPUB_NODROP, 1)

    async def _serve_replay(self) -> None:
        assert self._router is not None
        router = self._router
        while True:
            frames = await router.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                log.warning("KV event replay: ignoring a malformed request (%d frames)",
                            len(frames))
                continue
            client, start = frames[0], int.from_bytes(frames[2], "big")
            for seq, payload in list(self._buffer):
                if seq >= start:
                    await router.send_multipart([client, b"", TOPIC, encode_seq(seq), payload])
            await router.send_multipart([client, b"", b"", END_SEQ, b""])


def _bind(socket: zmq.Socket[Any], host: str, port: int) -> str:
    """Bind tcp://host:port (port 0: one the OS chooses); the endpoint actually bound."""
    socket.bind(f"tcp://{host}:{port or '*'}")
    return socket.getsockopt_string(zmq.LAST_ENDPOINT)
