"""Load signals: vLLM's /metrics gauges, scraped in the background, with their age."""

from __future__ import annotations

import asyncio

import httpx

from proxy.observability.node_gauges import NodeGauges, parse_metrics

# The shape of vLLM 0.32's page: HELP/TYPE lines, an engine label, histograms around.
VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
vllm:num_requests_running{engine="1",model_name="tiny"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 4.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="tiny"} 0.0
vllm:time_to_first_token_seconds_count{model_name="tiny"} 9.0
vllm:num_requests_running_total{model_name="tiny"} 99.0
"""


def test_parse_sums_engines_and_ignores_the_rest() -> None:
    reading = parse_metrics(VLLM_METRICS, at=5.0)
    assert (reading.running, reading.waiting, reading.kv_usage, reading.at) == (5.0, 4.0,
                                                                                0.25, 5.0)


def test_old_kv_usage_name_and_missing_gauges() -> None:
    reading = parse_metrics("vllm:gpu_cache_usage_perc 0.5\n", at=0.0)
    assert (reading.running, reading.waiting, reading.kv_usage) == (0.0, 0.0, 0.5)
    assert parse_metrics("", at=0.0).kv_usage is None


async def test_background_scrape_keeps_the_last_reading_and_its_age_grows() -> None:
    now = [100.0]
    healthy = {"http://d0": True}

    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/metrics"
        if healthy["http://d0"]:
            return httpx.Response(200, text=VLLM_METRICS)
        return httpx.Response(503)

    signals = NodeGauges(clock=lambda: now[0])
    signals.start(lambda: ["http://d0"], interval=0.01, transport=httpx.MockTransport(answer))
    try:
        for _ in range(200):
            if signals.get("http://d0") is not None:
                break
            await asyncio.sleep(0.01)
        assert signals.get("http://d0") is not None and signals.age("http://d0") == 0.0
        healthy["http://d0"] = False
        failures = signals.failures.get("http://d0", 0)
        for _ in range(200):
            if signals.failures.get("http://d0", 0) > failures:
                break
            await asyncio.sleep(0.01)
        now[0] += 7.0
        assert signals.age("http://d0") == 7.0  # the failed scrape kept the old reading
        assert signals.get("http://d0").running == 5.0  # type: ignore[union-attr]
    finally:
        await signals.stop()
    assert signals.age("http://unknown") is None


def test_kv_capacity_in_blocks_from_cache_config_info() -> None:
    page = ('vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="2048"} 1.0\n'
            'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1024"} 1.0\n'
            "vllm:num_requests_running 1\n")
    assert parse_metrics(page, 0.0).kv_blocks == 3072
    assert parse_metrics(page, 0.0).kv_block_size == 16
    # Room for new KV: (1 - usage) x blocks x block size; unknown without the usage gauge.
    assert parse_metrics(page, 0.0).free_kv_tokens is None
    used = page + "vllm:kv_cache_usage_perc 0.25\n"
    assert parse_metrics(used, 0.0).free_kv_tokens == 3072 * 16 * 3 // 4
    assert parse_metrics("vllm:num_requests_running 1\n", 0.0).kv_blocks is None
    odd = 'vllm:cache_config_info{num_gpu_blocks="None"} 1.0\n'  # before the engine profiled
    assert parse_metrics(odd, 0.0).kv_blocks is None
