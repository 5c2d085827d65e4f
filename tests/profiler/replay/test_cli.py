"""`ppd replay` end to end against the fake timed server, and its outputs on disk."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from profiler.cli import main as ppd
from profiler.replay import cli as replay_cli
from profiler.replay.output import summary_table
from tests.fakes.fake_openai_timed import FakeTimedServer, serve_in_thread

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def fake_url() -> str:
    app = FakeTimedServer(ttft_s=0.02, itl_s=0.002, route="local")
    with serve_in_thread(app) as url:
        yield url


def test_replay_synthetic_writes_every_output(fake_url: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code = replay_cli.main([
        "--target", fake_url, "--dataset", "synthetic:small-tiny", "--conversation-rate", "20",
        "--duration", "0.5", "--max-conversations", "4", "--max-tokens-cap", "8",
        "--slo", "1000,100", "--out", str(out), "--label", "fake@20", "--no-progress",
    ])
    assert code == 0
    printed = capsys.readouterr().out
    assert "turn-2+ TTFT" in printed and str(out) in printed
    assert re.search(r"conversations/s \(offered\) +20\.0", printed)
    document = json.loads((out / "summary.json").read_text())
    summary = document["summary"]
    assert document["label"] == "fake@20" and document["config"]["qps"] == 20.0
    assert document["load"]["conversation_rate"] == 20.0
    assert document["load"]["unit"] == "conversations/s"
    assert document["interrupted"] is False
    assert document["reset_prefix_cache"] is False
    assert document["command"].startswith("ppd replay --target ")
    assert summary["n_requests"] == 2 * summary["n_conversations"] > 0
    assert summary["success_rate"] == 1.0 and summary["slo_attainment"] == 1.0
    assert summary["local_share"] == 1.0
    csv = pd.read_csv(out / "requests.csv")
    parquet = pd.read_parquet(out / "requests.parquet")
    assert len(csv) == len(parquet) == summary["n_requests"]
    assert set(csv["turn"]) == {1, 2} and set(csv["max_tokens"]) == {8}
    assert len(parquet["itl_ms"].iloc[0]) == 7
    # Times in ms, as in summary.json: the fake's TTFT is 20 ms, its ITL 2 ms.
    assert {"start_ms", "ttft_ms", "tpot_ms", "e2e_ms", "itl_ms"} <= set(csv.columns)
    assert not any(column.endswith("_s") for column in csv.columns)
    assert csv["ttft_ms"].min() >= 20.0 and csv["tpot_ms"].min() >= 2.0
    assert csv["ttft_ms"].median() == pytest.approx(summary["ttft_ms_p50"])
    assert (out / "ttft_cdf.png").read_bytes()[:4] == b"\x89PNG"


def test_replay_a_trace_file_through_the_dispatcher(fake_url: str, tmp_path: Path) -> None:
    rows = [{"id": f"o{i}", "messages": [
        {"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": "x" * 20},
        {"role": "user", "content": "and?"}, {"role": "assistant", "content": "y" * 12},
    ]} for i in range(5)]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "run"
    code = ppd(["replay", "--target", fake_url, "--dataset", str(trace), "--qps", "50",
                "--duration", "0.2", "--max-conversations", "3", "--api", "completions",
                "--max-turns", "1", "--out", str(out), "--no-progress"])
    assert code == 0
    frame = pd.read_csv(out / "requests.csv")
    assert set(frame["turn"]) == {1}
    assert set(frame["max_tokens"]) == {5}  # 20 characters at 4 per token


@pytest.mark.parametrize("argv, message", [
    (["--dataset", "synthetic:nope"], "unknown synthetic workload"),
    (["--dataset", "/nonexistent/trace.json"], "not found"),
    (["--dataset", "synthetic:mixed", "--slo", "fast"], "--slo wants TTFT_MS,TPOT_MS"),
    (["--dataset", "synthetic:mixed", "--conversation-rate", "0"],
     "--conversation-rate must be > 0"),
    (["--dataset", "mixed"], "did you mean synthetic:mixed?"),
    (["--dataset", "synthetic:mixd"], "did you mean mixed?"),
    (["--dataset", "sharegtp"], "did you mean sharegpt?"),
    (["--dataset", "small-mid_bla"], "did you mean synthetic:small-mid_bal"),
    (["--dataset", "synthetic:mixed", "--duration", "0"], "--duration must be > 0"),
    (["--dataset", "synthetic:mixed", "--timeout", "-1"], "--timeout must be > 0"),
    (["--dataset", "synthetic:mixed", "--min-success", "95"],
     "--min-success is a share of requests between 0 and 1"),
])
def test_bad_input_is_one_clear_error(argv: list[str], message: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    base = ["replay", "--target", "http://127.0.0.1:9", "--conversation-rate", "1",
            "--duration", "1"]
    assert ppd(base + argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("ppd replay: error:") and message in err
    assert "Traceback" not in err


def test_conversations_needed_covers_poisson_spread() -> None:
    assert replay_cli.conversations_needed(1.0, 100.0, None) >= 140  # mean 100, sd 10
    assert replay_cli.conversations_needed(1.0, 100.0, 7) == 7


def test_summary_table_shows_missing_values_as_dashes() -> None:
    summary = {"n_success": 0, "n_requests": 0, "turn1_ttft_ms_mean": None, "routes": {}}
    table = summary_table(summary, title="empty")
    assert table.splitlines()[0] == "empty"
    assert "0/0" in table and " - / - / - / -" in table


def test_default_label_follows_a_name_at_load_out_directory() -> None:
    from profiler.replay.cli import default_label

    assert default_label(Path("runs/pd@0.5"), "synthetic:mixed", 0.5) == "pd@0.5"
    assert default_label(Path("runs/first"), "data/sharegpt.json", 2.0) == "sharegpt.json@2"
    assert default_label(None, "synthetic:mixed", 1.0) == "synthetic:mixed@1"


def test_qps_is_a_deprecated_alias_with_a_warning(fake_url: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code = replay_cli.main(["--target", fake_url, "--dataset", "synthetic:small-tiny",
                            "--qps", "20", "--duration", "0.2", "--max-conversations", "1",
                            "--max-tokens-cap", "2", "--out", str(out), "--no-progress"])
    assert code == 0
    assert "--qps is deprecated, use --conversation-rate" in capsys.readouterr().err
    assert json.loads((out / "summary.json").read_text())["load"]["conversation_rate"] == 20.0


def test_a_finished_run_is_not_overwritten_without_force(fake_url: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    out = tmp_path / "run"
    argv = ["replay", "--target", fake_url, "--dataset", "synthetic:small-tiny",
            "--conversation-rate", "20", "--duration", "0.2", "--max-conversations", "1",
            "--max-tokens-cap", "2", "--out", str(out), "--no-progress"]
    assert ppd(argv) == 0
    before = (out / "summary.json").read_text()
    assert ppd(argv) == 1
    err = capsys.readouterr().err
    assert "already holds a finished run" in err and "--force" in err
    assert (out / "summary.json").read_text() == before
    assert ppd([*argv, "--force"]) == 0


def test_an_interrupted_run_is_not_overwritten_without_force(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").write_text(json.dumps({"interrupted": True}))
    with pytest.raises(ValueError, match="holds an interrupted run") as refused:
        replay_cli.check_out_dir(out, force=False)
    # Says why it cannot be resumed, and how to replace or keep it.
    assert "cannot resume" in str(refused.value) and "--force" in str(refused.value)
    assert "another --out to keep it" in str(refused.value)
    replay_cli.check_out_dir(out, force=True)  # replacing it is a choice
    (out / "summary.json").write_text(json.dumps({"interrupted": False}))
    with pytest.raises(ValueError, match="finished run"):
        replay_cli.check_out_dir(out, force=False)


def _replay_argv(url: str, out: Path, *extra: str) -> list[str]:
    return ["replay", "--target", url, "--dataset", "synthetic:small-tiny",
            "--conversation-rate", "20", "--duration", "0.3", "--max-conversations", "4",
            "--max-tokens-cap", "2", "--timeout", "2", "--out", str(out), "--no-progress",
            *extra]


def test_a_run_where_every_request_failed_exits_1_with_the_first_errors(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    with serve_in_thread(FakeTimedServer(status=500)) as url:
        assert ppd(_replay_argv(url, out)) == 1
    err = capsys.readouterr().err
    assert "none of the 4 requests succeeded; first errors:" in err
    assert "4 x HTTP 500: injected failure" in err
    # What it measured is kept all the same.
    assert len(pd.read_csv(out / "requests.csv")) == 4


def test_min_success_fails_a_run_below_the_share(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Turn 1 answers at once, turn 2 outlasts the timeout: half the requests succeed.
    app = FakeTimedServer(ttft_s=0.005, itl_s=0.001,
                          ttft_for_turn=lambda turn: 0.005 if turn == 1 else 30.0)
    with serve_in_thread(app) as url:
        argv = _replay_argv(url, tmp_path / "a", "--timeout", "0.5")
        assert ppd(argv) == 0  # some succeeded, no threshold given
        capsys.readouterr()
        argv = _replay_argv(url, tmp_path / "b", "--timeout", "0.5", "--min-success", "0.9")
        assert ppd(argv) == 1
    err = capsys.readouterr().err
    assert "4/8 requests succeeded (50.0%), below --min-success 0.9" in err
    assert "4 x timeout after 0.5 s" in err


def test_the_admin_key_is_not_in_the_summary(tmp_path: Path, fake_url: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert ppd(_replay_argv(fake_url, out, "--force-route", "local",
                            "--admin-key", "s3cret")) == 0
    assert "s3cret" not in (out / "summary.json").read_text()
    captured = capsys.readouterr()
    assert "s3cret" not in captured.out + captured.err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_mid_replay_keeps_the_completed_turns(tmp_path: Path,
                                                       sig: signal.Signals) -> None:
    app = FakeTimedServer(ttft_s=0.01, itl_s=0.005, route="local")
    out = tmp_path / "run"
    with serve_in_thread(app) as url:
        process = subprocess.Popen(
            [sys.executable, "-m", "profiler.cli", "replay", "--target", url,
             "--dataset", "synthetic:small-tiny", "--conversation-rate", "10",
             "--duration", "600", "--max-tokens-cap", "4", "--out", str(out),
             "--no-progress", "--force-route", "local", "--admin-key", "s3cret"],
            env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=tmp_path,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while len(app.bodies) < 8 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(app.bodies) >= 8, "the replay never got going"
            process.send_signal(sig)
            stdout, stderr = process.communicate(timeout=60)
        finally:
            process.kill()
    assert process.returncode == 130, stderr
    document = json.loads((out / "summary.json").read_text())
    assert document["interrupted"] is True
    completed = document["summary"]["n_requests"]
    assert completed >= 6 and document["summary"]["success_rate"] == 1.0
    assert len(pd.read_csv(out / "requests.csv")) == completed
    assert "interrupted after" in stderr and "re-run" in stderr and str(out) in stdout
    assert "another --out" in stderr and "--force" in stderr
    assert "s3cret" not in stderr + (out / "summary.json").read_text()


def test_a_target_that_is_down_asks_whether_the_proxy_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://user:pw0rd@127.0.0.1:{sock.getsockname()[1]}"
    assert ppd(_replay_argv(url, tmp_path / "run")) == 1
    err = capsys.readouterr().err
    assert f"is the proxy running at {url.replace('pw0rd', '***')}?" in err
    assert "pw0rd" not in err


def test_force_route_on_a_proxy_without_an_admin_key_warns_that_it_was_ignored(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from contextlib import asynccontextmanager

    from proxy import ProxyConfig, create_app
    from proxy.config.cluster_file import NodeSpec
    from proxy.serving.server import running
    from proxy.shared.vocabulary import Role
    from tests.fakes.background import in_background
    from tests.fakes.fake_vllm import FakeVLLM

    @asynccontextmanager
    async def keyless_proxy():  # type: ignore[no-untyped-def]
        async with FakeVLLM("p") as p, FakeVLLM("d") as d:
            config = ProxyConfig(nodes=(NodeSpec(p.url, Role.PREFILL),
                                        NodeSpec(d.url, Role.DECODE)), port=0)
            async with running(create_app(config)) as proxy:
                yield proxy.url

    with in_background(keyless_proxy) as url:
        assert ppd(_replay_argv(url, tmp_path / "run", "--force-route", "local",
                                "--duration", "1", "--max-turns", "2")) == 0
    assert "proxy ignores x-ppd-route without an admin key" in capsys.readouterr().err
