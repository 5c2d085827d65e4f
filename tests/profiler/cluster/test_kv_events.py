"""`ppd cluster up` turns on KV cache events on D/R nodes and names them in cluster.json."""

from __future__ import annotations

import json
from pathlib import Path

from profiler.cluster.plan import (
    ClusterConfig,
    ServedModel,
    cluster_document,
    nixl_side_channel_port,
    node_command,
    parse_layout,
    plan_nodes,
)
from proxy.config.cluster_file import load_cluster_file
from proxy.live import kv_sources
from proxy.shared.vocabulary import Role


def test_d_and_r_publish_events_p_does_not_and_cluster_json_names_them(
        tmp_path: Path) -> None:
    config = ClusterConfig("tiny", parse_layout("1P1D"), tmp_path, base_port=9000)
    model = ServedModel("tiny", tmp_path / "model")
    prefill, decode = plan_nodes(config)
    assert "--kv-events-config" not in node_command(config, model, prefill)
    argv = node_command(config, model, decode)
    events = json.loads(argv[argv.index("--kv-events-config") + 1])
    assert events == {"enable_kv_cache_events": True, "publisher": "zmq",
                      "endpoint": "tcp://*:11001", "replay_endpoint": "tcp://127.0.0.1:12001",
                      "topic": "kv"}
    doc = cluster_document("tiny", config.layout, [
        (Role.PREFILL, "http://127.0.0.1:9000", 1, tmp_path / "p.log"),
        (Role.DECODE, "http://127.0.0.1:9001", 2, tmp_path / "d.log")])
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(doc))
    # The proxy reads them back (`ppd proxy --cluster`): the PUB and replay of the D only.
    (source,) = kv_sources.from_cluster_file(path)
    assert (source.url, source.endpoint, source.replay) == (
        "http://127.0.0.1:9001", "tcp://127.0.0.1:11001", "tcp://127.0.0.1:12001")


def test_no_two_listeners_of_a_cluster_share_a_port(tmp_path: Path) -> None:
    # Each node listens on its HTTP port, its NIXL side channel and (D, R) its KV event PUB and
    # replay sockets; a clash makes vLLM's handshake listener die while the node keeps serving.
    config = ClusterConfig("tiny", parse_layout("2P3D"), tmp_path, base_port=9000)
    model = ServedModel("tiny", tmp_path / "model")
    ports: list[int] = []
    for node in plan_nodes(config):
        argv = node_command(config, model, node)
        ports.append(int(argv[argv.index("--port") + 1]))
        ports.append(nixl_side_channel_port(config, node))
        if "--kv-events-config" in argv:
            events = json.loads(argv[argv.index("--kv-events-config") + 1])
            ports += [int(events["endpoint"].rsplit(":", 1)[1]),
                      int(events["replay_endpoint"].rsplit(":", 1)[1])]
    assert len(ports) == len(set(ports)), sorted(ports)


def test_a_hybrid_plans_replicas_without_transfer_and_with_events(tmp_path: Path) -> None:
    config = ClusterConfig("tiny", parse_layout("1R1P2D"), tmp_path, base_port=9000)
    model = ServedModel("tiny", tmp_path / "model")
    nodes = plan_nodes(config)
    assert [(n.name, n.port) for n in nodes] == [
        ("prefill-0", 9000), ("decode-0", 9001), ("decode-1", 9002), ("replica-0", 9003)]
    argvs = {n.name: node_command(config, model, n) for n in nodes}
    transfers = {name: json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_role"]
                 for name, argv in argvs.items() if "--kv-transfer-config" in argv}
    assert transfers == {"prefill-0": "kv_producer", "decode-0": "kv_consumer",
                         "decode-1": "kv_consumer"}  # none on the replica
    replica = argvs["replica-0"]
    events = json.loads(replica[replica.index("--kv-events-config") + 1])
    assert events["endpoint"] == "tcp://*:11003"  # R publishes its KV events as D does
    assert "--enable-prefix-caching" in replica  # its turns 2+ reuse the history it holds
    doc = cluster_document("tiny", config.layout, [
        (n.role, f"http://127.0.0.1:{n.port}", 1, tmp_path / f"{n.name}.log") for n in nodes])
    assert doc["layout"] == "1P2D1R" and parse_layout(str(doc["layout"])) == config.layout
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(doc))
    # The proxy reads every node with its role, and subscribes to the D and R events.
    specs = load_cluster_file(path)
    assert [(s.role, s.url) for s in specs] == [
        (Role.PREFILL, "http://127.0.0.1:9000"), (Role.DECODE, "http://127.0.0.1:9001"),
        (Role.DECODE, "http://127.0.0.1:9002"), (Role.REPLICA, "http://127.0.0.1:9003")]
    assert [s.url for s in kv_sources.from_cluster_file(path)] == [
        "http://127.0.0.1:9001", "http://127.0.0.1:9002", "http://127.0.0.1:9003"]
