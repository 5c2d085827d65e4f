"""`ppd replay --reset-prefix-cache`: every node behind the proxy reset before the run; a node
without vLLM's dev-mode route, or one that keeps refusing, is a clear error."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from profiler.replay.cli import main as replay_main
from profiler.replay.prefix_reset import PrefixResetError, reset_prefix_caches
from proxy import ProxyConfig, create_app
from proxy.config.cluster_file import NodeSpec
from proxy.config.policy_config import Policy, PolicyConfig
from proxy.serving.server import running
from proxy.shared.vocabulary import Role
from tests.fakes.fake_vllm import FakeVLLM


def _proxy_config(p: FakeVLLM, d: FakeVLLM) -> ProxyConfig:
    return ProxyConfig(nodes=(NodeSpec(p.url, Role.PREFILL), NodeSpec(d.url, Role.DECODE)),
                       policy=PolicyConfig(kind=Policy.PD), port=0)


async def test_every_node_the_proxy_lists_is_reset() -> None:
    async with (FakeVLLM("p") as p, FakeVLLM("d") as d,
                running(create_app(_proxy_config(p, d))) as proxy):
        reset = await asyncio.to_thread(reset_prefix_caches, proxy.url)
    assert sorted(reset) == sorted([p.url, d.url])
    assert (p.prefix_cache_resets, d.prefix_cache_resets) == (1, 1)


async def test_a_target_that_is_not_a_proxy_is_reset_itself() -> None:
    async with FakeVLLM("node") as node:
        assert await asyncio.to_thread(reset_prefix_caches, node.url) == [node.url]
    assert node.prefix_cache_resets == 1


async def test_a_node_without_dev_mode_is_named_with_the_fix() -> None:
    async with FakeVLLM("p") as p, FakeVLLM("d") as d:
        d.dev_mode = False
        async with running(create_app(_proxy_config(p, d))) as proxy:
            with pytest.raises(PrefixResetError, match=f"node {d.url} .*404.*"
                               "VLLM_SERVER_DEV_MODE=1"):
                await asyncio.to_thread(reset_prefix_caches, proxy.url)


async def test_blocks_still_held_are_waited_for_then_reported() -> None:
    async with FakeVLLM("node") as node:
        node.reset_refusals = 2  # KV not pulled yet: vLLM answers success false, then true
        naps: list[float] = []
        await asyncio.to_thread(reset_prefix_caches, node.url, sleep=naps.append)
        assert node.prefix_cache_resets == 1 and len(naps) == 2
        node.reset_refusals = 1000
        with pytest.raises(PrefixResetError, match="still holds KV blocks"):
            await asyncio.to_thread(reset_prefix_caches, node.url, retry_for_s=0.3)


async def test_the_replay_flag_resets_before_the_run(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    async with (FakeVLLM("p") as p, FakeVLLM("d") as d,
                running(create_app(_proxy_config(p, d))) as proxy):
        argv = ["--target", proxy.url, "--dataset", "synthetic:mixed", "--conversation-rate",
                "50", "--duration", "1", "--max-conversations", "1", "--max-turns", "1",
                "--out", str(tmp_path / "run"), "--no-progress", "--reset-prefix-cache"]
        code = await asyncio.to_thread(replay_main, argv)
    assert code == 0
    assert (p.prefix_cache_resets, d.prefix_cache_resets) == (1, 1)
    assert "reset the prefix cache of 2 node(s)" in capsys.readouterr().err
    # recorded for `ppd report compare`'s warm-cache warning
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["reset_prefix_cache"]
