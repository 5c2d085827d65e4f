"""`python -m benchmarks --only proxy_overhead --quick`: every process starts, every row is
measured through real sockets with no error, and the table and the JSON say so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.__main__ import main
from benchmarks.proxy_overhead.backend import stream_events
from benchmarks.proxy_overhead.loadgen import _reply_text


def test_quick_run_measures_every_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    out = tmp_path / "quick.json"
    assert main(["--only", "proxy_overhead", "--quick", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = data["rows"]
    seen = {(r["target"], r["turns"], r["concurrency"]) for r in rows}
    assert seen == {(t, turns, c) for t in ("direct", "local") for turns in (1, 4)
                    for c in (1, 16)}
    for row in rows:
        assert row["errors"] == 0, row["first_error"]
        assert row["requests"] > 0 and row["rps"] > 0
        assert row["ttft_p50_ms"] <= row["ttft_p99_ms"]
        if row["target"] != "direct":
            assert row["proxy_cpu_s_per_1k"] > 0 and row["proxy_rss_mb"] > 0
            assert row["rss_long_mb"] > 0 and row["long_errors"] == 0
            assert row["long_requests"] > row["requests_total"]
    table = capsys.readouterr().out
    assert "| target |" in table and table.count("\n|") >= len(rows) + 1


def test_the_fake_streams_what_the_generator_reads_back() -> None:
    text, done = _reply_text(b"".join(stream_events(3, usage=True)))
    assert done and text == " tok0 tok1 tok2"
    text, done = _reply_text(b"".join(stream_events(2, usage=False)[:-1]))
    assert not done and text == " tok0 tok1"


def test_compare_puts_before_and_after_side_by_side() -> None:
    from benchmarks.proxy_overhead.report import compare
    from benchmarks.proxy_overhead.runner import Row

    def result(rps: float, p50: float) -> dict[str, object]:
        return {"rps": rps, "ttft_p50_ms": p50, "ttft_p99_ms": p50, "gap_p99_ms": None,
                "errors": 0}

    rows = [Row("direct", "-", 1, 64, result(1000, 1.0)),
            Row("pd", "baseline", 1, 64, result(100, 5.0), cpu_s_per_1k=6.0),
            Row("pd", "default", 1, 64, result(400, 2.5), cpu_s_per_1k=1.5)]
    line = compare(rows).splitlines()[2]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells == ["pd", "1", "64", "1000.0", "100.0", "400.0", "0.10", "0.40", "4.00",
                     "1.50", "6.00", "1.50"]
