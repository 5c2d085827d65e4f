"""What each D/R node still holds of each session, from its KV cache events (`proxy.kv_events`).

Per node an index of resident blocks (hash -> parent) and, per session, the chain of blocks
the node stored for it, in order. A session's residency is the number of leading tokens of
its history whose blocks are all still resident: `leading resident blocks x block size`.

How a block is tied to a session: vLLM (>= 0.32) tags each `BlockStored` with the request's
`session_id` body field, and the proxy sends its own session id there on D's legs. The chain
is vLLM's own, as published (each event names the parent of its first block); the proxy
neither recomputes vLLM's block hashes (their seed, algorithm and CBOR/pickle encoding of
extra keys change with version and flags) nor needs the token ids (it never sees the
chat-templated ids D prefilled). A `BlockStored` whose parent the session's chain lacks (a
shared prefix stored under another session) is joined through the node's parent links.

"Unknown" (None) means: behave as before residency existed (assume D holds what the session
ledger says). A node's index starts unknown for every session, and is reset when its event
stream had a gap that replay could not fill: whatever was learned before is forgotten, and a
session is known again once the node stores its chain from the first block.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from proxy.kv_events import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored, KvEvent

# Sessions remembered per node: above this the least recently stored are forgotten (unknown).
MAX_SESSIONS_PER_NODE = 100_000


@dataclass(slots=True)
class _Chain:
    blocks: list[BlockHash]
    positions: dict[BlockHash, int]
    block_size: int
    counted_at: int = -1  # the node's removal epoch when `resident` was counted
    resident: int = 0  # leading blocks resident then


@dataclass(slots=True)
class NodeResidency:
    """The blocks one node holds and the chain it stored for each session."""

    max_sessions: int = MAX_SESSIONS_PER_NODE
    _parent: dict[BlockHash, BlockHash | None] = field(default_factory=dict)
    _chains: OrderedDict[str, _Chain] = field(default_factory=OrderedDict)
    resets: int = 0  # times the index was forgotten after an unfillable gap
    events: int = 0
    _epoch: int = 0  # bumped by every removal: a chain's count from an older epoch is stale

    @property
    def num_blocks(self) -> int:
        """Resident blocks known to this index."""
        return len(self._parent)

    def apply(self, event: KvEvent) -> None:
        """Fold one event into the index."""
        self.events += 1
        if isinstance(event, BlockStored):
            self._stored(event)
        elif isinstance(event, BlockRemoved):
            for block in event.block_hashes:
                self._parent.pop(block, None)
            self._epoch += 1
        elif isinstance(event, AllBlocksCleared):
            self._parent.clear()  # chains stay: their blocks now count as not resident
            self._epoch += 1

    def forget(self) -> None:
        """A gap nothing could fill: every session becomes unknown until stored again."""
        self._parent.clear()
        self._chains.clear()
        self.resets += 1
        self._epoch += 1

    def block_size(self, session_id: str, default: int) -> int:
        """The block size the node stored the session's chain with (default if unknown)."""
        chain = self._chains.get(session_id)
        return chain.block_size if chain is not None else default

    def held_tokens(self, session_id: str) -> int | None:
        """Leading tokens of the session's history this node still holds; None if unknown."""
        chain = self._chains.get(session_id)
        if chain is None:
            return None
        if chain.counted_at != self._epoch:  # counted once per removal, not per request
            resident = self._parent
            if all(map(resident.__contains__, chain.blocks)):  # the usual case, at C speed
                count = len(chain.blocks)
            else:
                count = 0
                for block in chain.blocks:
                    if block not in resident:
                        break
                    count += 1
            chain.resident, chain.counted_at = count, self._epoch
        return chain.resident * chain.block_size

    def _stored(self, event: BlockStored) -> None:
        parent = event.parent
        for block in event.block_hashes:
            self._parent[block] = parent
            parent = block
        session = event.session_id
        if session is None or not event.block_hashes:
            return
        chain = self._chains.get(session)
        base = self._base(chain, event.parent)
        if base is None:
            self._chains.pop(session, None)  # its start is not known: unknown, not "none held"
            return
        blocks = base + list(event.block_hashes)
        block_size = max(1, event.num_tokens // len(event.block_hashes))
        self._chains[session] = _Chain(blocks, {b: i for i, b in enumerate(blocks)}, block_size)
        self._chains.move_to_end(session)
        while len(self._chains) > self.max_sessions:
            self._chains.popitem(last=False)

    def _base(self, chain: _Chain | None, parent: BlockHash | None) -> list[BlockHash] | None:
        """The blocks before parent's child in the session's chain (parent included)."""
        if parent is None:
            return []
        if chain is not None and (at := chain.positions.get(parent)) is not None:
            return chain.blocks[:at + 1]
        # A prefix stored under another session (or before this one was tagged): follow the
        # node's parent links back to the first block.
        walk: list[BlockHash] = []
        block: BlockHash | None = parent
        while block is not None:
            if block not in self._parent:
                return None
            walk.append(block)
            block = self._parent[block]
        walk.reverse()
        return walk


class Residency:
    """Every D/R node's index, by node URL (what a policy asks: held tokens per session)."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeResidency] = {}

    def node(self, url: str) -> NodeResidency:
        """The index of a node (created empty: every session unknown)."""
        index = self.nodes.get(url)
        if index is None:
            index = self.nodes[url] = NodeResidency()
        return index

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
