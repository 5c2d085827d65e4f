"""A replay run on disk: per-request CSV/Parquet, summary.json, a TTFT CDF plot; and the table.

Run directory layout (what `ppd report compare` reads back):
    requests.csv, requests.parquet  one row per completed request; every time in milliseconds
                                    (start_ms from the run's start, ttft_ms, tpot_ms, e2e_ms,
                                    itl_ms - in the CSV a ';'-separated list), like summary.json
    summary.json                    {"label", "target", "dataset", "api", "created", "config",
                                     "load", "interrupted", "command",
                                     "summary": metrics.summarize(...)}
    ttft_cdf.png                    TTFT CDF by turn group (turn 2+ split by route when known)
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import fields
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profiler.replay.client import ReplayConfig, ReplayResult
from profiler.traces.request_records import RequestRecord
from proxy.shared.redact import redacted_url

if TYPE_CHECKING:
    import pandas as pd

SUMMARY_FILE = "summary.json"
REQUESTS_CSV = "requests.csv"
REQUESTS_PARQUET = "requests.parquet"
TTFT_CDF_PNG = "ttft_cdf.png"


# RequestRecord's times are seconds; on disk they are ms, the unit of summary.json.
_MS_COLUMNS = {"start_s": "start_ms", "ttft_s": "ttft_ms", "tpot_s": "tpot_ms", "e2e_s": "e2e_ms"}


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000.0


def records_frame(records: Sequence[RequestRecord]) -> pd.DataFrame:
    """One row per request, the RequestRecord fields as columns, times in ms (`*_ms`)."""
    import pandas as pd

    names = [f.name for f in fields(RequestRecord)]
    columns = [_MS_COLUMNS.get(name, "itl_ms" if name == "itl_s" else name) for name in names]
    rows = []
    for record in records:
        row = {}
        for name, column in zip(names, columns, strict=True):
            value = getattr(record, name)
            row[column] = _ms(value) if name in _MS_COLUMNS else value
        rows.append(row)
    frame = pd.DataFrame(rows, columns=columns)
    frame["itl_ms"] = [[gap * 1000.0 for gap in record.itl_s] for record in records]
    return frame


def config_dict(config: ReplayConfig) -> dict[str, Any]:
    """The config as JSON values (a headers callback is recorded as present or not)."""
    out: dict[str, Any] = {}
    for field in fields(ReplayConfig):
        value = getattr(config, field.name)
        out[field.name] = (value is not None) if callable(value) else value
    out["target"] = redacted_url(config.target)
    return out


def write_run(
    out_dir: Path,
    result: ReplayResult,
    summary: Mapping[str, Any],
    *,
    label: str,
    dataset: str,
    extra: Mapping[str, Any] | None = None,
    backend: str | None = None,
) -> list[Path]:
    """Write every output of one run into out_dir (created); returns the paths written.

    summary.json is written last, so a directory with one holds a whole run. backend: what
    served the run when it is not plain vLLM (e.g. emulated nodes and their preset); recorded
    in summary.json and in the plot's title."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / SUMMARY_FILE).unlink(missing_ok=True)
    frame = records_frame(result.records)
    csv_frame = frame.copy()
    csv_frame["itl_ms"] = [";".join(f"{gap:.3f}" for gap in gaps) for gaps in frame["itl_ms"]]
    csv_frame.to_csv(out_dir / REQUESTS_CSV, index=False)
    frame.to_parquet(out_dir / REQUESTS_PARQUET, index=False)
    document = {
        "label": label,
        "target": redacted_url(result.config.target),
        "dataset": dataset,
        "api": result.config.api,  # chat, completions or responses: what the turns went through
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "config": config_dict(result.config),
        "load": {"conversation_rate": result.config.qps, "unit": "conversations/s",
                 "measured_request_rate": summary.get("requests_s"),
                 "measured_unit": "requests (turns)/s"},
        "interrupted": result.interrupted,
        **dict(extra or {}),
        "summary": dict(summary),
        **({"backend": backend} if backend else {}),
    }
    title = f"{label} [{backend}]" if backend else label
    plot_ttft_cdf(result.records, out_dir / TTFT_CDF_PNG, title=title)
    (out_dir / SUMMARY_FILE).write_text(json.dumps(document, indent=2, default=_json_default))
    return [out_dir / name for name in (REQUESTS_CSV, REQUESTS_PARQUET, SUMMARY_FILE,
                                        TTFT_CDF_PNG)]


