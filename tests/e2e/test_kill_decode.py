"""A D node killed in the middle of a replay (real vLLM, 1P2D, tiny model).

Six conversations stream their turns through the proxy (policy local) while one D, the one
holding the most sessions, is killed with SIGKILL. Checked: nearly every request succeeds; each
failure is a clean error the client can see (a 5xx with an OpenAI error body before the stream
started, or an error event inside the stream), never a stream that just stops or a dropped
connection; the dead D's conversations go on P->D on the other D; and the dead D leaves the
pool quickly (printed, with the success rate, in the closing table).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from profiler.cluster.launcher import Cluster
from proxy import ServerThread, config_from_args, create_app
from proxy.shared.vocabulary import Role
from tests.e2e.support import filler, start_e2e_cluster

CONVERSATIONS = 6
TURNS_BEFORE_KILL = 2  # every conversation has a home D before the kill
TURNS_AFTER_KILL = 3
LONG_TOKENS = 400


@pytest.fixture(scope="module")
def doomed_cluster(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[Cluster]:
    # This module kills a node, so it owns its cluster.
    with start_e2e_cluster("1P2D", tiny_model, tmp_path_factory) as cluster:
        yield cluster


@dataclass
class Outcome:
    """One request as the client saw it."""

    conversation: int
    turn: int
    started: float
    ok: bool
    route: str | None = None
    decode: str | None = None
    failure: str | None = None  # "5xx" / "in-band" (clean) or "broken: ..." (not)


def stream_turn(proxy: str, session: str, messages: list[dict[str, str]], conversation: int,
                turn: int, max_tokens: int, streaming: threading.Event | None = None,
                ) -> tuple[Outcome, str]:
    """One streamed turn (`streaming` is set at its first token); its outcome and reply."""
    outcome = Outcome(conversation, turn, time.monotonic(), ok=False)
    body = {"model": "tiny", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    parts: list[str] = []
    try:
        with httpx.stream("POST", f"{proxy}/v1/chat/completions", json=body, timeout=120,
                          headers={"x-session-id": session}) as response:
            outcome.route = response.headers.get("x-ppd-route")
            outcome.decode = response.headers.get("x-ppd-decode")
            if response.status_code != 200:
                error = json.loads(response.read())["error"]
                assert isinstance(error["message"], str)
                outcome.failure = f"{response.status_code}"
                return outcome, ""
            done = False
            for line in response.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    event = json.loads(line[6:])
                    if "error" in event:
                        outcome.failure = "in-band"
                        return outcome, ""
                    parts += [(c.get("delta") or {}).get("content") or ""
                              for c in event.get("choices", [])]
                    if streaming is not None and "".join(parts):
                        streaming.set()
            if not done:
                outcome.failure = "broken: stream ended without [DONE] or an error"
                return outcome, ""
    except (httpx.HTTPError, ValueError, KeyError, AssertionError) as exc:
        outcome.failure = f"broken: {type(exc).__name__}: {exc}"
        return outcome, ""
    outcome.ok = True
    return outcome, "".join(parts)


def test_killing_a_d_mid_replay(doomed_cluster: Cluster, tiny_model: Path) -> None:
    config = config_from_args(["--cluster", str(doomed_cluster.cluster_file), "--policy",
                               "local", "--port", "0", "--tokenizer", str(tiny_model)])
    d_urls = doomed_cluster.urls(Role.DECODE)
    outcomes: list[Outcome] = []
    homes: dict[int, str] = {}  # conversation -> its D before the kill
    warmed = threading.Barrier(CONVERSATIONS + 1)
    released = threading.Event()
    streaming = {n: threading.Event() for n in range(CONVERSATIONS)}

    def converse(proxy: str, n: int) -> None:
        messages: list[dict[str, str]] = []
        for turn in range(TURNS_BEFORE_KILL + TURNS_AFTER_KILL):
            in_flight_at_kill = turn == TURNS_BEFORE_KILL
            if in_flight_at_kill:
                warmed.wait(timeout=300)
                released.wait(timeout=60)
            messages.append({"role": "user", "content": filler(120 if turn == 0 else 20,
                                                               seed=n * 100 + turn)})
            # The turn in flight at the kill is long, so the kill lands in mid-stream.
            outcome, reply = stream_turn(proxy, f"kill-{n}", messages, n, turn,
                                         LONG_TOKENS if in_flight_at_kill else 16,
                                         streaming[n] if in_flight_at_kill else None)
            outcomes.append(outcome)
            if outcome.ok:
                messages.append({"role": "assistant", "content": reply})
                if turn < TURNS_BEFORE_KILL:
                    homes[n] = outcome.decode or ""
            else:
                messages.pop()

    with ServerThread(create_app(config)) as server, ThreadPoolExecutor(CONVERSATIONS) as pool:
        futures = [pool.submit(converse, server.url, n) for n in range(CONVERSATIONS)]
        warmed.wait(timeout=300)
        victim = max(d_urls, key=lambda url: list(homes.values()).count(url))
        survivor = next(url for url in d_urls if url != victim)
        # The D dies once one of its conversations is streaming its long turn.
        released.set()
        victims = [n for n, home in homes.items() if home == victim]
        deadline = time.monotonic() + 60
        while not any(streaming[n].is_set() for n in victims) and time.monotonic() < deadline:
            time.sleep(0.01)
        node = next(n for n in doomed_cluster.nodes if n.url == victim)
        killed_at = time.monotonic()
        os.killpg(node.proc.pid, signal.SIGKILL)
        out_of_pool = _wait_out_of_pool(server.url, victim, timeout=60)
        for future in futures:
            future.result()

    after = [o for o in outcomes if o.turn >= TURNS_BEFORE_KILL]
    ok = [o for o in outcomes if o.ok]
    failures = [o for o in outcomes if not o.ok]
    print(f"\nkill of {victim}: {len(ok)}/{len(outcomes)} requests ok "
          f"({len(after)} after the kill); failures: {[o.failure for o in failures]}; "
          f"out of the pool {out_of_pool - killed_at:.2f} s after the kill; "
          f"conversations homed on it: {sorted(n for n, d in homes.items() if d == victim)}")
    assert not [o for o in failures if (o.failure or "").startswith("broken")], failures
    assert len(ok) >= len(outcomes) - CONVERSATIONS  # at most the turns in flight at the kill
    for n, home in homes.items():
        later = sorted((o for o in after if o.conversation == n and o.ok), key=lambda o: o.turn)
        assert later, f"conversation {n} never succeeded after the kill"
        assert all(o.decode == survivor for o in later if o.started > out_of_pool)
        if home == victim:  # its first turn on the survivor re-prefills: P->D
            first_on_survivor = next(o for o in later if o.decode == survivor)
            assert first_on_survivor.route == "pd", later
    assert any(home == victim for home in homes.values())


def _wait_out_of_pool(proxy: str, victim: str, timeout: float) -> float:
    """The moment the proxy stops counting the victim as usable (health or circuit)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        nodes = httpx.get(f"{proxy}/health", timeout=5).json()["nodes"]
        node = next(n for n in nodes if n["url"] == victim)
        if not node["healthy"] or node["circuit"] == "open":
            return time.monotonic()
        time.sleep(0.02)
    raise AssertionError(f"{victim} still in the pool {timeout} s after its death")
