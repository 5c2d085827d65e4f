"""`ppd profile` command line: load units, --force, resume message, meta, help."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from profiler.cli import main as ppd
from profiler.profile import cli as profile_cli
from profiler.tables.io import read_table
from tests.fakes.fake_openai_timed import FakeTimedServer, serve_in_thread


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


def test_a_partial_table_is_resumed_with_a_note(
        fake_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.csv"
    assert ppd(_argv(fake_url, out, "--request-rate", "16")) == 0
    capsys.readouterr()
    assert ppd(_argv(fake_url, out, "--request-rate", "16,24")) == 0
    err = capsys.readouterr().err
    assert "resuming" in err and "1 of 2 cells already measured" in err
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
                                                      "16,17,18,19,20,21")],
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
