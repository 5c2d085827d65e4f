"""Issue #45's failures 17-19 replayed against `ppd proxy` in its own process:

17. the store trusted: records in a shared Redis with non-numeric fields, missing keys or
    wrong types gave 500s, /sessions included - now dropped and counted
    (`ppd_store_records_rejected_total`), the turn served as a new session: the request in
    question gets a 200, under the bar of tests/proxy/trust/served.py;
18. a CR/LF in a cluster.json URL (a traceback);
19. a YAML alias bomb in --config (17 s, then an empty `error:`).

18 and 19 are operator files, read at start-up: there is no served proxy to watch, so the
replay asserts the start-up itself - a clean exit 1 within a time budget, one line on stderr
naming the file and what is wrong in it, no traceback.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

import httpx
import redis

from tests.fakes.fake_vllm import FakeVLLM
from tests.fakes.redis_server import RedisServer, free_port
from tests.proxy.trust.served import metric, ppd_proxy_command, served_proxy, watching
from tests.proxy.trust.test_operator_files import BOMB

ADMIN = "admin-key"
FIRST = [{"role": "user", "content": "hello there"}]
SECOND = [*FIRST, {"role": "assistant", "content": "Hello from d, a fake node."},
          {"role": "user", "content": "and again"}]
BAD_FIELDS = {"turns": "zz", "last_access": "nan", "created": "-5", "hl": "2", "hd": "x"}


def corrupt_every_session(url: str) -> int:
    """Wrong types in every session record the proxy wrote; how many were changed."""
    client = redis.Redis.from_url(url)
    try:
        changed = 0
        for key in client.scan_iter(match="*s:*"):
            if client.type(key) == b"hash":
                client.hset(key, mapping=BAD_FIELDS)
                client.hdel(key, "opening")  # and a missing key
                changed += 1
        return changed
    finally:
        client.close()


async def get(url: str, path: str, **kw: object) -> httpx.Response:
    return await asyncio.to_thread(httpx.get, url + path, timeout=10, **kw)  # type: ignore[arg-type]


async def chat(url: str, messages: list[dict[str, str]]) -> httpx.Response:
    return await asyncio.to_thread(httpx.post, url + "/v1/chat/completions", timeout=30, json={
        "model": "fake-model", "max_tokens": 16, "messages": messages})


async def test_17_bad_store_records_are_dropped_counted_and_never_a_500(tmp_path: Path) -> None:
    with RedisServer(tmp_path) as store:
        async with FakeVLLM("p") as p, FakeVLLM("d") as d:
            flags = ["--prefill", p.url, "--decode", d.url, "--session-store", store.url,
                     "--admin-key", ADMIN]
            async with served_proxy(flags) as first:
                assert (await chat(first.url, FIRST)).status_code == 200
            assert corrupt_every_session(store.url) >= 1
            # Another proxy on the same store: nothing cached, the bad record is read.
            async with served_proxy(flags) as proxy, watching(proxy):
                turn = await chat(proxy.url, SECOND)
                sessions = await get(proxy.url, "/sessions",
                                     headers={"authorization": f"Bearer {ADMIN}"})
                metrics = (await get(proxy.url, "/metrics")).text
    assert turn.status_code == 200 and sessions.status_code == 200, (turn.text, sessions.text)
    assert metric(metrics, "ppd_store_records_rejected_total") >= 1


def start_up(args: list[str], budget_s: float = 10.0) -> tuple[subprocess.CompletedProcess[str],
                                                               float]:
    started = time.monotonic()
    done = subprocess.run(ppd_proxy_command(args, free_port()), capture_output=True, text=True,
                          timeout=budget_s * 3)
    return done, time.monotonic() - started


def test_18_a_cr_lf_in_a_cluster_json_url(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"nodes": [
        {"role": "prefill", "url": "http://a:1\r\nX-Evil: y"},
        {"role": "decode", "url": "http://b:2"}]}))
    done, took = start_up(["--cluster", str(path)])
    assert done.returncode == 1 and took < 10.0, (done.returncode, took)
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert str(path) in done.stderr and "control character" in done.stderr


def test_19_a_yaml_alias_bomb_in_config(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    done, took = start_up(["--config", str(path)])
    assert done.returncode == 1 and took < 10.0, (done.returncode, took)  # 17 s once
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert str(path) in done.stderr and "anchors or aliases" in done.stderr
