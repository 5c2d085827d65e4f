"""A short soak (benchmarks/soak.py is the long one): streaming conversations through a real
`ppd proxy` process against fakes in another process, two identical rounds. Nothing is lost or
hung, the in-flight gauges return to 0, and once the keep-alive has passed no connection of a
departed client is left open (CLOSE-WAIT) and the descriptors are back where they started.
Also: SIGTERM lets an open stream finish instead of cutting it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import httpx
import pytest

from benchmarks.soak import close_wait_on_port, fake_nodes, probe, proxy_process, run_round
from proxy.serving.http_server import KEEP_ALIVE_S


def test_two_rounds_of_conversations_lose_nothing_and_leave_no_connection_behind() -> None:
    with fake_nodes() as urls, proxy_process(urls) as (url, pid):
        port = int(url.rsplit(":", 1)[1])
        start = probe(url, pid)
        rounds, settled = [], []
        for _ in range(2):
            rounds.append(asyncio.run(run_round(url, clients=40, seconds=1.0)))
            assert probe(url, pid).in_flight == 0
            # Idle connections close KEEP_ALIVE_S after their last byte, the client's and the
            # nodes' (the fakes close idle upstream connections like vLLM). Waited on by reading
            # /proc only: a /metrics request would leave a connection of its own.
            deadline = time.monotonic() + 2 * KEEP_ALIVE_S + 5
            while time.monotonic() < deadline and (
                    close_wait_on_port(port) or open_fds(pid) > start.fds + 4):
                time.sleep(0.25)
            settled.append(probe(url, pid))
    for result in rounds:
        assert result.conversations >= 40 and result.requests >= 80, result
        assert (result.lost, result.hung) == (0, 0), result
    for after in settled:
        assert after.close_wait == 0 and after.in_flight == 0, after
        assert after.fds <= start.fds + 4, (start, settled)


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_sigterm_lets_an_open_stream_finish_and_refuses_new_connections() -> None:
    with fake_nodes(("p1", "d1"), chunk_delay_s=0.2) as urls, \
            proxy_process(urls, "--shutdown-grace", "30") as (url, pid):
        body = {"model": "fake-model", "stream": True,
                "messages": [{"role": "user", "content": "hi"}]}
        with httpx.Client(base_url=url, timeout=30) as client, \
                client.stream("POST", "/v1/chat/completions", json=body) as response:
            stream = response.iter_lines()
            while not (line := next(stream)).startswith("data: {"):
                pass
            os.kill(pid, signal.SIGTERM)
            time.sleep(0.3)
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"{url}/health")
            lines = [line] + [line for line in stream if line]
        for _ in range(100):  # the process exits once its last stream is done
            if _exited(pid):
                break
            time.sleep(0.1)
        else:
            pytest.fail("the proxy did not exit after its last stream")
    text = "".join((choice.get("delta") or {}).get("content") or ""
                   for line in lines if line.startswith("data: {")
                   for choice in json.loads(line[6:])["choices"])
    assert lines[-1] == "data: [DONE]" and text == "Hello from d1, a fake node."


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _exited(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"  # a child not yet waited for
    except OSError:
        return True
