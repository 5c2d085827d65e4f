"""Many multi-turn conversations through a proxy URL, and the checks on where turns ran."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.fakes.fake_vllm import FakeVLLM
from tests.proxy.helpers import reply_text


@dataclass(frozen=True, slots=True)
class Turn:
    """One answered turn, as the client saw it."""

    conversation: int
    turn: int
    status: int
    headers: dict[str, str]
    text: str

    @property
    def route(self) -> str | None:
        return self.headers.get("x-ppd-route")

    @property
    def served_by(self) -> str:
        """The replica (haproxy's header) and worker that answered."""
        return f"{self.headers.get('x-ppd-replica', '-')}/{self.headers.get('x-ppd-worker', '-')}"


@dataclass
class Conversations:
    """n conversations, each with its own opening, advanced one turn per round."""

    url: str
    n: int
    concurrency: int = 16
    history: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    turns: dict[int, list[Turn]] = field(default_factory=lambda: defaultdict(list))

    def opening(self, c: int) -> str:
        return f"Conversation {c}: tell me something about the number {c}."

    async def round(self, k: int, conversations: range | list[int] | None = None) -> list[Turn]:
        """Turn k of each conversation; a new connection per request (so the kernel or the
        load balancer picks the worker or replica afresh every time)."""
        limits = httpx.Limits(max_keepalive_connections=0)
        semaphore = asyncio.Semaphore(self.concurrency)
        async with httpx.AsyncClient(base_url=self.url, timeout=30, limits=limits) as client:
            async def one(c: int) -> Turn:
                async with semaphore:
                    return await self._turn(client, c, k)
            return list(await asyncio.gather(*(one(c) for c in (conversations or range(self.n)))))

    async def _turn(self, client: httpx.AsyncClient, c: int, k: int) -> Turn:
        messages = self.history.setdefault(c, [])
        messages.append({"role": "user", "content": self.opening(c) if k == 1 else f"turn {k}"})
        stream = c % 2 == 0
        body = {"model": "fake-model", "messages": messages, "max_tokens": 8, "stream": stream}
        response = await client.post("/v1/chat/completions", json=body)
        text = reply_text(response) if response.status_code == 200 else ""
        turn = Turn(c, k, response.status_code, dict(response.headers), text)
        if response.status_code == 200:
            messages.append({"role": "assistant", "content": text})
        else:
            messages.pop()  # the client retries this turn later
        self.turns[c].append(turn)
        return turn


def check_every_later_turn_ran_locally_on_its_d(
        convs: Conversations, prefills: list[FakeVLLM], decodes: list[FakeVLLM]) -> None:
    """Every turn answered 200; turns 2+ ran locally on the D of turn 1, by the proxy's headers
    and by what the fake nodes received; no session lost or crossed."""
    sessions: dict[str, int] = {}
    home: dict[int, str] = {}
    for c in range(convs.n):
        turns = convs.turns[c]
        assert [t.status for t in turns] == [200] * len(turns), (c, turns)
        session_ids = {t.headers["x-ppd-session"] for t in turns}
        assert len(session_ids) == 1, f"conversation {c} changed session: {turns}"
        sid = session_ids.pop()
        assert sessions.setdefault(sid, c) == c, f"conversations {sessions[sid]} and {c} crossed"
        home[c] = turns[0].headers["x-ppd-decode"]
        for t in turns:
            assert t.headers["x-ppd-turn"] == str(t.turn), t
            if t.turn >= 2:
                assert (t.route, t.headers["x-ppd-decode"]) == ("local", home[c]), t
    # The nodes' side: P saw only first turns; each later turn reached its home D without
    # KV-transfer parameters (a local turn), and no other D.
    opening_of = {convs.opening(c): c for c in range(convs.n)}
    p_turns = [len(r.body["messages"]) for p in prefills for r in p.completions]
    assert sorted(p_turns) == [1] * convs.n
    seen: dict[tuple[int, int], list[str]] = defaultdict(list)
    for d in decodes:
        for r in d.completions:
            c = opening_of[r.body["messages"][0]["content"]]
            k = (len(r.body["messages"]) + 1) // 2
            seen[c, k].append(d.url)
            if k >= 2:
                assert "kv_transfer_params" not in r.body, (c, k)
    for c in range(convs.n):
        for t in convs.turns[c]:
            expected = home[c] if t.turn >= 2 else t.headers["x-ppd-decode"]
            assert seen[c, t.turn] == [expected], (c, t.turn, seen[c, t.turn])


def crossings(convs: Conversations) -> tuple[int, int]:
    """(turns served by another worker/replica than the conversation's previous turn, turns
    after a first one)."""
    moved = total = 0
    for turns in convs.turns.values():
        for before, after in zip(turns, turns[1:], strict=False):
            total += 1
            moved += before.served_by != after.served_by
    return moved, total
