"""The one conversation model every trace loader produces and the replay client consumes.

A conversation is a system prompt (optional) and a sequence of user turns. Each turn keeps the
dataset's reference answer only as a *length target*: on replay the history sent with turn k+1
contains the model's actual reply to turn k (so the decode node's prefix cache can match), never
the reference text.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from proxy.shared.tokens import TokenCounter


@dataclass(frozen=True, slots=True)
class Turn:
    """One user turn.

    user: the user message of this turn.
    reference_answer: the dataset's assistant answer (None for synthetic workloads).
    n_out_tokens: the reference answer's length in tokens, the replay's max_tokens target.
    """

    user: str
    reference_answer: str | None
    n_out_tokens: int | None


@dataclass(frozen=True, slots=True)
class Conversation:
    """A multi-turn conversation: an id, at least one user turn, an optional system prompt.

    language is what the dataset says (WildChat, LMSYS), None where it says nothing.
    """

    id: str
    turns: tuple[Turn, ...]
    system: str | None = None
    language: str | None = None

    def context_tokens(self, tokenizer: TokenCounter) -> list[int]:
        """Cumulative context size after each turn: system + every user and reference answer.

        This is what the serving side holds once turn k is answered with a reply of the
        reference length, the number to keep below a model's maximum length.
        """
        total = tokenizer.count(self.system) if self.system else 0
        sizes: list[int] = []
        for turn in self.turns:
            total += tokenizer.count(turn.user) + (turn.n_out_tokens or 0)
            sizes.append(total)
        return sizes


def with_token_counts(conversation: Conversation, tokenizer: TokenCounter) -> Conversation:
    """The conversation with every reference answer's n_out_tokens counted by tokenizer."""
    turns = tuple(
        replace(turn, n_out_tokens=tokenizer.count(turn.reference_answer))
        if turn.reference_answer is not None
        else turn
        for turn in conversation.turns
    )
    return replace(conversation, turns=turns)


def truncate_turns(conversation: Conversation, n_turns: int) -> Conversation:
    """The conversation's first n_turns turns (n_turns >= 1)."""
    return replace(conversation, turns=conversation.turns[:n_turns])


# Role names seen in the supported datasets, mapped onto the three roles of the model.
_ROLE_ALIASES: dict[str, str] = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "system": "system",
}


def canonical_role(role: str) -> str | None:
    """'user', 'assistant' or 'system' for a dataset's role name; None when it is unknown."""
    return _ROLE_ALIASES.get(role.strip().lower())


def from_messages(
    conversation_id: str,
    messages: Iterable[tuple[str, str]],
    tokenizer: TokenCounter | None,
    *,
    language: str | None = None,
) -> Conversation | None:
    """Build a Conversation from (canonical role, text) pairs; None if no complete turn remains.

    Reference answers are counted with tokenizer; with None their n_out_tokens stay None until
    `with_token_counts` (loaders count only the conversations they keep).

    Rules, shared by every loader so datasets behave alike:
    - system messages before the first user message form the system prompt (joined);
    - leading assistant messages (a bot greeting, a truncated split part) are dropped;
    - consecutive messages of the same role are joined with a blank line;
    - empty messages are ignored; unknown roles are skipped (tool calls etc.);
    - a trailing user message without an answer is dropped: it has no reference length to
      replay, and replaying it with an invented length would skew the output distribution.
    """
    system_parts: list[str] = []
    blocks: list[tuple[str, list[str]]] = []
    for role, text in messages:
        if not text or not text.strip():
            continue
        if role == "system":
            if not blocks:
                system_parts.append(text)
            continue  # a mid-conversation system message has no place in the turn model
        if role not in ("user", "assistant"):
            continue
        if not blocks and role == "assistant":
            continue
        if blocks and blocks[-1][0] == role:
            blocks[-1][1].append(text)
        else:
            blocks.append((role, [text]))
    turns: list[Turn] = []
    for index in range(0, len(blocks) - 1, 2):
        user = "\n\n".join(blocks[index][1])
        answer = "\n\n".join(blocks[index + 1][1])
        n_out = tokenizer.count(answer) if tokenizer is not None else None
        turns.append(Turn(user=user, reference_answer=answer, n_out_tokens=n_out))
    if not turns:
        return None
    system = "\n\n".join(system_parts) if system_parts else None
    return Conversation(id=conversation_id, turns=tuple(turns), system=system, language=language)

