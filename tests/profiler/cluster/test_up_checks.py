"""`ppd cluster up --with-proxy` checks the proxy's configuration before any node starts;
`live` gets its cluster's step-cost file; `down` says what it stopped, and is safe twice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from profiler.cli import main as ppd
from profiler.cluster import procs
from profiler.cluster.live_defaults import default_live_costs, shipped_tiny_cpu_costs
from profiler.cluster.plan import ClusterError, Device
from proxy.live.predict import StepCosts
from proxy.policies import registry

REPO = Path(__file__).resolve().parents[3]
BASE_PORT = 18340


@pytest.fixture
def no_spawn(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Fails the test if anything (a node, the emulated host, the proxy) is started."""
    spawned: list[list[str]] = []

    def refuse(name: str, url: str, argv: list[str], *args: object, **kw: object) -> None:
        spawned.append(argv)
        raise AssertionError(f"{name} was started: {argv}")

    monkeypatch.setattr(procs, "spawn", refuse)
    return spawned


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A model directory for vLLM nodes that are never started (only its path is used)."""
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


def test_a_misspelt_policy_fails_at_once_naming_local_and_starts_nothing(
        tmp_path: Path) -> None:
    state = tmp_path / "state"
    done = subprocess.run(
        [sys.executable, "-m", "profiler.cli", "cluster", "up", "--model", "tiny", "--layout",
         "1P1D", "--with-proxy", "--policy", "lcoal", "--state", str(state)],
        capture_output=True, text=True, timeout=60, cwd=REPO)  # a hang guard, not a timing:
    # how fast it answers is benchmarks/cli_startup.py's "ppd cluster up --policy lcoal" row
    assert done.returncode != 0
    assert "did you mean local" in done.stderr
    assert f"policy names: {', '.join(registry.names())})" in done.stderr
    assert not state.exists()  # no node log, no cluster.json: nothing was started


@pytest.mark.parametrize(("flags", "message"), [
    (["--policy", "ppd"], "policy ppd needs --table PATH"),
    (["--policy", "ppd", "--proxy-args", "--table missing.csv"], "missing.csv"),
    (["--policy", "fixed"], "policy fixed needs --x F"),
    (["--policy", "pd", "--proxy-args", "--w-tpot -1"], "--w-tpot must be"),
    (["--policy", "pd", "--proxy-args", "--polcy live"], "unrecognized arguments: --polcy"),
    (["--policy", "live", "--proxy-args", "--live-costs missing.json"],
     "cannot read live cost file missing.json"),
])
def test_the_proxys_configuration_is_built_before_any_node_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_spawn: list[list[str]],
        model: Path, flags: list[str], message: str) -> None:
    for engine in (["--model", str(model)], ["--emulate", "linear", "--model", "tiny"]):
        code = ppd(["cluster", "up", *engine, "--layout", "1P1D", "--with-proxy",
                    "--base-port", str(BASE_PORT), "--state", str(tmp_path / "state"), *flags])
        err = capsys.readouterr().err
        assert code == 1 and message in err and "no node was started" in err
    assert no_spawn == []


def test_live_on_the_tiny_model_on_cpu_gets_the_shipped_cost_file(tmp_path: Path) -> None:
    path = default_live_costs("tiny", Device.CPU, None, None, tmp_path)
    assert path == shipped_tiny_cpu_costs() and StepCosts.load(path).base_ms > 0
    with pytest.raises(ClusterError, match="ppd sim calibrate"):  # no file known for it
        default_live_costs("smollm2", Device.CPU, None, None, tmp_path)


def test_live_starts_on_an_emulated_cluster_with_no_other_flag(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PPD_CACHE_DIR", str(tmp_path / "cache"))
    state, proxy_port = tmp_path / "state", BASE_PORT + 9
    try:
        assert ppd(["cluster", "up", "--emulate", "linear", "--model", "tiny", "--layout",
                    "1P1D", "--base-port", str(BASE_PORT), "--state", str(state),
                    "--with-proxy", "--policy", "live", "--proxy-port", str(proxy_port)]) == 0
        stats = httpx.get(f"http://127.0.0.1:{proxy_port}/stats", timeout=10).json()
        assert stats["policy"] == "live"
        costs = StepCosts.load(state / "live-costs.json")  # the preset's, fitted for live
        assert costs.base_ms == pytest.approx(2.0)  # linear: 2 ms per step (its preset)
        assert json.loads((state / "cluster.json").read_text())["emulated"]["cost"] is None
        capsys.readouterr()
    finally:
        assert ppd(["cluster", "down", "--state", str(state)]) == 0
    out = capsys.readouterr().out
    assert "stopped 2 node(s)" in out and f"the proxy http://127.0.0.1:{proxy_port}" in out
    assert ppd(["cluster", "down", "--state", str(state)]) == 0  # safe in cleanup scripts
    assert "nothing was running" in capsys.readouterr().out


def test_down_without_a_cluster_is_not_an_error(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert ppd(["cluster", "down", "--state", str(tmp_path)]) == 0
    assert "nothing was running" in capsys.readouterr().out


@pytest.mark.parametrize(("flags", "noted"), [
    ([], True),  # the proxy's default policy, pd
    (["--policy", "local"], True),
    (["--policy", "live", "--proxy-args",
      f"--live-costs {REPO / 'tables' / 'tiny-cpu-1p1d.costs.json'}"], False),  # reads back
    (["--policy", "pd", "--no-kv-readback"], False),
    (["--policy", "pd", "--connector", "shared-storage"], False),  # no NIXL: nothing kept
])
def test_a_policy_that_never_reads_back_is_told_what_each_d_keeps(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_spawn: list[list[str]],
        model: Path, flags: list[str], noted: bool) -> None:
    code = ppd(["cluster", "up", "--model", str(model), "--layout", "1P1D", "--with-proxy",
                "--base-port", str(BASE_PORT), "--state", str(tmp_path / "state"), *flags])
    err = capsys.readouterr().err
    assert code != 0 and len(no_spawn) == 1  # checked, then the first node was refused
    assert ("never reads KV back" in err) is noted, err
    if noted:
        assert "480 s" in err and "--no-kv-readback" in err
