"""`ppd cluster up --emulate`: one background process serves the layout; status and down work
as for vLLM clusters; cluster.json records the emulation."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from profiler.cli import main as ppd
from profiler.cluster import procs
from profiler.cluster.emulated import start_emulated_cluster
from profiler.cluster.plan import ClusterConfig, parse_layout
from profiler.engine.transfer import load_link

BASE_PORT = 18320


def test_up_status_down(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PPD_CACHE_DIR", str(tmp_path / "cache"))  # the tokenizer is built here
    state = tmp_path / "state"
    config = ClusterConfig(model="llama-3.1-8b", layout=parse_layout("1P2D"),
                           base_port=BASE_PORT, state_dir=state)
    cluster = start_emulated_cluster(config, "linear", max_model_len=2048)
    host = cluster.nodes[0].proc.process
    assert host is not None
    try:
        doc = json.loads((state / "cluster.json").read_text())
        assert doc["model"] == "llama-3.1-8b" and doc["layout"] == "1P2D"
        assert [n["url"] for n in doc["nodes"]] == [
            f"http://127.0.0.1:{BASE_PORT + i}" for i in range(3)]
        assert {n["pid"] for n in doc["nodes"]} == {host.pid}  # one process hosts them all
        assert doc["emulated"]["preset"] == "linear:llama-3.1-8b"
        tokenizer = Path(doc["emulated"]["tokenizer"])
        assert (tokenizer / "tokenizer.json").is_file() and tmp_path in tokenizer.parents
        card = httpx.get(f"http://127.0.0.1:{BASE_PORT + 1}/v1/models").json()["data"][0]
        assert card["id"] == "llama-3.1-8b" and card["max_model_len"] == 2048
        assert ppd(["cluster", "status", "--state", str(state)]) == 0
        assert capsys.readouterr().out.count("healthy") == 3
    finally:
        # The host is this test's child: reap it as it ends (a zombie still counts as alive).
        with ThreadPoolExecutor(1) as pool:
            code = pool.submit(host.wait, 20)
            assert ppd(["cluster", "down", "--state", str(state)]) == 0
    assert code.result() is not None  # it ended (SIGTERM: gracefully or by the signal)
    assert not procs.group_alive(host.pid)
    assert not (state / "cluster.json").exists()


def test_unknown_preset_and_link_are_clear_errors(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    base = ["cluster", "up", "--model", "llama-3.1-8b", "--layout", "1P1D",
            "--base-port", str(BASE_PORT), "--state", str(tmp_path)]
    assert ppd([*base, "--emulate", "a100"]) == 1
    assert "a100" in capsys.readouterr().err
    assert ppd([*base, "--emulate", "linear", "--link", "carrier-pigeon"]) == 1
    assert "carrier-pigeon" in capsys.readouterr().err
    assert ppd([*base, "--link", "nvlink"]) == 1
    assert "--link needs --emulate" in capsys.readouterr().err
    assert ppd([*base[:2], "--model", "gpt-9", *base[4:], "--emulate", "linear"]) == 1
    assert "gpt-9" in capsys.readouterr().err


def test_a_link_can_be_given_by_latency_and_bandwidth() -> None:
    link = load_link("250:3.125")
    assert link.latency_s == 0.25 and link.bandwidth_bytes_per_s == 3.125e9
    assert load_link("nvlink").name == "nvlink"
    for bad in ("250", "x:1", "-1:1", "5:0"):
        with pytest.raises(ValueError, match="LATENCY_MS:GBPS"):
            load_link(bad)


def test_up_with_a_ppd_proxy_on_a_shipped_table(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """--proxy-args hands the proxy its table, so policy ppd can start in front of emulated
    nodes; a table the proxy refuses would fail `cluster up` (the proxy never gets healthy)."""
    monkeypatch.setenv("PPD_CACHE_DIR", str(tmp_path / "cache"))
    state, proxy_port = tmp_path / "state", BASE_PORT + 9
    table = Path(__file__).parents[3] / "tables" / "h100-llama-3.1-8b-1p3d.csv"
    try:
        assert ppd(["cluster", "up", "--emulate", "linear", "--model", "llama-3.1-8b",
                    "--layout", "1P1D", "--base-port", str(BASE_PORT + 5), "--state",
                    str(state), "--with-proxy", "--policy", "ppd", "--proxy-port",
                    str(proxy_port), "--proxy-args", f"--table '{table}' --w-tpot 3"]) == 0
        stats = httpx.get(f"http://127.0.0.1:{proxy_port}/stats", timeout=10).json()
        assert stats["policy"] == "ppd"
    finally:
        ppd(["cluster", "down", "--state", str(state)])


def test_proxy_args_need_with_proxy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ppd(["cluster", "up", "--emulate", "linear", "--model", "llama-3.1-8b", "--layout",
                "1P1D", "--proxy-args", "--w-tpot 3", "--state", str(tmp_path)]) != 0
    assert "--proxy-args need --with-proxy" in capsys.readouterr().err


def test_a_preset_file_given_by_a_relative_path_reaches_the_nodes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the nodes' process runs in the state directory: a relative path must not lead there
    monkeypatch.setenv("PPD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    Path("cpu.json").write_text(json.dumps({
        "kind": "linear", "name": "cpu", "source": "a test", "base_ms": 2.0,
        "per_prefill_token_ms": 0.02,
        "per_decode_seq_ms": 0.05}))
    state = tmp_path / "state"
    config = ClusterConfig(model="tiny", layout=parse_layout("1P1D"),
                           base_port=BASE_PORT + 10, state_dir=state)
    cluster = start_emulated_cluster(config, "cpu.json", max_model_len=2048)
    host = cluster.nodes[0].proc.process
    assert host is not None
    try:
        card = httpx.get(f"http://127.0.0.1:{BASE_PORT + 11}/v1/models").json()["data"][0]
        assert card["id"] == "tiny" and "cpu" in card["owned_by"]
    finally:
        with ThreadPoolExecutor(1) as pool:
            code = pool.submit(host.wait, 20)
            assert ppd(["cluster", "down", "--state", str(state)]) == 0
    assert code.result() is not None
