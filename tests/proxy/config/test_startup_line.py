"""proxy.config.startup_line: what an operator reads when the proxy comes up."""

from __future__ import annotations

from pathlib import Path

from proxy.config.settings import config_from_args
from proxy.config.startup_line import startup_line
from tests.proxy.serving.test_app import write_table


def test_startup_line_names_policy_table_weights_and_nodes(tmp_path: Path) -> None:
    table = write_table(tmp_path / "t.csv", local_wins=True)
    config = config_from_args(["--prefill", "http://p:1", "--decode", "http://d:2",
                               "--policy", "ppd", "--table", str(table), "--w-tpot", "2"])
    line = startup_line(config, "http://127.0.0.1:8000")
    assert "listening on http://127.0.0.1:8000" in line
    assert f"table {table}" in line and "w_ttft=1" in line and "w_tpot=2" in line
    assert "prefill=http://p:1" in line and "decode=http://d:2" in line
