"""The one Prometheus text parser: named sums, every sum, integer labels, full families."""

from __future__ import annotations

import pytest

from proxy.observability.prometheus_text import families, label_ints, sample_sums

PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="a}b"} 3.0
vllm:num_requests_running{engine="1",model_name="tiny"} 2.0 1700000000000
vllm:num_requests_running_total 99.0
vllm:e2e_request_latency_seconds_count{engine="0"} 4.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf"} 4.0
vllm:kv_cache_usage_perc\t0.25
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="3072"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1024"} 1.0
vllm:cache_config_info{block_size="x",engine="2"} 1.0
"""


def test_named_sums_add_label_sets_and_skip_longer_names() -> None:
    sums = sample_sums(PAGE, ["vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                              "vllm:absent"])
    assert sums == {"vllm:num_requests_running": 5.0, "vllm:kv_cache_usage_perc": 0.25}


def test_every_sum_reads_each_sample_line() -> None:
    sums = sample_sums(PAGE)
    assert sums["vllm:num_requests_running"] == 5.0  # a "}" in a label, a timestamp
    assert sums["vllm:num_requests_running_total"] == 99.0
    assert sums["vllm:e2e_request_latency_seconds_count"] == 4.0  # digits in the name
    assert sums["vllm:e2e_request_latency_seconds_bucket"] == 4.0
    assert sums["vllm:kv_cache_usage_perc"] == 0.25
    assert sums["vllm:cache_config_info"] == 3.0
    assert not any(name.startswith("#") for name in sums)


@pytest.mark.parametrize("names", [None, ["vllm:num_requests_waiting"]])
def test_a_value_that_is_not_a_number_is_named(names: list[str] | None) -> None:
    with pytest.raises(ValueError, match="vllm:num_requests_waiting: sample value 'many'"):
        sample_sums("vllm:num_requests_waiting{engine=\"0\"} many\n", names)


def test_label_ints_per_line_in_page_order() -> None:
    assert label_ints(PAGE, "vllm:cache_config_info", "num_gpu_blocks", "block_size") == {
        "num_gpu_blocks": [3072, 1024], "block_size": [16, 16]}
    assert label_ints(PAGE, "vllm:absent", "block_size") == {"block_size": []}


def test_families_keep_help_type_and_labels() -> None:
    by_name = {family.name: family for family in families(PAGE)}
    running = by_name["vllm:num_requests_running"]
    assert running.type == "gauge"
    assert running.documentation == "Number of requests in model execution batches."
    assert [s.labels["engine"] for s in running.samples] == ["0", "1"]
