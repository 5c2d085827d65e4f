"""The cluster launcher without vLLM: layouts, command lines, cluster.json, start/stop/failure
paths (with tests/profiler/fake_vllm_node.py standing in for vLLM's server)."""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from profiler.cluster import cli as cluster_cli
from profiler.cluster import launcher as cluster_mod
from profiler.cluster.launcher import Cluster, cluster_status, start_cluster, stop_cluster
from profiler.cluster.plan import (
    NIXL_SIDE_CHANNEL_OFFSET,
    ClusterConfig,
    ClusterError,
    Connector,
    Device,
    Layout,
    ServedModel,
    node_command,
    node_env,
    parse_layout,
    plan_nodes,
)
from profiler.cluster.procs import group_alive
from profiler.models import prepare as models
from proxy.shared.vocabulary import Role

FAKE_NODE = Path(__file__).resolve().parents[2] / "fakes" / "fake_vllm_node.py"
MODEL = ServedModel("tiny", Path("/m"))


def _free_port_block(n: int) -> int:
    """A base port with n free consecutive ports (OS-chosen, retried on collision)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n + NIXL_SIDE_CHANNEL_OFFSET > 65000:
            continue
        ports = [base + i for i in range(n)] + [base + NIXL_SIDE_CHANNEL_OFFSET + i
                                                 for i in range(n)]
        if all(cluster_mod.procs.port_free("127.0.0.1", port) for port in ports):
            return base
    raise RuntimeError("no free port block")


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    path = tmp_path / "mymodel"
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


@pytest.fixture
def fake_python(tmp_path: Path) -> str:
    """An 'interpreter' that runs the fake node whatever module it is asked for."""
    wrapper = tmp_path / "fake-python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_NODE}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    return str(wrapper)


@pytest.fixture
def record_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "records"
    path.mkdir()
    monkeypatch.setenv("FAKE_NODE_RECORD_DIR", str(path))
    return path


def _config(model_dir: Path, fake_python: str, state: Path, layout: str, **kw: object
            ) -> ClusterConfig:
    base = _free_port_block(parse_layout(layout).size)
    return ClusterConfig(model=str(model_dir), layout=parse_layout(layout), state_dir=state,
                         base_port=base, python=fake_python, cores=(0, 1), **kw)  # type: ignore[arg-type]


@pytest.fixture
def running(model_dir: Path, fake_python: str, tmp_path: Path, record_dir: Path
            ) -> Iterator[Cluster]:
    cluster = start_cluster(_config(model_dir, fake_python, tmp_path / "state", "1P2D"))
    yield cluster
    cluster.stop()


# ------------------------------------------------------------------------------------ planning


@pytest.mark.parametrize(
    ("text", "layout"),
    [("1P1D", Layout(1, 1)), ("1p2d", Layout(1, 2)), ("2P2D", Layout(2, 2)),
     ("1R", Layout(replica=1)), (" 2r ", Layout(replica=2)), ("1P2D1R", Layout(1, 2, 1)),
     ("2P1D1R", Layout(2, 1, 1))],
)
def test_parse_layout(text: str, layout: Layout) -> None:
    assert parse_layout(text) == layout
    assert str(layout) == text.strip().upper()


def test_hybrid_layouts_parse_in_any_order() -> None:
    assert parse_layout("1R1P2D") == parse_layout("2d1r1p") == Layout(1, 2, 1)
    assert str(parse_layout("2R1P1D")) == "1P1D2R"
    assert [role.value for role in parse_layout("1R1P2D").roles] == [
        "prefill", "decode", "decode", "replica"]


@pytest.mark.parametrize("text", ["", "1P", "P1D", "0P1D", "1P0D", "0R", "1R1P", "1R2D",
                                  "1P1D1P", "0R1P1D", "20R", "x"])
def test_parse_layout_rejects(text: str) -> None:
    with pytest.raises(ClusterError, match="bad layout"):
        parse_layout(text)


def test_plan_ports_roles_and_round_robin_cores(tmp_path: Path) -> None:
    config = ClusterConfig("tiny", parse_layout("1P2D"), tmp_path, base_port=9000, cores=(0, 1))
    nodes = plan_nodes(config)
    assert [(n.name, n.port, n.core) for n in nodes] == [
        ("prefill-0", 9000, 0), ("decode-0", 9001, 1), ("decode-1", 9002, 0)]
    no_pin = ClusterConfig("tiny", parse_layout("1P1D"), tmp_path)
    assert [n.core for n in plan_nodes(no_pin)] == [None, None]
    assert node_env(no_pin, plan_nodes(no_pin)[0], {})["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"


def _transfer(argv: list[str]) -> dict[str, object] | None:
    if "--kv-transfer-config" not in argv:
        return None
    return json.loads(argv[argv.index("--kv-transfer-config") + 1])


def test_cpu_commands_default_to_nixl_with_host_buffers_and_ucx_over_tcp(tmp_path: Path
                                                                         ) -> None:
    config = ClusterConfig("tiny", parse_layout("1P1D"), tmp_path / "st", cores=(0, 1),
                           base_port=9000, vllm_args=("--max-num-seqs", "8"))
    p, d = plan_nodes(config)
    argv_p = node_command(config, MODEL, p)
    argv_d = node_command(config, MODEL, d)
    assert argv_p[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    for flag in ("--enable-prefix-caching", "--enforce-eager"):
        assert flag in argv_p and flag in argv_d
    assert argv_p[argv_p.index("--max-model-len") + 1] == "4096"
    assert argv_p[argv_p.index("--served-model-name") + 1] == "tiny"
    assert argv_p[-2:] == ["--max-num-seqs", "8"]
    assert "--dtype" not in argv_p  # vLLM's default unless the model asks
    fp32 = node_command(config, ServedModel("smollm2", Path("/m"), "float32"), p)
    assert fp32[fp32.index("--dtype") + 1] == "float32"
    # The roles vLLM 0.32 wants (kv_both is deprecated), host buffers on the CPU; both roles
    # with bidirectional transfer (the readback route), D keeping blocks vLLM's default 480 s.
    readback = {"bidirectional_kv_xfer": True, "decoder_kv_blocks_ttl": 480}
    assert _transfer(argv_p) == {"kv_connector": "NixlConnector", "kv_role": "kv_producer",
                                 "kv_buffer_device": "cpu", "kv_connector_extra_config": readback}
    assert _transfer(argv_d) == {"kv_connector": "NixlConnector", "kv_role": "kv_consumer",
                                 "kv_buffer_device": "cpu", "kv_connector_extra_config": readback}
    for argv in (argv_p, argv_d):  # NIXL moves partial prefills: vLLM's chunked prefill stays
        assert "--no-enable-chunked-prefill" not in argv
        assert "--max-num-batched-tokens" not in argv
    env_p, env_d = (node_env(config, n, {"PATH": "/bin"}) for n in (p, d))
    assert env_d["PATH"] == "/bin" and env_d["HF_HUB_OFFLINE"] == "1"
    assert env_d["VLLM_CPU_KVCACHE_SPACE"] == "1" and env_d["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in env_d
    assert [e["VLLM_NIXL_SIDE_CHANNEL_PORT"] for e in (env_p, env_d)] == ["10000", "10001"]
    assert env_p["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
    assert env_p["UCX_TLS"] == env_d["UCX_TLS"] == "tcp,self,sm"
    assert node_env(config, d, {"UCX_TLS": "tcp"})["UCX_TLS"] == "tcp"  # the user's wins


def test_nixl_kv_lease_goes_to_the_connector_extra_config(tmp_path: Path) -> None:
    config = ClusterConfig("tiny", parse_layout("1P1D"), tmp_path, kv_lease_s=8,
                           kv_readback_ttl_s=None)
    p, _ = plan_nodes(config)
    assert _transfer(node_command(config, MODEL, p)) == {
        "kv_connector": "NixlConnector", "kv_role": "kv_producer", "kv_buffer_device": "cpu",
        "kv_connector_extra_config": {"kv_lease_duration": 8}}


def test_readback_ttl_goes_to_both_roles_and_off_means_no_bidirectional(tmp_path: Path) -> None:
    short = ClusterConfig("tiny", parse_layout("1P1D"), tmp_path, kv_readback_ttl_s=20)
    off = ClusterConfig("tiny", parse_layout("1P1D"), tmp_path, kv_readback_ttl_s=None)
    for node in plan_nodes(short):
        assert _transfer(node_command(short, MODEL, node))["kv_connector_extra_config"] == {
            "bidirectional_kv_xfer": True, "decoder_kv_blocks_ttl": 20}
    for node in plan_nodes(off):
        assert "kv_connector_extra_config" not in _transfer(node_command(off, MODEL, node))


def test_cluster_up_no_kv_readback_flag(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[ClusterConfig] = []

    def fake_start(config: ClusterConfig, progress: object = None) -> Cluster:
        seen.append(config)
        raise ClusterError("stop here")

    # `ppd cluster up` imports the launcher once its flags parse (a fast usage error).
    monkeypatch.setattr(cluster_mod, "start_cluster", fake_start)
    for extra, ttl in (([], 480), (["--kv-readback-ttl", "30"], 30), (["--no-kv-readback"], None)):
        with pytest.raises(ClusterError, match="stop here"):
            cluster_cli.main(["up", "--model", str(tmp_path), "--layout", "1P1D",
                              "--state", str(tmp_path / "s"), *extra])
        assert seen[-1].kv_readback_ttl_s == ttl


def test_shared_storage_uses_example_connector_with_one_dir_and_whole_prefills(tmp_path: Path
                                                                               ) -> None:
    config = ClusterConfig("tiny", parse_layout("1P1D"), tmp_path / "st", cores=(0, 1),
                           connector=Connector.SHARED_STORAGE)
    p, d = plan_nodes(config)
    argv_p, argv_d = node_command(config, MODEL, p), node_command(config, MODEL, d)
    shared = {"shared_storage_path": str((tmp_path / "st").resolve() / "kv")}
    assert _transfer(argv_p) == {"kv_connector": "ExampleConnector", "kv_role": "kv_producer",
                                 "kv_connector_extra_config": shared}
    assert _transfer(argv_d) == {"kv_connector": "ExampleConnector", "kv_role": "kv_consumer",
                                 "kv_connector_extra_config": shared}
    # ExampleConnector stores partial KV for a chunked prefill: whole-prompt prefills only.
    for argv in (argv_p, argv_d):
        assert "--no-enable-chunked-prefill" in argv
        assert argv[argv.index("--max-num-batched-tokens") + 1] == "4096"
    env = node_env(config, d, {})
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT" not in env and "UCX_TLS" not in env


def test_cuda_uses_nixl_roles_one_gpu_and_side_channel_per_node(tmp_path: Path) -> None:
    config = ClusterConfig("tiny", parse_layout("2P2D"), tmp_path, device=Device.CUDA,
                           base_port=9000)
    nodes = plan_nodes(config)
    roles = []
    for node in nodes:
        argv = node_command(config, MODEL, node)
        transfer = _transfer(argv)
        assert transfer is not None
        assert transfer["kv_connector"] == "NixlConnector"
        assert transfer["kv_buffer_device"] == "cuda"
        roles.append(transfer["kv_role"])
        assert "--no-enable-chunked-prefill" not in argv  # NIXL handles chunked prefill
    assert roles == ["kv_producer", "kv_producer", "kv_consumer", "kv_consumer"]
    envs = [node_env(config, n, {}) for n in nodes]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "1", "2", "3"]
    assert [e["VLLM_NIXL_SIDE_CHANNEL_PORT"] for e in envs] == ["10000", "10001", "10002", "10003"]
    assert all("VLLM_CPU_OMP_THREADS_BIND" not in e and "UCX_TLS" not in e for e in envs)


def test_replicas_get_no_kv_transfer(tmp_path: Path) -> None:
    config = ClusterConfig("tiny", parse_layout("2R"), tmp_path, connector=Connector.NIXL)
    assert [_transfer(node_command(config, MODEL, n)) for n in plan_nodes(config)
            ] == [None, None]


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"base_port": 0}, "base port"), ({"max_model_len": 8}, "max model length"),
     ({"kv_cache_gib": 0}, "KV cache"), ({"startup_timeout_s": 0}, "timeout"),
     ({"kv_lease_s": 5}, "lease"), ({"kv_readback_ttl_s": 0}, "readback")],
)
def test_config_validation(kw: dict[str, object], match: str, tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match=match):
        ClusterConfig("tiny", parse_layout("1P1D"), tmp_path, **kw)  # type: ignore[arg-type]


def test_resolve_model_takes_the_dtype_from_the_marker(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert cluster_mod.resolve_model(str(tmp_path)) == ServedModel(tmp_path.name, tmp_path)
    marker = {"name": "smollm2", "version": models.MARKER_VERSION, "vllm_dtype": "float32"}
    (tmp_path / models.READY_MARKER).write_text(json.dumps(marker))
    assert cluster_mod.resolve_model(str(tmp_path)).dtype == "float32"
    assert cluster_mod.resolve_model(str(tmp_path), dtype="bfloat16").dtype == "bfloat16"


def test_model_that_is_not_a_model_dir(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="neither tiny/smollm2 nor a directory"):
        cluster_mod.resolve_model(str(tmp_path / "nope"))


# ---------------------------------------------------------------------- processes (fake nodes)


def test_up_writes_cluster_json_and_down_stops_everything(
    running: Cluster, record_dir: Path, tmp_path: Path
) -> None:
    doc = json.loads((tmp_path / "state" / "cluster.json").read_text())
    assert set(doc) == {"model", "layout", "connector", "kv_readback_ttl_s", "nodes"}
    assert doc["kv_readback_ttl_s"] == 480  # the proxy offers the readback route for it
    assert doc["model"] == "mymodel" and doc["layout"] == "1P2D" and doc["connector"] == "nixl"
    assert [n["role"] for n in doc["nodes"]] == ["prefill", "decode", "decode"]
    for node in doc["nodes"]:
        # D nodes also name their KV event endpoints (profiler.emulate.node_kv_events).
        extra = {"kv_events", "kv_events_replay"} if node["role"] == "decode" else set()
        assert set(node) == {"role", "url", "pid", "log"} | extra
        assert httpx.get(node["url"] + "/v1/models").json()["data"][0]["id"] == "mymodel"
        assert Path(node["log"]).is_file() and group_alive(node["pid"])
    assert running.urls(Role.DECODE) == [n["url"] for n in doc["nodes"][1:]]
    assert running.url(Role.PREFILL) == doc["nodes"][0]["url"]
    with pytest.raises(ClusterError, match="no replica node"):
        running.url(Role.REPLICA)
    # Each node got its role's connector and its own core.
    records = [json.loads((record_dir / f"{n['url'].rsplit(':', 1)[1]}.json").read_text())
               for n in doc["nodes"]]
    roles = [_transfer(r["argv"])["kv_role"] for r in records]  # type: ignore[index]
    assert roles == ["kv_producer", "kv_consumer", "kv_consumer"]
    assert [r["env"]["VLLM_CPU_OMP_THREADS_BIND"] for r in records] == ["0", "1", "0"]
    # One local warm-up prefill per node (AMX permission before the first NIXL pull), then one
    # P->D turn per pair: P legs on P, D legs with P's kv_transfer_params on each D.
    posts = [[json.loads(line) for line in
              (record_dir / f"{n['url'].rsplit(':', 1)[1]}.posts").read_text().splitlines()]
             for n in doc["nodes"]]
    assert all(node_posts[0].get("kv_transfer_params") is None for node_posts in posts)
    assert [len(node_posts) for node_posts in posts] == [3, 2, 2]
    assert all(b["kv_transfer_params"]["do_remote_decode"] for b in posts[0][1:])
    assert [d[1]["kv_transfer_params"]["do_remote_prefill"] for d in posts[1:]] == [True, True]
    assert (tmp_path / "state" / "kv").is_dir()

    assert all(h.healthy and h.running for h in cluster_status(tmp_path / "state"))
    # The servers are this test's children: reap them as they end (a zombie still counts as
    # a live group), and see how they ended.
    with ThreadPoolExecutor(3) as pool:
        codes = pool.map(lambda n: n.proc.process.wait(timeout=10), running.nodes)
        stopped = stop_cluster(tmp_path / "state")  # as `ppd cluster down` does, from the file
    assert len(stopped.nodes) == 3
    assert list(codes) == [-15, -15, -15]
    assert not any(group_alive(n["pid"]) for n in doc["nodes"])
    assert not (tmp_path / "state" / "cluster.json").exists()
    assert not (tmp_path / "state" / "kv").exists()


def test_status_reports_a_dead_node(running: Cluster, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    victim = running.nodes[1].proc
    os.killpg(victim.pid, 9)
    victim.process.wait()  # type: ignore[union-attr]
    assert cluster_cli.main(["status", "--state", str(tmp_path / "state")]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert "healthy" in lines[0] and "stopped" in lines[1] and "healthy" in lines[2]


def test_second_up_on_a_running_state_dir_is_refused(
    running: Cluster, model_dir: Path, fake_python: str, tmp_path: Path
) -> None:
    with pytest.raises(ClusterError, match="still running.*ppd cluster down"):
        start_cluster(_config(model_dir, fake_python, tmp_path / "state", "1P1D"))


def test_a_node_that_exits_fails_up_with_its_log_and_stops_the_others(
    model_dir: Path, fake_python: str, tmp_path: Path, record_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FAKE_NODE_FAIL_ROLE", "kv_consumer")
    config = _config(model_dir, fake_python, tmp_path / "state", "1P1D")
    with pytest.raises(ClusterError) as info:
        start_cluster(config)
    message = str(info.value)
    assert "decode-0" in message and "exited with code 3" in message
    assert "boom, the fake node failed" in message  # the tail of its log
    # P was up and serving (the failing D waits a moment before exiting) ... and was stopped.
    prefill = json.loads((record_dir / f"{config.base_port}.json").read_text())
    assert not group_alive(prefill["pid"])
    assert cluster_mod.procs.port_free("127.0.0.1", config.base_port)
    assert not (tmp_path / "state" / "cluster.json").exists()


def test_a_node_that_never_answers_times_out(
    model_dir: Path, fake_python: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NODE_HANG", "1")
    config = _config(model_dir, fake_python, tmp_path / "state", "1R", startup_timeout_s=1.0)
    with pytest.raises(ClusterError, match=r"replica-0 .* did not answer /v1/models within 1 s"):
        start_cluster(config)


def test_busy_port_is_reported_before_anything_starts(
    model_dir: Path, fake_python: str, tmp_path: Path
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        config = ClusterConfig(str(model_dir), parse_layout("1R"), tmp_path / "s",
                               base_port=port, python=fake_python)
        with pytest.raises(ClusterError, match=rf"port\(s\) \[{port}\] in use"):
            start_cluster(config)
    assert not (tmp_path / "s" / "replica-0.log").exists()


def test_failed_warm_up_stops_the_cluster_with_the_nodes_answer(
    model_dir: Path, fake_python: str, tmp_path: Path, record_dir: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NODE_POST_STATUS", "500")
    config = _config(model_dir, fake_python, tmp_path / "state", "1P1D")
    with pytest.raises(ClusterError, match="prefill-0 answered its warm-up prefill with 500"):
        start_cluster(config)
    records = [json.loads(p.read_text()) for p in record_dir.glob("*.json")]
    assert len(records) == 2 and not any(group_alive(r["pid"]) for r in records)


def test_a_failed_warm_up_pull_is_tried_again(
    model_dir: Path, fake_python: str, tmp_path: Path, record_dir: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NODE_FAIL_FIRST_PULL", "1")
    config = _config(model_dir, fake_python, tmp_path / "state", "1P1D")
    with start_cluster(config) as cluster:
        d_port = cluster.url(Role.DECODE).rsplit(":", 1)[1]
        d_legs = [json.loads(line) for line in
                  (record_dir / f"{d_port}.posts").read_text().splitlines()
                  if "kv_transfer_params" in json.loads(line)]
        assert len(d_legs) == 2  # the failed pull, then the one that worked


def test_shared_storage_cluster_gets_no_warm_up(
    model_dir: Path, fake_python: str, tmp_path: Path, record_dir: Path
) -> None:
    config = _config(model_dir, fake_python, tmp_path / "state", "1P1D",
                     connector=Connector.SHARED_STORAGE)
    with start_cluster(config):
        assert not list(record_dir.glob("*.posts"))


def test_busy_nixl_side_channel_port_is_reported_before_anything_starts(
    model_dir: Path, fake_python: str, tmp_path: Path
) -> None:
    base = _free_port_block(2)
    side = base + NIXL_SIDE_CHANNEL_OFFSET + 1  # decode-0's
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", side))
        holder.listen()
        config = ClusterConfig(str(model_dir), parse_layout("1P1D"), tmp_path / "s",
                               base_port=base, python=fake_python)
        with pytest.raises(ClusterError, match=rf"NIXL side-channel port\(s\) \[{side}\]"):
            start_cluster(config)
    assert not (tmp_path / "s" / "decode-0.log").exists()


# ----------------------------------------------------------------------------------------- cli


def test_cli_bad_layout_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cluster_cli.main(["up", "--model", "tiny", "--layout", "3X"])
    assert info.value.code == 2
    assert "bad layout '3X'" in capsys.readouterr().err


def test_cli_down_without_cluster_says_so_and_succeeds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Cleanup scripts run `down` whether or not a cluster is up: exit 0, saying so.
    assert cluster_cli.main(["down", "--state", str(tmp_path)]) == 0
    assert "nothing was running" in capsys.readouterr().out


def test_cli_policy_needs_with_proxy(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="--policy and --proxy-args need --with-proxy"):
        cluster_cli.main(["up", "--model", "tiny", "--layout", "1P1D", "--policy", "pd",
                          "--state", str(tmp_path)])


@pytest.mark.parametrize(("host", "dev_mode"), [("127.0.0.1", True), ("localhost", True),
                                                 ("::1", True), ("0.0.0.0", False),
                                                 ("10.0.0.5", False)])
def test_loopback_nodes_serve_vllms_dev_routes_for_prefix_cache_resets(
        tmp_path: Path, host: str, dev_mode: bool) -> None:
    # POST /reset_prefix_cache needs VLLM_SERVER_DEV_MODE=1; the dev routes also expose
    # sleep and RPC, so never on a node other hosts can reach.
    config = ClusterConfig("tiny", parse_layout("1P1D"), tmp_path / "st", host=host)
    for node in plan_nodes(config):
        env = node_env(config, node, {})
        assert (env.get("VLLM_SERVER_DEV_MODE") == "1") is dev_mode
