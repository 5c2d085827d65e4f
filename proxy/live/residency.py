"""What each D/R node still holds of each session, from its KV cache events
(`proxy.live.kv_events`).

Per node a tree of the blocks it stored (hash -> parent hash and depth, the block's 1-based
position in its chain) and, per session, the last block the node stored for it. A session's
residency is the number of leading tokens of its history whose blocks are all still
resident: `leading resident blocks x block size`.

How a block is tied to a session: vLLM (>= 0.32) tags each `BlockStored` with the request's
`session_id` body field, and the proxy sends its own session id there on D's legs. The chain
is vLLM's own, as published (each event names the parent of its first block); the proxy
neither recomputes vLLM's block hashes (their seed, algorithm and CBOR/pickle encoding of
extra keys change with version and flags) nor needs the token ids (it never sees the
chat-templated ids D prefilled). A session's chain is its last block and the parent links
above it, so a shared prefix stored under another session is shared, not copied.

The stream is untrusted input (docs/robustness.md, "KV events"): a buggy or compromised
node, or whatever binds its event port, may send anything. So:
- storing costs O(blocks in the event): a block's depth is its parent's plus one, read from
  the parent's record, never found by walking the chain; nothing is copied per event;
- the only walk over parent links (`held_tokens`) follows strictly decreasing depths, so it
  ends within the chain's length whatever the links say, and its result is remembered per
  block until the next removal (all sessions' walks in one epoch cost O(blocks), not
  O(sessions x chain));
- an event that would close a cycle, chain past the node's KV capacity, name a block under
  a parent other than the one it was stored under, or carry an impossible block size is
  rejected (`Rejection`), and the whole index is forgotten: the node's residency is unknown
  until its chains are stored again, as after an unfillable gap;
- memory is bounded by the node's KV capacity in blocks (`capacity`: its /metrics, or
  --kv-blocks): past it the oldest-stored resident blocks are evicted (the tail of a
  chain before its head, as vLLM frees a request's blocks), and removed blocks are
  remembered (for the depths of their descendants) up to the same number, oldest forgotten
  first. Sessions are bounded by `max_sessions` and by the capacity (a node cannot hold
  something for more sessions than it has blocks), least recently stored forgotten first.

"Unknown" (None) means: behave as before residency existed (assume D holds what the session
ledger says). A node's index starts unknown for every session, and is reset when its event
stream had a gap that replay could not fill, or an event was rejected: whatever was learned
before is forgotten, and a session is known again once the node stores its chain from the
first block. A chain whose first block the index never saw (it joined late) stays unknown:
its blocks are kept as an orphan branch, tied to the unknown hash it hangs from.
"""

from __future__ import annotations

import enum
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Final

from proxy.live.kv_events import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored, KvEvent

# Sessions remembered per node: above this the least recently stored are forgotten (unknown).
MAX_SESSIONS_PER_NODE = 100_000
# A node's KV capacity in blocks until its /metrics (vllm:cache_config_info's num_gpu_blocks)
# or --kv-blocks says otherwise. An 80 GB GPU serving an 8B model holds ~30k 16-token blocks
# (131 KB of KV per token: 2 x 32 layers x 8 KV heads x 128 x 2 bytes); this is 4x that.
DEFAULT_KV_BLOCKS = 131_072
# The most blocks a node's /metrics may claim: ~130 MB of index (BLOCK_BYTES each), 4x the
# default, more than an H200 holds of a 1B model's 16-token blocks.
MAX_CLAIMED_KV_BLOCKS = 4 * DEFAULT_KV_BLOCKS
# vLLM's block sizes are 1..256 for attention; hybrid (Mamba) models align the attention block
# to the state size, a few thousand tokens at most. Larger is not a real node's.
MAX_BLOCK_SIZE = 65_536
# Bytes one remembered block and one session cost, what `memory_bytes` reports: measured with
# tracemalloc over 100,000 blocks with 32-byte hashes (vLLM's sha256 digests; int hashes cost
# less): 169 B of index + 65 B of hash a block, 333 B a tagged session with its block.
BLOCK_BYTES = 250
SESSION_BYTES = 200


