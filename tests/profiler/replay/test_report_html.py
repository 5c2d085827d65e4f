"""`ppd report show` and compare's page: one self-contained HTML page, checked in a real
headless browser (Debian's chromium, installed by `make system-deps`)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from profiler.cli import main as ppd
from profiler.replay import ReplayConfig, ReplayResult, report
from profiler.replay.metrics import summarize
from profiler.replay.output import REQUESTS_PARQUET, write_run
from profiler.replay.report_html import REPORT_FILE
from profiler.traces.request_records import RequestRecord

_CHECK = re.compile(r"images (\d+) decoded (\d+)")


def _run_dir(root: Path, name: str, *, failures: int = 2) -> Path:
    records = []
    for i in range(12):
        for turn in (1, 2, 3, 4, 5):
            failed = i < failures and turn == 3
            records.append(RequestRecord(
                conversation_id=f"c{i}", turn=turn,
                route="pd" if turn == 1 or i % 2 else "local", decode="d0", prefill="p0",
                start_s=i + turn * 0.5, ttft_s=None if failed else 0.05 * turn,
                tpot_s=None if failed else 0.007, e2e_s=None if failed else 0.5,
                itl_s=(0.007,) * 3, n_input_tokens=100 * turn, n_output_tokens=0 if failed else 4,
                success=not failed, error="timeout after 30 s" if failed else None,
                status=None if failed else 200))
    config = ReplayConfig(target="http://127.0.0.1:8000", qps=1.0, duration_s=12.0)
    result = ReplayResult(records=records, wall_time_s=15.0, config=config, n_conversations=12)
    out = root / name
    write_run(out, result, summarize(records, 15.0), label=f"{name}@1", dataset="syn")
    return out


def _rendered(page: Path) -> tuple[int, int]:
    """(images, images decoded) as the page's own script counted them in headless chromium."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:  # a failure, not a skip: CI installs it (make system-deps)
        pytest.fail("chromium is not installed: run `make system-deps` (Debian's chromium "
                    "package) - this test checks the report in a real browser")
    dom = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
         "--dump-dom", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120, check=True).stdout
    match = _CHECK.search(dom)
    assert match is not None, f"the page's render check did not run: {dom[:300]!r}"
    return int(match.group(1)), int(match.group(2))


def test_show_writes_one_self_contained_page(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    run = _run_dir(tmp_path, "pd")
    assert ppd(["report", "show", str(run)]) == 0
    page = run / REPORT_FILE
    assert f"wrote {page}" in capsys.readouterr().out
    text = page.read_text()
    for heading in ("Summary", "TTFT by turn and route", "TPOT by turn and route",
                    "Route mix over time", "Failures"):
        assert f"<h2>{heading}</h2>" in text
    # 2 distributions, the route mix, the failures over time: all inline, nothing fetched
    assert text.count("src='data:image/png;base64,") == 4
    assert not re.search(r"(src|href)=['\"]?(https?:)?//", text)
    assert "2 of 60 requests failed" in text and "timeout after 30 s" in text
    assert ">60/60<" not in text and ">58/60<" in text  # the summary table


def test_the_page_is_drawn_from_the_requests_table(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, "pd")
    (run / REQUESTS_PARQUET).unlink()  # the CSV is read instead
    assert ppd(["report", "show", str(run), "--out", str(tmp_path / "page.html")]) == 0
    assert "Route mix over time" in (tmp_path / "page.html").read_text()
    for name in ("requests.csv",):
        (run / name).unlink()
    with pytest.raises(FileNotFoundError, match="has neither requests.parquet nor"):
        report.main(["show", str(run)])


def test_a_headless_browser_renders_the_run_page_with_its_plots(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, "pd")
    assert ppd(["report", "show", str(run)]) == 0
    images, decoded = _rendered(run / REPORT_FILE)
    assert images == 4 and decoded == 4


def test_compare_writes_a_page_the_browser_renders(tmp_path: Path) -> None:
    runs = [_run_dir(tmp_path, "pd", failures=0), _run_dir(tmp_path, "local", failures=0)]
    out = tmp_path / "cmp"
    assert ppd(["report", "compare", *map(str, runs), "--out", str(out)]) == 0
    text = (out / "compare.html").read_text()
    assert "pd@1" in text and "local@1" in text
    images, decoded = _rendered(out / "compare.html")
    assert images == 4 and decoded == 4  # the two load plots, each run's TTFT
