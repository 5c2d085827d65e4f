"""One replay run as `ppd report` reads it back: its summary.json checked, its label, load
and provenance (`Run`, `load_run`), and the rows the side-by-side table shows.

Apart from `profiler.replay.report` so that the report's page and warnings modules can name a
run without importing the command that draws them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from profiler.replay.output import SUMMARY_FILE

# (row label, summary key) of the side-by-side table.
COMPARE_ROWS: tuple[tuple[str, str], ...] = (
    ("conversations/s (offered)", "_qps"),
    ("requests ok/all", "_requests"),
    ("success rate", "success_rate"),
    ("turn-1 TTFT mean ms", "turn1_ttft_ms_mean"),
    ("turn-1 TTFT p99 ms", "turn1_ttft_ms_p99"),
    ("turn-2+ TTFT mean ms", "turn2plus_ttft_ms_mean"),
    ("turn-2+ TTFT p50 ms", "turn2plus_ttft_ms_p50"),
    ("turn-2+ TTFT p90 ms", "turn2plus_ttft_ms_p90"),
    ("turn-2+ TTFT p99 ms", "turn2plus_ttft_ms_p99"),
    ("TPOT mean ms", "tpot_ms_mean"),
    ("TPOT p99 ms", "tpot_ms_p99"),
    ("output tok/s", "output_tok_s"),
    ("total tok/s", "total_tok_s"),
    ("requests/s (measured)", "requests_s"),
    ("local share (turn 2+)", "local_share"),
    ("SLO attainment", "slo_attainment"),
)
# The summary values the table and plots read as numbers (null: not measured in that run).
NUMBER_KEYS = (*(key for _, key in COMPARE_ROWS if not key.startswith("_")), "ttft_ms_p99",
               "n_success", "n_requests")


@dataclass(frozen=True, slots=True)
class Run:
    """One replay run as read back from its summary.json."""

    path: Path
    label: str
    qps: float  # the conversation rate offered
    summary: dict[str, Any]
    backend: str | None = None  # set when the run was not on vLLM (e.g. emulated nodes)
    dataset: str | None = None
    target: str | None = None
    interrupted: bool = False
    seed: int | None = None  # the replay's --seed: with the dataset, which conversations ran
    # The nodes' prefix caches were emptied before it ran (`ppd replay --reset-prefix-cache`),
    # or it ran on a fresh simulated cluster: an earlier run's prompts cannot be cached.
    cold_start: bool = False

    @property
    def series(self) -> str:
        return self.label.split("@", 1)[0]


def load_run(path: Path) -> Run:
    """The run in directory path (or a summary.json path itself)."""
    file = path / SUMMARY_FILE if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"{path} has no {SUMMARY_FILE} (not a `ppd replay --out` dir?)")
    if file.suffix in (".parquet", ".csv"):
        raise ValueError(f"{file} is {what_table(file)}, not a replay run: `ppd report compare` "
                         "reads the directories `ppd replay --out DIR` (or `ppd sim run --out "
                         f"DIR`) writes, e.g. `ppd report compare runs/pd@1 runs/ppd@1`")
    try:
        document = json.loads(file.read_text())
        summary = document["summary"]
        load = document.get("load") or {}
        qps = float(load.get("conversation_rate", document["config"]["qps"]))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{file} is not a ppd replay summary ({exc})") from None
    check_summary(summary, file)
    label = str(document.get("label") or file.parent.name)
    backend = document.get("backend")
    seed = document["config"].get("seed") if isinstance(document.get("config"), dict) else None
    return Run(path=file.parent, label=label, qps=qps, summary=summary,
               dataset=document.get("dataset"), target=document.get("target"),
               interrupted=bool(document.get("interrupted")),
               backend=str(backend) if backend else None,
               seed=seed if isinstance(seed, int) else None,
               cold_start=document.get("reset_prefix_cache") is True
               or document.get("simulated") is True)


def check_summary(summary: Any, file: Path) -> None:
    """Raise a ValueError that names file and what is wrong unless summary is what the table
    and plots read: an object whose NUMBER_KEYS hold numbers or null (checked here, since
    pandas and matplotlib would say it later and without the file)."""
    if not isinstance(summary, dict):
        raise ValueError(f'{file}: its "summary" is {_shown(summary)}, not the run\'s metrics '
                         "(an object of name: value, as `ppd replay` writes it)")
    bad = [key for key in NUMBER_KEYS if key in summary and not _number_or_null(summary[key])]
    if bad:
        listed = "; ".join(f'"{key}" is {_shown(summary[key])}' for key in bad)
        raise ValueError(f"{file}: in its summary, {listed}: a number (or null) was expected")


def _number_or_null(value: Any) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def _shown(value: Any) -> str:
    """A JSON value as it reads in the file, cut short."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def what_table(path: Path) -> str:
    """What a table file given in place of a run directory is, and which command reads it."""
    from profiler.tables.io import TABLE_COLUMNS

    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            columns = set(pq.read_schema(path).names)
        else:
            import pandas as pd

            columns = set(pd.read_csv(path, nrows=0).columns)
    except Exception:  # noqa: BLE001 - unreadable: say so instead of guessing
        return "a table file ppd cannot read"
    if {"layout", "dataset", "qps", "policy"} <= columns:
        return "a simulator grid (`ppd sim grid`; `ppd sim paper FILE` reads it)"
    if set(TABLE_COLUMNS) <= columns:
        return "a decision table (`ppd profile`; `ppd table show FILE` reads it)"
    if {"conversation_id", "turn", "ttft_ms"} <= columns:
        return f"a run's request table (pass its directory, {path.parent})"
    return "a table file"