class Rejection(enum.StrEnum):
    """Why an event was rejected (a label of ppd_kv_events_rejected_total)."""

    CYCLE = "cycle"  # a block is its own ancestor (itself its parent, or a loop of parents)
    PARENT_CONFLICT = "parent_conflict"  # a known block stored again under another parent
    TOO_LONG = "too_long"  # a chain longer than the node's KV capacity in blocks
    BLOCK_SIZE = "block_size"  # a block size no node has, or more tokens than its blocks fit
    MALFORMED = "malformed"  # not a KV event batch at all (counted by the subscriber)
    # A batch numbered far past the last, or stamped far ahead of the proxy's clock: dropped
    # whole by the subscriber, the index kept (a forged one would wipe it, then shadow every
    # honest batch after it as a duplicate).
    IMPLAUSIBLE = "implausible"


# A block's record: (parent hash, depth, anchor). Depth is the 1-based position in its chain,
# 0 for an orphan (its chain's start is unknown), whose anchor is the unknown hash its branch
# hangs from. A plain tuple of hashes and ints: the garbage collector untracks it, so a full
# collection never walks the index (a class instance per block made gen-2 collections over a
# full index take hundreds of ms, benchmarks/kv_events.py).
_Block = tuple[BlockHash | None, int, BlockHash | None]
_PARENT: Final = 0
_DEPTH: Final = 1
_ANCHOR: Final = 2


@dataclass(slots=True)
class _Session:
    tip: BlockHash  # the last block the node stored for the session
    depth: int
    block_size: int
    counted_at: int = -1  # the node's epoch when `resident` was counted
    resident: int = 0  # leading blocks resident then


