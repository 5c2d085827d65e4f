"""The table and the JSON file of one run."""

from __future__ import annotations

import json
import platform
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil

from benchmarks.proxy_overhead.runner import Plan, Row

COLUMNS = ("target", "stack", "turns", "conc", "req/s", "x direct", "TTFT p50 ms", "+ms p50",
           "x direct", "TTFT p99 ms", "x direct", "gap p99 ms", "CPU s/1k req", "RSS MB",
           "RSS 10x MB", "errors")


def _direct(rows: list[Row]) -> dict[tuple[int, int], Row]:
    return {(r.turns, r.concurrency): r for r in rows if r.target == "direct"}


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(value: float | None, base: float | None) -> str:
    return "-" if value is None or not base else f"{value / base:.2f}"


def cells(row: Row, direct: Row | None) -> list[str]:
    """One row of the table as strings."""
    r, d = row.result, direct.result if direct else {}
    added = (None if r["ttft_p50_ms"] is None or d.get("ttft_p50_ms") is None
             else r["ttft_p50_ms"] - d["ttft_p50_ms"])
    return [row.target, row.stack, str(row.turns), str(row.concurrency), _num(r["rps"]),
            _ratio(r["rps"], d.get("rps")), _num(r["ttft_p50_ms"], 2),
            _num(added, 2) if row.target != "direct" else "-",
            _ratio(r["ttft_p50_ms"], d.get("ttft_p50_ms")), _num(r["ttft_p99_ms"], 2),
            _ratio(r["ttft_p99_ms"], d.get("ttft_p99_ms")), _num(r["gap_p99_ms"], 2),
            _num(row.cpu_s_per_1k, 2), _num(row.rss_mb), _num(row.extra.get("rss_long_mb")),
            str(r["errors"])]


def render(rows: list[Row]) -> str:
    """A Markdown table (readable as plain text too)."""
    direct = _direct(rows)
    return _table(COLUMNS, [cells(row, direct.get((row.turns, row.concurrency)))
                            for row in rows])


COMPARE_COLUMNS = ("target", "turns", "conc", "direct req/s", "before req/s", "after req/s",
                   "before x direct", "after x direct", "before +ms p50", "after +ms p50",
                   "before CPU s/1k", "after CPU s/1k")


def compare(rows: list[Row], before: str = "baseline", after: str = "default") -> str:
    """BEFORE and AFTER stacks of one run side by side (Markdown), against direct."""
    direct = _direct(rows)
    by_key = {(r.target, r.stack, r.turns, r.concurrency): r for r in rows}
    body: list[list[str]] = []
    for row in rows:
        if row.stack != before or (row.target, after, row.turns, row.concurrency) not in by_key:
            continue
        new = by_key[(row.target, after, row.turns, row.concurrency)]
        base = direct.get((row.turns, row.concurrency))
        d = base.result if base else {}

        body.append([row.target, str(row.turns), str(row.concurrency), _num(d.get("rps")),
                     _num(row.result["rps"]), _num(new.result["rps"]),
                     _ratio(row.result["rps"], d.get("rps")),
                     _ratio(new.result["rps"], d.get("rps")), _num(_added(row, d), 2),
                     _num(_added(new, d), 2), _num(row.cpu_s_per_1k, 2), _num(new.cpu_s_per_1k, 2)])
    return _table(COMPARE_COLUMNS, body)


def _added(row: Row, direct: dict[str, Any]) -> float | None:
    p50, ref = row.result["ttft_p50_ms"], direct.get("ttft_p50_ms")
    return None if p50 is None or ref is None else p50 - ref


def _table(columns: tuple[str, ...], body: list[list[str]]) -> str:
    widths = [max(len(c), *(len(line[i]) for line in body)) if body else len(c)
              for i, c in enumerate(columns)]

    def line(values: list[str] | tuple[str, ...]) -> str:
        return "| " + " | ".join(v.rjust(w) for v, w in zip(values, widths, strict=True)) + " |"

    out = [line(columns), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    return "\n".join(out + [line(values) for values in body])


def machine() -> str:
    """A one-line description of where the numbers were taken."""
    return (f"{platform.processor() or platform.machine()}, {psutil.cpu_count()} cores, "
            f"Python {platform.python_version()}, load average "
            f"{' '.join(f'{x:.1f}' for x in psutil.getloadavg())}")


def write_json(path: Path, plan: Plan, rows: list[Row], command: str) -> None:
    """Every row's raw numbers, with the plan, the machine and the command."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {
        "command": command, "machine": machine(), "plan": asdict(plan),
        "rows": [{"target": r.target, "stack": r.stack, "turns": r.turns,
                  "concurrency": r.concurrency, **r.result,
                  "proxy_cpu_s_per_1k": r.cpu_s_per_1k, "proxy_rss_mb": r.rss_mb, **r.extra}
                 for r in rows],
    }
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")


PEER_COLUMNS = ("target", "stack", "turns", "conc", "req/s", "router req/s", "x router",
                "TTFT p50 ms", "router TTFT p50", "CPU s/1k", "router CPU", "x router CPU",
                "router-d CPU", "x router-d CPU")


def against_peer(rows: list[Row]) -> str:
    """Each ppd row beside vllm-router's rows of the same turns and concurrency: its P/D mode
    (`vllm-router`, the issue's yardstick for every ppd path) and its one-hop plain mode
    (`vllm-router-d`, the stricter yardstick for the local path)."""
    by_key = {(r.target, r.turns, r.concurrency): r for r in rows if r.stack == "-"}
    body: list[list[str]] = []
    for row in rows:
        router = by_key.get(("vllm-router", row.turns, row.concurrency))
        plain = by_key.get(("vllm-router-d", row.turns, row.concurrency))
        if row.stack == "-" or router is None:
            continue
        plain_cpu = plain.cpu_s_per_1k if plain else None
        body.append([row.target, row.stack, str(row.turns), str(row.concurrency),
                     _num(row.result["rps"]), _num(router.result["rps"]),
                     _ratio(row.result["rps"], router.result["rps"]),
                     _num(row.result["ttft_p50_ms"], 2), _num(router.result["ttft_p50_ms"], 2),
                     _num(row.cpu_s_per_1k, 2), _num(router.cpu_s_per_1k, 2),
                     _ratio(row.cpu_s_per_1k, router.cpu_s_per_1k), _num(plain_cpu, 2),
                     _ratio(row.cpu_s_per_1k, plain_cpu)])
    return _table(PEER_COLUMNS, body)
