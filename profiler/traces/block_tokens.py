"""Prompts as token ids made from block hashes: equal hashes give equal token blocks.

A block-hash trace (`profiler.traces.mooncake`) carries no text, so a node that needs tokens
gets made-up ones: block `h`'s tokens are drawn from a generator seeded by (seed, h) over the
model's vocabulary range, so two prompts that share leading hash ids share those leading
tokens exactly (a prefix cache hits), and different hashes give different blocks (equal only
by a chance of about vocab**-block, never in practice).

Without a vocabulary (`vocab_size=None`, the simulator's: its engines only compare ids) block
`h`'s ids are simply `DISTINCT_BASE + 512 h + position`: as exact, and made ten times faster
than drawn ones (a 300 s window of the Mooncake trace is 12 M prompt tokens).

A continuation (`continuation`) starts with its parent's exact prompt, partial last block
included, then goes on with its own ids from there: what a real chat prompt is (the previous
prompt, then the reply and the new message), so a proxy that matches a turn by its prompt
extending the previous one (`proxy.sessions.session.TokenTranscript`) sees a continuation.
Its blocks after the parent's end are its own hashes' blocks at their own positions; only the
block that holds the parent's partial tail is a mix (that tail, then its own block's rest),
the same for every turn that continues the same chain.

`scale` shrinks every block to fit a small model's context: at 0.1 a 512-token block is 51
tokens, a partial last block and the output length shrink alike. Keep a block a multiple of the
engine's KV block (vLLM: 16 tokens on GPU, 128 on CPU; scale 0.25 there) or shared blocks hit
only in part, and not at all below one KV block.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from profiler.traces.mooncake import BLOCK_TOKENS, BlockRecord

FIRST_TOKEN_ID = 100  # below it sit the special tokens of small vocabularies
# Ids of blocks made without a vocabulary: above the simulator's fresh user tokens (1 << 40
# up) and sampled outputs, so they never equal either.
DISTINCT_BASE = 1 << 44
# Blocks kept made (a FIFO): the shared first block and recent parents' blocks are reused
# within minutes; a whole hour's blocks would not fit in memory as Python lists.
MAX_CACHED_BLOCKS = 8192


@dataclass(slots=True)
class BlockTokens:
    """Token ids for block hashes, deterministic in (seed, hash id, scale, vocabulary);
    vocab_size None: distinct ids without a vocabulary (the simulator's)."""

    vocab_size: int | None = None
    scale: float = 1.0
    seed: int = 0
    _blocks: dict[int, list[int]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.vocab_size is not None and self.vocab_size <= FIRST_TOKEN_ID + 1:
            raise ValueError(f"vocabulary size must be > {FIRST_TOKEN_ID + 1}, "
                             f"got {self.vocab_size}")
        if not (math.isfinite(self.scale) and 0 < self.scale <= 1):
            raise ValueError(f"--scale-tokens must be in (0, 1], got {self.scale:g}")

    @property
    def block_size(self) -> int:
        """Tokens per (complete) block at this scale."""
        return max(1, round(BLOCK_TOKENS * self.scale))

    def scaled(self, tokens: int) -> int:
        """A length (an output, a history) at this scale, at least 1."""
        return max(1, round(tokens * self.scale))

    def block(self, hash_id: int) -> list[int]:
        """The complete block's token ids (drawn ones cached: shared blocks are made once)."""
        if self.vocab_size is None:
            start = DISTINCT_BASE + (hash_id + self.seed * (1 << 24)) * BLOCK_TOKENS
            return list(range(start, start + self.block_size))
        tokens = self._blocks.get(hash_id)
        if tokens is None:
            import numpy as np

            rng = np.random.default_rng([self.seed & 0xFFFFFFFF, hash_id & 0xFFFFFFFFFFFF])
            tokens = rng.integers(FIRST_TOKEN_ID, self.vocab_size, self.block_size).tolist()
            if len(self._blocks) >= MAX_CACHED_BLOCKS:
                del self._blocks[next(iter(self._blocks))]
            self._blocks[hash_id] = tokens
        return tokens

    def prompt(self, record: BlockRecord) -> list[int]:
        """The record's prompt: its complete blocks whole, its partial last block as the
        leading part of that block's tokens (scaled like the rest)."""
        size = self.block_size
        ids: list[int] = []
        for hash_id in record.hash_ids[:record.complete_blocks]:
            ids.extend(self.block(hash_id))
        partial = record.input_length - record.complete_blocks * BLOCK_TOKENS
        if partial:
            ids.extend(self.block(record.hash_ids[-1])[:min(self.scaled(partial), size)])
        return ids

    def continuation(self, record: BlockRecord, parent_prompt: Sequence[int]) -> list[int]:
        """The record's prompt as the turn after one whose prompt was `parent_prompt`: those
        ids exactly, then the record's own ids from the parent's length on (its complete blocks
        past the parent's stay where `prompt` puts them). At least one id of its own: a turn
        no longer than its parent once scaled (or in the trace) gets one id of its last block,
        so it still strictly extends its parent."""
        own = self.prompt(record)
        start = len(parent_prompt)
        tail = own[start:] or [self.block(record.hash_ids[-1])[start % self.block_size]]
        return [*parent_prompt, *tail]

    def forget(self) -> None:
        """Drop the cached blocks (a long run keeps only what it reuses soon)."""
        self._blocks.clear()
