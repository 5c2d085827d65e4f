"""Runs on emulated nodes say so: the preset is found through a proxy or at a node."""

from __future__ import annotations

import json
from pathlib import Path

from profiler.cluster.plan import cluster_document, parse_layout
from profiler.emulate.label import emulated_backend, emulation_of
from profiler.emulate.presets import resolve
from profiler.emulate.serve import HostThread
from profiler.emulate.tokenizer import Vocabulary
from profiler.replay.client import ReplayConfig, ReplayResult
from profiler.replay.output import write_run
from proxy import ServerThread, config_from_args, create_app
from proxy.shared.vocabulary import Role


def test_the_preset_is_found_at_a_node_and_through_a_proxy(tmp_path: Path,
                                                            vocab: Vocabulary) -> None:
    preset = resolve("linear", "llama-3.1-8b")
    with HostThread(preset, [(Role.PREFILL, 0), (Role.DECODE, 0)], vocab=vocab) as host:
        doc = cluster_document("llama-3.1-8b", parse_layout("1P1D"),
                               [(n.role, n.url, 0, tmp_path / "log") for n in host.nodes])
        (tmp_path / "cluster.json").write_text(json.dumps(doc))
        config = config_from_args(["--cluster", str(tmp_path / "cluster.json"), "--port", "0"])
        with ServerThread(create_app(config)) as proxy:
            assert emulation_of(proxy.url) == "linear:llama-3.1-8b"
        assert emulation_of(host.nodes[1].url) == "linear:llama-3.1-8b"


def test_a_target_that_is_not_emulated_or_not_there_is_taken_for_real() -> None:
    assert emulation_of("http://127.0.0.1:9", timeout_s=0.5) is None


def test_a_replay_run_on_emulated_nodes_records_the_backend(tmp_path: Path) -> None:
    result = ReplayResult([], 1.0, ReplayConfig(target="http://x", qps=1, duration_s=1))
    backend = emulated_backend("h100:llama-3.1-8b")
    write_run(tmp_path, result, {}, label="pd@1", dataset="synthetic:mixed", backend=backend)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["backend"] == backend and "emulated" in backend
