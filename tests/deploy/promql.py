"""The metric names a PromQL expression reads, and the queries of the shipped dashboard and
alert rules (deploy/grafana, deploy/prometheus), for the tests that check them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "ppd-dashboard.json"
ALERTS = ROOT / "deploy" / "prometheus" / "ppd-alerts.yml"
ALERT_TESTS = ROOT / "deploy" / "prometheus" / "ppd-alerts.test.yml"

# What is not a metric name: string literals, label matchers, range and subquery selectors,
# the label lists of by/without/on/ignoring/group_*, offsets, numbers (1e-9 holds an "e").
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_OFFSETS = re.compile(r"\boffset\s+-?[0-9smhdwy]+")
_NUMBERS = re.compile(r"(?<![\w:])\d[\d.]*(?:[eE][-+]?\d+)?")
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names `expr` selects (functions and aggregations are followed by `(`)."""
    text = _STRINGS.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _LABEL_LISTS.sub(" ", text)
    text = _OFFSETS.sub(" ", text)
    text = _NUMBERS.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        rest = text[match.end():].lstrip()
        if rest.startswith("(") or match.group().lower() in _KEYWORDS:
            continue
        names.add(match.group())
    return names


def dashboard_queries() -> dict[str, str]:
    """Every target expression of the dashboard, by "panel title / refId"."""
    dashboard = json.loads(DASHBOARD.read_text())
    return {f"{panel['title']} / {target['refId']}": target["expr"]
            for panel in dashboard["panels"] for target in panel.get("targets", [])}


def alert_expressions() -> dict[str, str]:
    """Every alert rule's expression, by alert name."""
    rules = yaml.safe_load(ALERTS.read_text())
    return {rule["alert"]: rule["expr"] for group in rules["groups"] for rule in group["rules"]}
