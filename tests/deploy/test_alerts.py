"""The shipped alert rules pass `promtool check rules`, and promtool's own unit tests of them
(deploy/prometheus/ppd-alerts.test.yml: each alert fires on the series of its trouble and not
on a healthy proxy's) pass. promtool is Debian's `prometheus` package, which `make
system-deps` installs (`make test` runs it first): without it these tests fail, never skip."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from tests.deploy.promql import ALERT_TESTS, ALERTS

ALERTS_ASKED_FOR = {"PpdKvEventsStale", "PpdResidencyUnknown", "PpdNoDecodeNode",
                    "PpdFallbackRateHigh"}


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool is not None, (
        "promtool is missing: `make system-deps` installs it (Debian's prometheus package)")
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120,
                          cwd=ALERTS.parent)


def test_the_alert_rules_pass_promtool_check_rules() -> None:
    result = _promtool("check", "rules", ALERTS.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 4 rules found" in result.stdout


def test_each_alert_fires_on_its_trouble_and_not_otherwise() -> None:
    tested = {case["alertname"] for test in yaml.safe_load(ALERT_TESTS.read_text())["tests"]
              for case in test.get("alert_rule_test", [])}
    assert tested == ALERTS_ASKED_FOR  # every alert has a unit test
    result = _promtool("test", "rules", ALERT_TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_would_catch_a_broken_rule(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text("groups:\n  - name: x\n    rules:\n      - alert: X\n"
                      "        expr: sum(rate(ppd_requests_total[5m]) > \n")
    result = _promtool("check", "rules", str(broken))
    assert result.returncode != 0
