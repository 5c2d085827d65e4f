"""A fake vLLM KV-event publisher: a real ZMQ PUB (+ optional ROUTER replay) on loopback.

Sends exactly vLLM's frames (`ZmqEventPublisher`): `[topic, seq, payload]` on PUB, and on the
replay socket `[identity, b"", topic, seq, payload]` per buffered batch from the requested
sequence number, then `[identity, b"", b"", END_SEQ, b""]`. `skip()` drops a sequence number
from the live stream (kept for replay), which is how a subscriber sees a gap.
"""

from __future__ import annotations

import threading
import time

import zmq

from proxy.live.kv_events import END_SEQ, KvEvent, encode_batch, encode_seq

TOPIC = b"kv"


class FakeKvPublisher:
    def __init__(self, *, replay: bool = False, positional: bool = False,
                 buffer: int = 1000, answer_replay: bool = True) -> None:
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.positional = positional
        self.seq = 0
        self.buffer: list[tuple[int, bytes]] = []
        self.buffer_size = buffer
        self.replay_endpoint: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if replay:
            self.router = self.ctx.socket(zmq.ROUTER)
            rport = self.router.bind_to_random_port("tcp://127.0.0.1")
            self.replay_endpoint = f"tcp://127.0.0.1:{rport}"
            if answer_replay:  # False: the test answers on `router` itself (a forged one)
                self._thread = threading.Thread(target=self._serve_replay, daemon=True)
                self._thread.start()

    def publish(self, events: list[KvEvent], *, drop: bool = False) -> int:
        """Publish one batch (or only buffer it, with drop=True); returns its seq."""
        seq = self.seq
        self.seq += 1
        payload = encode_batch(time.time(), events, positional=self.positional)
        self.buffer.append((seq, payload))
        del self.buffer[:-self.buffer_size]
        if not drop:
            self.pub.send_multipart([TOPIC, encode_seq(seq), payload])
        return seq

    def _serve_replay(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(50):
                continue
            client, _, start = self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            for seq, payload in list(self.buffer):
                if seq >= first:
                    self.router.send_multipart([client, b"", TOPIC, encode_seq(seq), payload])
            self.router.send_multipart([client, b"", b"", END_SEQ, b""])

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self.ctx.destroy(linger=0)