@dataclass(slots=True)
class NodeResidency:
    """The blocks one node holds and the chain it stored for each session."""

    max_sessions: int = MAX_SESSIONS_PER_NODE
    capacity: int = DEFAULT_KV_BLOCKS  # the node's KV cache, in blocks
    _resident: OrderedDict[BlockHash, _Block] = field(default_factory=OrderedDict)
    _gone: OrderedDict[BlockHash, _Block] = field(default_factory=OrderedDict)
    _sessions: OrderedDict[str, _Session] = field(default_factory=OrderedDict)
    resets: int = 0  # times the index was forgotten (an unfillable gap, a rejected event)
    events: int = 0
    evicted: int = 0  # resident blocks dropped because the index was over capacity
    rejected: Counter[Rejection] = field(default_factory=Counter)
    _epoch: int = 0  # bumped whenever a block stops (or starts again) being resident
    # Per block, its leading resident count (of the path from the root to it) in _memo_epoch.
    _memo: dict[BlockHash, int] = field(default_factory=dict)
    _memo_epoch: int = -1

    @property
    def num_blocks(self) -> int:
        """Resident blocks known to this index."""
        return len(self._resident)

    @property
    def num_sessions(self) -> int:
        """Sessions whose residency on this node is known."""
        return len(self._sessions)

    def is_resident(self, block: BlockHash) -> bool:
        """Whether the node holds the block, as far as its events say."""
        return block in self._resident

    def memory_bytes(self) -> int:
        """About how much memory the index holds (BLOCK_BYTES, SESSION_BYTES: measured)."""
        return ((len(self._resident) + len(self._gone)) * BLOCK_BYTES
                + len(self._sessions) * SESSION_BYTES)

    def set_capacity(self, blocks: int) -> None:
        """The node's KV capacity in blocks (from its /metrics or --kv-blocks)."""
        self.capacity = max(1, int(blocks))
        self._bound()

    def apply(self, event: KvEvent) -> Rejection | None:
        """Fold one event into the index; a rejected one forgets it (and says why)."""
        self.events += 1
        if isinstance(event, BlockStored):
            reason = self._stored(event)
            if reason is not None:
                self.reject(reason)
            return reason
        if isinstance(event, BlockRemoved):
            for block in event.block_hashes:
                record = self._resident.pop(block, None)
                if record is not None:
                    self._gone[block] = record
            self._epoch += 1
            self._bound()
        elif isinstance(event, AllBlocksCleared):
            # Chains stay (their blocks now count as not resident): sessions hold nothing.
            self._gone.update(self._resident)
            self._resident.clear()
            self._epoch += 1
            self._bound()
        return None

    def apply_all(self, events: tuple[KvEvent, ...] | list[KvEvent]) -> Rejection | None:
        """Fold a batch in order; a rejected event forgets the index and ends the batch (the
        rest would build on what was just forgotten)."""
        for event in events:
            reason = self.apply(event)
            if reason is not None:
                return reason
        return None

    def reject(self, reason: Rejection) -> None:
        """Count a rejected event and forget what the stream said so far."""
        self.rejected[reason] += 1
        self.forget()

    def forget(self) -> None:
        """A gap nothing could fill, or a rejected event: every session becomes unknown until
        stored again."""
        self._resident.clear()
        self._gone.clear()
        self._sessions.clear()
        self._memo.clear()
        self.resets += 1
        self._epoch += 1

    def block_size(self, session_id: str, default: int) -> int:
        """The block size the node stored the session's chain with (default if unknown)."""
        session = self._sessions.get(session_id)
        return session.block_size if session is not None else default

    def held_tokens(self, session_id: str) -> int | None:
        """Leading tokens of the session's history this node still holds; None if unknown."""
        session = self._sessions.get(session_id)
        if session is None:
            return None
        if session.counted_at != self._epoch:  # counted once per removal, not per request
            session.resident = self._leading(session.tip, session.depth)
            session.counted_at = self._epoch
        return session.resident * session.block_size

    def _record(self, block: BlockHash) -> _Block | None:
        record = self._resident.get(block)
        return record if record is not None else self._gone.get(block)

    def _leading(self, tip: BlockHash, depth: int) -> int:
        """Leading resident blocks of the chain ending in tip (at depth): walked up to the
        first block counted in this epoch, then counted down again, remembering each."""
        if self._memo_epoch != self._epoch:
            self._memo, self._memo_epoch = {}, self._epoch
        memo, resident_blocks, gone = self._memo, self._resident, self._gone
        path: list[tuple[BlockHash, int, bool]] = []
        block: BlockHash | None = tip
        count = 0
        while depth > 0:
            record = resident_blocks.get(block)  # type: ignore[arg-type]
            resident = record is not None
            if record is None:
                record = gone.get(block)  # type: ignore[arg-type]
            if record is None or record[_DEPTH] != depth:
                # Forgotten (or stored again elsewhere): not held, and what is above it can
                # no longer be reached - count nothing rather than guess.
                count = 0
                break
            known = memo.get(block)  # type: ignore[arg-type]
            if known is not None:
                count = known
                break
            path.append((block, depth, resident))  # type: ignore[arg-type]
            block, depth = record[_PARENT], depth - 1
        for block, depth, resident in reversed(path):
            if resident and count == depth - 1:
                count += 1
            memo[block] = count
        return count

    def _stored(self, event: BlockStored) -> Rejection | None:
        hashes = event.block_hashes
        n = len(hashes)
        if n == 0:
            return None
        if not 1 <= event.block_size <= MAX_BLOCK_SIZE or event.num_tokens > n * event.block_size:
            return Rejection.BLOCK_SIZE
        parent = event.parent
        if n > 1 and len(set(hashes)) != n or parent in hashes:
            return Rejection.CYCLE
        anchor: BlockHash | None = None
        if parent is None:
            base = 0
        elif (above := self._record(parent)) is None:
            base, anchor = -1, parent  # an orphan: hangs from a block never seen
        elif above[_DEPTH] == 0:
            base, anchor = -1, above[_ANCHOR]
            if anchor in hashes:  # the branch hangs from one of these: a loop of parents
                return Rejection.CYCLE
        else:
            base = above[_DEPTH]
        if base + n > self.capacity:
            return Rejection.TOO_LONG
        link = parent
        for block in hashes:
            known = self._record(block)
            if known is not None and known[_PARENT] != link:
                return Rejection.PARENT_CONFLICT
            link = block
        self._link(hashes, parent, base, anchor)
        session = event.session_id
        if session is not None:
            if base < 0:
                self._sessions.pop(session, None)  # its start is not known: unknown, not 0
            else:
                self._sessions[session] = _Session(hashes[-1], base + n,
                                                   max(1, event.num_tokens // n))
                self._sessions.move_to_end(session)
        self._bound()
        return None

    def _link(self, hashes: tuple[BlockHash, ...], parent: BlockHash | None, base: int,
              anchor: BlockHash | None) -> None:
        """Record the blocks (checked) as resident, newest last - and within the event the
        tail before the head, so over capacity a chain loses its tail first, as in vLLM."""
        resident, gone = self._resident, self._gone
        changed = False
        links = (parent, *hashes[:-1])
        for i in range(len(hashes) - 1, -1, -1):
            block = hashes[i]
            record: _Block = ((links[i], base + i + 1, None) if base >= 0
                              else (links[i], 0, anchor))
            old = resident.pop(block, None)
            if old is None:
                old = gone.pop(block, None)
                changed |= old is not None  # resident again: counts may grow
            if old is not None and old != record:
                changed = True  # the same block at another depth: descendants recount
            resident[block] = record
        if changed:
            self._epoch += 1

    def _bound(self) -> None:
        """Evict resident blocks past the capacity, forget removed ones past it, and forget
        the least recently stored sessions past their bound (each a no-op when within)."""
        capacity = self.capacity
        resident, gone, sessions = self._resident, self._gone, self._sessions
        if len(resident) > capacity:
            while len(resident) > capacity:
                block, record = resident.popitem(last=False)
                gone[block] = record
                self.evicted += 1
            self._epoch += 1
        while len(gone) > capacity:
            gone.popitem(last=False)
        if len(sessions) > capacity or len(sessions) > self.max_sessions:
            bound = min(self.max_sessions, capacity)
            while len(sessions) > bound:
                sessions.popitem(last=False)


class Residency:
    """Every D/R node's index, by node URL (what a policy asks: held tokens per session)."""

    def __init__(self, capacity: int | None = None) -> None:
        self.nodes: dict[str, NodeResidency] = {}
        self.capacity = capacity  # --kv-blocks: every node's, overriding its /metrics

    def node(self, url: str) -> NodeResidency:
        """The index of a node (created empty: every session unknown)."""
        index = self.nodes.get(url)
        if index is None:
            index = self.nodes[url] = NodeResidency()
            if self.capacity is not None:
                index.set_capacity(self.capacity)
        return index

    def node_capacity(self, url: str, blocks: int | None) -> None:
        """A node's KV capacity as its /metrics reports it (--kv-blocks, when set, wins)."""
        index = self.nodes.get(url)
        if blocks:
            # What a node claims is clamped to what the proxy keeps per node (10^12 blocks
            # claimed were believed); --kv-blocks, the operator's own word, is not.
            blocks = min(blocks, MAX_CLAIMED_KV_BLOCKS)
        if index is not None and blocks and self.capacity is None and index.capacity != blocks:
            index.set_capacity(blocks)

    def held_tokens(self, url: str | None, session_id: str) -> int | None:
        """Leading tokens of session's history that node holds; None if not known."""
        return self.held(url, session_id)[0]

    def held(self, url: str | None, session_id: str,
             default_block_size: int = 16) -> tuple[int | None, int]:
        """(held tokens or None, the node's block size) for a session on a node."""
        index = self.nodes.get(url) if url is not None else None
        if index is None:
            return None, default_block_size
        return index.held_tokens(session_id), index.block_size(session_id, default_block_size)
