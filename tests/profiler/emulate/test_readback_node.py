"""Emulated nodes with bidirectional transfer (in-process, linear preset): a D's whole answer
names the blocks it keeps, and a P leg carrying them reads the history back from that D and
computes only the rest (docs/readback.md)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from profiler.emulate.presets import resolve
from profiler.emulate.serve import HostedNode, hosted
from profiler.emulate.tokenizer import Vocabulary
from proxy.readback.protocol import held_kv, matched_tokens, prefill_params
from proxy.shared.vocabulary import Role
from proxy.upstream.pd_protocol import decode_body, prefill_body
from tests.profiler.emulate.test_node import HISTORY, MODEL, chat, metrics


@pytest.fixture
async def nodes(vocab: Vocabulary) -> AsyncIterator[list[HostedNode]]:
    preset = resolve("linear", MODEL, max_model_len=4096)
    async with hosted(preset, [(Role.PREFILL, 0), (Role.DECODE, 0)], vocab=vocab,
                      readback_ttl_s=60.0) as running:
        yield running


async def pd_turn(client: httpx.AsyncClient, p: str, d: str, body: dict[str, Any],
                  p_params: dict[str, Any] | None = None) -> dict[str, Any]:
    p_body = prefill_body(body)
    if p_params is not None:
        p_body["kv_transfer_params"] = p_params
    answer = (await client.post(f"{p}/v1/chat/completions", json=p_body)).json()
    d_body = {**decode_body(body, answer["kv_transfer_params"]), "return_token_ids": True}
    return (await client.post(f"{d}/v1/chat/completions", json=d_body)).json()


async def test_d_names_its_blocks_and_p_reads_them_back(nodes: list[HostedNode],
                                                        vocab: Vocabulary) -> None:
    p, d = (n.url for n in nodes)
    async with httpx.AsyncClient(timeout=30) as client:
        first = await pd_turn(client, p, d, chat(max_tokens=8))
        params = first["kv_transfer_params"]
        prompt = len(first["prompt_token_ids"])
        assert params["do_remote_decode"] is True and params["remote_block_ids"]
        assert params["remote_num_tokens"] == prompt + 8 - 1
        assert len(first["choices"][0]["token_ids"]) == 8
        held = held_kv(first, d, 0.0, 60.0)
        assert held is not None

        reply = first["choices"][0]["message"]["content"]
        body = {"model": MODEL, "max_tokens": 4, "messages": [
            {"role": "user", "content": HISTORY}, {"role": "assistant", "content": reply},
            {"role": "user", "content": "And lakes?"}]}
        tokenized = (await client.post(f"{p}/tokenize", json=body)).json()
        assert tokenized["tokens"] == vocab.encode_chat(body["messages"])
        matched = matched_tokens(held.token_ids, tokenized["tokens"])
        assert matched == held.tokens  # the emulator's replies re-tokenize to their own ids

        before = await metrics(client, p)
        second = await pd_turn(client, p, d, body, prefill_params(held, matched))
        after = await metrics(client, p)
    external = "vllm:external_prefix_cache_hits_total"
    local = "vllm:prefix_cache_hits_total"
    # P holds turn 1's prompt in whole blocks; it reads the rest of the history from D.
    own = after[local] - before[local]
    assert own > 0 and after[external] - before[external] == matched - own
    assert second["usage"]["completion_tokens"] == 4