def _json_default(value: object) -> object:
    if isinstance(value, float) and math.isnan(value):
        return None
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def ttft_groups(records: Sequence[RequestRecord]) -> dict[str, list[float]]:
    """Successful TTFTs (ms) by turn group: turn 1, and turn 2+ per route when routes are
    known (otherwise one turn 2+ group). Empty groups are left out."""
    groups: dict[str, list[float]] = {"turn 1": []}
    for record in records:
        if not record.success or record.ttft_s is None:
            continue
        if record.turn == 1:
            key = "turn 1"
        else:
            key = f"turn 2+ ({record.route})" if record.route else "turn 2+"
        groups.setdefault(key, []).append(record.ttft_s * 1000.0)
    return {key: sorted(values) for key, values in groups.items() if values}


def plot_ttft_cdf(records: Sequence[RequestRecord], path: Path, *, title: str) -> None:
    """A PNG of the empirical TTFT CDF per turn group."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    try:
        groups = ttft_groups(records)
        for name, values in groups.items():
            n = len(values)
            axes.step(values, [(i + 1) / n for i in range(n)], where="post",
                      label=f"{name} (n={n})")
        if not groups:
            axes.text(0.5, 0.5, "no successful requests", ha="center", transform=axes.transAxes)
        axes.set_xlabel("TTFT (ms)")
        axes.set_ylabel("fraction of requests")
        axes.set_ylim(0, 1.02)
        axes.set_title(f"TTFT CDF - {title}")
        axes.grid(alpha=0.3)
        if groups:
            axes.legend(loc="lower right")
        figure.tight_layout()
        figure.savefig(path, dpi=110)
    finally:
        plt.close(figure)


def format_value(value: Any) -> str:
    """A summary value for a text table: '-' for missing, 3 decimals below 10, else 1."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


# The rows of the printed summary: (label, summary key).
TABLE_ROWS: tuple[tuple[str, str], ...] = (
    ("requests (ok/all)", "_requests"),
    ("conversations/s (offered)", "conversation_rate"),
    ("conversations", "n_conversations"),
    ("success rate", "success_rate"),
    ("turn-1 TTFT mean/p50/p90/p99 ms", "turn1_ttft_ms"),
    ("turn-2+ TTFT mean/p50/p90/p99 ms", "turn2plus_ttft_ms"),
    ("TPOT mean/p50/p90/p99 ms", "tpot_ms"),
    ("turn-2+ TPOT mean/p50/p90/p99 ms", "turn2plus_tpot_ms"),
    ("E2E mean/p50/p90/p99 ms", "e2e_ms"),
    ("output tok/s", "output_tok_s"),
    ("total tok/s", "total_tok_s"),
    ("requests/s (measured)", "requests_s"),
    ("local share (turn 2+)", "local_share"),
    ("SLO attainment", "slo_attainment"),
)


def summary_table(summary: Mapping[str, Any], *, title: str) -> str:
    """The summary as a plain two-column text table."""
    lines = []
    for label, key in TABLE_ROWS:
        if key == "_requests":
            value = f"{summary['n_success']}/{summary['n_requests']}"
        elif f"{key}_mean" in summary:
            value = " / ".join(format_value(summary.get(f"{key}_{stat}"))
                               for stat in ("mean", "p50", "p90", "p99"))
        else:
            value = format_value(summary.get(key))
        lines.append((label, value))
    if summary.get("routes"):
        lines.append(("routes", ", ".join(f"{k}={v}" for k, v in summary["routes"].items())))
    width = max(len(label) for label, _ in lines)
    body = "\n".join(f"  {label:<{width}}  {value}" for label, value in lines)
    return f"{title}\n{body}"
