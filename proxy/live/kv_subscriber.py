"""One ZMQ SUB socket per D/R node, folding its KV cache events into `proxy.live.residency`.

Runs in the background on the proxy's event loop; the request path only reads the index.
Sequence numbers (`proxy.live.kv_events`) are checked: a batch that skips numbers is a gap. With a
replay endpoint (vLLM's ROUTER, `--kv-events-config ... "replay_endpoint"`) the missing
batches are asked for and applied in order; if the replay fails or no longer holds them, the
node's index is forgotten (`NodeResidency.forget`: every session unknown until it is stored
again - the proxy then behaves as it did without residency). Without a replay endpoint a gap
forgets at once. The first batch seen may have any number: what came before is unknown
anyway (the index starts empty).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import zmq
import zmq.asyncio

from proxy.live.kv_events import (
    END_SEQ,
    AllBlocksCleared,
    EventBatch,
    KvEvent,
    KvEventError,
    RawBatch,
    encode_seq,
    parse_events,
    parse_seq,
    read_batch,
    read_message,
)
from proxy.live.residency import NodeResidency, Rejection

log = logging.getLogger("ppd.proxy.residency")

REPLAY_TIMEOUT_S = 1.0
# The largest message read (ZMQ drops a longer one; the gap then forgets the index): a
# batch of one 128k-token prompt's blocks, token ids included, is under 1 MB.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# Events applied between two yields to the event loop: a huge batch never blocks the
# request path for longer than a slice (benchmarks/kv_events.py measures both).
SLICE_EVENTS = 256
# A batch is implausible - dropped whole, counted, the index kept - when its number is more
# than MAX_SEQ_JUMP past the next one expected (2^32 batches: over a year at 100 a second),
# or its time more than `max_skew` seconds ahead of the proxy's clock (--kv-clock-skew). One
# forged batch numbered 2^40 and stamped a week ahead once wiped the index and then shadowed
# every honest batch as a duplicate, for good.
MAX_SEQ_JUMP = 2**32
DEFAULT_CLOCK_SKEW_S = 300.0
# A replay answers at most what was missed plus this many stale batches, within
# REPLAY_DEADLINE_S in all: a replay socket answering stale batches forever stalled the node's
# subscriber.
REPLAY_SLACK = 64
REPLAY_DEADLINE_S = 5.0


@dataclass(frozen=True, slots=True)
class KvEventSource:
    """Where a node publishes its KV events (and, optionally, replays them)."""

    url: str  # the node's base URL (the pool's key)
    endpoint: str  # tcp://HOST:PORT of its PUB socket
    replay: str | None = None  # tcp://HOST:PORT of its ROUTER replay socket


@dataclass(slots=True)
class SubscriberStats:
    batches: int = 0
    events: int = 0  # events in the batches applied
    gaps: int = 0
    gaps_replayed: int = 0  # gaps the replay socket filled (the others forgot: `resets`)
    replayed: int = 0  # batches recovered by replay
    resets: int = 0  # gaps that forgot the index
    bad_messages: int = 0
    last_seq: int | None = None
    last_event_at: float | None = None  # time.monotonic() of the last batch applied
    last_ts: float | None = None  # the publisher's timestamp of the last batch applied
    restarts: int = 0  # the node's sequence began again (the node restarted)


@dataclass(slots=True)
class NodeSubscriber:
    """Applies one node's event stream to its index; `handle` is the whole sequence logic."""

    source: KvEventSource
    index: NodeResidency
    stats: SubscriberStats = field(default_factory=SubscriberStats)
    max_skew: float = DEFAULT_CLOCK_SKEW_S
    wall_clock: Callable[[], float] = time.time  # what a batch's timestamp is checked against

    def expected(self) -> int | None:
        last = self.stats.last_seq
        return None if last is None else last + 1

    async def apply_sliced(self, batch: EventBatch | RawBatch) -> None:
        """`apply`, yielding to the event loop every SLICE_EVENTS events (a RawBatch's
        events are decoded a slice at a time too; a malformed one rejects the rest)."""
        raw = isinstance(batch, RawBatch)
        events: list[Any] | tuple[KvEvent, ...] = (
            batch.raw_events if isinstance(batch, RawBatch) else batch.events)
        for start in range(0, len(events), SLICE_EVENTS):
            if start:
                await asyncio.sleep(0)
            chunk = events[start:start + SLICE_EVENTS]
            if raw:
                try:
                    chunk = parse_events(cast(list[Any], chunk))  # a RawBatch's slice
                except KvEventError:
                    self.index.reject(Rejection.MALFORMED)
                    break
            if self.index.apply_all(chunk) is not None:
                break  # rejected: the index was forgotten, the rest builds on nothing
        self._applied(batch.seq, batch.ts, len(events))

    def apply(self, batch: EventBatch) -> None:
        # A rejected event (proxy.live.residency.Rejection) forgets the index and is counted
        # there; the batch still counts as received, and its number as the last one seen.
        self.index.apply_all(batch.events)
        self._applied(batch.seq, batch.ts, len(batch.events))

    def _applied(self, seq: int, ts: float, events: int) -> None:
        self.stats.batches += 1
        self.stats.events += events
        self.stats.last_seq = seq
        self.stats.last_ts = ts
        self.stats.last_event_at = time.monotonic()

    def forget(self) -> None:
        self.index.forget()
        self.stats.resets += 1

    @classmethod
    def joining(cls, source: KvEventSource, index: NodeResidency,
                max_skew: float = DEFAULT_CLOCK_SKEW_S) -> NodeSubscriber:
        """A subscriber for a node that may have published before it joined: with a replay
        socket, its first batch is preceded by everything the node still holds from batch 0
        (a proxy started, or restarted, after the node served conversations knows them)."""
        stats = SubscriberStats(last_seq=-1) if source.replay is not None else SubscriberStats()
        return cls(source, index, stats, max_skew)

    def plausible(self, batch: EventBatch | RawBatch) -> bool:
        """False (and counted) for a batch numbered or stamped where no honest one can be."""
        expected = self.expected()
        if (expected is not None and batch.seq - expected > MAX_SEQ_JUMP) \
                or batch.ts - self.wall_clock() > self.max_skew:
            self.index.rejected[Rejection.IMPLAUSIBLE] += 1
            count = self.index.rejected[Rejection.IMPLAUSIBLE]
            if count & (count - 1) == 0:  # 1st, 2nd, 4th...: a flood cannot flood the log
                log.warning("KV events of %s: dropped batch %d stamped %.0f s ahead (expected "
                            "%s; %d so far)", self.source.url, batch.seq,
                            batch.ts - self.wall_clock(), expected, count)
            return False
        return True

    async def handle(self, batch: EventBatch | RawBatch, ctx: zmq.asyncio.Context) -> None:
        """One published batch: apply it, after replaying (or forgetting) what was missed."""
        if not self.plausible(batch):
            return
        expected = self.expected()
        if expected is not None and batch.seq < expected:
            last_ts = self.stats.last_ts
            if last_ts is None or batch.ts <= last_ts:
                return  # already applied (a replay overlapped the live stream)
            # An earlier number but a later time: the node restarted and numbers from 0 again,
            # with an empty cache - its sessions hold nothing (true, not unknown) - and the
            # new sequence is followed from its start.
            log.warning("KV events of %s: sequence restarted at %d (node restarted?)",
                        self.source.url, batch.seq)
            self.stats.restarts += 1
            self.index.apply(AllBlocksCleared())
            self.stats.last_seq = -1 if self.source.replay is not None else None
            expected = self.expected()
        if expected is not None and batch.seq > expected:
            catching_up = self.stats.last_seq == -1  # `joining`: not a gap, the node's past
            if not catching_up:
                self.stats.gaps += 1
                log.warning("KV events of %s: batches %d..%d missed", self.source.url,
                            expected, batch.seq - 1)
            filled = False
            if self.source.replay is not None:
                filled = await self._replay(ctx, expected, batch.seq)
            if not catching_up:
                if filled:
                    self.stats.gaps_replayed += 1
                else:
                    self.forget()
        if self.stats.last_seq is None or batch.seq > self.stats.last_seq:
            await self.apply_sliced(batch)

    async def _replay(self, ctx: zmq.asyncio.Context, start: int, until: int) -> bool:
        """Ask the node's replay socket for batches start..until-1; True iff all applied."""
        assert self.source.replay is not None
        socket = ctx.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        deadline = time.monotonic() + REPLAY_DEADLINE_S
        answers = until - start + REPLAY_SLACK
        try:
            socket.connect(self.source.replay)
            await socket.send_multipart([b"", encode_seq(start)])
            while True:
                left = min(REPLAY_TIMEOUT_S, deadline - time.monotonic())
                if answers <= 0 or left <= 0 or not await socket.poll(left * 1000):
                    log.warning("KV event replay of %s timed out or ran long", self.source.url)
                    return False
                answers -= 1
                frames = await socket.recv_multipart()
                if len(frames) != 4 or frames[2] == END_SEQ:
                    break
                batch = read_batch(parse_seq(frames[2]), frames[3])
                expected = self.expected()
                if expected is not None and batch.seq < expected:
                    continue
                if not self.plausible(batch):
                    return False
                if batch.seq != expected:
                    return False  # the replay buffer no longer holds what was missed
                await self.apply_sliced(batch)
                self.stats.replayed += 1
                if batch.seq + 1 >= until:
                    break  # all that was missed: a replay that goes on is not waited for
            reached = self.expected()
            return reached is not None and reached >= until
        except (zmq.ZMQError, KvEventError) as exc:
            log.warning("KV event replay of %s failed: %s", self.source.url, exc)
            return False
        finally:
            socket.close()

    async def run(self, ctx: zmq.asyncio.Context) -> None:
        """Subscribe and apply batches until cancelled."""
        socket = ctx.socket(zmq.SUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        socket.setsockopt(zmq.SUBSCRIBE, b"")  # every topic: one node publishes one stream
        socket.connect(self.source.endpoint)
        try:
            while True:
                frames = await socket.recv_multipart()
                try:
                    batch = read_message(frames)
                except KvEventError as exc:
                    self.stats.bad_messages += 1
                    self.index.rejected[Rejection.MALFORMED] += 1
                    if self.stats.bad_messages & (self.stats.bad_messages - 1) == 0:
                        # 1st, 2nd, 4th, 8th...: a flood of junk cannot flood the log.
                        log.warning("bad KV event message from %s: %s (%d so far)",
                                    self.source.url, exc, self.stats.bad_messages)
                    continue
                await self.handle(batch, ctx)
                # A receive that finds a message queued does not yield: without this a
                # flood would keep the loop from every request until the queue drained.
                await asyncio.sleep(0)
        finally:
            socket.close()


class KvEventSubscribers:
    """Every configured node's subscriber, as background tasks on the running loop."""

    def __init__(self, subscribers: list[NodeSubscriber]) -> None:
        self.subscribers = subscribers
        self._ctx: zmq.asyncio.Context | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._ctx = zmq.asyncio.Context()
        self._tasks = [asyncio.create_task(s.run(self._ctx), name=f"kv-events {s.source.url}")
                       for s in self.subscribers]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
