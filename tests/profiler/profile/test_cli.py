"""`ppd profile` command line: load units, --force, resume message, meta, help."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest

from profiler.cli import main as ppd
from profiler.profile import cli as profile_cli
from profiler.tables.io import read_table
from proxy import ProxyConfig, create_app
from proxy.config.cluster_file import NodeSpec
from proxy.config.policy_config import Policy, PolicyConfig
from proxy.serving.server import running
from proxy.shared.vocabulary import Role
from tests.fakes.background import in_background
from tests.fakes.fake_openai_timed import FakeTimedServer, serve_in_thread
from tests.fakes.fake_vllm import FakeVLLM


@pytest.fixture(scope="module")
def fake_url() -> Iterator[str]:
    with serve_in_thread(FakeTimedServer(ttft_s=0.005, itl_s=0.001)) as url:
        yield url


def _argv(url: str, out: Path, *extra: str) -> list[str]:
    return ["profile", "--target", url, "--out", str(out), "--contexts", "small",
            "--workloads", "tiny", "--duration", "0.3", "--warmup", "0", "--timeout", "10",
            "--no-progress", *extra]


def test_profile_records_the_command_and_refuses_to_redo_a_finished_table(
        fake_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.csv"
    assert ppd(_argv(fake_url, out, "--request-rate", "16")) == 0
    meta = json.loads((tmp_path / "t.meta.json").read_text())
    assert meta["command"].startswith("ppd profile --target ")
    assert "--request-rate 16" in meta["command"]
    # The fake has no /health with nodes, and the client machine is not the cluster.
    assert (meta["layout"], meta["hardware"]) == ("unknown", "unknown")
    assert meta["grid"]["qps"] == [16.0]
    capsys.readouterr()
    assert ppd(_argv(fake_url, out, "--request-rate", "16")) == 1
    err = capsys.readouterr().err
    assert "already holds every cell" in err and "--force" in err
    assert ppd(_argv(fake_url, out, "--request-rate", "16", "--force")) == 0


def test_an_interrupted_force_run_keeps_the_table_it_was_replacing(
        fake_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "t.csv"
    assert ppd(_argv(fake_url, out, "--request-rate", "16")) == 0
    finished = out.read_text()

    def interrupted(*_: Any) -> Any:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(profile_cli, "_profile", interrupted)
        assert ppd(_argv(fake_url, out, "--request-rate", "16", "--force")) == 130
    err = capsys.readouterr().err
    kept = tmp_path / "t.csv.previous"
    assert kept.read_text() == finished and f"kept as {kept}" in err
    # Another --force run never overwrites what the first one set aside: it asks.
    assert ppd(_argv(fake_url, out, "--request-rate", "16", "--force")) == 1
    assert "rename it back" in capsys.readouterr().err and kept.read_text() == finished
    kept.rename(out)
    for name in ("t.parquet.previous", "t.meta.json.previous"):
        (tmp_path / name).rename(tmp_path / name.removesuffix(".previous"))
    # A --force run that finishes leaves no .previous behind.
    assert ppd(_argv(fake_url, out, "--request-rate", "16", "--force")) == 0
    assert not list(tmp_path.glob("*.previous"))


def test_a_partial_table_is_resumed_with_a_note(
        fake_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.csv"
    assert ppd(_argv(fake_url, out, "--request-rate", "16")) == 0
    capsys.readouterr()
    assert ppd(_argv(fake_url, out, "--request-rate", "16,24")) == 0
    captured = capsys.readouterr()
    assert "resuming" in captured.err and "1 of 2 cells already measured" in captured.err
    # The cell measured in this run apart from the one it resumed.
    assert "profiled 1 cells in" in captured.out
    assert "1 cells were already in the table (resumed)" in captured.out
    assert sorted(read_table(out)["qps"]) == [16.0, 24.0]


def test_qps_is_a_deprecated_alias_of_request_rate(
        fake_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.csv"
    assert ppd(_argv(fake_url, out, "--qps", "16")) == 0
    assert "--qps is deprecated, use --request-rate" in capsys.readouterr().err
    meta = json.loads((tmp_path / "t.meta.json").read_text())
    assert meta["grid"]["qps"] == [16.0]


def test_layout_is_counted_from_the_proxy_health_nodes() -> None:
    nodes = [{"role": "prefill"}, {"role": "decode"}, {"role": "decode"}]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"status": "ok", "nodes": nodes})

    async def layout() -> str:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler),
                                     base_url="http://proxy") as client:
            return await profile_cli.reported_layout(client)

    assert asyncio.run(layout()) == "1P2D"
    nodes[:] = [{"role": "replica"}] * 2
    assert asyncio.run(layout()) == "2R"


def test_help_explains_x_the_shapes_and_gives_an_example(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        ppd(["profile", "--help"])
    text = capsys.readouterr().out
    assert "x=0" in text and "x=1" in text
    assert "huge_paste" in text and "1024 new input tokens" in text
    assert "example:" in text and "--request-rate" in text
    assert "(default: 60)" in text  # the grid's duration


def test_sigterm_mid_profile_keeps_the_measured_cells_and_says_how_to_resume(
        fake_url: str, tmp_path: Path) -> None:
    out = tmp_path / "t.csv"
    repo = Path(__file__).resolve().parents[3]
    process = subprocess.Popen(
        [sys.executable, "-m", "profiler.cli", *_argv(fake_url, out, "--request-rate",
                                                      "16,17,18,19,20,21", "--admin-key",
                                                      "s3cret")],
        env={**os.environ, "PYTHONPATH": str(repo)}, cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert out.exists(), "no cell was measured"
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    assert "interrupted" in stderr and "again to resume" in stderr
    measured = len(read_table(out))
    assert 1 <= measured < 6
    assert f"the {measured} cells measured so far are in {out}" in stderr
    assert "s3cret" not in stderr and "--admin-key '***'" in stderr


# --- the target must be a ppd proxy that forces routes (issue 23, items 8 and 9) ---

def _pd_proxy(admin_key: str | None = None, policy: Policy = Policy.PD) -> Callable[[], Any]:
    """A real proxy in front of fake P and D nodes: yields (proxy URL, P, D)."""
    @asynccontextmanager
    async def cluster() -> AsyncIterator[tuple[str, FakeVLLM, FakeVLLM]]:
        async with FakeVLLM("p") as p, FakeVLLM("d") as d:
            config = ProxyConfig(nodes=(NodeSpec(p.url, Role.PREFILL),
                                        NodeSpec(d.url, Role.DECODE)),
                                 port=0, admin_key=admin_key, policy=PolicyConfig(kind=policy))
            async with running(create_app(config)) as proxy:
                yield proxy.url, p, d
    return cluster


def test_a_vllm_node_as_target_is_refused_before_any_cell(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.csv"

    @asynccontextmanager
    async def node() -> AsyncIterator[FakeVLLM]:
        async with FakeVLLM("node") as fake:
            yield fake

    with in_background(node) as fake:
        # A long --duration: the refusal must come from the probe, not after the cells.
        started = time.monotonic()
        assert ppd([*_argv(fake.url, out, "--request-rate", "4"), "--duration", "30"]) == 1
        assert time.monotonic() - started < 15
        assert len(fake.completions) == 1  # the one probe turn, no cell
    err = capsys.readouterr().err
    assert "did not take the forced route" in err and "no x-ppd-route header" in err
    assert "ppd proxy" in err
    assert not out.exists()


def test_a_proxy_under_policy_replica_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.csv"

    @asynccontextmanager
    async def replica_proxy() -> AsyncIterator[str]:
        async with FakeVLLM("r") as node:
            config = ProxyConfig(nodes=(NodeSpec(node.url, Role.REPLICA),), port=0,
                                 policy=PolicyConfig(kind=Policy.REPLICA), admin_key="adm")
            async with running(create_app(config)) as proxy:
                yield proxy.url

    with in_background(replica_proxy) as url:
        assert ppd([*_argv(url, out, "--request-rate", "4"), "--admin-key", "adm"]) == 1
    err = capsys.readouterr().err
    assert "x-ppd-route: replica" in err and "--policy replica" in err
    assert not out.exists()


def test_a_proxy_without_an_admin_key_is_refused_saying_it_needs_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.csv"
    with in_background(_pd_proxy(None)) as (url, _, d):
        assert ppd([*_argv(url, out, "--request-rate", "4"), "--duration", "30"]) == 1
        assert len(d.completions) == 1  # the one probe turn, no cell
    err = capsys.readouterr().err
    assert "has no admin key" in err and "--admin-key KEY" in err
    assert not out.exists()


@pytest.mark.parametrize(("key", "fix"), [
    (None, "pass the proxy's admin key with --admin-key KEY"),
    ("wrong", "the --admin-key given is not the proxy's"),
])
def test_no_or_a_wrong_admin_key_stops_at_the_first_401_with_the_fix(
        key: str | None, fix: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.csv"
    with in_background(_pd_proxy("right")) as (url, p, d):
        argv = [*_argv(url, out, "--request-rate", "4"), "--duration", "30",
                *(["--admin-key", key] if key else [])]
        started = time.monotonic()
        assert ppd(argv) == 1
        assert time.monotonic() - started < 15
        assert not p.completions and not d.completions  # refused by the proxy itself
    err = capsys.readouterr().err
    assert "401" in err and fix in err
    assert not out.exists()


def test_the_right_admin_key_profiles_through_a_real_proxy(tmp_path: Path) -> None:
    out = tmp_path / "t.csv"
    with in_background(_pd_proxy("right")) as (url, _, _):
        assert ppd([*_argv(url, out, "--request-rate", "16"), "--duration", "1",
                    "--admin-key", "right"]) == 0
    row = read_table(out).iloc[0]
    assert row["pd_success"] == 1.0 and row["local_success"] == 1.0


def test_readback_against_a_proxy_whose_policy_never_reads_back_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Under pd D keeps no blocks: every turn forced to readback would be served P->D.
    out = tmp_path / "t.csv"
    with in_background(_pd_proxy("right")) as (url, _, d):
        assert ppd([*_argv(url, out, "--request-rate", "4"), "--duration", "30",
                    "--admin-key", "right", "--readback"]) == 1
        assert len(d.completions) == 1  # the one probe turn, no cell
    err = capsys.readouterr().err
    assert "runs --policy pd, which never reads back" in err and "--policy readback" in err
    assert not out.exists()


def test_readback_against_a_proxy_that_reads_back_passes_the_probes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from profiler.profile import runner

    measured: list[Any] = []

    async def no_cells(self: Any) -> pd.DataFrame:  # the probes, then stop: no load
        measured.append(self.routes)
        return pd.DataFrame()

    monkeypatch.setattr(runner.Profiler, "run", no_cells)
    with in_background(_pd_proxy("right", Policy.READBACK)) as (url, _, _):
        ppd([*_argv(url, tmp_path / "t.csv", "--request-rate", "4"),
             "--admin-key", "right", "--readback"])
    assert measured and "readback" in [route.value for route in measured[0]]


def test_a_target_that_is_down_asks_whether_the_proxy_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    assert ppd(_argv(url, tmp_path / "t.csv", "--request-rate", "4")) == 1
    assert f"is the proxy running at {url}?" in capsys.readouterr().err


# --- secrets and messages (issue 23, items 11 and 12) ---

def test_the_admin_key_is_never_recorded_or_printed(
        fake_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.csv"
    assert ppd(_argv(fake_url, out, "--request-rate", "16", "--admin-key", "s3cret")) == 0
    meta = (tmp_path / "t.meta.json").read_text()
    assert "s3cret" not in meta
    command = shlex.split(json.loads(meta)["command"])
    assert command[command.index("--admin-key") + 1] == "***"
    captured = capsys.readouterr()
    assert "s3cret" not in captured.out + captured.err


def test_the_interrupt_message_names_a_table_only_when_one_exists(tmp_path: Path) -> None:
    out = tmp_path / "t.csv"
    text = profile_cli.interrupt_message(out, "ppd profile --admin-key *** --out t.csv")
    assert "no table was written yet" in text and "does not exist" in text
    assert "give yours again" in text
    pd.DataFrame([{"context_class": "small", "workload": "tiny", "qps": 1.0, "pd_ttft_ms": 1,
                   "pd_tpot_ms": 1, "local_ttft_ms": 1, "local_tpot_ms": 1, "pd_success": 1,
                   "local_success": 1, "n_requests": 1}]).to_csv(out, index=False)
    text = profile_cli.interrupt_message(out, "ppd profile --out t.csv")
    assert f"the 1 cells measured so far are in {out}" in text
    assert "give yours again" not in text


@pytest.mark.parametrize(("flag", "value"), [("--duration", "0"), ("--timeout", "-1"),
                                             ("--warmup", "-1")])
def test_a_bad_grid_flag_is_named_in_the_error(flag: str, value: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*_argv("http://127.0.0.1:9", tmp_path / "t.csv", "--request-rate", "1"),
            flag, value]
    assert ppd(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"ppd profile: error: {flag} (grid key ")


def test_a_profile_where_no_cell_was_measured_exits_1(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The probe (a turn 1) passes; every turn 2 outlasts the timeout, so no cell has latencies.
    app = FakeTimedServer(ttft_s=0.005, itl_s=0.001,
                          ttft_for_turn=lambda turn: 0.005 if turn == 1 else 30.0)
    out = tmp_path / "t.csv"
    with serve_in_thread(app) as url:
        argv = [*_argv(url, out, "--request-rate", "16"), "--timeout", "0.5"]
        assert ppd(argv) == 1
    err = capsys.readouterr().err
    assert "no cell of" in err and "was measured" in err and "timeout after 0.5 s" in err
    assert read_table(out)["status"].tolist() == ["unmeasured"]
